//! A raw HTTP/2 peer for abuse tests: frames written and read one by one
//! over any byte stream (TLS or h2c), on either side of a connection.
//!
//! Hand-written on purpose: the h2 crate, and hyper over it, keep to the
//! protocol and cannot be made to misbehave. They will not send a HEADERS
//! without END_HEADERS followed by endless CONTINUATION, reset streams as
//! fast as they open them, flood SETTINGS or PING, or hold a zero window
//! while asking for a large body, which are the abuses under test. HPACK is
//! written with literal fields without indexing only (RFC 7541 §6.2.2): no
//! table, no Huffman, so no dependency. Header blocks that come back are
//! not decoded; tests look at frame types, error codes and DATA bytes.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types (RFC 9113 §6).
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
}

/// SETTINGS parameters (RFC 9113 §6.5.2).
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// The largest payload a frame may carry before SETTINGS say otherwise
/// (RFC 9113 §4.2), and what every server here keeps.
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024;

/// One frame, as written or as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(kind: u8, flags: u8, stream: u32, payload: Vec<u8>) -> Self {
        Self {
            kind,
            flags,
            stream,
            payload,
        }
    }

    /// HEADERS carrying `block`; without `end_headers` CONTINUATION must
    /// follow.
    pub fn headers(stream: u32, block: Vec<u8>, end_stream: bool, end_headers: bool) -> Self {
        let mut flags = 0;
        if end_stream {
            flags |= flag::END_STREAM;
        }
        if end_headers {
            flags |= flag::END_HEADERS;
        }
        Self::new(kind::HEADERS, flags, stream, block)
    }

    pub fn continuation(stream: u32, block: Vec<u8>, end_headers: bool) -> Self {
        let flags = if end_headers { flag::END_HEADERS } else { 0 };
        Self::new(kind::CONTINUATION, flags, stream, block)
    }

    pub fn data(stream: u32, bytes: &[u8], end_stream: bool) -> Self {
        let flags = if end_stream { flag::END_STREAM } else { 0 };
        Self::new(kind::DATA, flags, stream, bytes.to_vec())
    }

    pub fn rst_stream(stream: u32, error: u32) -> Self {
        Self::new(kind::RST_STREAM, 0, stream, error.to_be_bytes().to_vec())
    }

    pub fn settings(params: &[(u16, u32)]) -> Self {
        let mut payload = Vec::with_capacity(params.len() * 6);
        for (id, value) in params {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        Self::new(kind::SETTINGS, 0, 0, payload)
    }

    pub fn settings_ack() -> Self {
        Self::new(kind::SETTINGS, flag::ACK, 0, Vec::new())
    }

    pub fn ping(payload: [u8; 8]) -> Self {
        Self::new(kind::PING, 0, 0, payload.to_vec())
    }

    pub fn ping_ack(payload: [u8; 8]) -> Self {
        Self::new(kind::PING, flag::ACK, 0, payload.to_vec())
    }

    pub fn goaway(last_stream: u32, error: u32) -> Self {
        let mut payload = last_stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&error.to_be_bytes());
        Self::new(kind::GOAWAY, 0, 0, payload)
    }

    pub fn window_update(stream: u32, increment: u32) -> Self {
        Self::new(
            kind::WINDOW_UPDATE,
            0,
            stream,
            increment.to_be_bytes().to_vec(),
        )
    }

    /// The frame on the wire: 9 bytes of header (RFC 9113 §4.1), then the
    /// payload.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let len = self.payload.len() as u32;
        assert!(len < 1 << 24, "frame payload over 2^24-1 bytes");
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
        out.extend_from_slice(&self.payload);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + self.payload.len());
        self.encode_into(&mut out);
        out
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag == flag
    }

    /// The error code of a RST_STREAM or GOAWAY.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            kind::RST_STREAM => 0,
            kind::GOAWAY => 4,
            _ => return None,
        };
        let bytes = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }

    /// A SETTINGS frame's parameters.
    pub fn settings_params(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect()
    }

    /// Whether this HEADERS block starts with `:status: 200` as the static
    /// table's index 8 (RFC 7541 Appendix A), which is how h2 sends it.
    pub fn is_status_200(&self) -> bool {
        self.status() == Some(200)
    }

    /// The `:status` of a response HEADERS block, when it comes first in
    /// one of the forms h2 writes it (a block whose first frame carries it):
    /// a static-table index, or a literal naming index 8 with the digits
    /// raw or Huffman-coded. `None` for anything else.
    pub fn status(&self) -> Option<u16> {
        if self.kind != kind::HEADERS {
            return None;
        }
        let mut b = self.payload.as_slice();
        // A dynamic table size update may come first (RFC 7541 §4.2).
        while let Some(&first) = b.first() {
            if first & 0xe0 != 0x20 {
                break;
            }
            b = &b[1..];
        }
        match *b.first()? {
            first @ 0x88..=0x8e => [200, 204, 206, 304, 400, 404, 500]
                .get(usize::from(first - 0x88))
                .copied(),
            0x48 | 0x08 | 0x18 => {
                let len_byte = *b.get(1)?;
                let len = usize::from(len_byte & 0x7f);
                let value = b.get(2..2 + len)?;
                let digits = if len_byte & 0x80 != 0 {
                    huffman_digits(value)?
                } else {
                    value.to_vec()
                };
                std::str::from_utf8(&digits).ok()?.parse().ok()
            }
            _ => None,
        }
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), the prefix's
/// byte starting as `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// Decodes a Huffman-coded string of decimal digits (RFC 7541 Appendix
/// B: '0'-'2' are 5-bit codes 0-2, '3'-'9' 6-bit codes 0x19-0x1f); `None`
/// on any other symbol.
fn huffman_digits(coded: &[u8]) -> Option<Vec<u8>> {
    let bits: Vec<bool> = coded
        .iter()
        .flat_map(|byte| (0..8).rev().map(move |i| byte >> i & 1 == 1))
        .collect();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bits.len() {
        let rest = &bits[at..];
        // Padding: fewer than 8 bits, all ones (the EOS prefix).
        if rest.len() < 8 && rest.iter().all(|b| *b) {
            break;
        }
        let code = |n: usize| {
            rest.get(..n)
                .map(|c| c.iter().fold(0u8, |v, b| v << 1 | u8::from(*b)))
        };
        match code(5)? {
            c @ 0..=2 => {
                out.push(b'0' + c);
                at += 5;
            }
            _ => match code(6)? {
                c @ 0x19..=0x1f => {
                    out.push(b'3' + (c - 0x19));
                    at += 6;
                }
                _ => return None,
            },
        }
    }
    Some(out)
}

