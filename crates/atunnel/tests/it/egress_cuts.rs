//! A cut egress tunnel ends on the actor's side with a reset, never with a
//! clean FIN behind lost bytes: whether the gateway resets the stream right
//! around its last DATA and END_STREAM, its connection drops, or atunnel
//! itself is killed mid-stream. A clean end (FIN) is allowed only after
//! every byte the far end sent.
//!
//! The gateway here is hand-made (rustls and the h2 crate's server), so the
//! test decides exactly when the RST_STREAM goes out relative to the last
//! bytes; the process test runs the `atunnel` binary against a real gateway.

use atunnel_support::prelude::*;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::host::HostReady;
use atunnel_identity::clock::Clock;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// What the actor's socket gave before it ended, and how it ended.
#[derive(Debug)]
struct Seen {
    bytes: Vec<u8>,
    /// `Ok(())` for a clean end of stream, else the error that ended it.
    end: io::Result<()>,
}

impl Seen {
    fn is_reset(&self) -> bool {
        matches!(&self.end, Err(e) if e.kind() == io::ErrorKind::ConnectionReset)
    }
}

/// Reads `s` to its end (within 10 s).
async fn read_to_end(s: &mut (impl AsyncReadExt + Unpin)) -> Seen {
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the actor's socket ended within 10 s");
    Seen { bytes, end }
}

/// The property: a clean end only after all of `sent`; a reset after any
/// prefix of it; never other bytes. The kernel reports a reset once, to
/// whichever call on the socket comes first: when the actor also writes,
/// `upload` is how its writing ended, and a reset seen there counts (the
/// read then sees only the closed socket's end of stream).
fn assert_no_silent_cut(seen: &Seen, upload: Option<&io::Error>, sent: &[u8], what: &str) {
    assert!(
        sent.starts_with(&seen.bytes),
        "{what}: the actor got bytes the far end never sent ({} bytes)",
        seen.bytes.len()
    );
    let upload_reset = upload.is_some_and(|e| e.kind() == io::ErrorKind::ConnectionReset);
    match &seen.end {
        Ok(()) if upload_reset => {}
        Ok(()) => assert_eq!(
            seen.bytes.len(),
            sent.len(),
            "{what}: a clean FIN after {} of {} bytes (upload: {upload:?})",
            seen.bytes.len(),
            sent.len()
        ),
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{what}: {e}"),
    }
}

/// When the hand-made gateway resets each stream, relative to its last
/// DATA frame (which carries END_STREAM).
#[derive(Clone, Copy, Debug)]
enum ResetAt {
    /// In the same turn as queuing the whole answer and END_STREAM, before
    /// the connection wrote any of it.
    WithTheLastBytesQueued,
    /// Half the answer delivered (the client answered a PING sent after
    /// it), the rest and END_STREAM queued, then the reset at once.
    AfterHalfDelivered,
    /// The whole answer and END_STREAM delivered (a PING after them was
    /// answered), then the reset: the far end promised every byte and
    /// its end, and cut only the actor's upload.
    AfterAllDelivered,
}

/// A CONNECT stream the gateway accepted, and where its answer goes.
type Stream = (
    http::Request<h2::RecvStream>,
    h2::server::SendResponse<Bytes>,
);

/// Drives `conn` in a task of its own (the returned handle: aborting it
/// drops the connection), handing each stream it accepts to the receiver.
fn driven(
    mut conn: H2Conn,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<Stream>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(Ok(stream)) = conn.accept().await {
            let _ = tx.send(stream);
        }
    });
    (rx, driver)
}

/// A gateway that answers every CONNECT with `answer` and END_STREAM and
/// resets the stream (CANCEL) at `reset`; it never reads the upload.
async fn resetting_gateway(pki: &Pki, answer: Bytes, reset: ResetAt) -> ScriptedGateway {
    scripted_h2_gateway(pki, h2::server::Builder::new(), move |_, mut conn| {
        let answer = answer.clone();
        async move {
            let mut pings = conn.ping_pong().expect("ping handle");
            // Streams are answered here, one at a time (each test opens
            // one).
            let (mut streams, _driver) = driven(conn);
            while let Some((_request, mut respond)) = streams.recv().await {
                let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
                    continue;
                };
                // The 200 delivered first (a PING after it answered):
                // the tunnel is open, so what follows is a cut, not a
                // refused CONNECT (which closes with no bytes).
                let _ = pings.ping(h2::Ping::opaque()).await;
                // The answer fits the client's windows (256 KiB per
                // stream by default), so send_data never waits.
                match reset {
                    ResetAt::WithTheLastBytesQueued => {
                        let _ = send.send_data(answer.clone(), true);
                    }
                    ResetAt::AfterHalfDelivered => {
                        let half = answer.len() / 2;
                        let _ = send.send_data(answer.slice(..half), false);
                        let _ = pings.ping(h2::Ping::opaque()).await;
                        let _ = send.send_data(answer.slice(half..), true);
                    }
                    ResetAt::AfterAllDelivered => {
                        let _ = send.send_data(answer.clone(), true);
                        let _ = pings.ping(h2::Ping::opaque()).await;
                    }
                }
                send.send_reset(h2::Reason::CANCEL);
            }
        }
    })
    .await
}

