//! Ingress CONNECT with real peers: HTTP/1.1 CONNECT over TLS and HTTP/2
//! CONNECT streams from the router, relayed into an actor with half-close.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::{BufferPool, H2Stream};
use bytes::Bytes;
use support::ingress::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An actor that echoes until the client half-closes, then says how many
/// bytes it got and closes.
async fn counting_echo_actor() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut total = 0usize;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            total += n;
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.write_all(format!("|{total}").as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

struct Fixture {
    pki: IngressPki,
    running: RunningIngress,
}

/// `team-a/alpha` active; its port 8080 is the counting echo actor.
async fn fixture() -> Fixture {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let actor = counting_echo_actor().await;
    running.activate_alpha(&[(8080, actor.port())]);
    Fixture { pki, running }
}

/// Sends an HTTP/1.1 request head over TLS and returns the stream and the
/// response head.
async fn h1_connect(
    f: &Fixture,
    head: &str,
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    String,
) {
    let mut tls = router_tls(&f.pki, f.running.connect, None, None, &[b"http/1.1"])
        .await
        .expect("TLS");
    tls.write_all(head.as_bytes()).await.expect("write head");
    let head = atunnel::http1::read_head(&mut tls)
        .await
        .expect("response head");
    (tls, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connect_relays_both_ways_with_half_close() {
    let f = fixture().await;
    let (mut tls, head) = h1_connect(
        &f,
        "CONNECT actor:8080 HTTP/1.1\r\nHost: actor:8080\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let data = support::random(2 << 20, 4);
    tls.write_all(&data).await.expect("write");
    // Half-close: TLS close_notify, the actor sees EOF and still answers.
    tls.shutdown().await.expect("close_notify");
    let mut back = Vec::new();
    tls.read_to_end(&mut back).await.expect("read");
    let tail = format!("|{}", data.len());
    assert!(
        back.ends_with(tail.as_bytes()),
        "actor's answer after our half-close is missing"
    );
    assert!(back[..data.len()] == data[..], "echo corrupted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connect_relays_both_ways_with_half_close() {
    let f = fixture().await;
    let tls = router_tls(&f.pki, f.running.connect, None, None, &[b"h2"])
        .await
        .expect("TLS");
    let (mut send_request, conn) = h2::client::handshake(tls).await.expect("h2");
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("actor:8080")
        .header("ate-target-actor", "team-a/alpha")
        .body(())
        .expect("request");
    let (resp, send) = send_request.send_request(req, false).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut stream = H2Stream::new(send, resp.into_body());
    let pool = BufferPool::default();
    let data = support::random(1 << 20, 5);
    atunnel_core::endpoint::write_chunk(
        &mut stream,
        atunnel_core::Chunk::Shared(Bytes::from(data.clone())),
    )
    .await
    .expect("write");
    atunnel_core::endpoint::close_write(&mut stream)
        .await
        .expect("END_STREAM");
    let mut back = Vec::new();
    while let Some(chunk) = atunnel_core::endpoint::read_chunk(&mut stream, &pool)
        .await
        .expect("read")
    {
        back.extend_from_slice(chunk.remaining());
        stream_consumed(&mut stream, chunk.len());
    }
    assert!(back.ends_with(format!("|{}", data.len()).as_bytes()));
    assert!(back[..data.len()] == data[..]);
}

fn stream_consumed(s: &mut H2Stream, n: usize) {
    atunnel_core::Endpoint::consumed(s, n);
}

#[tokio::test]
async fn connect_refusals_have_their_status() {
    let f = fixture().await;
    let cases = [
        (
            "GET / HTTP/1.1\r\nHost: x\r\nate-target-actor: team-a/alpha\r\n\r\n",
            "405",
            false,
        ),
        (
            "CONNECT actor:8080 HTTP/1.1\r\nHost: actor:8080\r\n\r\n",
            "421",
            true,
        ),
        (
            "CONNECT actor:8080 HTTP/1.1\r\nate-target-actor: team-a/nobody\r\n\r\n",
            "421",
            true,
        ),
        (
            "CONNECT actor HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n",
            "400",
            false,
        ),
        (
            "CONNECT actor:0 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n",
            "400",
            false,
        ),
    ];
    for (head, status, stale) in cases {
        let (_tls, answer) = h1_connect(&f, head).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{head:?} -> {answer}"
        );
        assert_eq!(
            answer
                .to_ascii_lowercase()
                .contains("x-ate-assignment-stale: true"),
            stale,
            "{answer}"
        );
    }
    // A port nobody listens on: 502.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let head = format!("CONNECT actor:{closed} HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n");
    let (_tls, answer) = h1_connect(&f, &head).await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_holds_no_buffer_and_deactivation_closes_it() {
    let f = fixture().await;
    let (mut tls, head) = h1_connect(
        &f,
        "CONNECT actor:8080 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"));
    tls.write_all(b"ping").await.expect("write");
    let mut got = [0u8; 4];
    tls.read_exact(&mut got).await.expect("echo");
    // Idle now: the relay returns its buffer once the write completes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while f.running.pool.stats().in_use > 0 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        f.running.pool.stats().in_use,
        0,
        "an idle tunnel holds a buffer"
    );

    f.running
        .ingress
        .deactivate("team-a", "alpha", "uid-1")
        .await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the tunnel outlived its actor's deactivation"
    );
}
