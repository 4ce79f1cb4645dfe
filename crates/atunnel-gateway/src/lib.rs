//! The egress gateway: accepts HTTP/2 and HTTP/1.1 CONNECT over mutual TLS
//! from actors and hands each authorised tunnel to its far end: in
//! production [`Forward`], which dials the destination if the policy
//! allows it (`policy`). The far end is a trait ([`FarEnd`]) so that a benchmark can
//! answer tunnels itself without this crate carrying its code.
//!
//! Only clients holding an actor certificate from the actor CA get past the
//! handshake: exactly one actor-form URI SAN, ClientAuth, not a CA, exactly
//! one actor-identity extension for atunnel (checked by
//! `atunnel_identity::verifier`).
//!
//! Depends on the core, identity, TLS and CONNECT crates; nothing but the
//! bench and tests depends on it.

pub mod budget;
pub mod cli;
pub mod policy;
mod stats;
pub use stats::Stats;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use atunnel_connect::limits::MAX_CONCURRENT_STREAMS;
use atunnel_connect::{
    Answer, ConnectHandler, ConnectRequest, ConnectServer, H2Settings, parse_destination,
};
use atunnel_core::relay::{RelayBounds, relay_within};
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, Endpoint};
use atunnel_identity::identity::{ActorIdentity, verify_actor_leaf};
use atunnel_process::overload::OverloadGuard;
use budget::{Admitted, BudgetStats, Budgets, IdentityBudget};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("gateway TLS configuration: {0}")]
    Tls(String),
}

/// A refusal of an authorised CONNECT by the far end: the status and body
/// the client reads.
#[derive(Debug)]
pub struct Refusal {
    pub status: u16,
    pub reason: &'static str,
    pub body: String,
}

/// What an authorised tunnel leads to.
pub trait FarEnd: Send + Sync + 'static {
    /// An opened far end, held for the tunnel's life.
    type Target: Send + 'static;

    /// Opens the far end for `dest` (a valid IP literal and port), or
    /// refuses it.
    fn open(&self, dest: SocketAddr) -> impl Future<Output = Result<Self::Target, Refusal>> + Send;

    /// Carries the tunnel to its end; an error resets the tunnel.
    fn run<E: Endpoint + Send>(
        &self,
        target: Self::Target,
        tunnel: &mut E,
        pool: &BufferPool,
    ) -> impl Future<Output = io::Result<()>> + Send;
}

/// The production far end: dial the destination if the policy allows it
/// (default deny, [`policy`]), and relay.
#[derive(Clone, Debug)]
pub struct Forward {
    pub policy: Arc<policy::PolicyHandle>,
    pub socket: SocketOptions,
    /// When tunnels that cannot finish are reset.
    pub bounds: RelayBounds,
    /// How long dialing a destination may take; past it the CONNECT gets
    /// 502 ([`atunnel_connect::limits::DESTINATION_DIAL_TIMEOUT`]).
    pub dial_timeout: std::time::Duration,
}

impl FarEnd for Forward {
    type Target = TcpStream;

    async fn open(&self, dest: SocketAddr) -> Result<TcpStream, Refusal> {
        // Never dialled unless allowed; mapped IPv6 is dialled as IPv4.
        let dest = self.policy.check(dest).map_err(|rule| Refusal {
            status: 403,
            reason: "Forbidden",
            body: format!("egress denied by {rule}"),
        })?;
        self.socket
            .connect(dest, self.dial_timeout)
            .await
            .map_err(|e| Refusal {
                status: 502,
                reason: "Bad Gateway",
                body: format!("dialing {dest}: {e}"),
            })
    }

    async fn run<E: Endpoint + Send>(
        &self,
        mut tcp: TcpStream,
        tunnel: &mut E,
        pool: &BufferPool,
    ) -> io::Result<()> {
        // Both sides reset unless the relay ends cleanly, also when
        // shutdown drops this future mid-relay.
        relay_within(tunnel, &mut tcp, pool, &self.bounds)
            .await
            .map(drop)
            .map_err(|e| {
                if e.is_bound() {
                    tracing::debug!(error = %e, "tunnel reset at a bound");
                }
                io::Error::other(e)
            })
    }
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

/// ALPN a gateway offers unless told otherwise.
pub const DEFAULT_ALPN: [&str; 2] = ["h2", "http/1.1"];

pub struct GatewayConfig {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// CAs that sign actor certificates.
    pub actor_ca: Vec<CertificateDer<'static>>,
    /// Options of the sockets actors connect with.
    pub socket: SocketOptions,
    /// ALPN offered; `["http/1.1"]` behaves like the Envoy gateway.
    pub alpn: Vec<Vec<u8>>,
    /// TLS versions allowed (both by default).
    pub tls_versions: Vec<&'static rustls::SupportedProtocolVersion>,
    /// Streams one HTTP/2 connection may carry at once.
    pub max_concurrent_streams: u32,
    /// Receive window per tunnel: what one tunnel whose destination stopped
    /// reading makes the gateway hold.
    pub stream_window: u32,
    /// Receive window per connection: what one client identity's tunnels on
    /// one connection hold unread together.
    pub connection_window: u32,
    /// Largest HTTP/2 frame a client may send.
    pub max_frame_size: u32,
    /// How long a client has to finish TLS.
    pub handshake_timeout: std::time::Duration,
    /// Connections in their TLS handshake, in total and per source.
    pub pre_auth: atunnel_tls::PreAuthLimits,
    /// Each client connection's HTTP/2 control-frame budget.
    pub h2_floods: atunnel_connect::flood::FloodLimits,
    /// What each client identity may make the gateway hold.
    pub budget: IdentityBudget,
    /// Past its soft threshold new CONNECTs are refused (503).
    pub overload: Option<Arc<OverloadGuard>>,
    pub observer: Option<mpsc::UnboundedSender<ConnectSeen>>,
}

impl GatewayConfig {
    pub fn new(
        cert_chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        actor_ca: Vec<CertificateDer<'static>>,
    ) -> Self {
        Self {
            cert_chain,
            key,
            actor_ca,
            socket: SocketOptions::default(),
            alpn: DEFAULT_ALPN.iter().map(|p| p.as_bytes().to_vec()).collect(),
            tls_versions: rustls::ALL_VERSIONS.to_vec(),
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            stream_window: atunnel_connect::limits::TUNNEL_STREAM_WINDOW,
            connection_window: atunnel_connect::limits::TUNNEL_CONNECTION_WINDOW,
            max_frame_size: atunnel_connect::limits::GATEWAY_MAX_FRAME_SIZE,
            handshake_timeout: atunnel_connect::limits::HANDSHAKE_TIMEOUT,
            pre_auth: atunnel_tls::PreAuthLimits::default(),
            h2_floods: atunnel_connect::flood::FloodLimits::default(),
            budget: IdentityBudget::default(),
            overload: None,
            observer: None,
        }
    }
}

/// The gateway's side of each tunnel: identity check, method and
/// authority, then the far end.
pub struct GatewayHandler<F: FarEnd> {
    far: F,
    budgets: Arc<Budgets>,
    overload: Option<Arc<OverloadGuard>>,
    observer: Option<mpsc::UnboundedSender<ConnectSeen>>,
}

impl<F: FarEnd> GatewayHandler<F> {
    /// Identities with tunnels open and the refusals of their budgets.
    pub fn budget_stats(&self) -> BudgetStats {
        self.budgets.stats()
    }
}

/// An opened far end and the tunnel's place in its identity's budget.
pub struct Opened<T> {
    target: T,
    admitted: Admitted,
}

impl<F: FarEnd> ConnectHandler for GatewayHandler<F> {
    type Peer = ActorIdentity;
    type Target = Opened<F::Target>;

