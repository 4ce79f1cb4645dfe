//! Fixtures shared by atunnel's tests: a cluster-shaped PKI, a gateway, a
//! destination server, and actors with egress.
#![allow(dead_code)]

pub mod ingress;

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel::clock::Clock;
use atunnel::egress::{ActorEgress, Destination, Egress, EgressConfig};
use atunnel::gateway::{ConnectSeen, GatewayConfig, Mode};
use atunnel::gateway_client::{GatewayClient, GatewayClientConfig, Tunnel};
use atunnel_core::BufferPool;
use atunnel_identity::cert_source::{CertificateSource, MintError, MintFuture};
use atunnel_identity::identity::ActorRef;
use atunnel_identity::pki::{ActorCertOptions, CertificateAuthority, IssuedCert, Usage};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const GATEWAY_NAME: &str = "atenet-egress.ate-system.svc";

/// A destination a sink gateway answers by echoing (port 7); the address
/// itself is only named, never dialled.
pub const SINK_ECHO: &str = "192.0.2.10:7";

pub struct Pki {
    pub actor_ca: Arc<CertificateAuthority>,
    pub gateway_ca: CertificateAuthority,
    pub gateway_cert: IssuedCert,
}

impl Pki {
    pub fn new() -> Self {
        let actor_ca = Arc::new(CertificateAuthority::new("actor CA").expect("actor CA"));
        let gateway_ca = CertificateAuthority::new("servicedns CA").expect("gateway CA");
        let gateway_cert = gateway_ca
            .issue(
                Some(atunnel_identity::pki::GATEWAY_SPIFFE_ID),
                &[GATEWAY_NAME],
                &[],
                Usage::Server,
                Duration::from_secs(3600),
            )
            .expect("gateway cert");
        Self {
            actor_ca,
            gateway_ca,
            gateway_cert,
        }
    }

    pub fn gateway_roots(&self) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.gateway_ca.cert_der()).expect("root");
        Arc::new(roots)
    }
}

/// A certificate source for tests: signs with a CA using the test's clock,
/// counts mints, and answers from a script of failures first.
pub struct TestSource {
    pub ca: Arc<CertificateAuthority>,
    pub clock: Clock,
    pub lifetime: Duration,
    pub options: ActorCertOptions,
    pub script: Mutex<VecDeque<MintError>>,
    pub mints: AtomicUsize,
}

impl TestSource {
    pub fn new(ca: Arc<CertificateAuthority>, clock: Clock) -> Self {
        Self {
            ca,
            clock,
            lifetime: Duration::from_secs(3600),
            options: ActorCertOptions::default(),
            script: Mutex::new(VecDeque::new()),
            mints: AtomicUsize::new(0),
        }
    }

    pub fn fail_next(&self, e: MintError) {
        self.script.lock().expect("lock").push_back(e);
    }
}

impl CertificateSource for TestSource {
    fn mint<'a>(&'a self, actor: &'a ActorRef, csr_der: &'a [u8]) -> MintFuture<'a> {
        Box::pin(async move {
            self.mints.fetch_add(1, Ordering::SeqCst);
            if let Some(e) = self.script.lock().expect("lock").pop_front() {
                return Err(e);
            }
            let now = self.clock.now();
            self.ca
                .sign_actor_csr_with(
                    actor,
                    csr_der,
                    now - Duration::from_secs(300),
                    now + self.lifetime,
                    &self.options,
                )
                .map_err(|e| MintError::Failed(e.to_string()))
        })
    }
}

pub struct RunningGateway {
    pub addr: SocketAddr,
    pub seen: mpsc::UnboundedReceiver<ConnectSeen>,
    pub cancel: CancellationToken,
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts a gateway on loopback. `alpn` of `["http/1.1"]` makes it an
/// HTTP/1.1-only gateway like the Envoy one.
pub async fn gateway(
    pki: &Pki,
    mode: Mode,
    tune: impl FnOnce(&mut GatewayConfig),
) -> RunningGateway {
    let (tx, seen) = mpsc::unbounded_channel();
    let mut cfg = GatewayConfig::new(
        pki.gateway_cert.chain.clone(),
        pki.gateway_cert.key(),
        vec![pki.actor_ca.cert_der()],
        mode,
    );
    cfg.observer = Some(tx);
    tune(&mut cfg);
    let gw = atunnel::gateway::new(cfg, BufferPool::default()).expect("gateway");
    let cancel = CancellationToken::new();
    let (addr, _task) =
        atunnel::gateway::spawn(gw, "127.0.0.1:0".parse().expect("addr"), cancel.clone())
            .await
            .expect("gateway bind");
    RunningGateway { addr, seen, cancel }
}

pub fn h1_only(cfg: &mut GatewayConfig) {
    cfg.alpn = vec![b"http/1.1".to_vec()];
}

pub fn forward_loopback() -> Mode {
    Mode::Forward {
        allow: vec!["127.0.0.0/8".parse().expect("cidr")],
    }
}

pub fn client_config(pki: &Pki, gateway: SocketAddr) -> GatewayClientConfig {
    GatewayClientConfig::new(
        gateway,
        ServerName::try_from(GATEWAY_NAME).expect("name"),
        pki.gateway_roots(),
    )
}

/// A rustls client trusting `root`, presenting `chain` and `key`, offering
/// `versions` and `alpn`. Connections made with one config share its
/// session cache, so later ones resume.
pub fn mtls_client_config(
    root: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).expect("root");
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// TLS over a new TCP connection to `addr`, for the server `name`.
pub async fn tls_connect(
    cfg: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(name.to_owned()).expect("name"), tcp)
        .await
}

pub fn actor(name: &str) -> ActorRef {
    ActorRef::new("team-a", name, format!("uid-{name}")).expect("actor")
}

pub async fn prepare(
    pki: &Pki,
    gateway: SocketAddr,
    actor: ActorRef,
    source: Arc<TestSource>,
) -> ActorEgress {
    let clock = source.clock.clone();
    ActorEgress::prepare(actor, client_config(pki, gateway), source, clock)
        .await
        .expect("prepare egress")
}

/// An egress listener on loopback for `uid`, sending everything to `dest`.
pub async fn listen(
    egress: &Arc<Egress>,
    uid: &str,
    dest: SocketAddr,
    cancel: &CancellationToken,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    egress.serve_listener(uid, listener, Destination::Fixed(dest), cancel.clone());
    addr
}

pub fn egress() -> Arc<Egress> {
    egress_config(EgressConfig::default())
}

pub fn egress_config(cfg: EgressConfig) -> Arc<Egress> {
    Egress::new(
        EgressConfig {
            drain_timeout: Duration::from_secs(5),
            ..cfg
        },
        BufferPool::default(),
    )
}

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

/// `n` tunnels to `authority`, opened at once.
pub async fn open_at_once(client: &Arc<GatewayClient>, n: usize, authority: &str) -> Vec<Tunnel> {
    let opens = (0..n).map(|_| client.open_authority(authority));
    futures_util::future::join_all(opens)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, opened)| opened.unwrap_or_else(|e| panic!("tunnel {i}: {e}")))
        .collect()
}

/// The next read on `s` fails with a reset within 10 s: not a clean EOF
/// (which would pass a cut stream off as complete), not more bytes.
pub async fn next_read_is_reset(s: &mut (impl tokio::io::AsyncRead + Unpin), what: &str) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what}: the socket was left open"));
    match read {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
        Ok(0) => panic!("{what}: a clean end instead of a reset"),
        Ok(n) => panic!("{what}: {n} more bytes instead of a reset"),
    }
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
