//! A server TLS stream putting rustls down for its traffic keys
//! (`ServerTls::hibernate`), against a real rustls client over real
//! sockets: bytes both ways before, between and after hibernations, a clean
//! close_notify, key updates, and the cases where it must refuse (part of a
//! record received, TLS 1.2) or end the connection (a forged record).
//! `hibernated_tls.rs` compares it with rustls and checks every alert.

use std::io::Write;
use std::sync::Arc;

use atunnel_tls::stream::ServerTls;
use rand::{Rng, RngCore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod common;
use common::{Client, Pki, pki, provider};

fn server_config(
    pki: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ServerConfig> {
    let mut cfg = common::server_config(pki, provider(), versions);
    cfg.key_log = atunnel_tls::secrets::key_log();
    Arc::new(cfg)
}

fn client_config(pki: &Pki) -> Arc<rustls::ClientConfig> {
    Arc::new(common::client_config(pki))
}

/// A connected pair: atunnel's server stream and a tokio-rustls client.
async fn pair(versions: &[&'static rustls::SupportedProtocolVersion]) -> (ServerTls, Client) {
    let pki = pki("server.test");
    common::connected(
        server_config(&pki, versions),
        client_config(&pki),
        pki.name.clone(),
    )
    .await
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rng().fill_bytes(&mut v);
    v
}

/// `to_server` from the client and `to_client` from the server, both at
/// once, each checked intact on arrival.
async fn both_ways(
    server: &mut ServerTls,
    client: &mut Client,
    to_server: &[u8],
    to_client: &[u8],
) {
    // The server's bytes in one write, as the client's.
    let (server_got, client_got) =
        common::exchange(server, client, to_server, to_client, to_client.len().max(1)).await;
    assert!(
        server_got == to_server,
        "server received other bytes than sent"
    );
    assert!(
        client_got == to_client,
        "client received other bytes than sent"
    );
}

#[tokio::test]
async fn bytes_flow_both_ways_before_between_and_after_hibernations() {
    let (mut server, mut client) = pair(rustls::DEFAULT_VERSIONS).await;
    let mut rng = rand::rng();
    both_ways(&mut server, &mut client, b"before", b"hello").await;
    assert!(!server.is_records());
    for round in 0..3 {
        assert!(
            server.hibernate(),
            "round {round}: an idle TLS 1.3 stream hibernates"
        );
        assert!(server.is_records());
        // Up to 4 MiB each way: many full records and a partial one.
        let up = random_bytes(rng.random_range(1..4 << 20));
        let down = random_bytes(rng.random_range(1..4 << 20));
        both_ways(&mut server, &mut client, &up, &down).await;
        both_ways(&mut server, &mut client, b"x", b"y").await;
    }
    // Half-close from the client: the server reads a clean end, can still
    // answer, then closes; the client sees close_notify, not an error.
    let ((server_end, rest), (client_end, tail)) =
        common::half_close(&mut server, &mut client).await;
    server_end.expect("server sees a clean end");
    assert!(rest.is_empty());
    client_end.expect("client sees close_notify");
    assert_eq!(tail, b"bye");
}

#[tokio::test]
async fn tls12_connections_stay_with_rustls_and_keep_working() {
    let (mut server, mut client) = pair(&[&rustls::version::TLS12]).await;
    both_ways(&mut server, &mut client, b"ping", b"pong").await;
    assert!(!server.hibernate());
    assert!(!server.is_records());
    both_ways(&mut server, &mut client, &random_bytes(100_000), b"ok").await;
}

#[tokio::test]
async fn key_updates_before_and_after_hibernation_are_followed() {
    let (mut server, mut client) = pair(rustls::DEFAULT_VERSIONS).await;
    both_ways(&mut server, &mut client, b"a", b"b").await;
    // While with rustls: the hibernated stream must start from the secrets
    // of the keys rustls moved to, not the handshake's.
    for _ in 0..2 {
        client
            .get_mut()
            .1
            .refresh_traffic_keys()
            .expect("client key update");
        both_ways(&mut server, &mut client, b"before", b"hibernating").await;
    }
    assert!(server.hibernate());
    for round in 0..3 {
        client
            .get_mut()
            .1
            .refresh_traffic_keys()
            .expect("client key update");
        both_ways(&mut server, &mut client, b"after", b"answer").await;
        assert!(server.hibernate(), "round {round}");
    }
}

/// A blocking rustls client on a plain socket, for sending records byte by
/// byte or altered.
struct RawClient {
    tcp: std::net::TcpStream,
    conn: rustls::ClientConnection,
}

impl RawClient {
    /// The TLS records carrying `data`.
    fn records(&mut self, data: &[u8]) -> Vec<u8> {
        self.conn.writer().write_all(data).expect("plaintext");
        let mut out = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut out).expect("records");
        }
        out
    }

    fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).expect("send");
    }
}

