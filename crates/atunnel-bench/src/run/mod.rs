//! `atunnel-bench run`: everything on one machine, as three roles in network
//! namespaces of their own: the sink (the egress gateway in bench mode), the
//! worker (atunnel in a cgroup of its own with a CPU quota, a memory limit
//! and no swap, the ingress actors in its sandboxes, a fresh atunnel when
//! one dies) and the load generator (every scenario; it writes the run
//! folder: results.txt, results.json, report.md and plots). `run` only sets
//! the stage and clears it again, whatever happens.
//!
//! Its modules, each depending only on those below it:
//!
//! - this one: the `run` role; it sets the stage and starts the others.
//! - [`load`]: the `load` role: runs the scenarios, writes the run folder.
//! - [`report`]: writes report.md.
//! - [`scenarios`]: the scenarios, and running one.
//! - [`rung`]: the measurement around one rung, the ladders.
//! - [`dial`]: dialing from the actors' sandboxes.
//! - [`bench`]: what the scenarios drive (atunnel through the worker).
//! - [`router`]: the router's TLS to atunnel's ingress.
//!
//! Below `run`: `crate::worker` (the `worker` role and its control
//! socket), `crate::topology` (the namespaces, veth links and addresses)
//! and the library's `scenario` (the scenarios' names).

mod bench;
mod dial;
pub mod load;
mod report;
mod router;
mod rung;
mod scenarios;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use atunnel_bench::scenario::Scenario;
use tokio_util::sync::CancellationToken;

use crate::pki;
use crate::role::{self, Role, arg};
use crate::topology::{self, SINK_ADDR, Topology};

/// How long the load generator gets to write what it has after SIGTERM.
const LOAD_GRACE: Duration = Duration::from_secs(30);
/// How long the worker gets to stop atunnel (10 s) and the actors (10 s).
const WORKER_GRACE: Duration = Duration::from_secs(25);

#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The short run (about 14 minutes here, the cost scenario's windows
    /// most of it): small ladders, 1,000 idle connections.
    #[arg(long)]
    pub quick: bool,
    /// Also run egress-idle, egress-http and egress-tcp under each variant of
    /// one setting (`peers`: ingress-https and ingress-idle with atunnel,
    /// nginx and HAProxy in atunnel's place, egress-tcp with atunnel and
    /// HAProxy as a TCP -> TLS relay) and print them side by side
    /// (alone unless --scenarios).
    #[arg(long, value_enum)]
    pub compare: Option<load::Compare>,
    /// Run folder (default: runs/<timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scenarios to run, comma separated (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub scenarios: Vec<Scenario>,
    /// Actors hosted (each with a sandbox, an ingress actor and egress;
    /// default 16, 5 with --quick).
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
    /// An extra flag for the sink (the bench's gateway) for the whole run
    /// (repeatable), e.g. `--sink-arg=--stream-window=65536`.
    #[arg(long, allow_hyphen_values = true)]
    pub sink_arg: Vec<String>,
    /// The cost scenario's windows under the normal scheduler, the chain
    /// spread over the CPUs, instead of in lockstep on one CPU (see
    /// `lockstep.rs`): to see what lockstep holds still.
    #[arg(long)]
    pub cost_free_scheduling: bool,
    /// The cost scenario's units, comma-separated (default: every one), to
    /// count a change on the units it touches in a few minutes.
    #[arg(long, value_delimiter = ',', value_parser = scenarios::cost::parse_unit)]
    pub cost_units: Vec<String>,
    /// The cost scenario's contenders, comma-separated (default: atunnel
    /// and every peer installed).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub cost_contenders: Vec<atunnel_bench::peers::Contender>,
}

/// What `run` started, so that it can all be stopped whatever happened.
#[derive(Default)]
struct Stage {
    topo: Option<Topology>,
    sink: Option<Role>,
    worker: Option<Role>,
    load: Option<Role>,
}

/// Names of what `run` makes, known before anything is made, so that the
/// cleanup finds what a killed role left behind.
struct Names {
    out: PathBuf,
    /// Every namespace of the run starts with it (sandboxes included).
    prefix: String,
    /// atunnel's cgroup (the worker creates and removes it).
    cgroup: String,
}

