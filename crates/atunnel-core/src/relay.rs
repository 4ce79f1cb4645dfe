//! Bidirectional relay between two [`Endpoint`]s in one task.
//!
//! Both directions are polled from the same future, so a tunnel costs one
//! task, and a direction holds a buffer only between reading a chunk and
//! finishing writing it. It reads only once the destination can take bytes
//! ([`Endpoint::poll_send_capacity`]), so bytes behind a peer that stopped
//! reading wait upstream, under flow control, and a write blocked anyway
//! gives its pooled buffer back after [`SPILL_AFTER`] (the rest is copied
//! out). End of stream on one side becomes a half-close on the other while
//! the opposite direction keeps flowing; the relay ends when both
//! directions have ended, or at the first error, or at a [`RelayBounds`]
//! bound: a tunnel that can never finish does not live forever. A relay
//! that does not end cleanly (an error, a bound, or its future dropped)
//! aborts both sides: a peer sees a reset, never a clean end of a stream cut
//! short.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::endpoint::{Chunk, Endpoint};
use crate::pool::BufferPool;

/// Chunks one direction may move in one poll before yielding, so a fast
/// direction cannot starve the other or the runtime.
const CHUNKS_PER_POLL: usize = 16;

/// How long a write may stay blocked holding a pooled buffer before the
/// unwritten rest is copied into memory of its own and the buffer goes
/// back to the pool: a peer that stopped reading must not take a buffer
/// the other tunnels share. A socket drained by a live reader is writable
/// again well within this, so a transfer in flight never pays the copy.
pub const SPILL_AFTER: Duration = Duration::from_millis(20);

/// Default of [`RelayBounds::write_stall`].
pub const DEFAULT_WRITE_STALL: Duration = Duration::from_secs(60);

/// Default of [`RelayBounds::half_closed_idle`].
pub const DEFAULT_HALF_CLOSED_IDLE: Duration = Duration::from_secs(60);

/// Bounds on a relay that cannot finish; past either, both sides reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayBounds {
    /// How long a direction may have bytes to write and write none (its
    /// destination stopped reading, or grants no HTTP/2 window). Also ends
    /// a tunnel whose source has closed while its last bytes wait.
    pub write_stall: Duration,
    /// How long the open direction may move nothing once the other one
    /// has ended (a half-closed tunnel left idle).
    pub half_closed_idle: Duration,
}

impl Default for RelayBounds {
    fn default() -> Self {
        Self {
            write_stall: DEFAULT_WRITE_STALL,
            half_closed_idle: DEFAULT_HALF_CLOSED_IDLE,
        }
    }
}

/// Bytes moved in each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    pub a_to_b: u64,
    pub b_to_a: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    CloseWrite,
    /// A write made no progress for [`RelayBounds::write_stall`].
    StalledWrite,
    /// Half-closed and idle for [`RelayBounds::half_closed_idle`].
    HalfClosedIdle,
}

/// Why a relay stopped early; carries the bytes moved until then.
#[derive(Debug, thiserror::Error)]
#[error("relay failed to {op:?} side {side:?} after {stats:?}: {source}")]
pub struct RelayError {
    pub side: Side,
    pub op: Op,
    pub stats: RelayStats,
    #[source]
    pub source: io::Error,
}

impl RelayError {
    /// True when a [`RelayBounds`] bound ended the relay.
    pub fn is_bound(&self) -> bool {
        matches!(self.op, Op::StalledWrite | Op::HalfClosedIdle)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Reading,
    /// A write could not finish in the poll that read its chunk: the chunk
    /// waits in the relay's boxed [`Clocks`] (which time that write), so
    /// an idle direction keeps no room for one (every idle tunnel's task
    /// has two directions).
    Writing,
    Closing,
    Done,
}

/// A chunk read and not yet all written, and its length when read.
struct Writing {
    chunk: Chunk,
    len: usize,
}

struct Direction {
    state: State,
    bytes: u64,
    /// Written since the last flush: flush before waiting on the source again,
    /// or TLS would hold the tail of a burst.
    unflushed: bool,
    /// Bytes are waiting for the destination (its window or its socket)
    /// and none were written since; the relay's [`Clocks`] time it.
    blocked: bool,
    /// Some bytes were written since the relay last looked.
    wrote: bool,
}

/// An error from one direction: which end (source or destination) and what.
struct DirError {
    at_source: bool,
    op: Op,
    err: io::Error,
}

impl Direction {
    fn new() -> Self {
        Self {
            state: State::Reading,
            bytes: 0,
            unflushed: false,
            blocked: false,
            wrote: false,
        }
    }

