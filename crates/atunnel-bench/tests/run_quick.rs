//! `atunnel-bench run --quick` end to end (root) with egress-idle and
//! socket-memory (which starts every role the bench has, the forwarding
//! gateway included): the run folder holds results.json with sane figures,
//! and the bench leaves no namespace behind.

use std::process::Command;

use atunnel_bench::load::results::Results;
use atunnel_bench::scenario::{egress_idle, socket_memory};

#[test]
fn a_quick_run_writes_sane_results_and_measures_every_stall_case() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "atunnel-bench run needs root (namespaces, cgroups); run the tests as root"
    );
    let namespaces = || -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = namespaces();
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(env!("CARGO_BIN_EXE_atunnel-bench"))
        .args([
            "run",
            "--quick",
            "--scenarios",
            "egress-idle,socket-memory",
            "--idle-conns",
            "300",
            "--actors",
            "2",
        ])
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("atunnel-bench runs");
    assert!(status.success(), "run failed: {status}");
    let results: Results = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("results.json reads as the bench's results");
    let scenario = &results.scenarios[0];
    assert_eq!(scenario.name, "egress-idle");
    println!("egress-idle summary: {}", scenario.summary_json());
    let s = scenario
        .summary::<egress_idle::Summary>()
        .expect("egress-idle's summary");
    assert_eq!(s.conns, 300);
    // Measured 1,529 B of atunnel heap per idle egress connection at the
    // quick run's 1,000 connections (`cargo run --release -p atunnel-bench
    // -- run --quick --scenarios egress-idle` reproduces it), 1,742-1,749 B
    // at these 300 (release and debug alike).
    let heap = s.heap_bytes_per_conn;
    assert!(
        heap > 512.0 && heap <= 4.0 * 1024.0,
        "heap per connection {heap}"
    );
    // Measured 5,976-5,988 B of cgroup memory per connection at 1,000
    // connections (the same command) and 5,980-6,881 B at these 300, where
    // fixed costs are shared by fewer (add `--idle-conns 300 --actors 2`).
    let cgroup = s.cgroup_bytes_per_conn;
    assert!(
        cgroup > 2048.0 && cgroup <= 16.0 * 1024.0,
        "cgroup bytes per connection {cgroup}"
    );
    // atunnel runs one runtime worker per core of its cgroup's quota (1).
    assert_eq!(s.tunnel_worker_threads, 1, "{s:?}");
    let tasks = s.tasks_per_conn;
    assert!((0.9..=1.1).contains(&tasks), "tasks per connection {tasks}");
    let rung = &scenario.rungs[0];
    assert!(rung.achieved > 0.0);
    assert_eq!(rung.errors, 0);
    for f in ["results.txt", "report.md", "egress-idle.svg"] {
        assert!(out.path().join(f).exists(), "{f} missing");
    }
    // Every stall case measured: a role that fails to start (a flag it no
    // longer takes, say) leaves the scenario without a summary.
    let memory = &results.scenarios[1];
    assert_eq!(memory.name, "socket-memory");
    let memory = memory
        .summary::<socket_memory::Summary>()
        .unwrap_or_else(|| panic!("socket-memory has no cases: {memory:?}"));
    let rows: Vec<(&str, &str)> = memory
        .cases
        .iter()
        .map(|c| (c.case.as_str(), c.measured.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("actor-stops-reading", "atunnel"),
            ("destination-stops-reading", "atunnel"),
            ("destination-stops-reading", "gateway"),
            ("router-stops-reading", "atunnel"),
            ("router-stops-reading-https", "atunnel"),
            ("actor-stops-reading-body", "atunnel"),
        ]
    );
    // Every case has its figures; the 64 KiB verdict is reported, not yet
    // required here (the defaults are being tuned to it).
    for c in &memory.cases {
        let figure = |name: &str, kib: Option<f64>| {
            kib.filter(|x| *x >= 0.0)
                .unwrap_or_else(|| panic!("{name} of {c:?}"))
        };
        let (kernel, heap, total) = (
            figure("kernel_kib", c.kernel_kib),
            figure("heap_kib", c.heap_kib),
            figure("total_kib", c.total_kib),
        );
        assert!(
            (total - (kernel + heap)).abs() <= 0.2,
            "total is kernel plus heap: {c:?}"
        );
        assert!(c.pass.is_some(), "{c:?}");
    }
    assert_eq!(memory.bound_kib, Some(64.0));
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with("atb") && !before.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}
