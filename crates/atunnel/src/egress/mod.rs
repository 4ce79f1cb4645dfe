//! Egress: connections an actor makes, accepted on the listener bound for that
//! actor, carried through a tunnel to the gateway under the actor's identity.
//!
//! The listener is the actor's identity: every sandbox's listener has the
//! same address, inside its own network namespace, so which listener accepted
//! a connection says whose it is. A connection is admitted only while its
//! actor is activated and holds a valid certificate; otherwise it is closed
//! with no bytes. Each admitted connection is one task, from accept to close.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_core::endpoint::ReadReady;
use atunnel_core::original_dst::original_dst_from;
use atunnel_core::relay::{Op, RelayError, relay_within};
use atunnel_core::sockopt::{ListenerOptions, SocketOptions};
use atunnel_core::{BufferPool, Listener, ListenerCounters, RefusalPace};
use atunnel_identity::cert_source::CertificateSource;
use atunnel_identity::identity::ActorRef;
use atunnel_process::overload::{Held, OverloadGuard};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use atunnel_connect::{GatewayClient, GatewayClientConfig, GatewayTunnel};
use atunnel_identity::clock::Clock;
use atunnel_identity::credential::{ActorCredential, CredentialError, renew_until_cancelled};

use crate::activation::ActorActivation;
use crate::holdings::{ActorHold, Holdings, TUNNEL_HELD_BYTES};

mod budget;
mod config;
mod stats;

pub use budget::*;
pub use config::EgressConfig;
pub use stats::{ActorEgressStats, EgressStats, OPEN_LATENCY_BOUNDS_US, OpenLatency};

/// How long deactivation waits for an actor's tunnels to finish.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("preparing egress for actor {actor}: {source}")]
    Credential {
        actor: String,
        #[source]
        source: CredentialError,
    },
    #[error("building the gateway client for actor {actor}: {message}")]
    Client { actor: String, message: String },
    #[error("actor uid {0} is already activated for egress")]
    AlreadyActive(String),
    #[error(
        "actor uid {uid}: {open} tasks (tunnels, certificate renewal) still running after {after:?} of draining"
    )]
    DrainTimeout {
        uid: String,
        open: usize,
        after: Duration,
    },
}

/// Where an accepted connection is headed.
#[derive(Clone, Copy, Debug)]
pub enum Destination {
    /// The connection was redirected: ask conntrack (`SO_ORIGINAL_DST`).
    Original,
    /// Every connection goes to this address (a listener that is not behind
    /// a redirect, such as a local port-forward in a demo).
    Fixed(SocketAddr),
}

/// Everything an actor needs for egress, made before its workload starts:
/// a fresh key, a minted certificate and a gateway client. In memory only.
pub struct ActorEgress {
    credential: Arc<ActorCredential>,
    client: Arc<GatewayClient>,
    source: Arc<dyn CertificateSource>,
}

impl ActorEgress {
    /// Mints the actor's first certificate; a failure fails closed.
    pub async fn prepare(
        actor: ActorRef,
        gateway: GatewayClientConfig,
        source: Arc<dyn CertificateSource>,
        clock: Clock,
    ) -> Result<Self, EgressError> {
        let name = actor.to_string();
        let credential = ActorCredential::mint(actor, source.as_ref(), clock)
            .await
            .map_err(|source| EgressError::Credential {
                actor: name.clone(),
                source,
            })?;
        let credential = Arc::new(credential);
        let client =
            GatewayClient::new(gateway, credential.clone()).map_err(|e| EgressError::Client {
                actor: name,
                message: e.to_string(),
            })?;
        Ok(Self {
            credential,
            client: Arc::new(client),
            source,
        })
    }

    pub fn credential(&self) -> &Arc<ActorCredential> {
        &self.credential
    }

    pub fn client(&self) -> &Arc<GatewayClient> {
        &self.client
    }
}

/// Egress's side of one activation of one actor: its credential and
/// gateway client, beside what it shares with ingress (cancel, cut, relay
/// bounds, its tasks).
pub(crate) struct Activation {
    egress: ActorEgress,
    shared: Arc<ActorActivation>,
}