    /// (blocked now, wrote since the last call).
    fn take_progress(&mut self) -> (bool, bool) {
        (self.blocked, std::mem::take(&mut self.wrote))
    }

    fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn blocked(&mut self) {
        self.blocked = true;
    }

    /// A chunk of `len` bytes is all written.
    fn written<S: Endpoint + ?Sized>(&mut self, src: &mut S, len: usize) {
        self.blocked = false;
        src.consumed(len);
        self.bytes += len as u64;
        self.unflushed = true;
    }

    /// Moves what it can; `Ok(moved)` with the chunks written when it has to
    /// wait. A chunk whose write must wait is kept in `timer`'s clocks, as
    /// direction `at`'s.
    fn poll<S: Endpoint + ?Sized, D: Endpoint + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut S,
        dst: &mut D,
        pool: &BufferPool,
        timer: &mut Timer,
        at: usize,
    ) -> Poll<Result<usize, DirError>> {
        let dst_err = |op| {
            move |err| DirError {
                at_source: false,
                op,
                err,
            }
        };
        let src_err = |err| DirError {
            at_source: true,
            op: Op::Read,
            err,
        };
        let mut moved = 0;
        loop {
            match self.state {
                State::Reading => {
                    if moved == CHUNKS_PER_POLL {
                        cx.waker().wake_by_ref();
                        return Poll::Ready(Ok(moved));
                    }
                    // No buffer until the source has bytes and the
                    // destination room for them.
                    let read = match src.poll_readable(cx) {
                        Poll::Ready(Ok(())) if !src.reads_into_pool() => {
                            src.poll_read_chunk(cx, pool, usize::MAX)
                        }
                        Poll::Ready(Ok(())) => match dst.poll_send_capacity(cx) {
                            Poll::Ready(Ok(room)) => src.poll_read_chunk(cx, pool, room),
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(dst_err(Op::Write)(e))),
                            Poll::Pending => {
                                self.blocked();
                                return Poll::Ready(Ok(moved));
                            }
                        },
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(src_err(e))),
                        Poll::Pending => Poll::Pending,
                    };
                    match read {
                        Poll::Pending => {
                            // Nothing to write: a cut of the destination
                            // must still end the relay (what it took may
                            // be lost), not wait for the source's next byte.
                            if let Poll::Ready(e) = dst.poll_write_cut(cx) {
                                return Poll::Ready(Err(dst_err(Op::Write)(e)));
                            }
                            // Waiting on the source is not a stalled write.
                            self.blocked = false;
                            dst.idle();
                            if self.unflushed {
                                ready!(dst.poll_flush(cx)).map_err(dst_err(Op::Flush))?;
                                self.unflushed = false;
                            }
                            return Poll::Ready(Ok(moved));
                        }
                        Poll::Ready(Ok(Some(chunk))) => {
                            // Written from here: boxed only if it must wait.
                            let len = chunk.len();
                            let mut w = Writing { chunk, len };
                            match write_out(cx, dst, &mut w, &mut self.wrote) {
                                Poll::Ready(r) => r.map_err(dst_err(Op::Write))?,
                                Poll::Pending => {
                                    timer.clocks().writing[at] = Some(w);
                                    self.state = State::Writing;
                                    self.blocked();
                                    return Poll::Ready(Ok(moved));
                                }
                            }
                            self.written(src, len);
                            moved += 1;
                        }
                        Poll::Ready(Ok(None)) => self.state = State::Closing,
                        Poll::Ready(Err(err)) => return Poll::Ready(Err(src_err(err))),
                    }
                }
                State::Writing => {
                    let Some(w) = timer.writing(at) else {
                        // Not reached: the chunk is kept until written.
                        self.state = State::Reading;
                        continue;
                    };
                    match write_out(cx, dst, w, &mut self.wrote) {
                        Poll::Ready(r) => r.map_err(dst_err(Op::Write))?,
                        Poll::Pending => {
                            self.blocked();
                            return Poll::Ready(Ok(moved));
                        }
                    }
                    let len = w.len;
                    // Drops the chunk: a pooled buffer goes back now.
                    timer.take_written(at);
                    self.state = State::Reading;
                    self.written(src, len);
                    moved += 1;
                }
                State::Closing => {
                    match dst.poll_close_write(cx) {
                        Poll::Ready(r) => r.map_err(dst_err(Op::CloseWrite))?,
                        Poll::Pending => {
                            self.blocked();
                            return Poll::Ready(Ok(moved));
                        }
                    }
                    self.blocked = false;
                    self.unflushed = false;
                    self.state = State::Done;
                }
                State::Done => return Poll::Ready(Ok(moved)),
            }
        }
    }
}

