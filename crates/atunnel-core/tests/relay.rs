//! The relay over real loopback sockets and a real HTTP/2 connection.

mod common;

use std::time::Duration;

use atunnel_core::endpoint::WaitBuffered;
use atunnel_core::{BufferPool, Endpoint, H2Stream, RelayStats, relay};
use common::tcp_pair;
use rand::{Rng, RngCore, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// The outer ends of a relayed pair and the task running the relay.
type Relayed = (
    TcpStream,
    TcpStream,
    JoinHandle<std::io::Result<RelayStats>>,
);

/// `outer_a <-> [relay] <-> outer_b`, relay running in its own task.
async fn relayed(pool: &BufferPool) -> Relayed {
    relayed_via(pool, |s| s).await
}

/// As [`relayed`], with each of the relay's sockets made a side by `side`.
async fn relayed_via<E>(pool: &BufferPool, side: impl Fn(TcpStream) -> E) -> Relayed
where
    E: Endpoint + Send + 'static,
{
    let (outer_a, a) = tcp_pair().await;
    let (b, outer_b) = tcp_pair().await;
    let (mut a, mut b) = (side(a), side(b));
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        relay(&mut a, &mut b, &pool)
            .await
            .map_err(std::io::Error::other)
    });
    (outer_a, outer_b, task)
}

fn random_bytes(rng: &mut impl RngCore, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// Sends `data` on `tx`'s write half and returns everything `rx` reads until EOF.
async fn send_and_collect(
    tx: TcpStream,
    rx: TcpStream,
    data: Vec<u8>,
) -> (Vec<u8>, TcpStream, TcpStream) {
    let (mut tx_r, mut tx_w) = tx.into_split();
    let (mut rx_r, rx_w) = rx.into_split();
    let writer = async move {
        tx_w.write_all(&data).await.expect("write");
        tx_w.shutdown().await.expect("shutdown");
        tx_w
    };
    let reader = async move {
        let mut got = Vec::new();
        rx_r.read_to_end(&mut got).await.expect("read");
        (got, rx_r)
    };
    let (tx_w, (got, rx_r)) = tokio::join!(writer, reader);
    let _ = &mut tx_r;
    (
        got,
        tx_r.reunite(tx_w).expect("same stream"),
        rx_r.reunite(rx_w).expect("same stream"),
    )
}

/// Sends `ab` from `a` and `ba` from `b` at once, each followed by a FIN,
/// and returns what arrived at `b` and at `a`. The first byte goes alone, so
/// a side may see a tiny read before a large one.
async fn both_ways(a: TcpStream, b: TcpStream, ab: &[u8], ba: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let send = |mut w: tokio::net::tcp::OwnedWriteHalf, data: Vec<u8>| async move {
        let split = data.len().min(1);
        w.write_all(&data[..split]).await.expect("write");
        w.write_all(&data[split..]).await.expect("write");
        w.shutdown().await.expect("shutdown");
        w
    };
    let read_all = |mut r: tokio::net::tcp::OwnedReadHalf| async move {
        let mut v = Vec::new();
        r.read_to_end(&mut v).await.expect("read");
        v
    };
    let (a_r, a_w) = a.into_split();
    let (b_r, b_w) = b.into_split();
    let send_a = tokio::spawn(send(a_w, ab.to_vec()));
    let send_b = tokio::spawn(send(b_w, ba.to_vec()));
    let (got_at_b, got_at_a) = tokio::join!(read_all(b_r), read_all(a_r));
    send_a.await.expect("a");
    send_b.await.expect("b");
    (got_at_b, got_at_a)
}

/// Polls `cond` until it holds; the condition is a pool counter another
/// task changes (a relay returns its buffer when it next polls), which we
/// cannot await directly.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until the pool has no buffer out.
async fn until_no_buffer_in_use(pool: &BufferPool) {
    until("no buffer is in use", || pool.stats().in_use == 0).await;
}

/// Opens a CONNECT stream on a new HTTP/2 client connection over `io` and
/// checks the peer answered 200; the connection runs in its own task.
async fn connect_stream(io: TcpStream) -> (H2Stream, JoinHandle<Result<(), h2::Error>>) {
    let (mut send_req, conn) = h2::client::handshake(io).await.expect("client handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("192.0.2.10:443")
        .body(())
        .expect("request");
    let (resp, send) = send_req.send_request(req, false).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    (H2Stream::new(send, resp.into_body()), conn)
}

/// The peer's side of [`connect_stream`]: accepts one stream on a new HTTP/2
/// server connection over `io`, checks it is a CONNECT and answers 200; the
/// connection runs in its own task.
async fn accept_connect(io: TcpStream) -> (h2::RecvStream, h2::SendStream<bytes::Bytes>) {
    let mut conn = h2::server::handshake(io).await.expect("server handshake");
    let (req, mut respond) = conn.accept().await.expect("a stream").expect("stream ok");
    tokio::spawn(async move { while conn.accept().await.is_some() {} });
    assert_eq!(req.method(), http::Method::CONNECT);
    let send = respond
        .send_response(http::Response::new(()), false)
        .expect("200");
    (req.into_body(), send)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_payloads_arrive_intact_both_ways_at_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let pool = BufferPool::new(32 * 1024, 64, 8);
    for round in 0..6 {
        let len_ab = if round == 0 {
            8 << 20
        } else {
            rng.random_range(0..=8 << 20)
        };
        let len_ba = rng.random_range(0..=8 << 20);
        let ab = random_bytes(&mut rng, len_ab);
        let ba = random_bytes(&mut rng, len_ba);
        let (outer_a, outer_b, task) = relayed(&pool).await;
        let (got_at_b, got_at_a) = both_ways(outer_a, outer_b, &ab, &ba).await;
        assert!(
            got_at_b == ab,
            "round {round}: a->b payload of {len_ab} bytes corrupted"
        );
        assert!(
            got_at_a == ba,
            "round {round}: b->a payload of {len_ba} bytes corrupted"
        );
        let stats = task.await.expect("join").expect("relay");
        assert_eq!(
            stats,
            RelayStats {
                a_to_b: len_ab as u64,
                b_to_a: len_ba as u64
            }
        );
    }
    assert_eq!(pool.stats().in_use, 0);
}

/// `closer` sends `first` and half-closes; `answerer`, having read it to its
/// end, can still send `answer`, which `closer` still receives.
async fn answered_after_half_close(
    closer: TcpStream,
    answerer: TcpStream,
    first: &[u8],
    answer: &[u8],
) {
    let (got, mut closer, mut answerer) = send_and_collect(closer, answerer, first.to_vec()).await;
    assert_eq!(got, first);
    answerer.write_all(answer).await.expect("write");
    answerer.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    closer.read_to_end(&mut rest).await.expect("read");
    assert_eq!(rest, answer);
}

#[tokio::test]
async fn half_close_from_a_keeps_b_to_a_flowing() {
    let pool = BufferPool::default();
    let (outer_a, outer_b, task) = relayed(&pool).await;
    // b saw EOF; it can still answer and a still receives.
    answered_after_half_close(outer_a, outer_b, b"request", b"response after FIN").await;
    let stats = task.await.expect("join").expect("relay");
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: 7,
            b_to_a: 18
        }
    );
}

