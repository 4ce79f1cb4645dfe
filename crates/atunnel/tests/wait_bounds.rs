//! Waits a peer can make atunnel or the gateway sit through are bounded:
//! a client that never finishes TLS on every TLS listener, and the
//! gateway's dial to a destination that never answers. Real sockets, real
//! TLS.

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
