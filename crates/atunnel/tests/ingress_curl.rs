//! Ingress driven by the real `curl` binary: HTTPS over h1 and h2, CONNECT
//! through an HTTPS proxy, and mutual TLS refusing a client that is not the
//! router. Actors are hyper servers on loopback.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::mpsc;

/// The actor port a CONNECT authority names; mapped to the actor's real
/// loopback port by the dialer.
const ACTOR_PORT: u16 = 8080;
/// curl's own limit on one run, and ours on top of it.
const CURL_MAX_TIME: &str = "20";
const CURL_TIMEOUT: Duration = Duration::from_secs(30);

/// What the actor saw of a request: request line, then sorted headers.
fn describe(req: &Request<Incoming>) -> String {
    let mut headers: Vec<String> = req
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or("?")))
        .collect();
    headers.sort();
    format!(
        "{} {} {:?}\n{}\n",
        req.method(),
        req.uri(),
        req.version(),
        headers.join("\n")
    )
}

/// An HTTP/1.1 actor on loopback answering every request with what it saw,
/// and reporting the same on `seen`.
async fn describing_actor() -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let (tx, seen) = mpsc::unbounded_channel();
    let addr = http1_actor(move |req: Request<Incoming>| {
        let seen = describe(&req);
        let _ = tx.send(seen.clone());
        std::future::ready(http::Response::new(Full::new(Bytes::from(seen))))
    })
    .await;
    (addr, seen)
}

struct Fixture {
    pki: IngressPki,
    running: RunningIngress,
    seen: mpsc::UnboundedReceiver<String>,
}

/// One active actor `team-a/alpha`: ports 80 and 8080 both reach its
/// loopback server.
async fn fixture() -> Fixture {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let (actor, seen) = describing_actor().await;
    running.activate_alpha(&[(80, actor.port()), (ACTOR_PORT, actor.port())]);
    Fixture { pki, running, seen }
}