#[tokio::test]
async fn half_close_from_b_keeps_a_to_b_flowing() {
    let pool = BufferPool::default();
    let (outer_a, outer_b, task) = relayed(&pool).await;
    answered_after_half_close(outer_b, outer_a, b"banner", b"late request").await;
    let stats = task.await.expect("join").expect("relay");
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: 12,
            b_to_a: 6
        }
    );
}

#[tokio::test]
async fn idle_tunnels_hold_no_buffer() {
    let pool = BufferPool::default();
    let mut tunnels = Vec::new();
    for _ in 0..50 {
        tunnels.push(relayed(&pool).await);
    }
    // Move some bytes through each, then let them go idle.
    for (a, b, _) in &mut tunnels {
        a.write_all(&[7u8; 100_000]).await.expect("write");
        let mut got = vec![0u8; 100_000];
        b.read_exact(&mut got).await.expect("read");
        assert!(got.iter().all(|&x| x == 7));
    }
    until_no_buffer_in_use(&pool).await;
    let s = pool.stats();
    assert_eq!(s.in_use, 0, "idle tunnels hold buffers: {s:?}");
    assert!(s.acquired_total > 0);
    for (_, _, t) in &tunnels {
        assert!(!t.is_finished());
    }
}

/// A tunnel whose reader stopped: it holds no pooled buffer (it read
/// only what b's socket had room for, or gave back the buffer of a write
/// left blocked).
async fn stalled(pool: &BufferPool) -> Relayed {
    let (mut a, b, task) = relayed(pool).await;
    let payload = vec![1u8; 64 << 20];
    // b never reads: the kernel queues fill and the write cannot finish.
    let write = a.write_all(&payload);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), write)
            .await
            .is_err(),
        "64 MiB fit in the kernel's queues: nothing stalled"
    );
    until("a stalled direction holds no buffer", || {
        pool.stats().in_use == 0
    })
    .await;
    assert!(!task.is_finished(), "the relay waits for b");
    (a, b, task)
}

