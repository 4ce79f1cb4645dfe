//! Ingress on loopback with its PKI (the worker's and the router's
//! certificates), dialers to loopback actors, and actor servers (HTTP/1.1
//! and h2c) that count their connections.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use atunnel::ingress::ActorDialer;
use atunnel::ingress::{Ingress, IngressConfig, ROUTER_SPIFFE_ID};
use atunnel_core::BufferPool;
use atunnel_core::sockopt::SocketOptions;
use atunnel_identity::pki::{CertificateAuthority, IssuedCert, Usage, WORKER_SPIFFE_ID};
use atunnel_process::overload::OverloadGuard;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Tests that read the process's heap take turns: another test's
/// allocations would land in their difference.
pub static HEAP_MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The name the worker's serving certificate carries.
pub const WORKER_NAME: &str = "worker.test";

/// The actor port tests serve gRPC (h2c) on.
pub const GRPC_PORT: u16 = 50051;

pub struct IngressPki {
    pub pod_ca: CertificateAuthority,
    pub worker: IssuedCert,
    pub router: IssuedCert,
    pub dir: tempfile::TempDir,
}

impl Default for IngressPki {
    fn default() -> Self {
        Self::new()
    }
}

impl IngressPki {
    pub fn new() -> Self {
        let pod_ca = CertificateAuthority::new("pod identity CA").expect("ca");
        let worker = pod_ca
            .issue(
                Some(WORKER_SPIFFE_ID),
                &[WORKER_NAME],
                &[],
                Usage::ServerAndClient,
                Duration::from_secs(3600),
            )
            .expect("worker");
        let router = pod_ca
            .issue(
                Some(ROUTER_SPIFFE_ID),
                &[],
                &[],
                Usage::Client,
                Duration::from_secs(3600),
            )
            .expect("router");
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Self {
            pod_ca,
            worker,
            router,
            dir,
        };
        std::fs::write(
            pki.bundle_path(),
            format!("{}{}", pki.worker.cert_pem, pki.worker.key_pem),
        )
        .expect("bundle");
        std::fs::write(pki.trust_path(), pki.pod_ca.cert_pem()).expect("trust");
        std::fs::write(pki.path("router.pem"), &pki.router.cert_pem).expect("router cert");
        std::fs::write(pki.path("router.key"), &pki.router.key_pem).expect("router key");
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn bundle_path(&self) -> PathBuf {
        self.path("credential-bundle.pem")
    }

    pub fn trust_path(&self) -> PathBuf {
        self.path("trust-bundle.pem")
    }

    /// The config tests start from: this PKI's files, production defaults
    /// and a 5 s drain.
    pub fn ingress_config(&self) -> IngressConfig {
        IngressConfig {
            // Autotuned like the network side: the actors here are on
            // loopback, not behind veth.
            sandbox_socket: SocketOptions::default(),
            drain_timeout: Duration::from_secs(5),
            ..IngressConfig::new(self.bundle_path(), self.trust_path())
        }
    }

    /// A client identity from this PKI with another SPIFFE ID.
    pub fn other_client(&self, spiffe_id: &str) -> IssuedCert {
        self.pod_ca
            .issue(
                Some(spiffe_id),
                &[],
                &[],
                Usage::Client,
                Duration::from_secs(3600),
            )
            .expect("client")
    }
}

pub struct RunningIngress {
    pub ingress: Arc<Ingress>,
    /// The relay buffer pool the CONNECT listener borrows from.
    pub pool: BufferPool,
    pub https: SocketAddr,
    pub connect: SocketAddr,
    pub cancel: CancellationToken,
}

impl RunningIngress {
    /// Activates `team-a/alpha` (uid-1), its ports mapped to loopback ports.
    pub fn activate_alpha(&self, ports: &[(u16, u16)]) {
        activate_ports(&self.ingress, "alpha", "uid-1", ports);
    }
}

impl Drop for RunningIngress {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub async fn ingress(pki: &IngressPki) -> RunningIngress {
    ingress_with(pki, atunnel_tls::hibernate::DEFAULT_AFTER).await
}

/// An ingress whose HTTP/1.1 connections hibernate after `hibernate_after`.
pub async fn ingress_with(pki: &IngressPki, hibernate_after: Duration) -> RunningIngress {
    ingress_tuned(pki, |cfg| cfg.hibernate_after = hibernate_after).await
}

/// An ingress with [`IngressPki::ingress_config`], then `tune` applied to it.
pub async fn ingress_tuned(
    pki: &IngressPki,
    tune: impl FnOnce(&mut IngressConfig),
) -> RunningIngress {
    let mut cfg = pki.ingress_config();
    tune(&mut cfg);
    let pool = BufferPool::default();
    running(Ingress::new(cfg, pool.clone()).expect("ingress"), pool).await
}

/// An [`ingress_tuned`] whose pool settings, the defaults otherwise, are
/// changed by `tune`.
pub async fn ingress_pools(
    pki: &IngressPki,
    tune: impl FnOnce(&mut atunnel::ingress::PoolSettings),
) -> RunningIngress {
    ingress_tuned(pki, |cfg| tune(&mut cfg.pools)).await
}

/// `ingress` listening on loopback, HTTPS and CONNECT.
async fn running(ingress: Arc<Ingress>, pool: BufferPool) -> RunningIngress {
    let cancel = CancellationToken::new();
    let local = "127.0.0.1:0".parse().expect("addr");
    let (https, connect) = ingress
        .spawn(local, local, cancel.clone())
        .await
        .expect("listeners");
    RunningIngress {
        ingress,
        pool,
        https,
        connect,
        cancel,
    }
}

/// An ingress with [`IngressPki::ingress_config`] that asks `guard` before
/// it admits work.
pub async fn ingress_guarded(pki: &IngressPki, guard: Arc<OverloadGuard>) -> RunningIngress {
    let pool = BufferPool::default();
    let ingress =
        Ingress::with_overload(pki.ingress_config(), pool.clone(), Some(guard)).expect("ingress");
    running(ingress, pool).await
}

/// Dials loopback ports, with some actor ports mapped to others (so tests
/// can use port 80 without binding it).
pub struct LoopbackDialer(pub HashMap<u16, u16>);

impl ActorDialer for LoopbackDialer {
    fn dial(&self, port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        let port = self.0.get(&port).copied().unwrap_or(port);
        Box::pin(TcpStream::connect(("127.0.0.1", port)))
    }
}

/// Activates actor `team-a/name` (`uid`) with its port 80 on loopback
/// `port`.
pub fn activate_loopback(ingress: &Ingress, name: &str, uid: &str, port: u16) {
    activate_ports(ingress, name, uid, &[(80, port)]);
}

/// Activates actor `team-a/name` (`uid`), each of its `ports` mapped to a
/// loopback port: `(actor's port, loopback port)`.
pub fn activate_ports(ingress: &Ingress, name: &str, uid: &str, ports: &[(u16, u16)]) {
    ingress
        .activate(
            "team-a",
            name,
            uid,
            Box::new(LoopbackDialer(ports.iter().copied().collect())),
        )
        .expect("activate");
}

/// A port nobody listens on.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// How a test actor answers each request.
pub trait Answer<Fut>:
    Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static
{
}

impl<F, Fut> Answer<Fut> for F where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static
{
}

/// A response body a test actor can send.
pub trait ActorBody:
    hyper::body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + 'static
{
}

impl<B> ActorBody for B where
    B: hyper::body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// An actor on loopback: HTTP/1.1, each request answered by `answer`.
pub async fn http1_actor<F, Fut, B>(answer: F) -> SocketAddr
where
    F: Answer<Fut>,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: ActorBody,
{
    counted_http1_actor(answer).await.0
}

/// What an actor saw of its connections: how many it accepted, and which
/// ones (numbered from 0 in accept order) its peer has closed.
pub struct ActorConnections {
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    closed: tokio::sync::mpsc::UnboundedReceiver<usize>,
    seen_closed: std::collections::HashSet<usize>,
}

impl ActorConnections {
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits up to `within` for connection `n` to be closed by its peer.
    pub async fn closed(&mut self, n: usize, within: Duration) -> bool {
        let wait = async {
            while !self.seen_closed.contains(&n) {
                match self.closed.recv().await {
                    Some(c) => self.seen_closed.insert(c),
                    None => return false,
                };
            }
            true
        };
        tokio::time::timeout(within, wait).await.unwrap_or(false)
    }
}

/// [`http1_actor`] that also reports its connections.
pub async fn counted_http1_actor<F, Fut, B>(answer: F) -> (SocketAddr, ActorConnections)
where
    F: Answer<Fut>,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: ActorBody,
{
    counted_actor(answer, false).await
}

/// An actor on loopback speaking h2c with prior knowledge, as gRPC servers
/// do: each request answered by `answer`.
pub async fn h2c_actor<F, Fut, B>(answer: F) -> SocketAddr
where
    F: Answer<Fut>,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: ActorBody,
{
    counted_actor(answer, true).await.0
}

async fn counted_actor<F, Fut, B>(answer: F, h2c: bool) -> (SocketAddr, ActorConnections)
where
    F: Answer<Fut>,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: ActorBody,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (closed_tx, closed) = tokio::sync::mpsc::unbounded_channel();
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answer.clone();
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let answer = answer.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(req).await) }
                });
                let io = TokioIo::new(tcp);
                let _ = if h2c {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await
                };
                let _ = closed_tx.send(n);
            });
        }
    });
    let connections = ActorConnections {
        accepted,
        closed,
        seen_closed: Default::default(),
    };
    (addr, connections)
}

