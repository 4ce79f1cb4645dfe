//! The tunnel an open hands to the relay: an HTTP/2 stream holding its
//! pool slot, or a whole TLS connection; one `Endpoint` either way.

use std::io;
use std::task::{Context, Poll};

use atunnel_core::endpoint::{Chunk, Endpoint};
use atunnel_core::{BufferPool, H2Stream};
use atunnel_tls::client::ClientTls;

use super::pool::StreamSlot;

/// An open tunnel, ready for the relay.
pub enum GatewayTunnel {
    H2 {
        stream: H2Stream,
        _slot: StreamSlot,
    },
    /// Boxed: a TLS session is large and most tunnels are HTTP/2.
    H1(Box<ClientTls>),
}

impl GatewayTunnel {
    /// Which protocol carries it, for tests to tell what the open chose;
    /// nothing else asks.
    #[cfg(feature = "test-util")]
    pub fn protocol(&self) -> &'static str {
        match self {
            GatewayTunnel::H2 { .. } => "h2",
            GatewayTunnel::H1(_) => "http/1.1",
        }
    }

    fn endpoint(&mut self) -> &mut dyn Endpoint {
        match self {
            GatewayTunnel::H2 { stream, .. } => stream,
            GatewayTunnel::H1(tls) => tls.as_mut(),
        }
    }
}

impl Endpoint for GatewayTunnel {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_readable(cx)
    }
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.endpoint().poll_send_capacity(cx)
    }
    fn idle(&mut self) {
        self.endpoint().idle()
    }
    fn reads_into_pool(&self) -> bool {
        matches!(self, GatewayTunnel::H1(_))
    }
    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        pool: &BufferPool,
        max: usize,
    ) -> Poll<io::Result<Option<Chunk>>> {
        self.endpoint().poll_read_chunk(cx, pool, max)
    }
    fn consumed(&mut self, n: usize) {
        self.endpoint().consumed(n)
    }
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Chunk,
    ) -> Poll<io::Result<()>> {
        self.endpoint().poll_write_chunk(cx, chunk)
    }
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_flush(cx)
    }
    fn poll_close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_close_write(cx)
    }
    fn poll_write_cut(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.endpoint().poll_write_cut(cx)
    }
    fn abort(&mut self) {
        self.endpoint().abort()
    }
}
