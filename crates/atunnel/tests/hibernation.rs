//! Hibernation of idle ingress connections (`hibernate_after`, 100 ms here):
//! an idle HTTP/1.1 keep-alive connection drops hyper's buffers and parsed
//! state and its rustls session and still serves its next request; HTTP/2
//! connections and CONNECT tunnels drop their rustls sessions and still
//! serve their next stream or bytes. The heap is read from the counting
//! allocator, on the same connections before and after they hibernate, so
//! client and actor (in this process too) cancel out.

use atunnel_support::prelude::*;
use std::alloc::System;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use atunnel_tls::hibernate::{Hibernation, HibernationStats};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const CONNS: usize = 50;
/// Hibernation after this much idle time: long enough that no connection
/// starts hibernating before the awake reading, even on a busy host (at
/// 100 ms, one served first could already be half way through it: under a
/// loaded CI host, CONNECT readings fell to 3-5.5 KB of the 8.4 KB freed).
const FAST: Duration = Duration::from_millis(600);

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
        .header("ate-target-actor", "team-a/alpha");
    conn.get_ok(req).await
}

fn check_body(body: &[u8], path: &str) {
    if path == "/page" {
        assert!(body.len() == 60_000 && body.iter().all(|b| *b == b'p'));
    } else {
        assert_eq!(body, b"short");
    }
}

/// How long hibernation may take to reach a state before the test fails
/// instead of hanging.
const SETTLE: Duration = Duration::from_secs(10);

/// Waits until the hibernation stats satisfy `done`.
async fn settled(h: &Hibernation, what: &str, done: impl Fn(HibernationStats) -> bool) {
    tokio::time::timeout(SETTLE, h.wait_until(done))
        .await
        .unwrap_or_else(|_| panic!("{what} within {SETTLE:?}: {:?}", h.stats()));
}

/// Serves one exchange on every connection at once, then reads the heap
/// while they are awake and again once every one has hibernated: the same
/// connections, in the same process, so the difference is what hibernating
/// freed, which must be at least `at_least` bytes per connection. Then each
/// wakes on its next exchange, which it serves as usual, and goes back to
/// sleep. `serve` is one exchange on one connection.
async fn hibernating_frees<C>(
    what: &str,
    h: &Hibernation,
    conns: &mut [C],
    at_least: f64,
    serve: impl AsyncFn(&mut C),
) {
    let n = conns.len();
    exchange(
        what,
        "the first exchanges",
        futures_util::future::join_all(conns.iter_mut().map(|c| serve(c))),
    )
    .await;
    let awake = live_bytes();
    let already = h.stats().hibernating;
    settled(h, "all hibernated", |s| s.hibernating == n).await;
    let asleep = live_bytes();
    let measured = n - already;
    assert!(
        measured >= n / 2,
        "{already} of {n} connections hibernated before they could be measured awake"
    );
    let freed = (awake as f64 - asleep as f64) / measured as f64;
    println!("{what}: hibernating freed {freed:.0} B per connection");
    assert!(
        freed >= at_least,
        "{what}: hibernating freed only {freed:.0} B per connection"
    );
    let before = h.stats().wakes;
    for (i, c) in conns.iter_mut().enumerate() {
        exchange(what, &format!("connection {i}'s wake"), serve(c)).await;
    }
    let s = h.stats();
    assert_eq!(s.wakes - before, n as u64, "{s:?}");
    settled(h, "all hibernated again", |s| s.hibernating == n).await;
    exchange(what, "the last exchange", serve(&mut conns[0])).await;
}

