//! `atunnel gateway` (and the bench's `sink`): the gateway as a process.

use std::net::SocketAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use super::sink::SinkConfig;
use super::{GatewayConfig, Mode};
use crate::config::{PoolArgs, SocketArgs, load_certs, load_key};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// Dial each tunnel's destination if --allow contains it.
    Forward,
    /// Answer tunnels by destination port without dialing (bench mode).
    Sink,
}

#[derive(clap::Args, Clone, Debug)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:443")]
    pub listen: SocketAddr,
    /// Server certificate chain (PEM).
    #[arg(long)]
    pub cert: PathBuf,
    /// Server private key (PEM).
    #[arg(long)]
    pub key: PathBuf,
    /// CA certificates that sign actor certificates (PEM).
    #[arg(long)]
    pub actor_ca: PathBuf,
    /// What to do with an authorised tunnel.
    #[arg(long, value_enum, default_value = "forward")]
    pub mode: ModeArg,
    /// Destination CIDR allowed in forward mode (repeatable; default: none).
    #[arg(long)]
    pub allow: Vec<IpNet>,
    /// ALPN protocols offered, comma separated ("http/1.1" alone acts like the Envoy gateway).
    #[arg(long, default_value = "h2,http/1.1", value_delimiter = ',')]
    pub alpn: Vec<String>,
    /// HTTP/2 streams one connection may carry at once.
    #[arg(long, default_value_t = 1000)]
    pub max_concurrent_streams: u32,
    /// Sink mode: bytes the source service (port 19) sends per tunnel.
    #[arg(long, default_value_t = 1 << 30)]
    pub source_bytes: u64,
    /// Sink mode: body bytes of each HTTP response (port 80).
    #[arg(long, default_value_t = 64)]
    pub http_body_bytes: usize,
    /// Sink mode: service for ports without one (default: refuse with 403).
    #[arg(long, value_enum)]
    pub other_ports: Option<super::sink::Service>,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// Runs the gateway until `cancel`. Prints `listening <addr>` once bound.
pub async fn run(args: GatewayArgs, cancel: CancellationToken) -> Result<(), crate::BoxError> {
    let mode = match args.mode {
        ModeArg::Forward => Mode::Forward {
            allow: args.allow.clone(),
        },
        ModeArg::Sink => Mode::Sink(SinkConfig {
            source_bytes: args.source_bytes,
            http_body_bytes: args.http_body_bytes,
            other_ports: args.other_ports,
        }),
    };
    let mut cfg = GatewayConfig::new(
        load_certs(&args.cert)?,
        load_key(&args.key)?,
        load_certs(&args.actor_ca)?,
        mode,
    );
    cfg.alpn = args.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg.max_concurrent_streams = args.max_concurrent_streams;
    cfg.socket = args.socket.options();
    let gateway = super::new(cfg, args.pool.pool())?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening {}", listener.local_addr()?);
    gateway.serve(listener, cancel).await;
    Ok(())
}
