//! [`Bench`], the context every scenario runs in: atunnel through the
//! worker's control socket (its status, restarts with other flags or with
//! a peer in its place), the bench's namespaces and the running atunnel's
//! sandboxes, the tunnel's cgroup and /stats, and the router's TLS.
//!
//! With a peer (nginx, HAProxy) in atunnel's place there is no /stats:
//! [`Bench::stats`] fails, and the scenarios a peer runs check
//! [`Bench::contender`] and leave atunnel's own figures out. HAProxy's
//! actors are in sandboxes the worker built for it (the egress units dial
//! from them as for atunnel); nginx's are on loopback, with no sandboxes.

use std::path::Path;

use atunnel_bench::peers::Contender;
use atunnel_host::CgroupSample;
use atunnel_sandbox::NetNs;
use atunnel_support::stats_client::Stats;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::router::{Alpn, RouterTls};
use crate::pki::PkiFiles;
use crate::topology::Topology;
use crate::worker::{TunnelState, WorkerClient, WorkerStatus};

/// What the scenarios drive: atunnel through the worker, the namespaces,
/// and the tunnel's cgroup.
pub struct Bench {
    pub topo: Topology,
    pub pki: PkiFiles,
    /// The router's TLS settings, built once.
    router: RouterTls,
    /// The actors' runtime namespaces (where their programs dial from);
    /// none while a peer that reaches them on loopback runs.
    pub sandboxes: Vec<NetNs>,
    /// Actors the contender routes to (the sandboxes', or the peer's
    /// backends).
    actors: usize,
    pub quick: bool,
    pub idle_conns: usize,
    pub worker: WorkerClient,
    /// The worker's status as last seen (atunnel's ready line among it).
    status: WorkerStatus,
    /// The flags last asked for on top of the worker's (a restart that
    /// failed included).
    tunnel_args: Vec<String>,
    sink_pid: Option<u32>,
    /// The run folder (scenarios that keep files write below it).
    out: std::path::PathBuf,
    /// Whether the cost scenario's windows run the bench's processes in
    /// lockstep on one CPU (`atunnel_bench::lockstep`).
    pub cost_lockstep: bool,
    /// The cost scenario's units by name (empty: every one).
    pub cost_units: Vec<String>,
    /// The cost scenario's contenders (empty: atunnel and the peers
    /// installed).
    pub cost_contenders: Vec<atunnel_bench::peers::Contender>,
}

impl Bench {
    /// Opens what `load`'s flags name: the worker's `control` socket (once
    /// no restart is in progress), the namespaces under `netns_prefix` and
    /// the running atunnel's sandboxes, and the `pki` folder.
    pub async fn open(
        control: &Path,
        pki: &Path,
        netns_prefix: &str,
        quick: bool,
        idle_conns: usize,
        sink_pid: Option<u32>,
    ) -> Result<Self, atunnel_process::BoxError> {
        let worker = WorkerClient::new(control);
        let status = worker.settled().await?;
        let topo = Topology::open(netns_prefix)?;
        let sandboxes = running(&status)?;
        let actors = actors_of(&status);
        let pki = PkiFiles {
            dir: pki.to_path_buf(),
        };
        Ok(Self {
            topo,
            router: RouterTls::new(&pki)?,
            pki,
            sandboxes,
            actors,
            quick,
            idle_conns,
            worker,
            tunnel_args: status.extra_args.clone(),
            status,
            sink_pid,
            out: std::path::PathBuf::from("."),
            cost_lockstep: true,
            cost_units: Vec::new(),
            cost_contenders: Vec::new(),
        })
    }

    /// Where the run folder is.
    pub fn set_out_dir(&mut self, out: &Path) {
        self.out = out.to_path_buf();
    }

    /// The run folder.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// The worker's status as last seen.
    pub fn last_status(&self) -> &WorkerStatus {
        &self.status
    }

    /// Takes a status from the worker: a fresh atunnel has other sandboxes.
    fn adopt(&mut self, status: WorkerStatus) -> Result<(), atunnel_process::BoxError> {
        if status.generation != self.status.generation || status.tunnel_pid != self.tunnel_pid() {
            self.sandboxes = running(&status)?;
            self.actors = actors_of(&status);
        }
        self.status = status;
        Ok(())
    }

    /// Whether atunnel ran without dying since the last look. The worker
    /// replaces a dead atunnel by itself (logging how it died); this waits
    /// until the fresh one is ready.
    pub async fn check_tunnel(&mut self) -> Result<bool, atunnel_process::BoxError> {
        let status = self.worker.settled().await?;
        let alive = status.deaths == self.status.deaths;
        if status.state == TunnelState::Failed {
            self.status = status.clone();
            return Err(format!(
                "atunnel could not be restarted: {}",
                status.error.unwrap_or_default()
            )
            .into());
        }
        self.adopt(status)?;
        Ok(alive)
    }

    /// Restarts atunnel (and the actors in its fresh sandboxes) with `extra`
    /// flags; an empty list returns to the defaults. A peer in atunnel's
    /// place stays (and takes no flags).
    pub async fn restart_tunnel(
        &mut self,
        extra: Vec<String>,
    ) -> Result<(), atunnel_process::BoxError> {
        self.restart_as(self.contender(), extra).await
    }

