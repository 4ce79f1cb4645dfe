//! Destinations and actors' sockets: echo, counting, greeting, watched
//! peers, and checks of how a socket ended (bytes, clean close, reset).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A destination on loopback running `handle` on each connection it accepts.
pub async fn destination<F, Fut>(handle: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(handle(s));
        }
    });
    addr
}

/// A [`destination`] that sends how `handle` ended on each connection to
/// the returned channel.
pub async fn reporting_destination<T, F, Fut>(handle: F) -> (SocketAddr, mpsc::UnboundedReceiver<T>)
where
    T: Send + 'static,
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let addr = destination(move |s| {
        let (tx, ended) = (tx.clone(), handle(s));
        async move {
            let _ = tx.send(ended.await);
        }
    })
    .await;
    (addr, rx)
}

/// A peer that accepts every connection and holds it, never reading or
/// writing a byte: a gateway or an actor that hangs. Its address, and its
/// task (aborting it closes the held connections).
pub async fn silent_peer() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (addr, task)
}

/// A destination that echoes every byte and half-closes after the client does.
pub async fn echo_server() -> SocketAddr {
    destination(|mut s| async move {
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    })
    .await
}

/// A destination that reads until the client half-closes, then answers with
/// how many bytes it got and closes.
pub async fn counting_server() -> SocketAddr {
    destination(|mut s| async move {
        let mut got = Vec::new();
        if s.read_to_end(&mut got).await.is_ok() {
            let _ = s
                .write_all(format!("got {} bytes", got.len()).as_bytes())
                .await;
            let _ = s.shutdown().await;
        }
    })
    .await
}

/// Sends `data` and reads back everything until EOF, concurrently.
pub async fn round_trip(addr: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let s = TcpStream::connect(addr).await.expect("connect");
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        w.write_all(&data).await.expect("write");
        w.shutdown().await.expect("shutdown");
    });
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.expect("read");
    writer.await.expect("writer");
    got
}

/// Connects and reads whatever arrives until the socket closes; returns the
/// bytes (a reset counts as closed).
pub async fn bytes_before_close(addr: SocketAddr) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .expect("socket closed within 20 s");
    got
}

pub fn random(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A destination that greets, shuts its write side at once, then reads until
/// the client half-closes and sends what it received (or the read's error)
/// to the returned channel.
pub async fn greeting_server() -> (
    SocketAddr,
    mpsc::UnboundedReceiver<std::io::Result<Vec<u8>>>,
) {
    reporting_destination(|mut s| async move {
        s.write_all(b"hello").await?;
        s.shutdown().await?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.map(|_| got)
    })
    .await
}

/// A destination that echoes each byte until its peer closes, then sends
/// how its read ended to the returned channel: the bytes it got at EOF, or
/// the read's error (a reset, when the tunnel was cut).
pub async fn watched_echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<std::io::Result<usize>>)
{
    reporting_destination(|mut s| async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
            s.write_all(&buf[..n]).await?;
        }
    })
    .await
}

/// Writes `msg` and expects it echoed back within 10 s.
pub async fn echoes(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut got = vec![0u8; msg.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got)).await,
        Ok(Ok(_))
    ) && got == msg
}

/// Reads until the socket closes (within 10 s); true if it closed without a
/// byte (a reset counts as closed).
pub async fn closes_with_no_bytes(s: &mut TcpStream) -> bool {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("closed within 10 s");
    got.is_empty()
}

/// The next read on `s` fails with a reset within 10 s: not a clean EOF
/// (which would pass a cut stream off as complete), not more bytes.
pub async fn next_read_is_reset(s: &mut (impl tokio::io::AsyncRead + Unpin), what: &str) {
    next_read_is_reset_within(s, what, Duration::from_secs(10)).await
}

/// [`next_read_is_reset`] within `wait`.
pub async fn next_read_is_reset_within(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    what: &str,
    wait: Duration,
) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(wait, s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what}: the socket was left open {wait:?}"));
    match read {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
        Ok(0) => panic!("{what}: a clean end instead of a reset"),
        Ok(n) => panic!("{what}: {n} more bytes instead of a reset"),
    }
}

/// A connection refused with a reset the moment it is used: written to,
/// its next read fails with a reset within 5 s (not after an open timeout).
pub async fn written_to_is_reset(s: &mut TcpStream, what: &str) {
    match s.write_all(b"ping").await {
        // The reset arrived before the write, which reports it; the error
        // is then spent, and a read would see only an end.
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
        Ok(()) => next_read_is_reset_within(s, what, Duration::from_secs(5)).await,
    }
}

/// The connection ends (EOF or an error) within 20 s.
pub async fn ends(s: &mut (impl tokio::io::AsyncRead + Unpin), what: &str) {
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "{what} still open");
}

/// What `watched` reports within 10 s is a reset.
pub async fn watched_end_is_reset(
    watched: &mut mpsc::UnboundedReceiver<std::io::Result<usize>>,
    what: &str,
) {
    match tokio::time::timeout(Duration::from_secs(10), watched.recv()).await {
        Ok(Some(Err(e))) => {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}")
        }
        Ok(Some(Ok(n))) => panic!("{what}: a clean end after {n} bytes instead of a reset"),
        Ok(None) => panic!("{what}: the server stopped"),
        Err(_) => panic!("{what}: the socket was left open"),
    }
}

/// The one JSON line a process started with a piped stdout prints once it
/// is ready (`atunnel host`'s `HostReady`, `atunnel serve`'s `ServeReady`),
/// within 30 s.
pub async fn ready_line<T: serde::de::DeserializeOwned>(child: &mut tokio::process::Child) -> T {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().expect("a piped stdout");
    let line = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("ready within 30 s")
    .expect("read")
    .expect("a ready line");
    serde_json::from_str(&line).expect("ready JSON")
}

/// Starts `cmd` with a piped stdout, killed when dropped, and waits for its
/// [`ready_line`].
pub async fn spawn_ready<T: serde::de::DeserializeOwned>(
    cmd: &mut tokio::process::Command,
) -> (tokio::process::Child, T) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the process starts");
    let ready = ready_line(&mut child).await;
    (child, ready)
}
