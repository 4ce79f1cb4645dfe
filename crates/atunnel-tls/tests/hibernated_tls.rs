//! The hibernated TLS path against RFC 8446 sections 5 and 6 and against
//! rustls itself: the same client traffic (key updates both ways included)
//! gets the same bytes and the same end from a connection that stays with
//! rustls and from one that hibernated; every error the peer causes is
//! answered with the alert the RFC names before the write side closes, and
//! the peer's own alerts end the connection unanswered.

use std::io::{Read as _, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel_tls::records::{self, Direction, Suite, TlsError};
use atunnel_tls::secrets::Secret;
use atunnel_tls::stream::ServerTls;
use rand::{RngCore, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod common;
use common::{Client, Pki, accept, pki};

/// A server offering ChaCha20-Poly1305 only, with a confidentiality limit
/// of `limit` records so that the server's own key updates come soon.
fn server_config(pki: &Pki, limit: u64) -> Arc<rustls::ServerConfig> {
    let rustls::SupportedCipherSuite::Tls13(base) =
        rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256
    else {
        unreachable!("a TLS 1.3 suite")
    };
    let suite: &'static rustls::Tls13CipherSuite = Box::leak(Box::new(rustls::Tls13CipherSuite {
        common: rustls::CipherSuiteCommon {
            confidentiality_limit: limit,
            ..base.common
        },
        ..*base
    }));
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![rustls::SupportedCipherSuite::Tls13(suite)];
    let mut cfg = common::server_config(pki, Arc::new(provider), &[&rustls::version::TLS13]);
    cfg.key_log = atunnel_tls::secrets::key_log();
    Arc::new(cfg)
}

/// The client's own traffic secrets, to seal and open records by hand.
#[derive(Debug, Default)]
struct ClientLog(Mutex<Vec<(String, Vec<u8>)>>);

impl rustls::KeyLog for ClientLog {
    fn log(&self, label: &str, _: &[u8], secret: &[u8]) {
        self.0
            .lock()
            .expect("log")
            .push((label.to_string(), secret.to_vec()));
    }
}

impl ClientLog {
    fn secret(&self, label: &str) -> Secret {
        let log = self.0.lock().expect("log");
        let (_, s) = log.iter().find(|(l, _)| l == label).expect("logged");
        Secret::new(s).expect("a TLS 1.3 secret")
    }
}

fn client_config(pki: &Pki, log: Arc<ClientLog>) -> Arc<rustls::ClientConfig> {
    let mut cfg = common::client_config(pki);
    cfg.enable_secret_extraction = true;
    cfg.key_log = log;
    Arc::new(cfg)
}

async fn pair(limit: u64) -> (ServerTls, Client, Arc<ClientLog>) {
    let pki = pki("server.test");
    let log = Arc::new(ClientLog::default());
    let (server, client) = common::connected(
        server_config(&pki, limit),
        client_config(&pki, log.clone()),
        pki.name.clone(),
    )
    .await;
    (server, client, log)
}

/// What one side read, in order, and how its reads ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Transcript {
    server_got: Vec<u8>,
    client_got: Vec<u8>,
    ends: Vec<String>,
    /// The client's sequence numbers at the end: equal only if both servers
    /// updated their keys at the same records.
    client_rx_seq: u64,
    client_tx_seq: u64,
}