pub async fn run(
    args: RunArgs,
    cancel: CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => PathBuf::from("runs").join(timestamp()),
    };
    let chosen = load::scenarios_to_run(&args.scenarios, args.compare);
    // Before anything is set up: a comparison with peers needs them here.
    if args.compare == Some(load::Compare::Peers) {
        atunnel_bench::peers::require_installed()?;
    }
    std::fs::create_dir_all(&out)?;
    // Absolute: the peers' configurations name files in it, and nginx reads
    // relative paths from its own prefix (/usr/share/nginx).
    let out = std::path::absolute(&out)?;
    let pid = std::process::id();
    let names = Names {
        out,
        prefix: format!("atb{}-", pid % 100_000),
        cgroup: format!("atunnel-bench-{pid}/tunnel"),
    };
    eprintln!("atunnel-bench run: folder {}", names.out.display());
    // What a run killed inside a cost window left changed.
    recover_lockstep();
    let started = Instant::now();
    let mut stage = Stage::default();
    let outcome = tokio::select! {
        r = perform(&args, &names, &chosen, &mut stage) => r,
        _ = cancel.cancelled() => {
            eprintln!("interrupted: cleaning up");
            Ok(())
        }
    };
    stage.clear(&names).await;
    outcome?;
    let txt = names.out.join("results.txt");
    eprintln!(
        "[{:>5.0}s] done: {}",
        started.elapsed().as_secs_f64(),
        txt.display()
    );
    match std::fs::read_to_string(&txt) {
        Ok(text) => print!("{text}"),
        // Interrupted before the load generator wrote anything.
        Err(e) if cancel.is_cancelled() => eprintln!("no results: {e}"),
        Err(e) => return Err(format!("{}: {e}", txt.display()).into()),
    }
    Ok(())
}

/// Sets the stage, starts the roles in their namespaces and waits for the
/// load generator to finish. Whatever it started is in `stage`.
async fn perform(
    args: &RunArgs,
    names: &Names,
    chosen: &[Scenario],
    stage: &mut Stage,
) -> Result<(), atunnel_process::BoxError> {
    let out = &names.out;
    let pki = pki::write(&out.join("pki"))?;
    let topo = stage.topo.insert(Topology::create(&names.prefix).await?);
    let mut sink_args = vec![
        "sink".into(),
        arg("listen", std::net::SocketAddr::from((SINK_ADDR, 443))),
        arg("cert", pki.gateway_cert().display()),
        arg("key", pki.gateway_key().display()),
        arg("actor-ca", pki.actor_ca_cert().display()),
        arg("source-bytes", 1u64 << 30),
        // The far end of HAProxy's egress relay (`--compare peers`, cost).
        arg(
            "tls-services-port-offset",
            atunnel_support::sink_tls::DEFAULT_PORT_OFFSET,
        ),
    ];
    sink_args.extend(args.sink_arg.iter().cloned());
    let sink = role::start_in(&topo.exec, &topo.sink, &sink_args, None).await?;
    let sink_pid = sink.pid();
    stage.sink = Some(sink);
    let control = out.join("worker.sock");
    // 5 in the quick run: noisy-neighbour's actors-at-budget wants a victim
    // and four hostile actors.
    let actors = args.actors.unwrap_or(if args.quick { 5 } else { 16 });
    let mut worker_args = vec![
        "worker".into(),
        arg("control", control.display()),
        arg("pki", pki.dir.display()),
        arg(
            "node-agent-socket",
            out.join("ateom-support.sock").display(),
        ),
        arg("actors", actors),
        arg("tunnel-cpus", args.tunnel_cpus),
        arg("tunnel-memory-mib", args.tunnel_memory_mib),
        arg("cgroup", &names.cgroup),
        arg("netns-prefix", topology::sandbox_prefix(&names.prefix)),
    ];
    worker_args.extend(args.tunnel_arg.iter().map(|a| arg("tunnel-arg", a)));
    stage.worker = Some(role::start_in(&topo.exec, &topo.worker, &worker_args, None).await?);
    let mut load_args = vec![
        "load".into(),
        arg("control", control.display()),
        arg("pki", pki.dir.display()),
        arg("netns-prefix", &names.prefix),
        arg("out", out.display()),
    ];
    if !chosen.is_empty() {
        let names: Vec<&str> = chosen.iter().map(|s| s.name()).collect();
        load_args.push(arg("scenarios", names.join(",")));
    }
    if let Some(c) = args.compare {
        load_args.push(arg("compare", c.name()));
    }
    if let Some(pid) = sink_pid {
        load_args.push(arg("sink-pid", pid));
    }
    if args.quick {
        load_args.push("--quick".into());
    }
    if args.cost_free_scheduling {
        load_args.push("--cost-free-scheduling".into());
    }
    if !args.cost_units.is_empty() {
        load_args.push(arg("cost-units", args.cost_units.join(",")));
    }
    if !args.cost_contenders.is_empty() {
        let names: Vec<&str> = args.cost_contenders.iter().map(|c| c.name()).collect();
        load_args.push(arg("cost-contenders", names.join(",")));
    }
    if let Some(n) = args.idle_conns {
        load_args.push(arg("idle-conns", n));
    }
    let load = stage
        .load
        .insert(role::start_in(&topo.exec, &topo.load, &load_args, None).await?);
    let status = load.child.wait().await?;
    stage.load = None;
    if !status.success() {
        return Err(format!("the load generator failed ({status})").into());
    }
    Ok(())
}