#[tokio::test]
async fn buffer_returns_when_the_relay_is_cancelled() {
    let pool = BufferPool::default();
    let (_a, _b, task) = stalled(&pool).await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    assert_eq!(pool.stats().in_use, 0);
}

#[tokio::test]
async fn buffer_returns_when_the_peer_vanishes() {
    let pool = BufferPool::default();
    let (_a, b, task) = stalled(&pool).await;
    // RST instead of FIN: the relay's pending write fails.
    b.set_zero_linger().expect("linger");
    drop(b);
    let err = task
        .await
        .expect("join")
        .expect_err("write to a reset peer fails");
    assert!(err.to_string().contains("Write"), "{err}");
    assert_eq!(pool.stats().in_use, 0);
}

#[tokio::test]
async fn buffer_returns_after_eof() {
    let pool = BufferPool::default();
    let (a, b, task) = relayed(&pool).await;
    let (got, _a, _b) = send_and_collect(a, b, vec![9u8; 1 << 20]).await;
    assert_eq!(got.len(), 1 << 20);
    drop(_a);
    drop(_b);
    task.await.expect("join").expect("relay ends cleanly");
    assert_eq!(pool.stats().in_use, 0);
}

/// TCP on one side, an HTTP/2 stream on the other, over a real h2 connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_to_http2_stream_both_ways_with_half_close() {
    let pool = BufferPool::default();
    let (h2_client_io, h2_server_io) = tcp_pair().await;

    // Server: answers the CONNECT, then echoes the stream back.
    let server = tokio::spawn(async move {
        let (recv, send) = accept_connect(h2_server_io).await;
        let mut stream = H2Stream::new(send, recv);
        // Echo via a loopback TCP echo: relay h2 <-> tcp <-> echo.
        let (mut to_echo, mut echo) = tcp_pair().await;
        tokio::spawn(async move {
            let (mut r, mut w) = echo.split();
            tokio::io::copy(&mut r, &mut w).await.expect("echo");
            w.shutdown().await.expect("echo shutdown");
        });
        relay(&mut stream, &mut to_echo, &BufferPool::default())
            .await
            .expect("server relay")
    });

    let (mut stream, _client_conn) = connect_stream(h2_client_io).await;

    let (actor, mut inner) = tcp_pair().await;
    let relay_pool = pool.clone();
    let tunnel = tokio::spawn(async move {
        relay(&mut inner, &mut stream, &relay_pool)
            .await
            .expect("client relay")
    });

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let data = random_bytes(&mut rng, 3 << 20);
    let (actor_r, mut actor_w) = actor.into_split();
    let d2 = data.clone();
    let writer = tokio::spawn(async move {
        actor_w.write_all(&d2).await.expect("write");
        actor_w.shutdown().await.expect("FIN");
        actor_w
    });
    let mut got = Vec::new();
    let mut actor_r = actor_r;
    actor_r.read_to_end(&mut got).await.expect("read");
    writer.await.expect("writer");
    assert!(got == data, "echo through HTTP/2 corrupted");
    let stats = tunnel.await.expect("join");
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: data.len() as u64,
            b_to_a: data.len() as u64
        }
    );
    server.await.expect("server");
    // The h2 side read without pool buffers; the TCP side returned its own.
    assert_eq!(pool.stats().in_use, 0);
}

