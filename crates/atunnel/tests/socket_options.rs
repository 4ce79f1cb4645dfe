//! Socket options as the kernel reports them on the sockets atunnel and the
//! gateway really accept and dial, not on sockets the test set up itself:
//! each is found through /proc/self/fd while its tunnel is open and read
//! back with getsockopt.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;

use atunnel::egress::EgressConfig;
use atunnel::tunnel::{GatewaySpec, Tunnel, TunnelConfig};
use atunnel_core::sockopt::{ReadBack, SocketOptions, read_back};
use atunnel_dns::RelayConfig;
use atunnel_sandbox::require_root;
use atunnel_sandbox::sandbox::{DNS_PORT, GATEWAY_ADDR};
use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// A connected TCP socket of this process, on a duplicate of its descriptor.
struct Connection {
    local: SocketAddr,
    peer: SocketAddr,
    socket: std::net::TcpStream,
}

/// Every connected TCP socket this process holds right now, once each (a
/// test running alongside may hold duplicates of the same sockets).
fn connections() -> Vec<Connection> {
    let mut found = Vec::new();
    let mut inodes = std::collections::HashSet::new();
    for (fd, path) in
        atunnel_host::numbered_entries::<RawFd>("/proc/self/fd").expect("list /proc/self/fd")
    {
        // "socket:[<inode>]"; the inode names the socket, whatever the fd.
        let Ok(target) = std::fs::read_link(path) else {
            continue;
        };
        let target = target.to_string_lossy();
        if !target.starts_with("socket:") || !inodes.insert(target.into_owned()) {
            continue;
        }
        // SAFETY: `fd` was listed as open just now and is only duplicated
        // (one fcntl); if another thread closed it since, the duplicate
        // fails with EBADF, and if the number was reused, the addresses
        // the caller matches on tell the sockets apart.
        let Ok(dup) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
            continue;
        };
        // Not every socket is a connected TCP one: Unix sockets have no IP
        // address and listeners no peer; the callers' matches do the rest.
        let socket = std::net::TcpStream::from(dup);
        if let (Ok(local), Ok(peer)) = (socket.local_addr(), socket.peer_addr()) {
            found.push(Connection {
                local,
                peer,
                socket,
            });
        }
    }
    found
}

/// The options of the one connection `is_it` picks out.
fn options_of(
    conns: &mut Vec<Connection>,
    what: &str,
    is_it: impl Fn(&Connection) -> bool,
) -> ReadBack {
    let (mut picked, rest): (Vec<_>, Vec<_>) = std::mem::take(conns).into_iter().partition(&is_it);
    *conns = rest;
    assert_eq!(picked.len(), 1, "{what}: expected exactly one socket");
    let conn = picked.pop().expect("one socket");
    // The original is a tokio socket, hence already non-blocking; the
    // duplicate shares that flag.
    let stream = TcpStream::from_std(conn.socket).expect("register the duplicate");
    let got = read_back(&stream).expect("getsockopt");
    println!("{what} ({} -> {}): {got:?}", conn.local, conn.peer);
    got
}

/// What the kernel gives a loopback connection nobody set options on.
async fn untouched_loopback() -> ReadBack {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let _accepted = accepted.expect("accept");
    let dialed = dialed.expect("connect");
    dialed.set_nodelay(true).expect("nodelay");
    read_back(&dialed).expect("getsockopt")
}

