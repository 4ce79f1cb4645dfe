//! One window of N units under a pass (callgrind or perf), in lockstep,
//! and what it read around it (allocations, hibernations).

use super::*;

/// What one window counted (each pass fills its part).
#[derive(Debug, Default)]
pub(super) struct Window {
    pub(super) instructions: Option<u64>,
    /// perf's counts, read once it has stopped (`StoppingPerf`): the
    /// windows after it go on meanwhile.
    pub(super) sys: Option<tokio::task::JoinHandle<Result<SyscallCounts, cost::CostError>>>,
    pub(super) allocations: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// The contender as it is, perf attached: syscalls, switches,
    /// allocations.
    Perf,
    /// The contender under callgrind: instructions.
    Callgrind,
}

/// atunnel's allocations so far (none for a peer).
pub(super) async fn allocations(bench: &Bench) -> Result<Option<u64>, atunnel_process::BoxError> {
    if !bench.is_atunnel() {
        return Ok(None);
    }
    Ok(Some(bench.stats(false).await?.process.allocations))
}

/// One window of `n` units: the pass's counts, its callgrind dump kept as
/// `dir/<label>.callgrind` (the profile of the unit).
pub(super) async fn window(
    bench: &Bench,
    pass: Pass,
    unit: Unit,
    n: u64,
    dir: &Path,
    label: &str,
) -> Result<Window, atunnel_process::BoxError> {
    let mut prepared = prepare(bench, unit, n).await?;
    let pids = bench.contender_pids()?;
    let lockstep = bench.cost_lockstep;
    let allocs0 = allocations(bench).await?;
    let hib0 = hibernations(bench, unit).await?;
    let mut out = Window::default();
    match pass {
        Pass::Perf => {
            let file = dir.join(format!("{label}.perf.txt"));
            let p = pids.clone();
            let (mut perf, step) = tokio::task::spawn_blocking(move || {
                // What came before (the last window's connections closing,
                // this one's set-up) finishes outside the window.
                cost::settle(&p, QUIET, SETTLE_MAX)?;
                let mut w = PerfWindow::attach(&p, &file)?;
                let step = engage(lockstep, &[w.pid()])?;
                w.enable()?;
                Ok::<_, atunnel_process::BoxError>((w, step))
            })
            .await??;
            let result = opened_then_work(bench, pass, unit, &mut prepared, n, hib0).await;
            let p = pids.clone();
            let stopping = tokio::task::spawn_blocking(move || {
                cost::settle(&p, QUIET, SETTLE_MAX)?;
                perf.disable()?;
                drop(step);
                Ok::<_, cost::CostError>(perf.stop())
            })
            .await??;
            out.sys = Some(tokio::task::spawn_blocking(move || stopping.wait()));
            result?;
        }
        Pass::Callgrind => {
            let procs: Vec<CallgrindProcess> = pids
                .iter()
                .map(|&pid| CallgrindProcess {
                    pid,
                    out_dir: dir.to_path_buf(),
                })
                .collect();
            let p = procs.clone();
            let settled = pids.clone();
            let step = tokio::task::spawn_blocking(move || {
                cost::settle(&settled, QUIET_CALLGRIND, SETTLE_MAX)?;
                let step = engage(lockstep, &[])?;
                p.iter().try_for_each(|c| c.open_window())?;
                Ok::<_, atunnel_process::BoxError>(step)
            })
            .await??;
            let result = opened_then_work(bench, pass, unit, &mut prepared, n, hib0).await;
            let (d, l) = (dir.to_path_buf(), label.to_string());
            let total = tokio::task::spawn_blocking(move || {
                cost::settle(&pids, QUIET_CALLGRIND, SETTLE_MAX)?;
                let mut total = 0;
                for c in &procs {
                    let keep = d.join(format!("{l}.{}.callgrind", c.pid));
                    total += c.close_window(&keep)?;
                }
                drop(step);
                Ok::<_, cost::CostError>(total)
            })
            .await??;
            result?;
            out.instructions = Some(total);
        }
    }
    let allocs1 = allocations(bench).await?;
    if let (Some(a), Some(b)) = (allocs0, allocs1) {
        out.allocations = Some(b.saturating_sub(a));
    }
    if let (Some(h0), Some(h1)) = (hib0, hibernations(bench, unit).await?) {
        if h1.hibernations - h0.hibernations < n as f64 {
            return Err(format!(
                "ingress-idle: {} of {n} connections hibernated in the window",
                h1.hibernations - h0.hibernations
            )
            .into());
        }
        // One trim per batch of hibernations (`Hibernation::trim_until`):
        // a window with none misses the purge's madvise calls, one with two
        // split it.
        if h1.trims - h0.trims != 1.0 {
            return Err(format!(
                "ingress-idle: {} trims in the window, not one",
                h1.trims - h0.trims
            )
            .into());
        }
    }
    Ok(out)
}