impl Activation {
    fn admits(&self) -> bool {
        !self.shared.is_cancelled() && self.egress.credential.is_valid()
    }

    /// What this side shares with ingress.
    pub(crate) fn shared(&self) -> &Arc<ActorActivation> {
        &self.shared
    }
}

/// Why a connection was refused before it became a tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Tunnels,
    Opening,
    Descriptors,
    Overload,
}

/// One actor's use of its budget, and its refusals.
#[derive(Default)]
struct Usage {
    tunnels: AtomicUsize,
    opening: AtomicUsize,
    refused_tunnels: AtomicU64,
    refused_opening: AtomicU64,
    refused_overload: AtomicU64,
    shed: AtomicU64,
}

/// A place in an actor's tunnel budget; given back when dropped.
struct Slot {
    binding: Arc<Binding>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.binding.usage.tunnels.fetch_sub(1, Ordering::Relaxed);
        self.binding.hold.give(1, TUNNEL_HELD_BYTES);
    }
}

/// A place in an actor's opening budget, held by the open alone (so that
/// an open tunnel keeps no flag for it); given back when dropped.
struct Opening {
    binding: Arc<Binding>,
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.binding.usage.opening.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A listener's actor and its current activation, if any.
struct Binding {
    activation: Mutex<Option<Arc<Activation>>>,
    usage: Usage,
    /// The actor's share of the relay buffers.
    pool: BufferPool,
    /// Spent by each connection its listener refuses.
    refusals: Arc<RefusalPace>,
    /// Warnings about this actor's tunnels, rate limited.
    warnings: crate::log_limit::LogLimit,
    /// What the actor holds across egress and ingress: each tunnel takes a
    /// descriptor of its budget.
    hold: Arc<ActorHold>,
}

impl Binding {
    fn new(pool: BufferPool, refusals: RefusalPace, hold: Arc<ActorHold>) -> Self {
        Self {
            activation: Mutex::new(None),
            usage: Usage::default(),
            pool,
            refusals: Arc::new(refusals),
            warnings: Default::default(),
            hold,
        }
    }

    /// What the overload guard weighs against its fair share.
    fn held(&self) -> Held {
        self.hold.weighed()
    }

    /// Takes a place in the budget, or says which bound refuses it.
    fn admit(self: &Arc<Self>, budget: &ActorBudget) -> Result<(Slot, Opening), Refusal> {
        let u = &self.usage;
        if u.tunnels.fetch_add(1, Ordering::Relaxed) >= budget.max_tunnels {
            u.tunnels.fetch_sub(1, Ordering::Relaxed);
            u.refused_tunnels.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Tunnels);
        }
        if u.opening.fetch_add(1, Ordering::Relaxed) >= budget.max_opening {
            u.opening.fetch_sub(1, Ordering::Relaxed);
            u.tunnels.fetch_sub(1, Ordering::Relaxed);
            u.refused_opening.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Opening);
        }
        // The tunnel's actor socket; its gateway stream shares a pooled
        // connection.
        if !self.hold.try_take(1, TUNNEL_HELD_BYTES) {
            u.opening.fetch_sub(1, Ordering::Relaxed);
            u.tunnels.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Descriptors);
        }
        Ok((
            Slot {
                binding: self.clone(),
            },
            Opening {
                binding: self.clone(),
            },
        ))
    }

    fn current(&self) -> Option<Arc<Activation>> {
        self.activation
            .lock()
            .expect("binding lock poisoned")
            .clone()
    }
}

#[derive(Default)]
struct Counters {
    open: AtomicU64,
    total: AtomicU64,
    /// Of `total`, those to an IPv6 destination (IPv4 is the difference).
    total_ipv6: AtomicU64,
    rejected: AtomicU64,
    open_failed: AtomicU64,
    stalled_write: AtomicU64,
    half_closed: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    /// Per bucket (not cumulative), the last for opens past every bound.
    open_buckets: [AtomicU64; 15],
    open_sum_us: AtomicU64,
}

