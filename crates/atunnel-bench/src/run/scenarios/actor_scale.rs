//! actor-scale: many actors on one atunnel, brought up and torn down
//! through its control API as a worker does. Each actor gets a real sandbox
//! (two namespaces, a veth, the redirect), a prepared egress and an
//! activation, one at a time; then one idle egress connection from every
//! sandbox; then, once the connections and the actors' pooled gateway
//! connections closed, what an idle actor costs; then every sandbox closed.
//!
//! Reported: time per sandbox (p50/p99, first and last tenth, so a cost
//! that grows with the count shows) and in total, atunnel's CPU per
//! sandbox at its 1-CPU quota, atunnel's heap and cgroup per idle actor
//! (with and without its pooled gateway connection, the connection and
//! the idle tunnel each beside it), the kernel's share, descriptors per
//! actor, the teardown time, and what teardown left behind (namespaces,
//! descriptors, actors atunnel still knows, heap).

use std::path::Path;
use std::time::{Duration, Instant};

use atunnel::control::proto;
use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::scenario::actor_scale::{AfterTeardown, Summary, TenthCpu, Timing};
use atunnel_sandbox::NetNs;
use atunnel_support::stats_client::Stats;
use tokio::net::TcpStream;

use crate::control::Control;
use crate::run::bench::Bench;
use crate::traffic::{ECHO, ping};

type BoxError = atunnel_process::BoxError;

/// Actors brought up: the 1,000, or a tenth with `--quick`.
fn actor_count(quick: bool) -> usize {
    if quick { 100 } else { 1000 }
}

/// A pooled gateway connection with no tunnel closes after this, so the
/// scenario sees an idle actor without one soon after its tunnels closed;
/// long enough that every pooled connection is still open when the tunnels'
/// closes have been seen, so the two are told apart (at 10 s, 643 of 1,000
/// had closed by then).
fn gateway_idle(quick: bool) -> &'static str {
    if quick { "10s" } else { "30s" }
}
/// How long the scenario waits for closes to be seen (tunnels, pooled
/// connections).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// The scenario's actors are their own atespace, apart from the worker's.
fn actor(i: usize) -> proto::Actor {
    proto::Actor {
        atespace: "scale".into(),
        name: format!("actor-{i}"),
        uid: format!("scale-{i}"),
    }
}

/// Milliseconds at quantile `q` of `sorted`.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    (sorted[at].as_secs_f64() * 1e6).round() / 1e3
}

/// p50 and p99 of `times`, and the p50 of its first and last tenth (in
/// the order taken), in ms.
fn timing(times: &[Duration]) -> Timing {
    let mut sorted = times.to_vec();
    sorted.sort();
    let tenth = (times.len() / 10).max(1);
    let p50_of = |part: &[Duration]| {
        let mut p = part.to_vec();
        p.sort();
        quantile_ms(&p, 0.5)
    };
    let (first, last) = (
        p50_of(&times[..tenth.min(times.len())]),
        p50_of(&times[times.len().saturating_sub(tenth)..]),
    );
    Timing {
        p50_ms: quantile_ms(&sorted, 0.5),
        p99_ms: quantile_ms(&sorted, 0.99),
        max_ms: quantile_ms(&sorted, 1.0),
        first_tenth_p50_ms: first,
        last_tenth_p50_ms: last,
        last_over_first: if first > 0.0 {
            ((last / first) * 100.0).round() / 100.0
        } else {
            0.0
        },
    }
}

/// The kernel's memory outside any one process, host-wide: slab and
/// per-CPU allocations (`/proc/meminfo`), where namespaces, devices and
/// nftables live. Other work on the machine moves it too.
fn kernel_bytes() -> u64 {
    atunnel_host::memory::kernel_bytes().unwrap_or(0)
}

/// One reading of what atunnel holds.
struct Reading {
    heap: f64,
    rss: f64,
    fds: f64,
    cgroup: u64,
    kernel_cgroup: u64,
    kernel_host: u64,
    cpu_ns: u64,
}

