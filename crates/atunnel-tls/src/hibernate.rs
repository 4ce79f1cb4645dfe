//! Hibernation: a connection with no traffic for `hibernate_after` drops
//! whatever per-connection state it can rebuild on the next byte (the HTTP/1
//! connection's read and write buffers, parsed request state, and the TLS
//! session down to its traffic keys, see [`crate::stream`]), and the
//! allocator is asked to hand freed memory back to the system.
//!
//! Idleness is read cheaply: the connection's I/O bumps a counter
//! ([`ActivityIo`]), requests in flight hold a guard ([`InFlight`]), and a
//! single timer per connection looks at both once per period. A connection
//! under load never sees a whole quiet period, so it never hibernates; one
//! that went quiet hibernates between one and two periods after its last byte.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_core::endpoint::ReadReady;
use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::stream::ServerTls;

/// The default `--hibernate-after`.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(15);

/// Process-wide hibernation settings and counters, shared by every listener.
#[derive(Debug)]
pub struct Hibernation {
    after: Option<Duration>,
    /// Connections hibernated right now.
    sleeping: AtomicUsize,
    /// Times any connection hibernated, and woke.
    hibernations: AtomicU64,
    wakes: AtomicU64,
    /// Set when memory was freed since the allocator last trimmed.
    trim_wanted: AtomicBool,
    /// Times the allocator was asked to hand memory back.
    trims: AtomicU64,
    changed: Notify,
}

/// What /stats reports.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct HibernationStats {
    pub hibernating: usize,
    pub hibernations: u64,
    pub wakes: u64,
    /// Times the allocator was asked to hand freed memory back.
    pub trims: u64,
}

impl Hibernation {
    /// `after` of zero disables hibernation.
    pub fn new(after: Duration) -> Arc<Self> {
        Arc::new(Self {
            after: (!after.is_zero()).then_some(after),
            sleeping: AtomicUsize::new(0),
            hibernations: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            trim_wanted: AtomicBool::new(false),
            trims: AtomicU64::new(0),
            changed: Notify::new(),
        })
    }

    pub fn disabled() -> Arc<Self> {
        Self::new(Duration::ZERO)
    }

    pub fn after(&self) -> Option<Duration> {
        self.after
    }

    /// Resolves once `activity` has been idle for a whole period; never
    /// when hibernation is off.
    pub async fn idle(&self, activity: &Activity) {
        match self.after {
            Some(after) => activity.idle_for(after).await,
            None => std::future::pending().await,
        }
    }

    pub fn stats(&self) -> HibernationStats {
        HibernationStats {
            hibernating: self.sleeping.load(Ordering::Relaxed),
            hibernations: self.hibernations.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
            trims: self.trims.load(Ordering::Relaxed),
        }
    }

    /// Waits until `done` holds for the stats (checked on every change).
    pub async fn wait_until(&self, done: impl Fn(HibernationStats) -> bool) -> HibernationStats {
        loop {
            let changed = self.changed.notified();
            let s = self.stats();
            if done(s) {
                return s;
            }
            changed.await;
        }
    }

    /// Marks one connection hibernated until the guard drops (it woke or
    /// closed).
    pub fn enter(self: &Arc<Self>) -> Sleeping {
        self.sleeping.fetch_add(1, Ordering::Relaxed);
        self.hibernations.fetch_add(1, Ordering::Relaxed);
        self.trim_wanted.store(true, Ordering::Relaxed);
        self.changed.notify_waiters();
        Sleeping(self.clone())
    }

