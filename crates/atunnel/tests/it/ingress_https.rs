//! Ingress HTTPS with real peers: router-side hyper clients over h1 and h2
//! with mutual TLS, actors as hyper servers on loopback.

use atunnel_support::prelude::*;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::ingress::IngressConfig;
use atunnel_connect::limits::HEADER_READ_TIMEOUT;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
/// `/upload` counts the body, `/download/N` streams N bytes, `/hold` says so
/// on `holding`, then waits for `release` before answering.
async fn actor_server(hold: Hold) -> SocketAddr {
    http1_actor(move |req| actor_answer(req, hold.clone())).await
}

/// `/hold`'s two signals: the actor has a request (`holding`, which keeps
/// one permit for a late waiter) and the test lets it answer (`release`).
#[derive(Clone, Default)]
struct Hold {
    holding: Arc<Notify>,
    release: Arc<Notify>,
}

/// The actor port served by a second HTTP/1.1 server, which names the port
/// in its answers. [`GRPC_PORT`] is served by an h2c server.
const OTHER_PORT: u16 = 8080;

async fn actor_answer(req: Request<Incoming>, hold: Hold) -> http::Response<ActorBody> {
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
        let released = hold.release.notified();
        hold.holding.notify_one();
        released.await;
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
    hold: Hold,
}

/// One active actor `team-a/alpha`: port 80 mapped to [`actor_server`],
/// [`OTHER_PORT`] to a server that names that port, [`GRPC_PORT`] to an
/// h2c server answering with what it saw.
async fn fixture() -> Fixture {
    fixture_tuned(|_| {}).await
}

/// [`fixture`] with the ingress config changed by `tune`.
async fn fixture_tuned(tune: impl FnOnce(&mut IngressConfig)) -> Fixture {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, tune).await;
    let hold = Hold::default();
    let actor = actor_server(hold.clone()).await;
    let other = http1_actor(|req| async move {
        let seen = format!("port {OTHER_PORT}: {}", describe(&req));
        http::Response::new(Full::new(Bytes::from(seen)))
    })
    .await;
    let grpc =
        h2c_actor(|req| async move { http::Response::new(Full::new(Bytes::from(describe(&req)))) })
            .await;
    running.activate_alpha(&[
        (80, actor.port()),
        (OTHER_PORT, other.port()),
        (GRPC_PORT, grpc.port()),
    ]);
    Fixture { pki, running, hold }
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
    // Host alone never routes: every request names alpha in its one Host
    // header (replacing `get`'s, not added to it).
    fn describe_alpha_host(actor: Option<&str>) -> http::request::Builder {
        let mut b = get("/describe", actor);
        b.headers_mut().expect("builder").insert(
            http::header::HOST,
            http::HeaderValue::from_static("alpha.team-a.actors.resources.substrate.ate.dev"),
        );
        b
    }
    // Positive control: the same request with a valid, active target is
    // served on this connection, so the 421s below come from the target.
    let ok = conn
        .send(empty(describe_alpha_host(Some("team-a/alpha"))))
        .await
        .expect("response");
    assert_eq!(ok.status(), 200, "a valid, active target is served");
    let seen = body_text(ok).await;
    assert!(seen.starts_with("GET /describe HTTP/1.1"), "{seen}");
    for actor in [
        None,
        Some("team-a/unknown"),
        Some("not-a-target"),
        Some("a/b/c"),
        Some("Team-A/alpha"),
    ] {
        let resp = conn
            .send(empty(describe_alpha_host(actor)))
            .await
            .expect("response");
        assert_eq!(resp.status(), 421, "{actor:?}");
        assert_eq!(resp.headers()["x-ate-assignment-stale"], "true");
    }
    f.running
        .ingress
        .deactivate("team-a", "alpha", "uid-1")
        .await;
    let resp = conn
        .send(empty(describe_alpha_host(Some("team-a/alpha"))))
        .await
        .expect("response");
    assert_eq!(resp.status(), 421, "inactive actor");
    assert_eq!(resp.headers()["x-ate-assignment-stale"], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_port_header_selects_the_actor_port_and_is_stripped() {
    let f = fixture().await;
    let other = format!("port {OTHER_PORT}: GET /describe HTTP/1.1");
    let port_80 = "GET /describe HTTP/1.1";
    // Invalid values fall back to 80.
    let cases = [
        (Some(OTHER_PORT.to_string()), other.as_str()),
        (None, port_80),
        (Some("0".into()), port_80),
        (Some("70000".into()), port_80),
        (Some("eighty".into()), port_80),
    ];
    for h2 in [false, true] {
        let mut conn = RouterConn::open(&f.pki, f.running.https, h2).await;
        for (port, answered_by) in &cases {
            let mut req = get("/describe", Some("team-a/alpha"));
            if let Some(port) = port {
                req = req.header("x-ate-target-port", port);
            }
            let resp = conn.send(empty(req)).await.expect("response");
            assert_eq!(resp.status(), 200, "h2={h2} port={port:?}");
            let seen = body_text(resp).await;
            assert!(
                seen.starts_with(answered_by),
                "h2={h2} port={port:?}: {seen}"
            );
            assert!(!seen.contains("x-ate-target-port"), "{seen}");
        }
    }
}

#[tokio::test]
async fn upstream_failure_is_502() {
    let f = fixture().await;
    let closed = closed_port();
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
    let listeners = [
        (
            f.running.https,
            "GET /describe HTTP/1.1\r\nhost: x\r\nate-target-actor: team-a/alpha\r\n\r\n",
        ),
        (
            f.running.connect,
            "CONNECT actor:80 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n",
        ),
    ];
    // Positive control: the same requests with the router's identity are
    // answered 200 by both listeners, so the refusals below are the
    // certificates' doing.
    for (addr, request) in listeners {
        let head = answer_as(&f.pki, addr, None, request)
            .await
            .expect("the router identity is let in");
        assert!(head.starts_with("HTTP/1.1 200"), "{addr}: {head}");
    }
    // Each refusal is the server's TLS alert for that certificate.
    for (who, id, alert) in [
        ("other SPIFFE ID", &stranger, "CertificateUnknown"),
        ("untrusted CA", &forged, "UnknownCA"),
    ] {
        for (addr, request) in listeners {
            let refused = answer_as(&f.pki, addr, Some(id), request).await;
            let e = refused.expect_err(&format!("{who} was let into {addr}"));
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidData,
                "{who}, {addr}: {e}"
            );
            assert_eq!(
                e.to_string(),
                format!("received fatal alert: {alert}"),
                "{who}, {addr}"
            );
        }
    }
}