async fn raw_pair() -> (ServerTls, RawClient) {
    let pki = pki("server.test");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server_cfg = server_config(&pki, rustls::DEFAULT_VERSIONS);
    let client_cfg = client_config(&pki);
    let name = pki.name.clone();
    let client = tokio::task::spawn_blocking(move || {
        let (tcp, conn) = common::blocking_client(addr, client_cfg, name);
        RawClient { tcp, conn }
    });
    let mut server = common::accept(&listener, server_cfg).await;
    let mut client = client.await.expect("client task");
    // The server's session tickets arrive after the handshake; read them so
    // that nothing is left in flight toward the client.
    let ping = client.records(b"ping");
    client.send(&ping);
    let mut got = [0u8; 4];
    server.read_exact(&mut got).await.expect("ping");
    assert_eq!(&got, b"ping");
    (server, client)
}

/// Polls one read without waiting: the server takes in whatever the socket
/// has and reports whether that made plaintext.
async fn read_available(server: &mut ServerTls) -> Option<Vec<u8>> {
    let mut buf = [0u8; 256];
    std::future::poll_fn(|cx| {
        let mut rb = tokio::io::ReadBuf::new(&mut buf);
        match std::pin::Pin::new(&mut *server).poll_read(cx, &mut rb) {
            std::task::Poll::Pending => std::task::Poll::Ready(None),
            std::task::Poll::Ready(r) => {
                r.expect("read");
                std::task::Poll::Ready(Some(rb.filled().to_vec()))
            }
        }
    })
    .await
}

#[tokio::test]
async fn part_of_a_record_received_keeps_the_connection_with_rustls() {
    let (mut server, mut client) = raw_pair().await;
    let record = client.records(b"split across hibernation attempts");
    client.send(&record[..3]);
    server
        .tcp()
        .expect("socket")
        .readable()
        .await
        .expect("readable");
    assert_eq!(
        read_available(&mut server).await,
        None,
        "only part of a record"
    );
    assert!(!server.hibernate(), "rustls holds part of a record");
    assert!(!server.is_records());
    client.send(&record[3..]);
    let mut got = vec![0u8; b"split across hibernation attempts".len()];
    server.read_exact(&mut got).await.expect("read");
    assert_eq!(got, b"split across hibernation attempts");
    // At a record boundary it goes, and the next record, sent one byte at
    // a time, still arrives whole.
    assert!(server.hibernate());
    let record = client.records(b"byte by byte");
    for b in &record {
        client.send(std::slice::from_ref(b));
    }
    let mut got = vec![0u8; b"byte by byte".len()];
    server.read_exact(&mut got).await.expect("read");
    assert_eq!(got, b"byte by byte");
}

#[tokio::test]
async fn an_altered_record_after_hibernation_is_refused() {
    let (mut server, mut client) = raw_pair().await;
    assert!(server.hibernate());
    let mut record = client.records(b"genuine");
    let last = record.len() - 1;
    record[last] ^= 1;
    client.send(&record);
    let err = server
        .read(&mut [0u8; 64])
        .await
        .expect_err("a forged record must not be read");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("bad_record_mac"), "{err}");
}

#[tokio::test]
async fn a_peer_closing_without_close_notify_is_an_error_not_an_end() {
    let (mut server, client) = raw_pair().await;
    assert!(server.hibernate());
    // A FIN with no close_notify before it (dropping the socket would reset
    // it: the client left the server's session tickets unread).
    client.tcp.shutdown(std::net::Shutdown::Write).expect("FIN");
    let err = server
        .read(&mut [0u8; 64])
        .await
        .expect_err("truncation is not a clean end");
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
}

#[tokio::test]
async fn a_hibernated_stream_seals_a_whole_answer_in_one_write() {
    let (mut server, mut client) = pair(rustls::DEFAULT_VERSIONS).await;
    both_ways(&mut server, &mut client, b"request", b"answer").await;
    assert!(server.hibernate());
    // A 60 KB answer, as hyper hands it over: one write takes all of it
    // (four records, one syscall), not one 16 KiB record per write.
    let answer = random_bytes(60_000);
    let took = server.write(&answer).await.expect("write");
    assert_eq!(took, answer.len(), "one write sealed only {took} bytes");
    server.flush().await.expect("flush");
    let mut got = vec![0u8; answer.len()];
    client.read_exact(&mut got).await.expect("client read");
    assert!(got == answer, "client received other bytes than sent");
    // Past the batch, a write takes a batch's worth and the rest follows.
    let big = random_bytes(200_000);
    let took = server.write(&big).await.expect("write");
    assert_eq!(took, 4 * 16 * 1024);
    server
        .write_all(&big[took..])
        .await
        .expect("write the rest");
    server.flush().await.expect("flush");
    let mut got = vec![0u8; big.len()];
    client.read_exact(&mut got).await.expect("client read");
    assert!(got == big, "client received other bytes than sent");
}
