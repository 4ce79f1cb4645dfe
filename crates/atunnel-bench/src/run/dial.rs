//! Dialing as the actors' programs do: sockets made inside their sandboxes
//! (each actor's runtime namespace), to the gateway sink's ports through
//! atunnel's egress.

use std::net::SocketAddr;
use std::sync::Arc;

use atunnel_sandbox::{NetNs, NsExecutor};
use tokio::net::TcpStream;

use super::bench::Bench;

/// The sink's ports, as the actors dial them (the sink answers by port).
pub(super) const ECHO: &str = "192.0.2.10:7";
pub(super) const DISCARD: &str = "192.0.2.10:9";
pub(super) const HTTP: &str = "192.0.2.10:80";
pub(super) const SOURCE: &str = "192.0.2.10:19";
/// The sink's answer to each request on port 80 (64-byte body).
pub(super) const HTTP_ANSWER_LEN: usize =
    "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n".len() + 64;

/// Dials from inside the actors' sandboxes.
#[derive(Clone)]
pub(super) struct Actors {
    exec: NsExecutor,
    pub(super) sandboxes: Arc<Vec<NetNs>>,
}

impl Actors {
    pub(super) fn of(bench: &Bench) -> Self {
        Self {
            exec: bench.topo.exec.clone(),
            sandboxes: Arc::new(bench.sandboxes.clone()),
        }
    }

    pub(super) async fn dial(&self, actor: u64, dest: &str) -> std::io::Result<TcpStream> {
        let dest: SocketAddr = dest.parse().map_err(std::io::Error::other)?;
        let ns = &self.sandboxes[actor as usize % self.sandboxes.len()];
        let socket = self
            .exec
            .run_in(ns, move || {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                s.set_nonblocking(true)?;
                Ok::<std::net::TcpStream, std::io::Error>(s.into())
            })
            .await
            .map_err(std::io::Error::other)??;
        let s = tokio::net::TcpSocket::from_std_stream(socket)
            .connect(dest)
            .await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}
