//! Ingress HTTPS with real peers: router-side hyper clients over h1 and h2
//! with mutual TLS, actors as hyper servers on loopback.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use support::ingress::*;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// What the actor saw of a request, as the response body.
fn describe(req: &Request<Incoming>) -> String {
    let mut headers: Vec<String> = req
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or("?")))
        .collect();
    headers.sort();
    format!(
        "{} {} {:?}\n{}",
        req.method(),
        req.uri(),
        req.version(),
        headers.join("\n")
    )
}

type ActorBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// An HTTP/1.1 actor on loopback: `/describe` answers with what it saw,
/// `/upload` counts the body, `/download/N` streams N bytes, `/hold` waits
/// for `release` before answering.
async fn actor_server(release: Arc<Notify>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let release = release.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let release = release.clone();
                    async move { Ok::<_, Infallible>(actor_answer(req, release).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

async fn actor_answer(req: Request<Incoming>, release: Arc<Notify>) -> http::Response<ActorBody> {
    let full = |s: String| Full::new(Bytes::from(s)).boxed();
    let path = req.uri().path().to_string();
    if path == "/describe" {
        return http::Response::new(full(describe(&req)));
    }
    if path == "/upload" {
        let mut body = req.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("upload frame").into_data() {
                n += data.len() as u64;
            }
        }
        return http::Response::new(full(n.to_string()));
    }
    if let Some(n) = path.strip_prefix("/download/") {
        let n: u64 = n.parse().expect("size");
        let chunk = Bytes::from(vec![b'd'; 64 * 1024]);
        let chunks = (0..n.div_ceil(chunk.len() as u64)).map(move |i| {
            let len = (n - i * chunk.len() as u64).min(chunk.len() as u64) as usize;
            Ok::<_, Infallible>(Frame::data(chunk.slice(..len)))
        });
        return http::Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed());
    }
    if path == "/hold" {
        release.notified().await;
        return http::Response::new(full("released".into()));
    }
    let mut r = http::Response::new(full("not found".into()));
    *r.status_mut() = http::StatusCode::NOT_FOUND;
    r
}

fn get(path: &str, actor: Option<&str>) -> http::request::Builder {
    let mut b = Request::builder()
        .uri(format!("https://{WORKER_NAME}{path}"))
        .header("host", "app.example.com");
    if let Some(a) = actor {
        b = b.header("ate-target-actor", a);
    }
    b
}

fn empty(b: http::request::Builder) -> Request<Full<Bytes>> {
    b.body(Full::new(Bytes::new())).expect("request")
}

struct Fixture {
    pki: IngressPki,
    running: RunningIngress,
    actor_port: u16,
    release: Arc<Notify>,
}

/// One active actor `team-a/alpha`, port 80 mapped to its loopback server.
async fn fixture() -> Fixture {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let release = Arc::new(Notify::new());
    let actor = actor_server(release.clone()).await;
    running.activate_alpha(&[(80, actor.port())]);
    Fixture {
        pki,
        running,
        actor_port: actor.port(),
        release,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_actor_over_h1_and_h2_with_headers_rewritten() {
    let f = fixture().await;
    for h2 in [false, true] {
        let mut conn = RouterConn::open(&f.pki, f.running.https, h2).await;
        // The header name is case-insensitive.
        let req = get("/describe?x=1", None)
            .header("Ate-Target-Actor", "team-a/alpha")
            .header("x-forwarded-for", "203.0.113.9");
        let resp = conn.send(empty(req)).await.expect("response");
        assert_eq!(resp.status(), 200, "h2={h2}");
        let seen = body_text(resp).await;
        assert!(
            seen.starts_with("GET /describe?x=1 HTTP/1.1"),
            "h2={h2}: {seen}"
        );
        assert!(
            seen.contains("host=app.example.com"),
            "Host kept (h2={h2}): {seen}"
        );
        assert!(
            !seen.contains("ate-target-actor"),
            "routing header stripped: {seen}"
        );
        assert!(
            seen.contains("x-forwarded-for=203.0.113.9, 127.0.0.1"),
            "{seen}"
        );
        assert!(seen.contains("x-forwarded-proto=https"), "{seen}");
    }
}

#[tokio::test]
async fn unknown_invalid_missing_or_inactive_actors_get_421_stale() {
    let f = fixture().await;
    let mut conn = RouterConn::open(&f.pki, f.running.https, false).await;
    for actor in [
        None,
        Some("team-a/unknown"),
        Some("not-a-target"),
        Some("a/b/c"),
        Some("Team-A/alpha"),
    ] {
        // Host alone never routes.
        let req = get("/describe", actor)
            .header("host", "alpha.team-a.actors.resources.substrate.ate.dev");
        let resp = conn.send(empty(req)).await.expect("response");
        assert_eq!(resp.status(), 421, "{actor:?}");
        assert_eq!(resp.headers()["x-ate-assignment-stale"], "true");
    }
    f.running
        .ingress
        .deactivate("team-a", "alpha", "uid-1")
        .await;
    let resp = conn
        .send(empty(get("/describe", Some("team-a/alpha"))))
        .await
        .expect("response");
    assert_eq!(resp.status(), 421, "inactive actor");
}

#[tokio::test]
async fn target_port_header_selects_the_actor_port_and_is_stripped() {
    let f = fixture().await;
    let mut conn = RouterConn::open(&f.pki, f.running.https, false).await;
    let req = get("/describe", Some("team-a/alpha"))
        .header("x-ate-target-port", f.actor_port.to_string());
    let resp = conn.send(empty(req)).await.expect("response");
    assert_eq!(resp.status(), 200);
    let seen = body_text(resp).await;
    assert!(!seen.contains("x-ate-target-port"), "{seen}");
    // Invalid values fall back to 80 (mapped to the same actor here).
    for bad in ["0", "70000", "eighty"] {
        let req = get("/describe", Some("team-a/alpha")).header("x-ate-target-port", bad);
        let resp = conn.send(empty(req)).await.expect("response");
        assert_eq!(resp.status(), 200, "{bad}");
    }
}

#[tokio::test]
async fn upstream_failure_is_502() {
    let f = fixture().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut conn = RouterConn::open(&f.pki, f.running.https, false).await;
    let req =
        get("/describe", Some("team-a/alpha")).header("x-ate-target-port", closed.to_string());
    let resp = conn.send(empty(req)).await.expect("response");
    assert_eq!(resp.status(), 502);
}

#[tokio::test]
async fn only_the_router_identity_from_the_trusted_ca_gets_in() {
    let f = fixture().await;
    let stranger = f
        .pki
        .other_client("spiffe://cluster.local/ns/default/sa/stranger");
    let other_ca = atunnel_identity::pki::CertificateAuthority::new("other CA").expect("ca");
    let forged = other_ca
        .issue(
            Some(atunnel::ingress::ROUTER_SPIFFE_ID),
            &[],
            &[],
            atunnel_identity::pki::Usage::Client,
            Duration::from_secs(3600),
        )
        .expect("forged router");
    for (who, id) in [("other SPIFFE ID", &stranger), ("untrusted CA", &forged)] {
        for addr in [f.running.https, f.running.connect] {
            let refused = async {
                let mut tls = router_tls(&f.pki, addr, Some(id), None, &[b"http/1.1"]).await?;
                // Under TLS 1.3 the refusal arrives with the first read.
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                tls.write_all(
                    b"GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: team-a/alpha\r\n\r\n",
                )
                .await?;
                let mut buf = [0u8; 64];
                match tls.read(&mut buf).await? {
                    0 => Err(std::io::Error::other("closed")),
                    _ => Ok(()),
                }
            };
            assert!(refused.await.is_err(), "{who} was let into {addr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_cancels_a_request_in_flight() {
    let f = fixture().await;
    let mut conn = RouterConn::open(&f.pki, f.running.https, true).await;
    let pending = conn.send(empty(get("/hold", Some("team-a/alpha"))));
    let ingress = f.running.ingress.clone();
    let deactivate = async {
        // Let the request reach the actor before pulling the actor away.
        tokio::time::sleep(Duration::from_millis(200)).await;
        ingress.deactivate("team-a", "alpha", "uid-1").await;
    };
    let (resp, ()) = tokio::join!(pending, deactivate);
    let resp = resp.expect("an answer, not a hang");
    assert_eq!(resp.status(), 502, "the cancelled request is answered 502");
    f.release.notify_waiters();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways() {
    let f = fixture().await;
    for h2 in [false, true] {
        let mut conn = RouterConn::open(&f.pki, f.running.https, h2).await;
        let up = Request::builder()
            .method("POST")
            .uri(format!("https://{WORKER_NAME}/upload"))
            .header("ate-target-actor", "team-a/alpha")
            .body(Full::new(Bytes::from(vec![b'u'; 8 << 20])))
            .expect("request");
        let resp = conn.send(up).await.expect("response");
        assert_eq!(body_text(resp).await, (8u64 << 20).to_string(), "h2={h2}");
        let resp = conn
            .send(empty(get("/download/9000000", Some("team-a/alpha"))))
            .await
            .expect("response");
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(got.len(), 9_000_000, "h2={h2}");
        assert!(got.iter().all(|&b| b == b'd'));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_connections_are_reused_under_load() {
    // The contract: at 1,000 requests/s with up to 50 in flight, fewer than
    // 5 new actor connections per 1,000 requests after warm-up. Requests are
    // paced at that rate (not fired as fast as possible, which measures
    // hyper's checkout race instead of the pool's size).
    let f = fixture().await;
    const IN_FLIGHT: usize = 50;
    const RATE: u64 = 1000;
    let mut conns = Vec::new();
    for _ in 0..5 {
        match RouterConn::open(&f.pki, f.running.https, true).await {
            RouterConn::H2(s) => conns.push(s),
            RouterConn::H1(_) => unreachable!("h2 connections"),
        }
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let run = |requests: usize| {
        let conns = conns.clone();
        let slots = slots.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            let mut tasks = Vec::new();
            for i in 0..requests {
                tick.tick().await;
                let permit = slots.clone().acquire_owned().await.expect("semaphore");
                let mut conn = RouterConn::H2(conns[i % conns.len()].clone());
                tasks.push(tokio::spawn(async move {
                    let resp = conn
                        .send(empty(get("/describe", Some("team-a/alpha"))))
                        .await
                        .expect("response");
                    assert_eq!(resp.status(), 200);
                    let _ = body_text(resp).await;
                    drop(permit);
                }));
            }
            for t in tasks {
                t.await.expect("request");
            }
        }
    };
    run(1000).await;
    let before = f.running.ingress.stats().new_upstream_connections;
    const MEASURED: usize = 2000;
    run(MEASURED).await;
    let new = f.running.ingress.stats().new_upstream_connections - before;
    let per_1000 = new as f64 * 1000.0 / MEASURED as f64;
    println!("new actor connections per 1,000 requests after warm-up: {per_1000:.2}");
    assert!(
        per_1000 < 5.0,
        "{new} new actor connections for {MEASURED} requests"
    );
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_used_without_a_restart() {
    let f = fixture().await;
    let served = |tls: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        tls.get_ref()
            .1
            .peer_certificates()
            .expect("server certificate")[0]
            .clone()
    };
    let before = served(
        &router_tls(&f.pki, f.running.https, None, None, &[b"h2"])
            .await
            .expect("TLS"),
    );
    assert_eq!(before, f.pki.worker.chain[0]);
    let rotated = f
        .pki
        .pod_ca
        .issue(
            Some(atunnel_identity::pki::WORKER_SPIFFE_ID),
            &[WORKER_NAME],
            &[],
            atunnel_identity::pki::Usage::ServerAndClient,
            Duration::from_secs(7200),
        )
        .expect("rotated");
    // Written aside and renamed in, as the kubelet swaps the file.
    let tmp = f.pki.path("bundle.new");
    std::fs::write(&tmp, format!("{}{}", rotated.cert_pem, rotated.key_pem)).expect("write");
    std::fs::rename(&tmp, f.pki.bundle_path()).expect("rename");
    let after = served(
        &router_tls(&f.pki, f.running.https, None, None, &[b"h2"])
            .await
            .expect("TLS"),
    );
    assert_eq!(after, rotated.chain[0], "the new certificate is served");
    // A broken file keeps the last good certificate.
    std::fs::write(f.pki.bundle_path(), "not a PEM").expect("write");
    let kept = served(
        &router_tls(&f.pki, f.running.https, None, None, &[b"h2"])
            .await
            .expect("TLS"),
    );
    assert_eq!(kept, rotated.chain[0]);
}