impl Stage {
    /// Stops the roles (the load generator first, so that it writes what it
    /// has), kills whatever is left in the run's namespaces, removes
    /// atunnel's cgroup if the worker could not, and the namespaces.
    async fn clear(mut self, names: &Names) {
        if let Some(load) = self.load.take() {
            load.stop_within(LOAD_GRACE).await;
        }
        if let Some(worker) = self.worker.take() {
            worker.stop_within(WORKER_GRACE).await;
        }
        if let Some(sink) = self.sink.take() {
            sink.stop().await;
        }
        let killed = role::kill_processes_in_namespaces(&names.prefix);
        // A load role stopped inside a cost window left the machine's
        // real-time throttling off.
        recover_lockstep();
        if killed > 0 {
            eprintln!("atunnel-bench run: killed {killed} processes left in the run's namespaces");
        }
        match atunnel_measure::cgroup::remove_leftover(&names.cgroup) {
            Ok(true) => eprintln!("atunnel-bench run: removed the cgroup the worker left"),
            Ok(false) => {}
            Err(e) => eprintln!("atunnel-bench run: removing cgroup {}: {e}", names.cgroup),
        }
        if let Some(topo) = self.topo.take() {
            topo.destroy().await;
        }
        role::sweep_namespaces(&names.prefix).await;
        remove_socket(&names.out.join("worker.sock"));
        remove_socket(&names.out.join("ateom-support.sock"));
    }
}

/// Puts back what a cost window's lockstep left changed if its process
/// was killed inside it (`atunnel_bench::lockstep::recover_if_idle`).
fn recover_lockstep() {
    for line in atunnel_bench::lockstep::recover_if_idle() {
        eprintln!("atunnel-bench run: {line}");
    }
}

/// Removes a Unix socket a killed role left in the run folder.
fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// `run`'s flags, parsed as the binary parses them.
    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    #[test]
    fn help_lists_the_scenarios_and_scenarios_parses_their_names() {
        let help = Run::command().render_long_help().to_string();
        for s in Scenario::ALL {
            assert!(help.contains(s.name()), "{s} missing from:\n{help}");
        }
        let run = Run::try_parse_from(["run", "--scenarios", "socket-memory,egress-idle"])
            .expect("known names");
        assert_eq!(
            run.args.scenarios,
            [Scenario::SocketMemory, Scenario::EgressIdle]
        );
        assert!(Run::try_parse_from(["run", "--scenarios", "egress"]).is_err());
    }

    #[test]
    fn cost_units_and_contenders_parse_their_names_and_refuse_others() {
        let run = Run::try_parse_from([
            "run",
            "--cost-units",
            "egress-upload,ingress-idle",
            "--cost-contenders=atunnel,haproxy",
        ])
        .expect("known names");
        assert_eq!(run.args.cost_units, ["egress-upload", "ingress-idle"]);
        assert_eq!(
            run.args.cost_contenders,
            [
                atunnel_bench::peers::Contender::Atunnel,
                atunnel_bench::peers::Contender::Haproxy
            ]
        );
        let err = Run::try_parse_from(["run", "--cost-units", "egress-up"])
            .err()
            .expect("an unknown unit is refused")
            .to_string();
        assert!(err.contains("egress-upload"), "names the units: {err}");
        assert!(Run::try_parse_from(["run", "--cost-contenders", "envoy"]).is_err());
        let run = Run::try_parse_from(["run"]).expect("no flags");
        assert!(run.args.cost_units.is_empty() && run.args.cost_contenders.is_empty());
    }
}