/// The window's work, once `opened` found nothing hibernated too early.
pub(super) async fn opened_then_work(
    bench: &Bench,
    pass: Pass,
    unit: Unit,
    prepared: &mut Prepared,
    n: u64,
    hib0: Option<Asleep>,
) -> Result<(), atunnel_process::BoxError> {
    opened(bench, unit, hib0).await?;
    work(bench, pass, unit, prepared, n).await
}

/// For ingress-idle, read as the window has just opened: an error if a
/// connection hibernated before it did (since the set-up, `hib0`), as its
/// hibernation's work would then be missing from the window's counts.
/// The read is one /stats request in each window, so it cancels out of
/// the pair's difference.
pub(super) async fn opened(
    bench: &Bench,
    unit: Unit,
    hib0: Option<Asleep>,
) -> Result<(), atunnel_process::BoxError> {
    if let (Some(h0), Some(h)) = (hib0, hibernations(bench, unit).await?)
        && h.hibernations > h0.hibernations
    {
        return Err(format!(
            "ingress-idle: {} connections hibernated before their window opened (the set-up took longer than --hibernate-after)",
            h.hibernations - h0.hibernations
        )
        .into());
    }
    Ok(())
}

/// Puts the run's processes (the `run` process that started this one, and
/// everything below it but `spare`) in lockstep on one CPU for a window, if
/// `on` (`atunnel_bench::lockstep`); released when dropped.
pub(super) fn engage(
    on: bool,
    spare: &[u32],
) -> Result<Option<Lockstep>, atunnel_process::BoxError> {
    if !on {
        return Ok(None);
    }
    // The load role is a child of `run`, beside the worker (atunnel, the
    // actors) and the sink: its parent is the root of every process a unit
    // of work passes through.
    let root = nix::unistd::getppid().as_raw() as u32;
    Ok(Some(Lockstep::engage(root, spare)?))
}

/// atunnel's hibernation counters, for the ingress-idle unit.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asleep {
    pub(super) hibernations: f64,
    pub(super) trims: f64,
}

/// atunnel's hibernations and trims so far, for the ingress-idle unit
/// (which fails unless every connection of the window hibernated in it).
pub(super) async fn hibernations(
    bench: &Bench,
    unit: Unit,
) -> Result<Option<Asleep>, atunnel_process::BoxError> {
    if unit != Unit::IngressIdle || !bench.is_atunnel() {
        return Ok(None);
    }
    let h = bench
        .stats(false)
        .await?
        .hibernation
        .ok_or("atunnel serves no ingress: nothing hibernates")?;
    Ok(Some(Asleep {
        hibernations: h.hibernations as f64,
        trims: h.trims as f64,
    }))
}

/// (big - small) / n, the per-unit figure.
pub(super) fn per(small: u64, big: u64, n: u64) -> f64 {
    (big as f64 - small as f64) / n as f64
}
