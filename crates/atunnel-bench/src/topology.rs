//! The bench's machine layout: worker, sink and load each in a network
//! namespace of their own, joined by veth links on benchmark-range addresses
//! (198.18.0.0/15, never a real network).
//!
//! | link | worker side | far side |
//! |---|---|---|
//! | worker - sink | `w-sink` 198.18.0.1/30 | `s-worker` 198.18.0.2/30 |
//! | worker - load | `w-load` 198.18.1.1/30 | `l-worker` 198.18.1.2/30 |
//!
//! The sink also holds fd00:198:18::2/128 (on `s-worker`, no DAD), the IPv6
//! destination chaos's forwarding gateway dials beside it in the sink's
//! namespace; the worker's namespace has no route to it (atunnel reaches the
//! gateway over IPv4, only the actors' destinations are IPv6).
//!
//! `run` creates the namespaces and links, `load` opens them to dial from,
//! and `worker` serves on the worker side's addresses.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use atunnel_sandbox::link::Netlink;
use atunnel_sandbox::{NetNs, NsExecutor};
use tokio::net::TcpStream;

pub const WORKER_SINK_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const SINK_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const SINK_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 2);
pub const WORKER_LOAD_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
pub const LOAD_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);

/// The worker's sandboxes are named `<prefix>s-...`, so sweeping `<prefix>`
/// removes them with the rest.
pub fn sandbox_prefix(prefix: &str) -> String {
    format!("{prefix}s-")
}

pub struct Topology {
    pub exec: NsExecutor,
    pub worker: NetNs,
    pub sink: NetNs,
    pub load: NetNs,
}

impl Topology {
    pub async fn create(prefix: &str) -> Result<Self, atunnel_process::BoxError> {
        let exec = NsExecutor::start()?;
        let worker = exec.create(&format!("{prefix}worker")).await?;
        let sink = exec.create(&format!("{prefix}sink")).await?;
        let load = exec.create(&format!("{prefix}load")).await?;
        let topology = Self {
            exec,
            worker,
            sink,
            load,
        };
        topology.link().await?;
        Ok(topology)
    }

    /// Opens the namespaces `create` made under `prefix` (by another
    /// process: `run` creates them, `load` dials from them).
    pub fn open(prefix: &str) -> Result<Self, atunnel_process::BoxError> {
        Ok(Self {
            exec: NsExecutor::start()?,
            worker: NetNs::open(&format!("{prefix}worker"))?,
            sink: NetNs::open(&format!("{prefix}sink"))?,
            load: NetNs::open(&format!("{prefix}load"))?,
        })
    }

    async fn link(&self) -> Result<(), atunnel_process::BoxError> {
        let w = Netlink::open(&self.exec, &self.worker).await?;
        w.up("lo").await?;
        w.add_veth("w-sink", "s-worker", &self.sink).await?;
        w.add_veth("w-load", "l-worker", &self.load).await?;
        w.add_address("w-sink", WORKER_SINK_SIDE, 30).await?;
        w.add_address("w-load", WORKER_LOAD_SIDE, 30).await?;
        w.up("w-sink").await?;
        w.up("w-load").await?;
        for (ns, iface, addr) in [
            (&self.sink, "s-worker", SINK_ADDR),
            (&self.load, "l-worker", LOAD_ADDR),
        ] {
            let n = Netlink::open(&self.exec, ns).await?;
            n.up("lo").await?;
            n.add_address(iface, addr, 30).await?;
            n.up(iface).await?;
        }
        Netlink::open(&self.exec, &self.sink)
            .await?
            .add_address_nodad("s-worker", SINK_ADDR6, 128)
            .await?;
        Ok(())
    }

    /// A TCP connection made from inside `ns`.
    pub async fn connect_in(&self, ns: &NetNs, addr: SocketAddr) -> std::io::Result<TcpStream> {
        connect_in(&self.exec, ns, addr).await
    }

    /// Removes the three namespaces (their veth links go with them).
    pub async fn destroy(&self) {
        for ns in [&self.worker, &self.sink, &self.load] {
            let _ = self.exec.delete(ns.name()).await;
        }
    }
}

/// A TCP connection to `addr` (no Nagle delay) from a socket that `exec`
/// made inside `ns`: it lives in that namespace whichever thread uses it.
pub async fn connect_in(
    exec: &NsExecutor,
    ns: &NetNs,
    addr: SocketAddr,
) -> std::io::Result<TcpStream> {
    connect_in_with(exec, ns, addr, FixedBuffers::default()).await
}

/// A socket's buffers in bytes where fixed (`SO_RCVBUF`, `SO_SNDBUF`; the
/// kernel's autotuning off for that one); none: autotuned.
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedBuffers {
    pub receive: Option<usize>,
    pub send: Option<usize>,
}

/// [`connect_in`], with the socket's buffers fixed as `buffers` says.
pub async fn connect_in_with(
    exec: &NsExecutor,
    ns: &NetNs,
    addr: SocketAddr,
    buffers: FixedBuffers,
) -> std::io::Result<TcpStream> {
    let socket = exec
        .run_in(ns, move || {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                None,
            )?;
            s.set_nonblocking(true)?;
            if let Some(bytes) = buffers.receive {
                s.set_recv_buffer_size(bytes)?;
            }
            if let Some(bytes) = buffers.send {
                s.set_send_buffer_size(bytes)?;
            }
            Ok::<std::net::TcpStream, std::io::Error>(s.into())
        })
        .await
        .map_err(std::io::Error::other)??;
    let stream = tokio::net::TcpSocket::from_std_stream(socket)
        .connect(addr)
        .await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}
