//! Ingress isolation on one router connection, through real mTLS and
//! HTTP/2 from the router to loopback actors: request bodies an actor never
//! reads hold only their own streams' windows, never the window the
//! connection's other actors need.

use atunnel_support::prelude::*;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use atunnel_connect::limits::PROXY_STREAM_WINDOW;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::{Notify, mpsc};

/// Uploads to the actor that never reads, each longer than a stream window.
const STALLED_UPLOADS: usize = 8;
const STALLED_BODY: usize = 1024 * 1024;
/// The other actor's upload, larger than a stream window too.
const BODY: usize = 512 * 1024;
/// Most the other actor's upload may take: it moves 512 KiB on loopback.
const SERVED_WITHIN: Duration = Duration::from_secs(5);
/// Most the set-up may take on a loaded machine.
const SETUP_WITHIN: Duration = Duration::from_secs(20);

/// An actor that accepts connections, keeps them open and never reads
/// them, with the smallest receive buffer, so that little of a body hides
/// in its socket. Each accept is reported.
async fn deaf_actor() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    // Set on the listener so that accepted sockets start with it.
    socket.set_recv_buffer_size(1).expect("SO_RCVBUF");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(64).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let (accepted, accepts) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            open.push(tcp);
            let _ = accepted.send(());
        }
    });
    (addr, accepts)
}

/// An actor that reads each body whole and answers its length and digest
/// (or why it has none).
async fn digest_actor() -> SocketAddr {
    http1_actor(|req: http::Request<hyper::body::Incoming>| async move {
        let answer = match req.into_body().collect().await {
            Ok(body) => {
                let body = body.to_bytes();
                format!("{} {:016x}", body.len(), fnv1a(&body))
            }
            Err(e) => format!("the body broke off: {e}"),
        };
        http::Response::new(Full::new(Bytes::from(answer)))
    })
    .await
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn post(actor: &str) -> http::Request<()> {
    http::Request::post(format!("https://{WORKER_NAME}/upload"))
        .header("ate-target-actor", format!("team-a/{actor}"))
        .body(())
        .expect("request")
}

/// Bytes sent so far by some uploads, and a signal at each send.
#[derive(Default)]
struct Sent {
    bytes: AtomicUsize,
    more: Notify,
}

impl Sent {
    fn get(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    async fn at_least(&self, n: usize) {
        loop {
            let more = self.more.notified();
            if self.get() >= n {
                return;
            }
            more.await;
        }
    }
}

/// Sends `body` on `send` as h2's flow control lets it, counting what was
/// sent in `sent`; it waits for window as long as the peer grants none.
async fn stream_body(
    mut send: h2::SendStream<Bytes>,
    body: Bytes,
    sent: &Sent,
) -> Result<(), h2::Error> {
    let mut at = 0;
    while at < body.len() {
        send.reserve_capacity(body.len() - at);
        let granted = match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(granted) => granted?,
            None => return Ok(()),
        };
        let n = granted.min(body.len() - at);
        if n == 0 {
            continue;
        }
        send.send_data(body.slice(at..at + n), at + n == body.len())?;
        at += n;
        sent.bytes.fetch_add(n, Ordering::SeqCst);
        sent.more.notify_waiters();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_bodies_of_one_actor_do_not_stall_another_on_the_same_connection() {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let (deaf, mut accepts) = deaf_actor().await;
    activate_loopback(&running.ingress, "alpha", "uid-1", deaf.port());
    activate_loopback(
        &running.ingress,
        "beta",
        "uid-2",
        digest_actor().await.port(),
    );
    let mut router = h2_router(&pki, running.https).await;

    // alpha's uploads: each sends what its window allows, then waits for
    // more, which alpha never makes room for.
    let stalled_sent = Arc::new(Sent::default());
    let mut held = Vec::new();
    for _ in 0..STALLED_UPLOADS {
        router = router.ready().await.expect("ready");
        let (response, send) = router.send_request(post("alpha"), false).expect("send");
        let sent = stalled_sent.clone();
        let body = Bytes::from(vec![b'a'; STALLED_BODY]);
        tokio::spawn(async move { stream_body(send, body, &sent).await });
        held.push(response);
    }
    // Every upload reached alpha, and together they were sent four stream
    // windows: the whole connection window, were it only four windows.
    tokio::time::timeout(SETUP_WITHIN, async {
        for _ in 0..STALLED_UPLOADS {
            accepts.recv().await.expect("alpha accepts");
        }
    })
    .await
    .expect("every upload to alpha reached it");
    tokio::time::timeout(
        SETUP_WITHIN,
        stalled_sent.at_least(4 * PROXY_STREAM_WINDOW as usize),
    )
    .await
    .expect("alpha's uploads took their windows");

    // beta's upload, on the same connection, goes through whole.
    let body: Bytes = (0..BODY)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let expected = format!("{} {:016x}", body.len(), fnv1a(&body));
    let beta_sent = Sent::default();
    let served = tokio::time::timeout(SERVED_WITHIN, async {
        router = router.ready().await.expect("ready");
        let (response, send) = router.send_request(post("beta"), false).expect("send");
        stream_body(send, body, &beta_sent).await.expect("upload");
        let response = response.await.expect("response");
        assert_eq!(response.status(), 200);
        let mut answer = response.into_body();
        let mut text = Vec::new();
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.expect("answer");
            let _ = answer.flow_control().release_capacity(chunk.len());
            text.extend_from_slice(&chunk);
        }
        String::from_utf8(text).expect("text")
    })
    .await;
    let answer = served.unwrap_or_else(|_| {
        panic!(
            "beta's upload stalled behind alpha's unread ones: {} of {BODY} bytes sent \
             in {SERVED_WITHIN:?}, alpha's uploads sent {}",
            beta_sent.get(),
            stalled_sent.get(),
        )
    });
    assert_eq!(answer, expected, "beta received the body intact");
    // alpha's streams stayed open throughout.
    drop(held);
}
