//! Which actors ingress may reach (a request names its actor in
//! `ate-target-actor`), and ingress's side of each activation: its dialer
//! and its own upstream pools.
//!
//! Connection pools are never shared across activations: a new activation of
//! the same actor gets fresh pools, and a connection dialed for an old one is
//! never handed to a newer one.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_core::BufferPool;
use atunnel_core::relay::{Op, RelayBounds, RelayError};
use atunnel_sandbox::{NsExecutor, SandboxNetwork};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use http::HeaderMap;
use http::header::HeaderName;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::activation::ActorActivation;
use crate::holdings::{ActorHold, Holdings, REQUEST_HELD_BYTES};

use super::actor_io::{ActorIo, ActorStream};
use super::http1_pool::{Dial, Http1Pool, UpstreamBody};
use atunnel_connect::flood::{FloodCount, FloodGuard, Role};
use atunnel_connect::limits::{
    ACTOR_DIAL_TIMEOUT, MAX_CONCURRENT_RESET_STREAMS, MAX_LOCAL_ERROR_RESET_STREAMS,
    MAX_PENDING_ACCEPT_RESET_STREAMS, PROXY_ACTOR_CONNECTION_WINDOW, PROXY_MAX_HEADER_LIST,
    PROXY_MAX_SEND_BUF, PROXY_STREAM_WINDOW,
};

/// Reaches the actor's program on a port.
pub trait ActorDialer: Send + Sync + 'static {
    fn dial(&self, port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>>;
}

/// Dials 169.254.17.2:<port> from inside the sandbox's gateway namespace.
pub struct SandboxDialer {
    pub exec: NsExecutor,
    pub sandbox: SandboxNetwork,
}

impl ActorDialer for SandboxDialer {
    fn dial(&self, port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        Box::pin(async move {
            self.sandbox
                .connect_from_gateway(&self.exec, atunnel_sandbox::sandbox::actor_addr(port))
                .await
                .map_err(io::Error::other)
        })
    }
}

/// Dials `ip:<port>` directly (actors on loopback, without sandboxes).
pub struct DirectDialer(pub std::net::IpAddr);

impl ActorDialer for DirectDialer {
    fn dial(&self, port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        Box::pin(TcpStream::connect((self.0, port)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("actor {0} is already active with uid {1}")]
    AlreadyActive(String, String),
}

/// Header naming the actor: `<atespace>/<actor>`.
pub const TARGET_ACTOR: &str = "ate-target-actor";

/// [`TARGET_ACTOR`] as a `HeaderName`: a `&str` name is parsed and checked
/// again at each lookup, which cost ~5 % of an ingress request's
/// instructions (the cost scenario's profile).
pub(crate) static TARGET_ACTOR_NAME: HeaderName = HeaderName::from_static(TARGET_ACTOR);

/// The hyper connector of one activation: every dial goes through its dialer,
/// is refused once the activation is cancelled or ingress's side retired,
/// and is counted. It dials `port` if set, else the URI's port. An h2c
/// connection's IO is under a [`FloodGuard`].
#[derive(Clone)]
pub(crate) struct ActivationConnector {
    activation: Arc<Shared>,
    port: Option<u16>,
    h2c: bool,
}

struct Shared {
    dialer: Box<dyn ActorDialer>,
    /// What egress shares: deactivation's cancel, the cut, the relay bounds.
    activation: Arc<ActorActivation>,
    /// Set when ingress stops routing to this activation: at deactivation,
    /// or when a newer incarnation of the actor (another uid) replaces it,
    /// which retires ingress's side alone (the older uid's egress is its
    /// own until it is deactivated).
    retired: AtomicBool,
    /// What in-flight requests and CONNECTs end on: a child of the
    /// activation's cut (so deactivation and shedding end them, egress's
    /// tunnels with them), cancelled on its own when this side is retired,
    /// and made again after a shed. Made at the first request: a token
    /// costs about 150 B of heap, which an actor never sent one need not
    /// hold.
    work: Mutex<Option<CancellationToken>>,
    /// Bytes the router may send toward the actor that atunnel would hold
    /// while the actor does not read them: each request body's receive
    /// window (or its known length, if smaller), taken at admission and
    /// given back when the body ends.
    router_bytes: AtomicU64,
    /// Requests answered 503 for `max_router_bytes`.
    refused_router_bytes: AtomicU64,
    /// Its requests in flight on each of the router's HTTP/2 connections,
    /// by the connection's peer address (a few entries: a router keeps a
    /// few connections); at most `max_router_streams` each.
    router_streams: Mutex<Vec<(std::net::SocketAddr, u32)>>,
    /// Requests answered 503 for `max_router_streams`.
    refused_router_streams: AtomicU64,
    new_connections: AtomicU64,
    /// Requests and tunnels refused: the actor had `max_in_flight`.
    refused_in_flight: AtomicU64,
    /// Requests answered 504: no response head within `response_timeout`.
    response_timeouts: AtomicU64,
    /// Requests ended because a body moved no bytes for its idle bound.
    response_body_idle_ends: AtomicU64,
    request_body_idle_ends: AtomicU64,
    /// Requests answered 503: a new port past `max_ports`.
    refused_ports: AtomicU64,
    /// CONNECT tunnels reset at a relay bound.
    connect_stalled_write_ends: AtomicU64,
    connect_half_closed_ends: AtomicU64,
    /// CONNECT tunnels' relay buffers: this actor's share of the pool.
    pool: BufferPool,
    upstream: Arc<Upstream>,
}

/// How every actor is dialed and pooled: one copy for all activations, not
/// one each (about 200 B per actor).
#[derive(Debug, Default)]
pub(crate) struct Upstream {
    pools: PoolSettings,
    socket: atunnel_core::sockopt::SocketOptions,
    /// h2c connections to actors ended for a control-frame flood.
    h2c_floods: Arc<FloodCount>,
    /// CONNECT tunnels' bounds for activations ingress makes alone
    /// (`Ingress::activate`); a tunnel's activations carry egress's.
    pub(crate) relay: RelayBounds,
    /// Each activation takes a share of `pools.max_buffers` of it.
    pool: BufferPool,
}

impl tower_service::Service<Uri> for ActivationConnector {
    type Response = ActorIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let port = self.port.or(uri.port_u16()).unwrap_or(80);
        Box::pin(self.clone().connect(port))
    }
}

impl Dial for ActivationConnector {
    fn dial(&self, port: u16) -> Pin<Box<dyn Future<Output = io::Result<ActorIo>> + Send>> {
        Box::pin(self.connect(port))
    }
}

impl ActivationConnector {
    /// Dials the actor's `port`, bounded, refused once the activation is
    /// cancelled.
    pub(crate) fn connect(
        &self,
        port: u16,
    ) -> impl Future<Output = io::Result<ActorIo>> + Send + 'static {
        let shared = self.activation.clone();
        let h2c = self.h2c;
        async move {
            let dial = async {
                tokio::time::timeout(shared.upstream.pools.dial_timeout, shared.dialer.dial(port))
                    .await
                    .map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("dialing actor port {port} timed out"),
                        )
                    })?
            };
            let tcp = tokio::select! {
                _ = shared.activation.cancelled() => return Err(cancelled()),
                r = dial => r?,
            };
            // A dial that completes after deactivation (or after a newer
            // incarnation took the route) is closed, never used.
            if shared.is_retired() {
                return Err(cancelled());
            }
            shared.upstream.socket.apply(&tcp)?;
            shared.new_connections.fetch_add(1, Ordering::Relaxed);
            let stream = if h2c {
                let floods = shared.upstream.h2c_floods.clone();
                ActorStream::H2c(FloodGuard::new(tcp, Role::Client, floods))
            } else {
                ActorStream::Plain(tcp)
            };
            // Twice the request body's bound: the request has been ended
            // by then (and counted); this closes the connection.
            let stall = shared.upstream.pools.request_body_idle * 2;
            Ok(ActorIo::new(stream, stall))
        }
    }
}

