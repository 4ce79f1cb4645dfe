//! `atunnel-bench load`: the load generator and reporter. It runs in the
//! load namespace that `run` made, opens the other namespaces by name (it
//! dials from the actors' sandboxes as their programs would, and starts the
//! forwarding gateway of one socket-memory case in the sink's), asks the
//! worker over its control socket for atunnel's pids, cgroup and restarts,
//! runs the scenarios and writes the run folder.

use std::path::PathBuf;
use std::time::Instant;

use atunnel_bench::cgroup::CgroupSample;
use atunnel_bench::load::results::{self, Results, ScenarioResult};
use atunnel_sandbox::NetNs;
use tokio_util::sync::CancellationToken;

use super::SCENARIOS;
use super::report::{self, RunInfo};
use super::scenarios::{self, RouterTls};
use super::topology::Topology;
use crate::pki::PkiFiles;
use crate::worker::{TunnelState, WorkerClient, WorkerStatus};

#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// The worker's control socket.
    #[arg(long)]
    pub control: PathBuf,
    /// PKI folder (the router's certificate, the gateway's).
    #[arg(long)]
    pub pki: PathBuf,
    /// Prefix of the bench's namespaces (<prefix>worker, <prefix>sink, <prefix>load).
    #[arg(long)]
    pub netns_prefix: String,
    /// The gateway sink's pid (its CPU is the far end's in egress rungs).
    #[arg(long)]
    pub sink_pid: Option<u32>,
    /// The short run: small ladders, 1,000 idle connections.
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run, comma separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Idle egress connections held by egress-idle (default 15,000; 1,000 with --quick).
    #[arg(long)]
    pub idle_conns: Option<usize>,
    /// Run folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// A setting to compare across variants (see `run --compare`).
    #[arg(long, value_enum)]
    pub compare: Option<Compare>,
}

/// Settings `--compare` sweeps, each variant on a fresh atunnel.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The lean relay vs the reference's design before its fix.
    CopyMode,
    /// Waiting for data by readiness vs with a 512 B to 4 KiB wait buffer.
    WaitBuffer,
}

/// The scenarios a comparison runs under each variant.
const COMPARED: [&str; 3] = ["egress-idle", "egress-http", "egress-tcp"];

impl Compare {
    pub fn name(self) -> &'static str {
        match self {
            Compare::CopyMode => "copy-mode",
            Compare::WaitBuffer => "wait-buffer",
        }
    }

    fn variants(self) -> Vec<(String, Vec<String>)> {
        match self {
            Compare::CopyMode => vec![
                ("lean".into(), vec!["--copy-mode=lean".into()]),
                ("naive".into(), vec!["--copy-mode=naive".into()]),
            ],
            Compare::WaitBuffer => [0usize, 512, 1024, 2048, 4096]
                .into_iter()
                .map(|n| {
                    let label = if n == 0 {
                        "0 (readiness)".into()
                    } else {
                        format!("{n} B")
                    };
                    (label, vec![format!("--wait-buffer={n}")])
                })
                .collect(),
        }
    }
}

/// The scenarios to run, in order: the ones named (checked against the
/// known ones), else all of them; but a comparison with none named runs
/// only its own.
pub fn scenarios_to_run(
    names: &[String],
    compare: Option<Compare>,
) -> Result<Vec<String>, atunnel::BoxError> {
    if names.is_empty() {
        return Ok(match compare {
            Some(_) => Vec::new(),
            None => SCENARIOS.iter().map(|s| s.to_string()).collect(),
        });
    }
    for s in names {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s:?}; known: {}", SCENARIOS.join(", ")).into());
        }
    }
    Ok(names.to_vec())
}

