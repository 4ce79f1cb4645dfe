//! Opens egress tunnels to the gateway: HTTP/2 CONNECT streams over pooled
//! mutual-TLS connections, or one HTTP/1.1 CONNECT per TLS connection when the
//! gateway does not speak h2.
//!
//! Identity is only the client certificate: the request carries the CONNECT
//! line and, over HTTP/1.1, `Host`; nothing else.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use atunnel_core::endpoint::{Chunk, Endpoint};
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, H2Stream};
use bytes::Bytes;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, watch};
use tokio_util::task::TaskTracker;

use atunnel_identity::credential::ActorCredential;
use atunnel_tls::client::ClientTls;

use crate::flood::{FloodCount, FloodGuard, FloodLimits, Role};
use crate::http1;
use crate::limits::{
    INITIAL_MAX_SEND_STREAMS, MAX_CONCURRENT_RESET_STREAMS, MAX_LOCAL_ERROR_RESET_STREAMS,
    MAX_PENDING_ACCEPT_RESET_STREAMS, MAX_REFUSAL_BODY, OPEN_TIMEOUT, POOL_CLOSE_WAIT,
    POOL_IDLE_TIMEOUT, POOL_PING_INTERVAL, POOL_PING_TIMEOUT, REFUSAL_BODY_WAIT,
    TUNNEL_CONNECTION_WINDOW, TUNNEL_MAX_FRAME_SIZE, TUNNEL_MAX_HEADER_LIST, TUNNEL_MAX_SEND_BUF,
    TUNNEL_STREAM_WINDOW,
};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("invalid tunnel destination {0:?}: must be an IP literal and a port 1-65535")]
    InvalidDestination(String),
    #[error("gateway {addr} unreachable: {source}")]
    GatewayUnreachable {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// TLS failed, the gateway sent an alert, or hung up before answering the
    /// CONNECT. Under TLS 1.3 a refused client certificate only shows up here,
    /// after the client's side of the handshake has finished.
    #[error("gateway {addr} handshake failed: {reason}")]
    GatewayHandshake { addr: SocketAddr, reason: String },
    #[error("gateway refused CONNECT {authority} with status {status}: {body:?}")]
    ConnectRefused {
        authority: String,
        status: u16,
        body: String,
    },
    /// The gateway reset the CONNECT stream with REFUSED_STREAM (it did not
    /// process it, usually for being at its stream limit), on the retry too.
    #[error("gateway {addr} refused the stream for CONNECT {authority} (REFUSED_STREAM), twice")]
    StreamRefused { addr: SocketAddr, authority: String },
    #[error("opening a tunnel to {authority} took longer than {after:?}")]
    Timeout { authority: String, after: Duration },
    #[error("gateway {addr} sent a malformed answer: {reason}")]
    Protocol { addr: SocketAddr, reason: String },
}

/// Where and how to reach the gateway.
#[derive(Clone, Debug)]
pub struct GatewayClientConfig {
    pub address: SocketAddr,
    /// The name the gateway's certificate must carry.
    pub server_name: ServerName<'static>,
    /// CAs that sign the gateway's certificate.
    pub roots: Arc<rustls::RootCertStore>,
    pub socket: SocketOptions,
    pub open_timeout: Duration,
    /// See [`REFUSAL_BODY_WAIT`].
    pub refusal_body_wait: Duration,
    /// Receive window per tunnel (see [`TUNNEL_STREAM_WINDOW`]).
    pub stream_window: u32,
    /// Receive window per pooled connection: the most its tunnels together
    /// hold unread (see [`TUNNEL_CONNECTION_WINDOW`]).
    pub connection_window: u32,
    /// Largest frame the gateway may send (see [`TUNNEL_MAX_FRAME_SIZE`]).
    pub max_frame_size: u32,
    /// A pooled connection with no tunnel for this long is closed (see
    /// [`POOL_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// A pooled connection is pinged this often (see [`POOL_PING_INTERVAL`];
    /// zero: never)
    pub ping_interval: Duration,
    /// and retired if a ping is not answered within this.
    pub ping_timeout: Duration,
    /// Each pooled connection's control-frame budget ([`crate::flood`]).
    pub floods: FloodLimits,
}

