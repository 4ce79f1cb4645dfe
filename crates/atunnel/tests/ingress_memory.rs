//! Ingress memory under load: bodies stream with bounded memory, and a
//! router that stops reading does not make atunnel queue data. The heap is
//! this whole test process's (router client, atunnel and actor together),
//! read from the counting allocator, so each bound covers atunnel with room
//! to spare for the peers.

use atunnel_support::prelude::*;
use std::alloc::System;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

static CHUNK: [u8; 64 * 1024] = [b'z'; 64 * 1024];

/// A body of `n` bytes (or endless) from a static buffer: the body itself
/// allocates nothing per chunk, so heap growth is the proxy's.
fn static_body(
    n: Option<u64>,
    sent: Arc<AtomicU64>,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
    let chunks = futures_util::stream::unfold(0u64, move |done| {
        let sent = sent.clone();
        async move {
            let len = match n {
                Some(n) if done >= n => return None,
                Some(n) => (n - done).min(CHUNK.len() as u64) as usize,
                None => CHUNK.len(),
            };
            sent.fetch_add(len as u64, Ordering::Relaxed);
            Some((
                Ok(Frame::data(Bytes::from_static(&CHUNK[..len]))),
                done + len as u64,
            ))
        }
    });
    StreamBody::new(chunks)
}

/// An actor: `/endless` streams forever, `/download/N` streams N bytes,
/// anything else counts the request body.
async fn actor(sent: Arc<AtomicU64>) -> SocketAddr {
    http1_actor(move |req: http::Request<Incoming>| {
        let sent = sent.clone();
        async move {
            let path = req.uri().path().to_string();
            let body = if path == "/endless" {
                static_body(None, sent).boxed()
            } else if let Some(n) = path.strip_prefix("/download/") {
                static_body(Some(n.parse().expect("size")), sent).boxed()
            } else {
                count_body(req).await.boxed()
            };
            http::Response::new(body)
        }
    })
    .await
}

/// Waits until `counter` has not moved for 300 ms (the writer is blocked).
async fn until_stalled(counter: &AtomicU64) -> u64 {
    let mut last = counter.load(Ordering::Relaxed);
    let mut still = 0;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counter.load(Ordering::Relaxed);
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 6 {
            return now;
        }
    }
    panic!("the writer never stalled: {last} bytes sent to a reader that stopped");
}