/// One actor's egress listener, activated, its tunnels going through the
/// gateway at `gateway` (to a destination it never dials).
async fn actor_through(pki: &Pki, gateway: SocketAddr) -> (SocketAddr, CancellationToken) {
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(pki, gateway, a.clone(), source).await;
    let egress = egress();
    let cancel = CancellationToken::new();
    let dest: SocketAddr = "192.0.2.10:443".parse().expect("addr");
    let addr = listen(&egress, &a.uid, dest, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");
    // The listener's tasks hold the egress; the token keeps it serving.
    (addr, cancel)
}

/// Writes to `s` without end until a write fails (within 10 s), and says
/// how: the actor must learn that its upload was cut.
async fn upload_until_it_fails(mut w: tokio::net::tcp::OwnedWriteHalf) -> io::Error {
    let chunk = vec![0x55u8; 16 * 1024];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(e) = w.write_all(&chunk).await {
                return e;
            }
        }
    })
    .await
    .expect("the actor's upload failed within 10 s")
}

/// Each reset timing meets an actor that uploads all along (the reset cuts
/// its upload too) and one that half-closed at once (only the answer can
/// be cut).
async fn a_gateway_reset_never_reaches_the_actor_as_a_clean_end(reset: ResetAt) {
    for uploads in [true, false] {
        reset_meets_actor(reset, uploads).await;
    }
}

