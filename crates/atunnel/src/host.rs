//! Hosting actors without a worker: atunnel makes the worker's calls itself
//! for N actors, so the `atunnel` binary and the bench's `tunnel` role run the
//! same code a worker drives.
//!
//! Until sandboxes exist, each actor's egress listeners are loopback sockets,
//! one per destination (a listener not behind a redirect has no original
//! destination, so each carries a fixed one), and certificates come from a
//! local CA.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use atunnel_identity::cert_source::LocalCaSource;
use atunnel_identity::identity::ActorRef;
use atunnel_identity::pki::CertificateAuthority;
use rustls::pki_types::ServerName;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::{PoolArgs, SocketArgs, load_roots};
use crate::egress::{ActorEgress, Destination, Egress, EgressConfig};
use crate::gateway_client::GatewayClientConfig;
use crate::stats::StatsSource;

#[derive(clap::Args, Clone, Debug)]
pub struct HostArgs {
    /// Number of actors to host (named actor-0, actor-1, ... in atespace "bench").
    #[arg(long, default_value_t = 1)]
    pub actors: usize,
    /// Egress gateway address (IP:port).
    #[arg(long)]
    pub gateway: SocketAddr,
    /// Name the gateway's certificate must carry.
    #[arg(long, default_value = "atenet-egress.ate-system.svc")]
    pub gateway_name: String,
    /// CA certificates that sign the gateway's certificate (PEM).
    #[arg(long)]
    pub gateway_ca: PathBuf,
    /// Actor CA certificate (PEM); actor certificates are minted locally with it.
    #[arg(long)]
    pub actor_ca_cert: PathBuf,
    /// Actor CA private key (PEM).
    #[arg(long)]
    pub actor_ca_key: PathBuf,
    /// Address the loopback egress listeners bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_ip: IpAddr,
    /// Destinations, comma separated: each actor gets one listener per destination.
    #[arg(long, value_delimiter = ',', required = true)]
    pub destinations: Vec<SocketAddr>,
    /// Where /stats is served.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub stats: SocketAddr,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// Printed as one JSON line once every actor is active.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct HostReady {
    pub stats: SocketAddr,
    /// Per actor: destination -> listener address.
    pub actors: Vec<BTreeMap<SocketAddr, SocketAddr>>,
}

/// Hosts the actors until `cancel`, then deactivates them.
pub async fn run(args: HostArgs, cancel: CancellationToken) -> Result<(), crate::BoxError> {
    let roots = Arc::new(load_roots(&args.gateway_ca)?);
    let ca = CertificateAuthority::from_pem(
        &std::fs::read_to_string(&args.actor_ca_cert)?,
        &std::fs::read_to_string(&args.actor_ca_key)?,
    )?;
    let source = Arc::new(LocalCaSource::new(Arc::new(ca)));
    let server_name = ServerName::try_from(args.gateway_name.clone())?;
    let pool = args.pool.pool();
    let socket = args.socket.options();
    let egress = Egress::new(
        EgressConfig {
            socket,
            ..EgressConfig::default()
        },
        pool.clone(),
    );
    let stats = crate::stats::spawn(
        args.stats,
        Arc::new(StatsSource {
            pool,
            egress: Some(egress.clone()),
        }),
        cancel.clone(),
    )
    .await?;
    let mut ready = HostReady {
        stats,
        actors: Vec::new(),
    };
    let mut uids = Vec::new();
    for i in 0..args.actors {
        let actor = ActorRef::new("bench", format!("actor-{i}"), format!("uid-{i}"))?;
        let mut gateway =
            GatewayClientConfig::new(args.gateway, server_name.clone(), roots.clone());
        gateway.socket = socket;
        let prepared =
            ActorEgress::prepare(actor.clone(), gateway, source.clone(), Clock::new()).await?;
        let mut listeners = BTreeMap::new();
        for dest in &args.destinations {
            let listener = TcpListener::bind((args.listen_ip, 0)).await?;
            listeners.insert(*dest, listener.local_addr()?);
            egress.serve_listener(
                &actor.uid,
                listener,
                Destination::Fixed(*dest),
                cancel.clone(),
            );
        }
        egress.activate(&actor.uid, prepared)?;
        ready.actors.push(listeners);
        uids.push(actor.uid);
    }
    println!("{}", serde_json::to_string(&ready)?);
    cancel.cancelled().await;
    egress.shutdown().await;
    Ok(())
}
