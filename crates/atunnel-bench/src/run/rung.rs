//! Measuring rungs: the CPU and memory window around one (and its
//! verdict), the ladders of rates, and the sustainable rate of a ladder.

use std::time::{Duration, Instant};

use atunnel_bench::cgroup::CgroupSample;
use atunnel_bench::load::results::{Latency, RungResult};
use atunnel_bench::load::schedule::RungOutcome;
use atunnel_bench::load::verdict::{RungEvidence, Verdict, sustainable_rate, verdict};
use atunnel_support::stats_client::num;

use super::bench::Bench;
use crate::role::process_cpu_seconds;

/// CPU and memory around one rung.
pub(super) struct Window {
    t0: Instant,
    cg: CgroupSample,
    generator: f64,
    far_end: f64,
    far_pid: Option<u32>,
}

impl Window {
    pub(super) fn open(bench: &Bench, far_pid: Option<u32>) -> Self {
        Self {
            t0: Instant::now(),
            cg: bench.cgroup_sample(),
            generator: process_cpu_seconds(std::process::id()),
            far_end: far_pid.map_or(0.0, process_cpu_seconds),
            far_pid,
        }
    }

    /// Closes the window: the rung's result with its verdict.
    pub(super) async fn close(self, bench: &mut Bench, out: &RungOutcome) -> RungResult {
        let secs = self.t0.elapsed().as_secs_f64().max(1e-3);
        let cg = bench.cgroup_sample();
        let alive = bench.check_tunnel().await.unwrap_or(false);
        let stats = bench.stats(false).await.unwrap_or_default();
        // The machine's cores not given to the tunnel are shared by the
        // generator and the far end.
        let others = (cores() - bench.tunnel_cpus()).max(0.5);
        let evidence = RungEvidence {
            offered: out.offered,
            achieved: out.achieved,
            errors: out.errors,
            completed: out.completed,
            shed: out.shed,
            dispatch_lag_p99_us: out.dispatch_lag_p99_us(),
            tunnel_cpu_cores: cg.cpu_seconds_since(&self.cg) / secs,
            tunnel_cpu_quota: bench.tunnel_cpus(),
            tunnel_throttled: cg.throttled_since(&self.cg),
            generator_cpu_cores: (process_cpu_seconds(std::process::id()) - self.generator) / secs,
            generator_cpu_available: others,
            far_end_cpu_cores: self.far_pid.map_or(0.0, process_cpu_seconds) - self.far_end,
            far_end_cpu_available: others,
            tunnel_died: !alive,
        };
        let far_end_cpu_cores = evidence.far_end_cpu_cores / secs;
        let evidence = RungEvidence {
            far_end_cpu_cores,
            ..evidence
        };
        let v = verdict(&evidence);
        eprintln!(
            "         rung {:>7.0}/s: achieved {:>8.1}/s, errors {}, shed {}, tunnel {:.2} cores, generator {:.2}, far end {:.2}, p99 {:.1} ms -> {}",
            out.offered,
            out.achieved,
            out.errors,
            out.shed,
            evidence.tunnel_cpu_cores,
            evidence.generator_cpu_cores,
            evidence.far_end_cpu_cores,
            Latency::from_histogram(&out.latency).p99 as f64 / 1e3,
            v
        );
        RungResult {
            offered: out.offered,
            achieved: out.achieved,
            errors: out.errors,
            verdict: v,
            tunnel_cpu_cores: evidence.tunnel_cpu_cores,
            tunnel_heap_bytes: num(&stats, &["process", "heap_bytes"]) as u64,
            tunnel_cgroup_bytes: cg.memory_bytes,
            latency_us: Latency::from_histogram(&out.latency),
            shed: out.shed,
            dispatch_lag_p99_us: out.dispatch_lag_p99_us(),
            notes: out.first_error.clone().unwrap_or_default(),
        }
    }
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// The rates of a ladder and how long each rung lasts, short with `--quick`.
pub(super) fn ladder(bench: &Bench, quick: &[f64], full: &[f64]) -> (Vec<f64>, Duration) {
    if bench.quick {
        (quick.to_vec(), Duration::from_secs(3))
    } else {
        (full.to_vec(), Duration::from_secs(10))
    }
}

/// The ladder's sustainable rate: its highest `ok` rung that kept up.
pub(super) fn sustainable(rungs: &[RungResult]) -> Option<f64> {
    let list: Vec<(f64, f64, Verdict)> = rungs
        .iter()
        .map(|r| (r.offered, r.achieved, r.verdict))
        .collect();
    sustainable_rate(&list)
}
