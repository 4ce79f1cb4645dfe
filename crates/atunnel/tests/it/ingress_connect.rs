//! Ingress CONNECT with real peers: HTTP/1.1 CONNECT over TLS and HTTP/2
//! CONNECT streams from the router, relayed into an actor with half-close.

use atunnel_support::prelude::*;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use atunnel::ingress::{ActorDialer, PoolSettings};
use atunnel_connect::limits::ACTOR_DIAL_TIMEOUT;
use atunnel_core::endpoint::{close_write, read_chunk, write_chunk};
use atunnel_core::{BufferPool, Chunk, H2Stream};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// An actor that echoes until the client half-closes, then says how many
/// bytes it got and closes.
async fn counting_echo_actor() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut total = 0usize;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            total += n;
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.write_all(format!("|{total}").as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

struct Fixture {
    pki: IngressPki,
    running: RunningIngress,
}

/// `team-a/alpha` active; its port 8080 is the counting echo actor.
async fn fixture() -> Fixture {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let actor = counting_echo_actor().await;
    running.activate_alpha(&[(8080, actor.port())]);
    Fixture { pki, running }
}

/// Reads `stream` to its end (or first error), returning what was read and
/// how it ended.
async fn h2_read_all(stream: &mut H2Stream) -> (Vec<u8>, io::Result<()>) {
    let pool = BufferPool::default();
    let mut got = Vec::new();
    loop {
        match read_chunk(stream, &pool).await {
            Ok(Some(chunk)) => {
                got.extend_from_slice(chunk.remaining());
                atunnel_core::Endpoint::consumed(stream, chunk.len());
            }
            Ok(None) => return (got, Ok(())),
            Err(e) => return (got, Err(e)),
        }
    }
}

/// The router's side of an open tunnel.
enum Tunnel {
    H1(Box<RouterTls>),
    H2(h2::client::SendRequest<Bytes>, H2Stream),
}

/// Sends a ping through an HTTP/2 tunnel to the echoing actor and reads it
/// back.
async fn pings_back(stream: &mut H2Stream) {
    write_chunk(stream, Chunk::Shared(Bytes::from_static(b"ping")))
        .await
        .expect("write");
    let echo = read_chunk(stream, &BufferPool::default())
        .await
        .expect("read")
        .expect("echo");
    assert_eq!(echo.remaining(), b"ping");
}

/// A tunnel to `team-a/<actor>`'s `port`, over HTTP/2 or HTTP/1.1, that has
/// carried a ping to the (echoing) actor and back.
async fn pinged_tunnel(f: &Fixture, h2: bool, actor: &str, port: u16) -> Tunnel {
    if h2 {
        let mut router = h2_router(&f.pki, f.running.connect).await;
        let mut stream = h2_tunnel(&mut router, actor, port).await;
        pings_back(&mut stream).await;
        return Tunnel::H2(router, stream);
    }
    let mut tls = h1_tunnel(&f.pki, f.running.connect, actor, port).await;
    tls.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    tls.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"ping");
    Tunnel::H1(Box::new(tls))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connect_relays_both_ways_with_half_close() {
    let f = fixture().await;
    let (mut tls, head) = h1_connect(
        &f.pki,
        f.running.connect,
        "CONNECT actor:8080 HTTP/1.1\r\nHost: actor:8080\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let data = random(2 << 20, 4);
    tls.write_all(&data).await.expect("write");
    // Half-close: TLS close_notify, the actor sees EOF and still answers.
    tls.shutdown().await.expect("close_notify");
    let mut back = Vec::new();
    tls.read_to_end(&mut back).await.expect("read");
    let tail = format!("|{}", data.len());
    assert!(
        back.ends_with(tail.as_bytes()),
        "actor's answer after our half-close is missing"
    );
    assert!(back[..data.len()] == data[..], "echo corrupted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connect_relays_both_ways_with_half_close() {
    let f = fixture().await;
    let mut router = h2_router(&f.pki, f.running.connect).await;
    let mut stream = h2_tunnel(&mut router, "alpha", 8080).await;
    let data = random(1 << 20, 5);
    write_chunk(&mut stream, Chunk::Shared(Bytes::from(data.clone())))
        .await
        .expect("write");
    close_write(&mut stream).await.expect("END_STREAM");
    let (back, ended) = h2_read_all(&mut stream).await;
    ended.expect("the actor's side ends cleanly");
    assert!(back.ends_with(format!("|{}", data.len()).as_bytes()));
    assert!(back[..data.len()] == data[..]);
}

/// How a refusal looked: its status and whether it said the router's
/// assignment is stale.
async fn refusal(
    f: &Fixture,
    h2: bool,
    method: &str,
    authority: &str,
    actor: Option<&str>,
) -> (u16, bool) {
    if h2 {
        let mut router = h2_router(&f.pki, f.running.connect).await;
        let (resp, _send) = h2_request(&mut router, method, authority, actor).await;
        let stale = resp
            .headers()
            .get("x-ate-assignment-stale")
            .is_some_and(|v| v == "true");
        return (resp.status().as_u16(), stale);
    }
    let target = if method == "CONNECT" { authority } else { "/" };
    let actor = actor.map_or(String::new(), |a| {
        format!("ate-target-actor: team-a/{a}\r\n")
    });
    let head = format!("{method} {target} HTTP/1.1\r\nHost: {authority}\r\n{actor}\r\n");
    let (_tls, answer) = h1_connect(&f.pki, f.running.connect, &head).await;
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 answer: {answer}"));
    let stale = answer
        .to_ascii_lowercase()
        .contains("x-ate-assignment-stale: true");
    (status, stale)
}

#[tokio::test]
async fn connect_refusals_have_their_status_over_h1_and_h2() {
    let f = fixture().await;
    let closed = format!("actor:{}", closed_port());
    // (method, authority, actor, status, stale)
    let cases = [
        ("GET", "actor:8080", Some("alpha"), 405, false),
        ("CONNECT", "actor:8080", None, 421, true),
        ("CONNECT", "actor:8080", Some("nobody"), 421, true),
        ("CONNECT", "actor", Some("alpha"), 400, false),
        ("CONNECT", "actor:0", Some("alpha"), 400, false),
        ("CONNECT", closed.as_str(), Some("alpha"), 502, false),
    ];
    for h2 in [false, true] {
        for (method, authority, actor, status, stale) in cases {
            let case = format!("h2={h2} {method} {authority} to {actor:?}");
            assert_eq!(
                refusal(&f, h2, method, authority, actor).await,
                (status, stale),
                "{case}"
            );
        }
    }
}

/// Dials that never complete: an actor whose sandbox stopped answering.
struct NeverDials;

impl ActorDialer for NeverDials {
    fn dial(&self, _port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_that_does_not_complete_within_the_bound_is_502() {
    assert_eq!(PoolSettings::default().dial_timeout, ACTOR_DIAL_TIMEOUT);
    assert_eq!(ACTOR_DIAL_TIMEOUT, Duration::from_secs(5));
    let bound = Duration::from_millis(300);
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| cfg.pools.dial_timeout = bound).await;
    running
        .ingress
        .activate("team-a", "stuck", "uid-s", Box::new(NeverDials))
        .expect("activate");
    let f = Fixture { pki, running };
    let timed = |h2| {
        let f = &f;
        async move {
            let start = Instant::now();
            let answer = refusal(f, h2, "CONNECT", "actor:8080", Some("stuck")).await;
            (answer, start.elapsed())
        }
    };
    let both = async { tokio::join!(timed(false), timed(true)) };
    // Well under ACTOR_DIAL_TIMEOUT: a dial that kept the default bound
    // instead of the configured one fails here.
    let (h1, h2) = tokio::time::timeout(bound * 10, both)
        .await
        .expect("the dial is bounded by the configured timeout");
    for (protocol, (answer, took)) in [("http/1.1", h1), ("h2", h2)] {
        assert_eq!(answer, (502, false), "{protocol}");
        assert!(
            took >= bound,
            "{protocol}: refused after {took:?}, before the dial bound"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_half_closing_first_still_receives_everything() {
    let f = fixture().await;
    let (actor, mut received) = greeting_server().await;
    activate_ports(
        &f.running.ingress,
        "greeter",
        "uid-g",
        &[(7000, actor.port())],
    );
    let data = random(1 << 20, 6);

    // HTTP/1.1: the actor's FIN arrives as close_notify; the router writes on.
    let mut tls = h1_tunnel(&f.pki, f.running.connect, "greeter", 7000).await;
    let mut greeting = Vec::new();
    tls.read_to_end(&mut greeting).await.expect("greeting");
    assert_eq!(greeting, b"hello");
    tls.write_all(&data)
        .await
        .expect("write after the actor's FIN");
    tls.shutdown().await.expect("close_notify");
    actor_got_all(&mut received, &data, "h1").await;

    // HTTP/2: the actor's FIN arrives as END_STREAM; the router sends on.
    let mut router = h2_router(&f.pki, f.running.connect).await;
    let mut stream = h2_tunnel(&mut router, "greeter", 7000).await;
    let (greeting, ended) = h2_read_all(&mut stream).await;
    ended.expect("END_STREAM, not a reset");
    assert_eq!(greeting, b"hello");
    write_chunk(&mut stream, Chunk::Shared(Bytes::from(data.clone())))
        .await
        .expect("send after the actor's END_STREAM");
    close_write(&mut stream).await.expect("END_STREAM");
    actor_got_all(&mut received, &data, "h2").await;
}

/// What the greeting actor read up to our half-close, within 10 s, is all
/// of `data`.
async fn actor_got_all(
    received: &mut mpsc::UnboundedReceiver<io::Result<Vec<u8>>>,
    data: &[u8],
    what: &str,
) {
    let got = tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .expect("the actor reads to our half-close")
        .expect("actor")
        .expect("the actor's read");
    assert!(
        got == data,
        "{what}: the actor got {} of {} bytes",
        got.len(),
        data.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_closes_an_open_h2_tunnel_and_keeps_the_connection() {
    let f = fixture().await;
    let Tunnel::H2(mut router, mut stream) = pinged_tunnel(&f, true, "alpha", 8080).await else {
        unreachable!("an HTTP/2 tunnel")
    };

    f.running
        .ingress
        .deactivate("team-a", "alpha", "uid-1")
        .await;
    let (rest, ended) = tokio::time::timeout(Duration::from_secs(5), h2_read_all(&mut stream))
        .await
        .expect("the tunnel outlived its actor's deactivation");
    let reset = ended.expect_err("a deactivated tunnel is reset, not ended cleanly");
    assert_eq!(reset.kind(), io::ErrorKind::ConnectionReset, "{reset}");
    assert!(rest.is_empty(), "{rest:?}");
    // Only the stream was closed: the router's connection takes new ones.
    let (resp, _send) = h2_request(&mut router, "CONNECT", "actor:8080", Some("alpha")).await;
    assert_eq!(resp.status(), 421, "the actor is inactive now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_holds_no_buffer_and_deactivation_closes_it() {
    let f = fixture().await;
    let Tunnel::H1(mut tls) = pinged_tunnel(&f, false, "alpha", 8080).await else {
        unreachable!("an HTTP/1.1 tunnel")
    };
    // Idle now: the relay returns its buffer once the write completes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while f.running.pool.stats().in_use > 0 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        f.running.pool.stats().in_use,
        0,
        "an idle tunnel holds a buffer"
    );
    // Not vacuous: the ping was relayed with buffers from this pool.
    assert!(
        f.running.pool.stats().acquired_total > 0,
        "the tunnel borrowed nothing from the pool"
    );

    f.running
        .ingress
        .deactivate("team-a", "alpha", "uid-1")
        .await;
    // Reset, as deactivation_resets_the_actor_and_never_ends_the_router_cleanly
    // requires: a clean close_notify would pass for the tunnel's end.
    let mut rest = Vec::new();
    let e = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest))
        .await
        .expect("the tunnel outlived its actor's deactivation")
        .expect_err("a reset, not a clean close_notify");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
    assert!(rest.is_empty(), "{rest:?}");
}

/// Deactivation cuts an open tunnel loudly at both ends: the actor's socket
/// is reset, and the router never sees a clean end (over HTTP/2 its stream
/// is reset; over HTTP/1.1 its TLS connection is reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_resets_the_actor_and_never_ends_the_router_cleanly() {
    let f = fixture().await;
    for h2 in [false, true] {
        let (actor, mut watched) = watched_echo_server().await;
        let uid = format!("uid-w-{h2}");
        activate_ports(&f.running.ingress, "watcher", &uid, &[(9000, actor.port())]);
        let what = |side| format!("h2={h2}: {side}");
        let tunnel = pinged_tunnel(&f, h2, "watcher", 9000).await;
        f.running
            .ingress
            .deactivate("team-a", "watcher", &uid)
            .await;
        watched_end_is_reset(&mut watched, &what("actor")).await;
        match tunnel {
            Tunnel::H2(_router, mut stream) => {
                let (rest, ended) =
                    tokio::time::timeout(Duration::from_secs(5), h2_read_all(&mut stream))
                        .await
                        .expect("the stream ends");
                assert!(rest.is_empty(), "{rest:?}");
                let e = ended.expect_err("RST_STREAM, not END_STREAM");
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
            }
            Tunnel::H1(mut tls) => {
                // The router's connection is reset too: a clean end
                // (close_notify) would pass for the tunnel's end.
                let mut rest = Vec::new();
                let e = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest))
                    .await
                    .expect("the router's connection ends")
                    .expect_err("not a clean end");
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                assert!(rest.is_empty(), "{rest:?}");
            }
        }
    }
}

/// The CONNECT listener shutting down with a tunnel open resets the actor's
/// socket rather than ending its stream cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_resets_the_actor_of_an_open_tunnel() {
    for h2 in [false, true] {
        let pki = IngressPki::new();
        let running = ingress(&pki).await;
        let (actor, mut watched) = watched_echo_server().await;
        running.activate_alpha(&[(9000, actor.port())]);
        let f = Fixture { pki, running };
        // Held open until the shutdown.
        let _tunnel = pinged_tunnel(&f, h2, "alpha", 9000).await;
        f.running.cancel.cancel();
        watched_end_is_reset(&mut watched, &format!("h2={h2}: actor")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_with_headers_past_the_limit_is_refused_and_the_connection_serves_on() {
    let f = fixture().await;
    let mut router = h2_router(&f.pki, f.running.connect).await;
    // Past TUNNEL_MAX_HEADER_LIST (16 KiB) once decoded; h2's own default
    // would take 16 MiB.
    let big = "x".repeat(32 * 1024);
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("actor:8080")
        .header("ate-target-actor", "team-a/alpha")
        .header("x-padding", big.as_str())
        .body(())
        .expect("request");
    router = router.ready().await.expect("ready");
    let (resp, _send) = router.send_request(req, false).expect("send");
    match tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("answered within 5 s")
    {
        Ok(r) => assert_ne!(r.status(), 200, "an oversized CONNECT was served"),
        Err(e) => assert!(e.is_reset() || e.is_go_away(), "{e}"),
    }
    // The same connection, or a new one if it was closed, serves the next.
    let mut router = match router.clone().ready().await {
        Ok(r) => r,
        Err(_) => h2_router(&f.pki, f.running.connect).await,
    };
    pings_back(&mut h2_tunnel(&mut router, "alpha", 8080).await).await;
}