    /// Puts `contender` in atunnel's place (atunnel itself with `extra`
    /// flags, or a peer), fresh.
    pub async fn restart_as(
        &mut self,
        contender: Contender,
        extra: Vec<String>,
    ) -> Result<(), atunnel_process::BoxError> {
        self.tunnel_args = extra.clone();
        let status = self.worker.restart_as(contender, extra).await?;
        self.adopt(status)
    }

    /// Puts `contender` in atunnel's place, fresh, run under `wrapper`
    /// (callgrind, for the cost scenario's instruction pass).
    pub async fn restart_wrapped(
        &mut self,
        contender: Contender,
        extra: Vec<String>,
        wrapper: Vec<String>,
    ) -> Result<(), atunnel_process::BoxError> {
        self.tunnel_args = extra.clone();
        let status = self
            .worker
            .restart_wrapped(contender, extra, wrapper)
            .await?;
        self.adopt(status)
    }

    /// The command the contender runs under (empty: as it is).
    pub fn wrapper(&self) -> &[String] {
        &self.status.wrapper
    }

    /// Every process of the contender: its cgroup's (atunnel's one, or a
    /// peer's master and workers).
    pub fn contender_pids(&self) -> Result<Vec<u32>, atunnel_process::BoxError> {
        Ok(self.status.cgroup.processes()?)
    }

    /// What runs in atunnel's place.
    pub fn contender(&self) -> Contender {
        self.status.contender
    }

    /// Whether atunnel itself runs (not a peer in its place).
    pub fn is_atunnel(&self) -> bool {
        self.contender() == Contender::Atunnel
    }

    /// Deactivates actor number `actor` through the worker, as a worker
    /// does when an actor stops: atunnel cuts its tunnels.
    pub async fn deactivate_actor(&mut self, actor: u64) -> Result<(), atunnel_process::BoxError> {
        let status = self.worker.deactivate(actor as usize).await?;
        self.adopt(status)
    }

    /// Prepares actor number `actor`'s egress afresh and activates it.
    pub async fn activate_actor(&mut self, actor: u64) -> Result<(), atunnel_process::BoxError> {
        let status = self.worker.activate(actor as usize).await?;
        self.adopt(status)
    }

    /// The flags atunnel was last asked to run with on top of the worker's.
    pub fn tunnel_args(&self) -> &[String] {
        &self.tunnel_args
    }

    /// atunnel's CPU quota, in cores.
    pub fn tunnel_cpus(&self) -> f64 {
        self.status.cpus
    }

    pub fn tunnel_pid(&self) -> Option<u32> {
        self.status.tunnel_pid
    }

    pub fn sink_pid(&self) -> Option<u32> {
        self.sink_pid
    }

    pub fn actors_pid(&self) -> Option<u32> {
        self.status.actors_pid
    }

    /// How many actors the scenarios spread units over: the running
    /// atunnel's sandboxes (or the peer's backends), at least one.
    pub fn actor_count(&self) -> u64 {
        self.actors.max(1) as u64
    }

    pub fn cgroup_sample(&self) -> CgroupSample {
        self.status.cgroup.sample().unwrap_or_default()
    }

    /// atunnel's /stats, read from the load namespace (after releasing free
    /// memory when `release`).
    pub async fn stats(&self, release: bool) -> Result<Stats, atunnel_process::BoxError> {
        if !self.is_atunnel() {
            return Err(format!("{} runs in atunnel's place: no /stats", self.contender()).into());
        }
        let addr = self.status.host_ready()?.stats;
        let s = self.topo.connect_in(&self.topo.load, addr).await?;
        atunnel_support::stats_client::fetch_stats_over(s, release).await
    }

    /// TLS to atunnel's ingress `port` from the load namespace, as the
    /// router (its certificate), offering `alpn`.
    pub async fn router_tls(
        &self,
        port: u16,
        alpn: Alpn,
    ) -> Result<TlsStream<TcpStream>, atunnel_process::BoxError> {
        self.router.connect(&self.topo, port, alpn).await
    }

    /// An HTTP/1.1 CONNECT tunnel over TLS from the router, through the
    /// CONNECT listener, to `actor:port`, once atunnel answered 200; nothing
    /// after the answer's head is read.
    pub async fn connect_tunnel(
        &self,
        actor: u64,
        port: u16,
    ) -> Result<TlsStream<TcpStream>, atunnel_process::BoxError> {
        self.router.connect_tunnel(&self.topo, actor, port).await
    }
}

/// Actors the running contender routes to.
fn actors_of(status: &WorkerStatus) -> usize {
    match (&status.peer, &status.ready) {
        (Some(peer), _) => peer.backends.len(),
        (None, Some(ready)) => ready.actors.len(),
        (None, None) => 0,
    }
}

/// The running contender's sandboxes, opened (none for a peer on
/// loopback).
fn running(status: &WorkerStatus) -> Result<Vec<NetNs>, atunnel_process::BoxError> {
    if status.state != TunnelState::Running {
        return Err(format!(
            "{} is not running ({:?}): {}",
            status.contender,
            status.state,
            status.error.as_deref().unwrap_or("")
        )
        .into());
    }
    if let Some(peer) = &status.peer {
        let opened = peer.sandboxes.iter().map(|n| NetNs::open(n));
        return Ok(opened.collect::<Result<_, _>>()?);
    }
    let sandboxes = status
        .host_ready()?
        .actors
        .iter()
        .filter_map(|a| a.runtime_netns.as_deref())
        .map(NetNs::open)
        .collect::<Result<_, _>>()?;
    Ok(sandboxes)
}
