//! HTTP/2 control-frame floods, bounded per connection under any HTTP/2
//! server or client (h2's, or hyper's over it): an IO wrapper that walks
//! the frame headers going each way and ends a connection whose peer sends
//! more frames that do no work for the application than the budget allows.
//!
//! h2 0.4 bounds rapid resets, CONTINUATION and its own error resets, and
//! answers PING and SETTINGS one at a time (it stops reading while an
//! answer is unsent), but counts nothing else: a peer that reads its
//! answers can have SETTINGS, PING, WINDOW_UPDATE, PRIORITY, empty DATA or
//! HEADERS on closed streams processed for ever, one core's worth. No crate
//! bounds that below h2 (Envoy, nginx and HAProxy each do it inside their
//! own HTTP/2 codec), hence this one, under every HTTP/2 endpoint of
//! atunnel and the gateway.
//!
//! The rule is a token bucket per connection, Envoy's ratio with a time
//! refill: [`CONTROL_FRAME_BUDGET`] frames to start with; each control
//! frame read spends one; each useful frame (a request opening a stream, a
//! non-empty DATA either way, a HEADERS sent) puts [`REFILL_PER_USEFUL`]
//! back (Envoy's `max_inbound_window_update_frames_per_data_frame_sent`,
//! 10), up to the budget; and once empty it refills at
//! [`CONTROL_FRAMES_PER_SECOND`] for the time since it last did, so a
//! keepalive PING every few seconds for years is never cut. A burst is cut
//! within twice the budget (the first empty bucket refills once for the
//! time the connection lived). Then a GOAWAY ENHANCE_YOUR_CALM is written
//! when it can be at a frame boundary of what h2 writes (else the
//! connection is only closed), and reads and writes fail, which ends h2's
//! connection, and the flood is counted.
//!
//! Cost: frame headers only (read in place, payloads skipped, never
//! buffered), so O(frames) not O(bytes): 398 instructions a proxied
//! request (six frames, release); no allocation, no syscall
//! (the clock is read only when the bucket is empty), 88 B of state.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::limits::{CONTROL_FRAME_BUDGET, CONTROL_FRAMES_PER_SECOND, REFILL_PER_USEFUL};

/// Which end of the connection this side is: a server reads the client's
/// preface and takes HEADERS on a new stream as a request; a client
/// writes the preface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// The control-frame budget of each connection of one endpoint (flags
/// `--h2-control-frame-budget` and `--h2-control-frames-per-second`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloodLimits {
    /// Control frames a connection may send before they must be paid for
    /// ([`CONTROL_FRAME_BUDGET`]).
    pub budget: u32,
    /// Control frames a second an emptied budget earns back with time
    /// alone ([`CONTROL_FRAMES_PER_SECOND`]).
    pub per_second: u32,
}

impl Default for FloodLimits {
    fn default() -> Self {
        Self {
            budget: CONTROL_FRAME_BUDGET,
            per_second: CONTROL_FRAMES_PER_SECOND,
        }
    }
}

/// One endpoint's connections' limits, and how many were ended for a
/// flood: shared, so a connection carries only its own budget.
#[derive(Debug, Default)]
pub struct FloodCount {
    ended: AtomicU64,
    limits: FloodLimits,
}

impl FloodCount {
    pub fn with_limits(limits: FloodLimits) -> Self {
        Self {
            ended: AtomicU64::new(0),
            limits,
        }
    }

    pub fn total(&self) -> u64 {
        self.ended.load(Ordering::Relaxed)
    }
}

const PREFACE_LEN: u8 = 24;
const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// GOAWAY: length 8, type 7, no flags, stream 0; the last stream and
/// ENHANCE_YOUR_CALM (0xb) follow.
const GOAWAY_HEAD: [u8; FRAME_HEAD] = [0, 0, 8, 7, 0, 0, 0, 0, 0];
const GOAWAY_LEN: usize = FRAME_HEAD + 8;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A frame header as walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    len: u32,
    kind: u8,
    stream: u32,
}

impl Head {
    fn parse(h: &[u8; FRAME_HEAD]) -> Self {
        Self {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]),
            kind: h[3],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        }
    }
}

/// Where one direction's byte stream is: in the preface, a frame header,
/// or a payload (skipped).
#[derive(Debug)]
struct Walker {
    preface: u8,
    payload_left: u32,
    head: [u8; FRAME_HEAD],
    head_len: u8,
}

impl Walker {
    fn new(preface: bool) -> Self {
        Self {
            preface: if preface { PREFACE_LEN } else { 0 },
            payload_left: 0,
            head: [0; FRAME_HEAD],
            head_len: 0,
        }
    }

