//! One actor's sandbox network: two named namespaces joined by a veth pair,
//! the redirect, and sockets made inside it.
//!
//! | side | namespace | interface | address |
//! |---|---|---|---|
//! | actor | runtime (`<name>`) | `eth0` | 169.254.17.2/30, default route via .1 |
//! | gateway | gateway (`<name>-at`) | `atside` | 169.254.17.1/30 |
//!
//! Every sandbox has the same addresses (they are baked into snapshots), so
//! a socket's namespace, not its address, says whose it is. The sandbox is
//! IPv4 only: the veth still gets kernel IPv6 link-local addresses, and the
//! gateway side drops every IPv6 packet from the actor (see [`crate::nft`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use crate::link::{LinkError, Netlink};
use crate::netns::{NetNs, NetnsError, NsExecutor};
use crate::nft;

pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 1);
pub const ACTOR_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 2);
pub const SANDBOX_NET: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 0);
pub const PREFIX_LEN: u8 = 30;
pub const GATEWAY_IFACE: &str = "atside";
pub const ACTOR_IFACE: &str = "eth0";
/// Where the redirect sends the actor's TCP.
pub const DEFAULT_EGRESS_PORT: u16 = 15001;
pub const DNS_PORT: u16 = 53;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("sandbox {name}: {op}: {source}")]
    Io {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A built sandbox network. Call [`SandboxNetwork::destroy`] to remove it.
#[derive(Clone, Debug)]
pub struct SandboxNetwork {
    pub runtime: NetNs,
    pub gateway: NetNs,
    egress_port: u16,
}

/// The gateway namespace's name for a runtime namespace name.
pub fn gateway_ns_name(runtime: &str) -> String {
    format!("{runtime}-at")
}

impl SandboxNetwork {
    /// Builds the sandbox network named `name`. On failure nothing is left.
    pub async fn create(
        exec: &NsExecutor,
        name: &str,
        egress_port: u16,
    ) -> Result<Self, SandboxError> {
        let runtime = exec.create(name).await?;
        let gateway = match exec.create(&gateway_ns_name(name)).await {
            Ok(ns) => ns,
            Err(e) => {
                let _ = exec.delete(name).await;
                return Err(e.into());
            }
        };
        let sandbox = Self {
            runtime,
            gateway,
            egress_port,
        };
        if let Err(e) = sandbox.configure(exec, true).await {
            let _ = sandbox.clone().destroy(exec).await;
            return Err(e);
        }
        Ok(sandbox)
    }

    /// Builds the sandbox named `name`, adopting what an earlier process
    /// left under that name: the runtime namespace is kept (the actor's
    /// program may still run in it, and a new namespace of the same name
    /// would strand it), and everything is set up again idempotently: the
    /// veth pair is kept if it joins the two namespaces and rebuilt if not,
    /// addresses and the default route are replaced, links set up, and the
    /// nftables table replaced in one transaction. Returns whether either
    /// namespace was adopted. On failure nothing is left, adopted or not.
    pub async fn adopt_or_create(
        exec: &NsExecutor,
        name: &str,
        egress_port: u16,
    ) -> Result<(Self, bool), SandboxError> {
        let (runtime, runtime_adopted) = exec.open_or_create(name).await?;
        let (gateway, gateway_adopted) = match exec.open_or_create(&gateway_ns_name(name)).await {
            Ok(ns) => ns,
            Err(e) => {
                let _ = exec.delete(name).await;
                return Err(e.into());
            }
        };
        let sandbox = Self {
            runtime,
            gateway,
            egress_port,
        };
        let adopted = runtime_adopted || gateway_adopted;
        if let Err(e) = sandbox.configure(exec, !adopted).await {
            let _ = sandbox.clone().destroy(exec).await;
            return Err(e);
        }
        Ok((sandbox, adopted))
    }

    /// Sets the sandbox up; `fresh`: both namespaces were just made, so
    /// there is nothing to check or replace.
    async fn configure(&self, exec: &NsExecutor, fresh: bool) -> Result<(), SandboxError> {
        let gw = Netlink::open(exec, &self.gateway).await?;
        let rt = Netlink::open(exec, &self.runtime).await?;
        if fresh || !self.veth_joins(&gw, &rt).await? {
            // A half-built or foreign pair goes; deleting either end of a
            // veth deletes both.
            if !fresh {
                gw.delete(GATEWAY_IFACE).await?;
                rt.delete(ACTOR_IFACE).await?;
            }
            gw.add_veth(GATEWAY_IFACE, ACTOR_IFACE, &self.runtime)
                .await?;
        }
        gw.up("lo").await?;
        gw.add_address(GATEWAY_IFACE, GATEWAY_ADDR, PREFIX_LEN)
            .await?;
        gw.up(GATEWAY_IFACE).await?;
        rt.up("lo").await?;
        rt.add_address(ACTOR_IFACE, ACTOR_ADDR, PREFIX_LEN).await?;
        rt.up(ACTOR_IFACE).await?;
        rt.add_default_route(GATEWAY_ADDR).await?;
        let egress_port = self.egress_port;
        exec.run_in(&self.gateway, move || {
            let rules = nft::Ruleset::sandbox(
                GATEWAY_IFACE,
                SANDBOX_NET,
                PREFIX_LEN,
                egress_port,
                DNS_PORT,
            )?;
            if fresh {
                nft::apply(&rules)
            } else {
                nft::replace(&rules)
            }
        })
        .await?
        .map_err(|source| SandboxError::Io {
            name: self.runtime.name().to_string(),
            op: "apply nftables ruleset",
            source,
        })
    }

    /// Whether `atside` in the gateway namespace and `eth0` in the runtime
    /// namespace are the two ends of one veth: each a veth whose peer is in
    /// another namespace at the other's index. (Indexes repeat across
    /// namespaces, so a pair moved between sandboxes could pass; only root
    /// on the host can move one, and a veth's peer dies with its namespace.)
    async fn veth_joins(&self, gw: &Netlink, rt: &Netlink) -> Result<bool, SandboxError> {
        let (Some((gw_index, gw_peer)), Some((rt_index, rt_peer))) =
            (gw.veth(GATEWAY_IFACE).await?, rt.veth(ACTOR_IFACE).await?)
        else {
            return Ok(false);
        };
        Ok(gw_peer == rt_index && rt_peer == gw_index)
    }

    /// Opens an existing sandbox by its runtime namespace's name (another
    /// process built it), to make sockets inside it.
    pub fn open(name: &str, egress_port: u16) -> Result<Self, SandboxError> {
        Ok(Self {
            runtime: NetNs::open(name)?,
            gateway: NetNs::open(&gateway_ns_name(name))?,
            egress_port,
        })
    }

    /// Removes both namespaces (and with them the veth pair). Idempotent.
    pub async fn destroy(self, exec: &NsExecutor) -> Result<(), SandboxError> {
        let runtime = exec.delete(self.runtime.name()).await;
        let gateway = exec.delete(self.gateway.name()).await;
        runtime?;
        gateway?;
        Ok(())
    }

    pub fn name(&self) -> &str {
        self.runtime.name()
    }

    pub fn egress_port(&self) -> u16 {
        self.egress_port
    }

    /// A TCP listener on `addr` inside the gateway namespace.
    pub async fn listen_tcp(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpListener, SandboxError> {
        let listener = exec
            .run_in(&self.gateway, move || listen_tcp(addr))
            .await?
            .map_err(|source| self.io("bind TCP listener", source))?;
        tokio::net::TcpListener::from_std(listener)
            .map_err(|source| self.io("register TCP listener", source))
    }

    /// A UDP socket bound to `addr` inside the gateway namespace.
    pub async fn bind_udp(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::UdpSocket, SandboxError> {
        let socket = exec
            .run_in(&self.gateway, move || {
                let s = std::net::UdpSocket::bind(addr)?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(s)
            })
            .await?
            .map_err(|source| self.io("bind UDP socket", source))?;
        tokio::net::UdpSocket::from_std(socket)
            .map_err(|source| self.io("register UDP socket", source))
    }

    /// Binds the egress listener: every port-`egress_port` address of the
    /// gateway namespace, which the redirect delivers to.
    pub async fn listen_egress(
        &self,
        exec: &NsExecutor,
    ) -> Result<tokio::net::TcpListener, SandboxError> {
        self.listen_tcp(
            exec,
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, self.egress_port)),
        )
        .await
    }

    /// Dials `addr` from inside the gateway namespace (ingress into the
    /// sandbox dials the actor at 169.254.17.2 this way).
    pub async fn connect_from_gateway(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpStream, SandboxError> {
        self.connect_from(exec, &self.gateway, addr).await
    }

    /// Dials `addr` from inside the actor's runtime namespace, as the actor's
    /// own program would.
    pub async fn connect_from_runtime(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpStream, SandboxError> {
        self.connect_from(exec, &self.runtime, addr).await
    }

    async fn connect_from(
        &self,
        exec: &NsExecutor,
        ns: &NetNs,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpStream, SandboxError> {
        let socket = exec
            .run_in(ns, move || new_tcp_socket(addr))
            .await?
            .map_err(|source| self.io("create TCP socket", source))?;
        let socket = tokio::net::TcpSocket::from_std_stream(socket);
        socket
            .connect(addr)
            .await
            .map_err(|source| self.io("connect", source))
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> SandboxError {
        SandboxError::Io {
            name: self.runtime.name().to_string(),
            op,
            source,
        }
    }
}

/// A non-blocking TCP listener on `addr` in the calling thread's namespace
/// (run it through [`NsExecutor::run_in`] to place it in a sandbox).
pub fn listen_tcp(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// An unconnected, non-blocking TCP socket (connected later on the runtime).
fn new_tcp_socket(addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The actor's address and a port, as seen from the gateway namespace.
pub fn actor_addr(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ACTOR_ADDR, port))
}