pub async fn run(args: LoadArgs, cancel: CancellationToken) -> Result<(), atunnel::BoxError> {
    let chosen = scenarios_to_run(&args.scenarios, args.compare)?;
    std::fs::create_dir_all(&args.out)?;
    let mut bench = Bench::open(&args).await?;
    println!(
        "{}",
        serde_json::json!({"load": "ready", "scenarios": chosen})
    );
    let started = Instant::now();
    let mut results = Results::default();
    for name in &chosen {
        eprintln!(
            "[{:>5.0}s] scenario {name}",
            started.elapsed().as_secs_f64()
        );
        let result = tokio::select! {
            _ = cancel.cancelled() => {
                eprintln!("interrupted: writing what is done");
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
        results::write_results_json(&args.out, &results)?;
    }
    if let Some(compare) = args.compare {
        let mut comparison = results::Comparison {
            name: compare.name().into(),
            variants: Vec::new(),
        };
        'variants: for (label, flags) in compare.variants() {
            eprintln!(
                "[{:>5.0}s] compare {}: {label}",
                started.elapsed().as_secs_f64(),
                compare.name()
            );
            bench.restart_tunnel(flags.clone()).await?;
            let mut variant = results::Variant {
                label,
                flags,
                scenarios: Vec::new(),
            };
            for name in COMPARED {
                let result = tokio::select! {
                    _ = cancel.cancelled() => break 'variants,
                    r = scenarios::run(&mut bench, name) => r,
                };
                let result = result.unwrap_or_else(|e| ScenarioResult {
                    name: name.into(),
                    notes: vec![format!("scenario failed: {e}")],
                    ..ScenarioResult::default()
                });
                for line in report::summary_lines(&result) {
                    eprintln!("         {line}");
                }
                variant.scenarios.push(result);
            }
            comparison.variants.push(variant);
        }
        eprint!("{}", results::comparison_table(&comparison));
        results.comparisons.push(comparison);
        results::write_results_json(&args.out, &results)?;
        bench.restart_tunnel(Vec::new()).await?;
    }
    // The deaths the worker saw, for the report (the last status if it is
    // already gone).
    let status = match bench.worker.status().await {
        Ok(s) => s,
        Err(_) => bench.status.clone(),
    };
    let info = RunInfo {
        quick: args.quick,
        tunnel_cpus: status.cpus,
        tunnel_memory_mib: status.memory_bytes >> 20,
        tunnel_arg: status.base_args.clone(),
        compare: args.compare.map(Compare::name),
        // Named when they are not what the same command without
        // --scenarios would run.
        scenarios: (chosen != scenarios_to_run(&[], args.compare)?).then(|| chosen.clone()),
    };
    results::write_results_json(&args.out, &results)?;
    results::write_results_txt(&args.out, &results)?;
    let plots = results::write_plots(&args.out, &results)?;
    report::write(&args.out, &info, &results, &plots, &status.events)?;
    Ok(())
}

/// What the scenarios drive: atunnel through the worker, the namespaces,
/// and the tunnel's cgroup.
pub struct Bench {
    pub topo: Topology,
    pub pki: PkiFiles,
    /// The router's TLS settings, built once.
    pub(super) router_tls: RouterTls,
    /// The actors' runtime namespaces (where their programs dial from).
    pub sandboxes: Vec<NetNs>,
    pub quick: bool,
    pub idle_conns: usize,
    pub worker: WorkerClient,
    /// The worker's status as last seen (atunnel's ready line among it).
    status: WorkerStatus,
    /// The flags last asked for on top of the worker's (a restart that
    /// failed included).
    tunnel_args: Vec<String>,
    sink_pid: Option<u32>,
}

impl Bench {
    async fn open(args: &LoadArgs) -> Result<Self, atunnel::BoxError> {
        let worker = WorkerClient::new(&args.control);
        let status = worker.settled().await?;
        let topo = Topology::open(&args.netns_prefix)?;
        let sandboxes = running(&status)?;
        let pki = PkiFiles {
            dir: args.pki.clone(),
        };
        Ok(Self {
            topo,
            router_tls: RouterTls::new(&pki)?,
            pki,
            sandboxes,
            quick: args.quick,
            idle_conns: args
                .idle_conns
                .unwrap_or(if args.quick { 1000 } else { 15_000 }),
            worker,
            tunnel_args: status.extra_args.clone(),
            status,
            sink_pid: args.sink_pid,
        })
    }

    /// Takes a status from the worker: a fresh atunnel has other sandboxes.
    fn adopt(&mut self, status: WorkerStatus) -> Result<(), atunnel::BoxError> {
        if status.generation != self.status.generation || status.tunnel_pid != self.tunnel_pid() {
            self.sandboxes = running(&status)?;
        }
        self.status = status;
        Ok(())
    }

    /// Whether atunnel ran without dying since the last look. The worker
    /// replaces a dead atunnel by itself (logging how it died); this waits
    /// until the fresh one is ready.
    pub async fn check_tunnel(&mut self) -> Result<bool, atunnel::BoxError> {
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
    /// flags; an empty list returns to the defaults.
    pub async fn restart_tunnel(&mut self, extra: Vec<String>) -> Result<(), atunnel::BoxError> {
        self.tunnel_args = extra.clone();
        let status = self.worker.restart(extra).await?;
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

    pub fn cgroup_sample(&self) -> CgroupSample {
        self.status.cgroup.sample().unwrap_or_default()
    }

    /// atunnel's /stats, read from the load namespace (after releasing free
    /// memory when `release`).
    pub async fn stats(&self, release: bool) -> Result<serde_json::Value, atunnel::BoxError> {
        let addr = self.status.host_ready()?.stats;
        let s = self.topo.connect_in(&self.topo.load, addr).await?;
        atunnel::stats::fetch_over(s, release).await
    }
}

/// The running atunnel's sandboxes, opened.
fn running(status: &WorkerStatus) -> Result<Vec<NetNs>, atunnel::BoxError> {
    if status.state != TunnelState::Running {
        return Err(format!(
            "atunnel is not running ({:?}): {}",
            status.state,
            status.error.as_deref().unwrap_or("")
        )
        .into());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_comparison_alone_runs_only_its_own_scenarios() {
        let compare = Some(Compare::CopyMode);
        assert_eq!(scenarios_to_run(&[], None).expect("all"), names(SCENARIOS));
        assert!(scenarios_to_run(&[], compare).expect("none").is_empty());
        let tcp = names(&["egress-tcp"]);
        assert_eq!(scenarios_to_run(&tcp, compare).expect("named"), tcp);
        assert_eq!(scenarios_to_run(&tcp, None).expect("named"), tcp);
        assert!(scenarios_to_run(&names(&["egress-nope"]), compare).is_err());
    }
}