    /// Between two frames (the preface, if any, done).
    fn at_boundary(&self) -> bool {
        self.preface == 0 && self.payload_left == 0 && self.head_len == 0
    }

    /// Walks `bytes`, calling `on_head` for each frame header completed;
    /// stops early (false) when it says so.
    fn walk(&mut self, mut bytes: &[u8], mut on_head: impl FnMut(Head) -> bool) -> bool {
        if self.preface > 0 {
            let n = bytes.len().min(usize::from(self.preface));
            self.preface -= n as u8;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = bytes.len().min(self.payload_left as usize);
                self.payload_left -= n as u32;
                bytes = &bytes[n..];
                continue;
            }
            let head = match (self.head_len, bytes.first_chunk::<FRAME_HEAD>()) {
                // The usual case: a whole header in this read, not copied.
                (0, Some(h)) => {
                    bytes = &bytes[FRAME_HEAD..];
                    Head::parse(h)
                }
                _ => {
                    let at = usize::from(self.head_len);
                    let n = bytes.len().min(FRAME_HEAD - at);
                    self.head[at..at + n].copy_from_slice(&bytes[..n]);
                    self.head_len += n as u8;
                    bytes = &bytes[n..];
                    if usize::from(self.head_len) < FRAME_HEAD {
                        return true;
                    }
                    self.head_len = 0;
                    Head::parse(&self.head)
                }
            };
            self.payload_left = head.len;
            if !on_head(head) {
                return false;
            }
        }
        true
    }
}

/// The control-frame budget of one connection.
#[derive(Debug)]
struct Budget {
    tokens: u32,
    /// When the bucket last refilled with time; `None` until it first ran
    /// dry (the clock is read only then).
    refilled_at: Option<Instant>,
}

impl Budget {
    fn refill(&mut self, limits: &FloodLimits) {
        self.tokens = (self.tokens.saturating_add(REFILL_PER_USEFUL)).min(limits.budget);
    }

    /// Spends one token; false when none is left or earned since.
    fn spend(&mut self, limits: &FloodLimits) -> bool {
        if let Some(left) = self.tokens.checked_sub(1) {
            self.tokens = left;
            return true;
        }
        let now = Instant::now();
        let earned = match self.refilled_at {
            // The connection's first empty bucket: it refills once, as if
            // the time it lived had earned a whole budget.
            None => u64::from(limits.budget),
            Some(at) => {
                now.duration_since(at).as_millis() as u64 * u64::from(limits.per_second) / 1000
            }
        };
        if earned == 0 {
            return false;
        }
        self.refilled_at = Some(now);
        self.tokens = earned.min(u64::from(limits.budget)) as u32 - 1;
        true
    }
}

/// How a flooded connection is being ended.
#[derive(Debug)]
enum Ending {
    Open,
    /// A GOAWAY partly written.
    GoAway {
        frame: [u8; GOAWAY_LEN],
        sent: u8,
    },
    Closed,
}

/// An HTTP/2 connection's IO with its control frames counted; see the
/// module's doc.
#[derive(Debug)]
pub struct FloodGuard<T> {
    io: T,
    role: Role,
    read: Walker,
    write: Walker,
    budget: Budget,
    /// Highest stream the peer opened (a server's GOAWAY names it).
    last_peer_stream: u32,
    ending: Ending,
    floods: Arc<FloodCount>,
}

