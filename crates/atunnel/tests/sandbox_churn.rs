//! Sandboxes served and closed through the worker's calls leave nothing
//! behind: no namespace, link, descriptor or task (root). Its own test binary,
//! so descriptor and task counts are this test's alone.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel::clock::Clock;
use atunnel::tunnel::{Tunnel, TunnelConfig};
use atunnel_dns::RelayConfig;
use atunnel_sandbox::{netns, require_root};
use support::*;

fn kernel_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    meminfo
        .lines()
        .filter(|l| {
            l.starts_with("Slab:") || l.starts_with("KernelStack:") || l.starts_with("PageTables:")
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}

fn host_links() -> usize {
    std::fs::read_dir("/sys/class/net").expect("links").count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fds").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sandboxes_come_and_go_without_a_trace() {
    require_root("sandbox churn test");
    const N: usize = 200;
    let pki = Pki::new();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let mut cfg = TunnelConfig::new(pki.gateway_roots(), source);
    let prefix = format!("atnt-{}-churn-", std::process::id());
    cfg.netns_prefix = prefix.clone();
    cfg.dns = Some(RelayConfig::new(vec![
        "127.0.0.1:53".parse().expect("addr"),
    ]));
    let tunnel = Tunnel::start(cfg).await.expect("tunnel");
    let metrics = tokio::runtime::Handle::current().metrics();
    let fds_before = open_fds();
    let links_before = host_links();
    let tasks_before = metrics.num_alive_tasks();
    let kernel_before = kernel_bytes();

    let actors: Vec<_> = (0..N).map(|i| actor(&format!("churn-{i}"))).collect();
    let started = Instant::now();
    for a in &actors {
        tunnel.serve_sandbox(a).await.expect("serve sandbox");
    }
    let create = started.elapsed();
    let kernel_during = kernel_bytes();
    // Each sandbox: egress listener, DNS over UDP and TCP, one task each.
    assert_eq!(metrics.num_alive_tasks() - tasks_before, 3 * N);
    let started = Instant::now();
    for a in &actors {
        tunnel.close_sandbox(a).await.expect("close sandbox");
    }
    let destroy = started.elapsed();
    println!(
        "{N} sandboxes: serve {:.2} ms each, close {:.2} ms each, kernel memory (slab, stacks, page tables) {:.0} KiB each",
        create.as_secs_f64() * 1e3 / N as f64,
        destroy.as_secs_f64() * 1e3 / N as f64,
        kernel_during.saturating_sub(kernel_before) as f64 / 1024.0 / N as f64
    );

    let left: Vec<_> = std::fs::read_dir(netns::NETNS_DIR)
        .expect("netns dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    assert_eq!(open_fds(), fds_before, "file descriptors left behind");
    assert_eq!(
        host_links(),
        links_before,
        "links left in the worker's namespace"
    );
    // Netlink connection tasks end once their handles are dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > tasks_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metrics.num_alive_tasks(), tasks_before, "tasks left behind");
}
