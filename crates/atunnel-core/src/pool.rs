//! A bounded pool of relay buffers, borrowed only while bytes move.
//!
//! A tunnel holds no buffer while idle: it waits for readiness, then borrows
//! one buffer here for as long as data keeps flowing. The pool bounds both the
//! number of buffers out at once (`max_buffers`; a borrower past the bound
//! waits, which is backpressure, not an error) and the number kept for reuse
//! (`max_idle`; the rest go back to the allocator, so the pool shrinks after a
//! burst). A [`PooledBuf`] returns itself on drop, so every path (EOF, error,
//! cancellation, a future dropped mid-write) gives the buffer back.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};

/// Default buffer size: 32 KiB matches a TLS record's worth of plaintext twice
/// over and is what the reference copies with.
pub const DEFAULT_BUFFER_SIZE: usize = 32 * 1024;
/// Default bound on buffers out at once: 4096 x 32 KiB = 128 MiB, far above
/// what 1 CPU can keep busy, well below a 1 GiB limit.
pub const DEFAULT_MAX_BUFFERS: usize = 4096;
/// Default number of free buffers kept for reuse (2 MiB at 32 KiB).
pub const DEFAULT_MAX_IDLE: usize = 64;

/// Shared pool handle; cheap to clone. A handle made by
/// [`BufferPool::share`] also counts against its share's own cap.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
    share: Option<Arc<Share>>,
}

/// One borrower's part of a pool (an actor's): at most `max` of its
/// buffers out at once. Past it, that borrower waits while every other
/// keeps borrowing, so no one of them can take the whole pool.
struct Share {
    max: usize,
    in_use: AtomicUsize,
    waited_total: AtomicU64,
    waiters: Mutex<Vec<Waker>>,
}

impl Share {
    /// Takes a place, or registers `cx` to be woken when one frees.
    fn poll_take(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut waiters = self.waiters.lock().expect("share lock poisoned");
        if self.in_use.load(Ordering::Relaxed) >= self.max {
            self.waited_total.fetch_add(1, Ordering::Relaxed);
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(())
    }

    fn give_back(&self) {
        let waiters = {
            let mut waiters = self.waiters.lock().expect("share lock poisoned");
            self.in_use.fetch_sub(1, Ordering::Relaxed);
            std::mem::take(&mut *waiters)
        };
        for w in waiters {
            w.wake();
        }
    }
}

/// A share's figures, for /stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareStats {
    pub in_use: usize,
    pub max: usize,
    /// Borrows that waited because this share's cap was out.
    pub waited_total: u64,
}

struct Inner {
    buffer_size: usize,
    max_buffers: usize,
    max_idle: usize,
    free: Mutex<Free>,
    in_use: AtomicUsize,
    acquired_total: AtomicU64,
    allocated_total: AtomicU64,
    waited_total: AtomicU64,
    spilled_total: AtomicU64,
}

#[derive(Default)]
struct Free {
    buffers: Vec<Box<[u8]>>,
    /// Tasks waiting for a buffer while `max_buffers` are out. Woken all at
    /// once when one comes back: exhaustion is rare and the losers re-register
    /// (into a fresh list: the old one is taken whole so that no waker runs
    /// under the lock).
    waiters: Vec<Waker>,
}

/// Counters read by /stats and by tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Buffers currently borrowed.
    pub in_use: usize,
    /// Free buffers kept for reuse.
    pub idle: usize,
    /// Size of each buffer in bytes.
    pub buffer_size: usize,
    /// Borrows since start.
    pub acquired_total: u64,
    /// Fresh allocations since start (the rest were reuses).
    pub allocated_total: u64,
    /// Borrows that had to wait because `max_buffers` were out.
    pub waited_total: u64,
    /// Buffers given back by a write blocked behind a peer that stopped
    /// reading (the unwritten rest copied out; see the relay).
    pub spilled_total: u64,
}

impl BufferPool {
    /// A pool of `buffer_size`-byte buffers, at most `max_buffers` out at once
    /// and `max_idle` kept free.
    pub fn new(buffer_size: usize, max_buffers: usize, max_idle: usize) -> Self {
        assert!(
            buffer_size > 0 && max_buffers > 0,
            "pool needs room for one buffer"
        );
        Self {
            inner: Arc::new(Inner {
                buffer_size,
                max_buffers,
                max_idle: max_idle.min(max_buffers),
                free: Mutex::new(Free::default()),
                in_use: AtomicUsize::new(0),
                acquired_total: AtomicU64::new(0),
                allocated_total: AtomicU64::new(0),
                waited_total: AtomicU64::new(0),
                spilled_total: AtomicU64::new(0),
            }),
            share: None,
        }
    }

    /// A handle on the same buffers whose borrows also count against a
    /// share of their own, at most `max` out at once (each call makes a
    /// new share).
    pub fn share(&self, max: usize) -> BufferPool {
        BufferPool {
            inner: self.inner.clone(),
            share: Some(Arc::new(Share {
                max: max.max(1),
                in_use: AtomicUsize::new(0),
                waited_total: AtomicU64::new(0),
                waiters: Mutex::new(Vec::new()),
            })),
        }
    }