impl Shared {
    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed) || self.activation.is_cancelled()
    }
}

fn cancelled() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "actor deactivated")
}

/// One activation of one actor for ingress: its dialer, its upstream
/// pools, and its in-flight requests and tunnels.
pub struct ActorRoute {
    pub(crate) uid: String,
    shared: Arc<Shared>,
    /// What the actor holds across ingress and egress: each request or
    /// CONNECT in flight takes a descriptor of its budget (its upstream
    /// connection or dialled socket).
    hold: Arc<ActorHold>,
    /// HTTP/1.1 to the actor (everything but gRPC), by the URI's port;
    /// made on first use, and boxed: a client and its pool cost about
    /// 650 B, which an actor that is never sent a request need not hold.
    http1: OnceLock<Arc<Http1Pool>>,
    /// h2c with prior knowledge (gRPC), one client per actor port, each
    /// made on first use. The port is the client's, not the URI's, so that
    /// the URI keeps the router's authority: h2 sends it as `:authority`.
    h2c: Mutex<HashMap<u16, Client<ActivationConnector, UpstreamBody>>>,
    /// The ports HTTPS requests went to (port + 1; 0: free), HTTP/1.1 or
    /// h2c: each has a pool (and, for h2c, a client) for the activation's
    /// life, so at most `max_ports` of them. Filled in order and never
    /// changed, so a request finds its port with a few relaxed loads and
    /// no lock.
    ports: Box<[AtomicU32]>,
}

