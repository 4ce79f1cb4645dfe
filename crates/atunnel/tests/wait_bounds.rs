//! Waits and unauthenticated connections a peer can make atunnel or the
//! gateway hold are bounded: a client that never finishes TLS on every TLS
//! listener, a flood of them from one address while a router from another
//! is served, and the gateway's dial to a destination that never answers.
//! Real sockets, real TLS.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel::egress::ActorEgress;
use atunnel_connect::OpenError;
use atunnel_identity::clock::Clock;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const BOUND: Duration = Duration::from_millis(300);

/// Connects to `addr`, sends nothing, and returns how long the server took
/// to close the connection.
async fn closed_after(addr: SocketAddr) -> Duration {
    // Before the dial: the server's clock starts at its accept.
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("closed within 10 s");
    // A FIN, or a reset: nothing was sent either way.
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_tls_is_closed_after_the_handshake_timeout() {
    let ipki = IngressPki::new();
    let ingress = ingress_tuned(&ipki, |cfg| cfg.tls_handshake_timeout = BOUND).await;
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |cfg| {
        cfg.handshake_timeout = BOUND
    })
    .await;
    for (listener, addr) in [
        ("ingress HTTPS", ingress.https),
        ("ingress CONNECT", ingress.connect),
        ("gateway", gw.addr),
    ] {
        let took = closed_after(addr).await;
        assert!(
            took >= BOUND && took < BOUND * 10,
            "{listener}: closed after {took:?}"
        );
    }
}

/// A router from 127.0.0.1 dials ingress's HTTPS listener at `https`, as
/// a new connection, and its request to alpha is answered.
async fn router_is_served(ipki: &IngressPki, https: SocketAddr) {
    let mut router = RouterConn::open(ipki, https, true).await;
    let req = http::Request::get("https://w/").header("ate-target-actor", "team-a/alpha");
    router.get_ok(req).await;
}

/// A loopback address whose accept queue is full and never drained: the
/// kernel drops further SYNs, so a dial to it hangs.
async fn unanswering_destination() -> (SocketAddr, tokio::net::TcpListener, Vec<TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(1).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    // Fill the queue (backlog + 1 complete, then SYNs are dropped).
    while let Ok(Ok(s)) =
        tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
    {
        queued.push(s);
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    // The caller keeps the listener open, and never accepts.
    (addr, listener, queued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_dial_to_a_destination_that_never_answers_is_a_502() {
    let pki = Pki::new();
    let far = atunnel_gateway::Forward {
        dial_timeout: BOUND,
        ..forward_loopback()
    };
    let gw = gateway(&pki, far, |_| {}).await;
    let (dest, _listener, _queued) = unanswering_destination().await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let egress = ActorEgress::prepare(
        actor("alpha"),
        client_config(&pki, gw.addr),
        source,
        Clock::new(),
    )
    .await
    .expect("prepare egress");
    let started = Instant::now();
    match egress.client().open(dest).await {
        Err(OpenError::ConnectRefused { status, .. }) => assert_eq!(status, 502),
        Err(e) => panic!("expected a 502, got {e}"),
        Ok(_) => panic!("the dial cannot have succeeded"),
    }
    let took = started.elapsed();
    assert!(took >= BOUND && took < BOUND * 10, "refused after {took:?}");
}

/// A TCP connection to `addr` from loopback address `source`, sending
/// nothing.
async fn silent_from(source: std::net::Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind the source");
    socket.connect(addr).await.expect("connect")
}

/// Whether the server closed `s` within `within` (a FIN or a reset).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The two flood tests take turns: the 12,000-connection one left the other
/// a busy host on which one close past the cap was seen after its 5 s (CI,
/// once); each asserts timing of its own listeners only.
static FLOODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_flood_from_one_address_is_capped_and_a_router_from_another_is_served() {
    let _turn = FLOODS.lock().await;
    const PER_SOURCE: usize = 16;
    const FLOOD: usize = PER_SOURCE + 24;
    let limits = atunnel_tls::PreAuthLimits {
        total: 64,
        per_source: PER_SOURCE,
    };
    let ipki = IngressPki::new();
    let ingress = ingress_tuned(&ipki, |cfg| cfg.pre_auth = limits).await;
    let actor_http = http1_actor(|_req| async {
        http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))
    })
    .await;
    ingress.activate_alpha(&[(80, actor_http.port())]);
    let flooder = std::net::Ipv4Addr::new(127, 0, 0, 2);
    for (listener, addr) in [("HTTPS", ingress.https), ("CONNECT", ingress.connect)] {
        let mut flood = Vec::new();
        for _ in 0..FLOOD {
            flood.push(silent_from(flooder, addr).await);
        }
        // Past the cap, closed at once; the first PER_SOURCE wait for their
        // handshake (10 s, longer than these checks take together, with
        // room for a host busy with this binary's 12,000-connection flood).
        let mut checks = tokio::task::JoinSet::new();
        for mut s in flood.split_off(PER_SOURCE) {
            checks.spawn(async move { closed_within(&mut s, Duration::from_secs(5)).await });
        }
        let closed = checks.join_all().await.into_iter().filter(|c| *c).count();
        assert_eq!(
            closed,
            FLOOD - PER_SOURCE,
            "{listener}: closed past the cap"
        );
        let (https, connect) = ingress.ingress.pre_auth();
        let figures = if listener == "HTTPS" { https } else { connect };
        assert_eq!(figures.handshaking, PER_SOURCE, "{listener}: {figures:?}");
        assert_eq!(
            figures.refused_total,
            (FLOOD - PER_SOURCE) as u64,
            "{listener}: {figures:?}"
        );
        // A router from 127.0.0.1 is served meanwhile.
        if listener == "HTTPS" {
            router_is_served(&ipki, ingress.https).await;
        } else {
            let _tunnel = h1_tunnel(&ipki, ingress.connect, "alpha", 80).await;
        }
    }
}

/// Opens `count` silent connections to `addr`, spread over `sources`
/// loopback addresses from 127.0.0.2 up, as fast as they connect, and holds
/// them until the end. Connects that do not complete within a second (the
/// accept queue overflowing for a moment) are not retried.
async fn silent_flood(addr: SocketAddr, count: usize, sources: u8) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let source = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(sources)) as u8);
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((source, 0)))
            .expect("bind the source");
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), socket.connect(addr)).await
        {
            held.push(s);
        }
    }
    held
}

