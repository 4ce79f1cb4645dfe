//! The gateway client's TLS stream (`atunnel_tls::client`) against a real
//! tokio-rustls server over real sockets on 127.0.0.1: bytes both ways
//! checked byte for byte, records counted on the server's socket, key
//! updates, close_notify, truncation, forged records, buffers released when
//! idle, and a TLS 1.2 server staying with rustls.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use atunnel_tls::client::ClientTls;
use atunnel_tls::records;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{Pki, pki, provider};

fn server_config(
    pki: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ServerConfig> {
    let mut cfg = common::server_config(pki, provider(), versions);
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    // Tickets after the handshake, which the client must skip.
    cfg.send_tls13_tickets = 2;
    Arc::new(cfg)
}

fn client_config(pki: &Pki) -> rustls::ClientConfig {
    let mut cfg = common::client_config(pki);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg
}

/// Counts the TLS records a socket reads: the server's view of what the
/// client put on the wire.
struct Counting {
    tcp: TcpStream,
    records: Arc<AtomicUsize>,
    framing: records::Framing,
}

impl Counting {
    fn track(&mut self, bytes: &[u8]) {
        self.framing.track(bytes, |_| {
            self.records.fetch_add(1, Ordering::Relaxed);
        });
    }
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let this = &mut *self;
            let got = buf.filled()[before..].to_vec();
            this.track(&got);
        }
        r
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

type Server = tokio_rustls::server::TlsStream<Counting>;

/// A connected pair, both handshakes done: atunnel's client stream and a
/// tokio-rustls server, with the count of records the server has read.
async fn pair(
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> (ClientTls, Server, Arc<AtomicUsize>) {
    let pki = pki("gateway.test");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&pki, versions));
    let records = Arc::new(AtomicUsize::new(0));
    let counted = records.clone();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let counting = Counting {
            tcp,
            records: counted,
            framing: records::Framing::default(),
        };
        acceptor.accept(counting).await.expect("server handshake")
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let client = atunnel_tls::client::connect(client_config(&pki), pki.name.clone(), tcp)
        .await
        .expect("client handshake");
    let server = server.await.expect("server task");
    (client, server, records)
}

/// Byte `i` of a stream: a counter that does not repeat at any power of
/// two, so a lost, repeated or reordered chunk shows.
fn pattern(from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(|i| (i % 251) as u8).collect()
}

fn check(got: &[u8], from: usize) {
    for (i, b) in got.iter().enumerate() {
        assert_eq!(*b, ((from + i) % 251) as u8, "byte {} differs", from + i);
    }
}

/// Writes `len` pattern bytes in writes of `chunk`, then flushes.
async fn send<W: AsyncWrite + Unpin>(w: &mut W, len: usize, chunk: usize) {
    let data = pattern(0, len);
    for c in data.chunks(chunk) {
        w.write_all(c).await.expect("write");
    }
    w.flush().await.expect("flush");
}

/// Reads `len` bytes and checks them against the pattern.
async fn receive<R: AsyncRead + Unpin>(r: &mut R, len: usize) {
    let mut got = vec![0u8; len];
    r.read_exact(&mut got).await.expect("read");
    check(&got, 0);
}

const MIB: usize = 1024 * 1024;

#[tokio::test]
async fn mebibytes_cross_both_ways_intact_in_the_record_layer() {
    let (client, server, _) = pair(&[&rustls::version::TLS13]).await;
    assert!(client.is_records(), "TLS 1.3 leaves rustls");
    assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    tokio::join!(
        send(&mut cw, 6 * MIB, 100_000),
        send(&mut sw, 6 * MIB, 70_000),
        receive(&mut sr, 6 * MIB),
        receive(&mut cr, 6 * MIB),
    );
}

#[tokio::test]
async fn many_small_writes_arrive_intact() {
    let (mut client, mut server, _) = pair(&[&rustls::version::TLS13]).await;
    // 20,000 writes of 1 to 97 bytes each way.
    let data = pattern(0, 20_000 * 49);
    let mut at = 0;
    let mut sizes = Vec::new();
    for i in 0..20_000 {
        let n = (i % 97 + 1).min(data.len() - at);
        sizes.push((at, n));
        at += n;
    }
    let total = at;
    let client_writes = async {
        for &(a, n) in &sizes {
            client
                .write_all(&data[a..a + n])
                .await
                .expect("client write");
        }
        client.flush().await.expect("client flush");
        let mut got = vec![0u8; total];
        client.read_exact(&mut got).await.expect("client read");
        check(&got, 0);
    };
    let server_side = async {
        let mut got = vec![0u8; total];
        server.read_exact(&mut got).await.expect("server read");
        check(&got, 0);
        for &(a, n) in &sizes {
            server
                .write_all(&data[a..a + n])
                .await
                .expect("server write");
        }
        server.flush().await.expect("server flush");
    };
    tokio::join!(client_writes, server_side);
}

