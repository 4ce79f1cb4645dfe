//! Egress end to end on loopback: actor socket -> atunnel -> TLS gateway
//! (HTTP/2 and HTTP/1.1) -> destination, with real certificates.

use atunnel_support::prelude::*;

use crate::common::open_error;
use std::sync::Arc;
use std::time::Duration;

use atunnel_connect::client::OpenError;
use atunnel_identity::clock::Clock;
use atunnel_identity::identity::ActorRef;
use atunnel_identity::pki::ActorCertOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Proto {
    H2,
    H1,
}

impl Proto {
    fn tune(self) -> fn(&mut atunnel_gateway::GatewayConfig) {
        match self {
            Proto::H2 => |_| {},
            Proto::H1 => h1_only,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Proto::H2 => "h2",
            Proto::H1 => "http/1.1",
        }
    }
}

/// Each `scenario => h2_test, h1_test;` is two tests: `scenario` through an
/// HTTP/2 gateway, and through an HTTP/1.1 one.
macro_rules! over_h2_and_h1 {
    ($($(#[$attr:meta])* $scenario:ident => $h2:ident, $h1:ident;)*) => {$(
        $(#[$attr])*
        async fn $h2() {
            $scenario(Proto::H2).await;
        }

        $(#[$attr])*
        async fn $h1() {
            $scenario(Proto::H1).await;
        }
    )*};
}

// The scenarios below, each over both protocols.
over_h2_and_h1! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    an_idle_tunnel_holds_no_buffer_and_carries_the_next_bytes =>
        h2_idle_tunnel_holds_no_buffer_and_carries_the_next_bytes,
        h1_idle_tunnel_holds_no_buffer_and_carries_the_next_bytes;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    bytes_reach_the_destination_and_come_back =>
        h2_bytes_reach_the_destination_and_come_back,
        h1_bytes_reach_the_destination_and_come_back;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    half_close_travels_through_the_tunnel =>
        h2_half_close_travels_through_the_tunnel,
        h1_half_close_travels_through_the_tunnel;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    destination_half_close_travels_through_the_tunnel =>
        h2_destination_half_close_travels_through_the_tunnel,
        h1_destination_half_close_travels_through_the_tunnel;
    #[tokio::test]
    refused_connect_closes_the_actor_socket_with_no_bytes =>
        h2_refused_connect_closes_the_actor_socket_with_no_bytes,
        h1_refused_connect_closes_the_actor_socket_with_no_bytes;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_destination_reset_reaches_the_actor_as_a_reset =>
        h2_a_destination_reset_reaches_the_actor_as_a_reset,
        h1_a_destination_reset_reaches_the_actor_as_a_reset;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    deactivation_resets_the_actor_and_the_destination =>
        h2_deactivation_resets_the_actor_and_the_destination,
        h1_deactivation_resets_the_actor_and_the_destination;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    gateway_shutdown_resets_the_destination_and_the_actor =>
        h2_gateway_shutdown_resets_the_destination_and_the_actor,
        h1_gateway_shutdown_resets_the_destination_and_the_actor;
}

async fn one_actor_through(
    proto: Proto,
    dest: std::net::SocketAddr,
) -> (
    std::net::SocketAddr,
    RunningGateway,
    CancellationToken,
    Arc<atunnel::egress::Egress>,
) {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), proto.tune()).await;
    let (a, prepared) = alpha_prepared(&pki, gw.addr).await;
    let (listen_addr, egress, cancel) = activated(&a, prepared, dest).await;
    (listen_addr, gw, cancel, egress)
}

/// Alpha's egress through `gateway`, with certificates from a new source.
async fn alpha_prepared(
    pki: &Pki,
    gateway: std::net::SocketAddr,
) -> (ActorRef, atunnel::egress::ActorEgress) {
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(pki, gateway, a.clone(), source).await;
    (a, prepared)
}

/// `a` activated with `prepared` behind a listener sending to `dest`: the
/// listener's address, the egress, and what stops the listener.
async fn activated(
    a: &ActorRef,
    prepared: atunnel::egress::ActorEgress,
    dest: std::net::SocketAddr,
) -> (
    std::net::SocketAddr,
    Arc<atunnel::egress::Egress>,
    CancellationToken,
) {
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, dest, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");
    (addr, egress, cancel)
}