impl Counters {
    fn opened_after(&self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let at = OPEN_LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(OPEN_LATENCY_BOUNDS_US.len());
        self.open_buckets[at].fetch_add(1, Ordering::Relaxed);
        self.open_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    fn relayed(&self, stats: atunnel_core::relay::RelayStats) {
        // The relay runs actor (a) to gateway (b).
        self.bytes_up.fetch_add(stats.a_to_b, Ordering::Relaxed);
        self.bytes_down.fetch_add(stats.b_to_a, Ordering::Relaxed);
    }

    fn open_latency(&self) -> OpenLatency {
        let mut h = OpenLatency::default();
        let mut seen = 0;
        for (i, b) in self.open_buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if let Some(slot) = h.at_most_us.get_mut(i) {
                *slot = seen;
            }
        }
        h.count = seen;
        h.sum_us = self.open_sum_us.load(Ordering::Relaxed);
        h
    }

    /// Counts a tunnel that a relay bound ended.
    fn count_end(&self, e: &RelayError) {
        let counter = match e.op {
            Op::StalledWrite => &self.stalled_write,
            Op::HalfClosedIdle => &self.half_closed,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One tunnel's hold on the egress: counted as open, waited for by its
/// activation's deactivation, and a place in its actor's tunnel budget,
/// until dropped. One field of the tunnel's task instead of four.
struct OpenTunnel {
    egress: Arc<Egress>,
    _drained: TaskTrackerToken,
    slot: Slot,
}

impl OpenTunnel {
    fn new(egress: Arc<Egress>, drained: TaskTrackerToken, slot: Slot, dest: SocketAddr) -> Self {
        egress.counters.open.fetch_add(1, Ordering::Relaxed);
        egress.counters.total.fetch_add(1, Ordering::Relaxed);
        if is_ipv6(dest) {
            egress.counters.total_ipv6.fetch_add(1, Ordering::Relaxed);
        }
        Self {
            egress,
            _drained: drained,
            slot,
        }
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.egress.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The egress side of one atunnel: every actor's listener and activation.
pub struct Egress {
    cfg: EgressConfig,
    pool: BufferPool,
    bindings: Mutex<HashMap<String, Arc<Binding>>>,
    listeners: TaskTracker,
    /// Stops the listeners [`Egress::serve_listener`] started, at shutdown.
    stop: CancellationToken,
    counters: Counters,
    /// Every egress listener's figures, together.
    listener_counters: ListenerCounters,
    /// Refuses new tunnels while the process is overloaded.
    overload: Option<Arc<OverloadGuard>>,
    /// Every actor's holdings, shared with ingress.
    holdings: Arc<Holdings>,
}

impl Egress {
    pub fn new(cfg: EgressConfig, pool: BufferPool) -> Arc<Self> {
        Self::with_overload(cfg, pool, None)
    }

    /// As [`Egress::new`], refusing new tunnels while `overload` does.
    pub fn with_overload(
        cfg: EgressConfig,
        pool: BufferPool,
        overload: Option<Arc<OverloadGuard>>,
    ) -> Arc<Self> {
        Self::with_holdings(cfg, pool, overload, Holdings::unbounded())
    }

    /// As [`Egress::with_overload`], counting each actor's tunnels in
    /// `holdings` (shared with ingress) against its descriptor budget.
    pub fn with_holdings(
        cfg: EgressConfig,
        pool: BufferPool,
        overload: Option<Arc<OverloadGuard>>,
        holdings: Arc<Holdings>,
    ) -> Arc<Self> {
        Arc::new(Self {
            overload,
            holdings,
            cfg,
            pool,
            bindings: Mutex::new(HashMap::new()),
            listeners: TaskTracker::new(),
            stop: CancellationToken::new(),
            counters: Counters::default(),
            listener_counters: ListenerCounters::default(),
        })
    }

    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    pub fn stats(&self) -> EgressStats {
        let c = &self.counters;
        EgressStats {
            tunnels_open: c.open.load(Ordering::Relaxed),
            tunnels_total: c.total.load(Ordering::Relaxed),
            tunnels_ipv4_total: c
                .total
                .load(Ordering::Relaxed)
                .saturating_sub(c.total_ipv6.load(Ordering::Relaxed)),
            tunnels_ipv6_total: c.total_ipv6.load(Ordering::Relaxed),
            rejected_total: c.rejected.load(Ordering::Relaxed),
            open_failed_total: c.open_failed.load(Ordering::Relaxed),
            stalled_write_ends_total: c.stalled_write.load(Ordering::Relaxed),
            half_closed_ends_total: c.half_closed.load(Ordering::Relaxed),
            bytes_up_total: c.bytes_up.load(Ordering::Relaxed),
            bytes_down_total: c.bytes_down.load(Ordering::Relaxed),
            open_latency: c.open_latency(),
            tunnel_future_bytes: self.listener_counters.connection_future_bytes(),
        }
    }

    fn binding(&self, uid: &str) -> Arc<Binding> {
        self.bindings
            .lock()
            .expect("bindings lock poisoned")
            .entry(uid.to_string())
            .or_insert_with(|| {
                Arc::new(Binding::new(
                    self.pool.share(self.cfg.budget.max_buffers),
                    RefusalPace::new(self.cfg.budget.max_refusals_per_second),
                    self.holdings.actor(uid),
                ))
            })
            .clone()
    }

    /// Each actor's use of its budget and its refusals, by actor.
    pub fn actor_stats(&self) -> Vec<ActorEgressStats> {
        let bindings = self.bindings.lock().expect("bindings lock poisoned");
        let mut all: Vec<_> = bindings
            .iter()
            .map(|(uid, b)| binding_stats(uid, b))
            .collect();
        all.sort_by(|a, b| a.actor.cmp(&b.actor));
        all
    }

    /// Actor `uid`'s figures of [`actor_stats`](Self::actor_stats), if it
    /// has a binding: one actor's, so a control call about one actor costs
    /// the same with 10 actors as with 1,000.
    pub fn actor_stat(&self, uid: &str) -> Option<ActorEgressStats> {
        let bindings = self.bindings.lock().expect("bindings lock poisoned");
        bindings.get(uid).map(|b| binding_stats(uid, b))
    }

    /// Resets the tunnels of actor `uid` (the overload guard's pick past
    /// its hard threshold: the actor holding the most): every tunnel it has
    /// now, so that what the process holds for it goes at once; its new
    /// tunnels are admitted again, within its budget, once the guard lets
    /// work in. `None`: it has no tunnel.
    pub fn shed(&self, uid: &str) -> Option<usize> {
        let bindings = self.bindings.lock().expect("bindings lock poisoned");
        let binding = bindings.get(uid)?;
        let tunnels = binding.usage.tunnels.load(Ordering::Relaxed);
        if tunnels == 0 {
            return None;
        }
        binding
            .usage
            .shed
            .fetch_add(tunnels as u64, Ordering::Relaxed);
        if let Some(activation) = binding.current() {
            // The activation's cut: its ingress work in flight ends too.
            activation.shared.shed();
        }
        Some(tunnels)
    }

    /// Resets the tunnels of the actor with the most tunnels (see
    /// [`shed`](Self::shed)).
    pub fn shed_largest(&self) -> Option<(String, usize)> {
        let uid = {
            let bindings = self.bindings.lock().expect("bindings lock poisoned");
            let (uid, _) = bindings
                .iter()
                .max_by_key(|(_, b)| b.usage.tunnels.load(Ordering::Relaxed))?;
            uid.clone()
        };
        let tunnels = self.shed(&uid)?;
        Some((uid, tunnels))
    }

    /// Serves `listener` as actor `uid`'s egress listener until `cancel`.
    /// The caller binds it (inside the actor's sandbox); from here on, what
    /// it accepts is that actor's.
    pub fn serve_listener(
        self: &Arc<Self>,
        uid: &str,
        listener: TcpListener,
        dest: Destination,
        cancel: CancellationToken,
    ) {
        // The listener stops at the caller's cancel or at shutdown, and in
        // either case waits for its tunnels (shutdown has cancelled them).
        let stopping = self.stop.child_token();
        let (caller, listener_stop) = (cancel, stopping.clone());
        self.listeners.spawn(async move {
            tokio::select! {
                _ = caller.cancelled() => listener_stop.cancel(),
                _ = listener_stop.cancelled() => {}
            }
        });
        self.listeners
            .spawn(self.listener_task(uid, listener, dest, stopping));
    }

    /// The accept loop [`Egress::serve_listener`] spawns, for a caller that
    /// tracks it itself (a sandbox waits for its own listener on close).
    pub(crate) fn listener_task(
        self: &Arc<Self>,
        uid: &str,
        listener: TcpListener,
        dest: Destination,
        cancel: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let binding = self.binding(uid);
        self.clone().accept_loop(binding, listener, dest, cancel)
    }

    /// Accepts the actor's connections until `cancel`; each becomes a
    /// tunnel of the current activation (which deactivation waits for and
    /// cancels), or is closed with no bytes when there is none. Stopping
    /// waits for the listener's tunnels, so its owner deactivates first.
    ///
    /// Not an `async fn`, which would keep a second copy of its arguments
    /// in a future every sandbox holds for its life (rust-lang/rust#62958).
    fn accept_loop(
        self: Arc<Self>,
        binding: Arc<Binding>,
        listener: TcpListener,
        dest: Destination,
        cancel: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        // Set on the listener, so that the actors' sockets inherit them
        // rather than take four setsockopt calls each.
        let mut options = ListenerOptions::new(self.cfg.sandbox_socket, &listener);
        let mut listener =
            Listener::new(listener, "egress").with_refusal_pace(binding.refusals.clone());
        async move {
            listener
                .serve(&cancel, &self.listener_counters, |tcp, peer| {
                    let Some(activation) = binding.current().filter(|a| a.admits()) else {
                        // Closed with no bytes: inactive, deactivated or expired.
                        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                        binding.refusals.refused();
                        return None;
                    };
                    let admitted = match &self.overload {
                        Some(guard) if guard.admit_held(|| binding.held()).is_err() => {
                            Err(Refusal::Overload)
                        }
                        _ => binding.admit(&self.cfg.budget),
                    };
                    let (slot, opening) = match admitted {
                        Ok(admitted) => admitted,
                        Err(refusal) => {
                            if refusal == Refusal::Overload {
                                binding
                                    .usage
                                    .refused_overload
                                    .fetch_add(1, Ordering::Relaxed);
                            }
                            // Reset, no bytes: the actor sees ECONNRESET at once.
                            tcp.reset_on_close();
                            binding.refusals.refused();
                            return None;
                        }
                    };
                    // Taken now, not when the task first runs: a deactivation
                    // that begins in between must wait for this tunnel too.
                    let drained = activation.shared.egress_tasks().token();
                    let cut = activation.shared.cut_token();
                    // Here rather than in the task, which would hold both the
                    // `Destination` and the address for the tunnel's life.
                    let to = match dest {
                        Destination::Fixed(addr) => addr,
                        Destination::Original => match original_dst_from(&tcp, peer) {
                            Ok(addr) => addr,
                            Err(e) => {
                                tracing::warn!(error = %e, "egress connection has no original destination");
                                return None;
                            }
                        },
                    };
                    let options = options.for_accepted(&tcp);
                    Some(self.clone().tunnel(
                        tcp,
                        activation,
                        to,
                        drained,
                        (slot, opening, options),
                        cut,
                    ))
                })
                .await
        }
    }

    /// One tunnel's task, held for the connection's life by every idle
    /// connection. Not an `async fn`, which would keep a second copy of
    /// its arguments in that future (rust-lang/rust#62958); what only the
    /// open needs is moved into its boxed future, and the sockets it hands
    /// back are moved into the relay, so that none of them is kept twice.
    #[allow(clippy::manual_async_fn)]
    fn tunnel(
        self: Arc<Self>,
        actor: TcpStream,
        activation: Arc<Activation>,
        dest: SocketAddr,
        drained: TaskTrackerToken,
        (slot, opening, options): (Slot, Opening, Option<SocketOptions>),
        cut: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Counted from acceptance: a deactivation that begins before the
        // task first runs waits for it too.
        let open = OpenTunnel::new(self, drained, slot, dest);
        // Boxed so the destination, the TLS/HTTP/2 handshake state and the
        // clock of the open are heap only while opening, not part of every
        // idle tunnel's task.
        let opened = Box::pin(open.egress.clone().open_tunnel(
            actor,
            activation.clone(),
            dest,
            (opening, options),
            cut,
        ));
        async move {
            let Some((mut actor, mut tunnel, cut)) = opened.await else {
                return;
            };
            // The comparisons' states are boxed so that the default tunnel's task
            // (held by every idle connection) does not keep room for them.
            #[cfg(feature = "comparison")]
            if !open.egress.cfg.comparison.is_lean() {
                let relay = crate::comparison::relay(
                    open.egress.cfg.comparison,
                    actor,
                    tunnel,
                    &open.egress.pool,
                );
                relay_until_cancelled(Box::pin(relay), cut).await;
                return;
            }
            let pool = &open.slot.binding.pool;
            // From here on bytes may be in flight, so a cut must reach the actor
            // as a reset even when nothing of ours runs to say so: with SO_LINGER
            // 0 the kernel's close when this process dies (SIGKILL, OOM kill)
            // resets the connection, where it would otherwise send a FIN behind
            // the lost bytes. Only a clean end turns it off again.
            actor.reset_on_close();
            // The activation's bounds, which its ingress CONNECT tunnels share.
            let relay = relay_within(&mut actor, &mut tunnel, pool, activation.shared.relay());
            let ended = relay_until_cancelled(relay, cut).await;
            // The connection by the actor's address and port: its destination
            // is logged when it opens, and kept no longer.
            let actor_name = activation.egress.credential.actor();
            match ended {
                Ended::Clean(stats) => {
                    clean_close(&actor);
                    open.egress.counters.relayed(stats);
                    tracing::debug!(actor = %actor_name, from = ?actor.peer_addr().ok(), up = stats.a_to_b,
                        down = stats.b_to_a, "egress tunnel closed");
                }
                Ended::Failed(e) => {
                    open.egress.counters.count_end(&e);
                    open.egress.counters.relayed(e.stats);
                    tracing::debug!(actor = %actor_name, from = ?actor.peer_addr().ok(), up = e.stats.a_to_b,
                        down = e.stats.b_to_a, error = %e, "egress tunnel reset");
                }
                Ended::Cancelled => {
                    tracing::debug!(actor = %actor_name, from = ?actor.peer_addr().ok(),
                        "egress tunnel cut (deactivated or shed)")
                }
            }
            // Uncounted before the actor's socket closes (the locals are
            // dropped before what the task captured): whoever sees the close
            // sees the tunnel gone from the counts and its deactivation.
            drop(open);
        }
    }

    /// Opens `actor`'s tunnel to `dest`: the socket options it did not
    /// inherit from its listener (`options`), then the CONNECT through the
    /// activation's gateway client, unless `cut` comes first (a connection
    /// accepted as deactivation begins sends no CONNECT). Hands back the
    /// actor's socket, the tunnel and the cut.
    async fn open_tunnel(
        self: Arc<Self>,
        actor: TcpStream,
        activation: Arc<Activation>,
        dest: SocketAddr,
        (opening, options): (Opening, Option<SocketOptions>),
        cut: CancellationToken,
    ) -> Option<(TcpStream, GatewayTunnel, CancellationToken)> {
        if let Some(Err(e)) = options.map(|o| o.apply(&actor)) {
            tracing::warn!(error = %e, "egress socket options");
            return None;
        }
        let started = std::time::Instant::now();
        let opened = tokio::select! {
            biased;
            _ = cut.cancelled() => return None,
            r = activation.egress.client.open(dest) => r,
        };
        let actor_name = activation.egress.credential.actor();
        match opened {
            Ok(t) => {
                let took = started.elapsed();
                self.counters.opened_after(took);
                tracing::debug!(actor = %actor_name, from = ?actor.peer_addr().ok(), %dest, ?took,
                    "egress tunnel open");
                Some((actor, t, cut))
            }
            Err(e) => {
                self.counters.open_failed.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = opening.binding.warnings.admit() {
                    tracing::warn!(actor = %actor_name, %dest, error = %e, suppressed,
                        "atunnel failed to open egress tunnel");
                }
                None
            }
        }
    }

    /// Arms egress for actor `uid`: its listener's connections are admitted
    /// from now on, and its certificate is renewed until deactivation. The
    /// activation is egress's own, with `EgressConfig::relay`.
    pub fn activate(&self, uid: &str, egress: ActorEgress) -> Result<(), EgressError> {
        self.activate_with(uid, egress, Arc::new(ActorActivation::new(self.cfg.relay)))
    }

    /// [`Egress::activate`] as one side of `activation`, which ingress may
    /// share: its cancel refuses this side's new tunnels and cuts its open
    /// ones.
    pub(crate) fn activate_with(
        &self,
        uid: &str,
        egress: ActorEgress,
        activation: Arc<ActorActivation>,
    ) -> Result<(), EgressError> {
        let binding = self.binding(uid);
        let mut slot = binding.activation.lock().expect("binding lock poisoned");
        if slot.is_some() {
            return Err(EgressError::AlreadyActive(uid.to_string()));
        }
        activation.egress_tasks().spawn(renew_until_cancelled(
            egress.credential.clone(),
            egress.source.clone(),
            activation.cancel_token(),
        ));
        *slot = Some(Arc::new(Activation {
            egress,
            shared: activation,
        }));
        Ok(())
    }

    /// Refuses new tunnels for `uid`, closes its open ones, and waits (up to
    /// the drain timeout) for them to finish, then as long again at most for
    /// its gateway connections to close. Other actors are untouched; a
    /// second call is a no-op.
    pub async fn deactivate(&self, uid: &str) -> Result<(), EgressError> {
        self.deactivate_within(uid, self.cfg.drain_timeout).await
    }

    /// [`Egress::deactivate`], waiting at most `after` for the tunnels and
    /// again for the gateway connections.
    async fn deactivate_within(&self, uid: &str, after: Duration) -> Result<(), EgressError> {
        match self.take(uid) {
            Some(activation) => self.drain(uid, activation, after).await,
            None => Ok(()),
        }
    }

    /// Takes actor `uid`'s activation out of its binding: its listener's
    /// connections are refused from now on. `None`: it has none.
    pub(crate) fn take(&self, uid: &str) -> Option<Arc<Activation>> {
        let binding = self
            .bindings
            .lock()
            .expect("bindings lock poisoned")
            .get(uid)
            .cloned()?;
        binding
            .activation
            .lock()
            .expect("binding lock poisoned")
            .take()
    }

    /// Cancels `activation` (a no-op if the tunnel did already), then
    /// waits at most `after` for its tunnels and renewal, and again for its
    /// gateway connections.
    pub(crate) async fn drain(
        &self,
        uid: &str,
        activation: Arc<Activation>,
        after: Duration,
    ) -> Result<(), EgressError> {
        activation.shared.cancel();
        let tasks = activation.shared.egress_tasks();
        tasks.close();
        let drained = tokio::time::timeout(after, tasks.wait()).await.is_ok();
        // The actor's gateway connections end with their last stream, so a
        // tunnel that outlived the drain would hold this wait too: bounded.
        let closed = tokio::time::timeout(after, activation.egress.client.close())
            .await
            .is_ok();
        if drained && closed {
            Ok(())
        } else {
            Err(EgressError::DrainTimeout {
                uid: uid.to_string(),
                open: tasks.len(),
                after,
            })
        }
    }

    /// Forgets actor `uid`'s binding (its listener was closed by the caller's
    /// cancel token). Deactivates first if needed.
    pub(crate) async fn unbind(&self, uid: &str, within: Duration) -> Result<(), EgressError> {
        let result = self.deactivate_within(uid, within).await;
        self.forget(uid);
        result
    }

    /// Forgets actor `uid`'s binding, deactivated by the caller.
    pub(crate) fn forget(&self, uid: &str) {
        self.bindings
            .lock()
            .expect("bindings lock poisoned")
            .remove(uid);
    }

    /// Stops every listener and actor.
    pub async fn shutdown(&self) {
        let uids: Vec<String> = self
            .bindings
            .lock()
            .expect("bindings lock poisoned")
            .keys()
            .cloned()
            .collect();
        for uid in uids {
            let _ = self.unbind(&uid, crate::SHUTDOWN_CLOSE_GRACE).await;
        }
        self.stop.cancel();
        self.wait_served_listeners().await;
    }

    /// Waits for the listeners [`Egress::serve_listener`] started (each
    /// stops at its caller's cancel or at shutdown) and for their tunnels.
    pub(crate) async fn wait_served_listeners(&self) {
        self.listeners.close();
        self.listeners.wait().await;
    }
}

/// How a tunnel's relay ended.
pub(crate) enum Ended<T, E> {
    /// Both directions ended: every byte and both ends went through.
    Clean(T),
    /// The relay failed (it has reset both sides).
    Failed(E),
    /// The activation was cancelled or the actor shed (the relay, dropped,
    /// has reset both sides).
    Cancelled,
}

/// Runs `relay` until both directions end or `cut` (the activation's: see
/// `ActorActivation::cut`) is cancelled, which drops the relay: it resets the
/// tunnel and the actor's socket, so a cut stream does not look complete to
/// either peer. A named future owning both rather than a `select!` in an
/// `async` block, which kept its arguments twice and the macro's state
/// beside them (56 B more per tunnel); the caller logs how it ended.
pub(crate) fn relay_until_cancelled<R>(relay: R, cut: CancellationToken) -> UntilCut<R> {
    UntilCut {
        cut: cut.cancelled_owned(),
        relay,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`relay_until_cancelled`], held by every idle tunnel.
    pub(crate) struct UntilCut<R> {
        #[pin]
        cut: WaitForCancellationFutureOwned,
        relay: R,
    }
}

impl<T, E, R: Future<Output = Result<T, E>> + Unpin> Future for UntilCut<R> {
    type Output = Ended<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The cut first: a relay that could still move bytes is cut all
        // the same.
        if this.cut.poll(cx).is_ready() {
            return Poll::Ready(Ended::Cancelled);
        }
        Pin::new(this.relay).poll(cx).map(|r| match r {
            Ok(out) => Ended::Clean(out),
            Err(e) => Ended::Failed(e),
        })
    }
}

/// Whether the gateway dials `dest` over IPv6 (a v4-mapped address, which
/// no redirect gives but a fixed destination could, is IPv4).
fn is_ipv6(dest: SocketAddr) -> bool {
    match dest {
        SocketAddr::V4(_) => false,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_none(),
    }
}

/// After a clean end: SO_LINGER back to the default, so that closing lets
/// the bytes and the FIN still queued for the actor drain instead of
/// resetting over them. `None` is the kernel's default, a close that does not
/// block (tokio deprecates only a lingering close).
fn clean_close(actor: &TcpStream) {
    #[allow(deprecated)]
    if let Err(e) = actor.set_linger(None) {
        // Only a bad descriptor fails, which an open stream's is not.
        tracing::trace!(error = %e, "clearing SO_LINGER");
    }
}

/// One binding's figures, as /stats and the control API report them.
fn binding_stats(uid: &str, b: &Binding) -> ActorEgressStats {
    let u = &b.usage;
    let share = b.pool.share_stats().unwrap_or_default();
    let client = b
        .activation
        .lock()
        .expect("activation lock poisoned")
        .as_ref()
        .map(|a| a.egress.client.stats())
        .unwrap_or_default();
    ActorEgressStats {
        actor: uid.to_string(),
        tunnels: u.tunnels.load(Ordering::Relaxed),
        opening: u.opening.load(Ordering::Relaxed),
        buffers: share.in_use,
        refused_tunnels_total: u.refused_tunnels.load(Ordering::Relaxed),
        refused_opening_total: u.refused_opening.load(Ordering::Relaxed),
        refused_overload_total: u.refused_overload.load(Ordering::Relaxed),
        shed_total: u.shed.load(Ordering::Relaxed),
        buffer_waits_total: share.waited_total,
        refusal_pauses_total: b.refusals.paused_total(),
        gateway_connections: client.h2_connections,
        gateway_idle_closed_total: client.h2_idle_closed_total,
        gateway_h2_floods_total: client.h2_floods_total,
        held_descriptors: b.hold.held().descriptors,
        held_bytes: b.hold.held().bytes,
        refused_descriptors_total: b.hold.refused_total(),
    }
}