#[tokio::test]
async fn vectored_writes_fill_whole_records() {
    let (mut client, mut server, records) = pair(&[&rustls::version::TLS13]).await;
    assert!(client.is_write_vectored());
    // What h2 hands over for four 16 KiB DATA frames: a 9-byte header and
    // its payload, four times.
    let head = [0u8; 9];
    let payload = pattern(0, 16 * 1024);
    let before = records.load(Ordering::Relaxed);
    let mut slices = Vec::new();
    for _ in 0..4 {
        slices.push(IoSlice::new(&head));
        slices.push(IoSlice::new(&payload));
    }
    let total = 4 * (9 + payload.len());
    let mut written = 0;
    let mut calls = 0;
    while written < total {
        // Skip what was written, as h2's buffer does.
        let mut skip = written;
        let rest: Vec<IoSlice<'_>> = slices
            .iter()
            .filter_map(|s| {
                if skip >= s.len() {
                    skip -= s.len();
                    None
                } else {
                    let part = IoSlice::new(&s[skip..]);
                    skip = 0;
                    Some(part)
                }
            })
            .collect();
        written += client.write_vectored(&rest).await.expect("write");
        calls += 1;
    }
    client.flush().await.expect("flush");
    let mut got = vec![0u8; total];
    server.read_exact(&mut got).await.expect("server read");
    let sent = records.load(Ordering::Relaxed) - before;
    // 65,572 bytes: four full records in the first write (64 KiB, its
    // batch) and one of 36 bytes.
    assert_eq!(calls, 2, "one batch of 64 KiB, then the rest");
    assert_eq!(
        sent,
        total.div_ceil(16 * 1024),
        "{sent} records for {total} bytes"
    );
}

#[tokio::test]
async fn a_key_update_the_server_asks_for_is_followed_and_answered() {
    let (mut client, mut server, _) = pair(&[&rustls::version::TLS13]).await;
    // Three records from the client under its first keys.
    for _ in 0..3 {
        client.write_all(&pattern(0, 1000)).await.expect("write");
        client.flush().await.expect("flush");
    }
    receive_n(&mut server, 3).await;
    server
        .get_mut()
        .1
        .refresh_traffic_keys()
        .expect("server key update");
    // Data after the update: the client must follow the server's new keys.
    server.write_all(&pattern(0, 50_000)).await.expect("write");
    server.flush().await.expect("flush");
    receive(&mut client, 50_000).await;
    // The client answers before its next record.
    client.write_all(&pattern(0, 1000)).await.expect("write");
    client.flush().await.expect("flush");
    receive(&mut server, 1000).await;
    let (_, conn) = server.into_inner();
    let secrets = conn.dangerous_extract_secrets().expect("secrets");
    // The client's KeyUpdate reset its sequence numbers: one record since.
    // Without an answer it would be the fourth record under the old keys.
    assert_eq!(secrets.rx.0, 1, "records from the client since its update");
}

async fn receive_n(server: &mut Server, n: usize) {
    for _ in 0..n {
        receive(server, 1000).await;
    }
}

#[tokio::test]
async fn close_notify_ends_each_direction_cleanly() {
    let (mut client, mut server, _) = pair(&[&rustls::version::TLS13]).await;
    client.write_all(b"last words").await.expect("write");
    client.shutdown().await.expect("client close_notify");
    let mut got = Vec::new();
    server
        .read_to_end(&mut got)
        .await
        .expect("a clean end: close_notify came");
    assert_eq!(got, b"last words");
    server.write_all(b"and mine").await.expect("write");
    server.shutdown().await.expect("server close_notify");
    let mut got = Vec::new();
    client
        .read_to_end(&mut got)
        .await
        .expect("a clean end: close_notify came");
    assert_eq!(got, b"and mine");
}