    /// Returns freed memory to the system, at most once per period and only
    /// after something hibernated: malloc_trim walks the whole heap, so it
    /// is batched rather than run per connection. A batch ends with a tick
    /// in which nothing more hibernated (or after [`TRIM_DEFERRALS`] ticks
    /// that each saw more): connections that went quiet together hibernate
    /// over a few of the idle checks' grid ticks, and a trim between them
    /// would walk the heap twice for one batch. It also gives the bench's
    /// ingress-idle window exactly one trim to count.
    pub async fn trim_until(self: Arc<Self>, cancel: CancellationToken) {
        let Some(after) = self.after else { return };
        let period = after.clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = self.hibernations.load(Ordering::Relaxed);
        let mut deferred = 0;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.hibernations.load(Ordering::Relaxed);
            let more = now != seen;
            seen = now;
            if !self.trim_wanted.load(Ordering::Relaxed) {
                continue;
            }
            if more && deferred < TRIM_DEFERRALS {
                deferred += 1;
                continue;
            }
            deferred = 0;
            // Cleared before the trim, so memory freed during it asks for
            // the next one.
            self.trim_wanted.store(false, Ordering::Relaxed);
            atunnel_core::alloc::release_free_memory();
            self.trims.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Trim ticks a batch of hibernations may put its trim off by, so that a
/// steady trickle of hibernations still trims every few seconds.
const TRIM_DEFERRALS: u32 = 3;

/// A hibernated connection; dropping it counts the wake.
pub struct Sleeping(Arc<Hibernation>);

impl Drop for Sleeping {
    fn drop(&mut self) {
        self.0.sleeping.fetch_sub(1, Ordering::Relaxed);
        self.0.wakes.fetch_add(1, Ordering::Relaxed);
        self.0.changed.notify_waiters();
    }
}

/// Drives `fut`, a connection whose I/O goes through an [`ActivityIo`] on
/// `activity`, and each time the connection has been idle for a whole
/// period asks that stream to hibernate. The stream does it from inside its
/// next read (the only place that owns it), so `fut` is polled once more
/// right after asking; protocols that keep a read pending while idle (h2,
/// hyper's HTTP/1, the relay) get there at once. Once asked, no timer runs
/// until the connection's next I/O (which wakes `fut`), so a hibernated
/// connection is not woken every period. `fut` is pinned by the caller:
/// taken by value, it would be stored twice in this future (as the
/// argument and pinned), for the connection's whole life.
pub async fn with_hibernation<F: Future>(
    mut fut: Pin<&mut F>,
    activity: &Activity,
    hibernation: &Hibernation,
) -> F::Output {
    let Some(period) = hibernation.after() else {
        return fut.await;
    };
    loop {
        tokio::select! {
            biased;
            out = fut.as_mut() => return out,
            _ = activity.idle_for(period) => {}
        }
        activity.sleep_requested.store(true, Ordering::Relaxed);
        let asked_at = activity.io_events.load(Ordering::Relaxed);
        let woke = poll_fn(|cx| match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if activity.io_events.load(Ordering::Relaxed) == asked_at => {
                Poll::Pending
            }
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        if let Some(out) = woke {
            return out;
        }
    }
}

/// One connection's traffic, as seen by its idle timer.
#[derive(Debug, Default)]
pub struct Activity {
    io_events: AtomicU64,
    in_flight: AtomicUsize,
    /// Requests begun on the connection so far.
    requests: AtomicU64,
    /// Set by [`with_hibernation`], taken by the stream's next idle read.
    sleep_requested: AtomicBool,
}

impl Activity {
    fn touch(&self) {
        self.io_events.fetch_add(1, Ordering::Relaxed);
    }

    /// Held by a request until its response has been handed over entirely.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight(self.clone())
    }

    /// Whether [`with_hibernation`] is waiting for the stream's next idle
    /// read to hibernate it: a connection that polls its stream only when
    /// its own waker fired must read once now.
    pub fn sleep_requested(&self) -> bool {
        self.sleep_requested.load(Ordering::Relaxed)
    }

    /// Requests begun on the connection so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Resolves once a whole `period` passed with no I/O and no request in
    /// flight (checked about once per period, so between one and two
    /// periods and a tick).
    async fn idle_for(&self, period: Duration) {
        let mut seen = self.io_events.load(Ordering::Relaxed);
        loop {
            tokio::time::sleep_until(on_tick(Instant::now() + period, period)).await;
            let now = self.io_events.load(Ordering::Relaxed);
            if now == seen && self.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            seen = now;
        }
    }
}

/// Idle checks land on a process-wide grid of this many ticks per period,
/// so connections that went quiet at different moments are checked
/// together, in one wake-up of the runtime: one wake-up per connection
/// costs more CPU than hibernating it.
const TICKS_PER_PERIOD: u32 = 8;

/// The finest grid: below it the timer wheel's 1 ms resolution batches
/// anyway.
const MIN_TICK: Duration = Duration::from_millis(10);

/// The coarsest grid, so a long period does not delay hibernation by much.
const MAX_TICK: Duration = Duration::from_secs(1);

/// `at`, rounded up to the next tick of the grid for `period`.
fn on_tick(at: Instant, period: Duration) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let tick = (period / TICKS_PER_PERIOD).clamp(MIN_TICK, MAX_TICK);
    let since = at.saturating_duration_since(origin).as_nanos();
    let tick_ns = tick.as_nanos();
    let ticks = since.div_ceil(tick_ns);
    // Whole ticks since the process began fit in u64 nanoseconds for
    // centuries; past that, no rounding.
    u64::try_from(ticks * tick_ns).map_or(at, |ns| origin + Duration::from_nanos(ns))
}

pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's TLS stream, which records each read and write in its
/// [`Activity`], can replay bytes an earlier HTTP parser had read but not
/// used, and hibernates when [`with_hibernation`] asks.
pub struct ActivityIo {
    inner: ServerTls,
    activity: Arc<Activity>,
    /// Read before hibernating and not yet consumed; empty almost always.
    replay: Bytes,
    hibernation: Arc<Hibernation>,
    /// Held while the connection is hibernated, until its next I/O.
    sleeping: Option<Sleeping>,
}

impl ActivityIo {
    pub fn new(inner: ServerTls, activity: Arc<Activity>, hibernation: Arc<Hibernation>) -> Self {
        Self {
            inner,
            activity,
            replay: Bytes::new(),
            hibernation,
            sleeping: None,
        }
    }

