//! Hosting actors without a worker: atunnel makes the worker's calls itself
//! for N actors, so the `atunnel` binary and the bench's `tunnel` role run the
//! same code a worker drives.
//!
//! `--network sandbox` (the default) gives every actor a real sandbox: its
//! program dials any address from its runtime namespace and the redirect
//! hands the connection to atunnel. `--network loopback` needs no root: each
//! actor gets loopback listeners, one per `--destinations` entry (a listener
//! not behind a redirect has no original destination, so each carries a
//! fixed one).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use atunnel_identity::cert_source::{CertificateSource, LocalCaSource};
use atunnel_identity::identity::ActorRef;
use atunnel_identity::pki::CertificateAuthority;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use atunnel_identity::pem_files::{load_certs, load_key, load_roots};
use atunnel_process::{BoxError, FlagDuration, OverloadArgs, PoolArgs, RelayArgs, SocketArgs};

use crate::egress::{ActorBudget, Destination, EgressConfig};
use crate::holdings::HoldingsConfig;
use crate::ingress::IngressConfig;
use crate::ingress::{DirectDialer, PoolSettings};
use crate::tunnel::{GatewaySpec, IngressListen, Tunnel, TunnelConfig};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// A sandbox (two network namespaces, veth, redirect) per actor; needs root.
    Sandbox,
    /// Loopback listeners per actor and destination; no root needed.
    Loopback,
}

#[derive(clap::Args, Clone, Debug)]
pub struct HostArgs {
    /// Number of actors to host (actor-0, actor-1, ... in atespace "bench").
    #[arg(long, default_value_t = 1)]
    pub actors: usize,
    /// How actors reach atunnel.
    #[arg(long, value_enum, default_value = "sandbox")]
    pub network: Network,
    /// Egress gateway, host:port.
    #[arg(long)]
    pub gateway: String,
    /// Name the gateway's certificate must carry (default: the host of --gateway).
    #[arg(long)]
    pub gateway_name: Option<String>,
    /// Loopback network: address the egress listeners bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_ip: IpAddr,
    /// Loopback network: destinations, comma separated (one listener each per actor).
    #[arg(long, value_delimiter = ',')]
    pub destinations: Vec<SocketAddr>,
    #[command(flatten)]
    pub tunnel: TunnelArgs,
}

