//! Test fixtures for the crates above, behind the `test-util` feature
//! (their dev-dependencies turn it on; no production build has it).
//!
//! [`Chunked`]: an in-memory peer for the parsers' property tests.
//! It hands its bytes out in the chunk sizes it is given and returns
//! `Pending` (having woken itself) before every chunk, so each chunk is a
//! real suspension of the reader under test. It records how many bytes were
//! taken and the largest buffer a read offered: a reader that sizes a buffer
//! for the bytes it still waits for (`read_exact` into `vec![0; len]`)
//! shows that size here, so a claimed length can be checked against a limit.

/// A scripted peer: `data` in `sizes` chunks (cycled), then end of file or,
/// if `stalling`, silence for ever.
pub struct Chunked {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    next: usize,
    ready: bool,
    stall_at_end: bool,
    largest_offer: usize,
}

impl Chunked {
    /// `data` in chunks of `sizes` (cycled; 0 counts as 1; empty: all at once).
    pub fn new(data: Vec<u8>, sizes: Vec<usize>) -> Self {
        Self {
            data,
            pos: 0,
            sizes,
            next: 0,
            ready: false,
            stall_at_end: false,
            largest_offer: 0,
        }
    }

    /// After the data, never answer again (a peer that stalls) instead of EOF.
    pub fn stalling(mut self) -> Self {
        self.stall_at_end = true;
        self
    }

    /// Bytes the reader has taken so far.
    pub fn consumed(&self) -> usize {
        self.pos
    }

    /// The largest buffer any read offered to fill.
    pub fn largest_offer(&self) -> usize {
        self.largest_offer
    }
}

impl tokio::io::AsyncRead for Chunked {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        this.largest_offer = this.largest_offer.max(buf.remaining());
        if this.pos == this.data.len() {
            if this.stall_at_end {
                // Never woken: the reader must be bounded by its own timer.
                return Poll::Pending;
            }
            return Poll::Ready(Ok(()));
        }
        if !this.ready {
            this.ready = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.ready = false;
        let size = match this.sizes.len() {
            0 => usize::MAX,
            n => this.sizes[this.next % n].max(1),
        };
        this.next += 1;
        let n = size.min(buf.remaining()).min(this.data.len() - this.pos);
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// Runs `future` on a fresh current-thread runtime (one per proptest case),
/// failing the case if it has not finished within `guard`: a hang is a
/// failure, never a wait the test relies on.
pub fn run_bounded<F: std::future::Future>(guard: std::time::Duration, future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(async {
            tokio::time::timeout(guard, future)
                .await
                .expect("the reader returned within its bound")
        })
}