/// Both listeners choose TLS 1.3's AES-128-GCM-SHA256 (SHA-256 key
/// derivations run on the CPU's SHA instructions) over the router's own
/// first offer, AES-256-GCM-SHA384 from a rustls client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_choose_aes_128_gcm_sha256_over_the_routers_order() {
    let f = fixture().await;
    for addr in [f.running.https, f.running.connect] {
        let tls = router_tls(&f.pki, addr, None, None, &[b"http/1.1"])
            .await
            .expect("TLS");
        let suite = tls.get_ref().1.negotiated_cipher_suite().expect("suite");
        assert_eq!(
            suite.suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
            "{addr}"
        );
    }
}

/// The response head the listener at `addr` sends back to `request`, sent
/// as `identity` (the router if `None`), or the error that ended the
/// connection first. Under TLS 1.3 a refusal arrives with the first read.
async fn answer_as(
    pki: &IngressPki,
    addr: SocketAddr,
    identity: Option<&atunnel_identity::pki::IssuedCert>,
    request: &str,
) -> std::io::Result<String> {
    let mut tls = router_tls(pki, addr, identity, None, &[b"http/1.1"]).await?;
    tls.write_all(request.as_bytes()).await?;
    let head = atunnel_connect::http1::read_head(&mut tls).await?;
    Ok(String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_cancels_a_request_in_flight() {
    let f = fixture().await;
    let mut conn = RouterConn::open(&f.pki, f.running.https, true).await;
    let pending = conn.send(empty(get("/hold", Some("team-a/alpha"))));
    let ingress = f.running.ingress.clone();
    let deactivate = async {
        // The request reaches the actor before the actor is pulled away.
        f.hold.holding.notified().await;
        ingress.deactivate("team-a", "alpha", "uid-1").await;
    };
    let (resp, ()) = tokio::join!(pending, deactivate);
    let resp = resp.expect("an answer, not a hang");
    assert_eq!(resp.status(), 502, "the cancelled request is answered 502");
    f.hold.release.notify_waiters();
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

#[tokio::test]
async fn a_rotated_serving_certificate_is_used_without_a_restart() {
    let f = fixture().await;
    let served = |tls: &RouterTls| {
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

/// Short in tests; production keeps [`HEADER_READ_TIMEOUT`].
const SHORT_HEADER_TIMEOUT: Duration = Duration::from_millis(300);

/// [`SHORT_HEADER_TIMEOUT`] for heads and HTTP/2 prefaces, and hibernation
/// off, so that only the timeout under test can close a connection.
fn short_header_timeout(cfg: &mut IngressConfig) {
    cfg.header_read_timeout = SHORT_HEADER_TIMEOUT;
    cfg.hibernate_after = Duration::ZERO;
}

#[test]
fn header_read_timeout_defaults_to_10_s() {
    assert_eq!(HEADER_READ_TIMEOUT, Duration::from_secs(10));
}

/// An HTTP/1.1 keep-alive connection idle for longer than the header read
/// timeout is still open and serves its next request: the timeout bounds
/// sending a head, not the wait for one. Checked with hibernation off, and
/// with hibernation due after the timeout (the default order: 10 s, 15 s),
/// where the idle connection must still hibernate and wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_outlives_the_header_read_timeout() {
    for hibernate_after in [Duration::ZERO, SHORT_HEADER_TIMEOUT * 2] {
        let f = fixture_tuned(|cfg| {
            short_header_timeout(cfg);
            cfg.hibernate_after = hibernate_after;
        })
        .await;
        let mut conn = RouterConn::open(&f.pki, f.running.https, false).await;
        let resp = conn
            .send(empty(get("/describe", Some("team-a/alpha"))))
            .await
            .expect("first request");
        assert_eq!(resp.status(), 200);
        body_text(resp).await;
        let hibernation = f.running.ingress.hibernation();
        if hibernate_after.is_zero() {
            // The idle period under test.
            tokio::time::sleep(SHORT_HEADER_TIMEOUT * 3).await;
        } else {
            let slept = hibernation.wait_until(|s| s.hibernations >= 1);
            tokio::time::timeout(Duration::from_secs(10), slept)
                .await
                .expect("the idle connection hibernates");
        }
        let resp = conn
            .send(empty(get("/describe", Some("team-a/alpha"))))
            .await
            .unwrap_or_else(|e| panic!("hibernate_after={hibernate_after:?}: {e}"));
        assert_eq!(resp.status(), 200);
        body_text(resp).await;
        if !hibernate_after.is_zero() {
            assert!(hibernation.stats().wakes >= 1, "{:?}", hibernation.stats());
        }
    }
}

/// hyper's client lowercases header names, so mixed case is written here
/// byte for byte: both routing headers are matched whatever their case
/// (the port header picks [`OTHER_PORT`]) and neither reaches the actor.
#[tokio::test]
async fn routing_headers_in_any_case_route_and_are_stripped() {
    let f = fixture().await;
    let mut tls = router_tls(&f.pki, f.running.https, None, None, &[b"http/1.1"])
        .await
        .expect("TLS");
    let request = format!(
        "GET /describe HTTP/1.1\r\nHost: app.example.com\r\n\
         ATE-Target-Actor: team-a/alpha\r\nX-ATE-TARGET-PORT: {OTHER_PORT}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.expect("request");
    let (head, seen) = read_response(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let seen = String::from_utf8_lossy(&seen);
    assert!(
        seen.starts_with(&format!("port {OTHER_PORT}: GET /describe HTTP/1.1")),
        "{seen}"
    );
    assert!(seen.contains("host=app.example.com"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("ate-target-"),
        "routing headers stripped: {seen}"
    );
}

/// gRPC goes to the actor over h2c, on the port the router picked, with the
/// router's authority as `:authority` (not the actor's address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reaches_the_actor_over_h2c_with_the_routers_authority() {
    let f = fixture().await;
    let mut conn = RouterConn::open(&f.pki, f.running.https, true).await;
    let call = grpc_to_alpha("https://app.example.com/atunnel.test.Echo/Call")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .expect("request");
    let resp = conn.send(call).await.expect("response");
    assert_eq!(resp.status(), 200);
    let seen = body_text(resp).await;
    assert!(
        seen.starts_with("POST http://app.example.com/atunnel.test.Echo/Call HTTP/2.0"),
        "{seen}"
    );
    assert!(seen.contains("x-forwarded-host=app.example.com"), "{seen}");
    assert!(!seen.contains("ate-target-"), "{seen}");
}

/// A client that sends part of a request head and stops is closed, with
/// nothing answered, a header read timeout after its first byte at the
/// soonest: on a fresh connection, and after a keep-alive request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_not_sent_within_the_header_read_timeout_closes_the_connection() {
    let f = fixture_tuned(short_header_timeout).await;
    for after_a_request in [false, true] {
        let mut tls = router_tls(&f.pki, f.running.https, None, None, &[b"http/1.1"])
            .await
            .expect("TLS");
        if after_a_request {
            tls.write_all(
                b"GET /describe HTTP/1.1\r\nHost: x\r\nate-target-actor: team-a/alpha\r\n\r\n",
            )
            .await
            .expect("request");
            let (head, _) = read_response(&mut tls).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        }
        let started = tokio::time::Instant::now();
        tls.write_all(b"GET /describe HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("part of a head");
        let mut answered = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answered))
            .await
            .unwrap_or_else(|_| panic!("after_a_request={after_a_request}: left open"));
        let elapsed = started.elapsed();
        assert!(closed.is_ok(), "a clean TLS close: {closed:?}");
        assert!(
            answered.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&answered)
        );
        assert!(
            elapsed >= SHORT_HEADER_TIMEOUT,
            "after_a_request={after_a_request}: closed after {elapsed:?}"
        );
    }
}

#[test]
fn the_connect_servers_h2_preface_timeout_defaults_to_10_s() {
    let default = atunnel_connect::server::H2Settings::default();
    assert_eq!(default.preface_timeout, Duration::from_secs(10));
}

/// The HTTP/2 client preface's first bytes, without the SETTINGS frame that
/// completes it.
const H2_MAGIC: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 client that finishes TLS and then sends nothing, or only the
/// preface's magic and no SETTINGS, is closed with nothing answered, a
/// timeout after TLS at the soonest: on the HTTPS and the CONNECT listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_client_that_sends_no_preface_is_closed_after_the_timeout() {
    let f = fixture_tuned(short_header_timeout).await;
    for (listener, addr) in [("HTTPS", f.running.https), ("CONNECT", f.running.connect)] {
        for sent in [&b""[..], H2_MAGIC] {
            let case = format!("{listener} listener, {} bytes sent", sent.len());
            let mut tls = router_tls(&f.pki, addr, None, None, &[b"h2"])
                .await
                .expect("TLS");
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            let started = tokio::time::Instant::now();
            tls.write_all(sent).await.expect("write");
            tls.flush().await.expect("flush");
            let mut answered = Vec::new();
            // Closed with or without a TLS close_notify; left open, it times out.
            let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answered))
                .await
                .unwrap_or_else(|_| panic!("{case}: left open"));
            let elapsed = started.elapsed();
            assert!(answered.is_empty(), "{case}: answered {answered:?}");
            assert!(
                elapsed >= SHORT_HEADER_TIMEOUT,
                "{case}: closed after {elapsed:?}"
            );
        }
    }
}