/// The tunnel's own flags, shared by `atunnel host` and `atunnel serve`:
/// everything but the actors, which `host` invents and `serve` is told of.
#[derive(clap::Args, Clone, Debug)]
pub struct TunnelArgs {
    /// CA certificates that sign the gateway's certificate (PEM).
    #[arg(long)]
    pub gateway_ca: PathBuf,
    /// A TOML file setting any of these flags by long name
    /// (`gateway-idle-timeout = "90s"`); flags on the command line win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Node agent's Unix socket; actor certificates are minted there.
    #[arg(long, conflicts_with_all = ["actor_ca_cert", "actor_ca_key"])]
    pub node_agent_socket: Option<PathBuf>,
    /// With --node-agent-socket: this worker's certificate chain (PEM).
    #[arg(long, requires = "node_agent_socket")]
    pub worker_cert: Option<PathBuf>,
    /// With --node-agent-socket: this worker's private key (PEM).
    #[arg(long, requires = "node_agent_socket")]
    pub worker_key: Option<PathBuf>,
    /// The most one certificate mint at the node agent may take, its
    /// connection and TLS handshake included ("10s").
    #[arg(long, default_value_t = FlagDuration(atunnel_nodeagent::DEFAULT_MINT_TIMEOUT))]
    pub node_agent_timeout: FlagDuration,
    /// CAs that sign the router's (ingress) and the node agent's certificates (PEM).
    #[arg(long)]
    pub trust_bundle: Option<PathBuf>,
    /// How often ingress checks the trust bundle's file for a change and
    /// reloads it (SIGHUP reloads it at once) ("10s"; 0: only on SIGHUP).
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().trust_bundle_poll))]
    pub trust_bundle_poll_interval: FlagDuration,
    /// Ingress HTTPS listen address; used when ingress is on (--credential-bundle).
    #[arg(long, default_value = "0.0.0.0:443")]
    pub ingress_https: SocketAddr,
    /// Ingress CONNECT listen address; used when ingress is on (--credential-bundle).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub ingress_connect: SocketAddr,
    /// The worker's serving certificate chain and key in one PEM, re-read when it
    /// changes. Ingress is on with it and off without it.
    #[arg(long, requires = "trust_bundle")]
    pub credential_bundle: Option<PathBuf>,
    /// The only client identity ingress admits.
    #[arg(long, default_value_t = IngressConfig::default().allowed_client_id)]
    pub client_identity: String,
    /// Without a node agent: actor CA certificate (PEM) to mint locally with.
    #[arg(long, requires = "actor_ca_key")]
    pub actor_ca_cert: Option<PathBuf>,
    /// Without a node agent: actor CA private key (PEM).
    #[arg(long, requires = "actor_ca_cert")]
    pub actor_ca_key: Option<PathBuf>,
    /// Prefix of sandbox namespace names.
    #[arg(long, default_value = crate::tunnel::DEFAULT_NETNS_PREFIX)]
    pub netns_prefix: String,
    /// With sandboxes: how long namespaces under --netns-prefix that an
    /// earlier process left (a crash, an OOM kill) wait for ServeSandbox
    /// to adopt them before they are removed; the rest go at shutdown too
    /// ("300s").
    #[arg(long, default_value_t = FlagDuration(crate::leftovers::DEFAULT_LEFTOVER_GRACE))]
    pub netns_leftover_grace: FlagDuration,
    /// Egress port the sandbox redirect uses.
    #[arg(long, default_value_t = atunnel_sandbox::sandbox::DEFAULT_EGRESS_PORT)]
    pub egress_port: u16,
    /// Sandboxes IPv4 only, for clusters without IPv6: no fd00:a7:17::/126
    /// addresses, IPv6 route or redirect, the DNS relay on 169.254.17.1 only;
    /// an actor's IPv6 dial fails at once (ENETUNREACH). Default dual-stack.
    #[arg(long)]
    pub no_sandbox_ipv6: bool,
    /// resolv.conf whose nameservers the sandboxes' DNS relay forwards to ("" serves no DNS).
    #[arg(long, default_value = "/etc/resolv.conf",
          value_parser = |s: &str| Ok::<_, std::convert::Infallible>(PathBuf::from(s)))]
    pub resolv_conf: PathBuf,
    #[cfg(feature = "comparison")]
    #[command(flatten)]
    pub comparison: crate::comparison::RelayVariant,
    /// Idle time after which an ingress connection drops its rustls session
    /// for its traffic keys and, over HTTP/1.1, hyper's buffers until its
    /// next byte ("15s", "100ms"; 0 never).
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().hibernate_after))]
    pub hibernate_after: FlagDuration,
    /// How long deactivating an actor waits for its tunnels and requests to
    /// end, egress and ingress each ("10s").
    #[arg(long, default_value_t = FlagDuration(EgressConfig::default().drain_timeout))]
    pub drain_timeout: FlagDuration,
    /// How long a router may take to send a request head from its first
    /// byte, or its HTTP/2 preface once TLS is done ("10s").
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().header_read_timeout))]
    pub header_read_timeout: FlagDuration,
    /// The router's HTTP/2 connections to ingress HTTPS are pinged this
    /// often and closed if one goes unanswered for --router-ping-timeout
    /// ("60s"; 0: never).
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().router_ping_interval))]
    pub router_ping_interval: FlagDuration,
    /// See --router-ping-interval ("20s").
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().router_ping_timeout))]
    pub router_ping_timeout: FlagDuration,
    /// How long a router has to finish TLS on either ingress listener
    /// ("10s").
    #[arg(long, default_value_t = FlagDuration(IngressConfig::default().tls_handshake_timeout))]
    pub tls_handshake_timeout: FlagDuration,
    #[command(flatten)]
    pub pre_auth: atunnel_process::PreAuthArgs,
    #[command(flatten)]
    pub h2_floods: atunnel_process::H2FloodArgs,
    /// Where /stats is served.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub stats: SocketAddr,
    #[command(flatten)]
    pub admin: atunnel_process::AdminArgs,
    /// HTTP/2 receive window per egress tunnel, in bytes: the most a tunnel
    /// whose actor stopped reading makes atunnel hold; a tunnel's download
    /// rate is at most this per gateway round trip.
    #[arg(long, default_value_t = EgressConfig::default().stream_window,
          value_parser = clap::value_parser!(u32).range(4096..=(1 << 31) - 1))]
    pub gateway_stream_window: u32,
    /// HTTP/2 receive window per gateway connection, in bytes: the most one
    /// actor's tunnels on one connection hold unread together (an actor has
    /// one connection per 1,000 tunnels, the gateway's stream limit).
    #[arg(long, default_value_t = EgressConfig::default().connection_window,
          value_parser = clap::value_parser!(u32).range(65535..=(1 << 31) - 1))]
    pub gateway_connection_window: u32,
    /// Largest HTTP/2 frame the gateway may send, in bytes: a tunnel's
    /// bytes per write, and what one gateway connection's read buffer may
    /// grow to.
    #[arg(long, default_value_t = EgressConfig::default().max_frame_size,
          value_parser = clap::value_parser!(u32).range(16384..=(1 << 24) - 1))]
    pub gateway_max_frame_size: u32,
    /// A pooled gateway connection with no tunnel for this long is closed
    /// ("90s").
    #[arg(long, default_value_t = FlagDuration(EgressConfig::default().pool_idle_timeout))]
    pub gateway_idle_timeout: FlagDuration,
    /// Pooled gateway connections are pinged (HTTP/2 PING) this often and
    /// retired if one goes unanswered for --gateway-ping-timeout ("15s";
    /// 0: never).
    #[arg(long, default_value_t = FlagDuration(EgressConfig::default().pool_ping_interval))]
    pub gateway_ping_interval: FlagDuration,
    /// See --gateway-ping-interval ("10s").
    #[arg(long, default_value_t = FlagDuration(EgressConfig::default().pool_ping_timeout))]
    pub gateway_ping_timeout: FlagDuration,
    #[command(flatten)]
    pub relay: RelayArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub overload: OverloadArgs,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// What each actor may make egress hold (see [`ActorBudget`]).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct BudgetArgs {
    /// Concurrent egress tunnels per actor; past it the actor's new
    /// connections are reset.
    #[arg(long, default_value_t = ActorBudget::default().max_tunnels)]
    pub actor_max_tunnels: usize,
    /// Egress tunnels per actor being opened at once; past it the actor's
    /// new connections are reset.
    #[arg(long, default_value_t = ActorBudget::default().max_opening)]
    pub actor_max_opening: usize,
    /// Pooled relay buffers one actor's tunnels may hold at once; past it
    /// its relays wait (egress's tunnels, and separately its ingress
    /// CONNECT tunnels).
    #[arg(long, default_value_t = ActorBudget::default().max_buffers)]
    pub actor_max_buffers: usize,
    /// Egress connections refused per actor a second (over a budget,
    /// overloaded, inactive) before its listener pauses accepting, so a
    /// connection flood costs atunnel a bounded CPU; 0 does not pace.
    #[arg(long, default_value_t = ActorBudget::default().max_refusals_per_second)]
    pub actor_max_refusals_per_second: u32,
    /// Bytes all of one actor's gateway connections together may leave
    /// unread (its downloads' HTTP/2 windows): each connection's window is
    /// this over the most connections its tunnel budget opens (one per
    /// 1,000 tunnels), and at most --gateway-connection-window.
    #[arg(long, default_value_t = ActorBudget::default().max_gateway_bytes,
          value_parser = clap::value_parser!(u32).range(65535..=(1 << 31) - 1))]
    pub actor_max_gateway_bytes: u32,
    /// Descriptors one actor's egress tunnels and ingress requests and
    /// CONNECTs may hold together; past it its new tunnels are reset and
    /// its requests answered 503. 0: derived at start, so that
    /// --actors-at-budget actors at it (and their DNS relays) stay below
    /// the overload guard's soft threshold of RLIMIT_NOFILE, less 5% kept
    /// for the process (4,000 at 20,000 descriptors without DNS).
    #[arg(long, default_value_t = HoldingsConfig::default().max_descriptors)]
    pub actor_max_descriptors: u64,
    /// How many actors at their descriptor budgets must stay below the
    /// soft threshold: what the derived --actor-max-descriptors is sized
    /// for, and what an explicit one is checked against (a warning).
    #[arg(long, default_value_t = HoldingsConfig::default().actors_at_budget,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub actors_at_budget: u64,
    /// DNS queries in flight per sandbox's relay; past it that sandbox's
    /// queries are dropped (the resolver retries), no one else's.
    #[arg(long, default_value_t = atunnel_dns::RelayConfig::DEFAULT_MAX_IN_FLIGHT,
          value_parser = clap::builder::TypedValueParser::map(
              clap::value_parser!(u32).range(1..=65536), |n| n as usize))]
    pub dns_max_in_flight: usize,
    /// Ingress requests and CONNECT tunnels in flight to one actor; past it
    /// the router gets 503 for that actor.
    #[arg(long, default_value_t = PoolSettings::default().max_in_flight)]
    pub actor_max_ingress_in_flight: usize,
    /// How long an actor has to send an ingress response's head; past it
    /// the router gets 504 ("60s").
    #[arg(long, default_value_t = FlagDuration(PoolSettings::default().response_timeout))]
    pub actor_response_timeout: FlagDuration,
    /// How long an ingress response body may move no bytes from the actor
    /// before the request is ended: the router's stream reset (its
    /// HTTP/1.1 connection closed) and the actor's connection closed
    /// ("60s"; 0: never).
    #[arg(long, default_value_t = FlagDuration(PoolSettings::default().response_body_idle))]
    pub actor_response_body_timeout: FlagDuration,
    /// How long an ingress request body may move no bytes toward the actor
    /// (it stopped reading, or the router stopped sending) before the
    /// request is ended the same way, or answered 504 before its response
    /// head ("60s"; 0: never).
    #[arg(long, default_value_t = FlagDuration(PoolSettings::default().request_body_idle))]
    pub actor_request_body_timeout: FlagDuration,
    /// Bytes the router's connections may hold toward one actor, across all
    /// of them: each ingress request body in flight takes its receive
    /// window (256 KiB, or its length if known and smaller) until it ends;
    /// past it the router gets 503 for that actor (16 MiB: 64 full
    /// windows; requests without a body take nothing).
    #[arg(long, default_value_t = PoolSettings::default().max_router_bytes,
          value_parser = clap::value_parser!(u64).range(256 * 1024..))]
    pub actor_max_router_bytes: u64,
    /// Ingress requests one actor may have in flight on one router HTTP/2
    /// connection (of the 200 streams atunnel allows it), so an actor that
    /// answers slowly or never leaves the rest to the others on it; past
    /// it the router gets 503 for that actor.
    #[arg(long, default_value_t = PoolSettings::default().max_router_streams,
          value_parser = clap::value_parser!(u32).range(1..=200))]
    pub actor_max_router_streams: u32,
    /// Distinct ports one actor's ingress HTTPS requests may go to, each
    /// with its own upstream pool; a request to one more gets 503.
    #[arg(long, default_value_t = PoolSettings::default().max_ports)]
    pub actor_max_ingress_ports: usize,
    /// Idle HTTP/1.1 connections kept per actor and port (so at most
    /// --actor-max-ingress-ports times this per actor); the rest close.
    #[arg(long, default_value_t = PoolSettings::default().max_idle_per_actor)]
    pub actor_max_ingress_idle: usize,
    /// An HTTP/2 connection to an actor with requests in flight is pinged
    /// this often and closed (its requests answered 502) if a ping goes
    /// unanswered for --actor-ping-timeout ("20s"; 0: never).
    #[arg(long, default_value_t = FlagDuration(PoolSettings::default().ping_interval))]
    pub actor_ping_interval: FlagDuration,
    /// See --actor-ping-interval ("10s").
    #[arg(long, default_value_t = FlagDuration(PoolSettings::default().ping_timeout))]
    pub actor_ping_timeout: FlagDuration,
}

