//! `atunnel-bench worker`: what a worker node runs around atunnel. It gives
//! atunnel a cgroup of its own (CPU quota, memory limit, no swap), serves
//! actor certificates as the node agent does, starts atunnel as a daemon
//! (`atunnel serve`, the `serve` role) inside the cgroup and brings each
//! actor up over atunnel's control API as a real worker does (prepare
//! egress, serve sandbox, activate), starts the actors' programs (the
//! `actors` role) in the sandboxes, and starts fresh ones by itself whenever
//! atunnel dies, logging how it died (exit status and the cgroup's OOM-kill
//! counter).
//!
//! The load generator drives it over a Unix socket: one JSON request line
//! in, one JSON reply line out, any number per connection.
//!
//! ```text
//! {"op":"status"}                          -> {"ok":true,"status":{...}}
//! {"op":"status","wait_generation":0}      -> once no restart is in progress
//! {"op":"status","wait_generation":3}      -> once the 3rd atunnel runs
//! {"op":"restart","tunnel_args":["--tcp-notsent-lowat=-1"]}
//!                                          -> once the fresh atunnel is ready
//! {"op":"restart","contender":"nginx"}     -> once nginx serves in atunnel's place
//! {"op":"deactivate","actor":2}            -> once atunnel deactivated actor-2
//! {"op":"activate","actor":2}              -> once it is prepared and active again
//! anything else                            -> {"ok":false,"error":"..."}
//! ```
//!
//! `status` is [`WorkerStatus`]: what atunnel serves and the actors hosted
//! (the shape `atunnel host` prints), the pids, the cgroup's directories
//! (the load generator samples them itself), and the deaths and restarts so
//! far.
//!
//! A restart may name a contender other than atunnel (`peers.rs`: nginx or
//! HAProxy). It runs in atunnel's place: the same cgroup, listening on
//! atunnel's ingress HTTPS address with the worker's serving certificate,
//! its configuration written to the peers folder and started from there.
//! For HAProxy the worker builds each actor's sandbox itself as atunnel
//! does (the same names, `SandboxNetwork` with its veth and nftables
//! rules), the actors' program serves inside them, and HAProxy reaches
//! them from each sandbox's gateway side and relays their egress over TLS
//! to the sink's TLS services. nginx cannot enter a namespace, so the
//! actors' program serves the same actors on 127.0.0.1 in the worker's
//! namespace for it (one port each). `ready` is then empty (no /stats) and
//! `peer` says what runs and which sandboxes it uses. A peer that dies is
//! restarted as atunnel is.

mod control;
mod protocol;
mod supervisor;

use control::*;
pub use protocol::*;
use supervisor::*;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atunnel::control::daemon::ServeReady;
use atunnel::control::proto;
use atunnel::host::{HostReady, HostedActor};
use atunnel_bench::peers::{Backend, Contender, EgressRelay, Peer, PeerSetup};
use atunnel_host::CgroupDirs;
use atunnel_measure::cgroup::{Cgroup, Limits};
use atunnel_sandbox::{NsExecutor, SandboxNetwork};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::control::Control;
use crate::pki::{self, PkiFiles};
use crate::role::{self, Role, arg};
use crate::topology::{SINK_ADDR, WORKER_LOAD_SIDE};

/// How long a client waits for a reply that needs a fresh atunnel (each
/// role gets 60 s to become ready; atunnel and the actors are two).
pub const START_TIMEOUT: Duration = Duration::from_secs(150);