/// The router's HTTP/2 connection to either listener, speaking to
/// `team-a/alpha`'s port 80: a GET over HTTPS, or a GET inside a CONNECT
/// tunnel.
struct H2Router {
    send: h2::client::SendRequest<Bytes>,
    connect: bool,
}

impl H2Router {
    async fn open(f: &Fixture, connect: bool) -> Self {
        let addr = if connect {
            f.running.connect
        } else {
            f.running.https
        };
        let send = h2_router(&f.pki, addr).await;
        Self { send, connect }
    }

    /// One exchange on a new stream: what came back, as text.
    async fn describe(&mut self) -> String {
        let req = if self.connect {
            http::Request::builder().method("CONNECT").uri("actor:80")
        } else {
            http::Request::builder().uri(format!("https://{WORKER_NAME}/describe"))
        };
        let req = req
            .header("ate-target-actor", "team-a/alpha")
            .body(())
            .expect("request");
        self.send.clone().ready().await.expect("connection open");
        let (resp, mut body_tx) = self
            .send
            .send_request(req, !self.connect)
            .expect("new stream");
        let resp = resp.await.expect("response");
        assert_eq!(resp.status(), 200, "connect={}", self.connect);
        if self.connect {
            // The actor closes after answering, which ends the tunnel.
            let get = "GET /describe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            body_tx
                .send_data(Bytes::from_static(get.as_bytes()), false)
                .expect("into the tunnel");
        }
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(data) = body.data().await {
            let data = data.expect("body");
            let _ = body.flow_control().release_capacity(data.len());
            got.extend_from_slice(&data);
        }
        String::from_utf8_lossy(&got).into_owned()
    }
}

