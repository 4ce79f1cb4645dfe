//! Creating and destroying many sandboxes leaves nothing behind (root). Its
//! own test binary, so descriptor and task counts are this test's alone.

use std::time::{Duration, Instant};

use atunnel_sandbox::sandbox::{DEFAULT_EGRESS_PORT, SandboxNetwork};
use atunnel_sandbox::{NsExecutor, netns, require_root};

fn name(tag: &str) -> String {
    format!("atnt-{}-{tag}", std::process::id())
}

fn kernel_slab_bytes() -> u64 {
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

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fds").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sandboxes_come_and_go_without_a_trace() {
    require_root("sandbox churn test");
    const N: usize = 200;
    let exec = NsExecutor::start().expect("executor");
    let fds_before = open_fds();
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let slab_before = kernel_slab_bytes();
    let started = Instant::now();
    let mut sandboxes = Vec::new();
    for i in 0..N {
        let sb = SandboxNetwork::create(&exec, &name(&format!("churn{i}")), DEFAULT_EGRESS_PORT)
            .await
            .expect("sandbox");
        sandboxes.push(sb);
    }
    let create_time = started.elapsed();
    let slab_during = kernel_slab_bytes();
    let started = Instant::now();
    for sb in sandboxes {
        sb.destroy(&exec).await.expect("destroy");
    }
    let destroy_time = started.elapsed();
    println!(
        "{N} sandboxes: create {:.2} ms each, destroy {:.2} ms each, kernel memory (slab+stacks+page tables) {:.0} KiB each",
        create_time.as_secs_f64() * 1e3 / N as f64,
        destroy_time.as_secs_f64() * 1e3 / N as f64,
        slab_during.saturating_sub(slab_before) as f64 / 1024.0 / N as f64
    );
    let prefix = name("churn");
    let left: Vec<_> = std::fs::read_dir(netns::NETNS_DIR)
        .expect("netns dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    assert_eq!(open_fds(), fds_before, "file descriptors left behind");
    // Each sandbox's netlink connections end once their handles are dropped.
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > tasks_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metrics.num_alive_tasks(), tasks_before, "tasks left behind");
}