impl BudgetArgs {
    pub fn budget(&self) -> ActorBudget {
        ActorBudget {
            max_tunnels: self.actor_max_tunnels,
            max_opening: self.actor_max_opening,
            max_buffers: self.actor_max_buffers,
            max_refusals_per_second: self.actor_max_refusals_per_second,
            max_gateway_bytes: self.actor_max_gateway_bytes,
        }
    }

    pub fn holdings(&self) -> HoldingsConfig {
        HoldingsConfig {
            max_descriptors: self.actor_max_descriptors,
            actors_at_budget: self.actors_at_budget,
        }
    }
}

/// One hosted actor, as printed when ready.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostedActor {
    pub name: String,
    /// Sandbox network: the runtime namespace the actor's programs run in.
    pub runtime_netns: Option<String>,
    /// Loopback network: destination -> listener address.
    pub listeners: BTreeMap<SocketAddr, SocketAddr>,
}

/// Printed as one JSON line once every actor is active.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostReady {
    pub stats: SocketAddr,
    /// Ingress HTTPS and CONNECT addresses, when ingress is on.
    pub ingress: Option<(SocketAddr, SocketAddr)>,
    pub actors: Vec<HostedActor>,
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "no certificate source: give --node-agent-socket (with --worker-cert, --worker-key, --trust-bundle) or --actor-ca-cert and --actor-ca-key"
    )]
    NoCertificateSource,
    #[error("--network loopback needs --destinations")]
    NoDestinations,
}

