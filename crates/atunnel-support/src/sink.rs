//! The gateway's bench far end: it answers tunnels itself, by destination
//! port, without dialing anything, so a benchmark measures atunnel and not a
//! far end. The bench's `sink` role and the tests run a gateway with it.
//!
//! | port | service |
//! |---|---|
//! | 7   | echo: every byte comes back; end of stream is echoed as a half-close |
//! | 9   | discard: bytes are read and dropped; half-closes after the client does |
//! | 13  | stall: accepts and never reads (a destination that stopped reading); held until the client resets, or [`STALL_LIMIT`] at most |
//! | 19  | source: sends `source_bytes` bytes (zeros), then half-closes; input is discarded |
//! | 80  | HTTP/1.1 responder: each request head gets `200 OK` with `http_body_bytes` bytes; keep-alive |
//! | other | `other_ports` if set, else refused with `403 no sink service on port N` |

use std::io;

use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::BufferPool;
use atunnel_core::endpoint::{Chunk, Endpoint, close_write, read_chunk, write_chunk};
use atunnel_gateway::{FarEnd, Refusal};
use bytes::Bytes;

/// What the bench sink sends.
#[derive(Clone, Copy, Debug)]
pub struct SinkConfig {
    /// Bytes the source service (port 19) sends per tunnel.
    pub source_bytes: u64,
    /// Body size of each HTTP response (port 80).
    pub http_body_bytes: usize,
    /// The service for ports not in the table; `None` refuses them.
    pub other_ports: Option<Service>,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            source_bytes: 1 << 30,
            http_body_bytes: 64,
            other_ports: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Service {
    Echo,
    Discard,
    Source,
    Http,
    Stall,
}

impl Service {
    pub fn for_port(port: u16) -> Option<Self> {
        match port {
            7 => Some(Service::Echo),
            9 => Some(Service::Discard),
            13 => Some(Service::Stall),
            19 => Some(Service::Source),
            80 => Some(Service::Http),
            _ => None,
        }
    }
}

/// The sink as a gateway's far end.
impl FarEnd for SinkConfig {
    type Target = Service;

    async fn open(&self, dest: SocketAddr) -> Result<Service, Refusal> {
        Service::for_port(dest.port())
            .or(self.other_ports)
            .ok_or_else(|| Refusal {
                status: 403,
                reason: "Forbidden",
                body: format!("no sink service on port {}", dest.port()),
            })
    }

    async fn run<E: Endpoint + Send>(
        &self,
        service: Service,
        tunnel: &mut E,
        pool: &BufferPool,
    ) -> io::Result<()> {
        serve(service, tunnel, self, pool).await.map(drop)
    }
}

static ZEROS: [u8; 32 * 1024] = [0; 32 * 1024];

/// Runs `service` over an open tunnel until the client is done.
pub async fn serve<E: Endpoint + ?Sized>(
    service: Service,
    ep: &mut E,
    cfg: &SinkConfig,
    pool: &BufferPool,
) -> io::Result<u64> {
    match service {
        Service::Echo => echo(ep, pool).await,
        Service::Discard => {
            let n = discard(ep, pool).await?;
            close_write(ep).await?;
            Ok(n)
        }
        Service::Source => {
            let sent = source(ep, cfg.source_bytes).await?;
            // Read the client's side to its end before closing, so unread
            // input does not turn our close into a reset that could cut off
            // the tail of what we sent.
            discard(ep, pool).await?;
            Ok(sent)
        }
        Service::Http => http(ep, cfg.http_body_bytes, pool).await,
        Service::Stall => stall(ep, pool).await,
    }
}

/// The longest the stall service holds a tunnel: a client whose reset never
/// comes (one that only closed) would otherwise keep it forever.
pub const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Never reads, then resets: over HTTP/2 the bytes h2 already took under
/// the window this side granted are dropped without ever returning window
/// (`consumed`), so the client is held to one stream window, as behind a
/// destination that stopped reading; a socket is not read at all. Ends with
/// an error (the tunnel is reset) when the client resets, or after
/// [`STALL_LIMIT`].
async fn stall<E: Endpoint + ?Sized>(ep: &mut E, pool: &BufferPool) -> io::Result<u64> {
    let held = async {
        if ep.reads_into_pool() {
            // Reading a socket would take its bytes: wait without reading.
            std::future::pending::<()>().await;
        }
        while read_chunk(ep, pool).await?.is_some() {}
        Ok::<_, io::Error>(())
    };
    match tokio::time::timeout(STALL_LIMIT, held).await {
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "stall: the client ended a tunnel that is never read",
        )),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "stall: tunnel held for the stall limit",
        )),
    }
}

async fn echo<E: Endpoint + ?Sized>(ep: &mut E, pool: &BufferPool) -> io::Result<u64> {
    let mut total = 0;
    while let Some(chunk) = read_chunk(ep, pool).await? {
        let n = chunk.len();
        write_chunk(ep, chunk).await?;
        ep.consumed(n);
        total += n as u64;
    }
    close_write(ep).await?;
    Ok(total)
}

async fn discard<E: Endpoint + ?Sized>(ep: &mut E, pool: &BufferPool) -> io::Result<u64> {
    let mut total = 0;
    while let Some(chunk) = read_chunk(ep, pool).await? {
        ep.consumed(chunk.len());
        total += chunk.len() as u64;
    }
    Ok(total)
}

async fn source<E: Endpoint + ?Sized>(ep: &mut E, bytes: u64) -> io::Result<u64> {
    let mut left = bytes;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        write_chunk(ep, Chunk::Shared(Bytes::from_static(&ZEROS[..n]))).await?;
        left -= n as u64;
    }
    close_write(ep).await?;
    Ok(bytes)
}

/// Answers each request head with a fixed response. Request bodies are not
/// supported (the bench sends GETs).
async fn http<E: Endpoint + ?Sized>(
    ep: &mut E,
    body_bytes: usize,
    pool: &BufferPool,
) -> io::Result<u64> {
    let response = {
        let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {body_bytes}\r\n\r\n").into_bytes();
        r.resize(r.len() + body_bytes, b'x');
        Bytes::from(r)
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut answered = 0;
    while let Some(chunk) = read_chunk(ep, pool).await? {
        pending.extend_from_slice(chunk.remaining());
        ep.consumed(chunk.len());
        drop(chunk);
        while let Some(end) = find_head_end(&pending) {
            pending.drain(..end);
            write_chunk(ep, Chunk::Shared(response.clone())).await?;
            answered += 1;
        }
        if pending.len() > atunnel_connect::limits::MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
    }
    close_write(ep).await?;
    Ok(answered)
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}