async fn read(bench: &Bench) -> Result<(Reading, Stats), BoxError> {
    let stats = bench.stats(true).await?;
    let cg = bench.cgroup_sample();
    Ok((
        Reading {
            heap: stats.process.heap_bytes as f64,
            rss: stats.process.rss_bytes as f64,
            fds: stats.process.open_fds as f64,
            cgroup: cg.memory_bytes,
            kernel_cgroup: cg.kernel_bytes,
            kernel_host: kernel_bytes(),
            cpu_ns: cg.cpu_usage_ns,
        },
        stats,
    ))
}

/// atunnel's user and system CPU seconds so far.
async fn cpu(bench: &Bench) -> Result<(f64, f64), BoxError> {
    let s = bench.stats(false).await?;
    Ok((s.process.cpu_user_s, s.process.cpu_system_s))
}

/// The sum of every actor's pooled gateway connections.
fn gateway_connections(stats: &Stats) -> f64 {
    stats
        .egress_actors
        .iter()
        .map(|a| a.gateway_connections as f64)
        .sum()
}

/// Polls /stats until `done` holds (closes have nothing to await from
/// here), for [`SETTLE_LIMIT`] at most.
async fn settle(bench: &Bench, done: impl Fn(&Stats) -> bool) -> Result<bool, BoxError> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let s = bench.stats(false).await?;
        if done(&s) {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) async fn actor_scale(bench: &mut Bench) -> Result<ScenarioResult, BoxError> {
    let n = actor_count(bench.quick);
    let mut flags = bench.tunnel_args().to_vec();
    flags.push(format!(
        "--gateway-idle-timeout={}",
        gateway_idle(bench.quick)
    ));
    bench.restart_tunnel(flags).await?;
    let status = bench.last_status().clone();
    let socket = status
        .atunnel_control
        .clone()
        .ok_or("the worker names no control socket for atunnel")?;
    let (address, server_name) = status
        .gateway
        .clone()
        .ok_or("the worker names no gateway for atunnel's actors")?;
    let gateway = proto::Gateway {
        address,
        server_name,
    };
    let mut control = Control::connect(Path::new(&socket), gateway);
    let result = scale(bench, &mut control, n).await;
    // Whatever happened, close what this scenario opened (idempotent).
    for i in 0..n {
        let _ = control.close_sandbox(&actor(i)).await;
    }
    result
}