#[tokio::test]
async fn a_peer_closing_without_close_notify_is_an_error() {
    let (mut client, server, _) = pair(&[&rustls::version::TLS13]).await;
    let (mut counting, _) = server.into_inner();
    counting
        .tcp
        .shutdown()
        .await
        .expect("FIN without close_notify");
    let mut got = Vec::new();
    let e = client
        .read_to_end(&mut got)
        .await
        .expect_err("truncation is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
}

#[tokio::test]
async fn a_forged_record_fails_the_connection_with_an_alert() {
    let (mut client, server, _) = pair(&[&rustls::version::TLS13]).await;
    let (mut counting, mut conn) = server.into_inner();
    let mut forged = vec![23, 3, 3, 0, 40];
    forged.extend_from_slice(&[0x5a; 40]);
    counting
        .tcp
        .write_all(&forged)
        .await
        .expect("forged record");
    let mut buf = [0u8; 100];
    let e = client.read(&mut buf).await.expect_err("a bad record");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    // The server gets the client's alert, then the end of the connection.
    drop(client);
    let mut wire = Vec::new();
    counting.tcp.read_to_end(&mut wire).await.expect("read");
    conn.read_tls(&mut &wire[..]).expect("read_tls");
    let e = conn.process_new_packets().expect_err("the client's alert");
    assert_eq!(
        e,
        rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)
    );
}

/// Polls a read once: Pending if nothing is there.
fn read_now(client: &mut ClientTls) -> Poll<std::io::Result<usize>> {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut buf = [0u8; 64];
    let mut rb = ReadBuf::new(&mut buf);
    match Pin::new(client).poll_read(&mut cx, &mut rb) {
        Poll::Ready(r) => Poll::Ready(r.map(|()| rb.filled().len())),
        Poll::Pending => Poll::Pending,
    }
}

#[tokio::test]
async fn an_idle_stream_holds_no_buffer() {
    let (mut client, mut server, _) = pair(&[&rustls::version::TLS13]).await;
    let (_, conn) = server.get_mut();
    // The session tickets the server sends after the handshake went out.
    assert!(!conn.wants_write());
    client.write_all(&pattern(0, 200_000)).await.expect("write");
    client.flush().await.expect("flush");
    server.write_all(&pattern(0, 200_000)).await.expect("write");
    server.flush().await.expect("flush");
    let mut first = [0u8; 1];
    client.read_exact(&mut first).await.expect("read");
    assert!(client.held_bytes() > 0, "busy: records are buffered");
    let mut rest = vec![0u8; 200_000 - 1];
    client.read_exact(&mut rest).await.expect("read");
    check(&rest, 1);
    receive(&mut server, 200_000).await;
    // Everything sent has been read: the next read finds nothing.
    assert!(read_now(&mut client).is_pending());
    assert_eq!(client.held_bytes(), 0, "idle: no buffer held");
    // And it wakes up for more.
    server.write_all(&pattern(0, 5000)).await.expect("write");
    server.flush().await.expect("flush");
    receive(&mut client, 5000).await;
}

#[tokio::test]
async fn a_tls12_only_server_still_works() {
    let (client, server, _) = pair(&[&rustls::version::TLS12]).await;
    assert!(!client.is_records(), "TLS 1.2 stays with rustls");
    assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    tokio::join!(
        send(&mut cw, 2 * MIB, 100_000),
        send(&mut sw, 2 * MIB, 70_000),
        receive(&mut sr, 2 * MIB),
        receive(&mut cr, 2 * MIB),
    );
}

#[tokio::test]
async fn data_the_server_sends_with_its_finished_is_kept_for_the_record_layer() {
    use std::io::{Read, Write};
    let pki = pki("gateway.test");
    let mut cfg = (*server_config(&pki, &[&rustls::version::TLS13])).clone();
    // The server's first records come in the same flight as its Finished,
    // so the client reads them together with the handshake's last record.
    cfg.send_half_rtt_data = true;
    let cfg = Arc::new(cfg);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().expect("accept");
        let mut conn = rustls::ServerConnection::new(cfg).expect("server");
        conn.writer()
            .write_all(&pattern(0, 3000))
            .expect("half-RTT data");
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).expect("server handshake");
        }
        let mut got = [0u8; 5];
        rustls::Stream::new(&mut conn, &mut sock)
            .read_exact(&mut got)
            .expect("the client's answer");
        got
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut client = atunnel_tls::client::connect(client_config(&pki), pki.name.clone(), tcp)
        .await
        .expect("client handshake");
    assert!(client.is_records());
    receive(&mut client, 3000).await;
    client.write_all(b"thank").await.expect("write");
    client.flush().await.expect("flush");
    let got = tokio::task::spawn_blocking(move || server.join().expect("server thread"))
        .await
        .expect("join");
    assert_eq!(&got, b"thank");
}
