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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atunnel::control::daemon::ServeReady;
use atunnel::control::proto;
use atunnel::host::{HostReady, HostedActor};
use atunnel_bench::cgroup::{Cgroup, Limits};
use atunnel_bench::peers::{Backend, Contender, EgressRelay, Peer, PeerSetup};
use atunnel_host::CgroupDirs;
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

/// Longest request line the control socket reads.
const MAX_REQUEST: u64 = 64 * 1024;

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

/// A request on the control socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// The status now; with `wait_generation`, once an atunnel of at least
    /// that generation is running or the worker failed to start one (`0`
    /// waits out a restart in progress).
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_generation: Option<u64>,
    },
    /// Stops atunnel and the actors and starts fresh ones with
    /// `tunnel_args` on top of the worker's flags (a flag named here
    /// replaces the worker's: `--gateway=...` points the actors' egress
    /// elsewhere); replies once they are ready. An empty list returns to
    /// the defaults.
    Restart {
        #[serde(default)]
        tunnel_args: Vec<String>,
        /// What runs in atunnel's place (atunnel when not named); a peer
        /// takes no `tunnel_args`.
        #[serde(default)]
        contender: Contender,
        /// A command the contender runs under (`valgrind --tool=callgrind
        /// ...` for the cost scenario's instruction pass); none when empty.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        wrapper: Vec<String>,
    },
    /// Deactivates actor number `actor` (its tunnels cut, its requests
    /// cancelled, as the worker does when an actor stops); replies once
    /// atunnel is done.
    Deactivate { actor: usize },
    /// Prepares actor number `actor`'s egress afresh and activates it;
    /// replies once it is active.
    Activate { actor: usize },
}

/// The reply to one request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkerStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    fn status(status: WorkerStatus) -> Self {
        Self {
            ok: true,
            status: Some(status),
            error: None,
        }
    }

    fn error(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            status: None,
            error: Some(error.into()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TunnelState {
    /// A fresh atunnel (and actors) are being started.
    Starting,
    Running,
    /// The last start failed (see `error`); a restart request tries again.
    Failed,
}

/// What the worker is running, as the control socket reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub state: TunnelState,
    /// Why the last start failed.
    pub error: Option<String>,
    /// What atunnel serves and the actors hosted, while it runs.
    pub ready: Option<HostReady>,
    /// atunnel's control API socket while it runs (a scenario may bring
    /// actors of its own up through it).
    #[serde(default)]
    pub atunnel_control: Option<PathBuf>,
    /// The gateway (address, server name) the actors' egress is prepared
    /// for, while atunnel runs.
    #[serde(default)]
    pub gateway: Option<(String, String)>,
    pub tunnel_pid: Option<u32>,
    pub actors_pid: Option<u32>,
    /// atunnel's cgroup, for whoever samples it.
    pub cgroup: CgroupDirs,
    /// The cgroup's CPU quota, in cores.
    pub cpus: f64,
    /// The cgroup's memory limit, in bytes.
    pub memory_bytes: u64,
    /// Flags every atunnel runs with (`--tunnel-arg`).
    pub base_args: Vec<String>,
    /// Flags the current atunnel runs with on top (the last restart's).
    pub extra_args: Vec<String>,
    /// atunnels started so far (1 once the first is running).
    pub generation: u64,
    /// Times atunnel died without being asked to (each replaced at once).
    pub deaths: u64,
    /// Restarts asked for over the control socket.
    pub restarts: u64,
    /// How each death happened, in order.
    pub events: Vec<String>,
    /// Actors (by number) deactivated over the control socket and not
    /// activated since; a fresh atunnel activates them all.
    #[serde(default)]
    pub inactive_actors: BTreeSet<usize>,
    /// What runs in atunnel's place: atunnel unless a restart named a peer.
    #[serde(default)]
    pub contender: Contender,
    /// The peer running in atunnel's place, while one runs.
    #[serde(default)]
    pub peer: Option<PeerRunning>,
    /// The command the contender runs under (the last restart's); empty
    /// when it runs as it is.
    #[serde(default)]
    pub wrapper: Vec<String>,
}

/// A peer serving in atunnel's place (`tunnel_pid` is its process).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerRunning {
    /// Its configuration, in the peers folder.
    pub config: PathBuf,
    /// Where it serves the router (atunnel's ingress HTTPS address).
    pub listen: SocketAddr,
    /// Each actor's `ate-target-actor` value and the server it is routed to
    /// (on loopback, or in its sandbox).
    pub backends: Vec<Backend>,
    /// The actors' runtime namespaces (sandboxes the worker built for the
    /// peer, as atunnel builds them); empty when it reaches them on
    /// loopback.
    #[serde(default)]
    pub sandboxes: Vec<String>,
}

