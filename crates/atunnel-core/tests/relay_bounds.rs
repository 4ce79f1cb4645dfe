//! The relay's bounds on tunnels that cannot finish, over real sockets: a
//! write blocked past `write_stall` and a half-closed tunnel idle past
//! `half_closed_idle` end with a reset on both sides and give everything
//! back; a tunnel that keeps moving, however slowly, is never cut.

mod common;

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use atunnel_core::relay::{Op, RelayBounds, RelayError, relay_within};
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, RelayStats};
use common::tcp_pair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const BOUND: Duration = Duration::from_millis(300);

fn bounds(write_stall: Duration, half_closed_idle: Duration) -> RelayBounds {
    RelayBounds {
        write_stall,
        half_closed_idle,
    }
}

/// a <-> relay <-> b over loopback, within `bounds`, the relay's sockets
/// with the options atunnel gives its own (`TCP_NOTSENT_LOWAT`: a socket
/// is writable again once its reader took a little, not half its queue).
async fn relayed(
    pool: &BufferPool,
    bounds: RelayBounds,
) -> (
    TcpStream,
    TcpStream,
    JoinHandle<Result<RelayStats, RelayError>>,
) {
    let (outer_a, mut a) = tcp_pair().await;
    let (mut b, outer_b) = tcp_pair().await;
    for s in [&a, &b] {
        SocketOptions::default().apply(s).expect("socket options");
    }
    let pool = pool.clone();
    let task = tokio::spawn(async move { relay_within(&mut a, &mut b, &pool, &bounds).await });
    (outer_a, outer_b, task)
}

/// Reads until the connection ends; how it ended.
async fn read_to_end_or_error<R: AsyncReadExt + Unpin>(mut s: R) -> Result<Vec<u8>, ErrorKind> {
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.map_err(|e| e.kind())?;
    Ok(got)
}

/// Asserts the relay ended at `op` within a little of the bound.
async fn ended_at_bound(
    task: JoinHandle<Result<RelayStats, RelayError>>,
    since: Instant,
    op: Op,
) -> RelayError {
    let err = task
        .await
        .expect("join")
        .expect_err("the bound ends the relay");
    let took = since.elapsed();
    assert_eq!(err.op, op, "{err}");
    assert!(err.is_bound());
    assert!(
        took >= BOUND && took < BOUND + Duration::from_secs(5),
        "ended after {took:?}"
    );
    err
}

#[tokio::test]
async fn a_write_stalled_past_its_bound_resets_both_sides() {
    let pool = BufferPool::default();
    let (a, b, task) = relayed(&pool, bounds(BOUND, Duration::from_secs(60))).await;
    let (a_r, mut a_w) = a.into_split();
    // b never reads; a writes until the tunnel is gone.
    let writer = tokio::spawn(async move {
        let block = vec![7u8; 1 << 20];
        while a_w.write_all(&block).await.is_ok() {}
    });
    let err = ended_at_bound(task, Instant::now(), Op::StalledWrite).await;
    assert!(err.stats.a_to_b > 0, "bytes moved before the stall");
    assert_eq!(pool.stats().in_use, 0);
    assert_eq!(
        read_to_end_or_error(b).await,
        Err(ErrorKind::ConnectionReset)
    );
    assert_eq!(
        read_to_end_or_error(a_r).await,
        Err(ErrorKind::ConnectionReset)
    );
    writer.await.expect("the writer sees the reset");
}

#[tokio::test]
async fn a_half_closed_tunnel_left_idle_resets_both_sides() {
    let pool = BufferPool::default();
    let (mut a, mut b, task) = relayed(&pool, bounds(Duration::from_secs(60), BOUND)).await;
    a.write_all(b"last words").await.expect("write");
    a.shutdown().await.expect("FIN");
    let mut got = [0u8; 10];
    b.read_exact(&mut got).await.expect("relayed");
    assert_eq!(&got, b"last words");
    // b neither answers nor closes.
    let t0 = Instant::now();
    let err = ended_at_bound(task, t0, Op::HalfClosedIdle).await;
    assert_eq!(
        err.stats,
        RelayStats {
            a_to_b: 10,
            b_to_a: 0
        }
    );
    assert_eq!(
        read_to_end_or_error(a).await,
        Err(ErrorKind::ConnectionReset)
    );
    // b saw a's FIN before the reset: it learns of the reset by writing.
    assert_eq!(write_until_error(b).await, ErrorKind::ConnectionReset);
}

/// Writes a byte at a time until the connection fails; the error's kind
/// (a reset peer answers the first write with RST, failing the next).
async fn write_until_error(mut s: TcpStream) -> ErrorKind {
    for _ in 0..100 {
        if let Err(e) = s.write_all(b"x").await {
            return match e.kind() {
                ErrorKind::BrokenPipe => ErrorKind::ConnectionReset,
                kind => kind,
            };
        }
        // The RST for the first byte has to come back: yield to it.
        tokio::task::yield_now().await;
        let mut one = [0u8; 1];
        if let Err(e) = s.try_read(&mut one)
            && e.kind() != ErrorKind::WouldBlock
        {
            return e.kind();
        }
    }
    panic!("100 writes to a reset peer succeeded");
}

/// A half-closed tunnel whose open direction keeps moving, with gaps
/// shorter than the bound, outlives the bound many times and ends cleanly.
#[tokio::test]
async fn a_half_closed_tunnel_still_moving_is_not_cut() {
    let pool = BufferPool::default();
    let (mut a, mut b, task) = relayed(&pool, bounds(BOUND, BOUND)).await;
    a.shutdown().await.expect("FIN");
    let reader = tokio::spawn(read_to_end_or_error(a));
    let t0 = Instant::now();
    let mut sent = Vec::new();
    for i in 0..10u8 {
        // Pacing, not synchronisation: gaps of a third of the bound.
        tokio::time::sleep(BOUND / 3).await;
        b.write_all(&[i; 100]).await.expect("write");
        sent.extend_from_slice(&[i; 100]);
    }
    assert!(t0.elapsed() > BOUND * 3);
    b.shutdown().await.expect("FIN");
    let stats = task.await.expect("join").expect("a clean end");
    assert_eq!(
        stats,
        RelayStats {
            a_to_b: 0,
            b_to_a: 1000
        }
    );
    assert_eq!(reader.await.expect("reader"), Ok(sent));
}

/// A reader that drains slowly, with pauses shorter than the bound, keeps
/// the tunnel alive far past the bound and gets every byte in order.
#[tokio::test]
async fn a_slow_reader_is_not_a_stalled_one() {
    let pool = BufferPool::default();
    let (a, mut b, task) = relayed(&pool, bounds(BOUND, BOUND)).await;
    let payload: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    let (_a_r, mut a_w) = a.into_split();
    let writer = tokio::spawn(async move {
        a_w.write_all(&sent).await.expect("write");
        a_w.shutdown().await.expect("FIN");
        a_w
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    // Reads in bursts separated by pauses of a third of the bound, until
    // the bound has passed several times; then all at once.
    while t0.elapsed() < BOUND * 4 {
        tokio::time::sleep(BOUND / 3).await;
        let n = b.read(&mut buf).await.expect("read");
        got.extend_from_slice(&buf[..n]);
    }
    b.read_to_end(&mut got).await.expect("the rest");
    assert!(
        got == payload,
        "{} of {} bytes, or out of order",
        got.len(),
        payload.len()
    );
    let _a_w = writer.await.expect("writer");
    drop(b);
    drop(_a_w);
    let _ = task.await.expect("join");
    assert_eq!(pool.stats().in_use, 0);
}
