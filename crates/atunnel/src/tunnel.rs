//! The calls a worker makes, in the order it makes them:
//!
//! 1. [`Tunnel::start`]: start the shared machinery (ingress listeners come
//!    with ingress).
//! 2. [`Tunnel::prepare_egress`]: a fresh key and a minted certificate,
//!    before the workload starts; a failure fails closed.
//! 3. [`Tunnel::serve_sandbox`]: build the sandbox network, bind the egress
//!    listener and the DNS relay inside it. Egress is served last: nothing
//!    may fail between binding it and serving it.
//! 4. (the worker starts the actor's program)
//! 5. [`Tunnel::activate`]: egress is armed.
//! 6. [`Tunnel::deactivate`]: idempotent; refuses new work, closes the
//!    actor's tunnels, waits (bounded). Other actors keep theirs.
//! 7. [`Tunnel::close_sandbox`]: removes the sandbox and everything bound in it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel_connect::GatewayClientConfig;
use atunnel_core::BufferPool;
use atunnel_dns::{DnsRelay, RelayConfig};
use atunnel_process::overload::{OverloadConfig, OverloadGuard};

use crate::dns_relays::{DnsRelays, SandboxDnsStats, dns_stats};
use atunnel_identity::cert_source::CertificateSource;
use atunnel_identity::clock::Clock;
use atunnel_identity::identity::ActorRef;
use atunnel_sandbox::sandbox::{DEFAULT_EGRESS_PORT, DNS_PORT, GATEWAY_ADDR};
use atunnel_sandbox::{NsExecutor, SandboxError, SandboxNetwork};
use rustls::pki_types::ServerName;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::activation::ActorActivation;
use crate::egress::{ActorEgress, Destination, Egress, EgressConfig, EgressError};
use crate::ingress::{ActorDialer, SandboxDialer};
use crate::ingress::{Ingress, IngressConfig, IngressError};
use crate::leftovers::Leftovers;
use crate::stats::StatsSource;
use futures_util::StreamExt;

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("starting the namespace executor: {0}")]
    Executor(#[source] atunnel_sandbox::NetnsError),
    #[error("the overload guard: {0}")]
    Overload(#[source] atunnel_process::overload::OverloadError),
    #[error("invalid gateway address {address:?}: {reason}")]
    Gateway { address: String, reason: String },
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error("sandbox for actor {actor}: {source}")]
    Sandbox {
        actor: String,
        #[source]
        source: SandboxError,
    },
    #[error("DNS relay: {0}")]
    Dns(#[source] atunnel_dns::DnsError),
    #[error("actor {0} has no sandbox to route to")]
    NoSandbox(String),
    #[error(transparent)]
    Ingress(#[from] IngressError),
    #[error("binding ingress listeners: {0}")]
    Listen(#[source] std::io::Error),
    #[error("actor {0} already has a sandbox")]
    SandboxExists(String),
    #[error(transparent)]
    Leftovers(#[from] crate::leftovers::LeftoverError),
}

/// Sandboxes closed at once at shutdown: enough that waits overlap, few
/// enough that the netlink and namespace work stays a short queue.
const SHUTDOWN_CLOSE_CONCURRENCY: usize = 32;

/// The default prefix of sandbox namespace names.
pub const DEFAULT_NETNS_PREFIX: &str = "atn-";

/// Configuration of one tunnel.
pub struct TunnelConfig {
    pub pool: BufferPool,
    pub egress: EgressConfig,
    /// Port the sandbox's redirect sends the actor's TCP to.
    pub egress_port: u16,
    /// Prefix of sandbox namespace names: `<prefix><uid>` and `<prefix><uid>-at`.
    pub netns_prefix: String,
    /// Whether sandboxes are dual-stack (an IPv6 address, default route and
    /// redirect beside the IPv4 ones); off, an actor's IPv6 dial fails at
    /// once with ENETUNREACH.
    pub sandbox_ipv6: bool,
    /// Sandboxes an earlier process left under `netns_prefix`: `Some(grace)`
    /// takes the prefix's lock at start (refusing to start while a live
    /// process holds it), lets ServeSandbox adopt a leftover for `grace`
    /// ([`crate::leftovers::DEFAULT_LEFTOVER_GRACE`] from the flags) and
    /// removes the rest then and at shutdown. `None` takes no lock and
    /// adopts nothing (a name that exists fails ServeSandbox): for a
    /// library user whose prefix is not its own alone, as the flags set it
    /// only when actors get sandboxes.
    pub leftover_grace: Option<Duration>,
    /// The DNS relay's upstreams and timeouts; `None` serves no DNS. Its
    /// `tcp_notsent_lowat` is `egress.sandbox_socket`'s, like every socket's.
    pub dns: Option<RelayConfig>,
    /// CAs that sign egress gateways' certificates.
    pub gateway_roots: Arc<rustls::RootCertStore>,
    /// Where actor certificates come from (the node agent in a cluster).
    pub cert_source: Arc<dyn CertificateSource>,
    pub clock: Clock,
    /// Ingress listeners and their TLS; `None` serves no ingress.
    pub ingress: Option<IngressListen>,
    /// Where `/stats` is served; `None` serves none.
    pub stats: Option<SocketAddr>,
    /// Bounds of the /stats listener.
    pub stats_limits: atunnel_process::AdminLimits,
    /// The overload guard: past its soft threshold new egress tunnels are
    /// reset and ingress answers 503 (first for the actors above their fair
    /// share), past its hard one the actor holding the most is shed. `None`
    /// runs none.
    pub overload: Option<OverloadConfig>,
    /// Each actor's descriptor budget across egress and ingress.
    pub holdings: crate::holdings::HoldingsConfig,
}

/// Where ingress listens, and how.
#[derive(Clone, Debug)]
pub struct IngressListen {
    pub config: IngressConfig,
    /// HTTPS from the router (default :443).
    pub https: SocketAddr,
    /// CONNECT from the router (default :8443).
    pub connect: SocketAddr,
}

impl TunnelConfig {
    pub fn new(
        gateway_roots: Arc<rustls::RootCertStore>,
        cert_source: Arc<dyn CertificateSource>,
    ) -> Self {
        Self {
            pool: BufferPool::default(),
            egress: EgressConfig::default(),
            egress_port: DEFAULT_EGRESS_PORT,
            netns_prefix: DEFAULT_NETNS_PREFIX.into(),
            sandbox_ipv6: true,
            leftover_grace: None,
            dns: None,
            gateway_roots,
            cert_source,
            clock: Clock::new(),
            ingress: None,
            stats: None,
            stats_limits: Default::default(),
            overload: Some(OverloadConfig::default()),
            holdings: Default::default(),
        }
    }
}

/// An actor's egress gateway, as the worker is told.
#[derive(Clone, Debug)]
pub struct GatewaySpec {
    /// `host:port`.
    pub address: String,
    /// The name the gateway's certificate must carry; default: the host part
    /// of `address`.
    pub server_name: Option<String>,
}

/// What a sandbox holds besides its network: the egress listener's and the
/// DNS relay's tasks.
struct Sandbox {
    actor: ActorRef,
    network: SandboxNetwork,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// atunnel for one worker.
pub struct Tunnel {
    cfg: TunnelConfig,
    exec: NsExecutor,
    egress: Arc<Egress>,
    ingress: Option<(Arc<Ingress>, SocketAddr, SocketAddr)>,
    /// Stops the ingress listeners and /stats.
    cancel: CancellationToken,
    /// Stops the ingress listeners only (a child of `cancel`): drain.
    ingress_stop: CancellationToken,
    /// Set once draining or shut down: `/readyz` answers 503.
    draining: Arc<std::sync::atomic::AtomicBool>,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    /// What an earlier process left, when `leftover_grace` is set.
    leftovers: Option<Arc<Leftovers>>,
    dns_relays: DnsRelays,
    /// /stats, for shutdown to wait on.
    tasks: TaskTracker,
    stats: Option<SocketAddr>,
    /// The control socket's counts, when a daemon serves one; in /stats.
    control: Arc<crate::stats::ControlCounters>,
    overload: Option<Arc<OverloadGuard>>,
}

impl Tunnel {
    pub async fn start(cfg: TunnelConfig) -> Result<Arc<Self>, TunnelError> {
        // First: a process that may not run (another holds the prefix)
        // must not bind anything.
        let leftovers = match cfg.leftover_grace {
            Some(_) => Some(Arc::new(Leftovers::claim(&cfg.netns_prefix)?)),
            None => None,
        };
        let exec = NsExecutor::start().map_err(TunnelError::Executor)?;
        let overload = match &cfg.overload {
            Some(o) => Some(OverloadGuard::new(o.clone()).map_err(TunnelError::Overload)?),
            None => None,
        };
        let max_descriptors =
            crate::holdings::start_budget(&cfg.holdings, cfg.overload.as_ref(), cfg.dns.as_ref());
        if let Some(memory) = overload.as_ref().and_then(|g| g.stats().memory) {
            crate::holdings::check_memory_fit(
                cfg.holdings.actors_at_budget,
                max_descriptors,
                cfg.egress.budget.max_gateway_bytes,
                cfg.egress.budget.max_buffers,
                cfg.pool.buffer_size(),
                cfg.overload.as_ref().map_or(0.0, |o| o.soft),
                memory.limit,
            );
        }
        let holdings = crate::holdings::Holdings::new(max_descriptors);
        let egress = Egress::with_holdings(
            cfg.egress,
            cfg.pool.clone(),
            overload.clone(),
            holdings.clone(),
        );
        if let Some(dns) = &cfg.dns {
            // Checked once here so a bad configuration fails start, not a sandbox.
            DnsRelay::new(dns.clone()).map_err(TunnelError::Dns)?;
        }
        // Every listener is bound before any is served, so a failure leaves
        // nothing running.
        let stats_listener = match cfg.stats {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(TunnelError::Listen)?,
            ),
            None => None,
        };
        let stats = match &stats_listener {
            Some(l) => Some(l.local_addr().map_err(TunnelError::Listen)?),
            None => None,
        };
        let cancel = CancellationToken::new();
        let ingress_stop = cancel.child_token();
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ingress = match &cfg.ingress {
            Some(listen) => {
                let ingress = Ingress::with_holdings(
                    listen.config.clone(),
                    cfg.pool.clone(),
                    overload.clone(),
                    holdings.clone(),
                )?;
                let (https, connect) = ingress
                    .spawn(listen.https, listen.connect, ingress_stop.clone())
                    .await
                    .map_err(TunnelError::Listen)?;
                Some((ingress, https, connect))
            }
            None => None,
        };
        let tasks = TaskTracker::new();
        let dns_relays = DnsRelays::default();
        if let Some(guard) = &overload {
            guard.set_shedder(Arc::new(crate::shedding::ShedActors {
                egress: Arc::downgrade(&egress),
                dns_relays: dns_relays.clone(),
                ingress: ingress.as_ref().map(|(i, _, _)| Arc::downgrade(i)),
                holdings: Arc::downgrade(&holdings),
                buffer_size: cfg.pool.buffer_size() as u64,
            }));
            tasks.spawn(guard.clone().run(cancel.clone()));
        }
        let control = Arc::new(crate::stats::ControlCounters::default());
        if let (Some(leftovers), Some(grace)) = (&leftovers, cfg.leftover_grace) {
            tasks.spawn(
                leftovers
                    .clone()
                    .reap_after(exec.clone(), grace, cancel.clone()),
            );
        }
        if let Some(listener) = stats_listener {
            let source = Arc::new(StatsSource {
                leftovers: leftovers.clone(),
                pool: cfg.pool.clone(),
                overload: overload.clone(),
                egress: Some(egress.clone()),
                ingress: ingress.as_ref().map(|(i, _, _)| i.clone()),
                dns_relays: dns_relays.clone(),
                admin: Default::default(),
                control: control.clone(),
                draining: draining.clone(),
            });
            tasks.spawn(atunnel_process::admin::serve_app(
                listener,
                cfg.stats_limits,
                crate::admin::TunnelAdmin::new(source),
                cancel.clone(),
            ));
        }
        Ok(Arc::new(Self {
            cfg,
            exec,
            egress,
            ingress,
            cancel,
            ingress_stop,
            draining,
            sandboxes: Mutex::new(HashMap::new()),
            leftovers,
            dns_relays,
            tasks,
            stats,
            control,
            overload,
        }))
    }

    pub fn egress(&self) -> &Arc<Egress> {
        &self.egress
    }

    /// The overload guard, if one runs.
    pub fn overload(&self) -> Option<&Arc<OverloadGuard>> {
        self.overload.as_ref()
    }

    /// Each open sandbox's DNS relay figures, by actor uid.
    pub fn dns_stats(&self) -> Vec<SandboxDnsStats> {
        dns_stats(&self.dns_relays)
    }

    /// Ingress and its bound HTTPS and CONNECT addresses, if it serves ingress.
    pub fn ingress(&self) -> Option<(&Arc<Ingress>, SocketAddr, SocketAddr)> {
        self.ingress.as_ref().map(|(i, h, c)| (i, *h, *c))
    }

    /// On every SIGHUP until `cancel`, re-reads ingress's credential and
    /// trust bundles; ingress also polls the trust bundle's file
    /// ([`Ingress::reload_tls_until`]).
    pub async fn reload_tls_on_sighup(self: Arc<Self>, cancel: CancellationToken) {
        let Some((ingress, _, _)) = self.ingress() else {
            return;
        };
        ingress.reload_tls_until(cancel).await
    }

    /// Where /stats is served, if it is.
    pub fn stats_addr(&self) -> Option<SocketAddr> {
        self.stats
    }

    /// What the control socket serving this tunnel counts (zero without one).
    pub fn control_counters(&self) -> &Arc<crate::stats::ControlCounters> {
        &self.control
    }

    pub fn executor(&self) -> &NsExecutor {
        &self.exec
    }

    pub fn pool(&self) -> &BufferPool {
        &self.cfg.pool
    }

    /// The actor's sandbox network, if it has one.
    pub fn sandbox(&self, actor: &ActorRef) -> Option<SandboxNetwork> {
        self.sandboxes
            .lock()
            .expect("sandboxes lock poisoned")
            .get(&actor.uid)
            .map(|s| s.network.clone())
    }

    /// Mints the actor's certificate and builds its gateway client. Runs
    /// before the workload starts, so a failure fails closed.
    pub async fn prepare_egress(
        &self,
        actor: &ActorRef,
        gateway: &GatewaySpec,
    ) -> Result<ActorEgress, TunnelError> {
        let (address, mut server_name) = resolve_gateway(&gateway.address).await?;
        if let Some(name) = &gateway.server_name {
            server_name = ServerName::try_from(name.clone()).map_err(|e| TunnelError::Gateway {
                address: gateway.address.clone(),
                reason: format!("server name {name:?}: {e}"),
            })?;
        }
        let mut client =
            GatewayClientConfig::new(address, server_name, self.cfg.gateway_roots.clone());
        client.socket = self.cfg.egress.socket;
        client.stream_window = self.cfg.egress.stream_window;
        // What all the actor's gateway connections may leave unread is its
        // budget's, shared by the most connections it can open.
        client.connection_window = self
            .cfg
            .egress
            .budget
            .gateway_connection_window(self.cfg.egress.connection_window);
        client.max_frame_size = self.cfg.egress.max_frame_size;
        client.idle_timeout = self.cfg.egress.pool_idle_timeout;
        client.ping_interval = self.cfg.egress.pool_ping_interval;
        client.ping_timeout = self.cfg.egress.pool_ping_timeout;
        client.floods = self.cfg.egress.h2_floods;
        Ok(ActorEgress::prepare(
            actor.clone(),
            client,
            self.cfg.cert_source.clone(),
            self.cfg.clock.clone(),
        )
        .await?)
    }

    /// Whether each sandbox gets a DNS relay (`cfg.dns`).
    pub fn serves_dns(&self) -> bool {
        self.cfg.dns.is_some()
    }

    /// Builds the actor's sandbox network and serves egress and DNS inside
    /// it. With `leftover_grace` set, a sandbox an earlier process left for
    /// this actor is adopted, its runtime namespace kept.
    pub async fn serve_sandbox(&self, actor: &ActorRef) -> Result<SandboxNetwork, TunnelError> {
        if self.sandbox(actor).is_some() {
            return Err(TunnelError::SandboxExists(actor.to_string()));
        }
        let sandbox_err = |source| TunnelError::Sandbox {
            actor: actor.to_string(),
            source,
        };
        // One relay per sandbox: its in-flight budget is that sandbox's
        // alone, so one actor flooding DNS cannot starve the others.
        let relay = match &self.cfg.dns {
            Some(cfg) => Some(
                DnsRelay::new(RelayConfig {
                    tcp_notsent_lowat: self.cfg.egress.sandbox_socket.notsent_lowat,
                    ..cfg.clone()
                })
                .map_err(TunnelError::Dns)?,
            ),
            None => None,
        };
        let name = format!("{}{}", self.cfg.netns_prefix, actor.uid);
        let network = match &self.leftovers {
            Some(leftovers) => {
                leftovers.take(&name).await;
                let (network, adopted) = SandboxNetwork::adopt_or_create(
                    &self.exec,
                    &name,
                    self.cfg.egress_port,
                    self.cfg.sandbox_ipv6,
                )
                .await
                .map_err(sandbox_err)?;
                if adopted {
                    leftovers.adopted();
                    tracing::info!(%actor, netns = name, "adopted the sandbox an earlier process left");
                }
                network
            }
            None => SandboxNetwork::create(
                &self.exec,
                &name,
                self.cfg.egress_port,
                self.cfg.sandbox_ipv6,
            )
            .await
            .map_err(sandbox_err)?,
        };
        let bound = self.bind_sandbox(&network).await;
        let (egress_listener, dns_sockets) = match bound {
            Ok(b) => b,
            Err(e) => {
                let _ = network.destroy(&self.exec).await;
                return Err(sandbox_err(e));
            }
        };
        let cancel = CancellationToken::new();
        let cancel_dns = cancel.clone();
        let tasks = TaskTracker::new();
        if let (Some(relay), Some((udp, tcp))) = (relay, dns_sockets) {
            self.dns_relays
                .lock()
                .expect("dns relays lock poisoned")
                .insert(actor.uid.clone(), relay.clone());
            let (d, c) = (relay.clone(), cancel.clone());
            tasks.spawn(d.serve_udp(udp, c));
            tasks.spawn(relay.serve_tcp(tcp, cancel_dns));
        }
        // Last: from here on, the listener's connections are this actor's.
        tasks.spawn(self.egress.listener_task(
            &actor.uid,
            egress_listener,
            Destination::Original,
            cancel.clone(),
        ));
        self.sandboxes
            .lock()
            .expect("sandboxes lock poisoned")
            .insert(
                actor.uid.clone(),
                Sandbox {
                    actor: actor.clone(),
                    network: network.clone(),
                    cancel,
                    tasks,
                },
            );
        Ok(network)
    }

    #[allow(clippy::type_complexity)]
    async fn bind_sandbox(
        &self,
        network: &SandboxNetwork,
    ) -> Result<
        (
            tokio::net::TcpListener,
            Option<(tokio::net::UdpSocket, tokio::net::TcpListener)>,
        ),
        SandboxError,
    > {
        let dns = if self.cfg.dns.is_none() {
            None
        } else if network.ipv6() {
            // One dual-stack socket each answers on 169.254.17.1 and
            // fd00:a7:17::1 (the namespace has no other address but lo's):
            // no second relay task per sandbox for the second family.
            Some((
                network.bind_udp_any(&self.exec, DNS_PORT).await?,
                network.listen_tcp_any(&self.exec, DNS_PORT).await?,
            ))
        } else {
            let addr = SocketAddr::from((GATEWAY_ADDR, DNS_PORT));
            Some((
                network.bind_udp(&self.exec, addr).await?,
                network.listen_tcp(&self.exec, addr).await?,
            ))
        };
        let egress = network.listen_egress(&self.exec).await?;
        Ok((egress, dns))
    }

    /// Arms the actor: ingress routes to its sandbox, and its egress
    /// listener's connections are admitted. `egress` of `None` means the
    /// actor has no tunnelled egress: its connections are closed with no bytes.
    pub async fn activate(
        &self,
        actor: &ActorRef,
        egress: Option<ActorEgress>,
    ) -> Result<(), TunnelError> {
        let sandbox = self
            .sandbox(actor)
            .ok_or_else(|| TunnelError::NoSandbox(actor.to_string()))?;
        let dialer = SandboxDialer {
            exec: self.exec.clone(),
            sandbox,
        };
        self.activate_with_dialer(actor, Box::new(dialer), egress)
            .await
    }

    /// [`Tunnel::activate`] with a dialer of the caller's, for actors that
    /// are not in sandboxes of this tunnel's making.
    pub async fn activate_with_dialer(
        &self,
        actor: &ActorRef,
        dialer: Box<dyn ActorDialer>,
        egress: Option<ActorEgress>,
    ) -> Result<(), TunnelError> {
        // One activation for both sides: one cancel, one cut, and the
        // same relay bounds for egress tunnels and ingress CONNECT tunnels.
        let activation = Arc::new(ActorActivation::new(self.cfg.egress.relay));
        if let Some((ingress, _, _)) = &self.ingress {
            ingress.activate_with(
                &actor.atespace,
                &actor.name,
                &actor.uid,
                dialer,
                activation.clone(),
            )?;
        }
        if let Some(egress) = egress
            && let Err(e) = self.egress.activate_with(&actor.uid, egress, activation)
        {
            // All or nothing: the route just made goes again.
            if let Some((ingress, _, _)) = &self.ingress {
                ingress
                    .deactivate(&actor.atespace, &actor.name, &actor.uid)
                    .await;
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Refuses new work for the actor, cancels its in-flight requests, closes
    /// its tunnels and waits for them (bounded). Idempotent; other actors are
    /// untouched. Both sides are always attempted.
    pub async fn deactivate(&self, actor: &ActorRef) -> Result<(), TunnelError> {
        Ok(self.retire(actor, self.cfg.egress.drain_timeout).await?)
    }

    /// Deactivation: both sides stop taking work, the activation is
    /// cancelled once (both sides' work in flight is cut at that instant),
    /// and both sides are waited for together, ingress up to its drain
    /// timeout, egress up to `within` for its tunnels and again for its
    /// gateway connections. Only egress's wait reports a timeout.
    async fn retire(&self, actor: &ActorRef, within: Duration) -> Result<(), EgressError> {
        let ingress = self.ingress.as_ref().map(|(i, _, _)| i);
        let route = ingress.and_then(|i| i.take_route(&actor.atespace, &actor.name, &actor.uid));
        let egress = self.egress.take(&actor.uid);
        // The same activation on both sides, unless one side's is left
        // from an activation the other no longer has (egress armed alone).
        let shared = [
            route.as_ref().map(|r| r.activation().clone()),
            egress.as_ref().map(|e| e.shared().clone()),
        ];
        match &shared {
            [Some(a), Some(b)] if !Arc::ptr_eq(a, b) => {
                a.cancel();
                b.cancel();
            }
            [Some(a), _] | [None, Some(a)] => a.cancel(),
            [None, None] => {}
        }
        let (_, drained) = tokio::join!(
            async {
                if let (Some(ingress), Some(route)) = (ingress, route) {
                    ingress.drain_route(route).await;
                }
            },
            async {
                match egress {
                    Some(a) => self.egress.drain(&actor.uid, a, within).await,
                    None => Ok(()),
                }
            },
        );
        drained
    }

    /// Deactivates the actor, stops its listener and relay, and removes its
    /// sandbox network. Idempotent.
    pub async fn close_sandbox(&self, actor: &ActorRef) -> Result<(), TunnelError> {
        self.close_within(actor, self.cfg.egress.drain_timeout)
            .await
    }

    /// [`Tunnel::close_sandbox`], waiting at most `within` for the actor's
    /// egress tunnels and again for its gateway connections.
    async fn close_within(&self, actor: &ActorRef, within: Duration) -> Result<(), TunnelError> {
        let deactivated = self.retire(actor, within).await;
        self.egress.forget(&actor.uid);
        let sandbox = self
            .sandboxes
            .lock()
            .expect("sandboxes lock poisoned")
            .remove(&actor.uid);
        self.dns_relays
            .lock()
            .expect("dns relays lock poisoned")
            .remove(&actor.uid);
        if let Some(sandbox) = sandbox {
            sandbox.cancel.cancel();
            sandbox.tasks.close();
            sandbox.tasks.wait().await;
            sandbox
                .network
                .destroy(&self.exec)
                .await
                .map_err(|source| TunnelError::Sandbox {
                    actor: actor.to_string(),
                    source,
                })?;
        }
        Ok(deactivated?)
    }

    /// Drains for at most `within`: `/readyz` answers 503 from now on, the
    /// ingress listeners and every sandbox's egress listener stop
    /// accepting (listeners the caller serves stop at the caller's cancel),
    /// and what is open (tunnels, requests in flight) may finish on its
    /// own. Returns whether it all did; [`Tunnel::shutdown`] then
    /// ends what is left.
    pub async fn drain(&self, within: Duration) -> bool {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.ingress_stop.cancel();
        let sandboxes: Vec<TaskTracker> = {
            let sandboxes = self.sandboxes.lock().expect("sandboxes lock poisoned");
            sandboxes
                .values()
                .map(|s| {
                    // The listener stops accepting; its tunnels go on, and
                    // its task ends with the last of them.
                    s.cancel.cancel();
                    s.tasks.clone()
                })
                .collect()
        };
        let ended = async {
            for tasks in sandboxes {
                tasks.close();
                tasks.wait().await;
            }
            if let Some((ingress, _, _)) = &self.ingress {
                ingress.wait_listeners().await;
            }
            // Listeners the caller serves (loopback actors) end with
            // their last tunnel, once the caller's cancel stopped them.
            self.egress.wait_served_listeners().await;
        };
        tokio::time::timeout(within, ended).await.is_ok()
    }

    /// Stops everything it started and waits for it: the ingress
    /// listeners stop accepting and every activation is retired (requests
    /// and tunnels cancelled), every sandbox is closed, egress stops, and
    /// the listeners' connections and /stats are waited for. Each wait for
    /// something cancelled is bounded by [`crate::SHUTDOWN_CLOSE_GRACE`],
    /// not the drain timeout: the drain came first.
    pub async fn shutdown(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.cancel.cancel();
        if let Some((ingress, _, _)) = &self.ingress {
            ingress.shutdown().await;
        }
        let actors: Vec<ActorRef> = self
            .sandboxes
            .lock()
            .expect("sandboxes lock poisoned")
            .values()
            .map(|s| s.actor.clone())
            .collect();
        // Concurrently: each close may wait for its actor's tunnels and
        // gateway connections (bounded), and one after another those waits
        // would add up. Ingress has retired every route already.
        futures_util::stream::iter(actors)
            .for_each_concurrent(SHUTDOWN_CLOSE_CONCURRENCY, |actor| async move {
                if let Err(e) = self.close_within(&actor, crate::SHUTDOWN_CLOSE_GRACE).await {
                    tracing::warn!(%actor, error = %e, "closing sandbox at shutdown");
                }
            })
            .await;
        if let Some(leftovers) = &self.leftovers {
            leftovers
                .remove_unclaimed(&self.exec, "unclaimed at shutdown")
                .await;
        }
        self.egress.shutdown().await;
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Resolves `host:port` once; the host part is the name the gateway's
/// certificate must carry.
async fn resolve_gateway(address: &str) -> Result<(SocketAddr, ServerName<'static>), TunnelError> {
    let err = |reason: String| TunnelError::Gateway {
        address: address.to_string(),
        reason,
    };
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| err("missing port".into()))?;
    let port: u16 = port
        .parse()
        .map_err(|_| err(format!("bad port {port:?}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(err("missing host".into()));
    }
    let server_name = ServerName::try_from(host.to_string()).map_err(|e| err(e.to_string()))?;
    let addr = match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| err(e.to_string()))?
            .next()
            .ok_or_else(|| err("no address".into()))?,
    };
    Ok((addr, server_name))
}