async fn bytes_reach_the_destination_and_come_back(proto: Proto) {
    let echo = echo_server().await;
    let (addr, mut gw, _cancel, egress) = one_actor_through(proto, echo).await;
    let up = random(1 << 20, 1);
    let back = round_trip(addr, up.clone()).await;
    assert!(
        back == up,
        "{}: 1 MiB echo came back corrupted ({} bytes)",
        proto.name(),
        back.len()
    );

    let seen = gw.seen.recv().await.expect("gateway saw the CONNECT");
    assert_eq!(seen.protocol, proto.name());
    assert_eq!(seen.method, "CONNECT");
    assert_eq!(seen.authority, echo.to_string());
    assert_eq!(seen.identity.actor_name, "alpha");
    match proto {
        // Pseudo-headers only: no regular header at all.
        Proto::H2 => assert!(
            seen.headers.is_empty(),
            "extra headers over h2: {:?}",
            seen.headers
        ),
        Proto::H1 => assert_eq!(seen.headers, vec![("host".to_string(), echo.to_string())]),
    }
    let stats = egress.stats();
    assert_eq!(stats.tunnels_total, 1);
    assert_eq!(stats.rejected_total, 0);
    println!("tunnel task future: {} B", stats.tunnel_future_bytes);
    // The tunnel's state is one task allocation; a larger future is paid by
    // every idle tunnel (the budget is 2 KiB of heap in all). 280 B in a
    // debug build, which with tokio's task header (about 100 B; tasks come
    // in 128 B steps) puts the allocation in its 384 B step: 344 while the
    // actor's socket and the destination were captured beside the sockets
    // the relay used and the relay borrowed its cut (512 B allocated), 520
    // while each direction kept room for a chunk and the cut was a
    // `select!` (640 B), 600 while the relay was an async block (768 B),
    // 680 while the tunnel waited on two cancellation tokens (896 B), 920
    // while it kept async-fn copies of its arguments, the open's result and
    // the unresolved destination.
    assert!(
        (1..=288).contains(&stats.tunnel_future_bytes),
        "tunnel future is {} B",
        stats.tunnel_future_bytes
    );
}

