//! The worker's control protocol (one JSON request and reply per line on
//! its Unix socket) and the client the load role drives it with.

use super::*;

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
    pub(super) fn status(status: WorkerStatus) -> Self {
        Self {
            ok: true,
            status: Some(status),
            error: None,
        }
    }

    pub(super) fn error(error: impl Into<String>) -> Self {
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
    pub(super) socket: PathBuf,
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
