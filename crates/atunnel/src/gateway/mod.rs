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
use atunnel_core::{BufferPool, H2Stream, relay};
use atunnel_identity::identity::{ActorIdentity, verify_actor_leaf};
use bytes::Bytes;
use ipnet::IpNet;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gateway_client::parse_destination;
use crate::http1;
use sink::{Service, SinkConfig};

/// How long a forwarded tunnel's dial to its destination may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client has to finish TLS and send its CONNECT.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A running gateway.
pub struct Gateway {
    cfg: GatewayConfig,
    acceptor: TlsAcceptor,
    pool: BufferPool,
    tasks: TaskTracker,
}

/// The gateway's answer to a CONNECT.
enum Answer {
    Open(Target),
    Refuse(u16, &'static str, String),
}

enum Target {
    Dial(TcpStream),
    Sink(Service),
}

impl Gateway {
    pub fn new(cfg: GatewayConfig, pool: BufferPool) -> Result<Arc<Self>, GatewayError> {
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
        Ok(Arc::new(Self {
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            cfg,
            pool,
            tasks: TaskTracker::new(),
        }))
    }

    /// Accepts until `cancel`, then waits for open tunnels to finish.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, cancel: CancellationToken) {
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => break,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let this = self.clone();
            let cancel = cancel.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    r = this.connection(tcp) => if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "gateway connection ended");
                    }
                }
            });
        }
        self.tasks.close();
        self.tasks.wait().await;
    }

    async fn connection(self: &Arc<Self>, tcp: TcpStream) -> io::Result<()> {
        self.cfg.socket.apply(&tcp)?;
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        let identity = {
            let (_, conn) = tls.get_ref();
            let leaf = conn
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::PermissionDenied, "no client certificate")
                })?;
            verify_actor_leaf(leaf)
                .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?
        };
        if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            self.serve_h2(tls, identity).await
        } else {
            self.serve_h1(tls, identity).await
        }
    }

    async fn serve_h2(
        self: &Arc<Self>,
        tls: TlsStream<TcpStream>,
        identity: ActorIdentity,
    ) -> io::Result<()> {
        let mut conn = h2::server::Builder::new()
            .max_concurrent_streams(self.cfg.max_concurrent_streams)
            .initial_window_size(crate::gateway_client::STREAM_WINDOW)
            .initial_connection_window_size(crate::gateway_client::CONNECTION_WINDOW)
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(io::Error::other)?;
        let streams = TaskTracker::new();
        while let Some(accepted) = conn.accept().await {
            let (request, mut respond) = accepted.map_err(io::Error::other)?;
            let this = self.clone();
            let identity = identity.clone();
            streams.spawn(async move {
                let (parts, body) = request.into_parts();
                let authority = parts
                    .uri
                    .authority()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                this.observe(
                    "h2",
                    parts.method.as_str(),
                    &authority,
                    &parts.headers,
                    &identity,
                );
                if parts.method != http::Method::CONNECT {
                    let _ = respond_h2(&mut respond, 405, "method not allowed");
                    return;
                }
                match this.decide(&authority).await {
                    Answer::Refuse(status, _, body) => {
                        let _ = respond_h2(&mut respond, status, &body);
                    }
                    Answer::Open(target) => {
                        let Ok(send) = respond.send_response(http::Response::new(()), false) else {
                            return;
                        };
                        let mut stream = H2Stream::new(send, body);
                        this.run(target, &mut stream, &authority).await;
                    }
                }
            });
        }
        streams.close();
        streams.wait().await;
        Ok(())
    }

    async fn serve_h1(
        &self,
        mut tls: TlsStream<TcpStream>,
        identity: ActorIdentity,
    ) -> io::Result<()> {
        let head = tokio::time::timeout(HANDSHAKE_TIMEOUT, http1::read_head(&mut tls))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "CONNECT head timed out"))??;
        let request = match http1::parse_request(&head) {
            Ok(r) => r,
            Err(e) => {
                respond_h1(&mut tls, 400, "Bad Request", &e.to_string()).await?;
                return Ok(());
            }
        };
        let mut headers = http::HeaderMap::new();
        for (name, value) in &request.headers {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                headers.append(n, v);
            }
        }
        self.observe(
            "http/1.1",
            &request.method,
            &request.target,
            &headers,
            &identity,
        );
        if request.method != "CONNECT" {
            return respond_h1(&mut tls, 405, "Method Not Allowed", "method not allowed").await;
        }
        match self.decide(&request.target).await {
            Answer::Refuse(status, reason, body) => {
                respond_h1(&mut tls, status, reason, &body).await
            }
            Answer::Open(target) => {
                tls.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await?;
                tls.flush().await?;
                self.run(target, &mut tls, &request.target).await;
                Ok(())
            }
        }
    }

    fn observe(
        &self,
        protocol: &'static str,
        method: &str,
        authority: &str,
        headers: &http::HeaderMap,
        identity: &ActorIdentity,
    ) {
        if let Some(tx) = &self.cfg.observer {
            let _ = tx.send(ConnectSeen {
                protocol,
                method: method.to_string(),
                authority: authority.to_string(),
                headers: headers
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
    }

    async fn decide(&self, authority: &str) -> Answer {
        let Ok(dest) = parse_destination(authority) else {
            return Answer::Refuse(
                400,
                "Bad Request",
                format!("invalid authority {authority:?}"),
            );
        };
        match &self.cfg.mode {
            Mode::Sink(sink) => match Service::for_port(dest.port()).or(sink.other_ports) {
                Some(service) => Answer::Open(Target::Sink(service)),
                None => Answer::Refuse(
                    403,
                    "Forbidden",
                    format!("no sink service on port {}", dest.port()),
                ),
            },
            Mode::Forward { allow } => {
                if !allow.iter().any(|net| net.contains(&dest.ip())) {
                    return Answer::Refuse(403, "Forbidden", "egress denied".to_string());
                }
                match self.cfg.socket.connect(dest, DIAL_TIMEOUT).await {
                    Ok(tcp) => Answer::Open(Target::Dial(tcp)),
                    Err(e) => Answer::Refuse(502, "Bad Gateway", format!("dialing {dest}: {e}")),
                }
            }
        }
    }

    async fn run<E: atunnel_core::Endpoint>(
        &self,
        target: Target,
        tunnel: &mut E,
        authority: &str,
    ) {
        let result = match target {
            Target::Dial(mut tcp) => relay(tunnel, &mut tcp, &self.pool)
                .await
                .map(|s| s.a_to_b + s.b_to_a)
                .map_err(io::Error::other),
            Target::Sink(service) => {
                let Mode::Sink(cfg) = &self.cfg.mode else {
                    return;
                };
                sink::serve(service, tunnel, cfg, &self.pool).await
            }
        };
        if let Err(e) = result {
            tunnel.abort();
            tracing::debug!(%authority, error = %e, "gateway tunnel failed");
        }
    }

    pub fn local_tasks(&self) -> usize {
        self.tasks.len()
    }
}

fn respond_h2(
    respond: &mut h2::server::SendResponse<Bytes>,
    status: u16,
    body: &str,
) -> Result<(), h2::Error> {
    let response = http::Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(())
        .expect("static response parts are valid");
    let mut send = respond.send_response(response, false)?;
    send.send_data(Bytes::copy_from_slice(body.as_bytes()), true)
}

async fn respond_h1(
    tls: &mut TlsStream<TcpStream>,
    status: u16,
    reason: &str,
    body: &str,
) -> io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(response.as_bytes()).await?;
    tls.shutdown().await
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
