//! One actor's sandbox network: two named namespaces joined by a veth pair,
//! the redirect, and sockets made inside it.
//!
//! | side | namespace | interface | address |
//! |---|---|---|---|
//! | actor | runtime (`<name>`) | `eth0` | 169.254.17.2/30, default route via .1; fd00:a7:17::2/126, default route via ::1 |
//! | gateway | gateway (`<name>-at`) | `atside` | 169.254.17.1/30; fd00:a7:17::1/126 |
//!
//! Every sandbox has the same addresses (they are baked into snapshots), so
//! a socket's namespace, not its address, says whose it is. The IPv6 side
//! (on unless the sandbox is made IPv4 only) is one ULA link prefix, the
//! same in every sandbox for the same reason; its addresses are added
//! without duplicate address detection (only two ends share the link, and
//! a tentative address would refuse the actor's first second of dials).
//! IPv4 only, the veth still gets kernel IPv6 link-local addresses, and the
//! gateway side drops every IPv6 packet from the actor (see [`crate::nft`]).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::link::{LinkError, Netlink};
use crate::netns::{NetNs, NetnsError, NsExecutor};
use crate::nft;

pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 1);
pub const ACTOR_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 2);
pub const SANDBOX_NET: Ipv4Addr = Ipv4Addr::new(169, 254, 17, 0);
pub const PREFIX_LEN: u8 = 30;
pub const GATEWAY_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa7, 0x17, 0, 0, 0, 0, 1);
pub const ACTOR_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa7, 0x17, 0, 0, 0, 0, 2);
pub const SANDBOX_NET6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa7, 0x17, 0, 0, 0, 0, 0);
/// A /126, as the IPv4 side's /30: the two ends and nothing else.
pub const PREFIX_LEN6: u8 = 126;
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
    /// Whether the sandbox has its IPv6 side (addresses, route, redirect).
    ipv6: bool,
}

/// The gateway namespace's name for a runtime namespace name.
pub fn gateway_ns_name(runtime: &str) -> String {
    format!("{runtime}-at")
}

