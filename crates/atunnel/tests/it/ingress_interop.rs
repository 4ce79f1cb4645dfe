//! Ingress HTTPS against real clients, not our own: `curl --http2` and
//! `curl --http1.1` with the router's client certificate, and `nghttp`
//! (Debian's nghttp2-client). Each uploads 1 MiB of known bytes to an actor
//! that echoes them, and the answer must be those bytes: both directions
//! checked end to end, through real TLS and the clients' own HTTP stacks.
//!
//! Without curl or nghttp these tests say so and pass, unless
//! `ATUNNEL_REQUIRE_PEERS=1` (`.ci/run` sets it after installing them):
//! then a missing client fails the test and names its package.

use atunnel_support::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

use http_body_util::Full;

const ACTOR: &str = "team-a/alpha";

/// The client program on PATH, or None (failing when clients are required).
fn client(program: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("ATUNNEL_REQUIRE_PEERS").is_none_or(|v| v != "1"),
            "ATUNNEL_REQUIRE_PEERS=1 and {program} is not installed (Debian: apt-get install {package})"
        );
        eprintln!("not run: {program} is not installed (Debian: apt-get install {package})");
    }
    found
}

/// An ingress with `team-a/alpha` active, its port 80 an HTTP/1.1 actor
/// answering every request with the body it was sent, and the router
/// header it must not see (`ate-target-actor`) reported if it arrives.
async fn echoing_ingress(pki: &IngressPki) -> RunningIngress {
    let running = ingress(pki).await;
    let actor = http1_actor(|req: http::Request<hyper::body::Incoming>| async move {
        let leaked = req.headers().contains_key("ate-target-actor");
        let xff = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = whole_body(req).await;
        http::Response::builder()
            .header("x-seen-forwarded-for", xff)
            .header("x-saw-routing-header", leaked.to_string())
            .body(Full::new(body))
            .expect("response")
    })
    .await;
    running.activate_alpha(&[(80, actor.port())]);
    running
}

/// 1 MiB that no off-by-a-chunk mistake reproduces.
fn upload_file(dir: &Path) -> (PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0u32..1 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let path = dir.join("upload.bin");
    std::fs::write(&path, &data).expect("write upload");
    (path, data)
}

/// Runs `cmd` off the runtime (the ingress serves it on this runtime's
/// threads); its stdout, failing with its stderr when it fails.
async fn run(mut cmd: Command) -> Vec<u8> {
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

async fn curl_echo(http: &str) {
    let Some(curl) = client("curl", "curl") else {
        return;
    };
    let pki = IngressPki::new();
    let running = echoing_ingress(&pki).await;
    let (upload, data) = upload_file(pki.dir.path());
    let headers = pki.path(&format!("headers-{http}.txt"));
    let port = running.https.port();
    let mut cmd = Command::new(curl);
    cmd.args(["--silent", "--show-error", "--fail", http])
        .arg("--resolve")
        .arg(format!("{WORKER_NAME}:{port}:127.0.0.1"))
        .arg("--cacert")
        .arg(pki.trust_path())
        .arg("--cert")
        .arg(pki.path("router.pem"))
        .arg("--key")
        .arg(pki.path("router.key"))
        .args(["-H", &format!("ate-target-actor: {ACTOR}")])
        .args(["-H", "content-type: application/octet-stream"])
        .arg("--data-binary")
        .arg(format!("@{}", upload.display()))
        .arg("--dump-header")
        .arg(&headers)
        .arg(format!("https://{WORKER_NAME}:{port}/echo"));
    let answer = run(cmd).await;
    assert!(
        answer == data,
        "{http}: {} bytes came back, not the {} sent (or altered)",
        answer.len(),
        data.len()
    );
    let head = std::fs::read_to_string(&headers)
        .expect("headers")
        .to_ascii_lowercase();
    let version = if http == "--http2" {
        "http/2 200"
    } else {
        "http/1.1 200"
    };
    assert!(head.starts_with(version), "{http}: {head}");
    assert!(head.contains("x-saw-routing-header: false"), "{head}");
    assert!(head.contains("x-seen-forwarded-for: 127.0.0.1"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_http2_with_a_client_certificate_gets_its_upload_back() {
    curl_echo("--http2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_http1_1_with_a_client_certificate_gets_its_upload_back() {
    curl_echo("--http1.1").await;
}

/// `nghttp` with the router's certificate, addressing `actor`.
fn nghttp_as_router(nghttp: &Path, pki: &IngressPki, actor: &str) -> Command {
    let mut cmd = Command::new(nghttp);
    cmd.arg(format!("--cert={}", pki.path("router.pem").display()))
        .arg(format!("--key={}", pki.path("router.key").display()))
        .arg(format!("--header=ate-target-actor: {actor}"));
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nghttp_with_a_client_certificate_gets_its_upload_back() {
    let Some(nghttp) = client("nghttp", "nghttp2-client") else {
        return;
    };
    let pki = IngressPki::new();
    let running = echoing_ingress(&pki).await;
    let (upload, data) = upload_file(pki.dir.path());
    let mut cmd = nghttp_as_router(&nghttp, &pki, ACTOR);
    cmd.arg(format!("--data={}", upload.display()))
        .arg(format!("https://127.0.0.1:{}/echo", running.https.port()));
    let answer = run(cmd).await;
    assert!(
        answer == data,
        "{} bytes came back, not the {} sent (or altered)",
        answer.len(),
        data.len()
    );
    // A routing mistake is a 421 with an empty body: checked to fail here,
    // so the echo above is the actor's and not an error page.
    let mut stale = nghttp_as_router(&nghttp, &pki, "team-a/nobody");
    stale
        .arg("--stat")
        .arg("-v")
        .arg(format!("https://127.0.0.1:{}/echo", running.https.port()));
    let out = String::from_utf8_lossy(&run(stale).await).into_owned();
    assert!(out.contains(":status: 421"), "{out}");
}
