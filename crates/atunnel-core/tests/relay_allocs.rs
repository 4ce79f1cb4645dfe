//! The relay's steady state between two TCP sockets allocates nothing.
//!
//! This binary counts every heap allocation (CountingAlloc is its global
//! allocator), so it holds a single test: libtest would otherwise run tests
//! side by side and their allocations would land in each other's window.

mod common;

use std::alloc::System;

use atunnel_core::alloc::{self, CountingAlloc, CountingWith};
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, RelayStats, relay};
use common::tcp_pair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const CHUNK: usize = 32 * 1024;
const WARM_UP: usize = 4 << 20;
const STEADY: usize = 64 << 20;
/// The stream carries `offset % PERIOD`; a prime period catches reordered,
/// dropped or repeated chunks.
const PERIOD: usize = 251;
/// Bytes per socket write or read on the outer sides.
const IO: usize = 256 * 1024;

/// Writes bytes `from..to` of the patterned stream.
async fn send(w: &mut WriteHalf<'_>, pattern: &[u8], from: usize, to: usize) {
    let mut at = from;
    while at < to {
        let n = IO.min(to - at);
        let start = at % PERIOD;
        w.write_all(&pattern[start..start + n])
            .await
            .expect("write");
        at += n;
    }
}

/// Reads bytes `from..to` of the patterned stream and checks them.
async fn receive(r: &mut ReadHalf<'_>, buf: &mut [u8], pattern: &[u8], from: usize, to: usize) {
    let mut at = from;
    while at < to {
        let want = buf.len().min(to - at);
        let n = r.read(&mut buf[..want]).await.expect("read");
        assert!(n > 0, "early EOF at byte {at}");
        let start = at % PERIOD;
        assert!(
            buf[..n] == pattern[start..start + n],
            "corrupted bytes at {at}..{}",
            at + n
        );
        at += n;
    }
}

/// What one measured window cost.
struct Window {
    allocations: u64,
    relay_reads: u64,
    chunks: u64,
}

/// Moves `WARM_UP` then `STEADY` bytes from `outer_a` to `outer_b` (and, if
/// `both_ways`, as many from `outer_b` to `outer_a` at the same time),
/// counting allocations over the `STEADY` part only.
async fn run(both_ways: bool) -> Window {
    let pool = BufferPool::new(CHUNK, 64, 8);
    // A relay holds at most one buffer per direction, and the pool keeps
    // them; but whether both directions ever hold one at the same moment
    // during the warm-up is up to timing. Borrowing two now makes the pool's
    // working set part of the warm-up, not of the measured window.
    drop((pool.acquire().await, pool.acquire().await));
    let (mut outer_a, mut a) = tcp_pair().await;
    let (mut b, mut outer_b) = tcp_pair().await;
    for s in [&a, &b] {
        SocketOptions::default().apply(s).expect("socket options");
    }
    let relay_pool = pool.clone();
    let task = tokio::spawn(async move { relay(&mut a, &mut b, &relay_pool).await });

    let pattern: Vec<u8> = (0..IO + PERIOD).map(|i| (i % PERIOD) as u8).collect();
    let mut buf_at_a = vec![0u8; IO];
    let mut buf_at_b = vec![0u8; IO];
    let (mut a_r, mut a_w) = outer_a.split();
    let (mut b_r, mut b_w) = outer_b.split();

    let mut window = Window {
        allocations: 0,
        relay_reads: 0,
        chunks: 0,
    };
    for (from, to, measured) in [(0, WARM_UP, false), (WARM_UP, WARM_UP + STEADY, true)] {
        let allocs_before = alloc::allocations();
        let reads_before = pool.stats().acquired_total;
        // Both ends of both directions run in this one task: awaiting them
        // all together is the only synchronisation (no sleeps, no spawns).
        let a_to_b = async {
            tokio::join!(
                send(&mut a_w, &pattern, from, to),
                receive(&mut b_r, &mut buf_at_b, &pattern, from, to),
            )
        };
        let b_to_a = async {
            if both_ways {
                tokio::join!(
                    send(&mut b_w, &pattern, from, to),
                    receive(&mut a_r, &mut buf_at_a, &pattern, from, to),
                );
            }
        };
        tokio::join!(a_to_b, b_to_a);
        if measured {
            window.allocations = alloc::allocations() - allocs_before;
            window.relay_reads = pool.stats().acquired_total - reads_before;
            let directions = if both_ways { 2 } else { 1 };
            window.chunks = (directions * (to - from) / CHUNK) as u64;
        } else {
            // tokio's current-thread scheduler allocates its list of deferred
            // wakers (coop budget, yield_now) on first use in each block_on;
            // this puts that one-off allocation in the warm-up.
            tokio::task::yield_now().await;
        }
    }

    // Close both ways: the relay ends cleanly with every byte counted and
    // every buffer back.
    a_w.shutdown().await.expect("shutdown a");
    b_w.shutdown().await.expect("shutdown b");
    assert_eq!(a_r.read(&mut buf_at_a).await.expect("EOF at a"), 0);
    assert_eq!(b_r.read(&mut buf_at_b).await.expect("EOF at b"), 0);
    let stats = task.await.expect("join").expect("relay");
    let moved = (WARM_UP + STEADY) as u64;
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: moved,
            b_to_a: if both_ways { moved } else { 0 },
        }
    );
    assert_eq!(pool.stats().in_use, 0, "{:?}", pool.stats());
    window
}

#[test]
fn tcp_relay_steady_state_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for both_ways in [false, true] {
        let w = rt.block_on(run(both_ways));
        let case = if both_ways { "both ways" } else { "one way" };
        println!(
            "{case}: {} allocations over {} chunks of 32 KiB ({} relay reads)",
            w.allocations, w.chunks, w.relay_reads
        );
        // The window really went through the relay, a chunk at a time.
        assert!(w.relay_reads >= w.chunks, "{case}: {} reads", w.relay_reads);
        assert_eq!(
            w.allocations, 0,
            "{case}: the relay allocated {} times while moving {} chunks ({} reads): \
             something in the per-chunk path allocates",
            w.allocations, w.chunks, w.relay_reads
        );
    }
}
