//! Ingress: the router's traffic into the actors' sandboxes, over mutual TLS
//! that admits only the router's SPIFFE ID. HTTPS requests (`https`) and
//! CONNECT tunnels (`connect`) are routed by `ate-target-actor` to the
//! actor's current activation (`routes`).

mod actor_io;
mod connect;
mod http1_pool;
mod http1_wire;
mod https;
mod router_conn;
mod router_h2;
mod routes;
pub(crate) mod tls;

use atunnel_tls::{PreAuthGate, PreAuthLimits, PreAuthStats};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::SHUTDOWN_CLOSE_GRACE;
use crate::activation::ActorActivation;
use atunnel_core::relay::RelayBounds;

use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, Listener, ListenerCounters};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use atunnel_connect::flood::FloodLimits;
use atunnel_connect::limits::HEADER_READ_TIMEOUT;
use atunnel_connect::limits::{
    HANDSHAKE_TIMEOUT, ROUTER_CONNECT_CONNECTION_WINDOW, ROUTER_PING_INTERVAL, ROUTER_PING_TIMEOUT,
};
use atunnel_connect::{ConnectServer, H2Settings};
use atunnel_tls::Hibernation;

pub use routes::{
    ActorDialer, ActorIngressStats, ActorRoute, DEFAULT_ACTOR_MAX_ROUTER_STREAMS,
    DEFAULT_BODY_IDLE_TIMEOUT, DEFAULT_MAX_IDLE_PER_PORT, DEFAULT_MAX_IN_FLIGHT_PER_ACTOR,
    DEFAULT_MAX_PORTS_PER_ACTOR, DirectDialer, IngressH2Floods, PoolSettings, RouteError,
    RouteStats, SandboxDialer,
};
use routes::{Http2Keeping, RouterPing, Routes};
pub use tls::IngressTlsError;

/// The router's default SPIFFE ID, the only client ingress admits.
pub const ROUTER_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atenet-router";

/// How often the trust bundle's file is checked for a change: a stat every
/// 10 s costs nothing, and a rotated CA is trusted within that.
pub const TRUST_BUNDLE_POLL: Duration = Duration::from_secs(10);

/// How ingress serves the router: its certificates and trust, the router
/// it admits, its pools, socket options, timeouts and per-actor bounds.
#[derive(Clone, Debug)]
pub struct IngressConfig {
    /// One PEM with the worker's certificate chain and key; re-read when it changes.
    pub credential_bundle: PathBuf,
    /// CAs that sign the router's certificate; re-read on SIGHUP and, every
    /// `trust_bundle_poll`, when its file changed.
    pub trust_bundle: PathBuf,
    /// How often the trust bundle's file is checked for a change (zero:
    /// only on SIGHUP) ([`TRUST_BUNDLE_POLL`], 10 s).
    pub trust_bundle_poll: Duration,
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
    /// once TLS is done (default [`HEADER_READ_TIMEOUT`], 10 s). An
    /// idle keep-alive connection is not timed by it.
    pub header_read_timeout: Duration,
    /// The router's HTTP/2 connections to ingress HTTPS are pinged this
    /// often (zero: never) and closed if a ping goes unanswered for
    /// `router_ping_timeout` ([`ROUTER_PING_INTERVAL`]).
    pub router_ping_interval: Duration,
    pub router_ping_timeout: Duration,
    /// How long a client has to finish TLS on either listener
    /// ([`HANDSHAKE_TIMEOUT`], 10 s).
    pub tls_handshake_timeout: Duration,
    /// Connections in their TLS handshake on each listener, in total and
    /// per source address; past either, new ones are closed at once.
    pub pre_auth: PreAuthLimits,
    /// When CONNECT tunnels that cannot finish are reset, for an `Ingress`
    /// used on its own (`--stalled-write-timeout`, `--half-closed-timeout`).
    /// A `Tunnel`'s actors relay within their activation's bounds,
    /// `TunnelConfig::egress.relay`, on both sides.
    pub relay: RelayBounds,
    /// Each HTTP/2 connection's control-frame budget: the router's to both
    /// listeners, and h2c to actors.
    pub h2_floods: FloodLimits,
}

impl IngressConfig {
    /// The defaults, serving `credential_bundle` to routers signed by the
    /// CAs in `trust_bundle`.
    pub fn new(credential_bundle: PathBuf, trust_bundle: PathBuf) -> Self {
        Self {
            credential_bundle,
            trust_bundle,
            ..Self::default()
        }
    }
}

