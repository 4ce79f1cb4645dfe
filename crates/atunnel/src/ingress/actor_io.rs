//! The IO of one connection to an actor: plain for HTTP/1.1 and CONNECT,
//! under a [`FloodGuard`] for h2c, so an actor cannot flood its HTTP/2
//! client with control frames.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use atunnel_connect::flood::FloodGuard;
use hyper_util::client::legacy::connect::{Connected, Connection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub(crate) enum ActorIo {
    Plain(TcpStream),
    H2c(FloodGuard<TcpStream>),
}

impl ActorIo {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::H2c(guard) => guard.get_ref(),
        }
    }

    pub(crate) fn into_tcp(self) -> TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::H2c(guard) => guard.into_inner(),
        }
    }
}

impl Connection for ActorIo {
    fn connected(&self) -> Connected {
        self.tcp().connected()
    }
}

impl AsyncRead for ActorIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::H2c(guard) => Pin::new(guard).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ActorIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::H2c(guard) => Pin::new(guard).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::H2c(guard) => Pin::new(guard).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::H2c(guard) => Pin::new(guard).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::H2c(guard) => Pin::new(guard).poll_shutdown(cx),
        }
    }
}