impl GatewayClientConfig {
    pub fn new(
        address: SocketAddr,
        server_name: ServerName<'static>,
        roots: Arc<rustls::RootCertStore>,
    ) -> Self {
        Self {
            address,
            server_name,
            roots,
            socket: SocketOptions::default(),
            open_timeout: OPEN_TIMEOUT,
            refusal_body_wait: REFUSAL_BODY_WAIT,
            stream_window: TUNNEL_STREAM_WINDOW,
            connection_window: TUNNEL_CONNECTION_WINDOW,
            max_frame_size: TUNNEL_MAX_FRAME_SIZE,
            idle_timeout: POOL_IDLE_TIMEOUT,
            ping_interval: POOL_PING_INTERVAL,
            ping_timeout: POOL_PING_TIMEOUT,
            floods: FloodLimits::default(),
        }
    }
}

/// Parses a tunnel destination: an IP literal and a non-zero port, checked
/// before any I/O.
pub fn parse_destination(authority: &str) -> Result<SocketAddr, OpenError> {
    match authority.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Ok(addr),
        _ => Err(OpenError::InvalidDestination(authority.to_string())),
    }
}

/// `dest` as a CONNECT authority, as its `Display` writes it
/// (`192.0.2.1:443`, `[2001:db8::1]:443`), without `fmt` for IPv4: every
/// tunnel opened writes one (egress-open in `docs/design.md`).
fn authority(dest: SocketAddr) -> String {
    let mut out = Vec::with_capacity(24);
    atunnel_core::addr_text::push_socket_addr(&mut out, dest);
    // ASCII digits, dots, colons and brackets only.
    String::from_utf8(out).unwrap_or_else(|_| dest.to_string())
}

/// A pooled HTTP/2 connection to the gateway.
struct H2Conn {
    send: h2::client::SendRequest<Bytes>,
    use_: Arc<ConnUse>,
    /// Becomes true once the gateway's SETTINGS have been applied, so
    /// `current_max_send_streams` is the gateway's limit and not our guess.
    settled: watch::Receiver<bool>,
    /// The client certificate it was authenticated with expires here; no new
    /// streams after that, so expiry is enforced on pooled connections too.
    cert_not_after: Option<SystemTime>,
}

impl H2Conn {
    fn has_capacity(&self, now: SystemTime) -> bool {
        // Until the gateway's limit is known a fresh connection takes one
        // stream: more could exceed the limit, and each would be refused
        // (sent before the SETTINGS arrived) or queued inside h2 until some
        // stream ends (sent after), which for a tunnel may be never.
        let limit = if self.is_settled() {
            self.send.current_max_send_streams()
        } else {
            1
        };
        !self.use_.dead.load(Ordering::Acquire)
            && self.cert_not_after.is_none_or(|t| now < t)
            && self.use_.streams.load(Ordering::Acquire) < limit
    }

    fn is_settled(&self) -> bool {
        *self.settled.borrow()
    }

    /// Called under the pool's lock, so it cannot race the idle retirement.
    fn claim(&self) -> StreamSlot {
        self.use_.claims.fetch_add(1, Ordering::AcqRel);
        self.use_.streams.fetch_add(1, Ordering::AcqRel);
        StreamSlot(self.use_.clone())
    }
}

/// How a pooled connection is used, shared by its tunnels' slots and its
/// connection task.
#[derive(Default)]
struct ConnUse {
    streams: AtomicUsize,
    /// Streams ever claimed: the idle timer knows from it whether a tunnel
    /// came and went while it slept.
    claims: AtomicU64,
    dead: AtomicBool,
    /// Woken when the last stream ends.
    now_idle: Notify,
}

impl ConnUse {
    async fn until_idle(&self) {
        loop {
            let notified = self.now_idle.notified();
            if self.streams.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Holds one of a pooled connection's stream slots for a tunnel's life.
pub struct StreamSlot(Arc<ConnUse>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.now_idle.notify_one();
        }
    }
}

/// An open tunnel, ready for the relay.
pub enum GatewayTunnel {
    H2 {
        stream: H2Stream,
        _slot: StreamSlot,
    },
    /// Boxed: a TLS session is large and most tunnels are HTTP/2.
    H1(Box<ClientTls>),
}

impl GatewayTunnel {
    pub fn protocol(&self) -> &'static str {
        match self {
            GatewayTunnel::H2 { .. } => "h2",
            GatewayTunnel::H1(_) => "http/1.1",
        }
    }

    fn endpoint(&mut self) -> &mut dyn Endpoint {
        match self {
            GatewayTunnel::H2 { stream, .. } => stream,
            GatewayTunnel::H1(tls) => tls.as_mut(),
        }
    }
}