impl<T> FloodGuard<T> {
    /// Guards `io`, which is at the start of its HTTP/2 connection (a
    /// server's client preface not yet read by h2).
    pub fn new(io: T, role: Role, floods: Arc<FloodCount>) -> Self {
        Self {
            io,
            role,
            read: Walker::new(role == Role::Server),
            write: Walker::new(role == Role::Client),
            budget: Budget {
                tokens: floods.limits.budget,
                refilled_at: None,
            },
            last_peer_stream: 0,
            ending: Ending::Open,
            floods,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    pub fn into_inner(self) -> T {
        self.io
    }

    /// Counts the frames read in `bytes`; false when they flood.
    fn read_frames(&mut self, bytes: &[u8]) -> bool {
        let Self {
            read,
            budget,
            role,
            last_peer_stream,
            floods,
            ..
        } = self;
        let limits = &floods.limits;
        read.walk(bytes, |h| match h.kind {
            DATA if h.len > 0 => {
                budget.refill(limits);
                true
            }
            HEADERS if *role == Role::Server && h.stream > *last_peer_stream => {
                *last_peer_stream = h.stream;
                budget.refill(limits);
                true
            }
            // Bounded by h2 (its CONTINUATION limit), part of a HEADERS.
            CONTINUATION => true,
            // SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM, GOAWAY,
            // empty DATA, HEADERS on a stream already seen, unknown types.
            _ => budget.spend(limits),
        })
    }

    fn wrote_frames(&mut self, bytes: &[u8]) {
        let Self {
            write,
            budget,
            floods,
            ..
        } = self;
        let limits = &floods.limits;
        write.walk(bytes, |h| {
            if h.kind == HEADERS || (h.kind == DATA && h.len > 0) {
                budget.refill(limits);
            }
            true
        });
    }

    fn flooded(&mut self) {
        self.floods.ended.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(role = ?self.role, "HTTP/2 control-frame flood: ending the connection");
        self.ending = if self.write.at_boundary() {
            let mut frame = [0u8; GOAWAY_LEN];
            frame[..FRAME_HEAD].copy_from_slice(&GOAWAY_HEAD);
            let last = match self.role {
                Role::Server => self.last_peer_stream,
                Role::Client => 0,
            };
            frame[FRAME_HEAD..FRAME_HEAD + 4].copy_from_slice(&last.to_be_bytes());
            frame[FRAME_HEAD + 4..].copy_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
            Ending::GoAway { frame, sent: 0 }
        } else {
            Ending::Closed
        };
    }
}

fn flood_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "HTTP/2 control-frame flood",
    )
}