async fn reset_meets_actor(reset: ResetAt, uploads: bool) {
    let pki = Pki::new();
    let answer = Bytes::from(random(200_000, 7));
    let gateway = resetting_gateway(&pki, answer.clone(), reset).await;
    let (addr, _cancel) = actor_through(&pki, gateway.addr).await;
    let what = format!("{reset:?}, uploading: {uploads}");
    let s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        // The whole exchange, reset included, can be over before this task
        // sees its connect complete: the reset then ends the connect.
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return,
        Err(e) => panic!("{what}: connect: {e}"),
    };
    let (mut r, mut w) = s.into_split();
    if !uploads {
        w.shutdown().await.expect("half-close");
        let seen = read_to_end(&mut r).await;
        assert_no_silent_cut(&seen, None, &answer, &what);
        return;
    }
    // The actor uploads all along: the gateway's reset cuts that direction.
    let upload = tokio::spawn(upload_until_it_fails(w));
    let seen = read_to_end(&mut r).await;
    let failed = upload.await.expect("upload task");
    assert_no_silent_cut(&seen, Some(&failed), &answer, &what);
    // The upload was cut too, and the actor learns it: a reset (or, once
    // the read took the reset, the closed socket's broken pipe).
    assert!(
        matches!(
            failed.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
        "{what}: the upload ended with {failed}, not a reset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_with_the_last_bytes_and_end_queued_reaches_the_actor_as_a_reset() {
    a_gateway_reset_never_reaches_the_actor_as_a_clean_end(ResetAt::WithTheLastBytesQueued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_half_the_bytes_never_gives_the_actor_a_clean_end() {
    a_gateway_reset_never_reaches_the_actor_as_a_clean_end(ResetAt::AfterHalfDelivered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_every_byte_and_the_end_gives_them_all_then_resets_the_upload() {
    a_gateway_reset_never_reaches_the_actor_as_a_clean_end(ResetAt::AfterAllDelivered).await;
}

/// A gateway that answers every CONNECT with `answer` and END_STREAM, then,
/// once `go` says the actor has read them, resets the stream (CANCEL, as a
/// gateway whose destination failed) and tells `reset_seen` once the
/// client has taken the reset in (a PING after it answered).
async fn gateway_resetting_after_its_end(
    pki: &Pki,
    answer: Bytes,
    go: tokio::sync::mpsc::UnboundedReceiver<()>,
    reset_seen: tokio::sync::mpsc::UnboundedSender<()>,
) -> ScriptedGateway {
    // One connection takes the signals (each test opens one tunnel).
    let go = Arc::new(std::sync::Mutex::new(Some(go)));
    scripted_h2_gateway(pki, h2::server::Builder::new(), move |_, mut conn| {
        let (answer, reset_seen) = (answer.clone(), reset_seen.clone());
        let go = go.lock().expect("go lock").take();
        async move {
            let Some(mut go) = go else {
                return;
            };
            let mut pings = conn.ping_pong().expect("ping handle");
            let (mut rx, _driver) = driven(conn);
            while let Some((_req, mut respond)) = rx.recv().await {
                let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
                    continue;
                };
                let _ = send.send_data(answer.clone(), true);
                // A reset sooner could reach the actor before it read the
                // answer (the kernel drops unread bytes on a reset), or
                // before its connect returned.
                let _ = go.recv().await;
                send.send_reset(h2::Reason::CANCEL);
                let _ = pings.ping(h2::Ping::opaque()).await;
                let _ = reset_seen.send(());
            }
        }
    })
    .await
}

/// The gateway delivers its whole answer and END_STREAM, then resets the
/// stream before the actor's upload ended: the far end promised the
/// answer, not that the upload arrived. The actor gets every byte of the
/// answer and its end, and then a reset, not a clean close that would
/// tell it its upload went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_the_gateways_end_still_resets_the_actor_whose_upload_it_cut() {
    let pki = Pki::new();
    let answer = Bytes::from(random(50_000, 13));
    let (reset_tx, mut reset_seen) = tokio::sync::mpsc::unbounded_channel();
    let (go, go_rx) = tokio::sync::mpsc::unbounded_channel();
    let gateway = gateway_resetting_after_its_end(&pki, answer.clone(), go_rx, reset_tx).await;
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gateway.addr, a.clone(), source).await;
    let egress = egress();
    let cancel = CancellationToken::new();
    let dest: SocketAddr = "192.0.2.10:443".parse().expect("addr");
    let addr = listen(&egress, &a.uid, dest, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");

    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"the first part of an upload")
        .await
        .expect("write");
    let mut got = vec![0u8; answer.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("the answer within 10 s")
        .expect("read");
    assert!(got == answer[..], "the answer came through altered");
    let _ = go.send(());
    tokio::time::timeout(Duration::from_secs(10), reset_seen.recv())
        .await
        .expect("the gateway reset within 10 s");
    // The actor has not ended its upload: atunnel's answer to the gateway's
    // reset must reach it as a reset (SO_ERROR set, EPOLLERR), awaited as
    // that event. Half-closing first and then looking raced atunnel's close:
    // a FIN from the actor before atunnel closed put atunnel's socket in
    // TIME_WAIT, where the kernel sends no reset for anyone.
    tokio::time::timeout(Duration::from_secs(10), s.ready(Interest::ERROR))
        .await
        .expect("the actor's socket reset within 10 s of the gateway's reset")
        .expect("ready");
    let reset = s
        .take_error()
        .expect("SO_ERROR")
        .expect("the actor's socket closed cleanly: its cut upload looks complete");
    // EPIPE when the reset finds the actor's side in CLOSE_WAIT (it had the
    // answer's end), ECONNRESET otherwise.
    assert!(
        matches!(
            reset.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
        "{reset}"
    );
    let seen = read_to_end(&mut s).await;
    assert!(
        seen.bytes.is_empty(),
        "{} bytes after the answer",
        seen.bytes.len()
    );
}

/// A destination that sends without end and reads everything it is sent.
async fn endless_destination() -> SocketAddr {
    destination(|mut s: TcpStream| async move {
        let chunk = vec![0xa5u8; 16 * 1024];
        let (mut r, mut w) = s.split();
        let drain = async {
            let mut buf = vec![0u8; 16 * 1024];
            while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let flood = async { while w.write_all(&chunk).await.is_ok() {} };
        tokio::join!(drain, flood);
    })
    .await
}

/// A hand-made gateway whose one TCP connection is dropped (closed with no
/// TLS close_notify, as a gateway process that dies) once a stream has
/// sent `before` bytes and `drop_now` fires.
async fn dropping_gateway(
    pki: &Pki,
    before: Bytes,
    drop_now: tokio::sync::oneshot::Receiver<()>,
) -> ScriptedGateway {
    let drop_now = Arc::new(std::sync::Mutex::new(Some(drop_now)));
    scripted_h2_gateway(pki, h2::server::Builder::new(), move |_, conn| {
        let before = before.clone();
        let drop_now = drop_now.lock().expect("drop lock").take();
        async move {
            let Some(drop_now) = drop_now else {
                return;
            };
            // Aborting the driver drops the connection mid-stream.
            let (mut rx, driver) = driven(conn);
            if let Some((_req, mut respond)) = rx.recv().await
                && let Ok(mut send) = respond.send_response(http::Response::new(()), false)
            {
                let _ = send.send_data(before, false);
                let _ = drop_now.await;
            }
            // The connection (TLS and TCP) goes with its task: no GOAWAY, no
            // close_notify, as when the process is killed.
            driver.abort();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_gateway_connection_reaches_the_actor_as_a_reset() {
    let pki = Pki::new();
    let before = Bytes::from(random(100_000, 9));
    let (drop_now, dropped) = tokio::sync::oneshot::channel();
    let gateway = dropping_gateway(&pki, before.clone(), dropped).await;
    let (addr, _cancel) = actor_through(&pki, gateway.addr).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut got = vec![0u8; before.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("the bytes before the drop arrived within 10 s")
        .expect("read");
    assert!(got == before[..], "the bytes came through altered");
    drop_now.send(()).expect("the gateway waits");
    let seen = read_to_end(&mut s).await;
    assert!(
        seen.is_reset() && seen.bytes.is_empty(),
        "after the drop the actor saw {} more bytes and {:?}",
        seen.bytes.len(),
        seen.end
    );
}

/// The `atunnel` binary hosting one loopback actor whose connections go to
/// `dest` through `gateway`; its ready line.
async fn atunnel_process(
    pki: &Pki,
    dir: &std::path::Path,
    gateway: SocketAddr,
    dest: SocketAddr,
) -> (tokio::process::Child, HostReady) {
    spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .args(["host", "--network=loopback", "--actors=1"])
            .arg(format!("--gateway={gateway}"))
            .arg(format!("--gateway-name={GATEWAY_NAME}"))
            .args(pki.write_ca_files(dir).args())
            .arg(format!("--destinations={dest}"))
            .arg("--stats=127.0.0.1:0"),
    )
    .await
}

/// atunnel killed (SIGKILL: nothing of it runs to reset anything) while a
/// download streams: the kernel's close of the actor's socket must be a
/// reset, or the actor would take the bytes it got for the whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atunnel_killed_mid_stream_resets_the_actors_connection() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let dest = endless_destination().await;
    let (mut child, ready) = atunnel_process(&pki, dir.path(), gw.addr, dest).await;
    let listener = *ready.actors[0]
        .listeners
        .get(&dest)
        .expect("a listener for the destination");
    let mut s = TcpStream::connect(listener).await.expect("connect");
    // Mid-stream: the first bytes arrived, more are coming. Nothing is read
    // after this, so atunnel's socket has no unread bytes of the actor's
    // either (which alone would make the kernel reset).
    let mut first = vec![0u8; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut first))
        .await
        .expect("the download started within 10 s")
        .expect("read");
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("atunnel exited");
    let seen = read_to_end(&mut s).await;
    assert!(
        seen.is_reset(),
        "after {} more bytes the actor saw {:?}, not a reset",
        seen.bytes.len(),
        seen.end
    );
}

/// A tunnel ended cleanly by its destination still gets every byte and a
/// FIN to an actor that reads slowly: the reset-on-close armed for a cut is
/// turned off at a clean end, so the tail still queued in atunnel's socket
/// for the actor drains instead of being dropped by a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_end_still_drains_every_byte_and_a_fin_to_a_slow_actor() {
    // Small enough to be written into atunnel's socket whole (under its
    // 16 KiB TCP_NOTSENT_LOWAT once the actor's tiny window is full), so
    // the tunnel ends while most of it is still queued there.
    const ANSWER: usize = 12 * 1024;
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let answer = random(ANSWER, 11);
    let sent = answer.clone();
    let dest = destination(move |mut s: TcpStream| {
        let answer = sent.clone();
        async move {
            let _ = s.write_all(&answer).await;
            let _ = s.shutdown().await;
            let mut rest = [0u8; 1024];
            while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {}
        }
    })
    .await;
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw.addr, a.clone(), source).await;
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, dest, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");
    // The kernel's smallest receive buffer: a window of a couple of KiB.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(1).expect("SO_RCVBUF");
    let mut s = socket.connect(addr).await.expect("connect");
    s.shutdown().await.expect("half-close");
    // The actor reads nothing until the tunnel has ended at atunnel's end.
    // Polled: /stats' counter is the only sign of it.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while egress.stats().tunnels_total == 0 || egress.stats().tunnels_open > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(ended.is_ok(), "the tunnel did not end within 10 s");
    let seen = read_to_end(&mut s).await;
    assert!(seen.end.is_ok(), "a clean end, not {:?}", seen.end);
    assert!(
        seen.bytes == answer,
        "{} of {} bytes",
        seen.bytes.len(),
        answer.len()
    );
}
