//! `--copy-mode naive`: the reference's egress copy before its memory fix,
//! kept only as an ablation so one benchmark run can show both side by side.
//! Each direction is its own task with its own 32 KiB buffer held for the
//! tunnel's whole life, and an HTTP/2 stream gets a reader task that pulls
//! DATA into a pipe (as Go's http2 transport does). Never the default.

use std::future::poll_fn;
use std::io;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use crate::gateway_client::Tunnel;

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

/// Copies both ways until both directions finish.
pub async fn relay(actor: TcpStream, tunnel: Tunnel) -> io::Result<()> {
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
