//! Hibernation of idle ingress connections (`hibernate_after`, 100 ms here):
//! an idle HTTP/1.1 keep-alive connection drops hyper's buffers and parsed
//! state and still serves its next request; HTTP/2 connections and CONNECT
//! tunnels keep serving after the same idle time. The heap is read from the
//! counting allocator; client and actor live in this process too, so each
//! figure compares two ingresses that differ only in the setting.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::alloc::{CountingAlloc, live_bytes};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use support::ingress::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const CONNS: usize = 50;
const FAST: Duration = Duration::from_millis(100);

/// The actor: `/page` answers 60 KB, anything else a short body.
async fn actor() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<Incoming>| async move {
                    let body = if req.uri().path() == "/page" {
                        Bytes::from(vec![b'p'; 60_000])
                    } else {
                        Bytes::from_static(b"short")
                    };
                    Ok::<_, Infallible>(http::Response::new(Full::new(body)))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

async fn running(hibernate_after: Duration) -> (IngressPki, RunningIngress) {
    let pki = IngressPki::new();
    let running = ingress_with(&pki, hibernate_after).await;
    let port = actor().await.port();
    running
        .ingress
        .activate(
            "team-a",
            "alpha",
            "uid-1",
            Box::new(LoopbackDialer(HashMap::from([(80, port)]))),
        )
        .expect("activate");
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

fn expected(path: &str) -> usize {
    if path == "/page" { 60_000 } else { 5 }
}

/// Heap per connection of `CONNS` idle connections that served one request
/// to `path`, once `settled` says they are as small as they will get.
async fn idle_heap_per_conn(
    running: &RunningIngress,
    pki: &IngressPki,
    h2: bool,
    path: &str,
    settled: impl AsyncFnOnce(&RunningIngress),
) -> (Vec<RouterConn>, f64) {
    // One connection first, so one-time costs (the actor connection, lazy
    // statics) fall outside the measurement.
    let mut conns = vec![RouterConn::open(pki, running.https, h2).await];
    assert_eq!(request(&mut conns[0], path).await.len(), expected(path));
    let before = live_bytes();
    for _ in 1..CONNS {
        let mut c = RouterConn::open(pki, running.https, h2).await;
        assert_eq!(request(&mut c, path).await.len(), expected(path));
        conns.push(c);
    }
    settled(running).await;
    let per = (live_bytes() as f64 - before as f64) / (CONNS - 1) as f64;
    (conns, per)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http1_connections_shrink_when_hibernated_and_serve_the_next_request() {
    for path in ["/short", "/page"] {
        // The same connections without hibernation: what they hold awake.
        let (pki, awake) = running(Duration::ZERO).await;
        // Kept open (and idle, never hibernating) while the others are
        // measured, so nothing of theirs is freed during that measurement.
        let (_awake_conns, awake_per) =
            idle_heap_per_conn(&awake, &pki, false, path, async |_| {}).await;

        let (pki_sleepy, sleepy) = running(FAST).await;
        let h = sleepy.ingress.hibernation().clone();
        let (mut conns, asleep_per) =
            idle_heap_per_conn(&sleepy, &pki_sleepy, false, path, async |_| {
                h.wait_until(|s| s.hibernating == CONNS).await;
            })
            .await;
        println!(
            "HTTP/1.1 keep-alive after {path}: {awake_per:.0} B per idle connection awake, {asleep_per:.0} B hibernated (client and server together)"
        );
        assert!(
            asleep_per + 4096.0 < awake_per,
            "hibernating saves at least 4 KiB per connection: awake {awake_per:.0} B, hibernated {asleep_per:.0} B"
        );
        // Each wakes on its next request, which it serves as usual.
        for c in &mut conns {
            assert_eq!(request(c, path).await.len(), expected(path));
        }
        let s = h.stats();
        assert_eq!(s.wakes, CONNS as u64, "{s:?}");
        // And it goes back to sleep when idle again.
        h.wait_until(|s| s.hibernating == CONNS).await;
        assert_eq!(request(&mut conns[0], path).await.len(), expected(path));
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
    let mut got = Vec::new();
    while !got.ends_with(b"short") {
        let mut buf = [0u8; 1024];
        let n = tls.read(&mut buf).await.expect("read");
        assert!(n > 0, "response before EOF");
        got.extend_from_slice(&buf[..n]);
    }
    h.wait_until(|s| s.hibernating == 1).await;
    tls.shutdown().await.expect("close_notify");
    drop(tls);
    // The hibernated connection notices and ends: nothing stays asleep.
    h.wait_until(|s| s.hibernating == 0 && s.wakes == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_and_connect_tunnels_serve_after_idling() {
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut conn = RouterConn::open(&pki, running.https, true).await;
    assert_eq!(request(&mut conn, "/short").await.len(), 5);
    // Let an HTTP/1.1 connection hibernate to know a period has passed.
    let mut h1 = RouterConn::open(&pki, running.https, false).await;
    assert_eq!(request(&mut h1, "/short").await.len(), 5);
    h.wait_until(|s| s.hibernating == 1).await;
    assert_eq!(request(&mut conn, "/page").await.len(), 60_000);
    assert_eq!(
        h.stats().hibernating,
        1,
        "HTTP/2 connections do not hibernate"
    );
}