/// An egress tunnel has nothing to hibernate: once its bytes stop, it holds
/// no buffer (they return to the pool as each chunk is written), and the
/// next bytes flow as before.
async fn an_idle_tunnel_holds_no_buffer_and_carries_the_next_bytes(proto: Proto) {
    let echo = echo_server().await;
    let (addr, _gw, _cancel, egress) = one_actor_through(proto, echo).await;
    let (mut r, mut w) = TcpStream::connect(addr)
        .await
        .expect("connect")
        .into_split();
    for (round, len) in [(1u64, 1usize << 20), (2, 100_000), (3, 1)] {
        let data = random(len, round);
        let (writes, mut got) = (data.clone(), vec![0u8; len]);
        let (_, read) = tokio::join!(
            async { w.write_all(&writes).await.expect("write") },
            r.read_exact(&mut got)
        );
        read.expect("read");
        assert!(
            got == data,
            "{}: round {round} came back altered",
            proto.name()
        );
        // The pool's counter is changed by the tunnel's task; poll it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while egress.pool().stats().in_use > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: an idle tunnel holds {:?}",
                proto.name(),
                egress.pool().stats()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(
        egress.stats().tunnels_total,
        1,
        "one tunnel carried every round"
    );
    // Not vacuous: the tunnel did borrow its buffers from this pool.
    assert!(
        egress.pool().stats().acquired_total > 0,
        "{}: the tunnel borrowed nothing from the pool",
        proto.name()
    );
}

async fn half_close_travels_through_the_tunnel(proto: Proto) {
    let counter = counting_server().await;
    let (addr, _gw, _cancel, _egress) = one_actor_through(proto, counter).await;
    fin_reaches_the_destination(addr, proto).await;
}

/// Through `addr` to a counting destination, which answers only after it
/// sees our FIN.
async fn fin_reaches_the_destination(addr: std::net::SocketAddr, proto: Proto) {
    let got = round_trip(addr, vec![5u8; 300_000]).await;
    assert_eq!(
        String::from_utf8_lossy(&got),
        "got 300000 bytes",
        "{}",
        proto.name()
    );
}

/// The destination half-closes first: its greeting reaches the actor with
/// EOF, and the actor's bytes written after that still reach the
/// destination in full, followed by EOF once the actor shuts down.
async fn destination_half_close_travels_through_the_tunnel(proto: Proto) {
    let (greeter, mut received) = greeting_server().await;
    let (addr, _gw, _cancel, _egress) = one_actor_through(proto, greeter).await;
    let within = Duration::from_secs(10);
    let (mut r, mut w) = TcpStream::connect(addr)
        .await
        .expect("connect")
        .into_split();
    let mut greeting = Vec::new();
    tokio::time::timeout(within, r.read_to_end(&mut greeting))
        .await
        .expect("the destination's FIN reaches the actor")
        .expect("read the greeting");
    assert_eq!(greeting, b"hello", "{}", proto.name());
    let data = random(1 << 20, 11);
    w.write_all(&data)
        .await
        .expect("write after the destination's FIN");
    w.shutdown().await.expect("shutdown");
    let got = tokio::time::timeout(within, received.recv())
        .await
        .expect("the destination reads to our FIN")
        .expect("destination")
        .unwrap_or_else(|e| panic!("{}: the destination's read failed: {e}", proto.name()));
    assert!(
        got == data,
        "{}: the destination got {} of {} bytes",
        proto.name(),
        got.len(),
        data.len()
    );
}

async fn refused_connect_closes_the_actor_socket_with_no_bytes(proto: Proto) {
    let pki = Pki::new();
    // Default deny: nothing allowed.
    let gw = gateway(&pki, forward_with(Default::default()), proto.tune()).await;
    let (a, prepared) = alpha_prepared(&pki, gw.addr).await;
    let client = prepared.client().clone();
    match client.open_authority("192.0.2.10:443").await {
        Err(OpenError::ConnectRefused { status, body, .. }) => {
            assert_eq!(status, 403);
            assert_eq!(body, "egress denied by no allow rule");
        }
        Err(e) => panic!("{}: expected a refusal, got {e}", proto.name()),
        Ok(_) => panic!("{}: expected a refusal, got a tunnel", proto.name()),
    }
    let (addr, egress, _cancel) =
        activated(&a, prepared, "192.0.2.10:443".parse().expect("addr")).await;
    assert!(bytes_before_close(addr).await.is_empty());
    assert_eq!(egress.stats().open_failed_total, 1);
}

#[tokio::test]
async fn unreachable_gateway_closes_the_actor_socket_with_no_bytes() {
    let pki = Pki::new();
    // A port nobody listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let (a, prepared) = alpha_prepared(&pki, dead).await;
    let err = open_error(&prepared, "192.0.2.10:443").await;
    assert!(matches!(err, OpenError::GatewayUnreachable { .. }), "{err}");
    let (addr, egress, _cancel) =
        activated(&a, prepared, "192.0.2.10:443".parse().expect("addr")).await;
    assert!(bytes_before_close(addr).await.is_empty());
    // Admitted, then closed because the tunnel could not open.
    let counts = TunnelCounts {
        rejected: 0,
        admitted: 1,
        failed: 1,
    };
    assert_eq!(tunnel_counts(&egress), counts);
}

#[tokio::test]
async fn destinations_must_be_ip_literals_with_ports_and_are_checked_before_io() {
    let pki = Pki::new();
    let dead = "127.0.0.1:1".parse().expect("addr");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, dead, actor("alpha"), source).await;
    for bad in [
        "example.com:443",
        "192.0.2.1",
        "192.0.2.1:0",
        "192.0.2.1:70000",
        "[2001:db8::1]",
        "",
    ] {
        let err = prepared
            .client()
            .open_authority(bad)
            .await
            .err()
            .expect("rejected");
        assert!(
            matches!(err, OpenError::InvalidDestination(_)),
            "{bad}: {err}"
        );
    }
}