fn cert_source(args: &TunnelArgs) -> Result<Arc<dyn CertificateSource>, BoxError> {
    if let Some(socket) = &args.node_agent_socket {
        let (Some(cert), Some(key), Some(trust)) =
            (&args.worker_cert, &args.worker_key, &args.trust_bundle)
        else {
            return Err(HostError::NoCertificateSource.into());
        };
        let mut cfg = atunnel_nodeagent::NodeAgentConfig::new(
            socket.clone(),
            load_certs(cert)?,
            load_key(key)?,
            load_certs(trust)?,
        );
        cfg.agent_id = atunnel_identity::pki::ATELET_SPIFFE_ID.to_string();
        cfg.timeout = args.node_agent_timeout.0;
        return Ok(Arc::new(atunnel_nodeagent::NodeAgentSource::new(cfg)?));
    }
    let (Some(cert), Some(key)) = (&args.actor_ca_cert, &args.actor_ca_key) else {
        return Err(HostError::NoCertificateSource.into());
    };
    let ca = CertificateAuthority::from_pem(
        &std::fs::read_to_string(cert)?,
        &std::fs::read_to_string(key)?,
    )?;
    Ok(Arc::new(LocalCaSource::new(Arc::new(ca))))
}

/// Hosts the actors until `cancel`, then closes everything.
pub async fn run(args: HostArgs, cancel: CancellationToken) -> Result<(), BoxError> {
    if args.network == Network::Loopback && args.destinations.is_empty() {
        return Err(HostError::NoDestinations.into());
    }
    let cfg = args.tunnel.config(args.network == Network::Sandbox)?;
    let tunnel = Tunnel::start(cfg).await?;
    tokio::spawn(tunnel.clone().reload_tls_on_sighup(cancel.clone()));
    let stats = tunnel.stats_addr().expect("asked for /stats");
    let result = host_actors(&args, &tunnel, stats, &cancel).await;
    // A stop signal: stop accepting, let what is open finish (bounded),
    // then end the rest.
    let drain = args.tunnel.drain_timeout.0;
    if !tunnel.drain(drain).await {
        tracing::info!(after = ?drain, "drain timed out; ending what is still open");
    }
    tunnel.shutdown().await;
    result
}

