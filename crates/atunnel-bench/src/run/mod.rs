//! `atunnel-bench run`: everything on one machine. The sink (egress gateway
//! in bench mode) and the load generator each get a network namespace; the
//! worker namespace holds atunnel (in a cgroup of its own with a CPU quota,
//! a memory limit and no swap) and the ingress actors, one in every sandbox.
//! Then every scenario runs, and the run folder gets results.txt,
//! results.json, report.md and plots.

mod report;
mod scenarios;
mod topology;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use atunnel::host::HostReady;
use atunnel_bench::cgroup::{Cgroup, CgroupSample, Limits};
use atunnel_bench::load::results::{self, Results, ScenarioResult};
use atunnel_sandbox::NetNs;
use tokio_util::sync::CancellationToken;

use crate::pki::{self, PkiFiles};
use crate::role::{self, Role};
use topology::{SINK_ADDR, Topology, WORKER_LOAD_SIDE};

/// Scenario names, in the order they run (names are part of the results schema).
pub const SCENARIOS: &[&str] = &[
    "egress-idle",
    "egress-tcp",
    "egress-http",
    "egress-new",
    "ingress-https",
    "ingress-connect",
    "socket-memory",
];

#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The short run (under 3 minutes): small ladders, 1,000 idle connections.
    #[arg(long)]
    pub quick: bool,
    /// Run folder (default: runs/<timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scenarios to run, comma separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Actors hosted (each with a sandbox, an ingress actor and egress).
    #[arg(long)]
    pub actors: Option<usize>,
    /// atunnel's CPU quota, in cores.
    #[arg(long, default_value_t = 1.0)]
    pub tunnel_cpus: f64,
    /// atunnel's memory limit, in MiB (no swap).
    #[arg(long, default_value_t = 1024)]
    pub tunnel_memory_mib: u64,
    /// Idle egress connections held by egress-idle (default 15,000; 1,000 with --quick).
    #[arg(long)]
    pub idle_conns: Option<usize>,
    /// An extra flag for atunnel for the whole run (repeatable), e.g.
    /// `--tunnel-arg=--sandbox-receive-buffer=65536`, to compare settings.
    #[arg(long, allow_hyphen_values = true)]
    pub tunnel_arg: Vec<String>,
}

/// The running bench: its processes, namespaces and the tunnel's cgroup.
pub struct Bench {
    pub topo: Topology,
    pub pki: PkiFiles,
    pub cgroup: Cgroup,
    pub ready: HostReady,
    pub sandboxes: Vec<NetNs>,
    pub stats: SocketAddr,
    pub quick: bool,
    pub tunnel_cpus: f64,
    pub idle_conns: usize,
    sink: Option<Role>,
    /// The fake node agent atunnel mints actor certificates from.
    node_agent: Option<atunnel_nodeagent::FakeNodeAgentHandle>,
    tunnel: Option<Role>,
    /// Flags atunnel runs with for the whole run (`--tunnel-arg`).
    tunnel_base: Vec<String>,
    /// Extra flags the current atunnel runs with (a scenario's setting).
    tunnel_extra: Vec<String>,
    actors: Option<Role>,
    /// OOM kills and restarts seen, for the report.
    pub events: Vec<String>,
}

fn arg(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

pub async fn run(args: RunArgs) -> Result<(), atunnel::BoxError> {
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => PathBuf::from("runs").join(timestamp()),
    };
    std::fs::create_dir_all(&out)?;
    let chosen: Vec<String> = if args.scenarios.is_empty() {
        SCENARIOS.iter().map(|s| s.to_string()).collect()
    } else {
        args.scenarios.clone()
    };
    for s in &chosen {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s:?}; known: {}", SCENARIOS.join(", ")).into());
        }
    }
    let prefix = format!("atb{}-", std::process::id() % 100_000);
    eprintln!("atunnel-bench run: folder {}", out.display());
    let started = Instant::now();
    let mut bench = match Bench::start(&args, &out, &prefix).await {
        Ok(b) => b,
        Err(e) => {
            role::sweep_namespaces(&prefix).await;
            return Err(e);
        }
    };
    let interrupted = CancellationToken::new();
    let stop = interrupted.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let mut results = Results::default();
    for name in &chosen {
        eprintln!(
            "[{:>5.0}s] scenario {name}",
            started.elapsed().as_secs_f64()
        );
        let result = tokio::select! {
            _ = interrupted.cancelled() => {
                eprintln!("interrupted: cleaning up");
                break;
            }
            r = scenarios::run(&mut bench, name) => r,
        };
        let result = result.unwrap_or_else(|e| ScenarioResult {
            name: name.clone(),
            notes: vec![format!("scenario failed: {e}")],
            ..ScenarioResult::default()
        });
        for line in report::summary_lines(&result) {
            eprintln!("         {line}");
        }
        results.scenarios.push(result);
        // Keep what is done even if a later scenario fails hard.
        results::write_results_json(&out, &results)?;
    }
    let events = bench.events.clone();
    bench.stop().await;
    role::sweep_namespaces(&prefix).await;
    results::write_results_json(&out, &results)?;
    results::write_results_txt(&out, &results)?;
    let plots = results::write_plots(&out, &results)?;
    report::write(&out, &args, &results, &plots, &events)?;
    eprintln!(
        "[{:>5.0}s] done: {}",
        started.elapsed().as_secs_f64(),
        out.join("results.txt").display()
    );
    print!("{}", std::fs::read_to_string(out.join("results.txt"))?);
    Ok(())
}