impl<T: AsyncWrite + Unpin> FloodGuard<T> {
    /// Writes what is left of the GOAWAY and flushes it, once: a peer that
    /// does not take it now is not waited for.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) {
        while let Ending::GoAway { frame, sent } = &mut self.ending {
            let at = usize::from(*sent);
            if at == GOAWAY_LEN {
                let _ = Pin::new(&mut self.io).poll_flush(cx);
                self.ending = Ending::Closed;
                break;
            }
            match Pin::new(&mut self.io).poll_write(cx, &frame[at..]) {
                Poll::Ready(Ok(n)) if n > 0 => *sent += n as u8,
                _ => self.ending = Ending::Closed,
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for FloodGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !matches!(this.ending, Ending::Open) {
            return Poll::Ready(Err(flood_error()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if this.read_frames(&buf.filled()[before..]) {
            return Poll::Ready(Ok(()));
        }
        // None of this read reaches h2.
        buf.set_filled(before);
        this.flooded();
        this.poll_goaway(cx);
        Poll::Ready(Err(flood_error()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FloodGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !matches!(this.ending, Ending::Open) {
            return Poll::Ready(Err(flood_error()));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.wrote_frames(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !matches!(this.ending, Ending::Open) {
            return Poll::Ready(Err(flood_error()));
        }
        let mut n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let written = n;
        for b in bufs {
            if n == 0 {
                break;
            }
            let part = n.min(b.len());
            this.wrote_frames(&b[..part]);
            n -= part;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, 0]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn heads(bytes: &[u8], preface: bool, chunk: usize) -> Vec<Head> {
        let mut w = Walker::new(preface);
        let mut seen = Vec::new();
        for c in bytes.chunks(chunk) {
            w.walk(c, |h| {
                seen.push(h);
                true
            });
        }
        assert!(w.at_boundary());
        seen
    }

    #[test]
    fn frame_headers_are_found_however_the_stream_is_split() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, &[0; 6]));
        bytes.extend(frame(HEADERS, 1, b"block"));
        bytes.extend(frame(DATA, 1, &[7; 20_000]));
        bytes.extend(frame(0x6, 0, &[0; 8]));
        let want = vec![
            Head {
                len: 6,
                kind: 0x4,
                stream: 0,
            },
            Head {
                len: 5,
                kind: HEADERS,
                stream: 1,
            },
            Head {
                len: 20_000,
                kind: DATA,
                stream: 1,
            },
            Head {
                len: 8,
                kind: 0x6,
                stream: 0,
            },
        ];
        for chunk in [1, 2, 8, 9, 10, 17, 4096, bytes.len()] {
            assert_eq!(heads(&bytes, true, chunk), want, "chunks of {chunk}");
        }
    }

    fn server() -> FloodGuard<()> {
        let mut g = FloodGuard::new((), Role::Server, Arc::default());
        g.read.preface = 0;
        g
    }

    #[test]
    fn a_burst_of_control_frames_is_cut_within_twice_the_budget() {
        let mut g = server();
        let ping = frame(0x6, 0, &[0; 8]);
        let mut read = 0;
        while g.read_frames(&ping) {
            read += 1;
            assert!(read <= 2 * CONTROL_FRAME_BUDGET, "never cut");
        }
        assert!(read >= CONTROL_FRAME_BUDGET, "cut after {read}");
    }

    #[test]
    fn an_endpoints_own_budget_sets_where_a_burst_is_cut() {
        let limits = FloodLimits {
            budget: 10,
            per_second: 1,
        };
        let mut g = FloodGuard::new((), Role::Server, Arc::new(FloodCount::with_limits(limits)));
        g.read.preface = 0;
        let ping = frame(0x6, 0, &[0; 8]);
        let mut read = 0;
        while g.read_frames(&ping) {
            read += 1;
            assert!(read <= 20, "never cut at twice its budget of 10");
        }
        assert!(read >= 10, "cut after {read}");
    }

    #[test]
    fn useful_frames_pay_for_control_frames() {
        let mut g = server();
        for stream in (1..20_000u32).step_by(2) {
            // A request, its WINDOW_UPDATE, PRIORITY and RST_STREAM.
            assert!(g.read_frames(&frame(HEADERS, stream, b"h")));
            assert!(g.read_frames(&frame(0x8, stream, &[0, 0, 1, 0])));
            assert!(g.read_frames(&frame(0x2, stream, &[0; 5])));
            assert!(g.read_frames(&frame(0x3, stream, &[0; 4])));
        }
    }

    #[test]
    fn headers_on_a_stream_already_seen_are_control_frames() {
        let mut g = server();
        assert!(g.read_frames(&frame(HEADERS, 5, b"h")));
        let mut read = 0;
        while g.read_frames(&frame(HEADERS, 3, b"h")) {
            read += 1;
            assert!(read <= 2 * CONTROL_FRAME_BUDGET, "never cut");
        }
    }

    #[test]
    fn empty_data_is_a_control_frame_and_data_is_not() {
        let mut g = server();
        for _ in 0..10 * CONTROL_FRAME_BUDGET {
            assert!(g.read_frames(&frame(DATA, 1, b"x")));
        }
        let mut read = 0;
        while g.read_frames(&frame(DATA, 1, b"")) {
            read += 1;
            assert!(read <= 2 * CONTROL_FRAME_BUDGET, "never cut");
        }
    }

    /// One proxied request as a router connection's guard sees it: the
    /// request's HEADERS and the response's HEADERS and two DATA frames
    /// (a 20 KiB body), the router's two WINDOW_UPDATEs. Run under
    /// callgrind (`--toggle-collect='*walk_requests*'`) for the
    /// guard's instructions per request.
    #[test]
    fn a_request_is_walked_in_a_few_instructions_per_frame() {
        let mut g = server();
        let mut read = Vec::new();
        let mut written = Vec::new();
        for stream in (1..2001u32).step_by(2) {
            let mut r = frame(HEADERS, stream, &[0; 200]);
            r.extend(frame(0x8, stream, &[0, 0, 0x50, 0]));
            r.extend(frame(0x8, 0, &[0, 0, 0x50, 0]));
            read.push(r);
            let mut w = frame(HEADERS, stream, &[0; 60]);
            w.extend(frame(DATA, stream, &[0; 16 * 1024]));
            w.extend(frame(DATA, stream, &[0; 4 * 1024]));
            written.push(w);
        }
        assert!(walk_requests(&mut g, &read, &written));
    }

    /// 1,000 requests, 6 frames each.
    #[inline(never)]
    fn walk_requests(g: &mut FloodGuard<()>, read: &[Vec<u8>], written: &[Vec<u8>]) -> bool {
        let mut ok = true;
        for (r, w) in read.iter().zip(written) {
            ok &= g.read_frames(std::hint::black_box(r));
            g.wrote_frames(std::hint::black_box(w));
        }
        ok
    }

    #[test]
    fn the_guard_adds_little_to_a_connection() {
        // Over the IO it wraps: two walkers, the budget, the GOAWAY it may
        // write, the counter's Arc.
        let size = std::mem::size_of::<FloodGuard<()>>();
        eprintln!("FloodGuard: {size} B");
        assert!(size <= 96, "{size} B");
    }

    #[test]
    fn data_written_pays_for_window_updates_read() {
        let mut g = server();
        for _ in 0..10 * CONTROL_FRAME_BUDGET {
            g.wrote_frames(&frame(DATA, 1, &[0; 100]));
            assert!(g.read_frames(&frame(0x8, 0, &[0, 0, 1, 0])));
        }
    }
}