/// Writes `w` until all of it is written; any progress sets `wrote`.
fn write_out<D: Endpoint + ?Sized>(
    cx: &mut Context<'_>,
    dst: &mut D,
    w: &mut Writing,
    wrote: &mut bool,
) -> Poll<io::Result<()>> {
    loop {
        ready!(dst.poll_write_chunk(cx, &mut w.chunk))?;
        *wrote = true;
        if w.chunk.is_empty() {
            return Poll::Ready(Ok(()));
        }
    }
}

/// How long a relay with nothing to time keeps its [`Clocks`]: a tunnel
/// moving bytes reuses them (a write blocked between chunks costs no
/// allocation), an idle one gives them back.
const CLOCKS_KEPT: Duration = Duration::from_secs(1);

/// The relay's timing: when each direction's write blocked, since when it
/// is half-closed and idle, and the one timer for the next deadline; and
/// the chunk each blocked write holds. Boxed, made at the first blocked
/// write or half-close and dropped once the relay has had nothing to time
/// for [`CLOCKS_KEPT`]: an idle tunnel holds none of it.
struct Clocks {
    /// Each direction's chunk whose write is waiting (which is then timed).
    writing: [Option<Writing>; 2],
    blocked_since: [Option<Instant>; 2],
    half_closed_since: Option<Instant>,
    sleep: Pin<Box<Sleep>>,
    /// The timer counts down [`CLOCKS_KEPT`], not a deadline.
    releasing: bool,
}

#[derive(Default)]
struct Timer(Option<Box<Clocks>>);

impl Timer {
    /// The clocks, made if the relay has none.
    fn clocks(&mut self) -> &mut Clocks {
        self.0.get_or_insert_with(|| {
            Box::new(Clocks {
                writing: [None, None],
                blocked_since: [None, None],
                half_closed_since: None,
                sleep: Box::pin(tokio::time::sleep(CLOCKS_KEPT)),
                releasing: false,
            })
        })
    }

    /// Direction `at`'s chunk whose write is waiting.
    fn writing(&mut self, at: usize) -> Option<&mut Writing> {
        self.0.as_mut().and_then(|c| c.writing[at].as_mut())
    }

    /// Direction `at`'s chunk is all written: drops it (a pooled buffer goes
    /// back to its pool).
    fn take_written(&mut self, at: usize) {
        if let Some(clocks) = &mut self.0 {
            clocks.writing[at] = None;
        }
    }