impl TunnelArgs {
    /// The tunnel these flags describe. `sandboxes`: actors get sandboxes,
    /// so their DNS relay is configured (from --resolv-conf).
    pub fn config(&self, sandboxes: bool) -> Result<TunnelConfig, BoxError> {
        let args = self;
        let mut cfg =
            TunnelConfig::new(Arc::new(load_roots(&args.gateway_ca)?), cert_source(args)?);
        cfg.pool = args.pool.pool();
        cfg.egress = EgressConfig {
            socket: args.socket.options(),
            sandbox_socket: args.socket.sandbox_options(),
            drain_timeout: args.drain_timeout.0,
            budget: args.budget.budget(),
            stream_window: args.gateway_stream_window,
            connection_window: args.gateway_connection_window,
            max_frame_size: args.gateway_max_frame_size,
            pool_idle_timeout: args.gateway_idle_timeout.0,
            pool_ping_interval: args.gateway_ping_interval.0,
            pool_ping_timeout: args.gateway_ping_timeout.0,
            relay: args.relay.bounds(),
            h2_floods: args.h2_floods.limits(),
            #[cfg(feature = "comparison")]
            comparison: args.comparison,
        };
        cfg.egress_port = args.egress_port;
        cfg.netns_prefix = args.netns_prefix.clone();
        cfg.sandbox_ipv6 = !args.no_sandbox_ipv6;
        // Only a process that builds sandboxes owns names under the prefix.
        cfg.leftover_grace = sandboxes.then_some(args.netns_leftover_grace.0);
        if let (Some(bundle), Some(trust)) = (&args.credential_bundle, &args.trust_bundle) {
            cfg.ingress = Some(IngressListen {
                config: IngressConfig {
                    credential_bundle: bundle.clone(),
                    trust_bundle: trust.clone(),
                    trust_bundle_poll: args.trust_bundle_poll_interval.0,
                    allowed_client_id: args.client_identity.clone(),
                    pools: PoolSettings {
                        max_in_flight: args.budget.actor_max_ingress_in_flight,
                        response_timeout: args.budget.actor_response_timeout.0,
                        response_body_idle: args.budget.actor_response_body_timeout.0,
                        request_body_idle: args.budget.actor_request_body_timeout.0,
                        max_router_bytes: args.budget.actor_max_router_bytes,
                        max_router_streams: args.budget.actor_max_router_streams,
                        max_ports: args.budget.actor_max_ingress_ports,
                        max_idle_per_actor: args.budget.actor_max_ingress_idle,
                        max_buffers: args.budget.actor_max_buffers,
                        ping_interval: args.budget.actor_ping_interval.0,
                        ping_timeout: args.budget.actor_ping_timeout.0,
                        ..PoolSettings::default()
                    },
                    socket: args.socket.options(),
                    sandbox_socket: args.socket.sandbox_options(),
                    drain_timeout: args.drain_timeout.0,
                    hibernate_after: args.hibernate_after.0,
                    header_read_timeout: args.header_read_timeout.0,
                    router_ping_interval: args.router_ping_interval.0,
                    router_ping_timeout: args.router_ping_timeout.0,
                    tls_handshake_timeout: args.tls_handshake_timeout.0,
                    pre_auth: args.pre_auth.limits(),
                    h2_floods: args.h2_floods.limits(),
                    relay: args.relay.bounds(),
                },
                https: args.ingress_https,
                connect: args.ingress_connect,
            });
        }
        if sandboxes && !args.resolv_conf.as_os_str().is_empty() {
            cfg.dns = Some(atunnel_dns::RelayConfig {
                upstreams: atunnel_dns::resolvers_from_resolv_conf(&args.resolv_conf)?,
                max_in_flight: args.budget.dns_max_in_flight,
                ..atunnel_dns::RelayConfig::default()
            });
        }
        cfg.stats = Some(args.stats);
        cfg.stats_limits = args.admin.limits();
        cfg.overload = args.overload.config();
        cfg.holdings = args.budget.holdings();
        Ok(cfg)
    }
}