/// Appends `name: value` as a literal header field without indexing, new
/// name, neither string Huffman-coded (RFC 7541 §6.2.2).
pub fn literal(block: &mut Vec<u8>, name: &str, value: &[u8]) {
    block.push(0x00);
    hpack_int(block, 0x00, 7, name.len());
    block.extend_from_slice(name.as_bytes());
    hpack_int(block, 0x00, 7, value.len());
    block.extend_from_slice(value);
}

/// A request's header block: the four pseudo-headers (CONNECT has only
/// `:method` and `:authority`), then `headers`.
pub fn request_block(
    method: &str,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut block = Vec::new();
    literal(&mut block, ":method", method.as_bytes());
    if method != "CONNECT" {
        literal(&mut block, ":scheme", b"https");
        literal(&mut block, ":path", path.as_bytes());
    }
    literal(&mut block, ":authority", authority.as_bytes());
    for (name, value) in headers {
        literal(&mut block, name, value.as_bytes());
    }
    block
}

/// A response's header block: `:status`, then `headers`.
pub fn response_block(status: u16, headers: &[(&str, &[u8])]) -> Vec<u8> {
    let mut block = Vec::new();
    literal(&mut block, ":status", status.to_string().as_bytes());
    for (name, value) in headers {
        literal(&mut block, name, value);
    }
    block
}

/// How a connection ended, seen by [`RawH2::until_goaway`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// GOAWAY with this error code and last stream.
    GoAway { error: u32, last_stream: u32 },
    /// Closed (EOF or reset) with no GOAWAY.
    Closed,
}