#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// Unix socket the control interface listens on.
    #[arg(long)]
    pub control: PathBuf,
    /// PKI folder (as `atunnel-bench pki` writes it).
    #[arg(long)]
    pub pki: PathBuf,
    /// Unix socket the fake node agent serves actor certificates on.
    #[arg(long)]
    pub node_agent_socket: PathBuf,
    /// Actors hosted (each with a sandbox, an ingress actor and egress).
    #[arg(long, default_value_t = 4)]
    pub actors: usize,
    /// atunnel's CPU quota, in cores.
    #[arg(long, default_value_t = 1.0)]
    pub tunnel_cpus: f64,
    /// atunnel's memory limit, in MiB (no swap).
    #[arg(long, default_value_t = 1024)]
    pub tunnel_memory_mib: u64,
    /// atunnel's cgroup, below this process's own (default:
    /// atunnel-bench-<pid>/tunnel).
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Prefix of the sandboxes' namespace names.
    #[arg(long, default_value = "atb-s-")]
    pub netns_prefix: String,
    /// Egress gateway atunnel uses (a restart's `--gateway=` replaces it).
    #[arg(long, default_value_t = SocketAddr::from((SINK_ADDR, 443)))]
    pub gateway: SocketAddr,
    /// Where atunnel serves /stats.
    #[arg(long, default_value_t = SocketAddr::from((WORKER_LOAD_SIDE, 9100)))]
    pub stats: SocketAddr,
    /// atunnel's router-facing HTTPS listener.
    #[arg(long, default_value_t = SocketAddr::from((WORKER_LOAD_SIDE, 443)))]
    pub ingress_https: SocketAddr,
    /// atunnel's router-facing CONNECT listener.
    #[arg(long, default_value_t = SocketAddr::from((WORKER_LOAD_SIDE, 8443)))]
    pub ingress_connect: SocketAddr,
    /// An extra flag for every atunnel, `--name=value` (repeatable); it
    /// replaces the worker's own flag of that name.
    #[arg(long, allow_hyphen_values = true)]
    pub tunnel_arg: Vec<String>,
    /// Folder a peer's configuration is written to (default: `peers`
    /// beside the control socket, in the run folder).
    #[arg(long)]
    pub peers_dir: Option<PathBuf>,
}

/// Actor number `i`, named as `atunnel host` names its actors.
fn actor(i: usize) -> proto::Actor {
    proto::Actor {
        atespace: "bench".into(),
        name: format!("actor-{i}"),
        uid: format!("uid-{i}"),
    }
}

/// `--name` of `--name=value`.
fn flag_name(arg: &str) -> &str {
    arg.split_once('=').map_or(arg, |(name, _)| name)
}

/// The flags of `layers` in order, a flag in a later layer replacing every
/// earlier one of the same name (clap refuses most flags given twice).
pub fn layered(layers: &[&[String]]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for layer in layers {
        let names: HashSet<&str> = layer.iter().map(|a| flag_name(a)).collect();
        out.retain(|a| !names.contains(flag_name(a)));
        out.extend(layer.iter().cloned());
    }
    out
}

/// Serves actor certificates on `socket` as atelet would: mutual TLS with
/// the worker's pod certificate, signed with the actor CA.
async fn start_node_agent(
    pki: &PkiFiles,
    socket: &Path,
) -> Result<atunnel_nodeagent::FakeNodeAgentHandle, atunnel_process::BoxError> {
    use atunnel_identity::pem_files::{load_certs, load_key};
    let ca = atunnel_identity::pki::CertificateAuthority::from_pem(
        &std::fs::read_to_string(pki.actor_ca_cert())?,
        &std::fs::read_to_string(pki.actor_ca_key())?,
    )?;
    let tls = atunnel_nodeagent::FakeAgentTls {
        server_chain: load_certs(&pki.atelet_cert())?,
        server_key: load_key(&pki.atelet_key())?,
        client_roots: load_certs(&pki.pod_ca())?,
        allowed_client_id: atunnel_identity::pki::WORKER_SPIFFE_ID.to_string(),
    };
    Ok(atunnel_nodeagent::FakeNodeAgent::spawn(socket, tls, std::sync::Arc::new(ca)).await?)
}

/// Runs the worker until `cancel`, then stops atunnel, the actors and the
/// node agent and removes the cgroup.
pub async fn run(
    args: WorkerArgs,
    cancel: CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let name = args
        .cgroup
        .clone()
        .unwrap_or_else(|| format!("atunnel-bench-{}/tunnel", std::process::id()));
    let limits = Limits {
        cpus: args.tunnel_cpus,
        memory_bytes: args.tunnel_memory_mib << 20,
    };
    let cgroup = Cgroup::create(&name, &limits)?;
    let pki = PkiFiles {
        dir: args.pki.clone(),
    };
    let agent = start_node_agent(&pki, &args.node_agent_socket).await?;
    let result = serve(args, pki, cgroup, limits, &cancel).await;
    agent.shutdown().await;
    result
}