/// Checks that a socket given `opts` reports them, and that what `opts`
/// leaves off is as on `untouched`.
fn assert_carries(what: &str, got: ReadBack, opts: SocketOptions, untouched: ReadBack) {
    // 0 read back means "not set on the socket: net.ipv4.tcp_notsent_lowat
    // applies", the kernel default.
    assert_eq!(
        got.notsent_lowat,
        opts.notsent_lowat.unwrap_or(untouched.notsent_lowat),
        "{what}: TCP_NOTSENT_LOWAT"
    );
    assert!(got.nodelay, "{what}: TCP_NODELAY");
    // Linux doubles a requested size for its bookkeeping overhead. Left to
    // autotuning, the send buffer is sized from the path's MSS when the
    // connection is established (about 3.8 MiB on loopback), which a fixed
    // size would have prevented.
    assert_eq!(
        got.send_buffer,
        opts.send_buffer.map_or(untouched.send_buffer, |n| 2 * n),
        "{what}: SO_SNDBUF"
    );
    match opts.recv_buffer {
        Some(n) => assert_eq!(got.recv_buffer, 2 * n, "{what}: SO_RCVBUF"),
        // Left to autotuning, the receive buffer starts at the kernel's
        // default and grows when the application drains more than it
        // within a round trip: the gateway client's TLS stream reads
        // several records (up to 66 KiB) at once, and the 64 KiB echoed
        // below grows it (150 KB measured). A fixed size would not grow.
        None => assert!(
            got.recv_buffer >= untouched.recv_buffer,
            "{what}: SO_RCVBUF {} under the kernel's default {}",
            got.recv_buffer,
            untouched.recv_buffer
        ),
    }
}

/// Which socket a check is about.
type Pick<'a> = &'a dyn Fn(&Connection) -> bool;

/// Checks, on the sockets open now, that each one picked carries its options.
async fn assert_sockets(checks: &[(&str, SocketOptions, Pick<'_>)]) {
    let untouched = untouched_loopback().await;
    let mut conns = connections();
    for &(what, opts, is_it) in checks {
        let got = options_of(&mut conns, what, is_it);
        assert_carries(what, got, opts, untouched);
    }
}

/// Option sets that differ in every field, so a socket given the wrong set
/// is caught, not only one given none.
struct Sets {
    /// atunnel's network side.
    network: SocketOptions,
    /// atunnel's sandbox side (the actors' connections).
    sandbox: SocketOptions,
    gateway: SocketOptions,
}

const KIB: usize = 1024;

fn distinct_sets() -> Sets {
    Sets {
        network: SocketOptions {
            notsent_lowat: Some(8192),
            send_buffer: Some(72 * KIB),
            recv_buffer: Some(104 * KIB),
            ..SocketOptions::default()
        },
        sandbox: SocketOptions {
            notsent_lowat: Some(4096),
            send_buffer: Some(64 * KIB),
            recv_buffer: Some(96 * KIB),
            ..SocketOptions::sandbox_default()
        },
        gateway: SocketOptions {
            notsent_lowat: Some(12288),
            send_buffer: Some(80 * KIB),
            recv_buffer: Some(112 * KIB),
            ..SocketOptions::default()
        },
    }
}

/// `--tcp-notsent-lowat -1`, buffers at 0: everything left to the kernel.
fn kernel_defaults() -> Sets {
    let off = SocketOptions::from_flags(-1, 0, 0);
    Sets {
        network: off,
        sandbox: off,
        gateway: off,
    }
}

/// 64 KiB (random from `seed`) written to `s` come back intact from the
/// echo at its far end, through `what`.
async fn echoes_64_kib(s: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin), seed: u64, what: &str) {
    let data = random(64 * KIB, seed);
    s.write_all(&data).await.expect("write");
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).await.expect("read");
    assert!(back == data, "echo through {what} corrupted");
}

/// A tunnel's configuration with `sets` for its egress's two sides.
fn tunnel_config(pki: &Pki, sets: &Sets) -> TunnelConfig {
    let mut cfg = pki.tunnel_config();
    cfg.egress = EgressConfig {
        socket: sets.network,
        sandbox_socket: sets.sandbox,
        ..EgressConfig::default()
    };
    cfg
}