/// One script of client and server traffic; `hibernate` puts the server
/// down between every step.
async fn script(hibernate: bool) -> Transcript {
    let (mut server, mut client, _log) = pair(8).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut bytes = |n: usize| {
        let mut v = vec![0u8; n];
        rng.fill_bytes(&mut v);
        v
    };
    // Each step: the key updates the client makes first (asking the server
    // to update too, 4.6.3), then the bytes to the server and those to the
    // client, which the server writes a record of the last figure's size at
    // a time.
    let steps = [
        // Ten records from the server: it crosses its 8-record limit and
        // updates its keys before it first hibernates, so the keys it hands
        // over are not those of the key log's secret, and the key update
        // in the next step must find their generation.
        (0, b"hello".to_vec(), bytes(1_000), 100),
        (1, bytes(70_000), bytes(50_000), 16_384),
        // Many small records: the server crosses its 8-record limit and
        // updates its own keys, several times; the client answers each.
        (0, bytes(3_000), bytes(2_000), 50),
        (2, bytes(1), bytes(30_000), 1_000),
        (0, bytes(200), bytes(200), 7),
    ];
    let mut t = Transcript::default();
    for (key_updates, to_server, to_client, chunk) in steps {
        for _ in 0..key_updates {
            client.get_mut().1.refresh_traffic_keys().expect("update");
        }
        let (s, c) =
            common::exchange(&mut server, &mut client, &to_server, &to_client, chunk).await;
        t.server_got.extend_from_slice(&s);
        t.client_got.extend_from_slice(&c);
        if hibernate {
            assert!(server.hibernate(), "an idle connection hibernates");
        }
    }
    // The client closes its side; the server reads the end, answers, and
    // closes too.
    let ((server_end, rest), (client_end, tail)) =
        common::half_close(&mut server, &mut client).await;
    t.ends.push(format!(
        "server: {:?} after {} bytes",
        server_end.map(|_| ()),
        rest.len()
    ));
    t.ends
        .push(format!("client: {:?} {:?}", client_end.map(|_| ()), tail));
    let (_, conn) = client.into_inner();
    let secrets = conn.dangerous_extract_secrets().expect("client secrets");
    (t.client_rx_seq, t.client_tx_seq) = (secrets.rx.0, secrets.tx.0);
    t
}

#[tokio::test]
async fn a_hibernated_connection_behaves_as_one_that_stays_with_rustls() {
    let with_rustls = script(false).await;
    let hibernated = script(true).await;
    assert_eq!(
        with_rustls.ends,
        [
            "server: Ok(()) after 0 bytes",
            "client: Ok(()) [98, 121, 101]"
        ]
    );
    assert!(
        with_rustls == hibernated,
        "the same traffic gave other results:\nwith rustls: ends {:?}, seqs {} {}\nhibernated: ends {:?}, seqs {} {}, bytes equal: {} {}",
        with_rustls.ends,
        with_rustls.client_rx_seq,
        with_rustls.client_tx_seq,
        hibernated.ends,
        hibernated.client_rx_seq,
        hibernated.client_tx_seq,
        with_rustls.server_got == hibernated.server_got,
        with_rustls.client_got == hibernated.client_got,
    );
}

/// A client on a blocking socket that seals and opens records by hand with
/// its own traffic secrets, to send what rustls never would.
struct RawClient {
    tcp: std::net::TcpStream,
    tx: Direction,
    rx: Direction,
}

async fn raw_pair() -> (ServerTls, RawClient) {
    let pki = pki("server.test");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::new(ClientLog::default());
    let client_cfg = client_config(&pki, log.clone());
    let name = pki.name.clone();
    let client = tokio::task::spawn_blocking(move || {
        let (mut tcp, mut conn) = common::blocking_client(addr, client_cfg, name);
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        conn.writer().write_all(b"ping").expect("ping");
        while conn.wants_write() {
            conn.write_tls(&mut tcp).expect("send");
        }
        (tcp, conn)
    });
    // No session tickets: nothing of the server's is in flight toward the
    // client when it takes its keys.
    let mut cfg = Arc::unwrap_or_clone(server_config(&pki, u64::MAX));
    cfg.send_tls13_tickets = 0;
    let mut server = accept(&listener, Arc::new(cfg)).await;
    let mut got = [0u8; 4];
    server.read_exact(&mut got).await.expect("ping");
    let (tcp, conn) = client.await.expect("client task");
    let suite = Suite::of(conn.negotiated_cipher_suite().expect("suite"))
        .expect("a suite ours")
        .0;
    let keys = conn.dangerous_extract_secrets().expect("client secrets");
    let tx = Direction::resume(
        suite,
        &log.secret("CLIENT_TRAFFIC_SECRET_0"),
        keys.tx.0,
        &keys.tx.1,
    )
    .expect("client tx");
    let rx = Direction::resume(
        suite,
        &log.secret("SERVER_TRAFFIC_SECRET_0"),
        keys.rx.0,
        &keys.rx.1,
    )
    .expect("client rx");
    (server, RawClient { tcp, tx, rx })
}