impl Endpoint for GatewayTunnel {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_readable(cx)
    }
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.endpoint().poll_send_capacity(cx)
    }
    fn idle(&mut self) {
        self.endpoint().idle()
    }
    fn reads_into_pool(&self) -> bool {
        matches!(self, GatewayTunnel::H1(_))
    }
    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        pool: &BufferPool,
        max: usize,
    ) -> Poll<io::Result<Option<Chunk>>> {
        self.endpoint().poll_read_chunk(cx, pool, max)
    }
    fn consumed(&mut self, n: usize) {
        self.endpoint().consumed(n)
    }
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Chunk,
    ) -> Poll<io::Result<()>> {
        self.endpoint().poll_write_chunk(cx, chunk)
    }
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_flush(cx)
    }
    fn poll_close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.endpoint().poll_close_write(cx)
    }
    fn poll_write_cut(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.endpoint().poll_write_cut(cx)
    }
    fn abort(&mut self) {
        self.endpoint().abort()
    }
}

enum Dialed {
    /// A connection and the stream slot claimed on it; `true` if it came
    /// from the pool.
    H2(Arc<H2Conn>, StreamSlot, bool),
    H1(Box<ClientTls>),
}

/// What the pool has for a new stream.
enum Pooled {
    Slot(Arc<H2Conn>, StreamSlot),
    /// No room now, but this fresh connection's limit is about to be known.
    Settling(watch::Receiver<bool>),
    Full,
}

/// Counters for /stats.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    pub h2_connections: usize,
    pub h2_streams: usize,
    /// Pooled connections closed for having no tunnel for the idle timeout.
    pub h2_idle_closed_total: u64,
    /// Pooled connections retired as dead: a ping or a CONNECT unanswered.
    pub h2_dead_retired_total: u64,
    /// Connections ended for an HTTP/2 control-frame flood from the gateway.
    pub h2_floods_total: u64,
}

