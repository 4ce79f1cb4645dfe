//! Dialing as the actors' programs do: sockets made inside their sandboxes
//! (each actor's runtime namespace), to the gateway sink's ports through
//! atunnel's egress.

use std::net::SocketAddr;
use std::sync::Arc;

use atunnel_sandbox::{NetNs, NsExecutor};
use tokio::net::TcpStream;

use super::bench::Bench;

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

    /// A connection to `dest` from actor `actor`'s sandbox (modulo how many
    /// there are); the socket's family is `dest`'s (the bench dials IPv4).
    pub(super) async fn dial(&self, actor: u64, dest: &str) -> std::io::Result<TcpStream> {
        let dest: SocketAddr = dest.parse().map_err(std::io::Error::other)?;
        let ns = &self.sandboxes[actor as usize % self.sandboxes.len()];
        crate::topology::connect_in(&self.exec, ns, dest).await
    }

    /// [`Self::dial`] from a socket whose buffers are fixed as `buffers`
    /// says.
    pub(super) async fn dial_with_buffers(
        &self,
        actor: u64,
        dest: &str,
        buffers: crate::topology::FixedBuffers,
    ) -> std::io::Result<TcpStream> {
        let dest: SocketAddr = dest.parse().map_err(std::io::Error::other)?;
        let ns = &self.sandboxes[actor as usize % self.sandboxes.len()];
        crate::topology::connect_in_with(&self.exec, ns, dest, buffers).await
    }
}