    /// Bytes to hand out before reading from the stream again.
    pub fn set_replay(&mut self, bytes: Bytes) {
        self.replay = bytes;
    }

    /// Whether the connection is hibernated: since [`ActivityIo::sleep`] or
    /// an idle read hibernated it, with no I/O since.
    pub fn is_asleep(&self) -> bool {
        self.sleeping.is_some()
    }

    /// Hibernates now (the caller has dropped what it held above the
    /// stream): the TLS session goes if it can, and the connection counts
    /// as hibernated until its next I/O.
    pub fn sleep(&mut self) {
        self.inner.hibernate();
        self.sleeping = Some(self.hibernation.enter());
    }

    fn touched(&mut self) {
        self.activity.touch();
        self.sleeping = None;
    }

    /// After a read found nothing: hibernates the inner stream if asked.
    /// True when it did, so the caller polls again to wait on the new state.
    fn hibernate_if_asked(&mut self) -> bool {
        if self.activity.sleep_requested.swap(false, Ordering::Relaxed)
            && self.sleeping.is_none()
            && self.inner.hibernate()
        {
            self.sleeping = Some(self.hibernation.enter());
            return true;
        }
        false
    }
}

impl AsyncRead for ActivityIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.advance(n);
            if self.replay.is_empty() {
                // Even empty, it would keep the buffer it was cut from
                // (hyper's whole read buffer), asleep or not.
                self.replay = Bytes::new();
            }
            self.touched();
            return Poll::Ready(Ok(()));
        }
        let mut r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_pending() && self.hibernate_if_asked() {
            r = Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        if r.is_ready() {
            self.touched();
        }
        r
    }
}

impl ReadReady for ActivityIo {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let r = self.inner.poll_read_ready(cx);
        if r.is_pending() && self.hibernate_if_asked() {
            return self.inner.poll_read_ready(cx);
        }
        r
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_write_ready(cx)
    }

    fn reset_on_close(&self) {
        self.inner.reset_on_close()
    }
}