impl SandboxNetwork {
    /// Builds the sandbox network named `name`, dual-stack if `ipv6`. On
    /// failure nothing is left.
    pub async fn create(
        exec: &NsExecutor,
        name: &str,
        egress_port: u16,
        ipv6: bool,
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
            ipv6,
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
    /// nftables table replaced in one transaction. An IPv4-only sandbox
    /// adopting a dual-stack one loses its IPv6 addresses and route. Returns
    /// whether either namespace was adopted. On failure nothing is left,
    /// adopted or not.
    pub async fn adopt_or_create(
        exec: &NsExecutor,
        name: &str,
        egress_port: u16,
        ipv6: bool,
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
            ipv6,
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
        if self.ipv6 {
            gw.add_address_nodad(GATEWAY_IFACE, GATEWAY_ADDR6, PREFIX_LEN6)
                .await?;
            rt.add_address_nodad(ACTOR_IFACE, ACTOR_ADDR6, PREFIX_LEN6)
                .await?;
            rt.add_default_route6(GATEWAY_ADDR6).await?;
        } else if !fresh {
            // An earlier process's dual-stack sandbox: its IPv6 side goes,
            // so the actor's IPv6 dials fail at once as in a fresh one.
            rt.remove_default_route6().await?;
            rt.remove_address(ACTOR_IFACE, ACTOR_ADDR6, PREFIX_LEN6)
                .await?;
            gw.remove_address(GATEWAY_IFACE, GATEWAY_ADDR6, PREFIX_LEN6)
                .await?;
        }
        let egress_port = self.egress_port;
        let net6 = self.ipv6.then_some((SANDBOX_NET6, PREFIX_LEN6));
        exec.run_in(&self.gateway, move || {
            let rules = nft::Ruleset::sandbox(
                GATEWAY_IFACE,
                SANDBOX_NET,
                PREFIX_LEN,
                net6,
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
    /// process built it, dual-stack if `ipv6`), to make sockets inside it.
    pub fn open(name: &str, egress_port: u16, ipv6: bool) -> Result<Self, SandboxError> {
        Ok(Self {
            runtime: NetNs::open(name)?,
            gateway: NetNs::open(&gateway_ns_name(name))?,
            egress_port,
            ipv6,
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

    /// Whether the sandbox has its IPv6 side.
    pub fn ipv6(&self) -> bool {
        self.ipv6
    }

    /// The resolv.conf the actor's runtime gives its program: the DNS
    /// relay's addresses, IPv4 first (a resolver that cannot use IPv6
    /// tries it first), and the IPv6 one if the sandbox is dual-stack.
    pub fn resolv_conf(&self) -> String {
        if self.ipv6 {
            format!("nameserver {GATEWAY_ADDR}\nnameserver {GATEWAY_ADDR6}\n")
        } else {
            format!("nameserver {GATEWAY_ADDR}\n")
        }
    }

    /// A TCP listener on `addr` inside the gateway namespace.
    pub async fn listen_tcp(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpListener, SandboxError> {
        self.in_gateway(
            exec,
            move || listen_tcp(addr),
            tokio::net::TcpListener::from_std,
            ["bind TCP listener", "register TCP listener"],
        )
        .await
    }

    /// A UDP socket bound to `addr` inside the gateway namespace.
    pub async fn bind_udp(
        &self,
        exec: &NsExecutor,
        addr: SocketAddr,
    ) -> Result<tokio::net::UdpSocket, SandboxError> {
        let bind = move || {
            let s = std::net::UdpSocket::bind(addr)?;
            s.set_nonblocking(true)?;
            Ok(s)
        };
        self.in_gateway(
            exec,
            bind,
            tokio::net::UdpSocket::from_std,
            ["bind UDP socket", "register UDP socket"],
        )
        .await
    }

    /// Binds the egress listener: every port-`egress_port` address of the
    /// gateway namespace, which the redirect delivers to. Dual-stack, one
    /// socket takes both families (IPv4 peers arrive v4-mapped, which
    /// [`atunnel_core::original_dst`] reads from the IPv4 table): one accept
    /// loop per sandbox, as before.
    pub async fn listen_egress(
        &self,
        exec: &NsExecutor,
    ) -> Result<tokio::net::TcpListener, SandboxError> {
        self.listen_tcp_any(exec, self.egress_port).await
    }

    /// A UDP socket on `[::]:port` taking both families in the gateway
    /// namespace (IPv4 only: `0.0.0.0:port`). Its replies leave from the
    /// address each query came to: the link has one address per family.
    pub async fn bind_udp_any(
        &self,
        exec: &NsExecutor,
        port: u16,
    ) -> Result<tokio::net::UdpSocket, SandboxError> {
        if !self.ipv6 {
            return self
                .bind_udp(exec, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
                .await;
        }
        let bind = move || {
            let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None)?;
            s.set_only_v6(false)?;
            s.set_nonblocking(true)?;
            s.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
            Ok(std::net::UdpSocket::from(s))
        };
        self.in_gateway(
            exec,
            bind,
            tokio::net::UdpSocket::from_std,
            ["bind dual-stack UDP socket", "register UDP socket"],
        )
        .await
    }

    /// A TCP listener on `[::]:port` taking both families in the gateway
    /// namespace (IPv4 only: `0.0.0.0:port`).
    pub async fn listen_tcp_any(
        &self,
        exec: &NsExecutor,
        port: u16,
    ) -> Result<tokio::net::TcpListener, SandboxError> {
        if !self.ipv6 {
            return self
                .listen_tcp(exec, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
                .await;
        }
        self.in_gateway(
            exec,
            move || listen_tcp_dual_stack(port),
            tokio::net::TcpListener::from_std,
            ["bind dual-stack TCP listener", "register TCP listener"],
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

    /// A socket `bind` makes inside the gateway namespace, which `register`
    /// hands to the runtime; `ops` name each step's failure.
    async fn in_gateway<S: Send + 'static, T>(
        &self,
        exec: &NsExecutor,
        bind: impl FnOnce() -> std::io::Result<S> + Send + 'static,
        register: impl FnOnce(S) -> std::io::Result<T>,
        [bind_op, register_op]: [&'static str; 2],
    ) -> Result<T, SandboxError> {
        let socket = exec
            .run_in(&self.gateway, bind)
            .await?
            .map_err(|source| self.io(bind_op, source))?;
        register(socket).map_err(|source| self.io(register_op, source))
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

/// [`listen_tcp`] on `[::]:port` with IPV6_V6ONLY off, so IPv4 peers are
/// accepted too (as v4-mapped addresses), whatever the namespace's
/// `bindv6only` says.
pub fn listen_tcp_dual_stack(port: u16) -> std::io::Result<std::net::TcpListener> {
    let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
    socket.set_only_v6(false)?;
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

/// The actor's IPv6 address and a port, as seen from the gateway namespace.
pub fn actor_addr6(port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(ACTOR_ADDR6, port, 0, 0))
}
