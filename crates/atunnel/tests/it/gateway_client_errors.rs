//! How the egress gateway client fails, over HTTP/1.1 and h2 under TLS 1.2
//! and 1.3: a hang-up before the CONNECT answer, a pooled connection that
//! died (retried once), refused streams (retried once, connection kept), a
//! gateway's stream limit, refusals and their bodies, and gateways it must
//! not trust. The misbehaving gateways are hand-made (rustls and the h2
//! crate's server) so they fail at exactly the moment under test.

use atunnel_support::prelude::*;

use crate::common::open_error;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atunnel::egress::ActorEgress;
use atunnel_connect::limits::{
    INITIAL_MAX_SEND_STREAMS, MAX_REFUSAL_BODY, OPEN_TIMEOUT as DEFAULT_OPEN_TIMEOUT,
    REFUSAL_BODY_WAIT as DEFAULT_REFUSAL_BODY_WAIT,
};
use atunnel_connect::{GatewayClientConfig, OpenError};
use atunnel_identity::clock::Clock;
use bytes::Bytes;
use rustls::ProtocolVersion;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// The fake gateways ignore the destination.
const DEST: &str = "192.0.2.10:443";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Proto {
    H2,
    H1,
}

impl Proto {
    fn alpn(self) -> &'static [u8] {
        match self {
            Proto::H2 => b"h2",
            Proto::H1 => b"http/1.1",
        }
    }
}

const VERSIONS: [&rustls::SupportedProtocolVersion; 2] =
    [&rustls::version::TLS12, &rustls::version::TLS13];

/// What a fake gateway does with one CONNECT.
#[derive(Clone, Debug)]
enum Answer {
    /// 200, then echoes the stream's bytes and its end.
    Echo,
    /// `status` and `body`. `ended`: the body's end is signalled
    /// (Content-Length, END_STREAM); if not, silence follows on a connection
    /// kept open.
    Refuse {
        status: u16,
        body: Bytes,
        ended: bool,
    },
    /// Closes the connection without an answer.
    HangUp,
    /// h2 only: RST_STREAM(REFUSED_STREAM), the connection carries on.
    RefuseStream,
}

/// How a fake gateway's connections end when it hangs up.
#[derive(Clone, Copy, Debug)]
enum Close {
    Fin,
    /// SO_LINGER 0: the connection is killed with an RST.
    Reset,
}

/// Answers by (connection number, CONNECT number on that connection), from 1.
type Script = Arc<dyn Fn(usize, usize) -> Answer + Send + Sync>;

/// A TLS handshake's version and ALPN protocol.
type Negotiated = (Option<ProtocolVersion>, Option<Vec<u8>>);

struct FakeGateway {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Each completed TLS handshake.
    negotiated: Arc<Mutex<Vec<Negotiated>>>,
    /// Owns the connections' tasks: aborting it ends them all.
    task: JoinHandle<()>,
}

