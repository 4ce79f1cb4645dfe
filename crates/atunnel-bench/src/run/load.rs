//! `atunnel-bench load`: the load generator and reporter. It runs in the
//! load namespace that `run` made, opens the other namespaces by name (it
//! dials from the actors' sandboxes as their programs would, and starts the
//! forwarding gateway of one socket-memory case in the sink's), asks the
//! worker over its control socket for atunnel's pids, cgroup and restarts,
//! runs the scenarios and writes the run folder.

use std::path::PathBuf;
use std::time::Instant;

use atunnel_bench::load::results::{self, Results, ScenarioResult};
use atunnel_bench::peers::Contender;
use atunnel_bench::scenario::{Scenario, cost};
use tokio_util::sync::CancellationToken;

use super::bench::Bench;
use super::report::{self, RunInfo};
use super::scenarios;

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
    #[arg(long, value_delimiter = ',', value_enum)]
    pub scenarios: Vec<Scenario>,
    /// Idle egress connections held by egress-idle (default 15,000; 1,000 with --quick).
    #[arg(long)]
    pub idle_conns: Option<usize>,
    /// Run folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// A setting to compare across variants (see `run --compare`).
    #[arg(long, value_enum)]
    pub compare: Option<Compare>,
    /// The cost scenario's windows under the normal scheduler (see `run`).
    #[arg(long)]
    pub cost_free_scheduling: bool,
    /// The cost scenario's units (see `run`).
    #[arg(long, value_delimiter = ',', value_parser = super::scenarios::cost::parse_unit)]
    pub cost_units: Vec<String>,
    /// The cost scenario's contenders (see `run`).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub cost_contenders: Vec<atunnel_bench::peers::Contender>,
}

/// Settings `--compare` sweeps, each variant on a fresh atunnel (or a peer
/// in its place).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The lean relay vs the reference's design before its fix.
    CopyMode,
    /// Waiting for data by readiness vs with a 512 B to 4 KiB wait buffer.
    WaitBuffer,
    /// atunnel vs nginx and HAProxy in its place (ingress-https,
    /// ingress-idle; HAProxy egress-tcp too, as a TCP -> TLS relay); needs
    /// `apt-get install nginx haproxy`.
    Peers,
}

/// One variant of a comparison: what runs in atunnel's place, with which
/// flags of atunnel's.
struct VariantSpec {
    label: String,
    contender: Contender,
    flags: Vec<String>,
}

impl VariantSpec {
    fn atunnel(label: impl Into<String>, flag: String) -> Self {
        Self {
            label: label.into(),
            contender: Contender::Atunnel,
            flags: vec![flag],
        }
    }
}

impl Compare {
    pub fn name(self) -> &'static str {
        match self {
            Compare::CopyMode => "copy-mode",
            Compare::WaitBuffer => "wait-buffer",
            Compare::Peers => "peers",
        }
    }

    /// The scenarios it runs under a variant with `contender` in atunnel's
    /// place: the peers do ingress, and HAProxy egress-tcp too (as a TCP ->
    /// TLS relay, the nearest peer doing its byte work).
    pub fn scenarios(self, contender: Contender) -> Vec<Scenario> {
        match self {
            Compare::CopyMode | Compare::WaitBuffer => vec![
                Scenario::EgressIdle,
                Scenario::EgressHttp,
                Scenario::EgressTcp,
            ],
            Compare::Peers => {
                let mut s = vec![Scenario::IngressHttps, Scenario::IngressIdle];
                if contender.relays_egress() {
                    s.push(Scenario::EgressTcp);
                }
                s
            }
        }
    }

    fn variants(self) -> Vec<VariantSpec> {
        match self {
            Compare::CopyMode => vec![
                VariantSpec::atunnel("lean", "--copy-mode=lean".into()),
                VariantSpec::atunnel("naive", "--copy-mode=naive".into()),
            ],
            Compare::Peers => Contender::ALL
                .into_iter()
                .map(|contender| VariantSpec {
                    label: contender.name().into(),
                    contender,
                    flags: Vec::new(),
                })
                .collect(),
            Compare::WaitBuffer => [0usize, 512, 1024, 2048, 4096]
                .into_iter()
                .map(|n| {
                    let label = if n == 0 {
                        "0 (readiness)".into()
                    } else {
                        format!("{n} B")
                    };
                    VariantSpec::atunnel(label, format!("--wait-buffer={n}"))
                })
                .collect(),
        }
    }
}

/// The scenarios to run, in order: the ones named (`--scenarios` accepts
/// only known ones), else all of them; but a comparison with none named
/// runs only its own.
pub fn scenarios_to_run(named: &[Scenario], compare: Option<Compare>) -> Vec<Scenario> {
    if named.is_empty() {
        return match compare {
            Some(_) => Vec::new(),
            None => Scenario::ALL.to_vec(),
        };
    }
    named.to_vec()
}

