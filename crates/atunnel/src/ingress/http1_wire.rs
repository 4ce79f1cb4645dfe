//! HTTP/1.1 to the actor on the wire: a request head written into one
//! buffer, a response head parsed in place (`httparse`), and the response
//! body's framing (RFC 9112 section 6) decoded out of the read buffer as
//! slices of it, never copied. No I/O here: `http1_pool` reads and writes.
//!
//! Written over `httparse` rather than with hyper's HTTP/1.1 client because
//! that client runs each connection as a task of its own, which a request
//! reaches through a channel and which answers through another, and its
//! generic codec around them: ~11,700 user instructions of the ~66,000 an
//! ingress request took (`atunnel-bench run --quick --scenarios cost`,
//! ingress-https; see `docs/design.md`). Done in the request's own task,
//! with the head parsed where it was read, the same exchange takes a few
//! thousand.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

/// Most header lines in a response head or a chunked body's trailers
/// (hyper's default too).
pub(crate) const MAX_HEADERS: usize = 100;

/// Longest chunk-size line (with extensions) accepted: a size in hex is at
/// most 16 digits, and extensions are ignored.
const MAX_CHUNK_LINE: usize = 4096;

/// Why an exchange with the actor failed: every one ends in a 502, or a
/// reset of the router's stream once the head was sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WireError {
    #[error("the actor's response head is malformed ({0})")]
    Head(&'static str),
    #[error("the actor's response head is larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("the actor's response body framing is malformed ({0})")]
    Body(&'static str),
    #[error("the actor switched protocols, which ingress does not carry")]
    Upgrade,
}

/// Writes the request head: the request line in origin form, the
/// router's headers but those `skip` names, the `extra` ones, and the
/// body's framing. `body`: `None` without a body (a Content-Length the
/// router sent is written as sent), `Some(Some(n))` for a body of `n`
/// bytes, `Some(None)` for a body of unknown length (sent chunked).
pub(crate) fn encode_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    skip: impl Fn(&HeaderName) -> bool,
    extra: &[(&[u8], &[u8])],
    body: Option<Option<u64>>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if skip(name)
            || (body.is_some()
                && (name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING))
        {
            continue;
        }
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    for (name, value) in extra {
        field(out, name, value);
    }
    match body {
        None => {}
        Some(Some(n)) => {
            field(
                out,
                b"content-length",
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        Some(None) => field(out, b"transfer-encoding", b"chunked"),
    }
    out.extend_from_slice(b"\r\n");
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The line that opens a chunk of `n` bytes.
pub(crate) fn chunk_line(n: usize) -> Bytes {
    Bytes::from(format!("{n:x}\r\n"))
}

/// A chunked body's end, with its trailers if any.
pub(crate) fn last_chunk(trailers: Option<&HeaderMap>) -> Bytes {
    let Some(trailers) = trailers.filter(|t| !t.is_empty()) else {
        return Bytes::from_static(b"0\r\n\r\n");
    };
    let mut out = b"0\r\n".to_vec();
    for (name, value) in trailers {
        field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// A response head read from the actor.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub reusable: bool,
}

/// Parses the response head at the front of `buf`, taking it off `buf`.
/// `Ok(None)`: not all of it is here yet (an error past `max` bytes).
/// Interim (1xx) heads are taken off and skipped. `head_request`: the
/// request was HEAD, so the response has no body whatever it says.
pub(crate) fn parse_response_head(
    buf: &mut BytesMut,
    head_request: bool,
    max: usize,
) -> Result<Option<ResponseHead>, WireError> {
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        let len = match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= max => {
                return Err(WireError::HeadTooLarge(max));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(WireError::Head("too many headers"));
            }
            Err(_) => return Err(WireError::Head("not HTTP/1.x")),
        };
        if len > max {
            return Err(WireError::HeadTooLarge(max));
        }
        let code = parsed.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| WireError::Head("status code"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(WireError::Upgrade);
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let http11 = parsed.version == Some(1);
        // Where each name and value lies in the head, which is then copied
        // off `buf` into one `Bytes` of its own that the values are slices
        // of: a slice of `buf` would pin its whole 16 KiB for as long as
        // a value lives, and the router connection's HPACK table keeps
        // values for the connection's life (19.6 KB more per idle HTTP/2
        // router connection in ingress-idle, before this copy).
        let base = buf.as_ptr() as usize;
        // In a vector of as many as there are: a zeroed array of a hundred
        // cost ~3,200 instructions a response (a `memset` callgrind counts
        // by the byte).
        let count = parsed.headers.len();
        let mut at = Vec::with_capacity(count);
        for h in parsed.headers.iter() {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            at.push((name, name + h.name.len(), value, value + h.value.len()));
        }
        let head = Bytes::copy_from_slice(&buf[..len]);
        buf.advance(len);
        let mut headers = HeaderMap::with_capacity(count);
        let mut length: Option<u64> = None;
        let mut chunked = false;
        let mut coded = false;
        let mut close = !http11;
        for (n0, n1, v0, v1) in at {
            let (name, raw) = (&head[n0..n1], &head[v0..v1]);
            let name = HeaderName::from_bytes(name).map_err(|_| WireError::Head("name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
                .map_err(|_| WireError::Head("value"))?;
            if name == header::CONTENT_LENGTH {
                let n = parse_length(raw).ok_or(WireError::Head("content-length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(WireError::Head("content-lengths differ"));
                }
                length = Some(n);
            } else if name == header::TRANSFER_ENCODING {
                // The last coding decides; anything after chunked is not.
                coded = true;
                for coding in raw.split(|b| *b == b',') {
                    let coding = coding.trim_ascii();
                    if !coding.is_empty() {
                        chunked = coding.eq_ignore_ascii_case(b"chunked");
                    }
                }
            } else if name == header::CONNECTION {
                for token in raw.split(|b| *b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !http11 && token.eq_ignore_ascii_case(b"keep-alive") {
                        close = false;
                    }
                }
            }
            headers.append(name, value);
        }
        // Both framings at once may be an attempt to smuggle a second
        // response (RFC 9112 section 6.3, "ought to be handled as an error").
        if coded && length.is_some() {
            return Err(WireError::Head("transfer-encoding with content-length"));
        }
        let bodiless =
            head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
        let framing = if bodiless {
            Framing::Length(0)
        } else if chunked {
            Framing::Chunked(Chunk::Size)
        } else if coded {
            Framing::Close
        } else {
            match length {
                Some(n) => Framing::Length(n),
                None => Framing::Close,
            }
        };
        let reusable = !close && !matches!(framing, Framing::Close);
        return Ok(Some(ResponseHead {
            status,
            headers,
            framing,
            reusable,
        }));
    }
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// How the response body ends (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// This many bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the actor closes the connection.
    Close,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
    Done,
}

/// What the decoder made of the buffer.
#[derive(Debug, PartialEq)]
pub(crate) enum Decoded {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More bytes are needed (`eof` was false).
    More,
}

impl Framing {
    pub(crate) fn is_end(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunk::Done))
    }

    /// Bytes left, when known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(n) => Some(*n),
            Framing::Chunked(Chunk::Done) => Some(0),
            _ => None,
        }
    }

    /// Takes the body's next piece off the front of `buf`. `eof`: the
    /// actor closed its side, so `buf` is all there will be.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut, eof: bool) -> Result<Decoded, WireError> {
        loop {
            match self {
                Framing::Length(0) | Framing::Chunked(Chunk::Done) => return Ok(Decoded::End),
                Framing::Length(n) => {
                    if buf.is_empty() {
                        return match eof {
                            true => Err(WireError::Body("closed before content-length")),
                            false => Ok(Decoded::More),
                        };
                    }
                    let take = usize::try_from(*n).unwrap_or(usize::MAX).min(buf.len());
                    *n -= take as u64;
                    return Ok(Decoded::Data(buf.split_to(take).freeze()));
                }
                Framing::Close => {
                    if !buf.is_empty() {
                        return Ok(Decoded::Data(buf.split().freeze()));
                    }
                    return Ok(if eof { Decoded::End } else { Decoded::More });
                }
                Framing::Chunked(chunk) => match chunk {
                    Chunk::Size => match httparse::parse_chunk_size(buf) {
                        Ok(httparse::Status::Complete((used, size))) => {
                            buf.advance(used);
                            *chunk = if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Ok(httparse::Status::Partial) if buf.len() < MAX_CHUNK_LINE && !eof => {
                            return Ok(Decoded::More);
                        }
                        Ok(httparse::Status::Partial) if !eof => {
                            return Err(WireError::Body("chunk-size line too long"));
                        }
                        Ok(httparse::Status::Partial) => {
                            return Err(WireError::Body("closed inside a chunk-size line"));
                        }
                        Err(_) => return Err(WireError::Body("chunk size")),
                    },
                    Chunk::Data(n) => {
                        if buf.is_empty() {
                            return match eof {
                                true => Err(WireError::Body("closed inside a chunk")),
                                false => Ok(Decoded::More),
                            };
                        }
                        let take = usize::try_from(*n).unwrap_or(usize::MAX).min(buf.len());
                        *n -= take as u64;
                        if *n == 0 {
                            *chunk = Chunk::DataEnd;
                        }
                        return Ok(Decoded::Data(buf.split_to(take).freeze()));
                    }
                    Chunk::DataEnd => {
                        if buf.len() < 2 {
                            return match eof {
                                true => Err(WireError::Body("closed inside a chunk")),
                                false => Ok(Decoded::More),
                            };
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err(WireError::Body("no CRLF after a chunk"));
                        }
                        buf.advance(2);
                        *chunk = Chunk::Size;
                    }
                    Chunk::Trailers => {
                        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                        match httparse::parse_headers(buf, &mut slots) {
                            Ok(httparse::Status::Complete((used, fields))) => {
                                let mut trailers = HeaderMap::new();
                                for f in fields {
                                    let name = HeaderName::from_bytes(f.name.as_bytes())
                                        .map_err(|_| WireError::Body("trailer name"))?;
                                    let value = HeaderValue::from_bytes(f.value)
                                        .map_err(|_| WireError::Body("trailer value"))?;
                                    trailers.append(name, value);
                                }
                                buf.advance(used);
                                *chunk = Chunk::Done;
                                if !trailers.is_empty() {
                                    return Ok(Decoded::Trailers(trailers));
                                }
                            }
                            Ok(httparse::Status::Partial) if !eof => return Ok(Decoded::More),
                            Ok(httparse::Status::Partial) => {
                                return Err(WireError::Body("closed inside the trailers"));
                            }
                            Err(_) => return Err(WireError::Body("trailers")),
                        }
                    }
                    Chunk::Done => return Ok(Decoded::End),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8], head_request: bool) -> Result<Option<ResponseHead>, WireError> {
        let mut buf = BytesMut::from(bytes);
        parse_response_head(&mut buf, head_request, 8192)
    }

    fn body(framing: Framing, wire: &[u8]) -> Result<(Vec<u8>, Option<HeaderMap>), WireError> {
        let mut f = framing;
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut trailers = None;
        // Fed a byte at a time: every split point is a partial read.
        let mut rest = wire;
        loop {
            match f.decode(&mut buf, rest.is_empty())? {
                Decoded::Data(d) => data.extend_from_slice(&d),
                Decoded::Trailers(t) => trailers = Some(t),
                Decoded::End => return Ok((data, trailers)),
                Decoded::More => {
                    buf.extend_from_slice(&rest[..1]);
                    rest = &rest[1..];
                }
            }
        }
    }

    #[test]
    fn a_request_head_carries_the_bodys_framing_instead_of_the_routers() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("app"));
        h.insert("content-length", HeaderValue::from_static("99"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        let skip = |n: &HeaderName| n == "x-gone";
        let extra: &[(&[u8], &[u8])] = &[(b"x-added", b"2")];
        let mut out = Vec::new();
        encode_request_head(
            &mut out,
            &Method::POST,
            "/a?b",
            &h,
            skip,
            extra,
            Some(Some(5)),
        );
        assert_eq!(
            out,
            b"POST /a?b HTTP/1.1\r\nhost: app\r\nx-added: 2\r\ncontent-length: 5\r\n\r\n"
        );
        out.clear();
        encode_request_head(&mut out, &Method::PUT, "/", &h, skip, &[], Some(None));
        assert_eq!(
            out,
            b"PUT / HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        out.clear();
        encode_request_head(&mut out, &Method::GET, "/", &h, skip, &[], None);
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nhost: app\r\ncontent-length: 99\r\n\r\n"
        );
        assert_eq!(&last_chunk(None)[..], b"0\r\n\r\n");
        let mut t = HeaderMap::new();
        t.insert("x-sum", HeaderValue::from_static("7"));
        assert_eq!(&last_chunk(Some(&t))[..], b"0\r\nx-sum: 7\r\n\r\n");
        assert_eq!(&chunk_line(255)[..], b"ff\r\n");
    }

    #[test]
    fn response_heads_are_framed_as_rfc_9112_says() {
        let h = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
            false,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.reusable);
        assert_eq!(h.headers["x-a"], "b");
        let h = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            false,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        let h = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            false,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(h.framing, Framing::Close, "chunked not last: until close");
        assert!(!h.reusable);
        let h = head(b"HTTP/1.1 200 OK\r\n\r\n", false)
            .expect("parsed")
            .expect("complete");
        assert_eq!(h.framing, Framing::Close);
        assert!(!h.reusable);
        let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
            .expect("parsed")
            .expect("complete");
        assert_eq!(h.framing, Framing::Length(0), "HEAD: no body");
        assert_eq!(h.headers["content-length"], "5");
        let h = head(b"HTTP/1.1 304 Not Modified\r\n\r\n", false)
            .expect("parsed")
            .expect("complete");
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.reusable);
        let h = head(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .expect("parsed")
        .expect("complete");
        assert!(!h.reusable);
        let h = head(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false)
            .expect("parsed")
            .expect("complete");
        assert!(!h.reusable, "HTTP/1.0 closes unless keep-alive");
        let h = head(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(h.status, 201, "interim heads skipped");
        assert!(
            head(b"HTTP/1.1 200 OK\r\nContent-Le", false)
                .expect("partial")
                .is_none()
        );
    }

    #[test]
    fn ambiguous_or_malformed_response_heads_are_refused() {
        let refused = |wire: &[u8]| head(wire, false).expect_err("refused");
        refused(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n");
        refused(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n");
        refused(b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n");
        refused(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n");
        refused(b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\n\r\n");
        refused(b"HTTP/1.1 200 OK\r\nX-A: b\rc\r\n\r\n");
        refused(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n");
        refused(b"SSH-2.0-OpenSSH\r\n\r\n");
        let same = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            false,
        )
        .expect("the same length twice is one length")
        .expect("complete");
        assert_eq!(same.framing, Framing::Length(5));
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'a', 9000));
        assert_eq!(
            head(&big, false).expect_err("too large"),
            WireError::HeadTooLarge(8192)
        );
    }

    #[test]
    fn bodies_decode_in_any_split_and_end_where_their_framing_says() {
        let (data, _) = body(Framing::Length(5), b"hello").expect("length");
        assert_eq!(data, b"hello");
        let (data, trailers) = body(
            Framing::Chunked(Chunk::Size),
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 7\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!(data, b"hello world");
        assert_eq!(trailers.expect("trailers")["x-sum"], "7");
        let (data, trailers) =
            body(Framing::Chunked(Chunk::Size), b"3\r\nabc\r\n0\r\n\r\n").expect("chunked");
        assert_eq!(data, b"abc");
        assert!(trailers.is_none());
        let (data, _) = body(Framing::Close, b"until the end").expect("close");
        assert_eq!(data, b"until the end");
        assert!(body(Framing::Length(9), b"short").is_err(), "closed early");
        assert!(body(Framing::Chunked(Chunk::Size), b"5\r\nhelloXX0\r\n\r\n").is_err());
        assert!(body(Framing::Chunked(Chunk::Size), b"zz\r\n").is_err());
        assert!(body(Framing::Chunked(Chunk::Size), b"5\r\nhel").is_err());
        let mut long = vec![b'1'; MAX_CHUNK_LINE + 1];
        long.extend_from_slice(b"\r\n");
        assert!(body(Framing::Chunked(Chunk::Size), &long).is_err());
    }

    #[test]
    fn a_body_leaves_what_follows_it_in_the_buffer() {
        let mut f = Framing::Length(3);
        let mut buf = BytesMut::from(&b"abcHTTP/1.1"[..]);
        assert_eq!(
            f.decode(&mut buf, false).expect("data"),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
        assert_eq!(f.decode(&mut buf, false).expect("end"), Decoded::End);
        assert_eq!(&buf[..], b"HTTP/1.1");
    }
}