async fn scale(
    bench: &mut Bench,
    control: &mut Control,
    n: usize,
) -> Result<ScenarioResult, BoxError> {
    let mut notes = Vec::new();
    let (base, base_stats) = read(bench).await?;
    let base_gateway_conns = gateway_connections(&base_stats);

    // Up, one actor at a time, as a worker places them.
    let mut up_times = Vec::with_capacity(n);
    let mut netns = Vec::with_capacity(n);
    let started = Instant::now();
    let mut half = None;
    // atunnel's user and system CPU over the first and the last tenth: a
    // cost growing with the count shows in one or the other (atunnel's own
    // work, or the kernel's for the namespaces).
    let tenth = (n / 10).max(1);
    let mut cpu_marks = Vec::with_capacity(4);
    for i in 0..n {
        if i == 0 || i == n - tenth {
            cpu_marks.push(cpu(bench).await?);
        }
        let t = Instant::now();
        netns.push(control.bring_up(&actor(i)).await?);
        up_times.push(t.elapsed());
        if i + 1 == tenth || i + 1 == n {
            cpu_marks.push(cpu(bench).await?);
        }
        if i + 1 == n / 2 {
            half = Some(read(bench).await?.0);
        }
    }
    let tenth_cpu = |from: usize| {
        let (a, b) = (cpu_marks.get(from), cpu_marks.get(from + 1));
        a.zip(b).map(|((u0, s0), (u1, s1))| TenthCpu {
            user_ms_per_actor: ((u1 - u0) * 1e3 / tenth as f64 * 100.0).round() / 100.0,
            system_ms_per_actor: ((s1 - s0) * 1e3 / tenth as f64 * 100.0).round() / 100.0,
        })
    };
    let (first_tenth_cpu, last_tenth_cpu) = (tenth_cpu(0), tenth_cpu(2));
    let up_total = started.elapsed();
    let (up, _) = read(bench).await?;
    let half = half.ok_or("fewer than two actors")?;

    // One idle egress connection from every sandbox: each actor's first
    // tunnel, over its own pooled gateway connection.
    let sandboxes: Vec<NetNs> = netns
        .iter()
        .map(|name| NetNs::open(name))
        .collect::<Result<_, _>>()?;
    let mut held: Vec<TcpStream> = Vec::with_capacity(n);
    let dest = ECHO.parse()?;
    let mut dial_failures = 0u64;
    for ns in &sandboxes {
        match crate::topology::connect_in(&bench.topo.exec, ns, dest).await {
            Ok(mut s) => match ping(&mut s).await {
                Ok(()) => held.push(s),
                Err(_) => dial_failures += 1,
            },
            Err(_) => dial_failures += 1,
        }
    }
    let (busy, busy_stats) = read(bench).await?;
    let pooled = gateway_connections(&busy_stats) - base_gateway_conns;
    let idle_tunnels = held.len();
    // Reset, not FIN: a half-closed tunnel waits for the far end's half
    // (the sink's echo holds it), and the scenario wants them gone now.
    for s in &held {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
    drop(held);
    let tunnels_closed = settle(bench, |s| s.egress.is_none_or(|e| e.tunnels_open == 0)).await?;
    let (pooled_only, pooled_stats) = read(bench).await?;
    let pooled_left = gateway_connections(&pooled_stats) - base_gateway_conns;
    let pools_closed = settle(bench, |s| gateway_connections(s) <= base_gateway_conns).await?;
    let (idle, _) = read(bench).await?;
    if pooled_left < pooled {
        notes.push(format!(
            "{} of {pooled} pooled gateway connections closed before the tunnels' closes were all seen: the idle tunnel's and the pooled connection's heap are mixed",
            pooled - pooled_left
        ));
    }
    if !tunnels_closed || !pools_closed {
        notes.push(format!(
            "closes not all seen within {SETTLE_LIMIT:?}: tunnels closed {tunnels_closed}, pooled gateway connections closed {pools_closed}"
        ));
    }

    // Down.
    let mut down_times = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        control.close_sandbox(&actor(i)).await?;
        down_times.push(t.elapsed());
    }
    let down_total = started.elapsed();
    drop(sandboxes);
    let (gone, _) = read(bench).await?;
    let left_netns: Vec<String> = netns
        .iter()
        .filter(|name| Path::new("/run/netns").join(name).exists())
        .cloned()
        .collect();
    let still_known = control
        .list()
        .await?
        .iter()
        .filter(|a| a.actor.as_ref().is_some_and(|a| a.atespace == "scale"))
        .count();
    let left_fds = gone.fds - base.fds;

    let per = |v: f64| (v / n as f64).round();
    let per_i = |after: u64, before: u64| per(after as f64 - before as f64);
    let heap_idle = per(idle.heap - base.heap);
    let pass_heap = heap_idle <= 8.0 * 1024.0;
    let nothing_left = left_netns.is_empty() && still_known == 0 && left_fds <= 2.0;
    let growth = timing(&up_times).last_over_first;
    // `max(1)`: one actor has no first half.
    let heap_first_half = (half.heap - base.heap) / (n / 2).max(1) as f64;
    let heap_second_half = (up.heap - half.heap) / (n - n / 2) as f64;
    if dial_failures > 0 {
        notes.push(format!(
            "{dial_failures} of {n} sandboxes' idle connections failed to open"
        ));
    }
    notes.push(format!(
        "{n} actors (atespace \"scale\"), each brought up through atunnel's control API one at a time (ServeSandbox, PrepareEgress, Activate) beside the worker's own; atunnel at its cgroup's CPU quota; then one idle egress connection (a byte echoed) from every sandbox; then closed, and once atunnel's pooled gateway connections closed ({} idle timeout) the idle actors measured; then CloseSandbox for each",
        gateway_idle(bench.quick)
    ));
    notes.push("heap and descriptors from atunnel's /stats (after releasing free memory); cgroup: atunnel's cgroup memory (its kernel share is the cgroup's kmem figure, which holds the namespaces, veth devices and nftables atunnel creates); kernel_host: /proc/meminfo Slab + Percpu + KernelStack + PageTables, host-wide, moved by anything else on the machine too".into());
    notes.push(format!(
        "pass: heap per idle actor <= 8 KiB once its pooled connection closed, and teardown leaves no namespace, no descriptor, no actor atunnel knows; growth: the last tenth's bring-up p50 over the first tenth's is {growth}"
    ));
    let cpu_ms_per_actor = |after: u64, before: u64| {
        (after.saturating_sub(before) as f64 / n as f64 / 1e4).round() / 100.0
    };
    let summary = Summary {
        actors: n,
        bring_up: timing(&up_times),
        bring_up_cpu_first_tenth: first_tenth_cpu,
        bring_up_cpu_last_tenth: last_tenth_cpu,
        bring_up_total_s: (up_total.as_secs_f64() * 100.0).round() / 100.0,
        bring_up_cpu_ms_per_actor: cpu_ms_per_actor(up.cpu_ns, base.cpu_ns),
        teardown: timing(&down_times),
        teardown_total_s: (down_total.as_secs_f64() * 100.0).round() / 100.0,
        teardown_cpu_ms_per_actor: cpu_ms_per_actor(gone.cpu_ns, idle.cpu_ns),
        heap_bytes_per_idle_actor: heap_idle,
        heap_bytes_per_actor_just_activated: per(up.heap - base.heap),
        heap_bytes_per_actor_first_half: heap_first_half.round(),
        heap_bytes_per_actor_second_half: heap_second_half.round(),
        heap_bytes_per_pooled_gateway_connection: if pooled_left > 0.0 {
            ((pooled_only.heap - idle.heap) / pooled_left).round()
        } else {
            0.0
        },
        heap_bytes_per_idle_tunnel: if idle_tunnels > 0 {
            ((busy.heap - pooled_only.heap) / idle_tunnels as f64).round()
        } else {
            0.0
        },
        rss_bytes_per_idle_actor: per(idle.rss - base.rss),
        cgroup_bytes_per_idle_actor: per_i(idle.cgroup, base.cgroup),
        cgroup_kernel_bytes_per_idle_actor: per_i(idle.kernel_cgroup, base.kernel_cgroup),
        kernel_host_bytes_per_actor: per_i(idle.kernel_host, base.kernel_host),
        fds_per_idle_actor: (((idle.fds - base.fds) / n as f64) * 100.0).round() / 100.0,
        pooled_gateway_connections: pooled,
        idle_tunnels,
        after_teardown: AfterTeardown {
            namespaces_left: left_netns.len(),
            actors_still_known: still_known,
            fds_left: left_fds,
            heap_bytes_left: (gone.heap - base.heap).round(),
            cgroup_bytes_left: gone.cgroup as f64 - base.cgroup as f64,
        },
        pass: pass_heap && nothing_left && dial_failures == 0,
    };
    Ok(ScenarioResult::new(&summary, Vec::new(), notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_reports_quantiles_and_growth_in_order_taken() {
        let times: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let t = timing(&times);
        assert_eq!(t.p50_ms, 50.0);
        assert_eq!(t.p99_ms, 99.0);
        assert_eq!(t.max_ms, 100.0);
        assert_eq!(t.first_tenth_p50_ms, 5.0);
        assert_eq!(t.last_tenth_p50_ms, 95.0);
        assert_eq!(t.last_over_first, 19.0);
        assert_eq!(timing(&[]).p50_ms, 0.0);
    }
}
