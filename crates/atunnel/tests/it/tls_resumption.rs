//! TLS session resumption against certificate expiry, with real rustls peers
//! on loopback. rustls restores a resumed session's client chain from its
//! ticket without verifying it again and hands out new tickets carrying it,
//! so the ingress and the gateway check the client's leaf after every
//! handshake; the gateway client does not resume at all.

use atunnel_support::prelude::*;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use atunnel::ingress::ROUTER_SPIFFE_ID;
use atunnel_identity::clock::Clock;
use atunnel_identity::pki::{Usage, actor_csr, new_actor_key};
use atunnel_identity::verifier::{LeafValidityError, check_leaf_validity};
use bytes::Bytes;
use http_body_util::Full;
use rustls::HandshakeKind;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
const TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

/// Lifetime of the short-lived client certificates. X.509 keeps whole
/// seconds, so one is valid for at least this long after it is issued, and
/// has expired at most a second after that (see [`surely_expired_at`]).
/// Three seconds leave room for four handshakes on a loaded machine.
const LIFETIME: Duration = Duration::from_secs(3);

/// When a certificate issued before `issued_by`, for [`LIFETIME`], has
/// expired: its not_after is at most `issued_by + LIFETIME` truncated to
/// the second, and it is valid through that whole second (as in webpki).
fn surely_expired_at(issued_by: SystemTime) -> SystemTime {
    let not_after = (issued_by + LIFETIME)
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    UNIX_EPOCH + Duration::from_secs(not_after + 1)
}

/// One client that resumes (its config keeps the session cache) and what it
/// asks of the server on each connection.
struct Client {
    what: String,
    cfg: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    server_name: &'static str,
    request: Vec<u8>,
    /// How the server's answer ends when the request was served.
    reply: Vec<u8>,
}

/// How one connection went: its handshake (None if it failed) and the
/// answer to the request, or why none came.
struct Attempt {
    kind: Option<HandshakeKind>,
    answer: io::Result<Vec<u8>>,
}

impl Client {
    async fn attempt(&self) -> Attempt {
        let mut tls = match tls_connect(&self.cfg, self.addr, self.server_name).await {
            Ok(tls) => tls,
            Err(e) => {
                return Attempt {
                    kind: None,
                    answer: Err(e),
                };
            }
        };
        let kind = tls.get_ref().1.handshake_kind();
        let exchange = async {
            tls.write_all(&self.request).await?;
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(&self.reply) {
                let n = tls.read(&mut buf).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("closed after {:?}", String::from_utf8_lossy(&got)),
                    ));
                }
                got.extend_from_slice(&buf[..n]);
            }
            Ok(got)
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()));
        Attempt { kind, answer }
    }
}

/// The specification both servers meet: while `leaf` is valid each client
/// is served on a full handshake, then on a resumed one; once it has
/// expired, each client still resumes (its ticket came from a resumed
/// session) and is closed without being served.
async fn resumption_ends_when_the_certificate_expires(
    clients: &[Client],
    leaf: &CertificateDer<'_>,
    issued_by: SystemTime,
) {
    for client in clients {
        for want in [HandshakeKind::Full, HandshakeKind::Resumed] {
            let attempt = client.attempt().await;
            assert_eq!(attempt.kind, Some(want), "{}", client.what);
            let answer = attempt
                .answer
                .unwrap_or_else(|e| panic!("{}: {want:?} handshake not served: {e}", client.what));
            assert!(
                answer.starts_with(b"HTTP/1.1 200"),
                "{}: {}",
                client.what,
                String::from_utf8_lossy(&answer)
            );
        }
    }
    check_leaf_validity(leaf, UnixTime::now())
        .expect("the valid period outlasted the handshakes above (machine too slow?)");

    // The idle period under test: until the certificate has expired.
    let wait = surely_expired_at(issued_by)
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    assert!(matches!(
        check_leaf_validity(leaf, UnixTime::now()),
        Err(LeafValidityError::Expired { .. })
    ));

    for client in clients {
        let attempt = client.attempt().await;
        assert_eq!(
            attempt.kind,
            Some(HandshakeKind::Resumed),
            "{}: the expired client's session resumes as far as TLS goes",
            client.what
        );
        match attempt.answer {
            Ok(answer) => panic!(
                "{}: served after its certificate expired: {}",
                client.what,
                String::from_utf8_lossy(&answer[..answer.len().min(64)])
            ),
            // Closed at once, with nothing served: reset, or closed under
            // TLS (rustls' no-close_notify error, seen on every listener
            // here), or a clean end before any byte arrived.
            Err(e) => {
                let message = e.to_string();
                let closed_at_once = match e.kind() {
                    io::ErrorKind::ConnectionReset => true,
                    io::ErrorKind::UnexpectedEof => {
                        !message.starts_with("closed after") || message == r#"closed after """#
                    }
                    _ => false,
                };
                assert!(
                    closed_at_once,
                    "{}: the server should close the connection at once, got {:?}: {e}",
                    client.what,
                    e.kind()
                );
            }
        }
    }
}

