//! Ingress bodies that stop moving end, through real mTLS and HTTP/2 from
//! the router to loopback actors: a response body the actor stops sending
//! and a request body the actor never reads are each ended after their
//! idle bound (the router's stream reset or answered 504, the actor's
//! connection closed, the in-flight slot back, counted for that actor),
//! while another actor on the same router connection is served. Also the
//! per-actor caps on the ports an actor's requests (and pools) may use and
//! on the idle connections kept per port.

use atunnel_support::prelude::*;

use crate::common::{alpha_and_quick_beta, answered_504_after, quick_actor};
use std::time::Duration;

use atunnel::ingress::{ActorIngressStats, Ingress};
use bytes::Bytes;
use http_body_util::{Full, StreamBody};
use hyper::body::Frame;

/// The bound under test: short, so each test takes about a second.
const BOUND: Duration = Duration::from_millis(500);

/// A GET to `team-a/<actor>` (its port `port`) on a new stream, not awaited.
fn get(
    router: &mut h2::client::SendRequest<Bytes>,
    actor: &str,
    port: u16,
) -> h2::client::ResponseFuture {
    let req = http::Request::get("https://w/")
        .header("ate-target-actor", format!("team-a/{actor}"))
        .header("x-ate-target-port", port.to_string())
        .body(())
        .expect("request");
    router.send_request(req, true).expect("send").0
}

/// Waits (bounded) until `uid` has nothing in flight.
async fn drained(ingress: &Ingress, uid: &str) {
    until_actor(ingress, uid, "its in-flight slot never came back", |f| {
        f.in_flight == 0
    })
    .await;
}

/// Alpha's in-flight slot came back, and `ends` counts one end of alpha's
/// and none of beta's.
async fn one_end_for_alpha(ingress: &Ingress, ends: impl Fn(&ActorIngressStats) -> u64) {
    drained(ingress, "uid-1").await;
    assert_eq!(ends(&actor_figures(ingress, "uid-1")), 1, "alpha's ends");
    assert_eq!(ends(&actor_figures(ingress, "uid-2")), 0, "beta's ends");
}

/// An actor that reads a request's head and nothing more, ever; the
/// receiver fires once atunnel has closed (reset) its connection. Not
/// reading, it cannot see an end of stream, so it looks at the socket's
/// error every 10 ms (bounded by the caller's timeout).
async fn deaf_actor() -> (std::net::SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (reset_tx, reset) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if let Ok(Some(_)) | Err(_) = tcp.take_error() {
                let _ = reset_tx.send(());
                return;
            }
        }
    });
    (addr, reset)
}

/// An actor that sends its head and a first chunk, then nothing, forever.
async fn stalling_actor() -> (std::net::SocketAddr, ActorConnections) {
    counted_http1_actor(|_req| async {
        let first = futures_util::stream::once(async {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"first")))
        });
        let body = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        http::Response::new(StreamBody::new(body))
    })
    .await
}

/// A POST to alpha with all of an 8 MiB body queued: more than the kernel
/// and hyper buffer between here and alpha. Its answer, and its sending
/// half, to keep while the body is in flight.
fn upload_to_alpha(
    router: &mut h2::client::SendRequest<Bytes>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let req = http::Request::post("https://w/upload")
        .header("ate-target-actor", "team-a/alpha")
        .body(())
        .expect("request");
    let (answer, mut upload) = router.send_request(req, false).expect("send");
    upload
        .send_data(Bytes::from(vec![7u8; 8 << 20]), true)
        .expect("queue the body");
    (answer, upload)
}