/// 12,000 silent connections from 100 addresses (past the total cap, each
/// address under its own) on each TLS listener at the default limits:
/// atunnel and the gateway hold at most the cap, ending the oldest to make
/// room, and routers (actors, at the gateway) opening fresh connections all
/// the while are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_silent_connections_from_many_addresses_leave_routers_served() {
    let _turn = FLOODS.lock().await;
    // As many as this process's 20,000 descriptors allow beside the
    // listeners' own (each holds at most its cap of 1,024 more).
    const FLOOD: usize = 12_000;
    const SOURCES: u8 = 100;
    let limits = atunnel_tls::PreAuthLimits::default();
    assert!(FLOOD > limits.total && FLOOD / usize::from(SOURCES) < limits.per_source);
    let ipki = IngressPki::new();
    let ingress = ingress_tuned(&ipki, |_| {}).await;
    let actor_http = http1_actor(|_req| async {
        http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))
    })
    .await;
    ingress.activate_alpha(&[(80, actor_http.port())]);
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let dest = echo_server().await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));

    for listener in ["HTTPS", "CONNECT", "gateway"] {
        let addr = match listener {
            "HTTPS" => ingress.https,
            "CONNECT" => ingress.connect,
            _ => gw.addr,
        };
        let flood = tokio::spawn(silent_flood(addr, FLOOD, SOURCES));
        // Fresh connections, each with its own handshake, until the flood
        // is all in.
        let mut served = 0;
        while !flood.is_finished() || served == 0 {
            match listener {
                "HTTPS" => {
                    router_is_served(&ipki, ingress.https).await;
                }
                "CONNECT" => {
                    let _tunnel = h1_tunnel(&ipki, ingress.connect, "alpha", 80).await;
                }
                _ => {
                    let egress = ActorEgress::prepare(
                        actor("alpha"),
                        client_config(&pki, gw.addr),
                        source.clone(),
                        Clock::new(),
                    )
                    .await
                    .expect("prepare egress");
                    let mut tunnel = egress.client().open(dest).await.expect("a tunnel");
                    assert_eq!(echoed(&mut tunnel, b"through").await, b"through");
                }
            }
            served += 1;
        }
        let held = flood.await.expect("flood task");
        let figures = || match listener {
            "HTTPS" => ingress.ingress.pre_auth().0,
            "CONNECT" => ingress.ingress.pre_auth().1,
            _ => (gw.pre_auth)(),
        };
        // The last connections may still wait in the accept queue: the
        // listener's count is read until it has taken them all (polled,
        // bounded: its accepts are not events a test can await).
        let taken = |f: atunnel_tls::PreAuthStats| {
            f.evicted_total + f.refused_total + f.handshaking as u64 >= held.len() as u64
        };
        let started = Instant::now();
        while !taken(figures()) && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let figures = figures();
        assert!(
            held.len() > limits.total * 2,
            "{listener}: only {} flood connections got in",
            held.len()
        );
        assert!(
            figures.handshaking <= limits.total,
            "{listener}: {figures:?}"
        );
        assert!(
            figures.evicted_total >= (held.len() - limits.total) as u64,
            "{listener}: {} held, {figures:?}",
            held.len()
        );
        eprintln!(
            "{listener}: {} silent connections, {served} fresh router connections served, {figures:?}",
            held.len()
        );
    }
}