/// A request's whole body, or what an actor echoing it answers when it
/// ended in an error: nothing.
pub async fn whole_body(req: http::Request<hyper::body::Incoming>) -> Bytes {
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// Reads a request body to its end and answers with its length.
pub async fn count_body(req: http::Request<hyper::body::Incoming>) -> Full<Bytes> {
    let n = body_len(req.into_body()).await.unwrap_or_else(|(n, _)| n);
    Full::new(Bytes::from(n.to_string()))
}

/// Reads `body` to its end, keeping none of it: its length, or the length
/// so far and the error that ended it.
pub async fn body_len<B: hyper::body::Body<Data = Bytes> + Unpin>(
    mut body: B,
) -> Result<u64, (u64, B::Error)> {
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => n += frame.data_ref().map_or(0, |d| d.len() as u64),
            Err(e) => return Err((n, e)),
        }
    }
    Ok(n)
}

/// A tunnel's configuration with ingress on loopback (ports chosen by the
/// kernel) from `pki`'s files, `drain` as its drain timeout, and egress
/// certificates from `egress_pki` (no gateway needed unless egress is used).
pub fn tunnel_with_ingress(
    pki: &IngressPki,
    egress_pki: &crate::pki::Pki,
    drain: Duration,
) -> atunnel::tunnel::TunnelConfig {
    let mut cfg = egress_pki.tunnel_config();
    let local: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    cfg.ingress = Some(atunnel::tunnel::IngressListen {
        config: IngressConfig {
            drain_timeout: drain,
            ..pki.ingress_config()
        },
        https: local,
        connect: local,
    });
    cfg
}

/// Actor `uid`'s ingress figures; panics if it is not active.
pub fn actor_figures(ingress: &Ingress, uid: &str) -> atunnel::ingress::ActorIngressStats {
    ingress
        .stats()
        .actors
        .into_iter()
        .find(|a| a.actor == uid)
        .expect("actor's figures")
}

/// Waits until `check` holds of `uid`'s ingress figures, polling (they are
/// counters: nothing to await), for at most 10 s; then panics with `what`
/// and the figures.
pub async fn until_actor(
    ingress: &Ingress,
    uid: &str,
    what: &str,
    check: impl Fn(&atunnel::ingress::ActorIngressStats) -> bool,
) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let f = actor_figures(ingress, uid);
        if check(&f) {
            return;
        }
        assert!(tokio::time::Instant::now() < until, "{uid}: {what}: {f:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