async fn handshake_refused(
    proto: Proto,
    tls13: bool,
    options: ActorCertOptions,
    other_ca: bool,
) -> OpenError {
    let pki = Pki::new();
    let mut gw = gateway(&pki, SinkConfig::default(), |cfg| {
        proto.tune()(cfg);
        cfg.tls_versions = if tls13 {
            vec![&rustls::version::TLS13]
        } else {
            vec![&rustls::version::TLS12]
        };
    })
    .await;
    let ca = if other_ca {
        Arc::new(atunnel_identity::pki::CertificateAuthority::new("impostor CA").expect("ca"))
    } else {
        pki.actor_ca.clone()
    };
    let mut source = TestSource::new(ca, Clock::new());
    source.options = options;
    let prepared = prepare(&pki, gw.addr, actor("alpha"), Arc::new(source)).await;
    let err = match prepared.client().open_authority("192.0.2.10:7").await {
        Err(e) => e,
        Ok(_) => panic!("the gateway let a bad certificate through"),
    };
    // Refused in the handshake: no CONNECT reached the gateway's handler.
    let what = format!("{} tls13={tls13}", proto.name());
    assert!(
        matches!(gw.seen.try_recv(), Err(TryRecvError::Empty)),
        "{what}: a CONNECT got past the refused handshake"
    );
    // The same gateway does report a good actor's CONNECT, and it is the
    // first one on the channel: nothing from the refused actor came late.
    let good = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw.addr, actor("beta"), good).await;
    drop(
        prepared
            .client()
            .open_authority("192.0.2.10:7")
            .await
            .unwrap_or_else(|e| panic!("{what}: a good certificate was refused: {e}")),
    );
    let seen = gw.seen.recv().await.expect("the good actor's CONNECT");
    assert_eq!(seen.identity.actor_name, "beta", "{what}");
    err
}

/// [`handshake_refused`] over h2 and HTTP/1.1, TLS 1.3 and 1.2: each a
/// handshake error.
async fn refused_in_every_handshake(options: ActorCertOptions, other_ca: bool) {
    for proto in [Proto::H2, Proto::H1] {
        for tls13 in [true, false] {
            let err = handshake_refused(proto, tls13, options.clone(), other_ca).await;
            assert!(
                matches!(err, OpenError::GatewayHandshake { .. }),
                "{} tls13={tls13}: {err}",
                proto.name()
            );
        }
    }
}

#[tokio::test]
async fn gateway_refuses_certificates_from_another_ca_under_tls12_and_tls13() {
    refused_in_every_handshake(ActorCertOptions::default(), true).await;
}

#[tokio::test]
async fn gateway_refuses_certificates_without_the_actor_extension() {
    let options = ActorCertOptions {
        include_identity_extension: false,
        ..ActorCertOptions::default()
    };
    refused_in_every_handshake(options, false).await;
}