    /// When direction `at`'s pooled buffer should be spilled, if it holds
    /// one behind a write blocked since `since`.
    fn spill_at(&self, at: usize, since: Option<Instant>) -> Option<Instant> {
        let writing = self.0.as_ref().and_then(|c| c.writing[at].as_ref());
        match (writing, since) {
            (Some(w), Some(t)) if matches!(w.chunk, Chunk::Pooled { .. }) => Some(t + SPILL_AFTER),
            _ => None,
        }
    }

    fn spill(&mut self, at: usize, pool: &BufferPool) {
        if let Some(w) = self.writing(at)
            && w.chunk.spill()
        {
            pool.count_spill();
        }
    }

    /// Times each direction's blocked write, given (blocked now, wrote
    /// since last time): from when it was seen blocked with nothing
    /// written since, until it writes.
    fn track_blocked(&mut self, progress: [(bool, bool); 2]) {
        if progress.iter().any(|(blocked, _)| *blocked) {
            let clocks = self.clocks();
            for (since, (blocked, wrote)) in clocks.blocked_since.iter_mut().zip(progress) {
                match (blocked, *since) {
                    (false, _) => *since = None,
                    (true, None) => *since = Some(Instant::now()),
                    (true, Some(_)) if wrote => *since = Some(Instant::now()),
                    (true, Some(_)) => {}
                }
            }
        } else if let Some(clocks) = &mut self.0 {
            clocks.blocked_since = [None, None];
        }
    }

    /// Times a half-closed relay: from its last byte, or the half-close.
    fn track_half_closed(&mut self, half_closed: bool, moved: bool) {
        if half_closed {
            let clocks = self.clocks();
            if moved || clocks.half_closed_since.is_none() {
                clocks.half_closed_since = Some(Instant::now());
            }
        } else if let Some(clocks) = &mut self.0 {
            clocks.half_closed_since = None;
        }
    }

    fn blocked_since(&self) -> [Option<Instant>; 2] {
        self.0.as_ref().map_or([None, None], |c| c.blocked_since)
    }

    fn half_closed_since(&self) -> Option<Instant> {
        self.0.as_ref().and_then(|c| c.half_closed_since)
    }

    /// Polls the timer set to `at`; ready once `at` passed. With nothing to
    /// time, it counts down [`CLOCKS_KEPT`] and then drops the clocks.
    fn poll(&mut self, cx: &mut Context<'_>, at: Option<Instant>) -> Poll<()> {
        let Some(clocks) = &mut self.0 else {
            return Poll::Pending;
        };
        let deadline = match at {
            Some(at) => {
                clocks.releasing = false;
                at
            }
            None if clocks.releasing => clocks.sleep.deadline(),
            None => {
                clocks.releasing = true;
                Instant::now() + CLOCKS_KEPT
            }
        };
        if clocks.sleep.deadline() != deadline {
            clocks.sleep.as_mut().reset(deadline);
        }
        ready!(clocks.sleep.as_mut().poll(cx));
        if at.is_none() {
            // A waiting chunk is always timed, so this is a relay with
            // nothing held.
            if clocks.writing.iter().all(Option::is_none) {
                self.0 = None;
            }
            return Poll::Pending;
        }
        Poll::Ready(())
    }
}

/// Relays between `a` and `b` until both directions have ended, within
/// the default [`RelayBounds`].
pub fn relay<'a, A, B>(
    a: &'a mut A,
    b: &'a mut B,
    pool: &'a BufferPool,
) -> impl Future<Output = Result<RelayStats, RelayError>>
where
    A: Endpoint + ?Sized,
    B: Endpoint + ?Sized,
{
    relay_within(a, b, pool, &DEFAULT_BOUNDS)
}

/// [`RelayBounds::default`], for [`relay`] to borrow: a bound held by
/// reference costs each tunnel's future 8 bytes, not 32.
static DEFAULT_BOUNDS: RelayBounds = RelayBounds {
    write_stall: DEFAULT_WRITE_STALL,
    half_closed_idle: DEFAULT_HALF_CLOSED_IDLE,
};