#[derive(Debug)]
struct CurlRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl CurlRun {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `curl -sS --max-time 20 <args>` off the runtime, bounded.
async fn curl(args: Vec<String>) -> CurlRun {
    let shown = args.join(" ");
    let run = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["-sS", "--max-time", CURL_MAX_TIME])
            .args(&args)
            .stdin(Stdio::null())
            .output()
    });
    let out = tokio::time::timeout(CURL_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("curl {shown} ran past {CURL_TIMEOUT:?}"))
        .expect("curl task")
        .expect("curl runs (is curl installed?)");
    CurlRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn path_arg(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// `--resolve worker.test:<port>:127.0.0.1`, so the name curl verifies is
/// the worker's.
fn resolve(addr: SocketAddr) -> [String; 2] {
    [
        "--resolve".into(),
        format!("{WORKER_NAME}:{}:127.0.0.1", addr.port()),
    ]
}

/// Client TLS options for a request to the HTTPS listener with `cert`/`key`.
fn https_args(pki: &IngressPki, cert: &Path, key: &Path) -> Vec<String> {
    vec![
        "--cacert".into(),
        path_arg(&pki.trust_path()),
        "--cert".into(),
        path_arg(cert),
        "--key".into(),
        path_arg(key),
    ]
}

/// Proxy TLS options for a CONNECT through the CONNECT listener.
fn proxy_args(pki: &IngressPki, connect: SocketAddr, cert: &Path, key: &Path) -> Vec<String> {
    let mut args = vec![
        "-p".into(),
        "-x".into(),
        format!("https://{WORKER_NAME}:{}", connect.port()),
        "--proxy-cacert".into(),
        path_arg(&pki.trust_path()),
        "--proxy-cert".into(),
        path_arg(cert),
        "--proxy-key".into(),
        path_arg(key),
    ];
    args.extend(resolve(connect));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_the_https_listener() {
    let mut f = fixture().await;
    let https = f.running.https;
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let mut args = vec![flag.to_string()];
        args.extend(https_args(
            &f.pki,
            &f.pki.path("router.pem"),
            &f.pki.path("router.key"),
        ));
        args.extend(resolve(https));
        args.extend([
            "-H".into(),
            "ate-target-actor: team-a/alpha".into(),
            "-w".into(),
            "%{http_code} %{http_version}".into(),
            format!("https://{WORKER_NAME}:{}/hello", https.port()),
        ]);
        let run = curl(args).await;
        assert!(run.ok(), "{flag}: {run:?}");
        // The body is what the actor saw; -w appends status and version.
        let (body, trailer) = run.stdout.rsplit_once('\n').expect("body and -w line");
        assert_eq!(trailer, format!("200 {version}"), "{flag}: {run:?}");
        let seen = f.seen.recv().await.expect("the actor saw the request");
        assert_eq!(seen, format!("{body}\n"), "{flag}: answered by the actor");
        assert!(seen.starts_with("GET /hello HTTP/1.1\n"), "{flag}: {seen}");
        assert!(
            seen.contains(&format!("\nhost={WORKER_NAME}:{}\n", https.port())),
            "{flag}: Host as curl sent it: {seen}"
        );
        assert!(!seen.contains("ate-target-actor"), "{flag}: {seen}");
        assert!(
            seen.contains("\nx-forwarded-proto=https\n"),
            "{flag}: {seen}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_the_connect_listener() {
    let mut f = fixture().await;
    let connect = f.running.connect;
    let router = (f.pki.path("router.pem"), f.pki.path("router.key"));
    let url = format!("http://actor:{ACTOR_PORT}/hello");

    let mut args = proxy_args(&f.pki, connect, &router.0, &router.1);
    args.extend([
        "--proxy-header".into(),
        "ate-target-actor: team-a/alpha".into(),
        "-w".into(),
        "%{http_connect} %{http_code}".into(),
        url.clone(),
    ]);
    let run = curl(args).await;
    assert!(run.ok(), "{run:?}");
    let (body, codes) = run.stdout.rsplit_once('\n').expect("body and -w line");
    assert_eq!(codes, "200 200", "CONNECT then the request: {run:?}");
    // Bytes through the tunnel are the actor's own: its request line and
    // Host are curl's, and the proxy header went to the proxy only.
    let seen = f.seen.recv().await.expect("the actor saw the request");
    assert_eq!(seen, format!("{body}\n"), "answered by the actor");
    assert!(seen.starts_with("GET /hello HTTP/1.1\n"), "{seen}");
    assert!(
        seen.contains(&format!("\nhost=actor:{ACTOR_PORT}\n")),
        "{seen}"
    );
    assert!(!seen.contains("ate-target-actor"), "{seen}");
    assert!(
        !seen.contains("x-forwarded"),
        "a tunnel adds nothing: {seen}"
    );

    // Without the routing header the proxy refuses the tunnel with 421.
    let mut args = proxy_args(&f.pki, connect, &router.0, &router.1);
    args.extend(["-w".into(), "%{http_connect}".into(), url.clone()]);
    let run = curl(args).await;
    assert!(
        !run.ok(),
        "CONNECT without ate-target-actor succeeded: {run:?}"
    );
    assert_eq!(run.stdout, "421", "{run:?}");
    assert!(
        run.stderr.contains("421"),
        "curl reports the proxy's 421: {run:?}"
    );

    // Nor does an unknown actor get a tunnel.
    let mut args = proxy_args(&f.pki, connect, &router.0, &router.1);
    args.extend([
        "--proxy-header".into(),
        "ate-target-actor: team-a/unknown".into(),
        "-w".into(),
        "%{http_connect}".into(),
        url,
    ]);
    let run = curl(args).await;
    assert!(!run.ok(), "CONNECT to an unknown actor succeeded: {run:?}");
    assert_eq!(run.stdout, "421", "{run:?}");
    assert!(
        f.seen.try_recv().is_err(),
        "a refused tunnel reached the actor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_with_the_wrong_client_certificate_is_refused() {
    let mut f = fixture().await;
    let stranger = f
        .pki
        .other_client("spiffe://cluster.local/ns/default/sa/stranger");
    let (cert, key) = (f.pki.path("stranger.pem"), f.pki.path("stranger.key"));
    std::fs::write(&cert, &stranger.cert_pem).expect("stranger cert");
    std::fs::write(&key, &stranger.key_pem).expect("stranger key");
    let https = f.running.https;
    let url = format!("https://{WORKER_NAME}:{}/hello", https.port());

    let https_run = |cert: &Path, key: &Path, extra: &[&str]| {
        let mut args = https_args(&f.pki, cert, key);
        args.extend(resolve(https));
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend([
            "-H".into(),
            "ate-target-actor: team-a/alpha".into(),
            url.clone(),
        ]);
        curl(args)
    };
    let connect_run = |cert: &Path, key: &Path| {
        let mut args = proxy_args(&f.pki, f.running.connect, cert, key);
        args.extend([
            "--proxy-header".into(),
            "ate-target-actor: team-a/alpha".into(),
            format!("http://actor:{ACTOR_PORT}/hello"),
        ]);
        curl(args)
    };

    // The same commands with the router's identity get through, so the
    // refusals below are the certificate's doing.
    let router = (f.pki.path("router.pem"), f.pki.path("router.key"));
    for run in [
        https_run(&router.0, &router.1, &[]).await,
        https_run(&router.0, &router.1, &["--tls-max", "1.2"]).await,
        connect_run(&router.0, &router.1).await,
    ] {
        assert!(run.ok(), "router identity refused: {run:?}");
        f.seen.recv().await.expect("the actor saw the request");
    }

    // TLS 1.2: the server checks the client's certificate inside the
    // handshake, so curl's handshake fails (35) on the server's alert.
    let run = https_run(&cert, &key, &["--tls-max", "1.2"]).await;
    assert_eq!(run.code, Some(35), "https, TLS 1.2: {run:?}");
    assert!(run.stderr.contains("alert"), "https, TLS 1.2: {run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");

    // TLS 1.3: the client's handshake completes before the server has seen
    // its certificate; the alert arrives with curl's first read (56).
    let run = connect_run(&cert, &key).await;
    assert!(matches!(run.code, Some(35 | 56)), "connect: {run:?}");
    assert!(run.stderr.contains("alert"), "connect: {run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");

    // TLS 1.3 to the HTTPS listener: refused as well. curl 7.88 sometimes
    // fails first on getpeername() (55) instead of showing the alert, even
    // though ingress half-closes and drains after its alert; either way
    // nothing reaches the actor.
    let run = https_run(&cert, &key, &[]).await;
    assert!(matches!(run.code, Some(35 | 55 | 56)), "https: {run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");

    assert!(
        f.seen.try_recv().is_err(),
        "a stranger's request reached the actor"
    );
}
