//! `atunnel serve`: the tunnel as a daemon beside the worker. It takes the
//! same tunnel flags as `atunnel host` but hosts no actors of its own: the
//! worker brings each one over the control API.

use std::net::SocketAddr;
use std::path::PathBuf;

use atunnel_process::BoxError;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::ControlArgs;
use super::listener::{ControlSocket, serve};
use super::service::ControlService;
use crate::host::TunnelArgs;
use crate::tunnel::Tunnel;

#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    #[command(flatten)]
    pub tunnel: TunnelArgs,
}

/// Printed as one JSON line once the control socket accepts calls.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeReady {
    pub control_socket: PathBuf,
    pub stats: SocketAddr,
    /// Ingress HTTPS and CONNECT addresses, when ingress is on.
    pub ingress: Option<(SocketAddr, SocketAddr)>,
}

/// Serves the control API until `cancel`, then stops taking calls while it
/// drains the tunnel (bounded by the drain timeout), and closes every sandbox.
pub async fn run(args: ServeArgs, cancel: CancellationToken) -> Result<(), BoxError> {
    let control = args.control.config();
    let tunnel = Tunnel::start(args.tunnel.config(true)?).await?;
    tokio::spawn(tunnel.clone().reload_tls_on_sighup(cancel.clone()));
    let socket = match ControlSocket::bind(&control).await {
        Ok(s) => s,
        Err(e) => {
            tunnel.shutdown().await;
            return Err(e.into());
        }
    };
    let ready = ServeReady {
        control_socket: socket.path().to_path_buf(),
        stats: tunnel.stats_addr().expect("asked for /stats"),
        ingress: tunnel.ingress().map(|(_, https, connect)| (https, connect)),
    };
    println!("{}", serde_json::to_string(&ready)?);
    let service = ControlService::new(
        tunnel.clone(),
        &args.tunnel.netns_prefix,
        control.call_timeout,
    );
    // The drain starts with the stop signal, beside the control API's own
    // stop (which lets open calls finish): one after the other, they would
    // add up against the supervisor's grace period.
    let drain = args.tunnel.drain_timeout.0;
    let draining = async {
        cancel.cancelled().await;
        if !tunnel.drain(drain).await {
            tracing::info!(after = ?drain, "drain timed out; ending what is still open");
        }
    };
    let (result, ()) = tokio::join!(serve(socket, service, &control, cancel.clone()), draining);
    tunnel.shutdown().await;
    Ok(result?)
}
