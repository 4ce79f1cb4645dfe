//! A client for atunnel's `/stats`.

use std::net::SocketAddr;

pub use atunnel::stats::Stats;

/// atunnel's `/stats` as its own type: a field that the tunnel renames or
/// drops fails the reader's build (or this parse), where a JSON path would
/// read 0.
pub async fn fetch_stats(
    addr: SocketAddr,
    release: bool,
) -> Result<Stats, atunnel_process::BoxError> {
    fetch_stats_over(tokio::net::TcpStream::connect(addr).await?, release).await
}

/// [`fetch_stats`] over a connection the caller made.
pub async fn fetch_stats_over(
    s: tokio::net::TcpStream,
    release: bool,
) -> Result<Stats, atunnel_process::BoxError> {
    fetch_as_over(s, release).await
}

/// A `/stats` read as `T` (atunnel's [`Stats`], the gateway's
/// [`atunnel_gateway::Stats`]) over a connection the caller made.
pub async fn fetch_as_over<T: serde::de::DeserializeOwned>(
    s: tokio::net::TcpStream,
    release: bool,
) -> Result<T, atunnel_process::BoxError> {
    let body = stats_body(s, release).await?;
    serde_json::from_slice(&body).map_err(|e| {
        format!(
            "/stats does not parse as {}: {e}",
            std::any::type_name::<T>()
        )
        .into()
    })
}

/// The body of one `GET /stats`.
async fn stats_body(
    mut s: tokio::net::TcpStream,
    release: bool,
) -> Result<Vec<u8>, atunnel_process::BoxError> {
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
    raw.drain(..body_at);
    Ok(raw)
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