    /// This handle's share, if it has one.
    pub fn share_stats(&self) -> Option<ShareStats> {
        self.share.as_ref().map(|s| ShareStats {
            in_use: s.in_use.load(Ordering::Relaxed),
            max: s.max,
            waited_total: s.waited_total.load(Ordering::Relaxed),
        })
    }

    pub fn buffer_size(&self) -> usize {
        self.inner.buffer_size
    }

    /// Borrows a buffer, or registers `cx` to be woken when one is returned.
    pub fn poll_acquire(&self, cx: &mut Context<'_>) -> Poll<PooledBuf> {
        if let Some(share) = &self.share {
            ready!(share.poll_take(cx));
        }
        let inner = &self.inner;
        let mut free = inner.free.lock().expect("pool lock poisoned");
        if inner.in_use.load(Ordering::Relaxed) >= inner.max_buffers {
            inner.waited_total.fetch_add(1, Ordering::Relaxed);
            if !free.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                free.waiters.push(cx.waker().clone());
            }
            drop(free);
            if let Some(share) = &self.share {
                share.give_back();
            }
            return Poll::Pending;
        }
        inner.in_use.fetch_add(1, Ordering::Relaxed);
        inner.acquired_total.fetch_add(1, Ordering::Relaxed);
        let reused = free.buffers.pop();
        drop(free);
        let buf = reused.unwrap_or_else(|| {
            inner.allocated_total.fetch_add(1, Ordering::Relaxed);
            vec![0u8; inner.buffer_size].into_boxed_slice()
        });
        Poll::Ready(PooledBuf {
            buf: Some(buf),
            pool: self.inner.clone(),
            share: self.share.clone(),
        })
    }

    /// Borrows a buffer, waiting while `max_buffers` are out.
    pub async fn acquire(&self) -> PooledBuf {
        std::future::poll_fn(|cx| self.poll_acquire(cx)).await
    }

    /// Drops free buffers beyond `keep`, returning their memory.
    pub fn trim(&self, keep: usize) {
        let drained: Vec<Box<[u8]>> = {
            let mut free = self.inner.free.lock().expect("pool lock poisoned");
            let keep = keep.min(free.buffers.len());
            free.buffers.drain(keep..).collect()
        };
        drop(drained);
    }

    /// Counts a buffer given back by a blocked write.
    pub(crate) fn count_spill(&self) {
        self.inner.spilled_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> PoolStats {
        let inner = &self.inner;
        let idle = inner.free.lock().expect("pool lock poisoned").buffers.len();
        PoolStats {
            in_use: inner.in_use.load(Ordering::Relaxed),
            idle,
            buffer_size: inner.buffer_size,
            acquired_total: inner.acquired_total.load(Ordering::Relaxed),
            allocated_total: inner.allocated_total.load(Ordering::Relaxed),
            waited_total: inner.waited_total.load(Ordering::Relaxed),
            spilled_total: inner.spilled_total.load(Ordering::Relaxed),
        }
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new(DEFAULT_BUFFER_SIZE, DEFAULT_MAX_BUFFERS, DEFAULT_MAX_IDLE)
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A borrowed buffer; goes back to its pool when dropped.
pub struct PooledBuf {
    buf: Option<Box<[u8]>>,
    pool: Arc<Inner>,
    share: Option<Arc<Share>>,
}

impl PooledBuf {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("buffer present until drop")
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_deref().expect("buffer present until drop")
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if let Some(share) = &self.share {
            share.give_back();
        }
        let inner = &self.pool;
        let mut free = inner.free.lock().expect("pool lock poisoned");
        inner.in_use.fetch_sub(1, Ordering::Relaxed);
        let surplus = if free.buffers.len() < inner.max_idle {
            free.buffers.push(buf);
            None
        } else {
            Some(buf)
        };
        // Every waiter is woken (see `Free::waiters`). Taking an empty list
        // costs nothing; a non-empty one is woken, and any surplus freed,
        // outside the lock.
        let waiters = std::mem::take(&mut free.waiters);
        drop(free);
        drop(surplus);
        for w in waiters {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its wake-ups, so a test can see exactly when a waiter is woken.
    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_bound_holds_and_one_return_wakes_the_waiter() {
        let pool = BufferPool::new(64, 2, 2);
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        let Poll::Ready(first) = pool.poll_acquire(&mut cx) else {
            panic!("a free pool lends at once")
        };
        let Poll::Ready(second) = pool.poll_acquire(&mut cx) else {
            panic!("the bound is two")
        };
        // Past the bound: the borrower waits, registered once however often
        // it polls, and no buffer is allocated for it.
        assert!(pool.poll_acquire(&mut cx).is_pending());
        assert!(pool.poll_acquire(&mut cx).is_pending());
        let s = pool.stats();
        assert_eq!((s.in_use, s.allocated_total), (2, 2));
        assert!(s.waited_total >= 1, "{s:?}");
        assert_eq!(counter.0.load(Ordering::Relaxed), 0);
        drop(first);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1, "woken exactly once");
        let Poll::Ready(third) = pool.poll_acquire(&mut cx) else {
            panic!("the returned buffer is lent to the waiter")
        };
        assert_eq!(third.as_ref().len(), 64);
        assert_eq!(pool.stats().allocated_total, 2, "and reused, not allocated");
        drop(second);
        drop(third);
        assert_eq!(counter.0.load(Ordering::Relaxed), 1, "no waiter, no wake");
        assert_eq!(pool.stats().in_use, 0);
    }

    #[tokio::test]
    async fn contended_borrowers_stay_within_the_bound_and_all_get_served() {
        let pool = BufferPool::new(64, 3, 1);
        let peak = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let (pool, peak) = (pool.clone(), peak.clone());
                tokio::spawn(async move {
                    for _ in 0..5 {
                        let buf = pool.acquire().await;
                        peak.fetch_max(pool.stats().in_use, Ordering::Relaxed);
                        // Hold it across a yield so the others pile up.
                        tokio::task::yield_now().await;
                        drop(buf);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("borrower");
        }
        let s = pool.stats();
        assert_eq!(peak.load(Ordering::Relaxed), 3, "{s:?}");
        assert_eq!((s.in_use, s.idle, s.acquired_total), (0, 1, 60));
        assert!(s.waited_total > 0, "{s:?}");
    }

    /// A waiter whose task went away while registered must not swallow the
    /// wake-up a live waiter needs, whichever of the two registered first (a
    /// pool waking only its first or only its last waiter fails one order).
    #[tokio::test]
    async fn a_cancelled_waiter_does_not_strand_the_next() {
        /// Spawns a borrower and lets it register as a waiter.
        async fn waiter(pool: &BufferPool) -> tokio::task::JoinHandle<usize> {
            let p = pool.clone();
            let task = tokio::spawn(async move { p.acquire().await.as_ref().len() });
            tokio::task::yield_now().await;
            task
        }
        for cancelled_first in [true, false] {
            let pool = BufferPool::new(64, 1, 1);
            let held = pool.acquire().await;
            let (first, second) = (waiter(&pool).await, waiter(&pool).await);
            assert!(pool.stats().waited_total >= 2, "both wait");
            let (cancelled, next) = if cancelled_first {
                (first, second)
            } else {
                (second, first)
            };
            cancelled.abort();
            assert!(cancelled.await.expect_err("aborted").is_cancelled());
            drop(held);
            let got = tokio::time::timeout(std::time::Duration::from_secs(10), next)
                .await
                .unwrap_or_else(|_| panic!("cancelled_first={cancelled_first}: next stranded"));
            assert_eq!(got.expect("next"), 64);
            assert_eq!(pool.stats().in_use, 0);
        }
    }

    #[tokio::test]
    async fn a_burst_shrinks_back_to_max_idle_is_reused_and_trim_keeps_what_it_is_told() {
        let pool = BufferPool::new(1024, 16, 4);
        let burst = futures_join(&pool, 16).await;
        assert_eq!(pool.stats().in_use, 16);
        drop(burst);
        let s = pool.stats();
        assert_eq!((s.in_use, s.idle, s.allocated_total), (0, 4, 16));
        pool.trim(2);
        assert_eq!(pool.stats().idle, 2);
        pool.trim(10);
        assert_eq!(pool.stats().idle, 2, "trim never adds");
        let again = futures_join(&pool, 3).await;
        assert_eq!(pool.stats().allocated_total, 17, "two reused, one fresh");
        drop(again);
        assert_eq!(pool.stats().idle, 3);
        let _again = pool.acquire().await;
        assert_eq!(pool.stats().allocated_total, 17, "a free buffer is reused");
        pool.trim(0);
        assert_eq!(pool.stats().idle, 0);
    }

    async fn futures_join(pool: &BufferPool, n: usize) -> Vec<PooledBuf> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(pool.acquire().await);
        }
        v
    }

    /// A share at its cap waits while another share and the plain pool
    /// borrow on; a buffer it gives back wakes it and it borrows again.
    #[test]
    fn a_share_at_its_cap_waits_alone() {
        let pool = BufferPool::new(1024, 16, 16);
        let (greedy, other) = (pool.share(2), pool.share(2));
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        let ready = |p: Poll<PooledBuf>| match p {
            Poll::Ready(b) => b,
            Poll::Pending => panic!("should have borrowed"),
        };
        let first = ready(greedy.poll_acquire(&mut cx));
        let _second = ready(greedy.poll_acquire(&mut cx));
        assert!(greedy.poll_acquire(&mut cx).is_pending(), "past its cap");
        let _others = [
            ready(other.poll_acquire(&mut cx)),
            ready(pool.poll_acquire(&mut cx)),
        ];
        assert_eq!(pool.stats().in_use, 4);
        let s = greedy.share_stats().expect("a share");
        assert_eq!((s.in_use, s.max, s.waited_total), (2, 2, 1));
        drop(first);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the waiter woke");
        let _third = ready(greedy.poll_acquire(&mut cx));
        assert_eq!(greedy.share_stats().map(|s| s.in_use), Some(2));
        assert_eq!(pool.share_stats(), None);
    }
}
