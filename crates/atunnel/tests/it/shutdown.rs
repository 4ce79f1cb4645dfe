//! `Tunnel::shutdown` stops everything the tunnel started and waits for it:
//! ingress activations are retired (their routes gone, their tunnels cut),
//! the listeners close, and every task it spawned (listeners, their
//! connections, /stats and its connections) has ended when it returns.

use std::collections::HashMap;
use std::time::Duration;

use atunnel::tunnel::Tunnel;
use atunnel_support::prelude::*;
use atunnel_support::stats_client::fetch_stats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// On a current-thread runtime, so that a task that has ended is gone from
/// the runtime's count by the time the task that waited for it runs again.
#[tokio::test]
async fn shutdown_retires_ingress_and_waits_for_every_task_it_started() {
    let pki = IngressPki::new();
    // A long drain, so a shutdown that returns promptly shows that the open
    // tunnel was cut rather than waited out.
    let mut cfg = tunnel_with_ingress(&pki, &Pki::new(), Duration::from_secs(60));
    cfg.stats = Some("127.0.0.1:0".parse().expect("addr"));
    // The actor's program, accepted by the test itself (no task of its own).
    let program = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = program.local_addr().expect("addr").port();

    let before = alive_tasks();
    let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
    let (ingress, https, connect) = tunnel.ingress().expect("ingress");
    let ingress = ingress.clone();
    let stats = tunnel.stats_addr().expect("/stats");
    let alpha = actor("alpha");
    let dialer = LoopbackDialer(HashMap::from([(8080, port)]));
    tunnel
        .activate_with_dialer(&alpha, Box::new(dialer), None)
        .await
        .expect("activate");

    // An ingress CONNECT tunnel carrying bytes both ways.
    let (mut tunnel_tls, accepted) =
        tokio::join!(h1_tunnel(&pki, connect, "alpha", 8080), program.accept());
    let (mut at_actor, _) = accepted.expect("atunnel dials the actor");
    tunnel_tls.write_all(b"ping").await.expect("write");
    let mut got = [0u8; 4];
    at_actor
        .read_exact(&mut got)
        .await
        .expect("read at the actor");
    assert_eq!(&got, b"ping");
    at_actor.write_all(b"pong").await.expect("write back");
    tunnel_tls
        .read_exact(&mut got)
        .await
        .expect("read at the router");
    assert_eq!(&got, b"pong");
    // An idle router connection on the HTTPS listener, and an idle one on
    // /stats, after /stats answered once.
    let mut idle_router = router_tls(&pki, https, None, None, &[b"http/1.1"])
        .await
        .expect("TLS to the HTTPS listener");
    let figures = fetch_stats(stats, false).await.expect("/stats answers");
    let routes = figures.ingress.expect("ingress figures");
    assert_eq!(routes.active_actors, 1, "{routes:?}");
    let mut idle_stats = TcpStream::connect(stats).await.expect("connect /stats");
    assert!(
        alive_tasks() > before,
        "the tunnel runs tasks: listeners and connections"
    );

    tokio::time::timeout(Duration::from_secs(10), tunnel.shutdown())
        .await
        .expect("shutdown is bounded, whatever the drain timeout");

    assert_eq!(
        alive_tasks(),
        before,
        "every task the tunnel started has ended by the time shutdown returns"
    );
    assert_eq!(ingress.stats().active_actors, 0, "the route is retired");
    for (addr, what) in [(https, "HTTPS"), (connect, "CONNECT"), (stats, "/stats")] {
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the {what} listener is closed"
        );
    }
    // The open tunnel was cut, on both sides: no clean end after lost bytes.
    next_read_is_reset(&mut at_actor, "the actor's side of the tunnel").await;
    let mut byte = [0u8; 1];
    assert!(
        !matches!(tunnel_tls.read(&mut byte).await, Ok(n) if n > 0),
        "the router's side of the tunnel ended"
    );
    // The idle connections were closed, not left open.
    assert!(!matches!(idle_router.read(&mut byte).await, Ok(n) if n > 0));
    assert!(matches!(idle_stats.read(&mut byte).await, Ok(0) | Err(_)));
}
