//! Peers that vanish without a FIN are found: a real network namespace
//! joined to the host by a veth pair, the far side's listener inside it,
//! and an nftables drop rule there that black-holes one connection (both
//! directions) while new ones still get through. Root only.

use atunnel_support::prelude::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel::egress::ActorEgress;
use atunnel_core::sockopt::{Keepalive, SocketOptions};
use atunnel_identity::clock::Clock;
use atunnel_sandbox::link::Netlink;
use atunnel_sandbox::{NetNs, NsExecutor, nft, require_root};
use tokio::net::TcpListener;

/// The table of [`FarNet::black_hole`]'s drop rules.
const BLACKHOLE: &str = "blackhole";

/// A namespace `far` joined to the host: the host's end of the veth has
/// `.1`, `far`'s `.2` of a /30 of its own.
struct FarNet {
    exec: NsExecutor,
    far: NetNs,
    far_addr: Ipv4Addr,
}

impl FarNet {
    async fn new(tag: &str, subnet: u8) -> Self {
        require_root("dead peer tests (network namespaces, veth, nftables)");
        let exec = NsExecutor::start().expect("netns executor");
        let name = format!("atn-dp{}-{tag}", std::process::id());
        let _ = exec.delete(&name).await;
        let far = exec.create(&name).await.expect("create namespace");
        let host = NetNs::current().expect("the host namespace");
        // Names and addresses of this process's own: a namespace whose
        // black-holed connections are still retransmitting outlives the
        // test for a while, and its veth with it.
        let pid = std::process::id();
        let (host_if, far_if) = (
            format!("dh{}{tag}", pid % 100_000),
            format!("df{}{tag}", pid % 100_000),
        );
        let octet = ((pid % 120) * 2) as u8 + subnet;
        let host_addr = Ipv4Addr::new(10, 203, octet, 1);
        let far_addr = Ipv4Addr::new(10, 203, octet, 2);
        let h = Netlink::open(&exec, &host).await.expect("host netlink");
        h.add_veth(&host_if, &far_if, &far).await.expect("veth");
        h.add_address(&host_if, host_addr, 30)
            .await
            .expect("address");
        h.up(&host_if).await.expect("up");
        let f = Netlink::open(&exec, &far).await.expect("far netlink");
        f.up("lo").await.expect("lo up");
        f.add_address(&far_if, far_addr, 30).await.expect("address");
        f.up(&far_if).await.expect("up");
        Self {
            exec,
            far,
            far_addr,
        }
    }

    /// A listener inside `far`.
    async fn listen(&self) -> TcpListener {
        let addr = SocketAddr::from((self.far_addr, 0));
        let std = self
            .exec
            .run_in(&self.far, move || std::net::TcpListener::bind(addr))
            .await
            .expect("enter the namespace")
            .expect("bind");
        std.set_nonblocking(true).expect("nonblocking");
        TcpListener::from_std(std).expect("tokio listener")
    }

    /// Drops every packet of the connection whose host-side port is `port`,
    /// both ways, inside `far`: to the host it is a peer that vanished.
    async fn black_hole(&self, port: u16) {
        self.exec
            .run_in(&self.far, move || {
                nft::apply(&nft::Ruleset::drop_tcp_port(BLACKHOLE, port))
            })
            .await
            .expect("enter the namespace")
            .expect("the drop rule");
    }

    /// Takes the drop rules away, so what is left of the connections can
    /// finish and the namespace go.
    async fn clear_holes(&self) {
        let _ = self
            .exec
            .run_in(&self.far, || nft::delete_table(nft::FAMILY, BLACKHOLE))
            .await;
    }

    /// The far end of the connection from host port `port`: its socket's
    /// inode while a descriptor of this process holds it, if one does.
    async fn far_socket_held(&self, port: u16) -> Option<u64> {
        let table = self
            .exec
            .run_in(&self.far, || {
                std::fs::read_to_string("/proc/thread-self/net/tcp")
            })
            .await
            .expect("enter the namespace")
            .expect("the namespace's TCP table");
        let inode = tcp_inode(&table, port)?;
        held_by_this_process(inode).then_some(inode)
    }
}

impl Drop for FarNet {
    fn drop(&mut self) {
        // The host's end of the veth goes with the namespace.
        let path = self.far.path();
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(path);
    }
}

/// The inode of the socket in a `/proc/net/tcp` table whose remote port is
/// `port` (0 for an orphan that no descriptor holds any more).
fn tcp_inode(table: &str, port: u16) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let remote_port = u16::from_str_radix(f.get(2)?.rsplit(':').next()?, 16).ok()?;
        (remote_port == port)
            .then(|| f.get(9)?.parse().ok())
            .flatten()
    })
}

