//! Hibernation of idle ingress connections (`hibernate_after`, 100 ms here):
//! an idle HTTP/1.1 keep-alive connection drops hyper's buffers and parsed
//! state and its rustls session and still serves its next request; HTTP/2
//! connections and CONNECT tunnels drop their rustls sessions and still
//! serve their next stream or bytes. The heap is read from the counting
//! allocator, on the same connections before and after they hibernate, so
//! client and actor (in this process too) cancel out.

mod support;

use std::alloc::System;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel::hibernate::Hibernation;
use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use support::ingress::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const CONNS: usize = 50;
const FAST: Duration = Duration::from_millis(100);

/// The actor: `/page` answers 60 KB, anything else a short body.
async fn actor() -> SocketAddr {
    http1_actor(|req: http::Request<Incoming>| async move {
        let body = if req.uri().path() == "/page" {
            Bytes::from(vec![b'p'; 60_000])
        } else {
            Bytes::from_static(b"short")
        };
        http::Response::new(Full::new(body))
    })
    .await
}

async fn running(hibernate_after: Duration) -> (IngressPki, RunningIngress) {
    let pki = IngressPki::new();
    let running = ingress_with(&pki, hibernate_after).await;
    let port = actor().await.port();
    running.activate_alpha(&[(80, port)]);
    (pki, running)
}