async fn fixture(sent: Arc<AtomicU64>) -> (IngressPki, RunningIngress) {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let actor = actor(sent).await;
    running.activate_alpha(&[(80, actor.port())]);
    (pki, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_stops_reading_a_response_leaves_the_heap_bounded() {
    let _alone = HEAP_MEASURING.lock().await;
    for h2 in [false, true] {
        let sent = Arc::new(AtomicU64::new(0));
        let (pki, running) = fixture(sent.clone()).await;
        let mut conn = RouterConn::open(&pki, running.https, h2).await;
        let baseline = live_bytes();
        let req = http::Request::builder()
            .uri(format!("https://{WORKER_NAME}/endless"))
            .header("ate-target-actor", "team-a/alpha")
            .body(http_body_util::Full::new(Bytes::new()))
            .expect("request");
        let resp = conn.send(req).await.expect("response headers");
        assert_eq!(resp.status(), 200);
        // Read nothing more.
        let stalled_at = until_stalled(&sent).await;
        let growth = live_bytes().saturating_sub(baseline);
        println!("h2={h2}: actor stalled after {stalled_at} bytes; heap grew {growth} bytes");
        assert!(
            growth < 4 << 20,
            "h2={h2}: heap grew {growth} bytes behind a reader that stopped"
        );
        drop(resp);
    }
}

/// An h2c (gRPC) actor whose every call streams `/N` bytes back; served on
/// [`GRPC_PORT`].
async fn grpc_actor(sent: Arc<AtomicU64>) -> SocketAddr {
    h2c_actor(move |req: http::Request<Incoming>| {
        let n = req.uri().path().trim_start_matches('/').parse().ok();
        std::future::ready(http::Response::new(static_body(n, sent.clone())))
    })
    .await
}

/// Opens a gRPC call for `/n` bytes from [`grpc_actor`] and returns its
/// response body, not read.
async fn grpc_call(router: &mut h2::client::SendRequest<Bytes>, n: u64) -> h2::RecvStream {
    let req = grpc_to_alpha(&format!("https://app.example.com/{n}"))
        .body(())
        .expect("request");
    router.clone().ready().await.expect("router ready");
    let (resp, _) = router.send_request(req, true).expect("call");
    let resp = resp.await.expect("response headers");
    assert_eq!(resp.status(), 200);
    resp.into_body()
}

/// gRPC server streams through atunnel's h2c client: a router that stops
/// reading them leaves atunnel holding at most its receive windows toward
/// the actor (256 KiB a stream); with hyper's default 2 MiB it held 2 MiB
/// per stream, up to 5 MiB per actor connection. The router keeps h2's
/// default 64 KiB windows, so it holds little itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_stops_reading_grpc_streams_leaves_the_heap_bounded() {
    let _alone = HEAP_MEASURING.lock().await;
    const STREAMS: usize = 2;
    let sent = Arc::new(AtomicU64::new(0));
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    running.activate_alpha(&[(GRPC_PORT, grpc_actor(sent.clone()).await.port())]);
    let mut router = h2_router(&pki, running.https).await;
    // The actor connection and its pool exist before the baseline.
    let mut warm = grpc_call(&mut router, 1000).await;
    let mut got = 0;
    while let Some(data) = warm.data().await {
        let data = data.expect("warm-up data");
        got += data.len();
        let _ = warm.flow_control().release_capacity(data.len());
    }
    assert_eq!(got, 1000);

    let baseline = live_bytes();
    let mut unread = Vec::new();
    for _ in 0..STREAMS {
        unread.push(grpc_call(&mut router, 64 << 20).await);
    }
    let stalled_at = until_stalled(&sent).await;
    let growth = live_bytes().saturating_sub(baseline);
    println!(
        "gRPC: {STREAMS} streams stalled after {stalled_at} bytes in all; heap grew {growth} bytes"
    );
    assert!(
        growth < 2 << 20,
        "heap grew {growth} bytes behind {STREAMS} gRPC streams a router stopped reading"
    );
    drop(unread);
}

/// An actor port that writes as fast as it can to whoever connects.
async fn flooding_actor(flooded: Arc<AtomicU64>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let flooded = flooded.clone();
            tokio::spawn(async move {
                while s.write_all(&CHUNK).await.is_ok() {
                    flooded.fetch_add(CHUNK.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    port
}

/// The router's side of a tunnel it opened and then stopped reading, kept
/// open until dropped.
type StalledTunnel = Box<dyn std::any::Any + Send>;

/// Opens a CONNECT tunnel to `team-a/alpha` port 9000 and reads nothing of
/// it. Over HTTP/2 the router keeps its default 64 KiB windows, which it
/// never returns.
async fn stalled_tunnel(pki: &IngressPki, running: &RunningIngress, h2: bool) -> StalledTunnel {
    if h2 {
        let mut router = h2_router(pki, running.connect).await;
        Box::new(h2_tunnel(&mut router, "alpha", 9000).await)
    } else {
        Box::new(h1_tunnel(pki, running.connect, "alpha", 9000).await)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_stops_reading_a_tunnel_leaves_the_heap_bounded() {
    let _alone = HEAP_MEASURING.lock().await;
    for h2 in [false, true] {
        let flooded = Arc::new(AtomicU64::new(0));
        let pki = IngressPki::new();
        let running = ingress(&pki).await;
        running.activate_alpha(&[(9000, flooding_actor(flooded.clone()).await)]);
        let baseline = live_bytes();
        let tunnel = stalled_tunnel(&pki, &running, h2).await;
        let stalled_at = until_stalled(&flooded).await;
        let growth = live_bytes().saturating_sub(baseline);
        println!(
            "CONNECT h2={h2}: actor stalled after {stalled_at} bytes; heap grew {growth} bytes; \
             relay buffers out: {}",
            running.pool.stats().in_use
        );
        assert!(
            growth < 2 << 20,
            "h2={h2}: heap grew {growth} bytes behind a tunnel reader that stopped"
        );
        assert!(
            running.pool.stats().in_use <= 1,
            "h2={h2}: one stalled direction holds at most one buffer"
        );
        drop(tunnel);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_mib_up_and_down_stream_with_bounded_heap() {
    let _alone = HEAP_MEASURING.lock().await;
    const N: u64 = 100 << 20;
    let sent = Arc::new(AtomicU64::new(0));
    let (pki, running) = fixture(sent.clone()).await;
    let mut conn = RouterConn::open(&pki, running.https, false).await;
    // Warm the connections so their steady buffers are in the baseline.
    let warm = http::Request::builder()
        .uri(format!("https://{WORKER_NAME}/download/1000000"))
        .header("ate-target-actor", "team-a/alpha")
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    let _ = conn
        .send(warm)
        .await
        .expect("warm")
        .into_body()
        .collect()
        .await;

    let baseline = live_bytes();
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(live_bytes() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // Upload: a 100 MiB streaming body; the actor counts it.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let feeder = tokio::spawn(async move {
        let mut left = N;
        while left > 0 {
            let len = left.min(CHUNK.len() as u64) as usize;
            if tx
                .send(Ok(Frame::data(Bytes::from_static(&CHUNK[..len]))))
                .await
                .is_err()
            {
                return;
            }
            left -= len as u64;
        }
    });
    let up_body = StreamBody::new(Feed(rx));
    let mut up_conn = RouterConnStream::open(&pki, running.https).await;
    let resp = up_conn
        .send(
            http::Request::builder()
                .method("POST")
                .uri(format!("https://{WORKER_NAME}/upload"))
                .header("ate-target-actor", "team-a/alpha")
                .body(up_body)
                .expect("request"),
        )
        .await;
    feeder.await.expect("feeder");
    let counted =
        String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes())
            .into_owned();
    assert_eq!(counted, N.to_string());
    // Download: 100 MiB, consumed frame by frame.
    let got = conn
        .download_len(
            http::Request::builder()
                .uri(format!("https://{WORKER_NAME}/download/{N}"))
                .header("ate-target-actor", "team-a/alpha"),
        )
        .await;
    assert_eq!(got, N);
    sampler.abort();
    let growth = peak.load(Ordering::Relaxed).saturating_sub(baseline as u64);
    println!("100 MiB up and down: peak heap growth {growth} bytes (whole process)");
    assert!(
        growth < 3 << 20,
        "peak heap grew {growth} bytes moving 100 MiB each way"
    );
}

/// Frames fed from a channel, so the upload streams without being held whole.
struct Feed(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl futures_util::Stream for Feed {
    type Item = Result<Frame<Bytes>, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// An h1 router connection whose request bodies stream from a [`Feed`].
struct RouterConnStream(hyper::client::conn::http1::SendRequest<StreamBody<Feed>>);

impl RouterConnStream {
    async fn open(pki: &IngressPki, addr: SocketAddr) -> Self {
        Self(h1_router(pki, addr).await)
    }

    async fn send(&mut self, req: http::Request<StreamBody<Feed>>) -> http::Response<Incoming> {
        self.0.ready().await.expect("ready");
        self.0.send_request(req).await.expect("response")
    }
}