const ACTOR_REPLY: &str = "hello from alpha";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_router_cannot_resume_into_either_ingress_listener() {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let actor =
        http1_actor(|_| async { http::Response::new(Full::new(Bytes::from(ACTOR_REPLY))) }).await;
    running.activate_alpha(&[(80, actor.port())]);
    let router = pki
        .pod_ca
        .issue(Some(ROUTER_SPIFFE_ID), &[], &[], Usage::Client, LIFETIME)
        .expect("short-lived router certificate");
    let issued_by = SystemTime::now();

    let https =
        b"GET / HTTP/1.1\r\nHost: app.example.com\r\nate-target-actor: team-a/alpha\r\n\r\n";
    // The request through the tunnel is sent at once, behind the CONNECT.
    let connect = b"CONNECT actor:80 HTTP/1.1\r\nate-target-actor: team-a/alpha\r\n\r\n\
                    GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n";
    let mut clients = Vec::new();
    for (listener, addr, request) in [
        ("HTTPS", running.https, &https[..]),
        ("CONNECT", running.connect, &connect[..]),
    ] {
        for (version, versions) in [("TLS 1.3", TLS13), ("TLS 1.2", TLS12)] {
            clients.push(Client {
                what: format!("ingress {listener} over {version}"),
                cfg: mtls_client_config(
                    pki.pod_ca.cert_der(),
                    router.chain.clone(),
                    router.key(),
                    versions,
                    &[b"http/1.1"],
                ),
                addr,
                server_name: WORKER_NAME,
                request: request.to_vec(),
                reply: ACTOR_REPLY.as_bytes().to_vec(),
            });
        }
    }
    resumption_ends_when_the_certificate_expires(&clients, &router.chain[0], issued_by).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_actor_cannot_resume_into_the_gateway() {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let key = new_actor_key().expect("key");
    let csr = actor_csr(&key).expect("csr");
    let now = SystemTime::now();
    let chain = pki
        .actor_ca
        .sign_actor_csr(
            &actor("alpha"),
            &csr,
            now - Duration::from_secs(300),
            now + LIFETIME,
        )
        .expect("short-lived actor certificate");
    let issued_by = SystemTime::now();

    let payload = random(4096, 7);
    let mut request = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n").into_bytes();
    request.extend_from_slice(&payload);
    let clients: Vec<Client> = [("TLS 1.3", TLS13), ("TLS 1.2", TLS12)]
        .into_iter()
        .map(|(version, versions)| Client {
            what: format!("gateway over {version}"),
            cfg: mtls_client_config(
                pki.gateway_ca.cert_der(),
                chain.clone(),
                PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
                versions,
                &[b"http/1.1"],
            ),
            addr: gw.addr,
            server_name: GATEWAY_NAME,
            request: request.clone(),
            reply: payload.clone(),
        })
        .collect();
    resumption_ends_when_the_certificate_expires(&clients, &chain[0], issued_by).await;
}

/// A handshake as the stand-in gateway saw it: its kind and the client's leaf.
type Seen = (Option<HandshakeKind>, CertificateDer<'static>);

/// A stand-in HTTP/1.1 gateway that resumes any session offered (rustls'
/// default session cache and tickets), trusting the actor CA: it reports
/// each handshake, answers the CONNECT with 200 and echoes the tunnel.
async fn resuming_gateway(pki: &Pki) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let verifier =
        atunnel_identity::actor_client_verifier(&[pki.actor_ca.cert_der()]).expect("verifier");
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_client_cert_verifier(verifier)
    .with_single_cert(pki.gateway_cert.chain.clone(), pki.gateway_cert.key())
    .expect("server config");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let mut tls = acceptor.accept(tcp).await?;
                let conn = tls.get_ref().1;
                let leaf = conn.peer_certificates().expect("client auth is mandatory")[0].clone();
                let _ = tx.send((conn.handshake_kind(), leaf));
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    head.push(tls.read_u8().await?);
                }
                tls.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await?;
                let (mut r, mut w) = tokio::io::split(tls);
                tokio::io::copy(&mut r, &mut w).await?;
                w.shutdown().await
            });
        }
    });
    (addr, seen)
}

/// Every tunnel over an HTTP/1.1 gateway is a new TLS connection: each
/// must be a full handshake, so that after a renewal the gateway sees the
/// new certificate (a resumed session would present the old one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_client_authenticates_every_connection_with_its_current_certificate() {
    let pki = Pki::new();
    let (gw, mut handshakes) = resuming_gateway(&pki).await;
    let a = actor("alpha");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let prepared = prepare(&pki, gw, a.clone(), source.clone()).await;
    let credential = prepared.credential().clone();
    let egress = egress();
    let cancel = CancellationToken::new();
    // The stand-in gateway echoes the tunnel itself; the destination is only named.
    let dest = "127.0.0.1:7".parse().expect("addr");
    let listen_addr = listen(&egress, &a.uid, dest, &cancel).await;
    egress.activate(&a.uid, prepared).expect("activate");

    let mut tunnel = async |seed: u64| {
        let up = random(64 * 1024, seed);
        assert!(
            round_trip(listen_addr, up.clone()).await == up,
            "tunnel {seed} echo corrupted"
        );
        let (kind, leaf) = handshakes.recv().await.expect("gateway saw a handshake");
        assert!(
            handshakes.try_recv().is_err(),
            "one tunnel, one TLS connection"
        );
        assert_eq!(kind, Some(HandshakeKind::Full), "tunnel {seed}");
        leaf
    };
    let first = tunnel(1).await;
    let second = tunnel(2).await;
    assert_eq!(first, second, "no renewal yet, the same certificate");
    credential
        .renew(source.as_ref())
        .await
        .expect("renewed certificate");
    let renewed = tunnel(3).await;
    assert_ne!(renewed, first, "the gateway saw the renewed certificate");
    cancel.cancel();
}