impl WorkerStatus {
    /// atunnel's ready line.
    pub fn host_ready(&self) -> Result<&HostReady, atunnel_process::BoxError> {
        Ok(self.ready.as_ref().ok_or("atunnel is not running")?)
    }
}

/// Talks to a worker's control socket: one connection per request.
#[derive(Clone, Debug)]
pub struct WorkerClient {
    socket: PathBuf,
}

impl WorkerClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
        }
    }

    /// Sends `request`; its status, or the worker's error.
    pub async fn call(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<WorkerStatus, atunnel_process::BoxError> {
        let exchange = async {
            let mut conn = UnixStream::connect(&self.socket)
                .await
                .map_err(|e| format!("worker control socket {}: {e}", self.socket.display()))?;
            let mut line = serde_json::to_vec(request)?;
            line.push(b'\n');
            conn.write_all(&line).await?;
            let mut reply = String::new();
            BufReader::new(conn).read_line(&mut reply).await?;
            if reply.is_empty() {
                return Err("the worker closed the control connection".into());
            }
            let reply: Reply = serde_json::from_str(&reply)?;
            match (reply.ok, reply.status, reply.error) {
                (true, Some(status), _) => Ok(status),
                (_, _, Some(error)) => Err(format!("worker: {error}").into()),
                _ => Err("worker: reply without a status".into()),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("the worker did not answer {request:?} within {timeout:?}"))?
    }

    /// The status now.
    pub async fn status(&self) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.call(
            &Request::Status {
                wait_generation: None,
            },
            Duration::from_secs(10),
        )
        .await
    }

    /// The status once no restart is in progress (a dead atunnel replaced).
    pub async fn settled(&self) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.wait_generation(0).await
    }

    /// The status once the `generation`th atunnel runs (or starting failed).
    pub async fn wait_generation(
        &self,
        generation: u64,
    ) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.call(
            &Request::Status {
                wait_generation: Some(generation),
            },
            START_TIMEOUT,
        )
        .await
    }

    /// A fresh `contender` (atunnel with `tunnel_args`, or a peer) in
    /// atunnel's place; the status once it is ready.
    pub async fn restart_as(
        &self,
        contender: Contender,
        tunnel_args: Vec<String>,
    ) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.restart_wrapped(contender, tunnel_args, Vec::new())
            .await
    }

    /// As [`Self::restart_as`], the contender run under `wrapper`.
    pub async fn restart_wrapped(
        &self,
        contender: Contender,
        tunnel_args: Vec<String>,
        wrapper: Vec<String>,
    ) -> Result<WorkerStatus, atunnel_process::BoxError> {
        let request = Request::Restart {
            tunnel_args,
            contender,
            wrapper,
        };
        self.call(&request, START_TIMEOUT).await
    }

    /// Actor number `actor` deactivated; the status once atunnel is done.
    pub async fn deactivate(
        &self,
        actor: usize,
    ) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.call(&Request::Deactivate { actor }, START_TIMEOUT)
            .await
    }

    /// Actor number `actor` prepared and active again.
    pub async fn activate(&self, actor: usize) -> Result<WorkerStatus, atunnel_process::BoxError> {
        self.call(&Request::Activate { actor }, START_TIMEOUT).await
    }
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