/// Opens one egress tunnel actor -> atunnel -> gateway -> echo and, while it
/// is open, checks the options on the four sockets it is made of.
async fn egress_sockets_carry(sets: Sets) {
    let pki = Pki::new();
    let gw_opts = sets.gateway;
    // The gateway's accepted and dialed sockets both take its options.
    let far = atunnel_gateway::Forward {
        socket: gw_opts,
        ..forward_loopback()
    };
    let gw = gateway(&pki, far, |cfg| cfg.socket = gw_opts).await;
    let echo = echo_server().await;
    // The tunnel, not the test, builds the gateway client from its egress
    // configuration: that wiring is under test too.
    let tunnel = Tunnel::start(tunnel_config(&pki, &sets))
        .await
        .expect("tunnel starts");
    let a = actor("alpha");
    let spec = GatewaySpec {
        address: gw.addr.to_string(),
        server_name: Some(GATEWAY_NAME.to_string()),
    };
    let prepared = tunnel.prepare_egress(&a, &spec).await.expect("prepare");
    let cancel = CancellationToken::new();
    let listen_addr = listen(tunnel.egress(), &a.uid, echo, &cancel).await;
    tunnel
        .egress()
        .activate(&a.uid, prepared)
        .expect("activate");

    let mut actor_conn = TcpStream::connect(listen_addr).await.expect("connect");
    echoes_64_kib(&mut actor_conn, 7, "the tunnel").await;

    // The tunnel is open: its four sockets exist.
    let actor_addr = actor_conn.local_addr().expect("actor addr");
    assert_sockets(&[
        (
            "actor's connection, accepted by atunnel",
            sets.sandbox,
            &|c| c.local == listen_addr && c.peer == actor_addr,
        ),
        ("atunnel's connection to the gateway", sets.network, &|c| {
            c.peer == gw.addr
        }),
        (
            "atunnel's connection, accepted by the gateway",
            sets.gateway,
            &|c| c.local == gw.addr,
        ),
        (
            "the gateway's connection to the destination",
            sets.gateway,
            &|c| c.peer == echo,
        ),
    ])
    .await;
    cancel.cancel();
    tunnel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_sockets_carry_the_configured_options() {
    egress_sockets_carry(distinct_sets()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_sockets_keep_the_kernel_defaults_when_options_are_off() {
    egress_sockets_carry(kernel_defaults()).await;
}

/// Opens an ingress CONNECT tunnel and an HTTPS request's connections to two
/// actors and, while they are open, checks the options on both sides.
async fn ingress_sockets_carry(sets: Sets) {
    let pki = IngressPki::new();
    let (network, sandbox) = (sets.network, sets.sandbox);
    let running = ingress_tuned(&pki, |cfg| {
        cfg.socket = network;
        cfg.sandbox_socket = sandbox;
    })
    .await;
    let tcp_actor = echo_server().await;
    let http_actor =
        http1_actor(|_| async { http::Response::new(Full::new(Bytes::from_static(b"hello"))) })
            .await;
    running.activate_alpha(&[(8080, tcp_actor.port()), (80, http_actor.port())]);

    let mut tunnel = router_tls(&pki, running.connect, None, None, &[b"http/1.1"])
        .await
        .expect("router TLS");
    tunnel
        .write_all(b"CONNECT actor:8080 HTTP/1.1\r\nHost: actor:8080\r\nate-target-actor: team-a/alpha\r\n\r\n")
        .await
        .expect("CONNECT");
    let head = atunnel_connect::http1::read_head(&mut tunnel)
        .await
        .expect("answer");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    echoes_64_kib(&mut tunnel, 8, "the CONNECT tunnel").await;

    // The router's HTTPS connection and ingress's pooled connection to the
    // actor stay open after the answer (keep-alive).
    let mut router = RouterConn::open(&pki, running.https, false).await;
    let req = http::Request::builder()
        .uri(format!("https://{}/", WORKER_NAME))
        .header("host", "app.example.com")
        .header("ate-target-actor", "team-a/alpha");
    assert_eq!(router.get_ok(req).await, "hello");

    assert_sockets(&[
        (
            "router's CONNECT connection, accepted by ingress",
            sets.network,
            &|c| c.local == running.connect,
        ),
        (
            "ingress's CONNECT connection to the actor",
            sets.sandbox,
            &|c| c.peer == tcp_actor,
        ),
        (
            "router's HTTPS connection, accepted by ingress",
            sets.network,
            &|c| c.local == running.https,
        ),
        (
            "ingress's HTTP connection to the actor",
            sets.sandbox,
            &|c| c.peer == http_actor,
        ),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_sockets_carry_the_configured_options() {
    ingress_sockets_carry(distinct_sets()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_sockets_keep_the_kernel_defaults_when_options_are_off() {
    ingress_sockets_carry(kernel_defaults()).await;
}

/// A DNS server over TCP on loopback that reports each query's arrival and
/// answers it (the query, QR set) once `release` is notified: while it
/// holds, the relay's connections from the actor and to it are open.
async fn held_tcp_dns() -> (SocketAddr, mpsc::UnboundedReceiver<()>, Arc<Notify>) {
    let (arrived_tx, arrived) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let held = release.clone();
    let addr = destination(move |mut s| {
        let (arrived_tx, held) = (arrived_tx.clone(), held.clone());
        async move {
            let Ok(len) = s.read_u16().await else { return };
            let mut message = vec![0u8; usize::from(len)];
            if s.read_exact(&mut message).await.is_err() || message.len() < 3 {
                return;
            }
            let _ = arrived_tx.send(());
            held.notified().await;
            message[2] |= 0x80;
            let mut frame = len.to_be_bytes().to_vec();
            frame.extend_from_slice(&message);
            let _ = s.write_all(&frame).await;
        }
    })
    .await;
    (addr, arrived, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_dns_relay_gives_its_tcp_sockets_the_tunnels_lowat() {
    require_root("sandbox DNS socket options test");
    let pki = Pki::new();
    let (upstream, mut arrived, release) = held_tcp_dns().await;
    // One sandbox at a time: every sandbox's relay is at the same address.
    for (round, sets) in [distinct_sets(), kernel_defaults()].into_iter().enumerate() {
        let mut cfg = tunnel_config(&pki, &sets);
        cfg.netns_prefix = format!("atnso-{}-", std::process::id());
        // The relay's own default lowat (16 KiB): the tunnel must override it.
        cfg.dns = Some(RelayConfig::new(vec![upstream]));
        let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
        let a = actor(&format!("dns{round}"));
        let sandbox = tunnel.serve_sandbox(&a).await.expect("sandbox");
        let relay = SocketAddr::from((GATEWAY_ADDR, DNS_PORT));
        let mut client = sandbox
            .connect_from_runtime(tunnel.executor(), relay)
            .await
            .expect("the actor dials its DNS relay");
        let query = [
            0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        let mut frame = (query.len() as u16).to_be_bytes().to_vec();
        frame.extend_from_slice(&query);
        client.write_all(&frame).await.expect("write query");
        tokio::time::timeout(std::time::Duration::from_secs(10), arrived.recv())
            .await
            .expect("the query reached the upstream within 10 s")
            .expect("upstream running");

        let actor_addr = client.local_addr().expect("actor addr");
        let mut conns = connections();
        // A dual-stack sandbox's relay socket is IPv6: IPv4 peers are v4-mapped.
        let same = |a: SocketAddr, b: SocketAddr| {
            (a.ip().to_canonical(), a.port()) == (b.ip().to_canonical(), b.port())
        };
        let accepted = options_of(&mut conns, "DNS accepted", |c| {
            same(c.local, relay) && same(c.peer, actor_addr)
        });
        let dialed = options_of(&mut conns, "DNS to upstream", |c| c.peer == upstream);
        drop(conns);
        let expected = sets.sandbox.notsent_lowat.unwrap_or(0);
        assert_eq!(accepted.notsent_lowat, expected, "relay's accepted socket");
        assert_eq!(dialed.notsent_lowat, expected, "relay's upstream socket");

        release.notify_one();
        let len = client.read_u16().await.expect("answer length");
        let mut answer = vec![0u8; usize::from(len)];
        client.read_exact(&mut answer).await.expect("answer");
        assert_eq!(answer[..2], query[..2], "the answer to our query");
        tunnel.close_sandbox(&a).await.expect("close sandbox");
        tunnel.shutdown().await;
    }
}
