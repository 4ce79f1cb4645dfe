//! `atunnel-bench run --quick` end to end with one scenario (root): the run
//! folder holds results.json with sane, non-zero figures, and the bench
//! leaves no namespace behind.

use std::process::Command;

#[test]
fn quick_run_of_egress_idle_writes_sane_results() {
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
            "egress-idle",
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
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("JSON");
    let scenario = &results["scenarios"][0];
    assert_eq!(scenario["name"], "egress-idle");
    let s = &scenario["summary"];
    assert_eq!(s["conns"], 300);
    let heap = s["heap_bytes_per_conn"].as_f64().expect("heap");
    assert!(
        heap > 100.0 && heap < 64.0 * 1024.0,
        "heap per connection {heap}"
    );
    let cgroup = s["cgroup_bytes_per_conn"].as_f64().expect("cgroup");
    assert!(cgroup > 0.0, "cgroup bytes per connection {cgroup}");
    // atunnel runs one runtime worker per core of its cgroup's quota (1).
    assert_eq!(s["tunnel_worker_threads"], 1.0, "{s}");
    let tasks = s["tasks_per_conn"].as_f64().expect("tasks");
    assert!((0.9..=1.1).contains(&tasks), "tasks per connection {tasks}");
    let rung = &scenario["rungs"][0];
    assert!(rung["achieved"].as_f64().expect("achieved") > 0.0);
    assert_eq!(rung["errors"], 0);
    for f in ["results.txt", "report.md", "egress-idle.svg"] {
        assert!(out.path().join(f).exists(), "{f} missing");
    }
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with("atb") && !before.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}