/// Binds the control socket (replacing a stale one), readable by root only.
fn bind_control(path: &Path) -> Result<UnixListener, atunnel_process::BoxError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()).into());
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("binding the control socket {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// A request that changes what runs, for the supervisor.
struct Command {
    request: Request,
    reply: oneshot::Sender<Result<WorkerStatus, String>>,
}

/// Owns atunnel, the actors and the cgroup; the only writer of the status.
struct Supervisor {
    args: WorkerArgs,
    pki: PkiFiles,
    cgroup: Cgroup,
    tunnel: Option<Role>,
    /// The running atunnel's control API.
    control: Option<Control>,
    actors: Option<Role>,
    /// Makes the peers' sandboxes (started on first use).
    exec: Option<NsExecutor>,
    /// The sandboxes built for a peer (atunnel builds its own).
    peer_sandboxes: Vec<SandboxNetwork>,
    status: WorkerStatus,
    publish: watch::Sender<WorkerStatus>,
}

/// What woke the supervisor.
enum Wake {
    Stop,
    TunnelExited(std::io::Result<std::process::ExitStatus>),
    ActorsExited(std::io::Result<std::process::ExitStatus>),
    Command(Command),
}

/// Waits for `role` to exit; forever if there is none.
async fn exited(role: &mut Option<Role>) -> std::io::Result<std::process::ExitStatus> {
    match role {
        Some(r) => r.child.wait().await,
        None => std::future::pending().await,
    }
}

impl Supervisor {
    async fn supervise(
        &mut self,
        mut commands: mpsc::Receiver<Command>,
        cancel: &CancellationToken,
    ) {
        loop {
            let wake = tokio::select! {
                biased;
                _ = cancel.cancelled() => Wake::Stop,
                s = exited(&mut self.tunnel) => Wake::TunnelExited(s),
                s = exited(&mut self.actors) => Wake::ActorsExited(s),
                Some(c) = commands.recv() => Wake::Command(c),
            };
            let restart = match wake {
                Wake::Stop => return,
                Wake::TunnelExited(status) => {
                    self.tunnel = None;
                    let ooms = match self.cgroup.sample() {
                        Ok(s) => s.oom_kills.to_string(),
                        Err(e) => format!("unknown ({e})"),
                    };
                    self.record(format!(
                        "atunnel exited ({}); cgroup OOM kills so far: {ooms}; restarting",
                        describe(&status)
                    ));
                    self.status.deaths += 1;
                    None
                }
                Wake::ActorsExited(status) => {
                    // The actors' programs are the far end: replace them
                    // with atunnel so every sandbox serves again.
                    self.actors = None;
                    self.record(format!(
                        "actors exited ({}); restarting atunnel and the actors",
                        describe(&status)
                    ));
                    None
                }
                Wake::Command(command) => match &command.request {
                    Request::Restart {
                        tunnel_args,
                        contender,
                        wrapper,
                    } => {
                        self.status.restarts += 1;
                        self.status.extra_args = tunnel_args.clone();
                        self.status.contender = *contender;
                        self.status.wrapper = wrapper.clone();
                        Some(command)
                    }
                    Request::Deactivate { actor } | Request::Activate { actor } => {
                        // One actor's lifecycle: atunnel and the rest run on.
                        let activate = matches!(command.request, Request::Activate { .. });
                        let result = self.lifecycle(*actor, activate).await;
                        self.publish();
                        let _ = command.reply.send(
                            result
                                .map(|()| self.status.clone())
                                .map_err(|e| e.to_string()),
                        );
                        continue;
                    }
                    Request::Status { .. } => {
                        let _ = command.reply.send(Ok(self.status.clone()));
                        continue;
                    }
                },
            };
            let done = tokio::select! {
                _ = cancel.cancelled() => None,
                r = self.replace() => Some(r),
            };
            let Some(result) = done else {
                if let Some(command) = restart {
                    let _ = command.reply.send(Err("the worker is stopping".into()));
                }
                return;
            };
            if let Some(command) = restart {
                let _ = command.reply.send(
                    result
                        .map(|()| self.status.clone())
                        .map_err(|e| e.to_string()),
                );
            }
        }
    }

    /// Deactivates or (re)activates actor number `i` over the control API.
    async fn lifecycle(
        &mut self,
        i: usize,
        activate: bool,
    ) -> Result<(), atunnel_process::BoxError> {
        if i >= self.args.actors {
            return Err(format!("no actor {i}: the worker hosts {}", self.args.actors).into());
        }
        if let Some(peer) = self.status.contender.peer() {
            return Err(format!(
                "{} runs in atunnel's place: no actor lifecycle",
                peer.name()
            )
            .into());
        }
        let control = self.control.as_mut().ok_or("atunnel is not running")?;
        if activate {
            control.activate(&actor(i)).await?;
            self.status.inactive_actors.remove(&i);
        } else {
            control.deactivate(&actor(i)).await?;
            self.status.inactive_actors.insert(i);
        }
        Ok(())
    }

    fn record(&mut self, event: String) {
        // Shown with the load generator's progress (stderr is shared).
        eprintln!("         {event}");
        self.status.events.push(event);
    }

    fn publish(&mut self) {
        self.status.tunnel_pid = self.tunnel.as_ref().and_then(|t| t.pid());
        self.status.actors_pid = self.actors.as_ref().and_then(|t| t.pid());
        self.publish.send_replace(self.status.clone());
    }

    /// Stops what runs and starts a fresh atunnel and actors.
    async fn replace(&mut self) -> Result<(), atunnel_process::BoxError> {
        self.status.state = TunnelState::Starting;
        self.publish();
        self.stop_children().await;
        let result = self.start().await;
        self.publish();
        result
    }

    /// Starts atunnel inside its cgroup (moved there before it execs, so it
    /// is accounted from its first allocation), then the actors in its
    /// sandboxes. Sets the state either way.
    async fn start(&mut self) -> Result<(), atunnel_process::BoxError> {
        let result = self.start_roles().await;
        match &result {
            Ok(()) => {
                self.status.state = TunnelState::Running;
                self.status.error = None;
            }
            Err(e) => {
                self.status.state = TunnelState::Failed;
                self.status.error = Some(e.to_string());
                eprintln!("atunnel-bench worker: starting atunnel: {e}");
                self.stop_children().await;
            }
        }
        result
    }

    async fn start_roles(&mut self) -> Result<(), atunnel_process::BoxError> {
        if let Some(peer) = self.status.contender.peer() {
            return self.start_peer(peer).await;
        }
        let hook = role::both(
            Box::new(self.cgroup.pre_exec_hook()),
            role::own_process_group(),
        );
        let (command, gateway) = self.serve_command()?;
        let tunnel = role::start_wrapped(&self.status.wrapper, &command, Some(hook)).await?;
        let serving: ServeReady = serde_json::from_str(&tunnel.first_line)?;
        self.status.generation += 1;
        self.status.inactive_actors.clear();
        self.tunnel = Some(tunnel);
        self.status.gateway = Some((gateway.address.clone(), gateway.server_name.clone()));
        let mut control = Control::connect(&serving.control_socket, gateway);
        let mut ready = HostReady {
            stats: serving.stats,
            ingress: serving.ingress,
            actors: Vec::with_capacity(self.args.actors),
        };
        for i in 0..self.args.actors {
            let runtime_netns = control.bring_up(&actor(i)).await?;
            let a = actor(i);
            ready.actors.push(HostedActor {
                name: format!("{}/{}", a.atespace, a.name),
                runtime_netns: Some(runtime_netns),
                listeners: BTreeMap::new(),
            });
        }
        self.control = Some(control);
        let names: Vec<&str> = ready
            .actors
            .iter()
            .filter_map(|a| a.runtime_netns.as_deref())
            .collect();
        let actors = role::start_with(
            &["actors".into(), arg("netns", names.join(","))],
            Some(role::own_process_group()),
        )
        .await?;
        self.status.ready = Some(ready);
        self.status.atunnel_control = Some(serving.control_socket.clone());
        self.actors = Some(actors);
        Ok(())
    }

    /// Starts `peer` in atunnel's place: the actors first (in sandboxes the
    /// worker builds for a peer that can enter them, else on loopback: its
    /// backends), then its configuration written to the peers folder, then
    /// the peer from it inside atunnel's cgroup; ready once it accepts
    /// connections on atunnel's ingress HTTPS address.
    async fn start_peer(&mut self, peer: Peer) -> Result<(), atunnel_process::BoxError> {
        let binary = peer.find().ok_or_else(|| {
            format!(
                "{} is not installed (Debian: apt-get install nginx haproxy)",
                peer.name()
            )
        })?;
        let (backends, egress) = if peer.reaches_sandboxes() {
            self.start_peer_sandboxes().await?
        } else {
            (self.start_loopback_actors().await?, None)
        };
        let setup = PeerSetup {
            listen: self.args.ingress_https,
            cert_bundle: self.pki.worker_bundle(),
            client_ca: self.pki.pod_ca(),
            backends: backends.clone(),
            egress,
            dir: self.peers_dir(),
        };
        let config = peer.write_config(&setup)?;
        let mut command = self.status.wrapper.clone();
        command.extend(peer.command(&binary, &config));
        let hook = role::both(
            Box::new(self.cgroup.pre_exec_hook()),
            role::own_process_group(),
        );
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        // SAFETY: the hook only makes async-signal-safe syscalls (open,
        // write, close for the cgroup move; setpgid), as pre_exec requires
        // after fork.
        unsafe { cmd.pre_exec(hook) };
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        self.status.generation += 1;
        self.status.inactive_actors.clear();
        let tunnel = self.tunnel.insert(Role {
            child,
            first_line: String::new(),
        });
        wait_listening(peer, &mut tunnel.child, self.args.ingress_https).await?;
        self.status.peer = Some(PeerRunning {
            config,
            listen: self.args.ingress_https,
            backends,
            sandboxes: self
                .peer_sandboxes
                .iter()
                .map(|s| s.name().to_string())
                .collect(),
        });
        Ok(())
    }

    /// The actors' program on loopback, one port per actor (for a peer
    /// that cannot enter a sandbox); their backends.
    async fn start_loopback_actors(&mut self) -> Result<Vec<Backend>, atunnel_process::BoxError> {
        let n = self.args.actors;
        let backends = (0..n)
            .map(|i| {
                let a = actor(i);
                let addr = crate::actors::loopback_addr(crate::actors::LOOPBACK_BASE_PORT, i)?;
                Ok(Backend {
                    actor: format!("{}/{}", a.atespace, a.name),
                    addr,
                    netns: None,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let actors = role::start_with(
            &["actors".into(), arg("loopback-actors", n)],
            Some(role::own_process_group()),
        )
        .await?;
        self.actors = Some(actors);
        Ok(backends)
    }

    /// Each actor's sandbox built as atunnel builds it (its name, egress
    /// port and IPv6 setting; the veth and the nftables rules), the actors'
    /// program serving inside them as for atunnel; their backends, reached
    /// from each sandbox's gateway side, and the egress relay in them.
    async fn start_peer_sandboxes(
        &mut self,
    ) -> Result<(Vec<Backend>, Option<EgressRelay>), atunnel_process::BoxError> {
        if self.exec.is_none() {
            self.exec = Some(NsExecutor::start()?);
        }
        let exec = self.exec.clone().expect("started above");
        let (egress_port, ipv6) = sandbox_shape(&self.args.tunnel_arg)?;
        let mut backends = Vec::with_capacity(self.args.actors);
        for i in 0..self.args.actors {
            let a = actor(i);
            let name = format!("{}{}", self.args.netns_prefix, a.uid);
            // Pushed at once: stop_children removes what was built.
            let sandbox = SandboxNetwork::create(&exec, &name, egress_port, ipv6).await?;
            backends.push(Backend {
                actor: format!("{}/{}", a.atespace, a.name),
                addr: atunnel_sandbox::sandbox::actor_addr(crate::actors::ACTOR_PORT),
                netns: Some(sandbox.gateway.name().to_string()),
            });
            self.peer_sandboxes.push(sandbox);
        }
        let names: Vec<&str> = self.peer_sandboxes.iter().map(|s| s.name()).collect();
        let actors = role::start_with(
            &["actors".into(), arg("netns", names.join(","))],
            Some(role::own_process_group()),
        )
        .await?;
        self.actors = Some(actors);
        let egress = EgressRelay {
            port: egress_port,
            netns: self
                .peer_sandboxes
                .iter()
                .map(|s| s.gateway.name().to_string())
                .collect(),
            far_end: self.args.gateway.ip(),
            port_offset: atunnel_support::sink_tls::DEFAULT_PORT_OFFSET,
            server_name: pki::GATEWAY_NAME.to_string(),
            ca: self.pki.gateway_ca(),
        };
        Ok((backends, Some(egress)))
    }

    /// Where a peer's configuration goes.
    fn peers_dir(&self) -> PathBuf {
        self.args.peers_dir.clone().unwrap_or_else(|| {
            self.args
                .control
                .parent()
                .unwrap_or(Path::new("."))
                .join("peers")
        })
    }

    /// Where atunnel serves its control API: beside the worker's own.
    fn atunnel_socket(&self) -> PathBuf {
        self.args.control.with_extension("atunnel.sock")
    }

    /// The `serve` role's command line and the gateway the actors' egress
    /// is prepared for: the worker's flags, then `--tunnel-arg`s, then the
    /// last restart's, later ones replacing earlier ones of the same name.
    /// `--gateway` and `--gateway-name` are not atunnel's flags but the
    /// worker's PrepareEgress arguments.
    fn serve_command(&self) -> Result<(Vec<String>, proto::Gateway), atunnel_process::BoxError> {
        let (a, p) = (&self.args, &self.pki);
        let own = vec![
            arg("control-socket", self.atunnel_socket().display()),
            arg("gateway", a.gateway),
            arg("gateway-name", pki::GATEWAY_NAME),
            arg("gateway-ca", p.gateway_ca().display()),
            arg("node-agent-socket", a.node_agent_socket.display()),
            arg("worker-cert", p.worker_bundle().display()),
            arg("worker-key", p.worker_bundle().display()),
            arg("netns-prefix", &a.netns_prefix),
            arg("ingress-https", a.ingress_https),
            arg("ingress-connect", a.ingress_connect),
            arg("credential-bundle", p.worker_bundle().display()),
            arg("trust-bundle", p.pod_ca().display()),
            arg("stats", a.stats),
        ];
        let flags = layered(&[&own, &self.args.tunnel_arg, &self.status.extra_args]);
        let (flags, gateway) = split_gateway(flags)?;
        let mut command = vec!["serve".to_string()];
        command.extend(flags);
        Ok((command, gateway))
    }

    /// Stops the actors and atunnel, and removes sandboxes a killed atunnel
    /// left behind.
    async fn stop_children(&mut self) {
        if let Some(actors) = self.actors.take() {
            actors.stop().await;
        }
        self.control = None;
        if let Some(tunnel) = self.tunnel.take() {
            tunnel.stop().await;
        }
        // A peer's children outlive it when it is killed (nginx's worker
        // does): nothing may be left running in atunnel's cgroup.
        kill_cgroup_leftovers(&self.status.cgroup);
        self.status.ready = None;
        self.status.atunnel_control = None;
        self.status.gateway = None;
        self.status.peer = None;
        if let Some(exec) = &self.exec {
            for sandbox in self.peer_sandboxes.drain(..) {
                let name = sandbox.name().to_string();
                if let Err(e) = sandbox.destroy(exec).await {
                    eprintln!("atunnel-bench worker: removing sandbox {name}: {e}");
                }
            }
        }
        role::sweep_namespaces(&self.args.netns_prefix).await;
    }
}

/// The egress port and IPv6 setting atunnel's sandboxes get with the
/// worker's `--tunnel-arg`s `flags`: its defaults unless they are named.
fn sandbox_shape(flags: &[String]) -> Result<(u16, bool), atunnel_process::BoxError> {
    let mut port = atunnel_sandbox::sandbox::DEFAULT_EGRESS_PORT;
    let mut ipv6 = true;
    for flag in flags {
        match flag.split_once('=') {
            Some(("--egress-port", v)) => {
                port = v.parse().map_err(|e| format!("{flag}: {e}"))?;
            }
            _ if flag == "--no-sandbox-ipv6" => ipv6 = false,
            _ => {}
        }
    }
    Ok((port, ipv6))
}

/// SIGKILLs every process still in `cgroup` (read from `cgroup.procs`).
fn kill_cgroup_leftovers(cgroup: &CgroupDirs) {
    let Ok(pids) = cgroup.processes() else {
        return;
    };
    for pid in pids {
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
        eprintln!("atunnel-bench worker: killed process {pid} left in atunnel's cgroup");
    }
}

/// How long a peer gets to listen after it starts (nginx and HAProxy take
/// milliseconds; a busy host, a few seconds).
const PEER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Returns once `addr` accepts a connection (the peer is serving), or an
/// error once the peer exits or [`PEER_START_TIMEOUT`] passes. Neither
/// peer says when it is ready, so this polls the listener.
async fn wait_listening(
    peer: Peer,
    child: &mut tokio::process::Child,
    addr: SocketAddr,
) -> Result<(), atunnel_process::BoxError> {
    let deadline = tokio::time::Instant::now() + PEER_START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(
                format!("{} exited ({status}) before serving on {addr}", peer.name()).into(),
            );
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} did not serve on {addr} within {PEER_START_TIMEOUT:?}",
                peer.name()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `--gateway=` and `--gateway-name=` out of `flags`: the gateway
/// the worker prepares each actor's egress for, not a flag of atunnel's.
fn split_gateway(
    flags: Vec<String>,
) -> Result<(Vec<String>, proto::Gateway), atunnel_process::BoxError> {
    let mut gateway = proto::Gateway::default();
    let mut rest = Vec::with_capacity(flags.len());
    for flag in flags {
        match flag.split_once('=') {
            Some(("--gateway", v)) => gateway.address = v.to_string(),
            Some(("--gateway-name", v)) => gateway.server_name = v.to_string(),
            _ if matches!(flag_name(&flag), "--gateway" | "--gateway-name") => {
                return Err(format!("{flag}: give it as {flag}=value").into());
            }
            _ => rest.push(flag),
        }
    }
    if gateway.address.is_empty() {
        return Err("no --gateway= for the actors' egress".into());
    }
    Ok((rest, gateway))
}

fn describe(status: &std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("exit status unknown: {e}"),
    }
}

async fn serve_control(
    listener: UnixListener,
    status: watch::Receiver<WorkerStatus>,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    loop {
        let conn = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept");
                    tokio::time::sleep(crate::actors::ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        tokio::spawn(serve_connection(
            conn,
            status.clone(),
            commands.clone(),
            cancel.clone(),
        ));
    }
}

async fn serve_connection(
    conn: UnixStream,
    status: watch::Receiver<WorkerStatus>,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut line = String::new();
        // Bounded, so a client cannot make the worker buffer without end;
        // a line that is not UTF-8 ends the connection.
        let n = match (&mut read).take(MAX_REQUEST).read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let too_long = !line.ends_with('\n') && n as u64 >= MAX_REQUEST;
        let reply = if too_long {
            Reply::error(format!("request line longer than {MAX_REQUEST} bytes"))
        } else {
            answer(&line, &status, &commands, &cancel).await
        };
        let Ok(mut out) = serde_json::to_vec(&reply) else {
            return;
        };
        out.push(b'\n');
        if write.write_all(&out).await.is_err() || too_long {
            return;
        }
    }
}

async fn answer(
    line: &str,
    status: &watch::Receiver<WorkerStatus>,
    commands: &mpsc::Sender<Command>,
    cancel: &CancellationToken,
) -> Reply {
    let request: Request = match serde_json::from_str(line.trim()) {
        Ok(r) => r,
        Err(e) => return Reply::error(format!("bad request: {e}")),
    };
    match request {
        Request::Status {
            wait_generation: None,
        } => Reply::status(status.borrow().clone()),
        Request::Status {
            wait_generation: Some(generation),
        } => {
            let mut status = status.clone();
            let settled = |s: &WorkerStatus| {
                s.state == TunnelState::Failed
                    || (s.state == TunnelState::Running && s.generation >= generation)
            };
            tokio::select! {
                _ = cancel.cancelled() => Reply::error("the worker is stopping"),
                s = status.wait_for(settled) => match s {
                    Ok(s) => Reply::status(s.clone()),
                    Err(_) => Reply::error("the worker is stopping"),
                },
            }
        }
        request => {
            let (reply, answer) = oneshot::channel();
            let command = Command { request, reply };
            if commands.send(command).await.is_err() {
                return Reply::error("the worker is stopping");
            }
            match answer.await {
                Ok(Ok(status)) => Reply::status(status),
                Ok(Err(e)) => Reply::error(e),
                Err(_) => Reply::error("the worker is stopping"),
            }
        }
    }
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