/// Pool settings toward actors.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// Idle connections kept per actor and port (so at most `max_ports`
    /// times this per actor). The reference kept Go's default of 2, so
    /// under load most requests opened a new connection
    /// ([`DEFAULT_MAX_IDLE_PER_PORT`]).
    pub max_idle_per_actor: usize,
    pub idle_timeout: Duration,
    /// How long dialing the actor may take ([`ACTOR_DIAL_TIMEOUT`]).
    pub dial_timeout: Duration,
    /// Requests and CONNECT tunnels in flight to one actor at once; past
    /// it the router gets 503 for that actor alone
    /// ([`DEFAULT_MAX_IN_FLIGHT_PER_ACTOR`]).
    pub max_in_flight: usize,
    /// How long an actor has to send a response's head; past it the router
    /// gets 504 and the request is dropped ([`DEFAULT_RESPONSE_TIMEOUT`]).
    pub response_timeout: Duration,
    /// How long a response body may move no bytes from the actor before
    /// the request is ended: the router's stream reset (its HTTP/1.1
    /// connection closed), the actor's connection closed
    /// ([`DEFAULT_BODY_IDLE_TIMEOUT`]; zero: never).
    pub response_body_idle: Duration,
    /// The same for a request body toward the actor: the actor stopped
    /// reading it, or the router stopped sending it
    /// ([`DEFAULT_BODY_IDLE_TIMEOUT`]; zero: never).
    pub request_body_idle: Duration,
    /// Distinct ports HTTPS requests may go to, per activation: each keeps
    /// a pool of up to `max_idle_per_actor` idle connections (and, for
    /// gRPC, an h2c client) for the activation's life; a request to one
    /// more gets 503 ([`DEFAULT_MAX_PORTS_PER_ACTOR`]).
    pub max_ports: usize,
    /// Relay buffers one actor's ingress CONNECT tunnels may hold at once
    /// (a share of the process's pool); past it they wait
    /// (`--actor-max-buffers`, as egress's share).
    pub max_buffers: usize,
    /// Bytes the router's connections may hold toward one actor, across
    /// all of them: the windows of its request bodies in flight (see
    /// [`RouterBytes`]); past it the router gets 503
    /// ([`DEFAULT_ACTOR_MAX_ROUTER_BYTES`]). CONNECT tunnels are not
    /// counted: an idle one would take a whole window of it; theirs are
    /// bounded by the in-flight cap and the stalled-write bound.
    pub max_router_bytes: u64,
    /// Requests one actor may have in flight on one router HTTP/2
    /// connection, which carries other actors' too: past it the router gets
    /// 503 for that actor, so an actor that answers slowly or never cannot
    /// take every stream of a shared connection
    /// ([`DEFAULT_ACTOR_MAX_ROUTER_STREAMS`]).
    pub max_router_streams: u32,
    /// An h2c connection to an actor with requests in flight is pinged
    /// this often, and closed (its requests failing with 502) if a ping
    /// goes unanswered for `ping_timeout`: an actor that stops reading its
    /// connection cannot hold its streams, and their bodies, until the
    /// idle timeout ([`ACTOR_PING_INTERVAL`], [`ACTOR_PING_TIMEOUT`]; zero:
    /// never).
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
}

/// Defaults of [`PoolSettings::ping_interval`] and `ping_timeout`. An actor
/// is a local process across a veth: a live one answers a ping in
/// microseconds, so the timeout only has to outlast a busy scheduler.
pub const ACTOR_PING_INTERVAL: Duration = Duration::from_secs(20);
pub const ACTOR_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`PoolSettings::response_timeout`]: 60 s, nginx's
/// `proxy_read_timeout`. An actor that never answers would otherwise hold
/// a router stream, and a place in its in-flight budget, for as long as the
/// router waits. Bodies are not bounded by it: a response may stream for
/// as long as it moves.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default of [`PoolSettings::max_in_flight`]: 1,024 requests and tunnels
/// per actor. An actor that answers nothing or never reads a body holds
/// that many of the router's streams at most, each bounded by its window.
pub const DEFAULT_MAX_IN_FLIGHT_PER_ACTOR: usize = 1024;

/// Default of [`PoolSettings::response_body_idle`] and
/// `request_body_idle`: 60 s, nginx's `proxy_read_timeout` and
/// `proxy_send_timeout` (both between two successive reads or writes). A
/// slow body is fine; one that stops holds a router stream, its window and
/// a place in the in-flight budget only this long.
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default of [`PoolSettings::max_router_bytes`]: 16 MiB, what egress
/// allows one actor across its gateway connections
/// (`--actor-max-gateway-bytes`): 64 request bodies at their full 256 KiB
/// window (`PROXY_STREAM_WINDOW`), more with bodies of a known smaller
/// length, and any number without bodies. Without it, 1,024 in flight
/// could hold 256 MiB.
pub const DEFAULT_ACTOR_MAX_ROUTER_BYTES: u64 = 16 * 1024 * 1024;

/// Default of [`PoolSettings::max_router_streams`]: half of the 200 streams
/// atunnel allows a router connection
/// (`PROXY_ROUTER_MAX_CONCURRENT_STREAMS`), so the others on it always
/// have the other half.
pub const DEFAULT_ACTOR_MAX_ROUTER_STREAMS: u32 =
    atunnel_connect::limits::PROXY_ROUTER_MAX_CONCURRENT_STREAMS / 2;

/// Default of [`PoolSettings::max_ports`]: 16 ports per actor, far more
/// than a program serves on, few enough that its pools stay bounded (16
/// times [`DEFAULT_MAX_IDLE_PER_PORT`] idle connections at most).
pub const DEFAULT_MAX_PORTS_PER_ACTOR: usize = 16;

