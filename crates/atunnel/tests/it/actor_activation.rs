//! One activation per actor, shared by its egress and its ingress:
//!
//! - deactivation cuts both sides at once and waits for them together: an
//!   egress tunnel ends at once even while an ingress request that cannot
//!   end holds ingress's drain, and the whole call takes one drain timeout;
//! - the activation's relay bounds (`TunnelConfig::egress.relay`) reach
//!   egress tunnels and ingress CONNECT tunnels alike.

use atunnel_support::prelude::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel::egress::Destination;
use atunnel::tunnel::{GatewaySpec, Tunnel};
use atunnel_core::relay::RelayBounds;
use atunnel_support::ingress::IngressPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The sink's echo and source services, by the destination's port.
const ECHO: &str = "192.0.2.10:7";
const SOURCE: &str = "192.0.2.10:19";

fn gateway_spec(addr: SocketAddr) -> GatewaySpec {
    GatewaySpec {
        address: addr.to_string(),
        server_name: Some(GATEWAY_NAME.into()),
    }
}

/// An HTTP/1.1 actor that answers every request with an endless body,
/// written as fast as its peer takes it.
async fn endless_actor() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match s.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n";
                if s.write_all(answer).await.is_err() {
                    return;
                }
                let zeros = vec![0u8; 16 * 1024];
                while s.write_all(&zeros).await.is_ok() {}
            });
        }
    });
    port
}

/// An actor that accepts and never reads nor writes; its sockets are kept
/// until the test ends.
async fn deaf_actor() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            kept.push(s);
        }
    });
    port
}

/// Alpha, active on both sides: its ingress port 80 is `actor_port` on
/// loopback, its egress listener (returned) sends everything to `dest`.
async fn activate_alpha(
    tunnel: &Tunnel,
    gateway: SocketAddr,
    actor_port: u16,
    dest: &str,
    cancel: &CancellationToken,
) -> SocketAddr {
    let alpha = actor("alpha");
    let egress = tunnel
        .prepare_egress(&alpha, &gateway_spec(gateway))
        .await
        .expect("prepare");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tunnel.egress().serve_listener(
        &alpha.uid,
        listener,
        Destination::Fixed(dest.parse().expect("addr")),
        cancel.clone(),
    );
    let dialer = LoopbackDialer(HashMap::from([(80, actor_port), (8080, actor_port)]));
    tunnel
        .activate_with_dialer(&alpha, Box::new(dialer), Some(egress))
        .await
        .expect("activate");
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_cuts_both_sides_at_once_and_drains_them_together() {
    const DRAIN: Duration = Duration::from_secs(3);
    let (pki, ingress_pki) = (Pki::new(), IngressPki::new());
    let gateway = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let mut cfg = tunnel_with_ingress(&ingress_pki, &pki, DRAIN);
    cfg.egress.drain_timeout = DRAIN;
    cfg.overload = None;
    let tunnel = Tunnel::start(cfg).await.expect("tunnel");
    let (ingress, https, _) = tunnel.ingress().expect("ingress");
    let ingress = ingress.clone();
    let cancel = CancellationToken::new();
    let listener =
        activate_alpha(&tunnel, gateway.addr, endless_actor().await, ECHO, &cancel).await;

    // An egress tunnel, open and carrying bytes.
    let mut tunnelled = TcpStream::connect(listener).await.expect("connect");
    tunnelled.write_all(b"ping").await.expect("write");
    let mut got = [0u8; 4];
    tunnelled.read_exact(&mut got).await.expect("echo");
    assert_eq!(&got, b"ping");

    // An ingress request whose router reads none of the endless body:
    // once the router's window is full, atunnel polls the body no more, so
    // the request cannot see the cut and holds ingress's drain to its end.
    let mut router = h2_router(&ingress_pki, https).await;
    let (answer, _send) = h2_request(&mut router, "GET", "w", Some("alpha")).await;
    assert_eq!(answer.status(), 200);
    let mut body = answer.into_body();
    let window = 65_535;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    // A counter of h2's, with nothing to await: polled.
    while body.flow_control().used_capacity() < window {
        assert!(
            tokio::time::Instant::now() < until,
            "the router's window filled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(actor_figures(&ingress, "uid-alpha").in_flight, 1);

    let started = tokio::time::Instant::now();
    let deactivating = {
        let tunnel = tunnel.clone();
        tokio::spawn(async move { tunnel.deactivate(&actor("alpha")).await })
    };
    next_read_is_reset(&mut tunnelled, "the egress tunnel's actor side").await;
    let cut_after = started.elapsed();
    assert!(
        cut_after < DRAIN / 2,
        "the egress tunnel was cut {cut_after:?} into deactivation: after ingress's drain, not with it"
    );
    tokio::time::timeout(DRAIN * 2, deactivating)
        .await
        .expect("deactivation is bounded")
        .expect("task")
        .expect("egress drained");
    let took = started.elapsed();
    assert!(
        took >= DRAIN && took < DRAIN + DRAIN / 2,
        "deactivation took {took:?}: one drain timeout (ingress's stuck request) for both sides"
    );
    assert_eq!(ingress.stats().active_actors, 0);
    assert_eq!(tunnel.egress().stats().tunnels_open, 0);
    drop(body);
    cancel.cancel();
    tunnel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_tunnels_and_ingress_connect_tunnels_share_the_egress_relay_bounds() {
    const BOUND: Duration = Duration::from_millis(500);
    let (pki, ingress_pki) = (Pki::new(), IngressPki::new());
    let gateway = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let mut cfg = tunnel_with_ingress(&ingress_pki, &pki, Duration::from_secs(5));
    cfg.overload = None;
    let bounds = RelayBounds {
        write_stall: BOUND,
        half_closed_idle: BOUND,
    };
    cfg.egress.relay = bounds;
    // Ingress's own setting is what an `Ingress` used alone relays within;
    // a tunnel's actors take the activation's.
    let ingress_cfg = &cfg.ingress.as_ref().expect("ingress").config;
    assert_ne!(ingress_cfg.relay, bounds);
    let tunnel = Tunnel::start(cfg).await.expect("tunnel");
    let (ingress, _, connect) = tunnel.ingress().expect("ingress");
    let ingress = ingress.clone();
    let cancel = CancellationToken::new();
    let listener = activate_alpha(&tunnel, gateway.addr, deaf_actor().await, SOURCE, &cancel).await;

    // Ingress CONNECT: the actor reads nothing, the router writes until
    // atunnel resets the tunnel.
    let mut router = h1_tunnel(&ingress_pki, connect, "alpha", 8080).await;
    let started = tokio::time::Instant::now();
    let chunk = vec![1u8; 64 * 1024];
    let reset = tokio::time::timeout(Duration::from_secs(10), async {
        while router.write_all(&chunk).await.is_ok() {}
    })
    .await;
    assert!(
        reset.is_ok(),
        "the stalled CONNECT tunnel was not reset within 10 s"
    );
    assert!(started.elapsed() >= BOUND, "reset before the bound");
    until_actor(&ingress, "uid-alpha", "one stalled-write end", |a| {
        a.connect_stalled_write_ends_total == 1
    })
    .await;

    // Egress: the far end sends without end, the actor reads nothing.
    let _stalled = TcpStream::connect(listener).await.expect("connect");
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    // A counter, with nothing to await: polled.
    while tunnel.egress().stats().stalled_write_ends_total == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the stalled egress tunnel was not reset within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    tunnel.shutdown().await;
}
