//! The designs the bench compares the lean relay with, built only with the
//! `comparison` feature, so the production tunnel carries neither them nor
//! a branch for them:
//!
//! - `--copy-mode naive`: the reference's egress copy before its memory
//!   fix. Each direction is its own task with its own 32 KiB buffer held for
//!   the tunnel's whole life, and an HTTP/2 stream gets a reader task that
//!   pulls DATA into a pipe (as Go's http2 transport does).
//! - `--wait-buffer N`: the lean relay, but waiting for the actor's data by
//!   reading into an N-byte buffer held for the tunnel's life (the
//!   reference's 512 B fix) instead of by readiness.

use std::future::poll_fn;
use std::io;

use atunnel_connect::GatewayTunnel as Tunnel;
use atunnel_core::BufferPool;
use atunnel_core::endpoint::WaitBuffered;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

/// The copy buffer size of Go's io.Copy.
const BUFFER: usize = 32 * 1024;

/// How an egress tunnel moves bytes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMode {
    /// One task, no buffer while idle, pooled buffers while data moves.
    #[default]
    Lean,
    /// The reference's design: a task and a 32 KiB buffer per direction for
    /// life, plus a reader task per HTTP/2 stream (ablation only).
    Naive,
}

/// The design an egress tunnel relays with.
#[derive(clap::Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayVariant {
    /// How egress tunnels copy bytes (naive: the reference's design, for comparison).
    #[arg(long, value_enum, default_value_t = CopyMode::Lean)]
    pub copy_mode: CopyMode,
    /// Egress: wait for an actor's data with a buffer this size held per
    /// tunnel (0: readiness, no buffer; the reference used 512).
    #[arg(long, default_value_t = 0)]
    pub wait_buffer: usize,
}

impl RelayVariant {
    pub fn is_lean(&self) -> bool {
        *self == Self::default()
    }
}

/// Relays as `variant` says until both directions finish.
pub async fn relay(
    variant: RelayVariant,
    actor: TcpStream,
    mut tunnel: Tunnel,
    pool: &BufferPool,
) -> io::Result<()> {
    match variant.copy_mode {
        CopyMode::Naive => naive(actor, tunnel).await,
        CopyMode::Lean => {
            let mut actor = WaitBuffered::new(actor, variant.wait_buffer);
            atunnel_core::relay(&mut actor, &mut tunnel, pool)
                .await
                .map(drop)
                .map_err(io::Error::other)
        }
    }
}

/// Copies both ways until both directions finish.
async fn naive(actor: TcpStream, tunnel: Tunnel) -> io::Result<()> {
    let (actor_read, actor_write) = actor.into_split();
    match tunnel {
        Tunnel::H2 { stream, _slot } => {
            let (send, mut recv) = stream.into_parts();
            let (pipe, mut from_pipe) = mpsc::channel::<Bytes>(1);
            // Aborted with the tunnel (deactivation drops this future).
            let reader = AbortOnDropHandle::new(tokio::spawn(async move {
                while let Some(data) = recv.data().await {
                    let data = data.map_err(io::Error::other)?;
                    let _ = recv.flow_control().release_capacity(data.len());
                    if pipe.send(data).await.is_err() {
                        break;
                    }
                }
                Ok::<_, io::Error>(())
            }));
            let down = AbortOnDropHandle::new(tokio::spawn(async move {
                let mut buf = vec![0u8; BUFFER];
                let mut w = actor_write;
                while let Some(data) = from_pipe.recv().await {
                    for piece in data.chunks(BUFFER) {
                        buf[..piece.len()].copy_from_slice(piece);
                        w.write_all(&buf[..piece.len()]).await?;
                    }
                }
                w.shutdown().await
            }));
            let up = up_h2(actor_read, send).await;
            let down = down.await.map_err(io::Error::other)?;
            let _ = reader.await;
            up.and(down)
        }
        Tunnel::H1(tls) => {
            let (tls_read, tls_write) = tokio::io::split(*tls);
            let down = AbortOnDropHandle::new(tokio::spawn(copy(tls_read, actor_write)));
            let up = copy(actor_read, tls_write).await;
            up.and(down.await.map_err(io::Error::other)?)
        }
    }
}

async fn copy(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) -> io::Result<()> {
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn up_h2(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut send: h2::SendStream<Bytes>,
) -> io::Result<()> {
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return send.send_data(Bytes::new(), true).map_err(io::Error::other);
        }
        let mut data = Bytes::copy_from_slice(&buf[..n]);
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            let granted = poll_fn(|cx| send.poll_capacity(cx))
                .await
                .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "stream closed"))?
                .map_err(io::Error::other)?;
            let piece = data.split_to(granted.min(data.len()));
            send.send_data(piece, false).map_err(io::Error::other)?;
        }
    }
}