impl AsyncWrite for ActivityIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if r.is_ready() {
            self.touched();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if r.is_ready() {
            self.touched();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test(start_paused = true)]
    async fn hibernations_over_consecutive_ticks_are_trimmed_once_after_them() {
        let period = Duration::from_secs(1);
        let h = Hibernation::new(period);
        let cancel = CancellationToken::new();
        let trimmer = tokio::spawn(h.clone().trim_until(cancel.clone()));
        // The interval's first tick, at once, finds nothing to trim.
        tokio::time::sleep(period / 2).await;
        let mut asleep = Vec::new();
        // Hibernations in two consecutive tick intervals: one batch.
        asleep.push(h.enter());
        tokio::time::sleep(period).await;
        asleep.push(h.enter());
        tokio::time::sleep(period).await;
        assert_eq!(h.stats().trims, 0, "trimmed inside the batch");
        tokio::time::sleep(period).await;
        assert_eq!(h.stats().trims, 1, "one trim once a tick saw no more");
        // Nothing more hibernated: no more trims.
        tokio::time::sleep(period * 3).await;
        assert_eq!(h.stats().trims, 1);
        // A steady trickle still trims, after TRIM_DEFERRALS ticks.
        for _ in 0..=TRIM_DEFERRALS {
            asleep.push(h.enter());
            tokio::time::sleep(period).await;
        }
        assert_eq!(
            h.stats().trims,
            2,
            "a trickle defers a trim a bounded number of ticks"
        );
        cancel.cancel();
        trimmer.await.expect("trimmer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_asked_to_hibernate_is_not_polled_again_until_its_next_io() {
        let period = Duration::from_secs(1);
        let activity = Arc::new(Activity::default());
        let io = Arc::new(Notify::new());
        let polls = Arc::new(AtomicUsize::new(0));
        let connection = tokio::spawn({
            let (activity, io, polls) = (activity.clone(), io.clone(), polls.clone());
            async move {
                let mut traffic = std::pin::pin!(async {
                    loop {
                        io.notified().await;
                        activity.touch();
                    }
                });
                let counted = std::pin::pin!(poll_fn(|cx| {
                    polls.fetch_add(1, Ordering::Relaxed);
                    traffic.as_mut().poll(cx)
                }));
                with_hibernation(counted, &activity, &Hibernation::new(period)).await
            }
        });
        let asked = || activity.sleep_requested.swap(false, Ordering::Relaxed);
        for round in 0..2 {
            tokio::time::sleep(period * 3).await;
            assert!(asked(), "round {round}: idle, so asked to hibernate");
            let before = polls.load(Ordering::Relaxed);
            tokio::time::sleep(period * 60).await;
            assert_eq!(
                polls.load(Ordering::Relaxed),
                before,
                "round {round}: woken while asleep"
            );
            assert!(!asked(), "round {round}: asked again while asleep");
            // The next I/O starts the idle timer again.
            io.notify_one();
        }
        connection.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn connections_gone_quiet_at_different_moments_are_checked_together() {
        let period = Duration::from_secs(2);
        let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
        // 100 connections going quiet over one period, 20 ms apart.
        for _ in 0..100 {
            let done = done.clone();
            tokio::spawn(async move {
                Activity::default().idle_for(period).await;
                let _ = done.send(Instant::now());
            });
            tokio::time::sleep(period / 100).await;
        }
        drop(done);
        let mut wakeups = std::collections::BTreeSet::new();
        while let Some(at) = finished.recv().await {
            wakeups.insert(at);
        }
        // One period of quiet starts spread over 8 ticks (9 when the
        // first one falls just past a tick).
        assert!(
            wakeups.len() <= TICKS_PER_PERIOD as usize + 1,
            "{} separate idle checks for 100 connections",
            wakeups.len()
        );
    }

    #[test]
    fn a_check_lands_on_the_next_tick_never_before_its_time() {
        let period = Duration::from_secs(2);
        let tick = period / TICKS_PER_PERIOD;
        let base = on_tick(Instant::now(), period);
        for offset_ms in [0u64, 1, 100, 249, 250, 251, 1999] {
            let at = base + Duration::from_millis(offset_ms);
            let due = on_tick(at, period);
            assert!(due >= at, "{offset_ms} ms: due before its time");
            assert!(due - at < tick, "{offset_ms} ms: more than a tick late");
            assert_eq!(on_tick(due, period), due, "{offset_ms} ms: not on the grid");
        }
        // A short period keeps a tick of at least 10 ms, a long one at most 1 s.
        let short = Duration::from_millis(20);
        let at = base + Duration::from_millis(3);
        assert!(on_tick(at, short) - at < MIN_TICK);
        let long = Duration::from_secs(120);
        assert!(on_tick(base + Duration::from_millis(1), long) - base <= MAX_TICK);
    }

    #[tokio::test]
    async fn replayed_bytes_let_go_of_their_buffer_once_read() {
        // A few bytes cut from a large read buffer, as hyper hands them over.
        let buffer = Bytes::from(vec![b'r'; 8192]);
        let mut io = ActivityIo::new(ServerTls::Lost, Arc::default(), Hibernation::disabled());
        io.set_replay(buffer.slice(..100));
        let mut got = [0u8; 100];
        io.read_exact(&mut got).await.expect("replayed bytes");
        assert!(got.iter().all(|&b| b == b'r'));
        assert!(buffer.is_unique(), "the read buffer outlives its replay");
    }
}