/// The preface timeout bounds the preface only: an HTTP/2 connection idle
/// for longer, before its first request or after one, stays open and serves
/// the next, on the HTTPS and the CONNECT listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_outlives_the_preface_timeout() {
    let f = fixture_tuned(short_header_timeout).await;
    for connect in [false, true] {
        for request_first in [false, true] {
            let case = format!("connect={connect} request_first={request_first}");
            let mut router = H2Router::open(&f, connect).await;
            if request_first {
                let seen = router.describe().await;
                assert!(seen.contains("GET /describe HTTP/1.1"), "{case}: {seen}");
            }
            // The idle period under test.
            tokio::time::sleep(SHORT_HEADER_TIMEOUT * 3).await;
            let seen = router.describe().await;
            assert!(seen.contains("GET /describe HTTP/1.1"), "{case}: {seen}");
            if connect {
                assert!(seen.starts_with("HTTP/1.1 200"), "{case}: {seen}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_connection_that_stops_answering_pings_is_closed() {
    const INTERVAL: Duration = Duration::from_millis(200);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let f = fixture_tuned(|cfg| {
        cfg.router_ping_interval = INTERVAL;
        cfg.router_ping_timeout = TIMEOUT;
    })
    .await;
    let tls = router_tls(&f.pki, f.running.https, None, None, &[b"h2"])
        .await
        .expect("TLS");
    let (router, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    let (freeze, frozen) = tokio::sync::oneshot::channel::<Duration>();
    // Drives the connection, which answers pings, until told to stop for a
    // while (a router that vanished answers nothing); then reports whether
    // the connection had ended by the time it looked again.
    let driver = tokio::spawn(async move {
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return Err("ended while answering pings"),
            pause = frozen => tokio::time::sleep(pause.expect("pause")).await,
        }
        match tokio::time::timeout(Duration::from_secs(2), conn).await {
            Ok(_) => Ok(()),
            Err(_) => Err("still open after its pings went unanswered"),
        }
    });
    let get = |router: &h2::client::SendRequest<Bytes>| {
        let mut router = router.clone();
        async move {
            let req = http::Request::get("https://w/describe")
                .header("ate-target-actor", "team-a/alpha")
                .body(())
                .expect("request");
            router = router.ready().await.expect("ready");
            let (resp, _) = router.send_request(req, true).expect("send");
            resp.await.expect("response").status()
        }
    };
    // Answered pings keep it open over several intervals.
    assert_eq!(get(&router).await, 200);
    tokio::time::sleep(INTERVAL * 4).await;
    assert_eq!(get(&router).await, 200);
    freeze
        .send(INTERVAL + TIMEOUT + Duration::from_millis(700))
        .expect("driver");
    driver.await.expect("driver").expect("closed");
}

/// An actor written byte by byte: each request's path picks the answer it
/// gets, exactly as written here, so the framings hyper would not produce
/// (and the ones a proxy must refuse) reach ingress's HTTP/1.1 client.
async fn scripted_actor() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let (answer, close): (&[u8], bool) = match path.as_str() {
                        "/close" => (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true),
                        "/chunked" => (
                            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nx-sum: 7\r\n\r\n",
                            false,
                        ),
                        "/interim" => (
                            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
                            false,
                        ),
                        "/smuggle" => (
                            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                            true,
                        ),
                        "/bye" => (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye", true),
                        _ => (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
                    };
                    if tcp.write_all(answer).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_responses_are_framed_as_http1_says_and_ambiguous_ones_refused() {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let actor = scripted_actor().await;
    running.activate_alpha(&[(80, actor.port())]);
    let mut conn = RouterConn::open(&pki, running.https, true).await;
    let mut send = async |path: &str| {
        let resp = conn
            .send(empty(get(path, Some("team-a/alpha"))))
            .await
            .expect("response");
        let status = resp.status();
        let collected = resp.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (status, collected.to_bytes(), trailers)
    };

    let (status, body, _) = send("/close").await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"until the end"[..]));
    let (status, body, trailers) = send("/chunked").await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"hello world"[..]));
    assert_eq!(trailers.expect("the chunked body's trailers")["x-sum"], "7");
    let (status, body, _) = send("/interim").await;
    assert_eq!(
        (status.as_u16(), &body[..]),
        (200, &b"hi"[..]),
        "103 skipped"
    );
    let (status, _, _) = send("/smuggle").await;
    assert_eq!(
        status, 502,
        "Transfer-Encoding with Content-Length is refused"
    );
    // The actor closes the connection after this answer; the next request
    // must not be lost on it.
    let (status, body, _) = send("/bye").await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"bye"[..]));
    for _ in 0..3 {
        let (status, body, _) = send("/").await;
        assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    }
}
