//! The few bytes of HTTP/1.1 a CONNECT tunnel needs: one request head and one
//! response head, read straight from the TLS stream.
//!
//! Written by hand rather than with hyper because the head must be read
//! without over-reading: the bytes after it belong to the tunnel, and the
//! relay needs the bare TLS stream (for readiness) with nothing buffered in
//! front of it. Heads are read a byte at a time from rustls' plaintext buffer
//! (a memcpy, not a syscall) and parsed with httparse.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::limits::{MAX_HEAD, MAX_HEADERS};

/// Reads up to and including the blank line that ends a head.
pub async fn read_head<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    loop {
        let byte = match io.read_u8().await {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && head.is_empty() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed before sending a head",
                ));
            }
            Err(e) => return Err(e),
        };
        head.push(byte);
        if head.ends_with(b"\r\n\r\n") {
            return Ok(head);
        }
        if head.len() >= MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("head longer than {MAX_HEAD} bytes"),
            ));
        }
    }
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
}

pub fn parse_request(head: &[u8]) -> io::Result<RequestHead> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("incomplete request head")),
        Err(e) => return Err(invalid(&format!("malformed request head: {e}"))),
    }
    Ok(RequestHead {
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        headers: req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
    })
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub content_length: Option<usize>,
}

pub fn parse_response(head: &[u8]) -> io::Result<ResponseHead> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("incomplete response head")),
        Err(e) => return Err(invalid(&format!("malformed response head: {e}"))),
    }
    let content_length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
    Ok(ResponseHead {
        status: resp.code.unwrap_or_default(),
        content_length,
    })
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn head_is_read_without_consuming_what_follows() {
        let mut input: &[u8] = b"HTTP/1.1 200 OK\r\n\r\ntunnel bytes";
        let head = read_head(&mut input).await.expect("head");
        assert_eq!(head, b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(input, b"tunnel bytes");
        assert_eq!(parse_response(&head).expect("parse").status, 200);
    }

    #[tokio::test]
    async fn oversized_or_truncated_heads_are_errors() {
        let big = vec![b'a'; MAX_HEAD + 10];
        assert_eq!(
            read_head(&mut &big[..]).await.expect_err("too long").kind(),
            io::ErrorKind::InvalidData
        );
        let mut cut: &[u8] = b"HTTP/1.1 200";
        assert_eq!(
            read_head(&mut cut).await.expect_err("cut").kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert!(parse_request(b"NOT A REQUEST\r\n\r\n").is_err());
    }

    #[test]
    fn request_head_parses_method_target_and_headers() {
        let r = parse_request(b"CONNECT 192.0.2.1:443 HTTP/1.1\r\nHost: 192.0.2.1:443\r\n\r\n")
            .expect("parse");
        assert_eq!(r.method, "CONNECT");
        assert_eq!(r.target, "192.0.2.1:443");
        assert_eq!(
            r.headers,
            vec![("Host".to_string(), "192.0.2.1:443".to_string())]
        );
    }
}