/// An exchange within [`SETTLE`], so one that never ends fails naming
/// itself instead of hanging the run (and, through `HEAP_MEASURING`, the
/// tests waiting for it).
async fn exchange<T>(what: &str, which: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(SETTLE, work)
        .await
        .unwrap_or_else(|_| panic!("{what}: {which} did not end within {SETTLE:?}"))
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
        let what = format!("HTTP/1.1 keep-alive after {path}");
        // hyper's 8 KiB read buffer, its write buffer and parsed state, and
        // the rustls session.
        hibernating_frees(&what, &h, &mut conns, 20480.0, async |c| {
            check_body(&request(c, path).await, path);
        })
        .await;
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
    // Its connections' allocations would land in another test's heap
    // readings (one CONNECT reading fell short under load): it waits too.
    let _alone = HEAP_MEASURING.lock().await;
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut tls = router_tls(&pki, running.https, None, None, &[b"http/1.1"])
        .await
        .expect("tls");
    tls.write_all(b"GET /short HTTP/1.1\r\nhost: w\r\nate-target-actor: team-a/alpha\r\n\r\n")
        .await
        .expect("write");
    tls.flush().await.expect("flush");
    let (_, body) = read_response(&mut tls).await;
    assert_eq!(body, b"short");
    settled(&h, "hibernated", |s| s.hibernating == 1).await;
    tls.shutdown().await.expect("close_notify");
    drop(tls);
    // The hibernated connection notices and ends: nothing stays asleep.
    settled(&h, "closed", |s| s.hibernating == 0 && s.wakes == 1).await;
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
    // The rustls session (h2's buffers stay, see router_conn).
    hibernating_frees("HTTP/2 after /page", &h, &mut conns, 6144.0, async |c| {
        check_body(&request(c, "/page").await, "/page");
    })
    .await;
}

/// What a hibernated HTTP/2 connection keeps, whole: the heap this process
/// grew by for each connection (the router's client side here too, the
/// same in every build) once each served one request and hibernated. The
/// actor answers with a `date` header, which HPACK indexes: were its value
/// a slice of the actor's read buffer, it would keep that buffer (16 KiB)
/// for the connection's life (then ~133 KB here, against ~116 KB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_http2_connection_keeps_no_buffer_of_its_requests() {
    let _alone = HEAP_MEASURING.lock().await;
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    // The actor's pooled connection is the actor's, not the router
    // connections': opened before the baseline.
    let mut first = RouterConn::open(&pki, running.https, true).await;
    check_body(&request(&mut first, "/short").await, "/short");
    settled(&h, "the first hibernated", |s| s.hibernating == 1).await;
    let before = live_bytes();
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        conns.push(RouterConn::open(&pki, running.https, true).await);
    }
    for c in conns.iter_mut() {
        exchange("HTTP/2", "a request", async {
            check_body(&request(c, "/short").await, "/short");
        })
        .await;
    }
    settled(&h, "all hibernated", |s| s.hibernating == CONNS + 1).await;
    let each = (live_bytes() as f64 - before as f64) / CONNS as f64;
    println!("hibernated HTTP/2 connection, both ends: {each:.0} B");
    assert!(
        each <= 124_000.0,
        "a hibernated HTTP/2 connection and its client hold {each:.0} B"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connect_tunnels_shrink_when_hibernated_and_carry_the_next_bytes() {
    let _alone = HEAP_MEASURING.lock().await;
    let (pki, running) = running(FAST).await;
    let h = running.ingress.hibernation().clone();
    let mut tunnels = Vec::new();
    for _ in 0..CONNS {
        tunnels.push(h1_tunnel(&pki, running.connect, "alpha", 80).await);
    }
    let what = "CONNECT tunnel after /page";
    hibernating_frees(what, &h, &mut tunnels, 6144.0, async |t| {
        check_body(&get_in_tunnel(t, "/page").await, "/page");
    })
    .await;
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

/// One HTTP/1.1 request to the actor through an open CONNECT tunnel; the
/// response body.
async fn get_in_tunnel(tunnel: &mut RouterTls, path: &str) -> Vec<u8> {
    tunnel
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: actor\r\n\r\n").as_bytes())
        .await
        .expect("write");
    // tokio-rustls takes the bytes into rustls and reports them written
    // when the socket cannot take them yet: its first write of this poll
    // can be refused by tokio's cooperative budget (every 16th of the 50
    // tunnels served in one task here), and nothing sends them later
    // unless flushed.
    tunnel.flush().await.expect("flush");
    let (head, body) = read_response(tunnel).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body
}