#[tokio::test]
async fn opening_a_tunnel_is_bounded_in_time() {
    // Accepts TCP and never says a word.
    let (addr, _hold) = silent_peer().await;
    let pki = Pki::new();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let mut cfg = client_config(&pki, addr);
    cfg.open_timeout = Duration::from_millis(300);
    let prepared = atunnel::egress::ActorEgress::prepare(actor("alpha"), cfg, source, Clock::new())
        .await
        .expect("prepare");
    let started = std::time::Instant::now();
    let err = open_error(&prepared, "192.0.2.10:443").await;
    let took = started.elapsed();
    assert!(
        matches!(err, OpenError::Timeout { after, .. } if after == Duration::from_millis(300)),
        "{err}"
    );
    // The configured 300 ms, not some other bound: measured 301-303 ms.
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "the open gave up after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_tunnels_share_a_connection_until_its_streams_run_out() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |cfg| {
        cfg.max_concurrent_streams = 2
    })
    .await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw.addr, actor("alpha"), source).await;
    let client = prepared.client().clone();
    // All at once on a cold client: each connection takes its first stream,
    // then as many as the gateway's SETTINGS allow once they are known.
    let tunnels = open_at_once(&client, 5, "192.0.2.10:9").await;
    let stats = client.stats();
    assert_eq!(
        (stats.h2_connections, stats.h2_streams),
        (3, 5),
        "{stats:?}"
    );
    drop(tunnels);
    let again = client.open_authority("192.0.2.10:9").await.expect("tunnel");
    assert_eq!(again.protocol(), "h2");
    assert_eq!(
        client.stats().h2_connections,
        3,
        "freed streams are reused, no new connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pooled_connection_is_replaced_transparently() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let addr = gw.addr;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, addr, actor("alpha"), source).await;
    let client = prepared.client().clone();
    drop(
        client
            .open_authority("192.0.2.10:9")
            .await
            .expect("first tunnel"),
    );
    // Kill the gateway (and its connections), start a new one on the same port.
    drop(gw);
    let gw2 = loop {
        let candidate = gateway_at(&pki, addr).await;
        if let Some(g) = candidate {
            break g;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut t = client
        .open_authority("192.0.2.10:7")
        .await
        .expect("tunnel on a fresh connection");
    atunnel_core::endpoint::write_chunk(
        &mut t,
        atunnel_core::Chunk::Shared(bytes::Bytes::from_static(b"ping")),
    )
    .await
    .expect("write");
    let pool = atunnel_core::BufferPool::default();
    let chunk = atunnel_core::endpoint::read_chunk(&mut t, &pool)
        .await
        .expect("read")
        .expect("echo");
    assert_eq!(chunk.remaining(), b"ping");
    drop(gw2);
}

/// Starts a sink gateway on a fixed address, or None while the port is busy.
async fn gateway_at(pki: &Pki, addr: std::net::SocketAddr) -> Option<atunnel_core_gateway::Handle> {
    atunnel_core_gateway::start(pki, addr).await
}

mod atunnel_core_gateway {
    use super::*;
    use atunnel_gateway::GatewayConfig;

    pub struct Handle(CancellationToken);
    impl Drop for Handle {
        fn drop(&mut self) {
            self.0.cancel();
        }
    }

    pub async fn start(pki: &Pki, addr: std::net::SocketAddr) -> Option<Handle> {
        let cfg = GatewayConfig::new(
            pki.gateway_cert.chain.clone(),
            pki.gateway_cert.key(),
            vec![pki.actor_ca.cert_der()],
        );
        let far = SinkConfig::default();
        let gw =
            atunnel_gateway::new(cfg, far, atunnel_core::BufferPool::default()).expect("gateway");
        let cancel = CancellationToken::new();
        atunnel_gateway::spawn(gw, addr, cancel.clone())
            .await
            .ok()?;
        Some(Handle(cancel))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_services_answer_by_port() {
    let pki = Pki::new();
    let gw = gateway(
        &pki,
        SinkConfig {
            source_bytes: 100_000,
            http_body_bytes: 5,
            other_ports: None,
        },
        |_| {},
    )
    .await;
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw.addr, a.clone(), source).await;
    let client = prepared.client().clone();
    let egress = egress();
    egress.activate(&a.uid, prepared).expect("activate");
    let cancel = CancellationToken::new();
    let via = |port: u16| {
        let egress = egress.clone();
        let cancel = cancel.clone();
        let uid = a.uid.clone();
        async move {
            listen(
                &egress,
                &uid,
                format!("192.0.2.10:{port}").parse().expect("addr"),
                &cancel,
            )
            .await
        }
    };
    // source: exactly source_bytes, then EOF.
    let got = round_trip(via(19).await, Vec::new()).await;
    assert_eq!(got.len(), 100_000);
    // discard: nothing comes back, EOF after ours.
    assert!(round_trip(via(9).await, vec![1u8; 50_000]).await.is_empty());
    // http: one response per request head, keep-alive.
    let mut s = TcpStream::connect(via(80).await).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let one = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nxxxxx";
    let mut got = vec![0u8; one.len() * 2];
    s.read_exact(&mut got).await.expect("two responses");
    assert_eq!(&got[..one.len()], one);
    assert_eq!(&got[one.len()..], one);
    // Every port above opened its tunnel: discard's silence is the sink's.
    let stats = egress.stats();
    assert_eq!(
        (stats.tunnels_total, stats.open_failed_total),
        (3, 0),
        "{stats:?}"
    );
    // Unknown port: refused.
    let err = client
        .open_authority("192.0.2.10:4444")
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(err, OpenError::ConnectRefused { status: 403, .. }),
        "{err}"
    );
}

/// Through an egress with `cfg`, over `proto`: 3 MiB echoed intact, then a
/// half-close that reaches the destination (it answers after our FIN).
#[cfg(feature = "comparison")]
async fn carries_bytes_and_half_close(proto: Proto, cfg: atunnel::egress::EgressConfig) {
    let echo = echo_server().await;
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), proto.tune()).await;
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw.addr, a.clone(), source).await;
    let egress = egress_config(cfg);
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, echo, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");
    let up = random(3 << 20, 7);
    let back = round_trip(addr, up.clone()).await;
    assert!(back == up, "{}: the echo came back corrupted", proto.name());
    let counter = counting_server().await;
    let addr = listen(&egress, &a.uid, counter, &cancel).await;
    fin_reaches_the_destination(addr, proto).await;
    cancel.cancel();
}