impl RawClient {
    fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).expect("send");
    }

    fn seal(&mut self, content_type: u8, content: &[u8], padding: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.tx
            .seal_padded(content_type, content, padding, &mut out)
            .expect("seal");
        out
    }

    /// Every record the server sends until it closes, opened: (content
    /// type, content).
    fn records_until_closed(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut bytes = Vec::new();
        let _ = self.tcp.read_to_end(&mut bytes);
        let mut records = Vec::new();
        while let Ok(Some(len)) = records::record_len(&bytes) {
            let mut record: Vec<u8> = bytes.drain(..len).collect();
            let (t, range) = self.rx.open(&mut record).expect("a server record");
            records.push((t, record[range].to_vec()));
        }
        assert!(bytes.is_empty(), "a partial record at the end: {bytes:?}");
        records
    }
}

/// What a server sent and why it ended, for `bytes` sent to it.
async fn refused(
    mut server: ServerTls,
    client: &mut RawClient,
    bytes: &[u8],
) -> (Option<u8>, Vec<(u8, Vec<u8>)>) {
    client.send(bytes);
    let read = async {
        loop {
            match server.read(&mut [0u8; 64]).await {
                Ok(0) => panic!("the server read an end, not an error"),
                Ok(_) => continue,
                Err(e) => break e,
            }
        }
    };
    let err = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server refuses the bytes within 10 s");
    let alert = TlsError::of(&err).and_then(|e| e.alert);
    drop(server);
    (alert, client.records_until_closed())
}

#[derive(Clone, Copy, Debug)]
enum Case {
    Altered,
    KeyUpdateTooLong,
    KeyUpdateBadRequest,
    KeyUpdateNotLastInRecord,
    OtherHandshakeMessage,
    ProtectedChangeCipherSpec,
    PlainChangeCipherSpec,
    PlaintextOver2To14,
    CiphertextOver2To14Plus256,
    AllZeroPadding,
    EmptyAlert,
    EmptyHandshake,
    UnknownRecordType,
    DataInsideAFragmentedKeyUpdate,
    MalformedAlert,
    UnknownAlertLevel,
    ThirtyThreeEmptyRecords,
}