/// Pooled buffers handed to h2 sit in its send queue while the connection
/// cannot write; when the peer vanishes h2 drops them, and each one comes
/// back to the pool. Meanwhile the pool's bound is what stops the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffers_queued_in_http2_return_when_the_peer_vanishes() {
    const MAX_BUFFERS: usize = 8;
    let pool = BufferPool::new(32 * 1024, MAX_BUFFERS, 2);
    let (h2_client_io, h2_server_io) = tcp_pair().await;
    // RST rather than FIN when the peer goes.
    h2_server_io.set_zero_linger().expect("linger");

    // The peer answers the CONNECT, then stops reading its socket (so the
    // kernel queues fill and h2 holds what the relay sent it), then vanishes.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (vanish_tx, vanish_rx) = tokio::sync::oneshot::channel::<()>();
    let peer = tokio::spawn(async move {
        // Windows far above what the kernel queues hold, so h2 is left
        // holding data rather than waiting for window.
        let mut conn = h2::server::Builder::new()
            .initial_window_size(64 << 20)
            .initial_connection_window_size(64 << 20)
            .handshake::<_, bytes::Bytes>(h2_server_io)
            .await
            .expect("server handshake");
        let (req, mut respond) = conn.accept().await.expect("a stream").expect("stream ok");
        let _send = respond
            .send_response(http::Response::new(()), false)
            .expect("200");
        let _recv = req.into_body();
        tokio::select! {
            e = async { loop { match conn.accept().await { Some(Ok(_)) => {}, Some(Err(e)) => break format!("{e:?}"), None => break "none".to_string() } } } => panic!("connection ended: {e}"),
            _ = stop_rx => {}
        }
        vanish_rx.await.expect("vanish signal");
        drop(conn);
    });

    let (mut stream, client_conn) = connect_stream(h2_client_io).await;
    stop_tx.send(()).expect("peer running");

    let (actor, mut inner) = tcp_pair().await;
    let relay_pool = pool.clone();
    let tunnel = tokio::spawn(async move { relay(&mut inner, &mut stream, &relay_pool).await });
    let (_actor_r, mut actor_w) = actor.into_split();
    // Writes until everything in the way is full; fails once the tunnel is gone.
    let writer = tokio::spawn(async move {
        let block = vec![5u8; 1 << 20];
        while actor_w.write_all(&block).await.is_ok() {}
    });

    until(
        "h2 and the relay hold every buffer the pool may lend",
        || {
            let s = pool.stats();
            s.in_use == MAX_BUFFERS && s.waited_total > 0
        },
    )
    .await;
    assert_eq!(pool.stats().in_use, MAX_BUFFERS, "the bound holds");

    vanish_tx.send(()).expect("peer waiting");
    peer.await.expect("peer");
    let err = tunnel
        .await
        .expect("join")
        .expect_err("the tunnel fails with its peer");
    let _ = client_conn.await;
    writer.await.expect("writer");
    assert_eq!(pool.stats().in_use, 0, "after {err}: {:?}", pool.stats());
}

/// The wait-buffer ablation (`WaitBuffered`) moves the same bytes as the
/// readiness relay, both ways at once with half-close, at every swept size,
/// and holds no pooled buffer while idle between bursts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_buffered_sides_carry_payloads_both_ways_at_every_size() {
    const PING: &[u8] = b"ping";
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x3a17);
    let pool = BufferPool::new(32 * 1024, 64, 8);
    for wait in [512usize, 1024, 2048, 4096] {
        let (mut outer_a, mut outer_b, task) =
            relayed_via(&pool, |s| WaitBuffered::new(s, wait)).await;
        // A round trip, then idle: only the wait buffers stay, no pooled one.
        let acquired = pool.stats().acquired_total;
        let mut pong = [0u8; PING.len()];
        outer_a.write_all(PING).await.expect("ping");
        outer_b.read_exact(&mut pong).await.expect("ping arrives");
        outer_b.write_all(&pong).await.expect("pong");
        outer_a.read_exact(&mut pong).await.expect("pong arrives");
        assert_eq!(&pong, PING, "wait {wait}");
        assert!(pool.stats().acquired_total >= acquired + 2, "wait {wait}");
        until_no_buffer_in_use(&pool).await;
        assert!(!task.is_finished(), "wait {wait}: the relay is still up");
        let len_ab = rng.random_range(1..=3 << 20);
        let len_ba = rng.random_range(1..=3 << 20);
        let ab = random_bytes(&mut rng, len_ab);
        let ba = random_bytes(&mut rng, len_ba);
        let (got_at_b, got_at_a) = both_ways(outer_a, outer_b, &ab, &ba).await;
        assert!(got_at_b == ab, "wait {wait}: a->b corrupted");
        assert!(got_at_a == ba, "wait {wait}: b->a corrupted");
        let stats = task.await.expect("join").expect("relay");
        assert_eq!(
            stats,
            RelayStats {
                a_to_b: (PING.len() + len_ab) as u64,
                b_to_a: (PING.len() + len_ba) as u64
            }
        );
        assert_eq!(pool.stats().in_use, 0, "wait {wait}");
    }
}

