//! What one actor's pooled gateway connections may hold: the connection's
//! receive window caps the bytes its tunnels leave unread together, and a
//! connection no tunnel has used for the idle timeout closes. The gateway is
//! hand-made (rustls and the h2 crate's server) so the test sees exactly
//! what the client granted and when the connection ended.

use atunnel_support::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use atunnel::egress::ActorEgress;
use atunnel_connect::GatewayTunnel as Tunnel;
use atunnel_connect::{ClientStats, GatewayClientConfig};
use atunnel_core::BufferPool;
use atunnel_core::endpoint::{Endpoint, read_chunk};
use atunnel_identity::clock::Clock;

const DEST: &str = "192.0.2.10:443";

async fn fake_gateway(pki: &Pki, far: Far) -> FarGateway {
    let gateway = far_gateway(pki, h2::server::Builder::new(), far).await;
    // Flooded streams send as soon as they are open.
    gateway.flood.send_replace(true);
    gateway
}

async fn egress(pki: &Pki, cfg: GatewayClientConfig) -> ActorEgress {
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    ActorEgress::prepare(actor("alpha"), cfg, source, Clock::new())
        .await
        .expect("prepare egress")
}

async fn open(egress: &ActorEgress) -> Tunnel {
    egress.client().open_authority(DEST).await.expect("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connections_window_caps_what_its_unread_tunnels_hold_together() {
    const STREAM_WINDOW: u32 = 256 * 1024;
    const CONNECTION_WINDOW: u32 = 1024 * 1024;
    const TUNNELS: usize = 8;
    let pki = Pki::new();
    let mut gateway = fake_gateway(&pki, Far::Flood).await;
    let mut cfg = client_config(&pki, gateway.addr);
    cfg.stream_window = STREAM_WINDOW;
    cfg.connection_window = CONNECTION_WINDOW;
    let egress = egress(&pki, cfg).await;

    // Eight tunnels whose far end floods and whose actor reads nothing:
    // without the connection window they would hold 8 x 256 KiB.
    let mut tunnels = Vec::new();
    for _ in 0..TUNNELS {
        tunnels.push(open(&egress).await);
    }
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), 1, "one connection");
    let window = CONNECTION_WINDOW as usize;
    gateway.flooded_to(window, Duration::from_secs(10)).await;
    // Every window update the client sent is in before the PONG.
    let mut ping = gateway.pings.recv().await.expect("ping handle");
    ping.ping(h2::Ping::opaque()).await.expect("pong");
    assert_eq!(
        gateway.flooded.load(Ordering::SeqCst),
        window,
        "the far end could send past the connection window"
    );

    // The cap is flow control, not a deadlock: what one tunnel reads, the
    // far end may send again.
    let pool = BufferPool::default();
    let mut read = 0;
    while read < 64 * 1024 {
        let chunk = read_chunk(&mut tunnels[0], &pool)
            .await
            .expect("read")
            .expect("data");
        assert!(chunk.remaining().iter().all(|&b| b == 0), "flooded bytes");
        read += chunk.len();
        tunnels[0].consumed(chunk.len());
    }
    gateway
        .flooded_to(window + read, Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_with_no_tunnel_closes_after_the_idle_timeout() {
    const IDLE: Duration = Duration::from_millis(300);
    let pki = Pki::new();
    let mut gateway = fake_gateway(&pki, Far::Echo).await;
    let mut cfg = client_config(&pki, gateway.addr);
    cfg.idle_timeout = IDLE;
    let egress = egress(&pki, cfg).await;

    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut tunnel = open(&egress).await;
    assert_eq!(echoed(&mut tunnel, &data).await, data);
    drop(tunnel);
    let idle_from = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), gateway.ended.recv())
        .await
        .expect("the idle connection closed")
        .expect("ended");
    assert!(
        idle_from.elapsed() >= IDLE,
        "closed after {:?}, before the idle timeout",
        idle_from.elapsed()
    );
    let stats = egress.client().stats();
    assert_eq!((stats.h2_connections, stats.h2_idle_closed_total), (0, 1));

    // The next tunnel dials a fresh connection.
    let mut tunnel = open(&egress).await;
    assert_eq!(echoed(&mut tunnel, &data).await, data);
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_in_use_is_not_closed_as_idle() {
    // Long enough that a tunnel opened 3/4 of it after the last has ended
    // well before the timer looks, even on a busy host.
    const IDLE: Duration = Duration::from_millis(400);
    let pki = Pki::new();
    let gateway = fake_gateway(&pki, Far::Echo).await;
    let mut cfg = client_config(&pki, gateway.addr);
    cfg.idle_timeout = IDLE;
    let egress = egress(&pki, cfg).await;

    // One tunnel open for three idle timeouts, and tunnels coming and going
    // more often than the timeout: the connection is never idle that long.
    let data = vec![7u8; 10_000];
    let mut held = open(&egress).await;
    let started = Instant::now();
    while started.elapsed() < 3 * IDLE {
        let mut tunnel = open(&egress).await;
        assert_eq!(echoed(&mut tunnel, &data).await, data);
        tokio::time::sleep(IDLE / 4).await;
    }
    assert_eq!(
        echoed(&mut held, &data).await,
        data,
        "the held tunnel works"
    );
    drop(held);
    // Opened and closed alone, each 3/4 of the timeout after the last: the
    // connection's idle timer finds it without streams but used meanwhile,
    // and keeps it.
    for _ in 0..5 {
        let mut tunnel = open(&egress).await;
        assert_eq!(echoed(&mut tunnel, &data).await, data);
        drop(tunnel);
        tokio::time::sleep(IDLE * 3 / 4).await;
    }
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), 1, "one connection");
    assert_eq!(egress.client().stats().h2_idle_closed_total, 0);
}

