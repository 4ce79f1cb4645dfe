//! Reads a tunnel's `/stats`.
//!
//! A few lines of HTTP/1.0 by hand: one GET to a loopback endpoint we serve
//! ourselves, where a client library would add nothing but weight.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET /stats` (after releasing free memory when `release`).
pub async fn fetch(addr: SocketAddr, release: bool) -> Result<Value, atunnel::BoxError> {
    let mut s = TcpStream::connect(addr).await?;
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

/// A number at a JSON path like `["process", "heap_bytes"]`, or 0.
pub fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for key in path {
        cur = &cur[*key];
    }
    cur.as_f64().unwrap_or(0.0)
}
