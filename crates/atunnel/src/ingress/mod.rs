//! Ingress: the router's traffic into the actors' sandboxes, over mutual TLS
//! that admits only the router's SPIFFE ID. HTTPS requests (`https`) and
//! CONNECT tunnels (`connect`) are routed by `ate-target-actor` to the
//! actor's current activation (`routes`).

pub mod connect;
pub mod https;
pub mod router_conn;
pub mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use atunnel_core::BufferPool;
use atunnel_core::sockopt::SocketOptions;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connect_server::{ConnectServer, H2Settings};
use crate::hibernate::Hibernation;
use crate::server_tls;
use routes::{ActorDialer, PoolSettings, RouteError, RouteStats, Routes};

/// The router's default SPIFFE ID, the only client ingress admits.
pub const ROUTER_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atenet-router";

#[derive(Clone, Debug)]
pub struct IngressConfig {
    /// One PEM with the worker's certificate chain and key; re-read when it changes.
    pub credential_bundle: PathBuf,
    /// CAs that sign the router's certificate.
    pub trust_bundle: PathBuf,
    /// The only client identity admitted.
    pub allowed_client_id: String,
    pub pools: PoolSettings,
    /// Network side: the router's connections.
    pub socket: SocketOptions,
    /// Sandbox side: connections dialed to the actors.
    pub sandbox_socket: SocketOptions,
    /// How long deactivation waits for in-flight requests and tunnels.
    pub drain_timeout: Duration,
    /// Idle time after which a connection drops its rustls session for its
    /// traffic keys and, over HTTP/1.1, hyper's buffers (zero: never).
    pub hibernate_after: Duration,
    /// How long an HTTP/1.1 client may take to send a request head, from its
    /// first byte, and an HTTP/2 client (on either listener) its preface,
    /// once TLS is done (default [`https::HEADER_READ_TIMEOUT`], 10 s). An
    /// idle keep-alive connection is not timed by it.
    pub header_read_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error(transparent)]
    Tls(#[from] tls::IngressTlsError),
    #[error("loading the trust bundle: {0}")]
    Trust(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Route(#[from] RouteError),
}

static HTTPS_FUTURE_BYTES: AtomicUsize = AtomicUsize::new(0);

pub struct Ingress {
    cfg: IngressConfig,
    routes: Arc<Routes>,
    tls: Arc<rustls::ServerConfig>,
    connect: Arc<ConnectServer<connect::IngressConnect>>,
    connections: TaskTracker,
    hibernation: Arc<Hibernation>,
}

impl Ingress {
    pub fn new(cfg: IngressConfig, pool: BufferPool) -> Result<Arc<Self>, IngressError> {
        let trust = crate::config::load_certs(&cfg.trust_bundle)?;
        let tls = tls::server_config(&cfg.credential_bundle, &trust, &cfg.allowed_client_id)?;
        let routes = Arc::new(Routes::new(cfg.pools, cfg.sandbox_socket));
        let hibernation = Hibernation::new(cfg.hibernate_after);
        let connect = ConnectServer::new(
            Arc::new(connect::IngressConnect {
                routes: routes.clone(),
                pool,
            }),
            tls.clone(),
            cfg.socket,
            H2Settings {
                preface_timeout: cfg.header_read_timeout,
                ..H2Settings::default()
            },
            hibernation.clone(),
        );
        Ok(Arc::new(Self {
            hibernation,
            cfg,
            routes,
            tls,
            connect,
            connections: TaskTracker::new(),
        }))
    }

    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }

    pub fn stats(&self) -> RouteStats {
        self.routes.stats()
    }

    pub fn hibernation(&self) -> &Arc<Hibernation> {
        &self.hibernation
    }

    /// Sizes of one HTTPS and one CONNECT connection's task future: part of
    /// every idle connection's heap, hibernated or not (docs/memory.md).
    pub fn connection_future_bytes(&self) -> (usize, usize) {
        (
            HTTPS_FUTURE_BYTES.load(Ordering::Relaxed),
            crate::connect_server::CONNECTION_FUTURE_BYTES.load(Ordering::Relaxed),
        )
    }

    pub fn activate(
        &self,
        atespace: &str,
        name: &str,
        uid: &str,
        dialer: Box<dyn ActorDialer>,
    ) -> Result<(), IngressError> {
        Ok(self.routes.activate(atespace, name, uid, dialer)?)
    }

    pub async fn deactivate(&self, atespace: &str, name: &str, uid: &str) {
        self.routes
            .deactivate(atespace, name, uid, self.cfg.drain_timeout)
            .await
    }

    /// Serves the CONNECT listener until `cancel`.
    pub async fn serve_connect(&self, listener: TcpListener, cancel: CancellationToken) {
        self.connect.clone().serve(listener, cancel).await
    }

    /// Serves the HTTPS listener until `cancel`, then finishes in-flight
    /// requests gracefully.
    pub async fn serve_https(&self, listener: TcpListener, cancel: CancellationToken) {
        let acceptor = TlsAcceptor::from(self.tls.clone());
        loop {
            let (tcp, client) = tokio::select! {
                _ = cancel.cancelled() => break,
                a = listener.accept() => match a {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "ingress accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let routes = self.routes.clone();
            let socket = self.cfg.socket;
            let cancel = cancel.clone();
            let hibernation = self.hibernation.clone();
            let header_read_timeout = self.cfg.header_read_timeout;
            let fut = async move {
                if socket.apply(&tcp).is_err() {
                    return;
                }
                // Boxed: the handshake's state is needed only until it ends.
                let accept = server_tls::accept(&acceptor, tcp, https::HEADER_READ_TIMEOUT);
                if let Ok(tls) = Box::pin(accept).await {
                    router_conn::serve(
                        tls,
                        routes,
                        client,
                        hibernation,
                        header_read_timeout,
                        cancel,
                    )
                    .await;
                }
            };
            HTTPS_FUTURE_BYTES.store(std::mem::size_of_val(&fut), Ordering::Relaxed);
            self.connections.spawn(fut);
        }
        self.connections.close();
        self.connections.wait().await;
    }

    /// Binds both listeners and serves them in the background.
    pub async fn spawn(
        self: &Arc<Self>,
        https: SocketAddr,
        connect: SocketAddr,
        cancel: CancellationToken,
    ) -> std::io::Result<(SocketAddr, SocketAddr)> {
        let https = TcpListener::bind(https).await?;
        tokio::spawn(self.hibernation.clone().trim_until(cancel.clone()));
        let connect = TcpListener::bind(connect).await?;
        let addrs = (https.local_addr()?, connect.local_addr()?);
        let (a, c) = (self.clone(), cancel.clone());
        tokio::spawn(async move { a.serve_https(https, c).await });
        let a = self.clone();
        tokio::spawn(async move { a.serve_connect(connect, cancel).await });
        Ok(addrs)
    }
}