fn held_by_this_process(inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir("/proc/self/fd")
        .expect("own descriptors")
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == want))
}

/// Polls `done` every 50 ms until it holds or `within` passes: socket
/// states in the kernel are not events a test can await.
async fn eventually(within: Duration, mut done: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if done().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The host-side ports of this process's established connections to `far`.
fn ports_to(far: SocketAddr) -> Vec<u16> {
    let std::net::IpAddr::V4(ip) = far.ip() else {
        panic!("IPv4 only")
    };
    let want = format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), far.port());
    let table = std::fs::read_to_string("/proc/self/net/tcp").expect("TCP table");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // 01: ESTABLISHED.
            (f.get(2) == Some(&want.as_str()) && f.get(3) == Some(&"01"))
                .then(|| u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect::<std::collections::BTreeSet<u16>>()
        // Read in pieces while the table changes, it can list a socket twice.
        .into_iter()
        .collect()
}

/// The one port in `after` that is not in `before`.
fn new_port(before: &[u16], after: &[u16]) -> u16 {
    let new: Vec<u16> = after
        .iter()
        .copied()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "one new connection: {before:?} -> {after:?}");
    new[0]
}

/// A warm pooled gateway connection is black-holed: the next tunnel waits
/// out one open timeout on it, the connection is retired, and the tunnel is
/// opened on a fresh one (bytes checked both ways). A second black-holed
/// connection is retired by its missed pings with no tunnel asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_pooled_gateway_connection_is_retired_and_the_next_tunnel_dials_anew() {
    // Also the bound on the first tunnel's dial and handshake, which a
    // loaded CI host once took past 1 s.
    const OPEN_TIMEOUT: Duration = Duration::from_secs(2);
    let net = FarNet::new("g", 0).await;
    let pki = Pki::new();
    let mut cfg = atunnel_gateway::GatewayConfig::new(
        pki.gateway_cert.chain.clone(),
        pki.gateway_cert.key(),
        vec![pki.actor_ca.cert_der()],
    );
    cfg.socket = SocketOptions::default();
    let gw = atunnel_gateway::new(cfg, forward_loopback(), atunnel_core::BufferPool::default())
        .expect("gateway");
    let listener = net.listen().await;
    let gw_addr = listener.local_addr().expect("addr");
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(gw.serve(listener, cancel.clone()));
    let dest = echo_server().await;

    let mut client = client_config(&pki, gw_addr);
    client.open_timeout = OPEN_TIMEOUT;
    // No pings in the first part: the open timeout alone must find it.
    client.ping_interval = Duration::ZERO;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let egress = ActorEgress::prepare(actor("alpha"), client, source.clone(), Clock::new())
        .await
        .expect("prepare egress");
    let mut warm = egress.client().open(dest).await.expect("a first tunnel");
    assert_eq!(echoed(&mut warm, b"warm").await, b"warm");
    drop(warm);
    net.black_hole(new_port(&[], &ports_to(gw_addr))).await;

    let started = Instant::now();
    let mut tunnel = egress
        .client()
        .open(dest)
        .await
        .expect("opened on a fresh connection");
    let took = started.elapsed();
    assert_eq!(
        echoed(&mut tunnel, b"after the hole").await,
        b"after the hole"
    );
    assert!(
        took >= OPEN_TIMEOUT && took < OPEN_TIMEOUT + Duration::from_secs(3),
        "opened after {took:?}: one open timeout and a dial"
    );
    let stats = egress.client().stats();
    assert_eq!(stats.h2_dead_retired_total, 1, "{stats:?}");
    drop(tunnel);

    // Pings find the next one without a tunnel waiting on it.
    let mut client = client_config(&pki, gw_addr);
    client.ping_interval = Duration::from_millis(300);
    client.ping_timeout = Duration::from_millis(300);
    let pinged = ActorEgress::prepare(actor("beta"), client, source, Clock::new())
        .await
        .expect("prepare egress");
    let before = ports_to(gw_addr);
    let mut warm = pinged.client().open(dest).await.expect("a tunnel");
    assert_eq!(echoed(&mut warm, b"warm").await, b"warm");
    drop(warm);
    net.black_hole(new_port(&before, &ports_to(gw_addr))).await;
    let retired = eventually(Duration::from_secs(10), async || {
        pinged.client().stats().h2_dead_retired_total == 1
    })
    .await;
    assert!(retired.is_some(), "{:?}", pinged.client().stats());
    assert_eq!(pinged.client().stats().h2_connections, 0);
    let started = Instant::now();
    let mut tunnel = pinged
        .client()
        .open(dest)
        .await
        .expect("a fresh connection");
    assert_eq!(echoed(&mut tunnel, b"pinged").await, b"pinged");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    cancel.cancel();
    net.clear_holes().await;
}