/// Beta, on the same router connection, is answered "now" end to end.
async fn served(router: &mut h2::client::SendRequest<Bytes>) {
    let resp = get(router, "beta", 80).await.expect("beta answered");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let data = body.data().await.expect("a chunk").expect("data");
    assert_eq!(&data[..], b"now", "beta's bytes end to end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_the_actor_stops_sending_is_reset_after_the_idle_bound() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.response_body_idle = BOUND).await;
    let (stalling, mut alpha_conns) = stalling_actor().await;
    let mut router = alpha_and_quick_beta(&pki, &running, stalling).await;

    let resp = get(&mut router, "alpha", 80).await.expect("alpha's head");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.data().await.expect("a chunk").expect("data");
    assert_eq!(&first[..], b"first");
    let stalled_at = tokio::time::Instant::now();
    // The router's other streams are served while alpha's stalls.
    served(&mut router).await;

    let end = tokio::time::timeout(Duration::from_secs(10), body.data())
        .await
        .expect("alpha's stalled body ended within 10 s");
    let err = match end {
        Some(Err(e)) => e,
        other => panic!("alpha's stream should be reset, got {other:?}"),
    };
    assert!(err.is_reset(), "reset, not a clean end: {err}");
    assert!(stalled_at.elapsed() >= BOUND, "ended before the bound");
    assert!(
        alpha_conns.closed(0, Duration::from_secs(5)).await,
        "alpha's connection was closed, not pooled"
    );
    one_end_for_alpha(&running.ingress, |f| f.response_body_idle_ends_total).await;
    // The same router connection still serves.
    served(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_a_stalled_response_body_closes_the_routers_connection() {
    use http_body_util::BodyExt;
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.response_body_idle = BOUND).await;
    let (stalling, mut alpha_conns) = stalling_actor().await;
    activate_loopback(&running.ingress, "alpha", "uid-1", stalling.port());
    let mut router = RouterConn::open(&pki, running.https, false).await;
    let req = http::Request::get("https://w/")
        .header("ate-target-actor", "team-a/alpha")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = router.send(req).await.expect("alpha's head");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.data_ref().map(|d| &d[..]), Some(&b"first"[..]));
    let started = tokio::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("alpha's stalled body ended within 10 s");
    assert!(
        matches!(end, Some(Err(_))),
        "the connection closed mid-body, not a clean end: {end:?}"
    );
    assert!(started.elapsed() >= BOUND, "ended before the bound");
    assert!(
        alpha_conns.closed(0, Duration::from_secs(5)).await,
        "alpha's connection was closed, not pooled"
    );
    drained(&running.ingress, "uid-1").await;
    assert_eq!(
        actor_figures(&running.ingress, "uid-1").response_body_idle_ends_total,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_response_body_is_not_an_idle_one() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.response_body_idle = BOUND).await;
    // A chunk every half bound, for three bounds.
    let slow = http1_actor(|_req| async {
        let chunks = futures_util::stream::unfold(0u32, |i| async move {
            if i == 6 {
                return None;
            }
            tokio::time::sleep(BOUND / 2).await;
            let frame = Frame::data(Bytes::from(format!("{i}")));
            Some((Ok::<_, std::convert::Infallible>(frame), i + 1))
        });
        http::Response::new(StreamBody::new(chunks))
    })
    .await;
    activate_loopback(&running.ingress, "alpha", "uid-1", slow.port());
    let mut router = ready_h2_router(&pki, running.https).await;
    let resp = get(&mut router, "alpha", 80).await.expect("alpha's head");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        got.extend_from_slice(&chunk.expect("a slow body is not ended"));
    }
    assert_eq!(got, b"012345");
    assert_eq!(
        actor_figures(&running.ingress, "uid-1").response_body_idle_ends_total,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_the_actor_never_reads_is_ended_after_the_idle_bound() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| {
        pools.request_body_idle = BOUND;
        // Far past the test's own deadline: only the body bound ends it.
        pools.response_timeout = Duration::from_secs(60);
    })
    .await;
    // alpha reads the head, never the body, and never answers.
    let (deaf, alpha_reset) = deaf_actor().await;
    let mut router = alpha_and_quick_beta(&pki, &running, deaf).await;

    let (answer, _upload) = upload_to_alpha(&mut router);
    let started = tokio::time::Instant::now();
    served(&mut router).await;

    answered_504_after(answer, started, BOUND).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(10), alpha_reset)
            .await
            .is_ok(),
        "alpha's connection was closed"
    );
    one_end_for_alpha(&running.ingress, |f| f.request_body_idle_ends_total).await;
    assert_eq!(
        actor_figures(&running.ingress, "uid-1").response_timeouts_total,
        0
    );
    served(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_unread_behind_a_streaming_response_is_reset_after_the_idle_bound() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| {
        pools.request_body_idle = BOUND;
        pools.response_body_idle = Duration::ZERO;
    })
    .await;
    // alpha answers at once and keeps its response going, a chunk every
    // 50 ms, but never reads the request's body.
    let (deaf, mut alpha_conns) = counted_http1_actor(|req| async move {
        let ticks = futures_util::stream::unfold(req, |req| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let frame = Frame::data(Bytes::from_static(b"."));
            Some((Ok::<_, std::convert::Infallible>(frame), req))
        });
        http::Response::new(StreamBody::new(ticks))
    })
    .await;
    let mut router = alpha_and_quick_beta(&pki, &running, deaf).await;
    let (answer, _upload) = upload_to_alpha(&mut router);
    let resp = answer.await.expect("alpha's head");
    assert_eq!(resp.status(), 200);
    let started = tokio::time::Instant::now();
    served(&mut router).await;
    let mut body = resp.into_body();
    let reset = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match body.data().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return e,
                None => panic!("alpha's response ended cleanly"),
            }
        }
    })
    .await
    .expect("alpha's request ended within 10 s");
    assert!(reset.is_reset(), "reset: {reset}");
    assert!(started.elapsed() >= BOUND, "ended before the bound");
    assert!(
        alpha_conns.closed(0, Duration::from_secs(5)).await,
        "alpha's connection was closed"
    );
    one_end_for_alpha(&running.ingress, |f| f.request_body_idle_ends_total).await;
    served(&mut router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_gets_503_for_a_port_past_its_port_cap() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.max_ports = 2).await;
    let actor = quick_actor().await;
    let ports = [(80, actor.port()), (81, actor.port()), (82, actor.port())];
    activate_ports(&running.ingress, "beta", "uid-2", &ports);
    let mut router = ready_h2_router(&pki, running.https).await;
    for port in [80, 81, 80] {
        let resp = get(&mut router, "beta", port).await.expect("answer");
        assert_eq!(resp.status(), 200, "port {port}");
    }
    let refused = get(&mut router, "beta", 82).await.expect("answer");
    assert_eq!(refused.status(), 503);
    let beta = actor_figures(&running.ingress, "uid-2");
    assert_eq!((beta.ports, beta.refused_ports_total), (2, 1));
    // The ports it has keep working.
    assert_eq!(
        get(&mut router, "beta", 81).await.expect("answer").status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_keeps_at_most_its_idle_bound_of_connections_per_port() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.max_idle_per_actor = 1).await;
    // Four requests held at once take four connections.
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let r = release.clone();
    let (actor, mut conns) = counted_http1_actor(move |_req| {
        let r = r.clone();
        async move {
            let _go = r.acquire().await.expect("released");
            http::Response::new(Full::new(Bytes::from_static(b"now")))
        }
    })
    .await;
    activate_loopback(&running.ingress, "alpha", "uid-1", actor.port());
    let mut router = ready_h2_router(&pki, running.https).await;
    let held: Vec<_> = (0..4).map(|_| get(&mut router, "alpha", 80)).collect();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while conns.accepted() < 4 {
        assert!(tokio::time::Instant::now() < until, "four connections");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    release.add_permits(4);
    for r in held {
        assert_eq!(r.await.expect("answered").status(), 200);
    }
    // Back in the pool, all but one are closed.
    let mut closed = 0;
    for n in 0..4 {
        if conns.closed(n, Duration::from_secs(1)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 3, "one idle connection kept, the rest closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_ended_at_its_bound_is_counted_in_stats_and_metrics() {
    use atunnel_support::stats_client::{fetch_stats, get as admin_get};
    let pki = IngressPki::new();
    let mut cfg = tunnel_with_ingress(&pki, &Pki::new(), Duration::from_secs(1));
    cfg.stats = Some("127.0.0.1:0".parse().expect("addr"));
    if let Some(ingress) = cfg.ingress.as_mut() {
        ingress.config.pools.response_body_idle = BOUND;
    }
    let tunnel = atunnel::tunnel::Tunnel::start(cfg).await.expect("tunnel");
    let (ingress, https, _) = tunnel.ingress().expect("ingress");
    let ingress = ingress.clone();
    let (stalling, _conns) = stalling_actor().await;
    let dialer = LoopbackDialer([(80, stalling.port())].into_iter().collect());
    tunnel
        .activate_with_dialer(&actor("alpha"), Box::new(dialer), None)
        .await
        .expect("activate");
    let mut router = ready_h2_router(&pki, https).await;
    let resp = get(&mut router, "alpha", 80).await.expect("alpha's head");
    let mut body = resp.into_body();
    body.data().await.expect("a chunk").expect("data");
    let end = tokio::time::timeout(Duration::from_secs(10), body.data())
        .await
        .expect("ended within 10 s");
    assert!(matches!(end, Some(Err(_))), "reset");
    drained(&ingress, "uid-alpha").await;

    let addr = tunnel.stats_addr().expect("/stats");
    let stats = fetch_stats(addr, false).await.expect("/stats");
    let alpha = &stats.ingress.expect("ingress figures").actors[0];
    assert_eq!(alpha.actor, "uid-alpha");
    assert_eq!(alpha.response_body_idle_ends_total, 1);
    assert_eq!(alpha.request_body_idle_ends_total, 0);
    let (status, metrics) = admin_get(addr, "/metrics").await.expect("/metrics");
    assert_eq!(status, 200);
    let sample = "atunnel_ingress_actor_response_body_idle_ends_total{actor=\"uid-alpha\"} 1";
    assert!(
        metrics.lines().any(|l| l == sample),
        "no {sample:?} in /metrics"
    );
    tunnel.shutdown().await;
}