/// The rustls config of one dial. Made per dial rather than kept: it is
/// some 700 B with its verifier, every prepared actor would hold one, and
/// dials are rare (HTTP/2 pools them) and cost a handshake anyway.
fn tls_config(
    cfg: &GatewayClientConfig,
    credential: &Arc<ActorCredential>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut tls = rustls::ClientConfig::builder_with_provider(atunnel_tls::provider::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(cfg.roots.clone())
        .with_client_cert_resolver(credential.clone());
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // A pooled connection's expiry must be that of the certificate it
    // actually authenticated with: a resumed session would carry the
    // previous certificate's identity past a renewal. HTTP/2 pools its
    // connections, so full handshakes are rare.
    tls.resumption = rustls::client::Resumption::disabled();
    Ok(tls)
}

/// One actor's tunnel client: its TLS identity and its connection pool.
pub struct GatewayClient {
    cfg: GatewayClientConfig,
    /// Shared with each connection's task, which takes its connection out
    /// when it has been idle for the idle timeout.
    pool: Arc<Pool>,
    /// Serialises dials while the gateway may speak h2, so a burst of opens
    /// shares one new connection instead of racing to make one each.
    dial_lock: tokio::sync::Mutex<()>,
    gateway_is_h1: AtomicBool,
    credential: Arc<ActorCredential>,
    connections: TaskTracker,
}

/// The pooled connections and what became of those that left.
#[derive(Default)]
struct Pool {
    conns: Mutex<Vec<Arc<H2Conn>>>,
    idle_closed: AtomicU64,
    dead_retired: AtomicU64,
    floods: Arc<FloodCount>,
}

impl GatewayClient {
    /// A client presenting `credential`'s current certificate, offering
    /// ALPN `h2,http/1.1`, TLS 1.2 or 1.3.
    pub fn new(
        cfg: GatewayClientConfig,
        credential: Arc<ActorCredential>,
    ) -> Result<Self, rustls::Error> {
        // Built here once to fail at preparation, not at the first dial.
        tls_config(&cfg, &credential)?;
        let pool = Arc::new(Pool {
            floods: Arc::new(FloodCount::with_limits(cfg.floods)),
            ..Pool::default()
        });
        Ok(Self {
            cfg,
            pool,
            dial_lock: tokio::sync::Mutex::new(()),
            gateway_is_h1: AtomicBool::new(false),
            credential,
            connections: TaskTracker::new(),
        })
    }

    pub fn stats(&self) -> ClientStats {
        let pool = self.pool.conns.lock().expect("pool lock poisoned");
        ClientStats {
            h2_connections: pool.len(),
            h2_streams: pool
                .iter()
                .map(|c| c.use_.streams.load(Ordering::Relaxed))
                .sum(),
            h2_idle_closed_total: self.pool.idle_closed.load(Ordering::Relaxed),
            h2_dead_retired_total: self.pool.dead_retired.load(Ordering::Relaxed),
            h2_floods_total: self.pool.floods.total(),
        }
    }

    /// Opens a tunnel to `dest`, bounded by the open timeout. If that
    /// expires while a pooled connection has not answered the CONNECT, the
    /// connection is retired as black-holed and the open tried once more on
    /// a fresh one, within another open timeout.
    pub async fn open(&self, dest: SocketAddr) -> Result<GatewayTunnel, OpenError> {
        let authority = authority(dest);
        if dest.port() == 0 {
            return Err(OpenError::InvalidDestination(authority));
        }
        let after = self.cfg.open_timeout;
        let pooled_unanswered = AtomicBool::new(false);
        let first = self.open_unbounded(&authority, &pooled_unanswered);
        match tokio::time::timeout(after, first).await {
            Ok(result) => return result,
            Err(_) if pooled_unanswered.load(Ordering::Acquire) => {}
            Err(_) => return Err(OpenError::Timeout { authority, after }),
        }
        let again = self.open_unbounded(&authority, &pooled_unanswered);
        match tokio::time::timeout(after, again).await {
            Ok(result) => result,
            Err(_) => Err(OpenError::Timeout { authority, after }),
        }
    }

    /// Opens a tunnel to an authority given as text (validated first).
    pub async fn open_authority(&self, authority: &str) -> Result<GatewayTunnel, OpenError> {
        self.open(parse_destination(authority)?).await
    }

    async fn open_unbounded(
        &self,
        authority: &str,
        pooled_unanswered: &AtomicBool,
    ) -> Result<GatewayTunnel, OpenError> {
        let mut retried = false;
        loop {
            let (conn, slot, pooled) = match self.pooled_or_dial().await? {
                Dialed::H1(tls) => return self.connect_h1(tls, authority).await,
                Dialed::H2(conn, slot, pooled) => (conn, slot, pooled),
            };
            // Cancelled while waiting for its answer (the open timeout): the
            // connection may be black-holed, so no new tunnel is sent on it.
            let unanswered = RetireIfUnanswered {
                conn: &conn,
                client: self,
                armed: true,
                pooled: pooled.then_some(pooled_unanswered),
            };
            let answered = self.connect_h2(&conn, slot, authority).await;
            unanswered.disarm();
            match answered {
                Err(H2Failure::Connection(e)) => {
                    conn.use_.dead.store(true, Ordering::Release);
                    self.forget(&conn);
                    // A pooled connection may have died quietly: one retry
                    // on a fresh one. A fresh one failing is the gateway
                    // refusing us.
                    if pooled && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(self.handshake_error(e));
                }
                // The gateway did not process the stream (RFC 9113 §8.7) and
                // the connection is fine: retry once wherever the pool finds
                // room, this connection included.
                Err(H2Failure::Refused) if !retried => retried = true,
                Err(H2Failure::Refused) => {
                    return Err(OpenError::StreamRefused {
                        addr: self.cfg.address,
                        authority: authority.to_string(),
                    });
                }
                Err(H2Failure::Tunnel(e)) => return Err(e),
                Ok(tunnel) => return Ok(tunnel),
            }
        }
    }

    fn handshake_error(&self, reason: impl std::fmt::Display) -> OpenError {
        OpenError::GatewayHandshake {
            addr: self.cfg.address,
            reason: reason.to_string(),
        }
    }

    /// Claims a stream slot on a pooled connection with room. Claiming
    /// under the pool's lock keeps concurrent opens from all taking the last
    /// slot.
    fn pooled(&self) -> Pooled {
        let now = self.credential.clock().now();
        let mut pool = self.pool.conns.lock().expect("pool lock poisoned");
        // Drop dead connections and those whose certificate expired once
        // their last stream is gone.
        pool.retain(|c| {
            !c.use_.dead.load(Ordering::Acquire)
                && (c.cert_not_after.is_none_or(|t| now < t)
                    || c.use_.streams.load(Ordering::Acquire) > 0)
        });
        if let Some(conn) = pool.iter().find(|c| c.has_capacity(now)) {
            return Pooled::Slot(conn.clone(), conn.claim());
        }
        match pool.iter().find(|c| !c.is_settled()) {
            Some(conn) => Pooled::Settling(conn.settled.clone()),
            None => Pooled::Full,
        }
    }

    /// Marks `conn` dead and takes it out of the pool: no new tunnel goes
    /// on it; those it carries go on as long as it does.
    fn retire_dead(&self, conn: &Arc<H2Conn>) {
        if !conn.use_.dead.swap(true, Ordering::AcqRel) {
            self.pool.dead_retired.fetch_add(1, Ordering::Relaxed);
        }
        self.forget(conn);
    }

    fn forget(&self, conn: &Arc<H2Conn>) {
        self.pool
            .conns
            .lock()
            .expect("pool lock poisoned")
            .retain(|c| !Arc::ptr_eq(&c.use_, &conn.use_));
    }

    async fn pooled_or_dial(&self) -> Result<Dialed, OpenError> {
        loop {
            let mut settling = match self.pooled() {
                Pooled::Slot(conn, slot) => return Ok(Dialed::H2(conn, slot, true)),
                Pooled::Settling(settling) => settling,
                Pooled::Full if self.gateway_is_h1.load(Ordering::Relaxed) => {
                    return self.dial(None).await;
                }
                Pooled::Full => {
                    let guard = self.dial_lock.lock().await;
                    match self.pooled() {
                        Pooled::Slot(conn, slot) => return Ok(Dialed::H2(conn, slot, true)),
                        Pooled::Settling(settling) => settling,
                        Pooled::Full => return self.dial(Some(guard)).await,
                    }
                }
            };
            // A burst waits the one round trip for a fresh connection's
            // limit rather than dialling a connection each. An error means
            // the connection ended first: look again.
            let _ = settling.wait_for(|settled| *settled).await;
        }
    }

    /// Dials a connection; an h2 one joins the pool with a slot claimed for
    /// the caller. `_serialised` is held until then.
    async fn dial(
        &self,
        _serialised: Option<tokio::sync::MutexGuard<'_, ()>>,
    ) -> Result<Dialed, OpenError> {
        let tls = self.dial_tls().await?;
        if tls.alpn_protocol() != Some(b"h2") {
            self.gateway_is_h1.store(true, Ordering::Relaxed);
            return Ok(Dialed::H1(Box::new(tls)));
        }
        self.gateway_is_h1.store(false, Ordering::Relaxed);
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(self.cfg.stream_window)
            .initial_connection_window_size(self.cfg.connection_window)
            .max_frame_size(self.cfg.max_frame_size)
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .max_header_list_size(TUNNEL_MAX_HEADER_LIST)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
            .max_concurrent_reset_streams(MAX_CONCURRENT_RESET_STREAMS)
            .max_send_buffer_size(TUNNEL_MAX_SEND_BUF)
            // We never accept pushed streams.
            .enable_push(false)
            .handshake::<_, Bytes>(FloodGuard::new(tls, Role::Client, self.pool.floods.clone()))
            .await
            .map_err(|e| self.handshake_error(e))?;
        let use_ = Arc::new(ConnUse::default());
        let (settle, settled) = watch::channel(false);
        let mut ping_pong = connection
            .ping_pong()
            .expect("a new connection's ping handle, taken once");
        let (ping_every, ping_within) = (self.cfg.ping_interval, self.cfg.ping_timeout);
        let idle = IdleRetirement {
            use_: use_.clone(),
            pool: Arc::downgrade(&self.pool),
            after: self.cfg.idle_timeout,
        };
        self.connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = settled_by_ping(&mut ping_pong) => {
                    settle.send_replace(true);
                    tokio::select! {
                        ended = connection.as_mut() => ended,
                        // Its peer is gone (a node vanished, a NAT entry
                        // expired): out of the pool at once, and the socket
                        // closed, ending its tunnels.
                        () = ping_missed(&mut ping_pong, ping_every, ping_within) => {
                            idle.retire_dead();
                            tracing::debug!("gateway HTTP/2 connection missed a ping; retired");
                            Ok(())
                        }
                        // Out of the pool, the connection's last handle is
                        // gone: h2 sends GOAWAY and ends it.
                        () = idle.retire() => {
                            tokio::time::timeout(POOL_CLOSE_WAIT, connection.as_mut())
                                .await
                                .unwrap_or(Ok(()))
                        }
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "gateway HTTP/2 connection ended");
            }
            idle.use_.dead.store(true, Ordering::Release);
        });
        let conn = Arc::new(H2Conn {
            send,
            use_,
            settled,
            cert_not_after: self.credential.expires_at(),
        });
        let slot = conn.claim();
        self.pool
            .conns
            .lock()
            .expect("pool lock poisoned")
            .push(conn.clone());
        Ok(Dialed::H2(conn, slot, false))
    }

    async fn dial_tls(&self) -> Result<ClientTls, OpenError> {
        let addr = self.cfg.address;
        let tcp = self
            .cfg
            .socket
            .connect(addr, self.cfg.open_timeout)
            .await
            .map_err(|source| OpenError::GatewayUnreachable { addr, source })?;
        let tls = tls_config(&self.cfg, &self.credential).map_err(|e| self.handshake_error(e))?;
        atunnel_tls::client::connect(tls, self.cfg.server_name.clone(), tcp)
            .await
            .map_err(|e| self.handshake_error(e))
    }

    async fn connect_h2(
        &self,
        conn: &Arc<H2Conn>,
        slot: StreamSlot,
        authority: &str,
    ) -> Result<GatewayTunnel, H2Failure> {
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(authority)
            .body(())
            .map_err(|e| {
                H2Failure::Tunnel(OpenError::InvalidDestination(format!("{authority}: {e}")))
            })?;
        let mut send_request = conn.send.clone();
        let (response, send) = match send_request.send_request(request, false) {
            Ok(x) => x,
            Err(e) => return Err(H2Failure::Connection(e)),
        };
        let response = match response.await {
            Ok(r) => r,
            Err(e)
                if e.is_reset()
                    && !e.is_go_away()
                    && e.reason() == Some(h2::Reason::REFUSED_STREAM) =>
            {
                return Err(H2Failure::Refused);
            }
            // A reset of this stream alone is the gateway's answer to it.
            Err(e) if e.is_reset() && !e.is_go_away() => {
                return Err(H2Failure::Tunnel(OpenError::Protocol {
                    addr: self.cfg.address,
                    reason: format!("gateway reset the CONNECT stream: {e}"),
                }));
            }
            Err(e) => return Err(H2Failure::Connection(e)),
        };
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let body = read_refusal_body_h2(&mut body, self.cfg.refusal_body_wait).await;
            return Err(H2Failure::Tunnel(OpenError::ConnectRefused {
                authority: authority.to_string(),
                status: status.as_u16(),
                body,
            }));
        }
        Ok(GatewayTunnel::H2 {
            stream: H2Stream::new(send, body),
            _slot: slot,
        })
    }

    async fn connect_h1(
        &self,
        mut tls: Box<ClientTls>,
        authority: &str,
    ) -> Result<GatewayTunnel, OpenError> {
        let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        let write = async {
            tls.write_all(request.as_bytes()).await?;
            tls.flush().await
        };
        write.await.map_err(|e| self.handshake_error(e))?;
        let head = http1::read_head(&mut tls)
            .await
            .map_err(|e| match e.kind() {
                // TLS failures (alerts, rustls's or the record layer's) are
                // InvalidData too; only our own head parser's complaint is a protocol error.
                io::ErrorKind::InvalidData if !is_tls_error(&e) => OpenError::Protocol {
                    addr: self.cfg.address,
                    reason: e.to_string(),
                },
                _ => self.handshake_error(e),
            })?;
        let head = http1::parse_response(&head).map_err(|e| OpenError::Protocol {
            addr: self.cfg.address,
            reason: e.to_string(),
        })?;
        if (200..300).contains(&head.status) {
            return Ok(GatewayTunnel::H1(tls));
        }
        let limit = head
            .content_length
            .unwrap_or(MAX_REFUSAL_BODY)
            .min(MAX_REFUSAL_BODY);
        let body = read_refusal_body_h1(&mut tls, limit, self.cfg.refusal_body_wait).await;
        Err(OpenError::ConnectRefused {
            authority: authority.to_string(),
            status: head.status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// Closes pooled connections and waits for their tasks.
    pub async fn close(&self) {
        self.pool.conns.lock().expect("pool lock poisoned").clear();
        self.connections.close();
        self.connections.wait().await;
    }
}

/// Takes a pooled connection out of the pool once no tunnel has used it for
/// `after`, so an actor that went quiet stops holding a gateway connection
/// (its TLS session and h2 state) on both ends.
struct IdleRetirement {
    use_: Arc<ConnUse>,
    pool: Weak<Pool>,
    after: Duration,
}

impl IdleRetirement {
    /// Out of the pool now, whatever it carries, counted as dead unless it
    /// already was out.
    fn retire_dead(&self) {
        let first = !self.use_.dead.swap(true, Ordering::AcqRel);
        if let Some(pool) = self.pool.upgrade() {
            self.take_out(&mut pool.conns.lock().expect("pool lock poisoned"));
            if first {
                pool.dead_retired.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn take_out(&self, pool: &mut Vec<Arc<H2Conn>>) {
        pool.retain(|c| !Arc::ptr_eq(&c.use_, &self.use_));
    }

    async fn retire(&self) {
        loop {
            self.use_.until_idle().await;
            let claims = self.use_.claims.load(Ordering::Acquire);
            tokio::time::sleep(self.after).await;
            let Some(pool) = self.pool.upgrade() else {
                return;
            };
            // Claims are made under this lock: once the connection is marked
            // dead here, no tunnel can take a slot on it.
            let mut conns = pool.conns.lock().expect("pool lock poisoned");
            if self.use_.streams.load(Ordering::Acquire) == 0
                && self.use_.claims.load(Ordering::Acquire) == claims
            {
                self.use_.dead.store(true, Ordering::Release);
                self.take_out(&mut conns);
                pool.idle_closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

fn is_tls_error(e: &io::Error) -> bool {
    atunnel_tls::client::is_tls_error(e)
}

enum H2Failure {
    /// The connection (not just this stream) failed before an answer.
    Connection(h2::Error),
    /// RST_STREAM(REFUSED_STREAM): not processed, safe to send again.
    Refused,
    Tunnel(OpenError),
}

/// Resolves once the gateway's SETTINGS have been applied, or the connection
/// ended. The SETTINGS are the gateway's first frame and h2 applies them
/// before reading another, so the answer to a PING sent now comes after.
async fn settled_by_ping(ping_pong: &mut h2::PingPong) {
    let _ = ping_pong.ping(h2::Ping::opaque()).await;
}

/// Pings every `every` and returns when one is not answered within
/// `within` (or the connection can no longer ping). Never, if `every` is
/// zero.
async fn ping_missed(ping_pong: &mut h2::PingPong, every: Duration, within: Duration) {
    if every.is_zero() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(every).await;
        match tokio::time::timeout(within, ping_pong.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            _ => return,
        }
    }
}

/// Retires a pooled connection whose CONNECT answer was still awaited when
/// the open was cancelled (by the open timeout, or the tunnel's end).
struct RetireIfUnanswered<'a> {
    conn: &'a Arc<H2Conn>,
    client: &'a GatewayClient,
    armed: bool,
    /// Set when it fires on a connection that came from the pool.
    pooled: Option<&'a AtomicBool>,
}

impl RetireIfUnanswered<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RetireIfUnanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.retire_dead(self.conn);
            if let Some(flag) = self.pooled {
                flag.store(true, Ordering::Release);
            }
        }
    }
}

/// Up to `limit` bytes of a refusal's body, or what arrived within `wait`.
/// The body is best effort: the status is the answer.
async fn read_refusal_body_h1<R: tokio::io::AsyncRead + Unpin>(
    tls: &mut R,
    limit: usize,
    wait: Duration,
) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut body = vec![0u8; limit];
    let mut filled = 0;
    while filled < limit {
        match tokio::time::timeout_at(deadline, tls.read(&mut body[filled..])).await {
            Ok(Ok(n)) if n > 0 => filled += n,
            _ => break,
        }
    }
    body.truncate(filled);
    body
}

/// Up to [`MAX_REFUSAL_BODY`] bytes of a refusal's body, or what arrived
/// within `wait`.
async fn read_refusal_body_h2(body: &mut h2::RecvStream, wait: Duration) -> String {
    let deadline = tokio::time::Instant::now() + wait;
    let mut out = Vec::new();
    while out.len() < MAX_REFUSAL_BODY {
        match tokio::time::timeout_at(deadline, body.data()).await {
            Ok(Some(Ok(chunk))) => {
                let _ = body.flow_control().release_capacity(chunk.len());
                let take = chunk.len().min(MAX_REFUSAL_BODY - out.len());
                out.extend_from_slice(&chunk[..take]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod authority_fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn an_authority_is_written_as_display_writes_it(
            ip in any::<[u8; 4]>(),
            ip6 in any::<[u16; 8]>(),
            port in any::<u16>(),
        ) {
            let v4 = SocketAddr::from((ip, port));
            prop_assert_eq!(authority(v4), v4.to_string());
            let v6 = SocketAddr::from((ip6, port));
            prop_assert_eq!(authority(v6), v6.to_string());
        }
    }

    #[test]
    fn the_extremes_are_written_in_full() {
        for addr in [
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.0.0.1:9",
            "1.20.255.3:10000",
        ] {
            let addr: SocketAddr = addr.parse().expect("address");
            assert_eq!(authority(addr), addr.to_string());
        }
    }
}

#[cfg(test)]
mod refusal_body_fuzz {
    //! The refusal-body readers against arbitrary bodies in arbitrary
    //! chunks: never more than the limit, and within their wait.

    use proptest::prelude::*;

    use super::*;

    use atunnel_core::test_util::{Chunked, run_bounded};

    const GUARD: Duration = Duration::from_secs(10);
    /// The readers' own wait for a body that stalls: the case ends with it.
    const WAIT_STALLED: Duration = Duration::from_millis(50);
    /// The wait for a body that ends: never reached, so a busy host cannot
    /// cut such a body short.
    const WAIT_ENDED: Duration = Duration::from_secs(5);

    /// The gateway's side of one refused h2 CONNECT: the body goes in
    /// `chunks`, then the stream ends, or is left open if `stall`.
    async fn h2_refusal(chunks: Vec<Vec<u8>>, stall: bool) -> String {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io)
                .await
                .expect("server handshake");
            let (_request, mut respond) = conn.accept().await.expect("a request").expect("ok");
            let response = http::Response::builder()
                .status(403)
                .body(())
                .expect("response");
            let mut send = respond
                .send_response(response, false)
                .expect("send response");
            for chunk in chunks {
                send.send_data(Bytes::from(chunk), false)
                    .expect("send data");
            }
            if !stall {
                send.send_data(Bytes::new(), true).expect("end stream");
            }
            // Serve the connection until the client is done with it.
            while let Some(Ok(_)) = conn.accept().await {}
            drop(send);
        });
        let (mut send, conn) = h2::client::handshake(client_io)
            .await
            .expect("client handshake");
        let driver = tokio::spawn(conn);
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("192.0.2.1:443")
            .body(())
            .expect("request");
        let (response, _stream) = send.send_request(request, false).expect("send request");
        let response = response.await.expect("response");
        let mut body = response.into_body();
        let wait = if stall { WAIT_STALLED } else { WAIT_ENDED };
        let text = read_refusal_body_h2(&mut body, wait).await;
        drop((body, _stream, send));
        driver.abort();
        server.abort();
        text
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn an_h1_refusal_body_is_read_up_to_its_limit_and_no_further(
            body in prop::collection::vec(any::<u8>(), 0..6000),
            content_length in prop::option::of(any::<usize>()),
            sizes in prop::collection::vec(1usize..2048, 0..6),
            stall in any::<bool>(),
        ) {
            // As `open_h1` sizes it: the claimed length, at most the limit.
            let limit = content_length.unwrap_or(MAX_REFUSAL_BODY).min(MAX_REFUSAL_BODY);
            let mut peer = Chunked::new(body.clone(), sizes);
            if stall {
                peer = peer.stalling();
            }
            let wait = if stall { WAIT_STALLED } else { WAIT_ENDED };
            let got = run_bounded(GUARD, read_refusal_body_h1(&mut peer, limit, wait));
            let want = body.len().min(limit);
            if stall {
                // Returned within the guard, with what had come by the wait.
                prop_assert!(got.len() <= want);
            } else {
                prop_assert_eq!(got.len(), want);
            }
            prop_assert_eq!(&got[..], &body[..got.len()]);
            prop_assert_eq!(peer.consumed(), got.len());
            prop_assert!(peer.largest_offer() <= MAX_REFUSAL_BODY);
        }

        #[test]
        fn an_h2_refusal_body_is_kept_up_to_the_limit_whatever_its_frames(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..2500), 0..5),
            stall in any::<bool>(),
        ) {
            let mut chunks = chunks;
            if stall {
                // ASCII, so what came by the wait is a prefix of the text.
                chunks.iter_mut().flatten().for_each(|b| *b = *b % 95 + 32);
            }
            let body: Vec<u8> = chunks.concat();
            let got = run_bounded(GUARD, h2_refusal(chunks, stall));
            let want = String::from_utf8_lossy(&body[..body.len().min(MAX_REFUSAL_BODY)]).into_owned();
            if stall {
                prop_assert!(want.starts_with(&got), "{} bytes not a prefix", got.len());
            } else {
                prop_assert_eq!(got, want);
            }
        }
    }
}