/// Relays between `a` and `b` until both directions have ended.
///
/// Unless it ends cleanly, both sides are aborted ([`Endpoint::abort`]): on
/// an error, at a bound, and when the returned future is dropped first
/// (cancelled, its task aborted, its server shutting down), polled or not.
/// Dropping it also drops any chunk in flight, which returns its buffer to
/// `pool`.
pub fn relay_within<'a, A, B>(
    a: &'a mut A,
    b: &'a mut B,
    pool: &'a BufferPool,
    bounds: &'a RelayBounds,
) -> RelayWithin<'a, A, B>
where
    A: Endpoint + ?Sized,
    B: Endpoint + ?Sized,
{
    RelayWithin {
        // Aborts once dropped unless both directions are done, so that
        // even a future dropped unpolled aborts.
        a,
        b,
        a_to_b: Direction::new(),
        b_to_a: Direction::new(),
        timer: Timer::default(),
        pool,
        bounds,
    }
}

/// The future of [`relay_within`], held by every idle tunnel for its life.
/// A struct rather than an `async` block, which kept its arguments twice
/// and the references of its `poll_fn` beside them (88 B more per tunnel).
pub struct RelayWithin<'a, A: Endpoint + ?Sized, B: Endpoint + ?Sized> {
    a: &'a mut A,
    b: &'a mut B,
    a_to_b: Direction,
    b_to_a: Direction,
    timer: Timer,
    pool: &'a BufferPool,
    bounds: &'a RelayBounds,
}

impl<A: Endpoint + ?Sized, B: Endpoint + ?Sized> Future for RelayWithin<'_, A, B> {
    type Output = Result<RelayStats, RelayError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let result = ready!(this.poll_directions(cx));
        Poll::Ready(result.map_err(|(side, e, stats)| RelayError {
            side,
            op: e.op,
            stats,
            source: e.err,
        }))
    }
}

/// Dropped before it ended cleanly (both directions done, which is also
/// the only way it ends without an error), the relay aborts both sides.
/// Not a guard field of its own: that flag cost every tunnel 8 B.
impl<A: Endpoint + ?Sized, B: Endpoint + ?Sized> Drop for RelayWithin<'_, A, B> {
    fn drop(&mut self) {
        if !(self.a_to_b.is_done() && self.b_to_a.is_done()) {
            self.a.abort();
            self.b.abort();
        }
    }
}

