//! The `atunnel` binary's own heap (its counting allocator, read from
//! /stats) while 100 MiB go up and 100 MiB come down through ingress.

use atunnel_support::prelude::*;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atunnel::host::HostReady;
use atunnel_support::stats_client::fetch_stats;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};

static CHUNK: [u8; 64 * 1024] = [b'z'; 64 * 1024];
const N: u64 = 100 << 20;

fn sized_body(
    n: u64,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
    StreamBody::new(futures_util::stream::unfold(0u64, move |done| async move {
        if done >= n {
            return None;
        }
        let len = (n - done).min(CHUNK.len() as u64) as usize;
        Some((
            Ok(Frame::data(Bytes::from_static(&CHUNK[..len]))),
            done + len as u64,
        ))
    }))
}

/// `/download/N` streams N bytes; anything else counts the request body.
async fn actor() -> SocketAddr {
    http1_actor(|req: http::Request<Incoming>| async move {
        let body = match req.uri().path().strip_prefix("/download/") {
            Some(n) => sized_body(n.parse().expect("size")).boxed(),
            None => count_body(req).await.boxed(),
        };
        http::Response::new(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atunnel_heap_stays_flat_while_100_mib_go_each_way() {
    let pki = IngressPki::new();
    let gw_pki = Pki::new();
    let (_child, ready): (_, HostReady) = spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .args([
                "host",
                "--network=loopback",
                "--actors=1",
                "--gateway=127.0.0.1:1",
            ])
            .args(gw_pki.write_ca_files(pki.dir.path()).args())
            .arg("--destinations=192.0.2.10:7")
            .arg("--ingress-https=127.0.0.1:0")
            .arg("--ingress-connect=127.0.0.1:0")
            .arg(format!(
                "--credential-bundle={}",
                pki.bundle_path().display()
            ))
            .arg(format!("--trust-bundle={}", pki.trust_path().display())),
    )
    .await;
    let (https, _) = ready.ingress.expect("ingress is on");
    let actor = actor().await;
    let port = actor.port().to_string();
    let request = |method: &str, path: &str| {
        http::Request::builder()
            .method(method)
            .uri(format!("https://{WORKER_NAME}{path}"))
            .header("ate-target-actor", "bench/actor-0")
            .header("x-ate-target-port", port.as_str())
    };

    let mut conn = RouterConn::open(&pki, https, false).await;
    // Warm-up, so steady per-connection buffers are in the baseline.
    let warm = conn
        .send(
            request("GET", "/download/1000000")
                .body(http_body_util::Full::new(Bytes::new()))
                .expect("req"),
        )
        .await
        .expect("warm");
    assert_eq!(warm.status(), 200);
    let _ = warm.into_body().collect().await;
    let mut up = h1_router(&pki, https).await;
    let warm = up
        .send_request(
            request("POST", "/upload")
                .body(sized_body(1_000_000))
                .expect("req"),
        )
        .await
        .expect("warm upload");
    let _ = warm.into_body().collect().await;
    let baseline = fetch_stats(ready.stats, true)
        .await
        .expect("stats")
        .process
        .heap_bytes as u64;

    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        let stats = ready.stats;
        tokio::spawn(async move {
            loop {
                if let Ok(s) = fetch_stats(stats, false).await {
                    peak.fetch_max(s.process.heap_bytes as u64, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // Up: 100 MiB streamed from a static buffer. The connection takes the
    // next request only once its task has finished the last exchange.
    up.ready().await.expect("ready for the upload");
    let resp = up
        .send_request(request("POST", "/upload").body(sized_body(N)).expect("req"))
        .await
        .expect("upload answered");
    let counted = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(counted, N.to_string().as_bytes());
    // Down: 100 MiB, consumed as it arrives.
    let got = conn
        .download_len(request("GET", &format!("/download/{N}")))
        .await;
    assert_eq!(got, N);
    sampler.abort();
    let growth = peak.load(Ordering::Relaxed).saturating_sub(baseline);
    println!("atunnel heap: baseline {baseline} B, peak growth {growth} B moving 100 MiB each way");
    // Measured 131-268 KB over 18 runs (docs/design.md gives ~213 KB; this
    // test with --nocapture prints it). Without the 64 KiB HTTP/1.1 buffer
    // cap each hyper buffer may grow to ~408 KiB, which this bound catches.
    assert!(growth < 512 << 10, "atunnel's heap grew {growth} bytes");
    // /stats reports the listeners' unauthenticated connections: none now,
    // none refused.
    let pre_auth = fetch_stats(ready.stats, false)
        .await
        .expect("stats")
        .pre_auth
        .expect("ingress pre-authentication figures");
    for (listener, figures) in [("https", pre_auth.https), ("connect", pre_auth.connect)] {
        assert_eq!(
            (figures.handshaking, figures.refused_total),
            (0, 0),
            "{listener}: {figures:?}"
        );
    }
}