async fn host_actors(
    args: &HostArgs,
    tunnel: &Arc<Tunnel>,
    stats: SocketAddr,
    cancel: &CancellationToken,
) -> Result<(), BoxError> {
    let gateway = GatewaySpec {
        address: args.gateway.clone(),
        server_name: args.gateway_name.clone(),
    };
    let mut ready = HostReady {
        stats,
        ingress: tunnel.ingress().map(|(_, https, connect)| (https, connect)),
        actors: Vec::new(),
    };
    for i in 0..args.actors {
        let actor = ActorRef::new("bench", format!("actor-{i}"), format!("uid-{i}"))?;
        let egress = tunnel.prepare_egress(&actor, &gateway).await?;
        let mut hosted = HostedActor {
            name: actor.to_string(),
            runtime_netns: None,
            listeners: BTreeMap::new(),
        };
        match args.network {
            Network::Sandbox => {
                let sandbox = tunnel.serve_sandbox(&actor).await?;
                hosted.runtime_netns = Some(sandbox.name().to_string());
            }
            Network::Loopback => {
                for dest in &args.destinations {
                    let listener = TcpListener::bind((args.listen_ip, 0)).await?;
                    hosted.listeners.insert(*dest, listener.local_addr()?);
                    tunnel.egress().serve_listener(
                        &actor.uid,
                        listener,
                        Destination::Fixed(*dest),
                        cancel.clone(),
                    );
                }
            }
        }
        match args.network {
            Network::Sandbox => tunnel.activate(&actor, Some(egress)).await?,
            // Loopback actors listen on 127.0.0.1; X-Ate-Target-Port picks the port.
            Network::Loopback => {
                let dialer = Box::new(DirectDialer(std::net::Ipv4Addr::LOCALHOST.into()));
                tunnel
                    .activate_with_dialer(&actor, dialer, Some(egress))
                    .await?
            }
        }
        ready.actors.push(hosted);
    }
    println!("{}", serde_json::to_string(&ready)?);
    cancel.cancelled().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{HoldingsConfig, HostArgs};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        host: HostArgs,
    }

    fn parse(extra: &[&str]) -> Result<HostArgs, clap::Error> {
        let base = ["atunnel", "--gateway=gw:443", "--gateway-ca=ca.pem"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.host)
    }

    #[test]
    fn the_flags_defaults_are_the_librarys() {
        use crate::egress::EgressConfig;
        use crate::ingress::IngressConfig;
        let args = parse(&[]).unwrap();
        let (egress, ingress) = (EgressConfig::default(), IngressConfig::default());
        assert_eq!(args.tunnel.socket.options(), egress.socket);
        assert_eq!(args.tunnel.socket.sandbox_options(), egress.sandbox_socket);
        assert_eq!(args.tunnel.socket.options(), ingress.socket);
        assert_eq!(args.tunnel.socket.sandbox_options(), ingress.sandbox_socket);
        assert_eq!(args.tunnel.drain_timeout.0, egress.drain_timeout);
        assert_eq!(args.tunnel.drain_timeout.0, ingress.drain_timeout);
        assert_eq!(args.tunnel.budget.budget(), egress.budget);
        assert_eq!(args.tunnel.budget.holdings(), HoldingsConfig::default());
        assert_eq!(
            args.tunnel.budget.dns_max_in_flight,
            atunnel_dns::RelayConfig::default().max_in_flight
        );
        assert_eq!(args.tunnel.gateway_stream_window, egress.stream_window);
        assert_eq!(args.tunnel.gateway_max_frame_size, egress.max_frame_size);
        assert_eq!(
            args.tunnel.gateway_connection_window,
            egress.connection_window
        );
        assert_eq!(args.tunnel.gateway_idle_timeout.0, egress.pool_idle_timeout);
        assert_eq!(
            args.tunnel.gateway_ping_interval.0,
            egress.pool_ping_interval
        );
        assert_eq!(args.tunnel.gateway_ping_timeout.0, egress.pool_ping_timeout);
        assert_eq!(args.tunnel.hibernate_after.0, ingress.hibernate_after);
        assert_eq!(
            args.tunnel.header_read_timeout.0,
            ingress.header_read_timeout
        );
        assert_eq!(
            args.tunnel.router_ping_interval.0,
            ingress.router_ping_interval
        );
        assert_eq!(
            args.tunnel.router_ping_timeout.0,
            ingress.router_ping_timeout
        );
        assert_eq!(
            args.tunnel.tls_handshake_timeout.0,
            ingress.tls_handshake_timeout
        );
        assert_eq!(args.tunnel.pre_auth.limits(), ingress.pre_auth);
        assert_eq!(args.tunnel.h2_floods.limits(), ingress.h2_floods);
        assert_eq!(args.tunnel.h2_floods.limits(), egress.h2_floods);
        assert_eq!(
            args.tunnel.budget.actor_ping_interval.0,
            ingress.pools.ping_interval
        );
        assert_eq!(
            args.tunnel.budget.actor_ping_timeout.0,
            ingress.pools.ping_timeout
        );
        assert_eq!(
            args.tunnel.budget.actor_response_body_timeout.0,
            ingress.pools.response_body_idle
        );
        assert_eq!(
            args.tunnel.budget.actor_request_body_timeout.0,
            ingress.pools.request_body_idle
        );
        assert_eq!(
            args.tunnel.budget.actor_max_ingress_ports,
            ingress.pools.max_ports
        );
        assert_eq!(
            args.tunnel.budget.actor_max_router_bytes,
            ingress.pools.max_router_bytes
        );
        assert_eq!(
            args.tunnel.budget.actor_max_router_streams,
            ingress.pools.max_router_streams
        );
        assert_eq!(
            args.tunnel.budget.actor_max_ingress_idle,
            ingress.pools.max_idle_per_actor
        );
        assert_eq!(
            args.tunnel.budget.actor_max_buffers,
            ingress.pools.max_buffers
        );
        assert_eq!(args.tunnel.relay.bounds(), ingress.relay);
        assert_eq!(args.tunnel.client_identity, ingress.allowed_client_id);
        assert_eq!(
            args.tunnel.trust_bundle_poll_interval.0,
            ingress.trust_bundle_poll
        );
        let tunnel = crate::tunnel::TunnelConfig::new(
            std::sync::Arc::new(rustls::RootCertStore::empty()),
            std::sync::Arc::new(atunnel_identity::LocalCaSource::new(std::sync::Arc::new(
                atunnel_identity::CertificateAuthority::new("ca").unwrap(),
            ))),
        );
        assert_eq!(args.tunnel.egress_port, tunnel.egress_port);
        assert_eq!(args.tunnel.netns_prefix, tunnel.netns_prefix);
        assert_eq!(!args.tunnel.no_sandbox_ipv6, tunnel.sandbox_ipv6);
        assert_eq!(args.tunnel.pool.pool().stats(), tunnel.pool.stats());
        assert_eq!(args.tunnel.admin.limits(), tunnel.stats_limits);
        assert_eq!(
            args.tunnel.node_agent_timeout.0,
            atunnel_nodeagent::DEFAULT_MINT_TIMEOUT
        );
    }

    #[test]
    fn sandboxes_are_dual_stack_unless_the_flag_or_the_file_says_ipv4_only() {
        assert!(!parse(&[]).expect("parses").tunnel.no_sandbox_ipv6);
        let args = parse(&["--no-sandbox-ipv6"]).expect("parses");
        assert!(args.tunnel.no_sandbox_ipv6);
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("atunnel.toml");
        std::fs::write(&file, "no-sandbox-ipv6 = true\n").expect("write");
        let argv: Vec<std::ffi::OsString> = ["atunnel", "--gateway=gw:443", "--gateway-ca=ca.pem"]
            .iter()
            .map(std::ffi::OsString::from)
            .chain([
                std::ffi::OsString::from("--config"),
                file.clone().into_os_string(),
            ])
            .collect();
        let argv = atunnel_process::config_file::expand(argv, 1).expect("the file expands");
        let cli = Cli::try_parse_from(argv).expect("parses");
        assert!(
            cli.host.tunnel.no_sandbox_ipv6,
            "the file's key is the flag's"
        );
    }

    #[test]
    fn an_empty_resolv_conf_serves_no_dns() {
        let args = parse(&["--resolv-conf="]).expect("an empty path parses");
        assert!(args.tunnel.resolv_conf.as_os_str().is_empty());
        let args = parse(&["--resolv-conf", ""]).expect("an empty path parses");
        assert!(args.tunnel.resolv_conf.as_os_str().is_empty());
    }

    #[test]
    fn ingress_listens_on_443_and_8443_once_it_has_a_credential() {
        let off = parse(&[]).unwrap();
        assert!(
            off.tunnel.credential_bundle.is_none(),
            "ingress is off by default"
        );
        let on = parse(&["--credential-bundle=b.pem", "--trust-bundle=t.pem"]).unwrap();
        assert!(on.tunnel.credential_bundle.is_some());
        assert_eq!(on.tunnel.ingress_https, "0.0.0.0:443".parse().unwrap());
        assert_eq!(on.tunnel.ingress_connect, "0.0.0.0:8443".parse().unwrap());
        let moved = parse(&[
            "--credential-bundle=b.pem",
            "--trust-bundle=t.pem",
            "--ingress-https=127.0.0.1:9443",
            "--ingress-connect=127.0.0.1:9444",
        ])
        .unwrap();
        assert_eq!(
            moved.tunnel.ingress_https,
            "127.0.0.1:9443".parse().unwrap()
        );
        assert_eq!(
            moved.tunnel.ingress_connect,
            "127.0.0.1:9444".parse().unwrap()
        );
        // The router is trusted through the trust bundle; without it ingress
        // could not check the router, so the flag alone is refused.
        assert!(parse(&["--credential-bundle=b.pem"]).is_err());
    }
}
