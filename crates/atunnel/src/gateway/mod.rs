//! The egress gateway: accepts HTTP/2 and HTTP/1.1 CONNECT over mutual TLS
//! from actors, and either forwards each tunnel to its destination or, in
//! bench mode, answers it itself (see [`sink`]).
//!
//! Only clients holding an actor certificate from the actor CA get past the
//! handshake: exactly one actor-form URI SAN, ClientAuth, not a CA, exactly
//! one actor-identity extension for atunnel (checked by
//! `atunnel_identity::verifier`).

pub mod cli;
pub mod sink;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, relay};
use atunnel_identity::identity::{ActorIdentity, verify_actor_leaf};
use ipnet::IpNet;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::connect_server::{Answer, ConnectHandler, ConnectRequest, ConnectServer, H2Settings};
use crate::gateway_client::parse_destination;
use sink::{Service, SinkConfig};

/// How long a forwarded tunnel's dial to its destination may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("gateway TLS configuration: {0}")]
    Tls(String),
}

/// What the gateway does with an authorised tunnel.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Dial the destination if an allow-list entry contains it (default deny).
    Forward { allow: Vec<IpNet> },
    /// Answer by destination port without dialing.
    Sink(SinkConfig),
}

/// A CONNECT as the gateway received it; tests use it to see exactly what
/// atunnel sent.
#[derive(Clone, Debug)]
pub struct ConnectSeen {
    pub protocol: &'static str,
    pub method: String,
    pub authority: String,
    /// Every header besides the method and authority (pseudo-headers of
    /// HTTP/2 are not headers here).
    pub headers: Vec<(String, String)>,
    pub identity: ActorIdentity,
}

pub struct GatewayConfig {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// CAs that sign actor certificates.
    pub actor_ca: Vec<CertificateDer<'static>>,
    pub mode: Mode,
    pub socket: SocketOptions,
    /// ALPN offered; `["http/1.1"]` behaves like the Envoy gateway.
    pub alpn: Vec<Vec<u8>>,
    /// TLS versions allowed (both by default).
    pub tls_versions: Vec<&'static rustls::SupportedProtocolVersion>,
    /// Streams one HTTP/2 connection may carry at once.
    pub max_concurrent_streams: u32,
    pub observer: Option<mpsc::UnboundedSender<ConnectSeen>>,
}

impl GatewayConfig {
    pub fn new(
        cert_chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        actor_ca: Vec<CertificateDer<'static>>,
        mode: Mode,
    ) -> Self {
        Self {
            cert_chain,
            key,
            actor_ca,
            mode,
            socket: SocketOptions::default(),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            tls_versions: rustls::ALL_VERSIONS.to_vec(),
            max_concurrent_streams: 1000,
            observer: None,
        }
    }
}

/// The gateway's side of each tunnel: identity check, policy, far end.
pub struct GatewayHandler {
    mode: Mode,
    socket: SocketOptions,
    pool: BufferPool,
    observer: Option<mpsc::UnboundedSender<ConnectSeen>>,
}

pub enum Target {
    Dial(TcpStream),
    Sink(Service),
}

impl ConnectHandler for GatewayHandler {
    type Peer = ActorIdentity;
    type Target = Target;

    fn peer(&self, tls: &rustls::ServerConnection) -> io::Result<ActorIdentity> {
        let leaf = tls
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::PermissionDenied, "no client certificate")
            })?;
        verify_actor_leaf(leaf).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))
    }

    async fn open(&self, identity: &ActorIdentity, req: ConnectRequest<'_>) -> Answer<Target> {
        if let Some(tx) = &self.observer {
            let _ = tx.send(ConnectSeen {
                protocol: req.protocol,
                method: req.method.to_string(),
                authority: req.authority.to_string(),
                headers: req
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                identity: identity.clone(),
            });
        }
        if req.method != "CONNECT" {
            return Answer::refuse(405, "Method Not Allowed", "method not allowed");
        }
        let Ok(dest) = parse_destination(req.authority) else {
            return Answer::refuse(
                400,
                "Bad Request",
                format!("invalid authority {:?}", req.authority),
            );
        };
        match &self.mode {
            Mode::Sink(sink) => match Service::for_port(dest.port()).or(sink.other_ports) {
                Some(service) => Answer::Open(Target::Sink(service)),
                None => Answer::refuse(
                    403,
                    "Forbidden",
                    format!("no sink service on port {}", dest.port()),
                ),
            },
            Mode::Forward { allow } => {
                if !allow.iter().any(|net| net.contains(&dest.ip())) {
                    return Answer::refuse(403, "Forbidden", "egress denied");
                }
                match self.socket.connect(dest, DIAL_TIMEOUT).await {
                    Ok(tcp) => Answer::Open(Target::Dial(tcp)),
                    Err(e) => Answer::refuse(502, "Bad Gateway", format!("dialing {dest}: {e}")),
                }
            }
        }
    }

    async fn run<E: atunnel_core::Endpoint + Send>(&self, target: Target, tunnel: &mut E) {
        let result = match target {
            // Both sides reset unless the relay ends cleanly, also when
            // shutdown drops this future mid-relay.
            Target::Dial(mut tcp) => relay(tunnel, &mut tcp, &self.pool)
                .await
                .map(|s| s.a_to_b + s.b_to_a)
                .map_err(io::Error::other),
            Target::Sink(service) => {
                let Mode::Sink(cfg) = &self.mode else { return };
                sink::serve(service, tunnel, cfg, &self.pool).await
            }
        };
        if let Err(e) = result {
            tunnel.abort();
            tracing::debug!(error = %e, "gateway tunnel failed");
        }
    }
}

/// A gateway: a CONNECT server with the gateway's handler.
pub type Gateway = ConnectServer<GatewayHandler>;

/// Builds a gateway from its configuration.
pub fn new(cfg: GatewayConfig, pool: BufferPool) -> Result<Arc<Gateway>, GatewayError> {
    let verifier = atunnel_identity::verifier::actor_client_verifier(&cfg.actor_ca)
        .map_err(|e| GatewayError::Tls(e.to_string()))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&cfg.tls_versions)
    .map_err(|e| GatewayError::Tls(e.to_string()))?
    .with_client_cert_verifier(verifier)
    .with_single_cert(cfg.cert_chain.clone(), cfg.key.clone_key())
    .map_err(|e| GatewayError::Tls(e.to_string()))?;
    tls.alpn_protocols = cfg.alpn.clone();
    // rustls' default session cache and tickets stay: resumption skips the
    // verifier, and crate::server_tls::accept refuses an actor whose leaf
    // has expired since its session began.
    let h2 = H2Settings {
        max_concurrent_streams: cfg.max_concurrent_streams,
        ..H2Settings::default()
    };
    let handler = Arc::new(GatewayHandler {
        mode: cfg.mode,
        socket: cfg.socket,
        pool,
        observer: cfg.observer,
    });
    // The gateway stands for a remote service; its connections do not
    // hibernate.
    let hibernation = crate::hibernate::Hibernation::disabled();
    Ok(ConnectServer::new(
        handler,
        Arc::new(tls),
        cfg.socket,
        h2,
        hibernation,
    ))
}

/// Binds and serves a gateway on `addr` in the background; returns the bound
/// address. Used by tests and the bench.
pub async fn spawn(
    gateway: Arc<Gateway>,
    addr: SocketAddr,
    cancel: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(gateway.serve(listener, cancel))))
}
