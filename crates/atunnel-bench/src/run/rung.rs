//! Measuring rungs: the CPU and memory window around one (and its
//! verdict), the ladders of rates, and the sustainable rate of a ladder.

use std::future::Future;
use std::time::{Duration, Instant};

use atunnel_bench::load::results::{Latency, RungResult};
use atunnel_bench::load::verdict::{RungEvidence, Verdict, sustainable_rate, verdict};
use atunnel_host::CgroupSample;
use atunnel_measure::schedule::{Rung, RungOutcome, run_rung, run_saturated};

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
        // A peer has no /stats: its heap is not known (0).
        let heap = bench
            .stats(false)
            .await
            .map_or(0, |s| s.process.heap_bytes as u64);
        // The machine's cores not given to the tunnel are shared by the
        // generator and the far end.
        let others = (cores() - bench.tunnel_cpus()).max(0.5);
        let evidence = RungEvidence {
            tunnel_cpu_cores: cg.cpu_seconds_since(&self.cg) / secs,
            tunnel_cpu_quota: bench.tunnel_cpus(),
            tunnel_throttled: cg.throttled_since(&self.cg),
            generator_cpu_cores: (process_cpu_seconds(std::process::id()) - self.generator) / secs,
            generator_cpu_available: others,
            far_end_cpu_cores: (self.far_pid.map_or(0.0, process_cpu_seconds) - self.far_end)
                / secs,
            far_end_cpu_available: others,
            tunnel_died: !alive,
            ..RungEvidence::of(out)
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
            tunnel_cpu_cores: evidence.tunnel_cpu_cores,
            tunnel_heap_bytes: heap,
            tunnel_cgroup_bytes: cg.memory_bytes,
            ..RungResult::of(out, v)
        }
    }
}

/// Runs `work` for one rung inside a [`Window`] whose far end is
/// `far(bench)`: the rung's result with its verdict, and what the scheduler
/// counted.
pub(super) async fn measure<F, Fut>(
    bench: &mut Bench,
    far: fn(&Bench) -> Option<u32>,
    rung: &Rung,
    work: F,
) -> (RungResult, RungOutcome)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let window = Window::open(bench, far(bench));
    let outcome = run_rung(rung, work).await;
    (window.close(bench, &outcome).await, outcome)
}

/// Runs `work` with `concurrency` units always in flight for `duration`
/// ([`run_saturated`]) inside a [`Window`] whose far end is `far(bench)`:
/// the contender at saturation, with its verdict (whether the tunnel, the
/// generator or the far end ran out of CPU first).
pub(super) async fn measure_saturated<F, Fut>(
    bench: &mut Bench,
    far: fn(&Bench) -> Option<u32>,
    concurrency: usize,
    duration: Duration,
    work: F,
) -> RungResult
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let window = Window::open(bench, far(bench));
    let outcome = run_saturated(concurrency, duration, work).await;
    window.close(bench, &outcome).await
}

/// Climbs a ladder (its rates and how long each rung lasts): one
/// [`measure`]d rung per rate, at most `max_in_flight` units at once.
pub(super) async fn climb<F, Fut>(
    bench: &mut Bench,
    far: fn(&Bench) -> Option<u32>,
    (rates, duration): (Vec<f64>, Duration),
    max_in_flight: usize,
    work: F,
) -> Vec<RungResult>
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let mut rungs = Vec::new();
    for rate in rates {
        let rung = Rung {
            rate,
            duration,
            max_in_flight,
        };
        rungs.push(measure(bench, far, &rung, work.clone()).await.0);
    }
    rungs
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// How long a rung lasts: short with `--quick`.
pub(super) fn rung_duration(bench: &Bench) -> Duration {
    Duration::from_secs(if bench.quick { 3 } else { 10 })
}

/// The rates of a ladder, `quick` ones with `--quick`, and how long each
/// rung lasts.
pub(super) fn ladder(bench: &Bench, quick: &[f64], full: &[f64]) -> (Vec<f64>, Duration) {
    let rates = if bench.quick { quick } else { full };
    (rates.to_vec(), rung_duration(bench))
}

/// The ladder's sustainable rate: its highest `ok` rung that kept up.
pub(super) fn sustainable(rungs: &[RungResult]) -> Option<f64> {
    let list: Vec<(f64, f64, Verdict)> = rungs
        .iter()
        .map(|r| (r.offered, r.achieved, r.verdict))
        .collect();
    sustainable_rate(&list)
}
