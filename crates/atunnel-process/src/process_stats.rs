//! What a process costs, read from the kernel and the runtime: the
//! `process` part of every `/stats` (the tunnel's and the gateway's).

use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct ProcessStats {
    pub pid: u32,
    pub cpu_user_s: f64,
    pub cpu_system_s: f64,
    pub rss_bytes: u64,
    /// Live heap through the counting allocator; 0 if it is not installed.
    pub heap_bytes: usize,
    /// Allocations (and reallocations) through the counting allocator since
    /// start; 0 if it is not installed. The cost scenario reads it around
    /// its windows.
    pub allocations: u64,
    pub open_fds: usize,
    /// Tasks alive on this runtime (includes the stats server's own).
    pub tasks: usize,
    /// The runtime's worker threads (the cgroup's CPU quota, rounded down,
    /// at least 1; else the CPUs this process may run on).
    pub worker_threads: usize,
}

/// The process's figures and its buffer pool's, the part of every snapshot
/// the tunnel and the gateway share. With `release` (`/stats?release=1`),
/// free pool buffers and free heap are first handed back, so that idle
/// figures are taken the same way every time.
pub fn process_and_pool(
    pool: &atunnel_core::BufferPool,
    release: bool,
) -> (ProcessStats, atunnel_core::PoolStats) {
    if release {
        pool.trim(0);
        atunnel_core::alloc::release_free_memory();
    }
    (process_stats(), pool.stats())
}

/// The figures now.
pub fn process_stats() -> ProcessStats {
    let runtime = tokio::runtime::Handle::try_current()
        .ok()
        .map(|h| h.metrics());
    let (user, system) =
        match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
            Ok(u) => (timeval_s(u.user_time()), timeval_s(u.system_time())),
            Err(_) => (0.0, 0.0),
        };
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    ProcessStats {
        pid: std::process::id(),
        cpu_user_s: user,
        cpu_system_s: system,
        rss_bytes: rss_pages * page,
        heap_bytes: atunnel_core::alloc::live_bytes(),
        allocations: atunnel_core::alloc::allocations(),
        // Not by listing /proc/self/fd: at 14,000 descriptors that held
        // the runtime's thread ~10 ms per /stats read, which noisy-neighbour's
        // victim saw as a 12 ms p99 (its requests wait behind the read).
        open_fds: atunnel_host::open_descriptors().map_or(0, |n| n as usize),
        tasks: runtime.as_ref().map_or(0, |m| m.num_alive_tasks()),
        worker_threads: runtime.as_ref().map_or(0, |m| m.num_workers()),
    }
}

fn timeval_s(t: nix::sys::time::TimeVal) -> f64 {
    t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count follows the descriptors opened and closed, as listing
    /// /proc/self/fd would (without listing it). Other tests of this binary
    /// run beside it and hold a few sockets of their own: hence the slack.
    #[test]
    fn open_fds_counts_descriptors_as_they_open_and_close() {
        const SLACK: usize = 64;
        let before = process_stats().open_fds;
        let held: Vec<std::net::UdpSocket> = (0..1000)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("socket"))
            .collect();
        let during = process_stats().open_fds;
        assert!(
            during.abs_diff(before + 1000) <= SLACK,
            "{before} then {during} with 1,000 more open"
        );
        drop(held);
        let after = process_stats().open_fds;
        assert!(after.abs_diff(before) <= SLACK, "{before} then {after}");
    }
}