/// The router vanishes: ingress HTTPS finds it by its unanswered HTTP/2
/// pings, ingress CONNECT (no pings: a tunnel is bytes) by TCP keepalive,
/// and both close their side, giving the descriptor back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_router_is_closed_within_the_keepalive_bound_and_its_descriptor_freed() {
    let net = FarNet::new("r", 1).await;
    let ipki = IngressPki::new();
    let mut cfg = ipki.ingress_config();
    cfg.router_ping_interval = Duration::from_millis(300);
    cfg.router_ping_timeout = Duration::from_millis(300);
    // Keepalive counts in whole seconds: 1 s idle, 1 s apart, 2 probes.
    // With TCP_USER_TIMEOUT set, Linux ends a connection whose probes go
    // unanswered only once that much has passed since the last ACK, so it
    // is the bound too.
    cfg.socket.keepalive = Some(Keepalive {
        idle: Duration::from_secs(1),
        interval: Duration::from_secs(1),
        probes: 2,
    });
    cfg.socket.user_timeout = Some(Duration::from_secs(4));
    let ingress =
        atunnel::ingress::Ingress::new(cfg, atunnel_core::BufferPool::default()).expect("ingress");
    let cancel = tokio_util::sync::CancellationToken::new();
    let (https, connect) = (net.listen().await, net.listen().await);
    let (https_addr, connect_addr) = (
        https.local_addr().expect("addr"),
        connect.local_addr().expect("addr"),
    );
    tokio::spawn({
        let (i, c) = (ingress.clone(), cancel.clone());
        async move { i.serve_https(https, c).await }
    });
    tokio::spawn({
        let (i, c) = (ingress.clone(), cancel.clone());
        async move { i.serve_connect(connect, c).await }
    });
    let actor_http = http1_actor(|_req| async {
        http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))
    })
    .await;
    let actor_echo = echo_server().await;
    activate_ports(
        &ingress,
        "alpha",
        "uid-1",
        &[(80, actor_http.port()), (7, actor_echo.port())],
    );

    let mut router = RouterConn::open(&ipki, https_addr, true).await;
    let req = http::Request::get("https://w/")
        .header("ate-target-actor", "team-a/alpha")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    assert_eq!(router.send(req).await.expect("served").status(), 200);
    let https_port = new_port(&[], &ports_to(https_addr));
    let mut tunnel = h1_tunnel(&ipki, connect_addr, "alpha", 7).await;
    let h1_port = new_port(&[], &ports_to(connect_addr));
    tokio::io::AsyncWriteExt::write_all(&mut tunnel, b"ping")
        .await
        .expect("write");
    let mut back = [0u8; 4];
    tokio::io::AsyncReadExt::read_exact(&mut tunnel, &mut back)
        .await
        .expect("read");
    assert_eq!(&back, b"ping");
    let mut h2_router_conn = h2_router(&ipki, connect_addr).await;
    let mut h2 = h2_tunnel(&mut h2_router_conn, "alpha", 7).await;
    assert_eq!(echoed_h2(&mut h2, b"ping").await, b"ping");
    let h2_port = new_port(&[h1_port], &ports_to(connect_addr));

    for (what, port, bound) in [
        // A ping period and its timeout (0.6 s), margin for a busy host,
        // and less than keepalive would take (4 s or more).
        ("HTTPS", https_port, Duration::from_secs(3)),
        ("CONNECT over HTTP/2", h2_port, Duration::from_secs(3)),
        // No pings in HTTP/1.1: idle, then probes until the user timeout
        // (4-5 s), and margin.
        ("CONNECT over HTTP/1.1", h1_port, Duration::from_secs(10)),
    ] {
        let inode = net.far_socket_held(port).await;
        assert!(
            inode.is_some(),
            "{what}: atunnel holds the router's connection"
        );
        net.black_hole(port).await;
        let closed = eventually(bound, async || net.far_socket_held(port).await.is_none()).await;
        assert!(closed.is_some(), "{what}: still held after {bound:?}");
        eprintln!("{what}: the black-holed router's connection closed after {closed:?}");
    }
    drop((router, tunnel, h2, h2_router_conn));
    cancel.cancel();
    net.clear_holes().await;
}
