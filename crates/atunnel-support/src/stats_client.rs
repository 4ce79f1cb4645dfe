//! A client for atunnel's `/stats`.

use std::net::SocketAddr;

/// Reads a `/stats` endpoint (after releasing free memory when `release`).
///
/// A few lines of HTTP/1.0 by hand: one GET to a loopback endpoint of our
/// own, where a client library would add nothing but weight.
pub async fn fetch(
    addr: SocketAddr,
    release: bool,
) -> Result<serde_json::Value, atunnel_process::BoxError> {
    fetch_over(tokio::net::TcpStream::connect(addr).await?, release).await
}

/// [`fetch`] over a connection the caller made (from another namespace, say).
pub async fn fetch_over(
    mut s: tokio::net::TcpStream,
    release: bool,
) -> Result<serde_json::Value, atunnel_process::BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let query = if release { "?release=1" } else { "" };
    s.write_all(format!("GET /stats{query} HTTP/1.0\r\nHost: stats\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let body_at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("stats answer has no body")?
        + 4;
    Ok(serde_json::from_slice(&raw[body_at..])?)
}

/// `GET path` on an admin listener: the status and the body.
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), atunnel_process::BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: admin\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("an answer with no body")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("an answer with no status")?;
    Ok((status, body.to_string()))
}

/// A number at a JSON path like `["process", "heap_bytes"]`, or 0.
pub fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for key in path {
        cur = &cur[*key];
    }
    cur.as_f64().unwrap_or(0.0)
}