pub async fn run(
    args: LoadArgs,
    cancel: CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let chosen = scenarios_to_run(&args.scenarios, args.compare);
    std::fs::create_dir_all(&args.out)?;
    let mut bench = Bench::open(
        &args.control,
        &args.pki,
        &args.netns_prefix,
        args.quick,
        args.idle_conns
            .unwrap_or(if args.quick { 1000 } else { 15_000 }),
        args.sink_pid,
    )
    .await?;
    bench.set_out_dir(&std::fs::canonicalize(&args.out)?);
    bench.cost_lockstep = !args.cost_free_scheduling;
    bench.cost_units = args.cost_units.clone();
    bench.cost_contenders = args.cost_contenders.clone();
    let names: Vec<&str> = chosen.iter().map(|s| s.name()).collect();
    println!(
        "{}",
        serde_json::json!({"load": "ready", "scenarios": names})
    );
    let started = Instant::now();
    let mut results = Results::default();
    for &scenario in &chosen {
        eprintln!(
            "[{:>5.0}s] scenario {scenario}",
            started.elapsed().as_secs_f64()
        );
        let Some(result) = run_scenario(&mut bench, scenario, &cancel).await else {
            eprintln!("interrupted: writing what is done");
            break;
        };
        if let Some(counts) = result.summary::<cost::Summary>() {
            results.cost = Some(counts);
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
        'variants: for spec in compare.variants() {
            eprintln!(
                "[{:>5.0}s] compare {}: {}",
                started.elapsed().as_secs_f64(),
                compare.name(),
                spec.label
            );
            bench.restart_as(spec.contender, spec.flags.clone()).await?;
            let mut variant = results::Variant {
                label: spec.label,
                flags: spec.flags,
                scenarios: Vec::new(),
            };
            for scenario in compare.scenarios(spec.contender) {
                let Some(result) = run_scenario(&mut bench, scenario, &cancel).await else {
                    break 'variants;
                };
                variant.scenarios.push(result);
            }
            comparison.variants.push(variant);
        }
        eprint!("{}", results::comparison_table(&comparison));
        results.comparisons.push(comparison);
        results::write_results_json(&args.out, &results)?;
        bench.restart_as(Contender::Atunnel, Vec::new()).await?;
    }
    // The deaths the worker saw, for the report (the last status if it is
    // already gone).
    let status = match bench.worker.status().await {
        Ok(s) => s,
        Err(_) => bench.last_status().clone(),
    };
    let info = RunInfo {
        quick: args.quick,
        tunnel_cpus: status.cpus,
        tunnel_memory_mib: status.memory_bytes >> 20,
        tunnel_arg: status.base_args.clone(),
        compare: args.compare.map(Compare::name),
        // Named when they are not what the same command without
        // --scenarios would run.
        scenarios: (chosen != scenarios_to_run(&[], args.compare)).then(|| chosen.clone()),
    };
    results::write_results_json(&args.out, &results)?;
    results::write_results_txt(&args.out, &results)?;
    let plots = atunnel_bench::load::plots::write_plots(&args.out, &results)?;
    report::write(&args.out, &info, &results, &plots, &status.events)?;
    Ok(())
}

/// Runs `scenario` and prints its summary lines; a scenario that failed is
/// a result with the error in its notes. `None` once `cancel` fires.
async fn run_scenario(
    bench: &mut Bench,
    scenario: Scenario,
    cancel: &CancellationToken,
) -> Option<ScenarioResult> {
    let result = tokio::select! {
        _ = cancel.cancelled() => return None,
        r = scenarios::run(bench, scenario) => r,
    };
    let result = result.unwrap_or_else(|e| {
        ScenarioResult::without_summary(scenario, vec![format!("scenario failed: {e}")])
    });
    for line in report::summary_lines(&result) {
        eprintln!("         {line}");
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `load`'s flags, parsed as the binary parses them.
    #[derive(Parser)]
    struct Load {
        #[command(flatten)]
        args: LoadArgs,
    }

    fn parse(scenarios: &str) -> Result<LoadArgs, clap::Error> {
        Load::try_parse_from([
            "load",
            "--control=worker.sock",
            "--pki=pki",
            "--netns-prefix=atb-",
            "--out=out",
            &format!("--scenarios={scenarios}"),
        ])
        .map(|l| l.args)
    }

    #[test]
    fn a_comparison_alone_runs_only_its_own_scenarios() {
        let compare = Some(Compare::CopyMode);
        assert_eq!(scenarios_to_run(&[], None), Scenario::ALL);
        assert!(scenarios_to_run(&[], compare).is_empty());
        let tcp = [Scenario::EgressTcp];
        assert_eq!(scenarios_to_run(&tcp, compare), tcp);
        assert_eq!(scenarios_to_run(&tcp, None), tcp);
    }

    #[test]
    fn the_peers_comparison_runs_each_contender_on_ingress_and_the_relays_on_egress_tcp() {
        let variants = Compare::Peers.variants();
        let labels: Vec<&str> = variants.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(labels, ["atunnel", "nginx", "haproxy"]);
        let contenders: Vec<Contender> = variants.iter().map(|v| v.contender).collect();
        assert_eq!(contenders, Contender::ALL);
        assert!(variants.iter().all(|v| v.flags.is_empty()));
        let ingress = [Scenario::IngressHttps, Scenario::IngressIdle];
        assert_eq!(Compare::Peers.scenarios(Contender::Nginx), ingress);
        for relay in [Contender::Atunnel, Contender::Haproxy] {
            assert_eq!(
                Compare::Peers.scenarios(relay),
                [ingress[0], ingress[1], Scenario::EgressTcp]
            );
        }
        // The other comparisons vary atunnel's flags on egress.
        for v in Compare::CopyMode.variants() {
            assert_eq!(v.contender, Contender::Atunnel);
            assert_eq!(v.flags.len(), 1);
        }
        assert_eq!(
            Compare::WaitBuffer.scenarios(Contender::Atunnel)[0],
            Scenario::EgressIdle
        );
    }

    #[test]
    fn scenarios_are_named_and_unknown_names_refused_with_the_known_ones() {
        let args = parse("egress-tcp,ingress-idle").expect("known names");
        assert_eq!(args.scenarios, [Scenario::EgressTcp, Scenario::IngressIdle]);
        let error = parse("egress-tcp,egress-nope")
            .expect_err("an unknown name")
            .to_string();
        assert!(error.contains("egress-nope"), "{error}");
        for s in Scenario::ALL {
            assert!(error.contains(s.name()), "{s} missing from: {error}");
        }
    }
}