impl FakeGateway {
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn negotiated(&self) -> Vec<Negotiated> {
        self.negotiated.lock().expect("lock").clone()
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway with the real gateway certificate, speaking only `version` and
/// `proto`, requesting no client certificate, answering CONNECTs by `script`.
async fn fake_gateway(
    pki: &Pki,
    version: &'static rustls::SupportedProtocolVersion,
    proto: Proto,
    close: Close,
    script: impl Fn(usize, usize) -> Answer + Send + Sync + 'static,
) -> FakeGateway {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[version])
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(pki.gateway_cert.chain.clone(), pki.gateway_cert.key())
    .expect("server config");
    tls.alpn_protocols = vec![proto.alpn().to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let negotiated = Arc::new(Mutex::new(Vec::new()));
    let script: Script = Arc::new(script);
    let (count, record) = (accepted.clone(), negotiated.clone());
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            if let Close::Reset = close {
                tcp.set_zero_linger().expect("SO_LINGER");
            }
            let (acceptor, record, script) = (acceptor.clone(), record.clone(), script.clone());
            connections.spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let session = tls.get_ref().1;
                record.lock().expect("lock").push((
                    session.protocol_version(),
                    session.alpn_protocol().map(<[u8]>::to_vec),
                ));
                match proto {
                    Proto::H2 => serve_h2(tls, n, &script).await,
                    Proto::H1 => serve_h1(tls, n, &script).await,
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    FakeGateway {
        addr,
        accepted,
        negotiated,
        task,
    }
}

async fn serve_h1(mut tls: TlsStream<tokio::net::TcpStream>, n: usize, script: &Script) {
    if atunnel_connect::http1::read_head(&mut tls).await.is_err() {
        return;
    }
    match script(n, 1) {
        // HTTP/1.1 has no stream to refuse.
        Answer::HangUp | Answer::RefuseStream => {}
        Answer::Echo => {
            if tls
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_ok()
            {
                let (mut r, mut w) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            }
        }
        Answer::Refuse {
            status,
            body,
            ended,
        } => {
            let mut out = format!("HTTP/1.1 {status} Refused\r\n").into_bytes();
            if ended {
                out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&body);
            if tls.write_all(&out).await.is_ok() && tls.flush().await.is_ok() {
                // Keep-alive: the connection stays open until the client leaves.
                let _ = tls.read(&mut [0u8; 1]).await;
            }
        }
    }
}

async fn serve_h2(tls: TlsStream<tokio::net::TcpStream>, n: usize, script: &Script) {
    let Ok(mut conn) = h2::server::handshake(tls).await else {
        return;
    };
    let mut echoes = JoinSet::new();
    // Streams whose refusal body never ends: held open, silent.
    let mut unended = Vec::new();
    let mut connects = 0;
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        connects += 1;
        match script(n, connects) {
            // Dropping the connection closes the socket under it, with
            // CONNECT's HEADERS received and unanswered.
            Answer::HangUp => return,
            Answer::RefuseStream => respond.send_reset(h2::Reason::REFUSED_STREAM),
            Answer::Echo => {
                if let Ok(send) = respond.send_response(http::Response::new(()), false) {
                    echoes.spawn(echo_h2(request.into_body(), send));
                }
            }
            Answer::Refuse {
                status,
                body,
                ended,
            } => {
                let response = http::Response::builder()
                    .status(status)
                    .body(())
                    .expect("response");
                if let Ok(mut send) = respond.send_response(response, false) {
                    let _ = send.send_data(body, ended);
                    if !ended {
                        unended.push(send);
                    }
                }
            }
        }
    }
}

/// An actor's egress (credential and client) for `cfg`.
async fn actor_egress(pki: &Pki, cfg: GatewayClientConfig) -> ActorEgress {
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    ActorEgress::prepare(actor("alpha"), cfg, source, Clock::new())
        .await
        .expect("prepare egress")
}

#[tokio::test]
async fn a_hang_up_after_the_tls_handshake_before_the_connect_answer_is_a_handshake_error() {
    let pki = Pki::new();
    for version in VERSIONS {
        for proto in [Proto::H1, Proto::H2] {
            for close in [Close::Fin, Close::Reset] {
                let case = format!("{:?} {proto:?} {close:?}", version.version);
                let gw = fake_gateway(&pki, version, proto, close, |_, _| Answer::HangUp).await;
                let egress = actor_egress(&pki, client_config(&pki, gw.addr)).await;
                let err = open_error(&egress, DEST).await;
                assert!(
                    matches!(err, OpenError::GatewayHandshake { .. }),
                    "{case}: {err}"
                );
                // The handshake completed as intended, so the hang-up came
                // after it.
                assert_eq!(
                    gw.negotiated(),
                    vec![(Some(version.version), Some(proto.alpn().to_vec()))],
                    "{case}"
                );
                // A fresh connection failing is the gateway's answer: no retry.
                assert_eq!(gw.accepted(), 1, "{case}");
            }
        }
    }
}

/// An HTTP/2 gateway over TLS 1.3 whose connections, where `script` says
/// to hang up, end with a reset (RST): as a crashed peer's do.
async fn h2_gateway_hanging_up_with_resets(
    pki: &Pki,
    script: impl Fn(usize, usize) -> Answer + Send + Sync + 'static,
) -> FakeGateway {
    fake_gateway(
        pki,
        &rustls::version::TLS13,
        Proto::H2,
        Close::Reset,
        script,
    )
    .await
}

/// Connection 1 answers its first CONNECT and kills itself (RST) at its
/// second, so the client's pooled connection still looks alive when the
/// stream is opened.
fn pooled_connection_dies_at_second_connect(conn: usize, connect: usize) -> Answer {
    if (conn, connect) == (1, 2) {
        Answer::HangUp
    } else {
        Answer::Echo
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_h2_connection_dying_at_the_connect_is_retried_once_on_a_fresh_one() {
    let pki = Pki::new();
    let gw =
        h2_gateway_hanging_up_with_resets(&pki, pooled_connection_dies_at_second_connect).await;
    let prepared = actor_egress(&pki, client_config(&pki, gw.addr)).await;
    let client = prepared.client().clone();
    let first = client.open_authority(DEST).await.expect("first tunnel");
    assert_eq!(first.protocol(), "h2");
    drop(first);
    assert_eq!(client.stats().h2_connections, 1);

    // The second tunnel carries an actor's socket, so its bytes are checked
    // end to end (actor, relay, h2 stream, gateway echo, and back).
    let a = actor("alpha");
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, DEST.parse().expect("addr"), &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");
    let up = random(256 * 1024, 11);
    let back = round_trip(addr, up.clone()).await;
    assert!(
        back == up,
        "the retried tunnel's echo came back altered ({} bytes)",
        back.len()
    );
    assert_eq!(gw.accepted(), 2, "one dead pooled connection, one fresh");
    let stats = egress.stats();
    assert_eq!((stats.tunnels_total, stats.open_failed_total), (1, 0));
    assert_eq!(
        client.stats().h2_connections,
        1,
        "the dead connection left the pool"
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_retry_that_dies_too_is_a_handshake_error_after_exactly_two_connections() {
    let pki = Pki::new();
    // Only connection 1's first CONNECT is answered; every later one, on any
    // connection, kills its connection.
    let gw = h2_gateway_hanging_up_with_resets(&pki, |conn, connect| {
        if (conn, connect) == (1, 1) {
            Answer::Echo
        } else {
            Answer::HangUp
        }
    })
    .await;
    let egress = actor_egress(&pki, client_config(&pki, gw.addr)).await;
    drop(
        egress
            .client()
            .open_authority(DEST)
            .await
            .expect("first tunnel"),
    );
    let err = open_error(&egress, DEST).await;
    assert!(matches!(err, OpenError::GatewayHandshake { .. }), "{err}");
    // open() has returned, so no further dial can be in flight.
    assert_eq!(gw.accepted(), 2, "retried once, not more");
}

/// The (connection, CONNECT) pairs a script is asked about, in order.
type Calls = Arc<Mutex<Vec<(usize, usize)>>>;

/// `script`, logging each call.
fn logged(
    script: fn(usize, usize) -> Answer,
) -> (
    Calls,
    impl Fn(usize, usize) -> Answer + Send + Sync + 'static,
) {
    let calls = Calls::default();
    let log = calls.clone();
    (calls, move |conn, connect| {
        log.lock().expect("lock").push((conn, connect));
        script(conn, connect)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_retried_once_and_its_connection_stays_in_use() {
    let pki = Pki::new();
    let (calls, script) = logged(|conn, connect| {
        if (conn, connect) == (1, 1) {
            Answer::RefuseStream
        } else {
            Answer::Echo
        }
    });
    let gw = fake_gateway(&pki, &rustls::version::TLS13, Proto::H2, Close::Fin, script).await;
    let egress = actor_egress(&pki, client_config(&pki, gw.addr)).await;
    let client = egress.client();
    for seed in [21, 22] {
        let mut tunnel = client.open_authority(DEST).await.expect("tunnel");
        let up = random(64 * 1024, seed);
        let back = echoed(&mut tunnel, &up).await;
        assert!(back == up, "echo came back altered ({} bytes)", back.len());
    }
    assert_eq!(
        *calls.lock().expect("lock"),
        vec![(1, 1), (1, 2), (1, 3)],
        "the retry and the next tunnel both went to the connection that refused"
    );
    assert_eq!(gw.accepted(), 1);
    assert_eq!(client.stats().h2_connections, 1, "still pooled");
}

#[tokio::test]
async fn a_stream_refused_again_on_the_retry_is_a_stream_refusal_not_a_handshake_error() {
    let pki = Pki::new();
    let (calls, script) = logged(|_, _| Answer::RefuseStream);
    let gw = fake_gateway(&pki, &rustls::version::TLS13, Proto::H2, Close::Fin, script).await;
    let egress = actor_egress(&pki, client_config(&pki, gw.addr)).await;
    match open_error(&egress, DEST).await {
        OpenError::StreamRefused { addr, authority } => {
            assert_eq!((addr, authority.as_str()), (gw.addr, DEST));
        }
        e => panic!("expected a stream refusal, got {e}"),
    }
    assert_eq!(
        *calls.lock().expect("lock"),
        vec![(1, 1), (1, 2)],
        "retried once, on the same connection"
    );
    assert_eq!(gw.accepted(), 1);
    assert_eq!(
        egress.client().stats().h2_connections,
        1,
        "a refused stream leaves its connection pooled"
    );
}

/// A TCP relay to `upstream` that counts the connections it accepts: how
/// many connections a client made to a real gateway.
async fn counting_relay(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let addr = destination(move |mut client| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            if let Ok(mut gateway) = tokio::net::TcpStream::connect(upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut gateway).await;
            }
        }
    })
    .await;
    (addr, accepted)
}

/// Before a fresh connection's SETTINGS arrive the client cannot know the
/// gateway allows only 2 streams; it must not send the burst there (the
/// gateway would refuse the rest, or h2 would hold them until a stream ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_cold_client_fills_connections_to_the_gateways_stream_limit() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |cfg| {
        cfg.max_concurrent_streams = 2
    })
    .await;
    let (relay, accepted) = counting_relay(gw.addr).await;
    let egress = actor_egress(&pki, client_config(&pki, relay)).await;
    let client = egress.client();
    let tunnels = open_at_once(client, 6, SINK_ECHO).await;
    let stats = client.stats();
    assert_eq!(
        (stats.h2_connections, stats.h2_streams),
        (3, 6),
        "{stats:?}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "none abandoned, none beyond what 2 streams each needs"
    );
    let echoes = tunnels
        .into_iter()
        .zip(0u64..)
        .map(|(mut tunnel, seed)| async move {
            let up = random(64 * 1024, seed);
            echoed(&mut tunnel, &up).await == up
        });
    assert_eq!(
        futures_util::future::join_all(echoes).await,
        vec![true; 6],
        "every tunnel's echo intact"
    );
}

#[test]
fn a_fresh_connection_opens_at_most_the_rfc_minimum_of_100_streams_before_settings() {
    assert_eq!(INITIAL_MAX_SEND_STREAMS, 100);
}

/// 10 KiB whose every prefix differs in length and content.
fn long_body() -> Bytes {
    (0..10 * 1024)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn a_refusal_keeps_its_status_and_the_first_4_kib_of_its_body() {
    assert_eq!(MAX_REFUSAL_BODY, 4096);
    let pki = Pki::new();
    let body = long_body();
    for proto in [Proto::H1, Proto::H2] {
        let answer = Answer::Refuse {
            status: 502,
            body: body.clone(),
            ended: true,
        };
        let gw = fake_gateway(
            &pki,
            &rustls::version::TLS13,
            proto,
            Close::Fin,
            move |_, _| answer.clone(),
        )
        .await;
        let egress = actor_egress(&pki, client_config(&pki, gw.addr)).await;
        match open_error(&egress, DEST).await {
            OpenError::ConnectRefused {
                authority,
                status,
                body: got,
            } => {
                assert_eq!((authority.as_str(), status), (DEST, 502), "{proto:?}");
                assert_eq!(got.len(), MAX_REFUSAL_BODY, "{proto:?}");
                assert!(
                    got.as_bytes() == &body[..MAX_REFUSAL_BODY],
                    "{proto:?}: not the body's first 4 KiB"
                );
            }
            e => panic!("{proto:?}: expected a refusal, got {e}"),
        }
    }
}

/// A refusal whose body has no end (no Content-Length on a kept-alive
/// HTTP/1.1 connection; no END_STREAM over h2) comes back with the body that
/// arrived, after the short body wait, not at the 10 s open timeout.
#[tokio::test]
async fn a_refusal_whose_body_never_ends_comes_back_promptly_with_what_arrived() {
    let pki = Pki::new();
    for proto in [Proto::H1, Proto::H2] {
        let gw = fake_gateway(&pki, &rustls::version::TLS13, proto, Close::Fin, |_, _| {
            Answer::Refuse {
                status: 403,
                body: Bytes::from_static(b"egress denied, and more to come"),
                ended: false,
            }
        })
        .await;
        let mut cfg = client_config(&pki, gw.addr);
        cfg.refusal_body_wait = Duration::from_millis(200);
        let egress = actor_egress(&pki, cfg).await;
        let started = Instant::now();
        let err = open_error(&egress, DEST).await;
        let took = started.elapsed();
        match err {
            OpenError::ConnectRefused { status, body, .. } => {
                assert_eq!(status, 403, "{proto:?}");
                assert_eq!(body, "egress denied, and more to come", "{proto:?}");
            }
            e => panic!("{proto:?}: expected a refusal, got {e}"),
        }
        // The configured 200 ms wait for the body (after the handshake),
        // not the open timeout or another bound: measured 244-248 ms.
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{proto:?}: the refusal took {took:?}"
        );
    }
}

#[tokio::test]
async fn a_gateway_certificate_the_client_cannot_trust_is_a_handshake_error() {
    let pki = Pki::new();
    // A gateway with the right name, signed by a CA the client does not trust.
    let impostor = Pki::new();
    for version in VERSIONS {
        for proto in [Proto::H1, Proto::H2] {
            for (what, gateway_pki, name) in [
                ("untrusted CA", &impostor, GATEWAY_NAME),
                ("wrong name", &pki, "other-gateway.ate-system.svc"),
            ] {
                let case = format!("{what} {:?} {proto:?}", version.version);
                let mut gw = gateway(gateway_pki, SinkConfig::default(), |cfg| {
                    cfg.alpn = vec![proto.alpn().to_vec()];
                    cfg.tls_versions = vec![version];
                })
                .await;
                let mut cfg = client_config(&pki, gw.addr);
                cfg.server_name = ServerName::try_from(name).expect("name");
                let egress = actor_egress(&pki, cfg).await;
                match open_error(&egress, DEST).await {
                    OpenError::GatewayHandshake { reason, .. } => assert!(
                        reason.contains("invalid peer certificate"),
                        "{case}: {reason}"
                    ),
                    e => panic!("{case}: expected a handshake error, got {e}"),
                }
                assert!(
                    gw.seen.try_recv().is_err(),
                    "{case}: a CONNECT reached the gateway"
                );
            }
        }
    }
}

#[test]
fn opening_a_tunnel_is_bounded_by_10_s_by_default() {
    assert_eq!(DEFAULT_OPEN_TIMEOUT, Duration::from_secs(10));
    let cfg = GatewayClientConfig::new(
        "127.0.0.1:1".parse().expect("addr"),
        ServerName::try_from(GATEWAY_NAME).expect("name"),
        Pki::new().gateway_roots(),
    );
    assert_eq!(cfg.open_timeout, Duration::from_secs(10));
    // A body without an end waits this long, well inside the open timeout.
    assert_eq!(DEFAULT_REFUSAL_BODY_WAIT, Duration::from_millis(250));
    assert_eq!(cfg.refusal_body_wait, DEFAULT_REFUSAL_BODY_WAIT);
}