impl Case {
    fn bytes(self, c: &mut RawClient) -> Vec<u8> {
        use records::*;
        match self {
            Case::Altered => {
                let mut r = c.seal(CONTENT_APPLICATION_DATA, b"genuine", 0);
                let last = r.len() - 1;
                r[last] ^= 1;
                r
            }
            Case::KeyUpdateTooLong => c.seal(CONTENT_HANDSHAKE, &[24, 0, 0, 2, 0, 0], 0),
            Case::KeyUpdateBadRequest => c.seal(CONTENT_HANDSHAKE, &[24, 0, 0, 1, 2], 0),
            Case::KeyUpdateNotLastInRecord => {
                c.seal(CONTENT_HANDSHAKE, &[24, 0, 0, 1, 0, 24, 0], 0)
            }
            // A well-formed Finished: a server takes only KeyUpdate now.
            Case::OtherHandshakeMessage => {
                let mut finished = vec![20, 0, 0, 32];
                finished.resize(4 + 32, 9);
                c.seal(CONTENT_HANDSHAKE, &finished, 0)
            }
            Case::ProtectedChangeCipherSpec => c.seal(CONTENT_CHANGE_CIPHER_SPEC, &[1], 0),
            Case::PlainChangeCipherSpec => vec![20, 3, 3, 0, 1, 1],
            Case::PlaintextOver2To14 => c.seal(CONTENT_APPLICATION_DATA, &[b'x'; MAX_PLAINTEXT], 1),
            Case::CiphertextOver2To14Plus256 => {
                let len = MAX_PLAINTEXT + 257;
                let mut r = vec![23, 3, 3, (len >> 8) as u8, len as u8];
                r.resize(HEADER_LEN + len, 7);
                r
            }
            Case::AllZeroPadding => c.seal(0, &[], 10),
            Case::EmptyAlert => c.seal(CONTENT_ALERT, &[], 0),
            Case::EmptyHandshake => c.seal(CONTENT_HANDSHAKE, &[], 0),
            Case::UnknownRecordType => vec![
                99, 3, 3, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
            Case::DataInsideAFragmentedKeyUpdate => {
                let mut r = c.seal(CONTENT_HANDSHAKE, &[24, 0], 0);
                r.extend(c.seal(CONTENT_APPLICATION_DATA, b"x", 0));
                r
            }
            Case::MalformedAlert => c.seal(CONTENT_ALERT, &[2, 40, 0], 0),
            Case::UnknownAlertLevel => c.seal(CONTENT_ALERT, &[3, 40], 0),
            Case::ThirtyThreeEmptyRecords => {
                let mut r = Vec::new();
                for _ in 0..33 {
                    r.extend(c.seal(CONTENT_APPLICATION_DATA, &[], 0));
                }
                r
            }
        }
    }
}

/// Each case, the alert the RFC asks for, and whether rustls answers with
/// that alert too (where it does not, the connection that stays with
/// rustls is not compared).
const ALERTS: [(Case, u8, bool); 17] = {
    use records::*;
    [
        (Case::Altered, ALERT_BAD_RECORD_MAC, true),
        (Case::KeyUpdateTooLong, ALERT_DECODE_ERROR, true),
        (Case::KeyUpdateBadRequest, ALERT_ILLEGAL_PARAMETER, true),
        (
            Case::KeyUpdateNotLastInRecord,
            ALERT_UNEXPECTED_MESSAGE,
            false,
        ),
        (Case::OtherHandshakeMessage, ALERT_UNEXPECTED_MESSAGE, true),
        (
            Case::ProtectedChangeCipherSpec,
            ALERT_UNEXPECTED_MESSAGE,
            true,
        ),
        (Case::PlainChangeCipherSpec, ALERT_UNEXPECTED_MESSAGE, true),
        (Case::PlaintextOver2To14, ALERT_RECORD_OVERFLOW, true),
        (
            Case::CiphertextOver2To14Plus256,
            ALERT_RECORD_OVERFLOW,
            false,
        ),
        (Case::AllZeroPadding, ALERT_UNEXPECTED_MESSAGE, false),
        (Case::EmptyAlert, ALERT_UNEXPECTED_MESSAGE, false),
        (Case::EmptyHandshake, ALERT_UNEXPECTED_MESSAGE, false),
        (Case::UnknownRecordType, ALERT_UNEXPECTED_MESSAGE, false),
        (
            Case::DataInsideAFragmentedKeyUpdate,
            ALERT_UNEXPECTED_MESSAGE,
            false,
        ),
        (Case::MalformedAlert, ALERT_DECODE_ERROR, false),
        (Case::UnknownAlertLevel, ALERT_ILLEGAL_PARAMETER, true),
        (
            Case::ThirtyThreeEmptyRecords,
            ALERT_UNEXPECTED_MESSAGE,
            false,
        ),
    ]
};

#[tokio::test]
async fn every_error_after_hibernation_is_answered_with_its_alert_before_the_close() {
    use records::*;
    for (case, alert, _) in ALERTS {
        let (mut server, mut client) = raw_pair().await;
        assert!(server.hibernate());
        let bytes = case.bytes(&mut client);
        let (sent, records) = refused(server, &mut client, &bytes).await;
        assert_eq!(sent, Some(alert), "{case:?}");
        assert_eq!(
            records,
            [(CONTENT_ALERT, vec![LEVEL_FATAL, alert])],
            "{case:?}: one fatal alert, then the close"
        );
    }
}

/// The errors where rustls sends the same alert as the RFC asks: the
/// connection that stays with rustls answers as the hibernated one does.
#[tokio::test]
async fn where_rustls_follows_the_rfc_it_answers_errors_with_the_same_alerts() {
    use records::*;
    for (case, alert, rustls_agrees) in ALERTS {
        if !rustls_agrees {
            continue;
        }
        let (server, mut client) = raw_pair().await;
        let bytes = case.bytes(&mut client);
        let (_, records) = refused(server, &mut client, &bytes).await;
        assert_eq!(
            records,
            [(CONTENT_ALERT, vec![LEVEL_FATAL, alert])],
            "{case:?}: rustls"
        );
    }
}

#[tokio::test]
async fn a_peers_error_alert_ends_the_connection_unanswered_whatever_its_level() {
    for level in [records::LEVEL_FATAL, records::LEVEL_WARNING] {
        let (mut server, mut client) = raw_pair().await;
        assert!(server.hibernate());
        let bytes = client.seal(records::CONTENT_ALERT, &[level, 40], 0);
        let (sent, records) = refused(server, &mut client, &bytes).await;
        assert_eq!(sent, None, "level {level}");
        assert!(records.is_empty(), "level {level}: {records:?}");
    }
}

#[tokio::test]
async fn legal_but_odd_traffic_after_hibernation_carries_on() {
    use records::*;
    let (mut server, mut client) = raw_pair().await;
    assert!(server.hibernate());
    let mut bytes = Vec::new();
    // 32 empty records in a row (legal, 5.4; rustls's bound), a
    // user_canceled warning, padding, and a key update split over three
    // records, then data under the new key.
    for _ in 0..32 {
        bytes.extend(client.seal(CONTENT_APPLICATION_DATA, &[], 0));
    }
    bytes.extend(client.seal(CONTENT_APPLICATION_DATA, b"one ", 300));
    bytes.extend(client.seal(CONTENT_ALERT, &[LEVEL_WARNING, ALERT_USER_CANCELED], 0));
    bytes.extend(client.seal(CONTENT_HANDSHAKE, &[24], 0));
    bytes.extend(client.seal(CONTENT_HANDSHAKE, &[0, 0, 1], 0));
    bytes.extend(client.seal(CONTENT_HANDSHAKE, &[1], 0));
    client
        .tx
        .next_generation()
        .expect("the client's key update");
    bytes.extend(client.seal(CONTENT_APPLICATION_DATA, b"two", 0));
    // Sent one byte at a time.
    for b in &bytes {
        client.send(std::slice::from_ref(b));
    }
    let mut got = [0u8; 7];
    server.read_exact(&mut got).await.expect("read");
    assert_eq!(&got, b"one two");
    // The client asked for an update: the server's next record comes after
    // a KeyUpdate of its own, under its next key.
    server.write_all(b"three").await.expect("write");
    server.flush().await.expect("flush");
    // close_notify, then bytes that must be ignored.
    let mut close = client.seal(CONTENT_ALERT, &CLOSE_NOTIFY, 0);
    close.extend_from_slice(b"ignored after close_notify");
    client.send(&close);
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.expect("a clean end");
    assert!(rest.is_empty());
    server.shutdown().await.expect("close_notify");
    let records = client.records_until_after_key_update();
    assert_eq!(
        records,
        [
            (CONTENT_HANDSHAKE, vec![24, 0, 0, 1, 0]),
            (CONTENT_APPLICATION_DATA, b"three".to_vec()),
            (CONTENT_ALERT, CLOSE_NOTIFY.to_vec()),
        ]
    );
}

impl RawClient {
    /// As `records_until_closed`, following the server's key updates.
    fn records_until_after_key_update(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut bytes = Vec::new();
        let _ = self.tcp.read_to_end(&mut bytes);
        let mut records = Vec::new();
        while let Ok(Some(len)) = records::record_len(&bytes) {
            let mut record: Vec<u8> = bytes.drain(..len).collect();
            let (t, range) = self.rx.open(&mut record).expect("a server record");
            let content = record[range].to_vec();
            if t == records::CONTENT_HANDSHAKE && content.first() == Some(&24) {
                self.rx.next_generation().expect("the server's key update");
            }
            records.push((t, content));
        }
        records
    }
}