/// Every setting's default; the two bundles are empty paths, which
/// [`Ingress::new`] refuses, naming them: set them (or use
/// [`IngressConfig::new`]).
impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            credential_bundle: PathBuf::new(),
            trust_bundle: PathBuf::new(),
            allowed_client_id: ROUTER_SPIFFE_ID.to_string(),
            pools: PoolSettings::default(),
            socket: SocketOptions::default(),
            sandbox_socket: SocketOptions::sandbox_default(),
            drain_timeout: crate::egress::DEFAULT_DRAIN_TIMEOUT,
            hibernate_after: atunnel_tls::hibernate::DEFAULT_AFTER,
            header_read_timeout: HEADER_READ_TIMEOUT,
            router_ping_interval: ROUTER_PING_INTERVAL,
            router_ping_timeout: ROUTER_PING_TIMEOUT,
            tls_handshake_timeout: HANDSHAKE_TIMEOUT,
            trust_bundle_poll: TRUST_BUNDLE_POLL,
            pre_auth: PreAuthLimits::default(),
            relay: RelayBounds::default(),
            h2_floods: FloodLimits::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error(transparent)]
    Tls(#[from] IngressTlsError),
    #[error("loading the trust bundle: {0}")]
    Trust(#[from] atunnel_identity::pem_files::PemError),
    #[error(transparent)]
    Route(#[from] RouteError),
}

pub struct Ingress {
    cfg: IngressConfig,
    routes: Arc<Routes>,
    /// Both listeners' TLS, replaced by [`Ingress::reload_tls`].
    tls: Arc<atunnel_tls::ReloadableConfig>,
    connect: Arc<ConnectServer<connect::IngressConnect>>,
    https_listeners: ListenerCounters,
    https_pre_auth: Arc<PreAuthGate>,
    hibernation: Arc<Hibernation>,
    /// The listeners' tasks and the allocator trim, for shutdown to wait on.
    tasks: TaskTracker,
    /// Drops every HTTPS router connection at once: shutdown's last step,
    /// for connections a graceful close would not end (hyper reading the
    /// rest of a request body the router is still sending).
    force_close: CancellationToken,
}

impl Ingress {
    pub fn new(cfg: IngressConfig, pool: BufferPool) -> Result<Arc<Self>, IngressError> {
        Self::with_overload(cfg, pool, None)
    }

    /// As [`Ingress::new`], answering new requests and tunnels 503 while
    /// `overload` refuses work.
    pub fn with_overload(
        cfg: IngressConfig,
        pool: BufferPool,
        overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
    ) -> Result<Arc<Self>, IngressError> {
        Self::with_holdings(cfg, pool, overload, crate::holdings::Holdings::unbounded())
    }

    /// As [`Ingress::with_overload`], counting each actor's requests and
    /// CONNECTs in `holdings` (shared with egress) against its descriptor
    /// budget.
    pub fn with_holdings(
        cfg: IngressConfig,
        pool: BufferPool,
        overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
        holdings: Arc<crate::holdings::Holdings>,
    ) -> Result<Arc<Self>, IngressError> {
        let tls = atunnel_tls::ReloadableConfig::new(Self::server_config(&cfg)?);
        let routes = Arc::new(Routes::new(
            cfg.pools,
            cfg.sandbox_socket,
            cfg.relay,
            pool,
            overload,
            Http2Keeping {
                router_ping: RouterPing {
                    interval: cfg.router_ping_interval,
                    timeout: cfg.router_ping_timeout,
                },
                floods: cfg.h2_floods,
            },
            holdings,
        ));
        let hibernation = Hibernation::new(cfg.hibernate_after);
        let connect = ConnectServer::new(
            Arc::new(connect::IngressConnect {
                routes: routes.clone(),
            }),
            tls.clone(),
            cfg.socket,
            H2Settings {
                preface_timeout: cfg.header_read_timeout,
                handshake_timeout: cfg.tls_handshake_timeout,
                pre_auth: cfg.pre_auth,
                connection_window: ROUTER_CONNECT_CONNECTION_WINDOW,
                ping_interval: cfg.router_ping_interval,
                ping_timeout: cfg.router_ping_timeout,
                floods: cfg.h2_floods,
                ..H2Settings::default()
            },
            hibernation.clone(),
        );
        let https_pre_auth = PreAuthGate::new(cfg.pre_auth);
        Ok(Arc::new(Self {
            hibernation,
            cfg,
            routes,
            tls,
            connect,
            https_listeners: ListenerCounters::default(),
            https_pre_auth,
            tasks: TaskTracker::new(),
            force_close: CancellationToken::new(),
        }))
    }

    /// Ends actor `uid`'s requests and CONNECT tunnels in flight (the
    /// overload guard shed it) and its egress tunnels with them: how many
    /// requests and tunnels, or `None` if it is not active.
    pub(crate) fn shed(&self, uid: &str) -> Option<usize> {
        self.routes.shed(uid)
    }

    /// Actor `uid`'s requests and CONNECT tunnels in flight, if any.
    pub(crate) fn in_flight(&self, uid: &str) -> Option<usize> {
        self.routes.in_flight(uid)
    }

    /// The actor's current route, if it is active.
    pub fn route(&self, atespace: &str, name: &str) -> Option<Arc<ActorRoute>> {
        self.routes.lookup(atespace, name)
    }

    pub fn stats(&self) -> RouteStats {
        let mut stats = self.routes.stats();
        stats.h2_floods.connect_total = self.connect.h2_floods();
        stats
    }

    pub fn hibernation(&self) -> &Arc<Hibernation> {
        &self.hibernation
    }

    /// Connections in their TLS handshake on the HTTPS and the CONNECT
    /// listener, and those closed at the cap.
    fn server_config(cfg: &IngressConfig) -> Result<Arc<rustls::ServerConfig>, IngressError> {
        let trust = atunnel_identity::pem_files::load_certs(&cfg.trust_bundle)?;
        Ok(tls::server_config(
            &cfg.credential_bundle,
            &trust,
            &cfg.allowed_client_id,
        )?)
    }

    /// The ingress configuration it runs with.
    pub fn config(&self) -> &IngressConfig {
        &self.cfg
    }

    /// Reads the credential and trust bundles again: connections accepted
    /// from now on, on both listeners, handshake with them (open ones keep
    /// theirs). A bundle that fails to load changes nothing.
    pub fn reload_tls(&self) -> Result<(), IngressError> {
        self.tls.replace(Self::server_config(&self.cfg)?);
        Ok(())
    }

    /// Until `cancel`, reloads the credential and trust bundles
    /// ([`Ingress::reload_tls`]) on every SIGHUP and, every
    /// `trust_bundle_poll` (zero: never), when the trust bundle's file
    /// changed: its own rotation needs no signal. The credential bundle is
    /// also checked at every handshake (`ReloadingCert`). A bundle that
    /// fails to load is logged and the previous one kept.
    pub async fn reload_tls_until(&self, cancel: CancellationToken) {
        let (trust, poll) = (&self.cfg.trust_bundle, self.cfg.trust_bundle_poll);
        atunnel_process::reload::on_sighup_or_change(trust, poll, cancel, |why| {
            match self.reload_tls() {
                Ok(()) => tracing::info!(why, "reloaded the credential and trust bundles"),
                Err(e) => tracing::warn!(why, error = %e, "keeping the previous TLS bundles"),
            }
        })
        .await
    }

    /// The pre-authentication figures of the HTTPS and the CONNECT listener.
    pub fn pre_auth(&self) -> (PreAuthStats, PreAuthStats) {
        (self.https_pre_auth.stats(), self.connect.pre_auth())
    }

    /// Sizes of one HTTPS and one CONNECT connection's task future: part of
    /// every idle connection's heap, hibernated or not (docs/memory.md).
    pub fn connection_future_bytes(&self) -> (usize, usize) {
        (
            self.https_listeners.connection_future_bytes(),
            self.connect.listener_stats().connection_future_bytes,
        )
    }

    /// Routes `<atespace>/<name>` to the actor `uid` behind `dialer`, in
    /// an activation of ingress's own (CONNECT tunnels relay within
    /// `IngressConfig::relay`). The same name with another uid replaces the
    /// older incarnation; the same uid is refused.
    pub fn activate(
        &self,
        atespace: &str,
        name: &str,
        uid: &str,
        dialer: Box<dyn ActorDialer>,
    ) -> Result<(), IngressError> {
        let activation = Arc::new(ActorActivation::new(self.routes.relay()));
        self.activate_with(atespace, name, uid, dialer, activation)
    }

    /// [`Ingress::activate`] as one side of `activation`, which egress
    /// may share (its relay bounds are the CONNECT tunnels').
    pub(crate) fn activate_with(
        &self,
        atespace: &str,
        name: &str,
        uid: &str,
        dialer: Box<dyn ActorDialer>,
        activation: Arc<ActorActivation>,
    ) -> Result<(), IngressError> {
        Ok(self
            .routes
            .activate(atespace, name, uid, dialer, activation)?)
    }

    /// Stops routing to the actor if `uid` matches, cancels its activation
    /// (its requests in flight end with an error, its tunnels are reset)
    /// and waits for them up to `drain_timeout`. Idempotent.
    pub async fn deactivate(&self, atespace: &str, name: &str, uid: &str) {
        self.routes
            .deactivate(atespace, name, uid, self.cfg.drain_timeout)
            .await
    }

    /// Stops routing to the actor if `uid` matches (the first half of
    /// [`Ingress::deactivate`]): its route, for [`Ingress::drain_route`].
    pub(crate) fn take_route(
        &self,
        atespace: &str,
        name: &str,
        uid: &str,
    ) -> Option<Arc<ActorRoute>> {
        self.routes.take(atespace, name, uid)
    }

    /// Cancels `route`'s activation and waits for its requests and
    /// tunnels up to `drain_timeout` (the second half).
    pub(crate) async fn drain_route(&self, route: Arc<ActorRoute>) {
        Routes::drain(route, self.cfg.drain_timeout).await
    }

    /// Serves the CONNECT listener until `cancel`.
    pub async fn serve_connect(&self, listener: TcpListener, cancel: CancellationToken) {
        self.connect.clone().serve(listener, cancel).await
    }

    /// Serves the HTTPS listener until `cancel`, then finishes in-flight
    /// requests gracefully and waits for every connection.
    pub async fn serve_https(&self, listener: TcpListener, cancel: CancellationToken) {
        let mut listener = Listener::new(listener, "ingress-https");
        listener
            .serve(&cancel, &self.https_listeners, |tcp, client| {
                // Closed at once past the cap: no task, no handshake state.
                let handshaking = self.https_pre_auth.admit(client.ip())?;
                // The config current at the accept (it may be reloaded).
                let acceptor = TlsAcceptor::from(self.tls.current());
                let routes = self.routes.clone();
                let socket = self.cfg.socket;
                let cancel = cancel.clone();
                let force_close = self.force_close.clone();
                let hibernation = self.hibernation.clone();
                let header_read_timeout = self.cfg.header_read_timeout;
                let handshake_timeout = self.cfg.tls_handshake_timeout;
                Some(async move {
                    if socket.apply(&tcp).is_err() {
                        return;
                    }
                    // Boxed: the handshake's state is needed only until it ends.
                    let accept = atunnel_tls::accept(&acceptor, tcp, handshake_timeout);
                    let tls = tokio::select! {
                        _ = cancel.cancelled() => return,
                        tls = Box::pin(handshaking.run(accept)) => tls,
                    };
                    if let Some(Ok(tls)) = tls {
                        // Shutdown's last step drops the connection here. The
                        // serve future is made inside the select!, not
                        // captured and moved into it: a connection's future
                        // (per-connection memory) would hold it twice.
                        tokio::select! {
                            biased;
                            _ = force_close.cancelled() => {}
                            _ = router_conn::serve(
                                tls,
                                routes,
                                client,
                                hibernation,
                                header_read_timeout,
                                cancel,
                            ) => {}
                        }
                    }
                })
            })
            .await
    }

    /// Binds both listeners and serves them in the background.
    pub async fn spawn(
        self: &Arc<Self>,
        https: SocketAddr,
        connect: SocketAddr,
        cancel: CancellationToken,
    ) -> std::io::Result<(SocketAddr, SocketAddr)> {
        let https = TcpListener::bind(https).await?;
        let connect = TcpListener::bind(connect).await?;
        let addrs = (https.local_addr()?, connect.local_addr()?);
        self.tasks
            .spawn(self.hibernation.clone().trim_until(cancel.clone()));
        let (a, c) = (self.clone(), cancel.clone());
        self.tasks
            .spawn(async move { a.serve_https(https, c).await });
        let a = self.clone();
        self.tasks
            .spawn(async move { a.serve_connect(connect, cancel).await });
        Ok(addrs)
    }

    /// Retires every activation (their requests and tunnels are cancelled,
    /// waited for up to [`SHUTDOWN_CLOSE_GRACE`]), then waits for the listeners
    /// [`Ingress::spawn`] started, whose cancel token the caller has
    /// cancelled, and every connection they accepted: for
    /// [`SHUTDOWN_CLOSE_GRACE`] to close gracefully, then dropped.
    pub async fn shutdown(&self) {
        self.routes.deactivate_all(SHUTDOWN_CLOSE_GRACE).await;
        if tokio::time::timeout(SHUTDOWN_CLOSE_GRACE, self.wait_listeners())
            .await
            .is_err()
        {
            tracing::info!(after = ?SHUTDOWN_CLOSE_GRACE, "router connections still closing at shutdown; dropping them");
            self.force_close.cancel();
            self.wait_listeners().await;
        }
    }

    /// Waits for the listeners (stopped by their cancel token) and their
    /// connections to end: in-flight requests finish, then each router
    /// connection closes.
    pub async fn wait_listeners(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}