/// Sends `data` from `from`, reads exactly that much at `to` and checks it,
/// so the bytes are known to have crossed before whatever comes next.
async fn crosses_intact(from: &mut TcpStream, to: &mut TcpStream, data: &[u8]) {
    from.write_all(data).await.expect("write");
    let mut got = vec![0u8; data.len()];
    to.read_exact(&mut got).await.expect("read");
    assert!(got == data, "bytes before the failure came through altered");
}

/// The next read on `s` fails with a reset: not EOF, not more bytes.
async fn next_read_is_reset(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what}: the peer was left open"));
    match read {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
        Ok(0) => panic!("{what}: a clean FIN passed a cut stream off as complete"),
        Ok(n) => panic!("{what}: {n} more bytes instead of a reset"),
    }
}

/// `outer` (one relayed peer) resets after some bytes each way; the peer on
/// the other side gets those bytes, then a reset.
async fn a_peer_reset_resets_the_other_peer(
    mut reset: TcpStream,
    mut other: TcpStream,
    task: JoinHandle<std::io::Result<RelayStats>>,
    what: &str,
) {
    crosses_intact(&mut reset, &mut other, b"before the reset").await;
    crosses_intact(&mut other, &mut reset, b"the other way").await;
    reset.set_zero_linger().expect("linger");
    drop(reset);
    next_read_is_reset(&mut other, what).await;
    let err = task.await.expect("join").expect_err("the relay fails");
    assert!(err.to_string().contains("Read"), "{what}: {err}");
}

#[tokio::test]
async fn a_reset_on_either_side_resets_the_tcp_peer_of_the_other() {
    let pool = BufferPool::default();
    for reset_a in [true, false] {
        let what = format!("plain sockets, reset_a={reset_a}");
        let (a, b, task) = relayed(&pool).await;
        let (reset, other) = if reset_a { (a, b) } else { (b, a) };
        a_peer_reset_resets_the_other_peer(reset, other, task, &what).await;
        // The wait-buffer ablation forwards the abort to its socket.
        let what = format!("wait-buffered sockets, reset_a={reset_a}");
        let (a, b, task) = relayed_via(&pool, |s| WaitBuffered::new(s, 512)).await;
        let (reset, other) = if reset_a { (a, b) } else { (b, a) };
        a_peer_reset_resets_the_other_peer(reset, other, task, &what).await;
    }
    assert_eq!(pool.stats().in_use, 0);
}

/// An HTTP/2 peer resetting its stream mid-response (what a gateway does
/// when the destination resets) reaches the actor's TCP as a reset, after the
/// bytes sent before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_http2_stream_resets_the_tcp_side() {
    const PART: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npart of the body";
    let (h2_client_io, h2_server_io) = tcp_pair().await;
    let (reset_tx, reset_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (_recv, mut send) = accept_connect(h2_server_io).await;
        send.send_data(bytes::Bytes::from_static(PART), false)
            .expect("data");
        reset_rx.await.expect("reset signal");
        send.send_reset(h2::Reason::CANCEL);
    });
    let (mut stream, _client_conn) = connect_stream(h2_client_io).await;
    let (mut actor, mut inner) = tcp_pair().await;
    let pool = BufferPool::default();
    let relay_pool = pool.clone();
    let tunnel = tokio::spawn(async move { relay(&mut inner, &mut stream, &relay_pool).await });

    let mut got = vec![0u8; PART.len()];
    actor.read_exact(&mut got).await.expect("the part sent");
    assert_eq!(got, PART);
    reset_tx.send(()).expect("server waiting");
    next_read_is_reset(&mut actor, "after RST_STREAM").await;
    let err = tunnel
        .await
        .expect("join")
        .expect_err("the relay fails with the stream");
    assert_eq!(err.side, atunnel_core::relay::Side::B, "{err}");
    server.await.expect("server");
}