/// Serves actor certificates on `socket` as atelet would: mutual TLS with
/// the worker's pod certificate, signed with the actor CA.
async fn start_node_agent(
    pki: &PkiFiles,
    socket: &std::path::Path,
) -> Result<atunnel_nodeagent::FakeNodeAgentHandle, atunnel::BoxError> {
    use atunnel::config::{load_certs, load_key};
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

fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // UTC, YYYYMMDD-HHMMSS, without a date crate: days since the epoch to
    // a civil date (Howard Hinnant's algorithm).
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Bench {
    async fn start(
        args: &RunArgs,
        out: &std::path::Path,
        prefix: &str,
    ) -> Result<Self, atunnel::BoxError> {
        let pki = pki::write(&out.join("pki"))?;
        let topo = Topology::create(prefix).await?;
        let actors = args.actors.unwrap_or(if args.quick { 4 } else { 16 });
        let idle_conns = args
            .idle_conns
            .unwrap_or(if args.quick { 1000 } else { 15_000 });
        let cgroup = Cgroup::create(
            &format!("atunnel-bench-{}/tunnel", std::process::id()),
            &Limits {
                cpus: args.tunnel_cpus,
                memory_bytes: args.tunnel_memory_mib << 20,
            },
        )?;
        let sink = role::start_in(
            &topo.exec,
            &topo.sink,
            &[
                "sink".into(),
                arg("listen", SocketAddr::from((SINK_ADDR, 443))),
                arg("cert", pki.gateway_cert().display()),
                arg("key", pki.gateway_key().display()),
                arg("actor-ca", pki.actor_ca_cert().display()),
                "--mode=sink".into(),
                arg("source-bytes", 1u64 << 30),
            ],
            None,
        )
        .await?;
        let mut bench = Self {
            pki,
            cgroup,
            ready: HostReady {
                stats: SocketAddr::from((WORKER_LOAD_SIDE, 9100)),
                ingress: None,
                actors: Vec::new(),
            },
            sandboxes: Vec::new(),
            stats: SocketAddr::from((WORKER_LOAD_SIDE, 9100)),
            quick: args.quick,
            tunnel_cpus: args.tunnel_cpus,
            idle_conns,
            sink: Some(sink),
            node_agent: None,
            tunnel: None,
            tunnel_base: args.tunnel_arg.clone(),
            tunnel_extra: Vec::new(),
            actors: None,
            events: Vec::new(),
            topo,
        };
        bench.node_agent =
            Some(start_node_agent(&bench.pki, &out.join("ateom-support.sock")).await?);
        bench.start_tunnel(actors).await?;
        Ok(bench)
    }

    fn tunnel_args(&self, actors: usize) -> Vec<String> {
        let p = &self.pki;
        vec![
            "tunnel".into(),
            arg("actors", actors),
            "--network=sandbox".into(),
            arg("gateway", SocketAddr::from((SINK_ADDR, 443))),
            arg("gateway-name", pki::GATEWAY_NAME),
            arg("gateway-ca", p.gateway_ca().display()),
            arg(
                "node-agent-socket",
                self.pki.dir.join("..").join("ateom-support.sock").display(),
            ),
            arg("worker-cert", p.worker_bundle().display()),
            arg("worker-key", p.worker_bundle().display()),
            arg("netns-prefix", format!("{}s-", self.topo.prefix)),
            arg("ingress-https", SocketAddr::from((WORKER_LOAD_SIDE, 443))),
            arg(
                "ingress-connect",
                SocketAddr::from((WORKER_LOAD_SIDE, 8443)),
            ),
            arg("credential-bundle", p.worker_bundle().display()),
            arg("trust-bundle", p.pod_ca().display()),
            arg("stats", self.stats),
        ]
    }

    /// Starts atunnel inside its cgroup (moved there before it execs, so it
    /// is accounted from its first allocation) and the ingress actors.
    async fn start_tunnel(&mut self, actors: usize) -> Result<(), atunnel::BoxError> {
        let hook: role::PreExec = Box::new(self.cgroup.pre_exec_hook());
        let mut args = self.tunnel_args(actors);
        args.extend(self.tunnel_base.iter().cloned());
        args.extend(self.tunnel_extra.iter().cloned());
        let tunnel = role::start_in(&self.topo.exec, &self.topo.worker, &args, Some(hook)).await?;
        self.ready = serde_json::from_str(&tunnel.first_line)?;
        self.tunnel = Some(tunnel);
        self.sandboxes = self
            .ready
            .actors
            .iter()
            .filter_map(|a| a.runtime_netns.as_deref())
            .map(NetNs::open)
            .collect::<Result<_, _>>()?;
        let names: Vec<&str> = self.sandboxes.iter().map(|n| n.name()).collect();
        let actors = role::start_in(
            &self.topo.exec,
            &self.topo.worker,
            &["actors".into(), arg("netns", names.join(","))],
            None,
        )
        .await?;
        self.actors = Some(actors);
        Ok(())
    }

    /// Whether atunnel is still running; if it died, records how (an OOM
    /// kill is read from the cgroup's own counter) and starts a fresh one.
    pub async fn check_tunnel(&mut self) -> Result<bool, atunnel::BoxError> {
        let Some(tunnel) = self.tunnel.as_mut() else {
            return Ok(false);
        };
        let Some(status) = tunnel.exited() else {
            return Ok(true);
        };
        let ooms = self.cgroup.sample().map(|s| s.oom_kills).unwrap_or(0);
        self.events.push(format!(
            "atunnel exited ({status}); cgroup OOM kills so far: {ooms}; restarting"
        ));
        eprintln!("         {}", self.events.last().expect("just pushed"));
        if let Some(actors) = self.actors.take() {
            actors.stop().await;
        }
        self.tunnel = None;
        role::sweep_namespaces(&format!("{}s-", self.topo.prefix)).await;
        let n = self.ready.actors.len().max(1);
        self.start_tunnel(n).await?;
        Ok(false)
    }

    /// Restarts atunnel (and the actors in its fresh sandboxes) with `extra`
    /// flags; an empty list returns to the defaults.
    pub async fn restart_tunnel(&mut self, extra: Vec<String>) -> Result<(), atunnel::BoxError> {
        if let Some(actors) = self.actors.take() {
            actors.stop().await;
        }
        if let Some(tunnel) = self.tunnel.take() {
            tunnel.stop().await;
        }
        role::sweep_namespaces(&format!("{}s-", self.topo.prefix)).await;
        self.tunnel_extra = extra;
        let n = self.ready.actors.len().max(1);
        self.start_tunnel(n).await
    }

    pub fn tunnel_pid(&self) -> Option<u32> {
        self.tunnel.as_ref().and_then(|t| t.pid())
    }

    pub fn sink_pid(&self) -> Option<u32> {
        self.sink.as_ref().and_then(|t| t.pid())
    }

    pub fn actors_pid(&self) -> Option<u32> {
        self.actors.as_ref().and_then(|t| t.pid())
    }

    pub fn cgroup_sample(&self) -> CgroupSample {
        self.cgroup.sample().unwrap_or_default()
    }

    /// atunnel's /stats, read from the load namespace (after releasing free
    /// memory when `release`).
    pub async fn stats(&self, release: bool) -> Result<serde_json::Value, atunnel::BoxError> {
        let s = self.topo.connect_in(&self.topo.load, self.stats).await?;
        atunnel::stats::fetch_over(s, release).await
    }

    async fn stop(mut self) {
        for role in [self.actors.take(), self.tunnel.take(), self.sink.take()]
            .into_iter()
            .flatten()
        {
            role.stop().await;
        }
        if let Some(agent) = self.node_agent.take() {
            agent.shutdown().await;
        }
        // Leave the tunnel's sandboxes and our namespaces to the sweep.
        self.topo.destroy().await;
        let _ = self.cgroup.remove();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
