//! Bidirectional relay between two [`Endpoint`]s in one task.
//!
//! Both directions are polled from the same future, so a tunnel costs one
//! task, and a direction holds a buffer only between reading a chunk and
//! finishing writing it. End of stream on one side becomes a half-close on
//! the other while the opposite direction keeps flowing; the relay ends when
//! both directions have ended, or at the first error. A relay that does not
//! end cleanly (an error, or its future dropped) aborts both sides: a peer
//! sees a reset, never a clean end of a stream cut short.

use std::fmt;
use std::future::{Future, poll_fn};
use std::io;
use std::task::{Context, Poll, ready};

use crate::endpoint::{Chunk, Endpoint};
use crate::pool::BufferPool;

/// Chunks one direction may move in one poll before yielding, so a fast
/// direction cannot starve the other or the runtime.
const CHUNKS_PER_POLL: usize = 16;

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

enum State {
    Reading,
    Writing { chunk: Chunk, len: usize },
    Closing,
    Done,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Reading => f.write_str("Reading"),
            State::Writing { len, .. } => write!(f, "Writing({len})"),
            State::Closing => f.write_str("Closing"),
            State::Done => f.write_str("Done"),
        }
    }
}

struct Direction {
    state: State,
    bytes: u64,
    /// Written since the last flush: flush before waiting on the source again,
    /// or TLS would hold the tail of a burst.
    unflushed: bool,
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
        }
    }

    fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn poll<S: Endpoint + ?Sized, D: Endpoint + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut S,
        dst: &mut D,
        pool: &BufferPool,
    ) -> Poll<Result<(), DirError>> {
        let dst_err = |op| {
            move |err| DirError {
                at_source: false,
                op,
                err,
            }
        };
        let mut moved = 0;
        loop {
            match &mut self.state {
                State::Reading => {
                    if moved == CHUNKS_PER_POLL {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    match src.poll_read_chunk(cx, pool) {
                        Poll::Pending => {
                            if self.unflushed {
                                ready!(dst.poll_flush(cx)).map_err(dst_err(Op::Flush))?;
                                self.unflushed = false;
                            }
                            return Poll::Pending;
                        }
                        Poll::Ready(Ok(Some(chunk))) => {
                            let len = chunk.len();
                            self.state = State::Writing { chunk, len };
                        }
                        Poll::Ready(Ok(None)) => self.state = State::Closing,
                        Poll::Ready(Err(err)) => {
                            return Poll::Ready(Err(DirError {
                                at_source: true,
                                op: Op::Read,
                                err,
                            }));
                        }
                    }
                }
                State::Writing { chunk, len } => {
                    ready!(dst.poll_write_chunk(cx, chunk)).map_err(dst_err(Op::Write))?;
                    if chunk.is_empty() {
                        let len = *len;
                        // Drops the chunk: a pooled buffer goes back now.
                        self.state = State::Reading;
                        src.consumed(len);
                        self.bytes += len as u64;
                        self.unflushed = true;
                        moved += 1;
                    }
                }
                State::Closing => {
                    ready!(dst.poll_close_write(cx)).map_err(dst_err(Op::CloseWrite))?;
                    self.unflushed = false;
                    self.state = State::Done;
                }
                State::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// The two sides of a relay; dropped before the relay ended cleanly, it
/// aborts both.
struct Sides<'a, A: Endpoint + ?Sized, B: Endpoint + ?Sized> {
    a: &'a mut A,
    b: &'a mut B,
    clean: bool,
}

impl<A: Endpoint + ?Sized, B: Endpoint + ?Sized> Drop for Sides<'_, A, B> {
    fn drop(&mut self) {
        if !self.clean {
            self.a.abort();
            self.b.abort();
        }
    }
}

/// Relays between `a` and `b` until both directions have ended.
///
/// Unless it ends cleanly, both sides are aborted ([`Endpoint::abort`]): on
/// an error, and when the returned future is dropped first (cancelled, its
/// task aborted, its server shutting down), polled or not. Dropping it also
/// drops any chunk in flight, which returns its buffer to `pool`.
pub fn relay<'a, A, B>(
    a: &'a mut A,
    b: &'a mut B,
    pool: &'a BufferPool,
) -> impl Future<Output = Result<RelayStats, RelayError>>
where
    A: Endpoint + ?Sized,
    B: Endpoint + ?Sized,
{
    // Made before the first poll, so that even a future dropped unpolled
    // aborts.
    let sides = Sides { a, b, clean: false };
    async move {
        let mut sides = sides;
        let mut a_to_b = Direction::new();
        let mut b_to_a = Direction::new();
        let result = poll_fn(|cx| {
            let stats = |x: &Direction, y: &Direction| RelayStats {
                a_to_b: x.bytes,
                b_to_a: y.bytes,
            };
            if let Poll::Ready(Err(e)) = a_to_b.poll(cx, sides.a, sides.b, pool) {
                let side = if e.at_source { Side::A } else { Side::B };
                return Poll::Ready(Err((side, e, stats(&a_to_b, &b_to_a))));
            }
            if let Poll::Ready(Err(e)) = b_to_a.poll(cx, sides.b, sides.a, pool) {
                let side = if e.at_source { Side::B } else { Side::A };
                return Poll::Ready(Err((side, e, stats(&a_to_b, &b_to_a))));
            }
            if a_to_b.is_done() && b_to_a.is_done() {
                Poll::Ready(Ok(stats(&a_to_b, &b_to_a)))
            } else {
                Poll::Pending
            }
        })
        .await;
        sides.clean = result.is_ok();
        result.map_err(|(side, e, stats)| RelayError {
            side,
            op: e.op,
            stats,
            source: e.err,
        })
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
}