/// Default of [`PoolSettings::max_idle_per_actor`]: idle HTTP/1.1
/// connections kept per actor and port, 128 (a burst's worth reused
/// instead of dialed again); with [`DEFAULT_MAX_PORTS_PER_ACTOR`], at most
/// 2,048 per actor.
pub const DEFAULT_MAX_IDLE_PER_PORT: usize = 128;

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_idle_per_actor: DEFAULT_MAX_IDLE_PER_PORT,
            response_body_idle: DEFAULT_BODY_IDLE_TIMEOUT,
            request_body_idle: DEFAULT_BODY_IDLE_TIMEOUT,
            max_ports: DEFAULT_MAX_PORTS_PER_ACTOR,
            max_buffers: crate::egress::DEFAULT_ACTOR_MAX_BUFFERS,
            idle_timeout: Duration::from_secs(90),
            dial_timeout: ACTOR_DIAL_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT_PER_ACTOR,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            max_router_bytes: DEFAULT_ACTOR_MAX_ROUTER_BYTES,
            max_router_streams: DEFAULT_ACTOR_MAX_ROUTER_STREAMS,
            ping_interval: ACTOR_PING_INTERVAL,
            ping_timeout: ACTOR_PING_TIMEOUT,
        }
    }
}

/// A request or CONNECT admitted to an actor: a place in its in-flight
/// budget (deactivation waits for it) and in its descriptor budget, both
/// given back when dropped.
pub(crate) struct InFlight {
    _token: TaskTrackerToken,
    hold: Arc<ActorHold>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.hold.give(1, REQUEST_HELD_BYTES);
    }
}

/// A request's place among its actor's streams on one router connection
/// (`max_router_streams`), given back when dropped.
pub(crate) struct RouterStream {
    shared: Arc<Shared>,
    client: std::net::SocketAddr,
}

impl Drop for RouterStream {
    fn drop(&mut self) {
        let mut streams = self
            .shared
            .router_streams
            .lock()
            .expect("router streams lock poisoned");
        if let Some(i) = streams.iter().position(|(c, _)| *c == self.client) {
            streams[i].1 -= 1;
            if streams[i].1 == 0 {
                streams.swap_remove(i);
            }
        }
    }
}