async fn serve(
    args: WorkerArgs,
    pki: PkiFiles,
    cgroup: Cgroup,
    limits: Limits,
    cancel: &CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let listener = bind_control(&args.control)?;
    let status = WorkerStatus {
        state: TunnelState::Starting,
        error: None,
        ready: None,
        atunnel_control: None,
        gateway: None,
        tunnel_pid: None,
        actors_pid: None,
        cgroup: cgroup.dirs().clone(),
        cpus: limits.cpus,
        memory_bytes: limits.memory_bytes,
        base_args: args.tunnel_arg.clone(),
        extra_args: Vec::new(),
        generation: 0,
        deaths: 0,
        restarts: 0,
        events: Vec::new(),
        inactive_actors: BTreeSet::new(),
        contender: Contender::Atunnel,
        peer: None,
        wrapper: Vec::new(),
    };
    let (publish, watch) = watch::channel(status.clone());
    let control = args.control.clone();
    let mut sup = Supervisor {
        args,
        pki,
        cgroup,
        tunnel: None,
        control: None,
        actors: None,
        exec: None,
        peer_sandboxes: Vec::new(),
        status,
        publish,
    };
    // The first atunnel must start; later failures are reported, not fatal.
    let first = tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        r = sup.start() => r,
    };
    let result = match first {
        Err(e) => Err(e),
        Ok(()) if cancel.is_cancelled() => Ok(()),
        Ok(()) => {
            sup.publish();
            println!("{}", serde_json::to_string(&sup.status)?);
            let (commands, rx) = mpsc::channel(8);
            tokio::spawn(serve_control(listener, watch, commands, cancel.clone()));
            sup.supervise(rx, cancel).await;
            Ok(())
        }
    };
    sup.stop_children().await;
    let _ = std::fs::remove_file(&control);
    if let Err(e) = sup.cgroup.remove() {
        eprintln!("atunnel-bench worker: removing the cgroup: {e}");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn later_flags_replace_earlier_ones_of_the_same_name() {
        let own = strings(&["--gateway=a:443", "--gateway-name=g", "--network=sandbox"]);
        let base = strings(&["--tcp-notsent-lowat=1"]);
        let extra = strings(&["--gateway=b:4443", "--tcp-notsent-lowat=-1"]);
        assert_eq!(
            layered(&[&own, &base, &extra]),
            strings(&[
                "--gateway-name=g",
                "--network=sandbox",
                "--gateway=b:4443",
                "--tcp-notsent-lowat=-1",
            ])
        );
        assert_eq!(layered(&[&own, &[], &[]]), own);
    }

    #[test]
    fn the_gateway_flags_become_prepare_egress_arguments() {
        let flags = strings(&[
            "--control-socket=/tmp/a.sock",
            "--gateway=10.0.0.1:443",
            "--gateway-name=gw",
            "--tcp-notsent-lowat=-1",
        ]);
        let (rest, gateway) = split_gateway(flags).expect("splits");
        assert_eq!(
            rest,
            strings(&["--control-socket=/tmp/a.sock", "--tcp-notsent-lowat=-1"])
        );
        assert_eq!(gateway.address, "10.0.0.1:443");
        assert_eq!(gateway.server_name, "gw");
        assert!(split_gateway(strings(&["--gateway", "x:1"])).is_err());
        assert!(split_gateway(strings(&["--gateway-name=gw"])).is_err());
    }

    #[test]
    fn a_peers_sandboxes_are_shaped_as_atunnels_by_the_same_flags() {
        assert_eq!(sandbox_shape(&[]).expect("defaults"), (15001, true));
        assert_eq!(
            sandbox_shape(&strings(&["--egress-port=16000", "--no-sandbox-ipv6"])).expect("named"),
            (16000, false)
        );
        assert!(sandbox_shape(&strings(&["--egress-port=x"])).is_err());
    }

    #[test]
    fn requests_parse_and_bad_ones_are_refused() {
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"status"}"#).expect("status"),
            Request::Status {
                wait_generation: None
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(
                r#"{"op":"restart","tunnel_args":["--tcp-notsent-lowat=-1"]}"#
            )
            .expect("restart"),
            Request::Restart {
                tunnel_args: strings(&["--tcp-notsent-lowat=-1"]),
                contender: Contender::Atunnel,
                wrapper: Vec::new(),
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"restart","contender":"haproxy"}"#)
                .expect("restart as a peer"),
            Request::Restart {
                tunnel_args: Vec::new(),
                contender: Contender::Haproxy,
                wrapper: Vec::new(),
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"deactivate","actor":3}"#)
                .expect("deactivate"),
            Request::Deactivate { actor: 3 }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"activate","actor":0}"#).expect("activate"),
            Request::Activate { actor: 0 }
        );
        for bad in [
            r#"{"op":"deactivate"}"#,
            r#"{"op":"activate","actor":-1}"#,
            r#"{"op":"reboot"}"#,
            r#"{"op":"restart","contender":"envoy"}"#,
            "status",
            r#"{"op":"status","wait_generation":-1}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}
