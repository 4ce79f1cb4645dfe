//! Sandboxes served and closed through the worker's calls leave nothing
//! behind: no namespace (so no link in one), descriptor or task (root). Its
//! own test binary, so descriptor and task counts are this test's alone.

use atunnel_support::prelude::*;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use atunnel::tunnel::Tunnel;
use atunnel_dns::RelayConfig;
use atunnel_sandbox::{netns, require_root};

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

/// A namespace's identity: its nsfs device and inode, which `/proc/*/ns/net`
/// shows as `net:[INODE]`.
fn ns_identity(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).expect("stat namespace");
    (meta.dev(), meta.ino())
}

/// Who on the host still refers to any of `namespaces`, by namespace: a
/// task in one, or an open descriptor on one. Compared by stat, not by link
/// text: a descriptor opened through `/run/netns/<name>` reads back as that
/// path. A namespace nobody refers to is freed by the kernel, and with it
/// every link in it (a leaked veth would mean a namespace kept alive).
fn holders(namespaces: &HashSet<(u64, u64)>) -> HashMap<(u64, u64), Vec<String>> {
    let mut found = HashMap::<_, Vec<_>>::new();
    // Numbered entries only: `self` and `thread-self` repeat one of them.
    let Ok(procs) = atunnel_host::numbered_entries::<u32>("/proc") else {
        return found;
    };
    for (_, dir) in procs {
        // Processes come and go while we look; a vanished one holds nothing.
        let tasks = std::fs::read_dir(dir.join("task"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|t| t.path().join("ns/net"));
        let fds = std::fs::read_dir(dir.join("fd"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|f| f.path());
        for link in std::iter::once(dir.join("ns/net")).chain(tasks).chain(fds) {
            let Ok(meta) = std::fs::metadata(&link) else {
                continue;
            };
            let ns = (meta.dev(), meta.ino());
            if namespaces.contains(&ns) {
                let target = std::fs::read_link(&link).unwrap_or_default();
                found.entry(ns).or_default().push(format!(
                    "{} -> {} (net:[{}])",
                    link.display(),
                    target.display(),
                    meta.ino()
                ));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sandboxes_come_and_go_without_a_trace() {
    require_root("sandbox churn test");
    const N: usize = 200;
    let pki = Pki::new();
    let mut cfg = pki.tunnel_config();
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
    let namespaces: HashSet<(u64, u64)> = actors
        .iter()
        .flat_map(|a| {
            let sandbox = tunnel.sandbox(a).expect("sandbox being served");
            [
                ns_identity(&sandbox.runtime.path()),
                ns_identity(&sandbox.gateway.path()),
            ]
        })
        .collect();
    assert_eq!(namespaces.len(), 2 * N, "every namespace is its own");
    // The control for the check after closing: the scan finds each one.
    assert_eq!(
        holders(&namespaces).len(),
        2 * N,
        "every served sandbox's namespaces are seen held (atunnel keeps a descriptor on each)"
    );
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
    let held: Vec<String> = holders(&namespaces).into_values().flatten().collect();
    assert!(
        held.is_empty(),
        "{} references to closed sandboxes' namespaces, e.g. {:?}",
        held.len(),
        &held[..held.len().min(5)]
    );
    assert_eq!(open_fds(), fds_before, "file descriptors left behind");
    // The veth pairs were made in the sandboxes' namespaces, never here;
    // that they left with those namespaces is the check above.
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