/// A request body's place in its actor's `max_router_bytes`, given back
/// when dropped (the body ended or was dropped): while it lives, h2 may
/// hold that many bytes the router sent and the actor has not read.
pub(crate) struct RouterBytes {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for RouterBytes {
    fn drop(&mut self) {
        self.shared
            .router_bytes
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl ActorRoute {
    fn new(
        uid: &str,
        dialer: Box<dyn ActorDialer>,
        upstream: Arc<Upstream>,
        hold: Arc<ActorHold>,
        activation: Arc<ActorActivation>,
    ) -> Self {
        let shared = Arc::new(Shared {
            dialer,
            activation,
            retired: AtomicBool::new(false),
            work: Mutex::new(None),
            router_bytes: AtomicU64::new(0),
            refused_router_bytes: AtomicU64::new(0),
            router_streams: Mutex::default(),
            refused_router_streams: AtomicU64::new(0),
            new_connections: AtomicU64::new(0),
            refused_in_flight: AtomicU64::new(0),
            response_timeouts: AtomicU64::new(0),
            response_body_idle_ends: AtomicU64::new(0),
            request_body_idle_ends: AtomicU64::new(0),
            refused_ports: AtomicU64::new(0),
            connect_stalled_write_ends: AtomicU64::new(0),
            connect_half_closed_ends: AtomicU64::new(0),
            pool: upstream.pool.share(upstream.pools.max_buffers),
            upstream,
        });
        Self {
            uid: uid.to_string(),
            hold,
            http1: OnceLock::new(),
            h2c: Mutex::default(),
            ports: (0..shared.upstream.pools.max_ports.max(1))
                .map(|_| AtomicU32::new(0))
                .collect(),
            shared,
        }
    }

    /// The activation's uid.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// What this side shares with egress.
    pub(crate) fn activation(&self) -> &Arc<ActorActivation> {
        &self.shared.activation
    }

    /// In-flight requests and tunnels; deactivation waits for them.
    fn tasks(&self) -> &TaskTracker {
        self.shared.activation.ingress_tasks()
    }

    /// A place for one more request or tunnel; none (counted) when the
    /// actor already has `max_in_flight` of them or its descriptor budget
    /// is spent: the caller answers 503.
    pub(crate) fn admit(&self) -> Option<InFlight> {
        if self.tasks().len() >= self.pools().max_in_flight {
            self.shared
                .refused_in_flight
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if !self.hold.try_take(1, REQUEST_HELD_BYTES) {
            return None;
        }
        Some(InFlight {
            _token: self.tasks().token(),
            hold: self.hold.clone(),
        })
    }

    /// A place for `bytes` the router may make atunnel hold toward the
    /// actor (a request body's window); none (counted)
    /// past `max_router_bytes`: the caller answers 503. Two relaxed atomic
    /// operations and an `Arc` clone, only for requests with a body.
    pub(crate) fn reserve_router_bytes(&self, bytes: u64) -> Option<RouterBytes> {
        let s = &self.shared;
        let before = s.router_bytes.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.pools().max_router_bytes {
            s.router_bytes.fetch_sub(bytes, Ordering::Relaxed);
            s.refused_router_bytes.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(RouterBytes {
            shared: s.clone(),
            bytes,
        })
    }

    /// A place for one more request of the actor on the router's HTTP/2
    /// connection from `client`; none (counted) when it already has
    /// `max_router_streams` there: the caller answers 503. A lock and a
    /// scan of the connections it has requests on, per request.
    pub(crate) fn admit_router_stream(&self, client: std::net::SocketAddr) -> Option<RouterStream> {
        let s = &self.shared;
        let mut streams = s
            .router_streams
            .lock()
            .expect("router streams lock poisoned");
        match streams.iter_mut().find(|(c, _)| *c == client) {
            Some((_, n)) if *n >= self.pools().max_router_streams => {
                drop(streams);
                s.refused_router_streams.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Some((_, n)) => *n += 1,
            None => streams.push((client, 1)),
        }
        drop(streams);
        Some(RouterStream {
            shared: s.clone(),
            client,
        })
    }

    /// What the actor's work in flight ends on (deactivation, shedding, or
    /// a newer incarnation taking the route).
    pub(crate) fn work_token(&self) -> CancellationToken {
        let mut work = self.shared.work.lock().expect("work token lock poisoned");
        match &*work {
            // Cancelled by a shed of the activation (or its end, which a
            // new child of the cut will see too).
            Some(token) if !token.is_cancelled() => token.clone(),
            _ => {
                // Retiring sets `retired` before it takes this lock to
                // cancel the current token, so one made after that is
                // cancelled here.
                let token = self.shared.activation.cut_token().child_token();
                if self.shared.retired.load(Ordering::Relaxed) {
                    token.cancel();
                }
                *work = Some(token.clone());
                token
            }
        }
    }

    /// Stops this side of the activation: no new work (lookups and dials
    /// refuse it), its work in flight ends, its tracker closes for the
    /// drain. Egress's side is untouched unless the activation is cancelled.
    fn retire(&self) {
        self.shared.retired.store(true, Ordering::Relaxed);
        let mut work = self.shared.work.lock().expect("work token lock poisoned");
        if let Some(old) = work.take() {
            old.cancel();
        }
        drop(work);
        self.tasks().close();
    }

    /// Requests and CONNECT tunnels in flight.
    fn in_flight(&self) -> usize {
        self.tasks().len()
    }

    /// Ends the actor's work in flight (the overload guard shed it): the
    /// activation's cut, so its egress tunnels end too; new work is
    /// admitted as before. How many requests and tunnels were in flight.
    pub(crate) fn shed(&self) -> usize {
        // Counted first: they end on other threads at once.
        let in_flight = self.in_flight();
        self.shared.activation.shed();
        in_flight
    }

    /// How long the actor has to send a response head.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.pools().response_timeout
    }

    /// A request got no response head in time (answered 504).
    pub(crate) fn response_timed_out(&self) {
        self.shared
            .response_timeouts
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The request bodies' idle bounds, response then request (zero: never).
    pub(crate) fn body_idle(&self) -> (Duration, Duration) {
        (
            self.pools().response_body_idle,
            self.pools().request_body_idle,
        )
    }

    /// A request ended at a body's idle bound: its response body (`true`)
    /// or its request body.
    pub(crate) fn body_idle_ended(&self, response: bool) {
        let c = if response {
            &self.shared.response_body_idle_ends
        } else {
            &self.shared.request_body_idle_ends
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// False (counted) when `port` would be one more than `max_ports`
    /// distinct ports: the caller answers 503. Per request: a scan of at
    /// most `max_ports` (16) atomics, one for an actor on one port.
    pub(crate) fn admits_port(&self, port: u16) -> bool {
        let want = u32::from(port) + 1;
        for slot in self.ports.iter() {
            match slot.load(Ordering::Relaxed) {
                v if v == want => return true,
                0 => match slot.compare_exchange(0, want, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return true,
                    Err(v) if v == want => return true,
                    // Taken by another port meanwhile: look further.
                    Err(_) => {}
                },
                _ => {}
            }
        }
        self.shared.refused_ports.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The actor's share of the relay buffer pool, for CONNECT tunnels.
    pub(crate) fn pool(&self) -> &BufferPool {
        &self.shared.pool
    }

    /// The bounds CONNECT tunnels relay within: the activation's, which
    /// egress's tunnels share.
    pub(crate) fn relay_bounds(&self) -> &RelayBounds {
        self.shared.activation.relay()
    }

    /// Counts a CONNECT tunnel that a relay bound ended.
    pub(crate) fn relay_ended(&self, e: &RelayError) {
        let c = match e.op {
            Op::StalledWrite => &self.shared.connect_stalled_write_ends,
            Op::HalfClosedIdle => &self.shared.connect_half_closed_ends,
            _ => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn stats(&self) -> ActorIngressStats {
        let s = &self.shared;
        let share = s.pool.share_stats().unwrap_or_default();
        ActorIngressStats {
            actor: self.uid.clone(),
            in_flight: self.in_flight(),
            refused_in_flight_total: s.refused_in_flight.load(Ordering::Relaxed),
            response_timeouts_total: s.response_timeouts.load(Ordering::Relaxed),
            response_body_idle_ends_total: s.response_body_idle_ends.load(Ordering::Relaxed),
            request_body_idle_ends_total: s.request_body_idle_ends.load(Ordering::Relaxed),
            ports: self
                .ports
                .iter()
                .filter(|p| p.load(Ordering::Relaxed) != 0)
                .count(),
            refused_ports_total: s.refused_ports.load(Ordering::Relaxed),
            connect_stalled_write_ends_total: s.connect_stalled_write_ends.load(Ordering::Relaxed),
            connect_half_closed_ends_total: s.connect_half_closed_ends.load(Ordering::Relaxed),
            connect_buffers_in_use: share.in_use,
            connect_buffers_waited_total: share.waited_total,
            held_descriptors: self.hold.held().descriptors,
            refused_descriptors_total: self.hold.refused_total(),
            router_bytes: s.router_bytes.load(Ordering::Relaxed),
            refused_router_bytes_total: s.refused_router_bytes.load(Ordering::Relaxed),
            refused_router_streams_total: s.refused_router_streams.load(Ordering::Relaxed),
        }
    }

    fn pools(&self) -> &PoolSettings {
        &self.shared.upstream.pools
    }

    /// The HTTP/1.1 connections to the actor.
    pub(crate) fn http1(&self) -> &Arc<Http1Pool> {
        self.http1.get_or_init(|| {
            let connector = ActivationConnector {
                activation: self.shared.clone(),
                port: None,
                h2c: false,
            };
            let pools = self.pools();
            Arc::new(Http1Pool::new(
                Box::new(connector),
                pools.max_idle_per_actor,
                pools.idle_timeout,
            ))
        })
    }

    /// The h2c client to the actor's `port`.
    pub(crate) fn h2c(&self, port: u16) -> Client<ActivationConnector, UpstreamBody> {
        let mut clients = self.h2c.lock().expect("h2c clients lock poisoned");
        let client = clients.entry(port).or_insert_with(|| {
            let connector = ActivationConnector {
                activation: self.shared.clone(),
                port: Some(port),
                h2c: true,
            };
            h2c_client(connector, self.pools())
        });
        client.clone()
    }

    /// Whether ingress stopped routing to it (deactivated or replaced).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.shared.is_retired()
    }

    /// Connections dialed to the actor so far.
    pub fn new_connections(&self) -> u64 {
        self.shared.new_connections.load(Ordering::Relaxed)
    }

    /// Dials the actor directly (CONNECT), bounded and refused once cancelled.
    pub(crate) async fn dial(&self, port: u16) -> io::Result<TcpStream> {
        let mut connector = ActivationConnector {
            activation: self.shared.clone(),
            port: Some(port),
            h2c: false,
        };
        Ok(
            tower_service::Service::call(&mut connector, Uri::from_static("http://actor/"))
                .await?
                .into_tcp(),
        )
    }
}

/// The h2c (gRPC) client to one actor port; HTTP/1.1 goes through
/// `http1_pool`.
fn h2c_client(
    connector: ActivationConnector,
    pools: &PoolSettings,
) -> Client<ActivationConnector, UpstreamBody> {
    let mut builder = Client::builder(TokioExecutor::new());
    if !pools.ping_interval.is_zero() {
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_keep_alive_interval(pools.ping_interval)
            .http2_keep_alive_timeout(pools.ping_timeout)
            .http2_keep_alive_while_idle(false);
    }
    builder
        .pool_idle_timeout(pools.idle_timeout)
        .pool_max_idle_per_host(pools.max_idle_per_actor)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .http2_only(true)
        // What a router that stops reading a gRPC stream leaves queued here.
        // The connection window may be smaller than its streams' windows:
        // the connection is this actor's alone, so stalled streams that
        // exhaust it hold back only this actor's other streams.
        .http2_initial_stream_window_size(PROXY_STREAM_WINDOW)
        .http2_initial_connection_window_size(PROXY_ACTOR_CONNECTION_WINDOW)
        .http2_max_header_list_size(PROXY_MAX_HEADER_LIST)
        .http2_max_concurrent_reset_streams(MAX_CONCURRENT_RESET_STREAMS)
        .http2_max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .http2_max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .http2_max_send_buf_size(PROXY_MAX_SEND_BUF)
        .build(connector)
}

/// Counters for /stats and the bench.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RouteStats {
    pub active_actors: usize,
    pub new_upstream_connections: u64,
    /// Requests and tunnels answered 503 because the process was overloaded.
    pub refused_overload_total: u64,
    /// Each active actor's requests and tunnels in flight and refusals.
    pub actors: Vec<ActorIngressStats>,
    /// HTTP/2 connections ended for a control-frame flood, by endpoint.
    pub h2_floods: IngressH2Floods,
}

/// HTTP/2 connections ended for a control-frame flood
/// (`atunnel_connect::flood`), by endpoint.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct IngressH2Floods {
    /// The router's connections to ingress HTTPS.
    pub https_total: u64,
    /// The router's connections to ingress CONNECT.
    pub connect_total: u64,
    /// h2c connections to actors (gRPC).
    pub actors_total: u64,
}

/// One actor's ingress figures.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ActorIngressStats {
    pub actor: String,
    pub in_flight: usize,
    /// Requests and tunnels answered 503: the actor had `max_in_flight`.
    pub refused_in_flight_total: u64,
    /// Requests answered 504: no response head within the response timeout.
    pub response_timeouts_total: u64,
    /// Requests ended because the actor's response body moved nothing for
    /// `--actor-response-body-timeout`.
    pub response_body_idle_ends_total: u64,
    /// Requests ended because their request body moved nothing for
    /// `--actor-request-body-timeout` (the actor stopped reading it).
    pub request_body_idle_ends_total: u64,
    /// Distinct ports its HTTPS requests went to (each with a pool), and
    /// requests answered 503 for one more past `--actor-max-ingress-ports`.
    pub ports: usize,
    pub refused_ports_total: u64,
    /// CONNECT tunnels reset at `--stalled-write-timeout` and
    /// `--half-closed-timeout`.
    pub connect_stalled_write_ends_total: u64,
    pub connect_half_closed_ends_total: u64,
    /// Relay buffers its CONNECT tunnels hold now (of
    /// `--actor-max-buffers`), and borrows that waited at that cap.
    pub connect_buffers_in_use: usize,
    pub connect_buffers_waited_total: u64,
    /// Descriptors the actor holds across ingress and egress (its
    /// descriptor budget's count; egress_actors[] has the same).
    pub held_descriptors: u64,
    /// Requests, CONNECTs and egress tunnels refused for its descriptor
    /// budget.
    pub refused_descriptors_total: u64,
    /// Bytes its request bodies in flight may make the router's
    /// connections hold (of `--actor-max-router-bytes`), and requests
    /// answered 503 past it.
    pub router_bytes: u64,
    pub refused_router_bytes_total: u64,
    /// Requests answered 503 past `--actor-max-router-streams` on one
    /// router connection.
    pub refused_router_streams_total: u64,
}

/// The registry of active actors, keyed by `<atespace>/<name>`.
pub(crate) struct Routes {
    /// Keyed by `<atespace>/<actor>`, as the router names it in
    /// `ate-target-actor`: a request's lookup takes the header's text as it
    /// is (only valid names are ever keys), with no allocation.
    active: Mutex<HashMap<String, Arc<ActorRoute>>>,
    upstream: Arc<Upstream>,
    /// New connections of activations already gone, so totals never drop.
    retired_connections: AtomicU64,
    /// Refuses new requests and tunnels while the process is overloaded.
    overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
    refused_overload: AtomicU64,
    /// Kept here, with what every router connection shares, rather than in
    /// each connection's future.
    router_ping: RouterPing,
    /// The router's HTTPS connections ended for a control-frame flood.
    router_h2_floods: Arc<FloodCount>,
    /// Every actor's holdings, shared with egress.
    holdings: Arc<Holdings>,
}

/// HTTP/2 PING keepalive on the router's connections (zero interval: off).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RouterPing {
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
}

/// How ingress's HTTP/2 connections are kept: the router's pinged, and
/// theirs and the h2c ones to actors each with a control-frame budget.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Http2Keeping {
    pub router_ping: RouterPing,
    pub floods: atunnel_connect::flood::FloodLimits,
}

impl Routes {
    pub(crate) fn new(
        pools: PoolSettings,
        socket: atunnel_core::sockopt::SocketOptions,
        relay: RelayBounds,
        pool: BufferPool,
        overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
        http2: Http2Keeping,
        holdings: Arc<Holdings>,
    ) -> Self {
        let (router_ping, h2_floods) = (http2.router_ping, http2.floods);
        Self {
            active: Mutex::default(),
            upstream: Arc::new(Upstream {
                pools,
                socket,
                h2c_floods: Arc::new(FloodCount::with_limits(h2_floods)),
                relay,
                pool,
            }),
            retired_connections: AtomicU64::new(0),
            router_h2_floods: Arc::new(FloodCount::with_limits(h2_floods)),
            overload,
            refused_overload: AtomicU64::new(0),
            router_ping,
            holdings,
        }
    }

    /// How the router's HTTP/2 connections are pinged.
    pub(crate) fn router_ping(&self) -> RouterPing {
        self.router_ping
    }

    /// The router's HTTPS connections ended for a control-frame flood.
    pub(crate) fn router_h2_floods(&self) -> &Arc<FloodCount> {
        &self.router_h2_floods
    }

    /// Why new work for `actor` must be refused now (the process is
    /// overloaded, and the actor above its fair share or everyone refused);
    /// counted.
    pub(crate) fn overloaded(
        &self,
        actor: &ActorRoute,
    ) -> Option<atunnel_process::overload::Overloaded> {
        let guard = self.overload.as_ref()?;
        let refused = guard.admit_held(|| actor.hold.weighed()).err()?;
        self.refused_overload.fetch_add(1, Ordering::Relaxed);
        Some(refused)
    }

    /// Routes `<atespace>/<name>` to `dialer`, as ingress's side of
    /// `activation`. The same name with another uid replaces the older
    /// incarnation (its side retired, its pools dropped); the same uid is
    /// refused.
    pub(crate) fn activate(
        &self,
        atespace: &str,
        name: &str,
        uid: &str,
        dialer: Box<dyn ActorDialer>,
        activation: Arc<ActorActivation>,
    ) -> Result<(), RouteError> {
        let key = format!("{atespace}/{name}");
        let route = Arc::new(ActorRoute::new(
            uid,
            dialer,
            self.upstream.clone(),
            self.holdings.actor(uid),
            activation,
        ));
        let old = {
            let mut active = self.active.lock().expect("routes lock poisoned");
            if let Some(existing) = active.get(&key)
                && existing.uid == uid
            {
                return Err(RouteError::AlreadyActive(key, uid.to_string()));
            }
            active.insert(key, route)
        };
        if let Some(old) = old {
            self.retire(&old);
        }
        Ok(())
    }

    /// The relay bounds of an activation ingress makes alone.
    pub(crate) fn relay(&self) -> RelayBounds {
        self.upstream.relay
    }

    fn retire(&self, old: &ActorRoute) {
        old.retire();
        self.retired_connections
            .fetch_add(old.new_connections(), Ordering::Relaxed);
    }

    /// Stops routing to the actor if `uid` matches and retires its side:
    /// new requests and tunnels are refused, those in flight end. The
    /// caller cancels the activation and waits ([`Routes::drain`]).
    pub(crate) fn take(&self, atespace: &str, name: &str, uid: &str) -> Option<Arc<ActorRoute>> {
        let key = format!("{atespace}/{name}");
        let removed = {
            let mut active = self.active.lock().expect("routes lock poisoned");
            match active.get(&key) {
                Some(a) if a.uid == uid => active.remove(&key),
                _ => None,
            }
        }?;
        self.retire(&removed);
        Some(removed)
    }

    /// Cancels `route`'s activation (a no-op if the tunnel did already)
    /// and waits for its requests and tunnels up to `drain`. A timeout is
    /// not reported: what is left was cut and ends on its own.
    pub(crate) async fn drain(route: Arc<ActorRoute>, drain: Duration) {
        route.activation().cancel();
        let _ = tokio::time::timeout(drain, route.tasks().wait()).await;
        // Dropping the last reference closes the idle pooled connections.
    }

    /// Stops routing to the actor if `uid` matches, cancels its activation
    /// and waits for its requests and tunnels up to `drain`. Idempotent.
    pub(crate) async fn deactivate(&self, atespace: &str, name: &str, uid: &str, drain: Duration) {
        if let Some(route) = self.take(atespace, name, uid) {
            Self::drain(route, drain).await;
        }
    }

    /// Stops routing to every actor, cancels their activations and waits
    /// for their requests and tunnels up to `drain` in all (shutdown).
    pub(crate) async fn deactivate_all(&self, drain: Duration) {
        let removed: Vec<_> = self
            .active
            .lock()
            .expect("routes lock poisoned")
            .drain()
            .map(|(_, a)| a)
            .collect();
        for old in &removed {
            self.retire(old);
            old.activation().cancel();
        }
        let all = futures_util::future::join_all(removed.iter().map(|a| a.tasks().wait()));
        let _ = tokio::time::timeout(drain, all).await;
    }

    /// The route of actor `uid`'s activation, if it has one.
    fn of_uid(&self, uid: &str) -> Option<Arc<ActorRoute>> {
        self.active
            .lock()
            .expect("routes lock poisoned")
            .values()
            .find(|a| a.uid == uid)
            .cloned()
    }

    /// Actor `uid`'s requests and CONNECT tunnels in flight, if it is
    /// active and has any.
    pub(crate) fn in_flight(&self, uid: &str) -> Option<usize> {
        Some(self.of_uid(uid)?.in_flight()).filter(|n| *n > 0)
    }

    /// Ends the in-flight requests and CONNECT tunnels of actor `uid`'s
    /// activation (the overload guard shed it), and with them its egress
    /// tunnels: how many requests and tunnels, or `None` if it has no
    /// activation or nothing in flight.
    pub(crate) fn shed(&self, uid: &str) -> Option<usize> {
        Some(self.of_uid(uid)?.shed()).filter(|n| *n > 0)
    }

    /// The actor that `ate-target-actor` names, if the header is valid and
    /// the actor active. Host is never used to route.
    pub(crate) fn target(&self, headers: &HeaderMap) -> Option<Arc<ActorRoute>> {
        let value = headers.get(&TARGET_ACTOR_NAME)?.to_str().ok()?;
        // Looked up as it is, not parsed into two names first (four allocations
        // a request): exactly one '/' keeps an actor whose names hold one from
        // answering for another.
        let value = value.trim();
        if value.bytes().filter(|b| *b == b'/').count() != 1 {
            return None;
        }
        self.lookup_target(value).filter(|a| !a.is_cancelled())
    }

    pub(crate) fn lookup(&self, atespace: &str, name: &str) -> Option<Arc<ActorRoute>> {
        self.lookup_target(&format!("{atespace}/{name}"))
    }

    /// The actor named `<atespace>/<actor>`, if active.
    pub(crate) fn lookup_target(&self, target: &str) -> Option<Arc<ActorRoute>> {
        self.active
            .lock()
            .expect("routes lock poisoned")
            .get(target)
            .cloned()
    }

    pub fn stats(&self) -> RouteStats {
        let active = self.active.lock().expect("routes lock poisoned");
        RouteStats {
            active_actors: active.len(),
            new_upstream_connections: self.retired_connections.load(Ordering::Relaxed)
                + active.values().map(|a| a.new_connections()).sum::<u64>(),
            refused_overload_total: self.refused_overload.load(Ordering::Relaxed),
            h2_floods: IngressH2Floods {
                https_total: self.router_h2_floods.total(),
                // The CONNECT server's, filled in by `Ingress::stats`.
                connect_total: 0,
                actors_total: self.upstream.h2c_floods.total(),
            },
            actors: {
                let mut actors: Vec<_> = active.values().map(|a| a.stats()).collect();
                actors.sort_by(|a, b| a.actor.cmp(&b.actor));
                actors
            },
        }
    }
}
