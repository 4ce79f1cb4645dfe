//! The bench's `sink` process: the gateway whose far end is the sink
//! (`sink`), and, when asked, the same services over TLS without a tunnel
//! (`sink_tls`, the far end of the bench's TCP -> TLS relay peer).

use crate::sink::{Service, SinkConfig};
use crate::sink_tls;

/// The bench's `sink` role: a gateway whose far end is this sink.
#[derive(clap::Args, Clone, Debug)]
pub struct SinkArgs {
    #[command(flatten)]
    pub gateway: atunnel_gateway::cli::GatewayArgs,
    /// Bytes the source service (port 19) sends per tunnel.
    #[arg(long, default_value_t = SinkConfig::default().source_bytes)]
    pub source_bytes: u64,
    /// Body bytes of each HTTP response (port 80).
    #[arg(long, default_value_t = SinkConfig::default().http_body_bytes)]
    pub http_body_bytes: usize,
    /// Service for ports without one (default: refuse with 403).
    #[arg(long, value_enum)]
    pub other_ports: Option<Service>,
    /// Also serve each service over TLS, without a tunnel, on the listen
    /// address at its port plus this offset (`sink_tls`: the far end of
    /// the bench's TCP -> TLS relay); off unless given.
    #[arg(long)]
    pub tls_services_port_offset: Option<u16>,
}

/// Runs the sink gateway until `cancel`; prints `listening <addr>` once bound.
pub async fn run(
    args: SinkArgs,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let sink = SinkConfig {
        source_bytes: args.source_bytes,
        http_body_bytes: args.http_body_bytes,
        other_ports: args.other_ports,
    };
    let Some(offset) = args.tls_services_port_offset else {
        return atunnel_gateway::cli::run(&args.gateway, sink, cancel).await;
    };
    let listeners = sink_tls::bind(args.gateway.listen.ip(), offset)?;
    let tls = sink_tls::server_config(&args.gateway.cert, &args.gateway.key)?;
    let services = sink_tls::spawn(listeners, tls, sink, cancel.clone())?;
    let result = atunnel_gateway::cli::run(&args.gateway, sink, cancel.clone()).await;
    cancel.cancel();
    services.tasks.wait().await;
    // Whether the relay resumed its sessions, for the run's log.
    eprintln!(
        "sink: TLS services: {} full handshakes, {} resumed",
        services.handshakes.full(),
        services.handshakes.resumed()
    );
    result
}
