//! Ingress CONNECT tunnels get egress's relay bounds, counted per actor: a
//! tunnel whose actor stops reading is reset at the stalled-write timeout,
//! one left half-closed and idle at the half-closed timeout, while another
//! actor's tunnel relays; an actor's tunnels borrow from its own share of
//! the buffer pool; and a CONNECT refused for overload says the configured
//! Retry-After.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::relay::RelayBounds;
use atunnel_process::overload::OverloadConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BOUND: Duration = Duration::from_millis(500);

/// An actor that accepts, reads its peer to EOF only if `read`, and never
/// writes nor closes: its sockets are kept until the test ends.
async fn silent_actor(read: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            if read {
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            }
            kept.push(s);
        }
    });
    addr
}

/// An actor that echoes what it reads.
async fn echo_actor() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn bounded() -> (IngressPki, RunningIngress) {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| {
        cfg.relay = RelayBounds {
            write_stall: BOUND,
            half_closed_idle: BOUND,
        }
    })
    .await;
    (pki, running)
}

/// beta's tunnel carries bytes both ways, end to end.
async fn beta_relays(pki: &IngressPki, running: &RunningIngress) {
    let mut tls = h1_tunnel(pki, running.connect, "beta", 9000).await;
    tls.write_all(b"hello beta").await.expect("write");
    let mut echo = [0u8; 10];
    tls.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"hello beta");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_whose_actor_stops_reading_is_reset_at_the_stalled_write_timeout() {
    let (pki, running) = bounded().await;
    running.activate_alpha(&[(8080, silent_actor(false).await.port())]);
    let beta = echo_actor().await;
    activate_ports(&running.ingress, "beta", "uid-2", &[(9000, beta.port())]);
    let mut tls = h1_tunnel(&pki, running.connect, "alpha", 8080).await;
    let started = tokio::time::Instant::now();
    // Writes until atunnel resets the tunnel: the actor takes nothing.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        let chunk = vec![1u8; 64 * 1024];
        loop {
            if tls.write_all(&chunk).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stalled tunnel was not reset within 10 s"
    );
    assert!(started.elapsed() >= BOUND, "reset before the bound");
    beta_relays(&pki, &running).await;
    let alpha = actor_figures(&running.ingress, "uid-1");
    assert_eq!(
        (
            alpha.connect_stalled_write_ends_total,
            alpha.connect_half_closed_ends_total
        ),
        (1, 0)
    );
    assert_eq!(
        actor_figures(&running.ingress, "uid-2").connect_stalled_write_ends_total,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_idle_tunnel_is_reset_at_the_half_closed_timeout() {
    let (pki, running) = bounded().await;
    // alpha reads to our EOF, then says nothing and keeps its socket.
    running.activate_alpha(&[(8080, silent_actor(true).await.port())]);
    let mut tls = h1_tunnel(&pki, running.connect, "alpha", 8080).await;
    tls.write_all(b"last words").await.expect("write");
    tls.shutdown().await.expect("close_notify");
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut rest))
        .await
        .expect("the half-closed tunnel ended within 10 s");
    assert!(read.is_err(), "a reset, not a clean end: {read:?}");
    assert!(started.elapsed() >= BOUND, "reset before the bound");
    let alpha = actor_figures(&running.ingress, "uid-1");
    assert_eq!(
        (
            alpha.connect_stalled_write_ends_total,
            alpha.connect_half_closed_ends_total
        ),
        (0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_refused_for_overload_says_the_configured_retry_after() {
    let pki = IngressPki::new();
    // Past the guard's second line (0.90), where every actor is refused,
    // not only those above their fair share.
    let memory = FakeMemoryCgroup::new(920);
    let guard = memory.guard(OverloadConfig {
        retry_after: Duration::from_secs(7),
        ..OverloadConfig::default()
    });
    guard.sample();
    let guarded = ingress_guarded(&pki, guard.clone()).await;
    let (ingress, connect) = (&guarded.ingress, guarded.connect);
    // A known actor: an unknown one is 421 whatever the load.
    activate_ports(ingress, "alpha", "uid-1", &[(8080, 1)]);
    let (_tls, head) = h1_connect(
        &pki,
        connect,
        "CONNECT actor:8080 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(head.contains("Retry-After: 7\r\n"), "{head}");
    let mut router = h2_router(&pki, connect).await;
    let (resp, _send) = h2_request(&mut router, "CONNECT", "actor:8080", Some("alpha")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "7");
    guarded.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actors_connect_tunnels_borrow_from_its_own_share_of_the_pool() {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| cfg.pools.max_buffers = 1).await;
    running.activate_alpha(&[(8080, echo_actor().await.port())]);
    // Two of alpha's tunnels echo 4 MiB each at once: with a share of one
    // buffer, one waits for the other's.
    let data = random(4 << 20, 9);
    let mut transfers = Vec::new();
    for _ in 0..2 {
        let tls = h1_tunnel(&pki, running.connect, "alpha", 8080).await;
        let data = data.clone();
        transfers.push(tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(tls);
            let sent = data.clone();
            let writer = tokio::spawn(async move { w.write_all(&sent).await.map(|_| w) });
            let mut back = vec![0u8; data.len()];
            r.read_exact(&mut back).await.expect("echo");
            let _w = writer.await.expect("writer").expect("write");
            assert!(back == data, "echo corrupted");
        }));
    }
    for t in transfers {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("echoed within 30 s")
            .expect("transfer");
    }
    let alpha = actor_figures(&running.ingress, "uid-1");
    assert!(
        alpha.connect_buffers_waited_total > 0,
        "alpha's tunnels never waited for its one buffer"
    );
    assert_eq!(alpha.connect_buffers_in_use, 0);
}