impl<A: Endpoint + ?Sized, B: Endpoint + ?Sized> RelayWithin<'_, A, B> {
    /// Moves bytes both ways until both have ended, a side fails, or a
    /// bound is due.
    #[allow(clippy::type_complexity)]
    fn poll_directions(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RelayStats, (Side, DirError, RelayStats)>> {
        let Self {
            a,
            b,
            a_to_b,
            b_to_a,
            timer,
            pool,
            bounds,
        } = self;
        let (pool, bounds) = (*pool, *bounds);
        let stats = |x: &Direction, y: &Direction| RelayStats {
            a_to_b: x.bytes,
            b_to_a: y.bytes,
        };
        loop {
            let moved = match a_to_b.poll(cx, *a, *b, pool, timer, 0) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => {
                    let side = if e.at_source { Side::A } else { Side::B };
                    return Poll::Ready(Err((side, e, stats(a_to_b, b_to_a))));
                }
                Poll::Pending => 0,
            };
            let moved = moved
                + match b_to_a.poll(cx, *b, *a, pool, timer, 1) {
                    Poll::Ready(Ok(n)) => n,
                    Poll::Ready(Err(e)) => {
                        let side = if e.at_source { Side::B } else { Side::A };
                        return Poll::Ready(Err((side, e, stats(a_to_b, b_to_a))));
                    }
                    Poll::Pending => 0,
                };
            let (a_done, b_done) = (a_to_b.is_done(), b_to_a.is_done());
            if a_done && b_done {
                return Poll::Ready(Ok(stats(a_to_b, b_to_a)));
            }
            timer.track_half_closed(a_done != b_done, moved > 0);
            timer.track_blocked([a_to_b.take_progress(), b_to_a.take_progress()]);
            let since = timer.blocked_since();
            let stall = since
                .into_iter()
                .flatten()
                .min()
                .map(|t| t + bounds.write_stall);
            let idle = timer
                .half_closed_since()
                .map(|t| t + bounds.half_closed_idle);
            let spill = timer
                .spill_at(0, since[0])
                .into_iter()
                .chain(timer.spill_at(1, since[1]))
                .min();
            let next = [stall, idle, spill].into_iter().flatten().min();
            if timer.poll(cx, next).is_pending() {
                return Poll::Pending;
            }
            // The timer fired, so `next` is due, whatever the clock reads.
            let now = next.map_or_else(Instant::now, |t| t.max(Instant::now()));
            let bound = |op, side, what: &str| {
                let e = DirError {
                    at_source: false,
                    op,
                    err: io::Error::new(io::ErrorKind::TimedOut, what.to_string()),
                };
                Poll::Ready(Err((side, e, stats(a_to_b, b_to_a))))
            };
            if stall.is_some_and(|t| t <= now) {
                let side = if since[0].is_some_and(|t| t + bounds.write_stall <= now) {
                    Side::B
                } else {
                    Side::A
                };
                return bound(
                    Op::StalledWrite,
                    side,
                    &format!("no byte written for {:?}", bounds.write_stall),
                );
            }
            if idle.is_some_and(|t| t <= now) {
                // The side whose bytes never came.
                let side = if a_to_b.is_done() { Side::B } else { Side::A };
                return bound(
                    Op::HalfClosedIdle,
                    side,
                    &format!("half-closed and idle for {:?}", bounds.half_closed_idle),
                );
            }
            // Neither bound was due, so a spill was.
            for (at, since) in since.into_iter().enumerate() {
                if timer.spill_at(at, since).is_some_and(|t| t <= now) {
                    timer.spill(at, pool);
                }
            }
            // A spill came due: poll again, with the timer re-set.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side with nothing to send (end of stream at once) that counts its
    /// aborts.
    #[derive(Default)]
    struct Empty {
        aborts: usize,
    }

    impl Endpoint for Empty {
        fn poll_read_chunk(
            &mut self,
            _: &mut Context<'_>,
            _: &BufferPool,
            _: usize,
        ) -> Poll<io::Result<Option<Chunk>>> {
            Poll::Ready(Ok(None))
        }
        fn poll_write_chunk(&mut self, _: &mut Context<'_>, _: &mut Chunk) -> Poll<io::Result<()>> {
            unreachable!("an empty peer sends nothing to write")
        }
        fn poll_flush(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close_write(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn abort(&mut self) {
            self.aborts += 1;
        }
    }

    /// A relay cancelled before its first poll (a select whose other branch
    /// was already ready) aborts both sides too; a clean end aborts neither.
    #[tokio::test]
    async fn a_relay_dropped_unpolled_aborts_both_sides_and_a_clean_one_neither() {
        let pool = BufferPool::default();
        let (mut a, mut b) = (Empty::default(), Empty::default());
        drop(relay(&mut a, &mut b, &pool));
        assert_eq!((a.aborts, b.aborts), (1, 1), "dropped unpolled");

        let (mut a, mut b) = (Empty::default(), Empty::default());
        let stats = relay(&mut a, &mut b, &pool).await.expect("both ended");
        assert_eq!(stats, RelayStats::default());
        assert_eq!((a.aborts, b.aborts), (0, 0), "ended cleanly");
    }

    /// Gives one pooled chunk of `len` bytes, then waits forever.
    struct OneChunk {
        len: usize,
        given: bool,
    }

    impl Endpoint for OneChunk {
        fn poll_read_chunk(
            &mut self,
            cx: &mut Context<'_>,
            pool: &BufferPool,
            max: usize,
        ) -> Poll<io::Result<Option<Chunk>>> {
            if self.given {
                return Poll::Pending;
            }
            let mut buf = ready!(pool.poll_acquire(cx));
            let end = self.len.min(max).min(buf.as_mut_slice().len());
            for (i, b) in buf.as_mut_slice()[..end].iter_mut().enumerate() {
                *b = i as u8;
            }
            self.given = true;
            Poll::Ready(Ok(Some(Chunk::Pooled { buf, start: 0, end })))
        }
        fn poll_write_chunk(&mut self, _: &mut Context<'_>, _: &mut Chunk) -> Poll<io::Result<()>> {
            Poll::Pending
        }
        fn poll_flush(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close_write(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    /// Says it has room, then takes nothing until opened; keeps what it took.
    #[derive(Default)]
    struct Gate {
        open: std::sync::Arc<std::sync::atomic::AtomicBool>,
        waker: std::sync::Arc<std::sync::Mutex<Option<std::task::Waker>>>,
        got: Vec<u8>,
        aborted: bool,
    }

    impl Endpoint for Gate {
        fn poll_read_chunk(
            &mut self,
            _: &mut Context<'_>,
            _: &BufferPool,
            _: usize,
        ) -> Poll<io::Result<Option<Chunk>>> {
            Poll::Pending
        }
        fn poll_write_chunk(
            &mut self,
            cx: &mut Context<'_>,
            chunk: &mut Chunk,
        ) -> Poll<io::Result<()>> {
            if !self.open.load(std::sync::atomic::Ordering::SeqCst) {
                *self.waker.lock().expect("lock") = Some(cx.waker().clone());
                return Poll::Pending;
            }
            self.got.extend_from_slice(chunk.remaining());
            chunk.advance(chunk.len());
            Poll::Ready(Ok(()))
        }
        fn poll_flush(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close_write(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn abort(&mut self) {
            self.aborted = true;
        }
    }

    /// A write blocked for SPILL_AFTER gives its pooled buffer back with
    /// its bytes copied out; they are all written once the destination
    /// takes bytes again. Blocked for `write_stall`, the relay ends.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_write_spills_its_buffer_and_loses_nothing() {
        let pool = BufferPool::new(4096, 4, 4);
        let mut src = OneChunk {
            len: 1000,
            given: false,
        };
        let mut dst = Gate::default();
        let (open, waker) = (dst.open.clone(), dst.waker.clone());
        let bounds = RelayBounds {
            write_stall: Duration::from_secs(10),
            half_closed_idle: Duration::from_secs(10),
        };
        {
            let mut relay = std::pin::pin!(relay_within(&mut src, &mut dst, &pool, &bounds));
            let mut poll_once = || {
                let waker = std::task::Waker::noop();
                relay
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_pending()
            };
            assert!(poll_once());
            assert_eq!(pool.stats().in_use, 1, "the chunk waits in its buffer");
            tokio::time::advance(SPILL_AFTER).await;
            assert!(poll_once());
            let s = pool.stats();
            assert_eq!((s.in_use, s.spilled_total), (0, 1), "spilled: {s:?}");
            open.store(true, std::sync::atomic::Ordering::SeqCst);
            if let Some(w) = waker.lock().expect("lock").take() {
                w.wake();
            }
            assert!(poll_once());
        }
        let want: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        assert_eq!(dst.got, want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_blocked_past_the_bound_ends_the_relay_and_aborts_both() {
        let pool = BufferPool::new(4096, 4, 4);
        let mut src = OneChunk {
            len: 1000,
            given: false,
        };
        let mut dst = Gate::default();
        let bounds = RelayBounds {
            write_stall: Duration::from_secs(10),
            half_closed_idle: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let err = relay_within(&mut src, &mut dst, &pool, &bounds)
            .await
            .expect_err("the bound");
        assert_eq!((err.op, err.side), (Op::StalledWrite, Side::B));
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
        assert!(dst.aborted);
        assert_eq!(pool.stats().in_use, 0);
    }
}
