//! Bidirectional relay between two [`Endpoint`]s in one task.
//!
//! Both directions are polled from the same future, so a tunnel costs one
//! task, and a direction holds a buffer only between reading a chunk and
//! finishing writing it. End of stream on one side becomes a half-close on
//! the other while the opposite direction keeps flowing; the relay ends when
//! both directions have ended, or at the first error, which aborts both
//! sides: a peer sees a reset, never a clean end of a stream cut short.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, ready};

use tokio::net::TcpStream;

use crate::endpoint::{Chunk, Endpoint, set_reset_on_close};
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

/// Relays between `a` and `b` until both directions have ended.
///
/// Dropping the returned future (cancellation) drops any chunk in flight,
/// which returns its buffer to `pool`.
pub async fn relay<A, B>(a: &mut A, b: &mut B, pool: &BufferPool) -> Result<RelayStats, RelayError>
where
    A: Endpoint + ?Sized,
    B: Endpoint + ?Sized,
{
    let mut a_to_b = Direction::new();
    let mut b_to_a = Direction::new();
    let result = poll_fn(|cx| {
        let stats = |x: &Direction, y: &Direction| RelayStats {
            a_to_b: x.bytes,
            b_to_a: y.bytes,
        };
        if let Poll::Ready(Err(e)) = a_to_b.poll(cx, a, b, pool) {
            let side = if e.at_source { Side::A } else { Side::B };
            return Poll::Ready(Err((side, e, stats(&a_to_b, &b_to_a))));
        }
        if let Poll::Ready(Err(e)) = b_to_a.poll(cx, b, a, pool) {
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
    result.map_err(|(side, e, stats)| {
        a.abort();
        b.abort();
        RelayError {
            side,
            op: e.op,
            stats,
            source: e.err,
        }
    })
}

/// [`relay`] to the TCP stream `b`, which resets when closed until the relay
/// has ended cleanly: should this future be dropped mid-relay (its server
/// shutting down), `b`'s peer sees a reset, not a clean end of a cut stream.
pub async fn relay_resetting_unless_done<A: Endpoint + ?Sized>(
    a: &mut A,
    b: &mut TcpStream,
    pool: &BufferPool,
) -> Result<RelayStats, RelayError> {
    set_reset_on_close(b, true);
    let result = relay(a, b, pool).await;
    if result.is_ok() {
        // Both directions ended with FIN: the close must deliver what the
        // kernel still holds, not drop it.
        set_reset_on_close(b, false);
    }
    result
}
