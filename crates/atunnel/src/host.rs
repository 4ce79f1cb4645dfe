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

use crate::config::{PoolArgs, SocketArgs, load_certs, load_key, load_roots};
use crate::egress::{Destination, EgressConfig};
use crate::ingress::IngressConfig;
use crate::ingress::routes::{DirectDialer, PoolSettings};
use crate::stats::StatsSource;
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
    /// CA certificates that sign the gateway's certificate (PEM).
    #[arg(long)]
    pub gateway_ca: PathBuf,
    /// Node agent's Unix socket; actor certificates are minted there.
    #[arg(long, conflicts_with_all = ["actor_ca_cert", "actor_ca_key"])]
    pub node_agent_socket: Option<PathBuf>,
    /// With --node-agent-socket: this worker's certificate chain (PEM).
    #[arg(long, requires = "node_agent_socket")]
    pub worker_cert: Option<PathBuf>,
    /// With --node-agent-socket: this worker's private key (PEM).
    #[arg(long, requires = "node_agent_socket")]
    pub worker_key: Option<PathBuf>,
    /// CAs that sign the router's (ingress) and the node agent's certificates (PEM).
    #[arg(long)]
    pub trust_bundle: Option<PathBuf>,
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
    #[arg(long, default_value = crate::ingress::ROUTER_SPIFFE_ID)]
    pub client_identity: String,
    /// Without a node agent: actor CA certificate (PEM) to mint locally with.
    #[arg(long, requires = "actor_ca_key")]
    pub actor_ca_cert: Option<PathBuf>,
    /// Without a node agent: actor CA private key (PEM).
    #[arg(long, requires = "actor_ca_cert")]
    pub actor_ca_key: Option<PathBuf>,
    /// Prefix of sandbox namespace names.
    #[arg(long, default_value = "atn-")]
    pub netns_prefix: String,
    /// Egress port the sandbox redirect uses.
    #[arg(long, default_value_t = 15001)]
    pub egress_port: u16,
    /// resolv.conf whose nameservers the sandboxes' DNS relay forwards to ("" serves no DNS).
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Loopback network: address the egress listeners bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_ip: IpAddr,
    /// Loopback network: destinations, comma separated (one listener each per actor).
    #[arg(long, value_delimiter = ',')]
    pub destinations: Vec<SocketAddr>,
    /// How egress tunnels copy bytes (naive: the reference's design, for comparison).
    #[arg(long, value_enum, default_value = "lean")]
    pub copy_mode: crate::naive_copy::CopyMode,
    /// Egress: wait for an actor's data with a buffer this size held per
    /// tunnel (0: readiness, no buffer; the reference used 512).
    #[arg(long, default_value_t = 0)]
    pub wait_buffer: usize,
    /// Idle time after which an ingress connection drops its rustls session
    /// for its traffic keys and, over HTTP/1.1, hyper's buffers until its
    /// next byte ("15s", "100ms"; 0 never).
    #[arg(long, default_value = "15s", value_parser = crate::config::parse_duration)]
    pub hibernate_after: std::time::Duration,
    /// Where /stats is served.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub stats: SocketAddr,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
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

fn cert_source(args: &HostArgs) -> Result<Arc<dyn CertificateSource>, crate::BoxError> {
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
pub async fn run(args: HostArgs, cancel: CancellationToken) -> Result<(), crate::BoxError> {
    if args.network == Network::Loopback && args.destinations.is_empty() {
        return Err(HostError::NoDestinations.into());
    }
    let mut cfg = TunnelConfig::new(Arc::new(load_roots(&args.gateway_ca)?), cert_source(&args)?);
    cfg.pool = args.pool.pool();
    cfg.egress = EgressConfig {
        socket: args.socket.options(),
        sandbox_socket: args.socket.sandbox_options(),
        copy_mode: args.copy_mode,
        wait_buffer: args.wait_buffer,
        ..EgressConfig::default()
    };
    cfg.egress_port = args.egress_port;
    cfg.netns_prefix = args.netns_prefix.clone();
    if let (Some(bundle), Some(trust)) = (&args.credential_bundle, &args.trust_bundle) {
        cfg.ingress = Some(IngressListen {
            config: IngressConfig {
                credential_bundle: bundle.clone(),
                trust_bundle: trust.clone(),
                allowed_client_id: args.client_identity.clone(),
                pools: PoolSettings::default(),
                socket: args.socket.options(),
                sandbox_socket: args.socket.sandbox_options(),
                drain_timeout: crate::egress::DEFAULT_DRAIN_TIMEOUT,
                hibernate_after: args.hibernate_after,
                header_read_timeout: crate::ingress::https::HEADER_READ_TIMEOUT,
            },
            https: args.ingress_https,
            connect: args.ingress_connect,
        });
    }
    if args.network == Network::Sandbox && !args.resolv_conf.as_os_str().is_empty() {
        cfg.dns = Some(atunnel_dns::RelayConfig {
            upstreams: atunnel_dns::resolvers_from_resolv_conf(&args.resolv_conf)?,
            ..atunnel_dns::RelayConfig::default()
        });
    }
    let tunnel = Tunnel::start(cfg).await?;
    let stats = crate::stats::spawn(
        args.stats,
        Arc::new(StatsSource {
            pool: tunnel.pool().clone(),
            egress: Some(tunnel.egress().clone()),
            ingress: tunnel.ingress().map(|(i, _, _)| i.clone()),
        }),
        cancel.clone(),
    )
    .await?;
    let result = host_actors(&args, &tunnel, stats, &cancel).await;
    tunnel.shutdown().await;
    result
}

async fn host_actors(
    args: &HostArgs,
    tunnel: &Arc<Tunnel>,
    stats: SocketAddr,
    cancel: &CancellationToken,
) -> Result<(), crate::BoxError> {
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

    use super::HostArgs;

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
    fn ingress_listens_on_443_and_8443_once_it_has_a_credential() {
        let off = parse(&[]).unwrap();
        assert!(off.credential_bundle.is_none(), "ingress is off by default");
        let on = parse(&["--credential-bundle=b.pem", "--trust-bundle=t.pem"]).unwrap();
        assert!(on.credential_bundle.is_some());
        assert_eq!(on.ingress_https, "0.0.0.0:443".parse().unwrap());
        assert_eq!(on.ingress_connect, "0.0.0.0:8443".parse().unwrap());
        let moved = parse(&[
            "--credential-bundle=b.pem",
            "--trust-bundle=t.pem",
            "--ingress-https=127.0.0.1:9443",
            "--ingress-connect=127.0.0.1:9444",
        ])
        .unwrap();
        assert_eq!(moved.ingress_https, "127.0.0.1:9443".parse().unwrap());
        assert_eq!(moved.ingress_connect, "127.0.0.1:9444".parse().unwrap());
        // The router is trusted through the trust bundle; without it ingress
        // could not check the router, so the flag alone is refused.
        assert!(parse(&["--credential-bundle=b.pem"]).is_err());
    }
}