/// Waits until `check` holds of the client's figures.
async fn until_client(egress: &ActorEgress, what: &str, check: impl Fn(&ClientStats) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !check(&egress.client().stats()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: {:?}", egress.client().stats()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_that_misses_a_ping_is_retired_and_the_next_tunnel_dials() {
    let pki = Pki::new();
    let gateway = fake_gateway(&pki, Far::Echo).await;
    let mut cfg = client_config(&pki, gateway.addr);
    cfg.ping_interval = Duration::from_millis(100);
    cfg.ping_timeout = Duration::from_millis(300);
    let egress = egress(&pki, cfg).await;
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 241) as u8).collect();

    // Answered pings keep it: several intervals pass on one connection.
    let mut tunnel = open(&egress).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(echoed(&mut tunnel, &data).await, data);
    drop(tunnel);
    assert_eq!(egress.client().stats().h2_dead_retired_total, 0);

    gateway.freeze_open_connections();
    until_client(&egress, "the black-holed connection retired", |s| {
        s.h2_dead_retired_total == 1 && s.h2_connections == 0
    })
    .await;
    let mut tunnel = open(&egress).await;
    assert_eq!(echoed(&mut tunnel, &data).await, data);
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_on_a_black_holed_pooled_connection_succeeds_on_a_fresh_one() {
    const OPEN_TIMEOUT: Duration = Duration::from_millis(500);
    let pki = Pki::new();
    let gateway = fake_gateway(&pki, Far::Echo).await;
    let mut cfg = client_config(&pki, gateway.addr);
    cfg.open_timeout = OPEN_TIMEOUT;
    // No pings: the unanswered CONNECT is what finds it.
    cfg.ping_interval = Duration::ZERO;
    let egress = egress(&pki, cfg).await;
    let data = vec![42u8; 20_000];
    let mut warm = open(&egress).await;
    assert_eq!(echoed(&mut warm, &data).await, data);
    drop(warm);

    gateway.freeze_open_connections();
    let started = Instant::now();
    let mut tunnel = open(&egress).await;
    let took = started.elapsed();
    assert!(
        took >= OPEN_TIMEOUT && took < 2 * OPEN_TIMEOUT,
        "opened in {took:?}: one open timeout on the dead connection plus a dial"
    );
    assert_eq!(echoed(&mut tunnel, &data).await, data);
    let stats = egress.client().stats();
    assert_eq!(
        (stats.h2_dead_retired_total, stats.h2_connections),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), 2);
}