async fn request(conn: &mut RouterConn, path: &str) -> Bytes {
    let req = http::Request::builder()
        .uri(format!("https://{WORKER_NAME}{path}"))
        .header("host", "app.example.com")
        .header("ate-target-actor", "team-a/alpha")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = conn.send(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body").to_bytes()
}

fn check_body(body: &[u8], path: &str) {
    if path == "/page" {
        assert!(body.len() == 60_000 && body.iter().all(|b| *b == b'p'));
    } else {
        assert_eq!(body, b"short");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http1_connections_shrink_when_hibernated_and_serve_the_next_request() {
    let _alone = HEAP_MEASURING.lock().await;
    for path in ["/short", "/page"] {
        let (pki, running) = running(FAST).await;
        let h = running.ingress.hibernation().clone();
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            conns.push(RouterConn::open(&pki, running.https, false).await);
        }
        // One request on every connection at once, then the heap while they
        // are awake and again once every one has hibernated: the same
        // connections, in the same process, so the difference is what
        // hibernating freed.
        let served =
            futures_util::future::join_all(conns.iter_mut().map(|c| request(c, path))).await;
        served.iter().for_each(|b| check_body(b, path));
        let awake = live_bytes();
        let already = h.stats().hibernating;
        h.wait_until(|s| s.hibernating == CONNS).await;
        let asleep = live_bytes();
        let measured = CONNS - already;
        assert!(
            measured >= CONNS / 2,
            "{already} of {CONNS} connections hibernated before they could be measured awake"
        );
        let freed = (awake as f64 - asleep as f64) / measured as f64;
        println!("HTTP/1.1 keep-alive after {path}: hibernating freed {freed:.0} B per connection");
        // hyper's 8 KiB read buffer, its write buffer and parsed state, and
        // the rustls session.
        assert!(
            freed >= 20480.0,
            "hibernating freed only {freed:.0} B per connection"
        );
        // Each wakes on its next request, which it serves as usual.
        let before = h.stats().wakes;
        for c in &mut conns {
            check_body(&request(c, path).await, path);
        }
        let s = h.stats();
        assert_eq!(s.wakes - before, CONNS as u64, "{s:?}");
        // And it goes back to sleep when idle again.
        h.wait_until(|s| s.hibernating == CONNS).await;
        check_body(&request(&mut conns[0], path).await, path);
        // What stays per connection while idle includes its task's future:
        // the handshake, the TLS stream and hyper's state are boxed so that
        // it stays small.
        let https = running.ingress.connection_future_bytes().0;
        println!("HTTPS connection task future: {https} B");
        assert!(
            (1..=1536).contains(&https),
            "HTTPS connection future {https} B"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_closing_a_hibernated_connection_is_seen() {
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut tls = router_tls(&pki, running.https, None, None, &[b"http/1.1"])
        .await
        .expect("tls");
    tls.write_all(b"GET /short HTTP/1.1\r\nhost: w\r\nate-target-actor: team-a/alpha\r\n\r\n")
        .await
        .expect("write");
    read_until(&mut tls, b"short").await;
    h.wait_until(|s| s.hibernating == 1).await;
    tls.shutdown().await.expect("close_notify");
    drop(tls);
    // The hibernated connection notices and ends: nothing stays asleep.
    h.wait_until(|s| s.hibernating == 0 && s.wakes == 1).await;
}

/// Connections, each served once, then measured awake and once all of
/// them hibernated; `serve` is one exchange on one connection.
async fn freed_per_connection<C>(
    h: &Hibernation,
    conns: &mut [C],
    mut serve: impl AsyncFnMut(&mut C),
) -> f64 {
    for c in conns.iter_mut() {
        serve(c).await;
    }
    let awake = live_bytes();
    let already = h.stats().hibernating;
    h.wait_until(|s| s.hibernating == conns.len()).await;
    let asleep = live_bytes();
    let measured = conns.len() - already;
    assert!(
        measured >= conns.len() / 2,
        "{already} of {} connections hibernated before they could be measured awake",
        conns.len()
    );
    // Each wakes on its next exchange, which it serves as usual, and goes
    // back to sleep.
    let before = h.stats().wakes;
    for c in conns.iter_mut() {
        serve(c).await;
    }
    let s = h.stats();
    assert_eq!(s.wakes - before, conns.len() as u64, "{s:?}");
    h.wait_until(|s| s.hibernating == conns.len()).await;
    serve(&mut conns[0]).await;
    (awake as f64 - asleep as f64) / measured as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_shrink_when_hibernated_and_serve_the_next_stream() {
    let _alone = HEAP_MEASURING.lock().await;
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        conns.push(RouterConn::open(&pki, running.https, true).await);
    }
    let freed = freed_per_connection(&h, &mut conns, async |c| {
        check_body(&request(c, "/page").await, "/page");
    })
    .await;
    println!("HTTP/2 after /page: hibernating freed {freed:.0} B per connection");
    // The rustls session (h2's buffers stay, see router_conn).
    assert!(
        freed >= 6144.0,
        "hibernating freed only {freed:.0} B per connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connect_tunnels_shrink_when_hibernated_and_carry_the_next_bytes() {
    let _alone = HEAP_MEASURING.lock().await;
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut tunnels = Vec::new();
    for _ in 0..CONNS {
        let mut tunnel = router_tls(&pki, running.connect, None, None, &[b"http/1.1"])
            .await
            .expect("tls");
        tunnel
            .write_all(b"CONNECT actor:80 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n")
            .await
            .expect("write");
        let head = read_until(&mut tunnel, b"\r\n\r\n").await;
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        tunnels.push(tunnel);
    }
    let freed = freed_per_connection(&h, &mut tunnels, async |t| {
        check_body(&get_in_tunnel(t, "/page").await, "/page");
    })
    .await;
    println!("CONNECT tunnel after /page: hibernating freed {freed:.0} B per connection");
    assert!(
        freed >= 6144.0,
        "hibernating freed only {freed:.0} B per connection"
    );
    // What stays per tunnel while idle includes its connection task's
    // future: the TLS stream, the handshake and opening the target are
    // boxed so that it stays small.
    let connect = running.ingress.connection_future_bytes().1;
    println!("CONNECT connection task future: {connect} B");
    assert!(
        (1..=1536).contains(&connect),
        "CONNECT connection future {connect} B"
    );
}

/// Reads from `tls` until what was read ends with `end`.
async fn read_until(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    end: &[u8],
) -> Vec<u8> {
    let mut got = Vec::new();
    while !got.ends_with(end) {
        let mut buf = [0u8; 1024];
        let n = tls.read(&mut buf).await.expect("read");
        assert!(n > 0, "EOF before {:?}", String::from_utf8_lossy(end));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// One HTTP/1.1 request to the actor through an open CONNECT tunnel; the
/// response body.
async fn get_in_tunnel(
    tunnel: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    path: &str,
) -> Vec<u8> {
    tunnel
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: actor\r\n\r\n").as_bytes())
        .await
        .expect("write");
    // The head byte by byte, so that no byte of the body is taken with it.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tunnel.read_u8().await.expect("head"));
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    let mut body = vec![0u8; len];
    tunnel.read_exact(&mut body).await.expect("body");
    body
}