/// A relay dropped mid-stream (its server shutting down): the TCP side's
/// peer sees a reset; ended cleanly, every byte still
/// queued in the kernel arrives, then FIN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_to_tcp_resets_it_when_dropped_and_closes_cleanly_when_done() {
    let pool = BufferPool::default();

    let (mut outer_a, mut a) = tcp_pair().await;
    let (mut b, mut outer_b) = tcp_pair().await;
    let relay_pool = pool.clone();
    let task = tokio::spawn(async move { relay(&mut a, &mut b, &relay_pool).await });
    crosses_intact(&mut outer_a, &mut outer_b, b"request").await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    next_read_is_reset(&mut outer_b, "relay dropped").await;

    // Clean end with bytes still queued behind a peer that is not reading:
    // closing with SO_LINGER 0 still set would drop them and reset.
    // More than b's peer takes in unread; b's send buffer (at least twice
    // the smallest usual wmem_max, 208 KiB) holds the rest.
    const QUEUED: usize = 256 * 1024;
    let (outer_a, mut a) = tcp_pair().await;
    let (mut b, outer_b) = tcp_pair().await;
    socket2::SockRef::from(&b)
        .set_send_buffer_size(1 << 20)
        .expect("sndbuf");
    let relay_pool = pool.clone();
    let task = tokio::spawn(async move { relay(&mut a, &mut b, &relay_pool).await });
    let (mut outer_b_r, mut outer_b_w) = outer_b.into_split();
    outer_b_w.shutdown().await.expect("FIN from b's peer");
    let data = random_bytes(&mut rand::rngs::StdRng::seed_from_u64(9), QUEUED);
    let (mut outer_a_r, mut outer_a_w) = outer_a.into_split();
    outer_a_w.write_all(&data).await.expect("write");
    outer_a_w.shutdown().await.expect("FIN from a's peer");
    let mut eof = Vec::new();
    outer_a_r
        .read_to_end(&mut eof)
        .await
        .expect("b's FIN reaches a");
    let stats = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay ends while b's peer is not reading")
        .expect("join")
        .expect("relay");
    assert_eq!(stats.a_to_b, QUEUED as u64);
    let mut got = Vec::new();
    outer_b_r
        .read_to_end(&mut got)
        .await
        .expect("a clean end is FIN, not a reset");
    assert!(got == data, "{} of {QUEUED} bytes arrived", got.len());
}

/// An upload to an HTTP/2 peer that grants window and never reads holds
/// no pooled buffer: the relay reads only what the window lets it send,
/// and the rest waits in the actor's socket, under TCP flow control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_waiting_for_http2_window_holds_no_buffer() {
    const WINDOW: u32 = 64 * 1024;
    let pool = BufferPool::default();
    let (h2_client_io, h2_server_io) = tcp_pair().await;
    let (got_tx, got_rx) = tokio::sync::oneshot::channel::<usize>();
    let peer = tokio::spawn(async move {
        let mut conn = h2::server::Builder::new()
            .initial_window_size(WINDOW)
            .initial_connection_window_size(1 << 30)
            .handshake::<_, bytes::Bytes>(h2_server_io)
            .await
            .expect("server handshake");
        let (req, mut respond) = conn.accept().await.expect("a stream").expect("stream ok");
        let _send = respond
            .send_response(http::Response::new(()), false)
            .expect("200");
        let mut recv = req.into_body();
        // Takes the window's worth without releasing any of it.
        let drive = tokio::spawn(async move { while conn.accept().await.is_some() {} });
        let mut got = 0;
        while got < WINDOW as usize {
            got += recv.data().await.expect("data").expect("data ok").len();
        }
        got_tx.send(got).expect("test waiting");
        drive.await.expect("connection");
    });
    let (mut stream, _client_conn) = connect_stream(h2_client_io).await;
    let (actor, mut inner) = tcp_pair().await;
    let relay_pool = pool.clone();
    let tunnel = tokio::spawn(async move { relay(&mut inner, &mut stream, &relay_pool).await });
    let (_actor_r, mut actor_w) = actor.into_split();
    let writer = tokio::spawn(async move {
        let block = vec![5u8; 1 << 20];
        while actor_w.write_all(&block).await.is_ok() {}
    });
    assert_eq!(
        got_rx.await.expect("peer"),
        WINDOW as usize,
        "the window's worth arrived"
    );
    let acquired = pool.stats().acquired_total;
    assert!(acquired > 0, "the relay read through the pool");
    until("the stalled upload holds no buffer", || {
        pool.stats().in_use == 0
    })
    .await;
    // Still waiting, holding nothing: the next read waits for window.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = pool.stats();
    assert_eq!((s.in_use, s.spilled_total), (0, 0), "{s:?}");
    assert!(!tunnel.is_finished());
    tunnel.abort();
    writer.abort();
    peer.abort();
}