/// The `--copy-mode naive` ablation moves the same bytes (both ways, with
/// half-close) as the lean relay; only its memory differs.
#[cfg(feature = "comparison")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_copy_mode_carries_bytes_and_half_close_over_h2_and_h1() {
    use atunnel::comparison::{CopyMode, RelayVariant};
    for proto in [Proto::H2, Proto::H1] {
        let cfg = atunnel::egress::EgressConfig {
            comparison: RelayVariant {
                copy_mode: CopyMode::Naive,
                wait_buffer: 0,
            },
            ..Default::default()
        };
        carries_bytes_and_half_close(proto, cfg).await;
    }
}

/// `--wait-buffer` (the reference's 512 B wait) carries the same bytes.
#[cfg(feature = "comparison")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_buffer_carries_bytes_and_half_close() {
    let cfg = atunnel::egress::EgressConfig {
        comparison: atunnel::comparison::RelayVariant {
            copy_mode: atunnel::comparison::CopyMode::Lean,
            wait_buffer: 512,
        },
        ..Default::default()
    };
    carries_bytes_and_half_close(Proto::H2, cfg).await;
}

/// A destination that sends `part`, then resets its one connection (RST:
/// SO_LINGER 0, then close) when told to.
async fn resetting_destination(part: Vec<u8>) -> (std::net::SocketAddr, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (reset_tx, reset) = oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        s.write_all(&part).await.expect("write the part");
        let _ = reset.await;
        s.set_zero_linger().expect("linger");
    });
    (addr, reset_tx)
}

/// A destination resetting mid-response reaches the actor as a reset, after
/// the bytes it sent before, intact: never as a clean end of a cut response.
async fn a_destination_reset_reaches_the_actor_as_a_reset(proto: Proto) {
    let part = random(300_000, 21);
    let (dest, reset) = resetting_destination(part.clone()).await;
    let (addr, _gw, _cancel, _egress) = one_actor_through(proto, dest).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut got = vec![0u8; part.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("the part arrives")
        .expect("read the part");
    assert!(
        got == part,
        "{}: the part came through altered",
        proto.name()
    );
    reset.send(()).expect("destination waiting");
    next_read_is_reset(&mut s, proto.name()).await;
}

/// An open tunnel from an actor socket to a watched echo: a round trip
/// shows it carries bytes both ways.
async fn open_watched_tunnel(
    proto: Proto,
) -> (
    TcpStream,
    tokio::sync::mpsc::UnboundedReceiver<std::io::Result<usize>>,
    RunningGateway,
    Arc<atunnel::egress::Egress>,
) {
    let (echo, watched) = watched_echo_server().await;
    // Dropping the listener's token does not cancel it.
    let (addr, gw, _, egress) = one_actor_through(proto, echo).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut ping = *b"ping";
    s.write_all(&ping).await.expect("write");
    s.read_exact(&mut ping).await.expect("echo");
    assert_eq!(&ping, b"ping", "{}", proto.name());
    (s, watched, gw, egress)
}

/// Deactivating an actor resets its open tunnel at both ends: the actor's
/// socket and the destination's connection, never a clean FIN.
async fn deactivation_resets_the_actor_and_the_destination(proto: Proto) {
    let (mut s, mut watched, _gw, egress) = open_watched_tunnel(proto).await;
    egress
        .deactivate(&actor("alpha").uid)
        .await
        .expect("deactivate");
    next_read_is_reset(&mut s, &format!("{}: actor", proto.name())).await;
    watched_end_is_reset(&mut watched, &format!("{}: destination", proto.name())).await;
}

/// The gateway shutting down with a tunnel open resets the destination's
/// connection and, through atunnel, the actor's socket.
async fn gateway_shutdown_resets_the_destination_and_the_actor(proto: Proto) {
    let (mut s, mut watched, gw, _egress) = open_watched_tunnel(proto).await;
    gw.cancel.cancel();
    watched_end_is_reset(&mut watched, &format!("{}: destination", proto.name())).await;
    next_read_is_reset(&mut s, &format!("{}: actor", proto.name())).await;
}