/// Frames over `io`, with nothing done behind the test's back: SETTINGS
/// and PING are acknowledged only where a method says so.
pub struct RawH2<S> {
    io: S,
    buf: Vec<u8>,
    /// The peer's first SETTINGS.
    pub peer_settings: Vec<(u16, u32)>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawH2<S> {
    /// No handshake: the caller writes the preface (to misbehave from the
    /// first byte).
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::new(),
            peer_settings: Vec::new(),
        }
    }

    /// As a client: the preface and `settings`, then waits for the server's
    /// SETTINGS and acknowledges them, so the limits it announced are in
    /// force on its side (h2 applies its own receive limits once they are
    /// acknowledged).
    pub async fn client(io: S, settings: &[(u16, u32)]) -> io::Result<Self> {
        let mut this = Self::new(io);
        let mut out = PREFACE.to_vec();
        Frame::settings(settings).encode_into(&mut out);
        this.write_raw(&out).await?;
        this.take_peer_settings().await?;
        Ok(this)
    }

    /// As a server: reads the client's preface, sends `settings`, and
    /// acknowledges the client's SETTINGS.
    pub async fn server(io: S, settings: &[(u16, u32)]) -> io::Result<Self> {
        let mut this = Self::new(io);
        let mut preface = [0u8; PREFACE.len()];
        this.io.read_exact(&mut preface).await?;
        if preface != PREFACE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no HTTP/2 preface",
            ));
        }
        this.send(&Frame::settings(settings)).await?;
        this.take_peer_settings().await?;
        Ok(this)
    }

    async fn take_peer_settings(&mut self) -> io::Result<()> {
        let within = Duration::from_secs(10);
        let settings = self
            .wait_for(within, |f| f.kind == kind::SETTINGS && !f.has(flag::ACK))
            .await?;
        self.peer_settings = settings.settings_params();
        self.send(&Frame::settings_ack()).await
    }

    /// The value the peer's first SETTINGS gave `id`, if it did.
    pub fn peer_setting(&self, id: u16) -> Option<u32> {
        self.peer_settings
            .iter()
            .rev()
            .find(|(i, _)| *i == id)
            .map(|(_, v)| *v)
    }

    pub async fn send(&mut self, frame: &Frame) -> io::Result<()> {
        self.write_raw(&frame.encode()).await
    }

    /// Writes `frames` in one write, so the peer reads them back to back.
    pub async fn send_all(&mut self, frames: &[Frame]) -> io::Result<()> {
        let mut out = Vec::new();
        for f in frames {
            f.encode_into(&mut out);
        }
        self.write_raw(&out).await
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Writes `bytes` again and again until `total` bytes are written or a
    /// write makes no progress for `stall` (the peer stopped reading);
    /// returns how many bytes went out.
    pub async fn write_until_stalled(
        &mut self,
        bytes: &[u8],
        total: usize,
        stall: Duration,
    ) -> io::Result<usize> {
        let mut written = 0;
        while written < total {
            match tokio::time::timeout(stall, self.write_raw(bytes)).await {
                Ok(Ok(())) => written += bytes.len(),
                Ok(Err(e)) => return Err(e),
                Err(_) => break,
            }
        }
        Ok(written)
    }

    /// The next frame; `None` at EOF. A frame longer than 2^24-1 cannot be
    /// announced, so the buffer is bounded by that.
    pub async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let stream =
                        u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                            & 0x7fff_ffff;
                    let frame = Frame::new(
                        self.buf[3],
                        self.buf[4],
                        stream,
                        self.buf[9..9 + len].to_vec(),
                    );
                    self.buf.drain(..9 + len);
                    return Ok(Some(frame));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.io.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads until a frame matches `want` and returns it; an error at EOF
    /// or after `within`.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        mut want: impl FnMut(&Frame) -> bool,
    ) -> io::Result<Frame> {
        let wait = async {
            loop {
                match self.read_frame().await? {
                    Some(f) if want(&f) => return Ok(f),
                    Some(_) => {}
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed before the frame awaited",
                        ));
                    }
                }
            }
        };
        tokio::time::timeout(within, wait)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "frame awaited not seen"))?
    }

    /// Reads, acknowledging nothing, until GOAWAY or the end of the
    /// connection; an error if neither comes within `within`.
    pub async fn until_goaway(&mut self, within: Duration) -> io::Result<Ended> {
        let wait = async {
            loop {
                match self.read_frame().await {
                    Ok(Some(f)) if f.kind == kind::GOAWAY => {
                        let last = f.payload.get(..4).map_or(0, |b| {
                            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
                        });
                        return Ended::GoAway {
                            error: f.error_code().unwrap_or(u32::MAX),
                            last_stream: last,
                        };
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return Ended::Closed,
                }
            }
        };
        tokio::time::timeout(within, wait)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no GOAWAY and no close"))
    }

    /// Whether the connection ends (EOF or an error) within `within`,
    /// whatever frames come first.
    pub async fn closes_within(&mut self, within: Duration) -> bool {
        let wait = async {
            loop {
                match self.read_frame().await {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                }
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.io
    }

    pub fn into_inner(self) -> S {
        self.io
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541_c_1() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 5, 10);
        assert_eq!(out, [0x0a]);
        out.clear();
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    }

    #[test]
    fn a_literal_field_without_indexing_matches_rfc_7541_c_2_2() {
        let mut block = Vec::new();
        literal(&mut block, ":path", b"/sample/path");
        let mut want = vec![0x00, 0x05];
        want.extend_from_slice(b":path");
        want.push(0x0c);
        want.extend_from_slice(b"/sample/path");
        // C.2.2 uses an indexed name; the new-name form adds only the name.
        assert_eq!(block, want);
    }

    #[test]
    fn a_huffman_coded_status_is_read() {
        // "302" from RFC 7541 C.6.1: 6402 (0x64 0x02).
        let mut block = vec![0x48, 0x82, 0x64, 0x02];
        let f = Frame::headers(1, block.clone(), true, true);
        assert_eq!(f.status(), Some(302));
        block[1] = 0x03;
        block.truncate(2);
        block.extend_from_slice(b"431");
        assert_eq!(Frame::headers(1, block, true, true).status(), Some(431));
        assert_eq!(
            Frame::headers(1, vec![0x88], true, true).status(),
            Some(200)
        );
    }

    #[test]
    fn a_frame_header_is_length_type_flags_stream() {
        let f = Frame::rst_stream(3, code::CANCEL).encode();
        assert_eq!(f, [0, 0, 4, 3, 0, 0, 0, 0, 3, 0, 0, 0, 8]);
    }
}