    fn peer(&self, tls: &rustls::ServerConnection) -> io::Result<ActorIdentity> {
        let leaf = tls
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::PermissionDenied, "no client certificate")
            })?;
        verify_actor_leaf(leaf).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))
    }

    async fn open(
        &self,
        identity: &ActorIdentity,
        req: ConnectRequest<'_>,
    ) -> Answer<Opened<F::Target>> {
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
        if let Some(guard) = &self.overload
            && let Err(e) = guard.admit()
        {
            return Answer::refuse(503, "Service Unavailable", format!("gateway {e}"));
        }
        let Some(admitted) = self.budgets.admit(identity) else {
            return Answer::refuse(
                429,
                "Too Many Requests",
                "too many tunnels open for this identity",
            );
        };
        match self.far.open(dest).await {
            Ok(target) => Answer::Open(Opened { target, admitted }),
            Err(r) => Answer::refuse(r.status, r.reason, r.body),
        }
    }

    async fn run<E: Endpoint + Send>(&self, opened: Opened<F::Target>, tunnel: &mut E) {
        let Opened { target, admitted } = opened;
        if let Err(e) = self.far.run(target, tunnel, admitted.pool()).await {
            tunnel.abort();
            tracing::debug!(error = %e, "gateway tunnel failed");
        }
    }
}

/// A gateway: a CONNECT server with the gateway's handler.
pub type Gateway<F> = ConnectServer<GatewayHandler<F>>;

/// Builds a gateway from its configuration and far end.
pub fn new<F: FarEnd>(
    cfg: GatewayConfig,
    far: F,
    pool: BufferPool,
) -> Result<Arc<Gateway<F>>, GatewayError> {
    let verifier = atunnel_identity::verifier::actor_client_verifier(&cfg.actor_ca)
        .map_err(|e| GatewayError::Tls(e.to_string()))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(atunnel_tls::provider::provider())
        .with_protocol_versions(&cfg.tls_versions)
        .map_err(|e| GatewayError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cfg.cert_chain.clone(), cfg.key.clone_key())
        .map_err(|e| GatewayError::Tls(e.to_string()))?;
    tls.alpn_protocols = cfg.alpn.clone();
    atunnel_tls::provider::choose_suites_by_our_order(&mut tls);
    // rustls' default session cache and tickets stay: resumption skips the
    // verifier, and atunnel_tls::accept refuses an actor whose leaf has
    // expired since its session began.
    let h2 = H2Settings {
        max_concurrent_streams: cfg.max_concurrent_streams,
        stream_window: cfg.stream_window,
        connection_window: cfg.connection_window,
        max_frame_size: cfg.max_frame_size,
        handshake_timeout: cfg.handshake_timeout,
        pre_auth: cfg.pre_auth,
        floods: cfg.h2_floods,
        ..H2Settings::default()
    };
    let handler = Arc::new(GatewayHandler {
        far,
        budgets: Budgets::new(cfg.budget, pool),
        overload: cfg.overload,
        observer: cfg.observer,
    });
    // The gateway stands for a remote service; its connections do not
    // hibernate.
    let hibernation = atunnel_tls::Hibernation::disabled();
    Ok(ConnectServer::new(
        handler,
        atunnel_tls::ReloadableConfig::new(Arc::new(tls)),
        cfg.socket,
        h2,
        hibernation,
    ))
}

/// Binds and serves a gateway on `addr` in the background; returns the bound
/// address. Used by tests and the bench.
pub async fn spawn<F: FarEnd>(
    gateway: Arc<Gateway<F>>,
    addr: SocketAddr,
    cancel: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(gateway.serve(listener, cancel))))
}
