//! noisy-neighbour: one hostile actor beside a victim on the same atunnel
//! (in its cgroup at the run's CPU and memory limits). The hostile actor
//! runs seven patterns one after another (unread downloads, uploads to a
//! destination that never reads, a connection flood past its budget, a DNS
//! flood, stalled ingress CONNECT tunnels, ingress responses whose body
//! never comes on the victim's own router connections, and, with three
//! more hostile actors, every actor holding what its budgets allow) while
//! the victim's egress-http p99, egress-tcp MB/s and ingress-https p99 are
//! measured, each against a baseline window taken right before a window
//! under the pattern, in several such pairs per pattern (the pattern
//! stopped and started again between them), each figure's ratio with a
//! 95 % interval over the pairs and a pass / fail / inconclusive verdict
//! (`load::confidence`), and its new tunnels counted as refused or not;
//! then how long until atunnel's memory, buffers, descriptors and tasks are
//! back to the first baseline once the hostile actors stop.
//!
//! The hostile actor is persistent: what a bound resets it opens again, so
//! a pattern holds for the whole measurement whatever the bound. atunnel is
//! restarted for the scenario with 10 s relay bounds (the defaults are
//! 60 s) so that recovery is measured within the run, and with a resolver
//! that never answers (a socket in the sink's namespace that is never
//! read), so the DNS flood meets the slow upstream that holds the relay's
//! work longest.

mod holdings;
mod hostile;
mod patterns;
mod report;
mod verdict;
mod victim;

use holdings::*;
use hostile::*;
use patterns::*;
use verdict::*;
use victim::*;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atunnel_bench::load::confidence::{Bound, Conclusion, Counts, Figure, FigureSummary, ratio};
use atunnel_bench::load::results::{Latency, ScenarioResult};
use atunnel_bench::scenario::noisy_neighbour as summary;
use atunnel_measure::schedule::{Rung, RungOutcome, run_rung};
use atunnel_process::overload::OverloadState;
use atunnel_sandbox::NsExecutor;
use atunnel_support::stats_client::Stats;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(in crate::run) use report::section as report_section;

use crate::role::process_cpu_seconds;
use crate::run::bench::Bench;
use crate::run::dial::Actors;
use crate::run::router::{Alpn, RouterTls};
use crate::run::scenarios::ingress::hyper_h2;
use crate::topology::{SINK_ADDR, Topology};
use crate::traffic::{DISCARD, ECHO, HTTP, HTTP_ANSWER_LEN, SOURCE, closed_unread};

type BoxError = atunnel_process::BoxError;
type H2Sender = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// The victim: actor-0, whose figures are compared.
const VICTIM: u64 = 0;
/// The hostile actor: actor-1 (actors-at-budget adds the next three).
const HOSTILE: u64 = 1;
/// The hostile actors of actors-at-budget: HOSTILE and the next ones, as
/// many as the worker hosts.
const AT_BUDGET_ACTORS: u64 = 4;
/// What each of them tries to hold: atunnel's default budgets today
/// (`--actor-max-tunnels`, `--actor-max-ingress-in-flight`); atunnel's own
/// budgets decide what they get.
const EGRESS_BUDGET: usize = 4096;
const INGRESS_BUDGET: usize = 1024;
/// Streams atunnel allows on one router connection.
const ROUTER_STREAMS: usize = atunnel_connect::limits::PROXY_ROUTER_MAX_CONCURRENT_STREAMS as usize;
/// Of those, what one actor may hold on one connection
/// (`--actor-max-router-streams`): past it its requests get 503.
const ACTOR_ROUTER_STREAMS: usize = atunnel::ingress::DEFAULT_ACTOR_MAX_ROUTER_STREAMS as usize;
/// Descriptors the generator keeps for everything but actors-at-budget's
/// hostile tunnels (the victim's connections, its probes, /stats).
const FD_RESERVE: usize = 1000;
/// How long a hostile open that atunnel refused waits before it tries
/// again: the patterns that hold connections retry at once-ish; the four
/// actors at their budgets, some 20,000 openers, wait longer so the
/// generator does not become what the victim waits for.
const RETRY: Duration = Duration::from_millis(100);
const AT_BUDGET_RETRY: Duration = Duration::from_secs(1);
/// How long a hostile request may wait for its head (behind a full
/// connection's streams, say) before it counts as failed and is retried.
const HEAD_LIMIT: Duration = Duration::from_secs(5);
/// The victim's new egress tunnels under each pattern (one byte there and
/// back each), counted as refused or not.
const PROBE_TUNNELS: usize = 50;
/// The sink's stall service: accepts and never reads.
const STALL: &str = "192.0.2.10:13";
/// The DNS relay inside every sandbox.
const DNS_RELAY: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(169, 254, 17, 1)), 53);
/// The resolver atunnel is given for the scenario: a socket in the sink's
/// namespace that is never read, so no query is ever answered.
const BLACK_HOLE: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(SINK_ADDR), 53);
/// The actors' port whose every connection gets an endless stream of bytes.
const FLOOD_PORT: u16 = 9000;
/// atunnel's relay bounds, ingress body idle bounds and pooled gateway
/// connections' idle timeout for the scenario (the defaults are 60 s and
/// 90 s): a tunnel or body that can never finish is reset, and the hostile
/// actor's extra gateway connections close, within it, and so recovery is
/// measured within the run.
const RELAY_BOUND: &str = "10s";
/// The victim's request rate, egress HTTP and ingress HTTPS alike.
const RATE: f64 = 1000.0;
/// The victim's kept-alive egress HTTP connections.
const HTTP_CONNS: usize = 16;
/// The victim's router HTTP/2 connections for ingress HTTPS.
const ROUTER_CONNS: usize = 4;
/// DNS queries per second the hostile actor sends: a fixed rate, high
/// enough to fill its relay's in-flight budget (256) many times a second,
/// low enough that the generator, which shares a core with the sink and
/// the victim's clients, does not become what the victim waits for.
const DNS_RATE: f64 = 20_000.0;
/// Opens in flight at once for the patterns that hold connections, each
/// holding its place for [`OPEN_SPACING`] more: at most 1,280 opens a
/// second, so the patterns that are not a flood stay well inside the
/// actor's opening budget (256) and are what they say they are.
const OPENING_AT_ONCE: usize = 64;
const OPEN_SPACING: Duration = Duration::from_millis(50);
/// How long a pattern may take to be established.
const ESTABLISH_LIMIT: Duration = Duration::from_secs(30);
/// How long what a pattern holds may stay the same before it counts as
/// all that atunnel lets it hold.
const PLATEAU: Duration = Duration::from_secs(2);
/// How often recovery is checked, and how long it is waited for.
const POLL: Duration = Duration::from_millis(200);
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);
/// Back to baseline: heap within 2 MiB, cgroup memory within 8 MiB (kernel
/// slab and socket memory come back in pages), descriptors and tasks
/// within 8, no more pooled buffers out than at baseline, and the hostile
/// actor holding no egress tunnel.
const HEAP_SLACK: f64 = 2.0 * 1048576.0;
const CGROUP_SLACK: f64 = 8.0 * 1048576.0;
const COUNT_SLACK: f64 = 8.0;
/// The pass bounds: the victim's p99 within 1.1x of its baseline, its
/// throughput at least 0.9x.
const P99_RATIO_MAX: f64 = 1.1;
const TCP_RATIO_MIN: f64 = 0.9;

/// What the scenario drives: the victim's connections and the hostile
/// actor's means, remade if atunnel was replaced.
struct Stage {
    actors: Actors,
    router: Router,
    victim: Victim,
}

impl Stage {
    async fn open(bench: &Bench) -> Result<Self, BoxError> {
        let actors = Actors::of(bench);
        let router = Router::of(bench)?;
        let victim = Victim::open(actors.clone(), router.clone()).await?;
        Ok(Self {
            actors,
            router,
            victim,
        })
    }
}

/// One pattern: [`Sizes::pairs`] pairs of the victim's windows, a baseline
/// and one under the pattern, in blocks of two pairs ordered baseline,
/// pattern, pattern, baseline: the pattern started and established once
/// per block, stopped after its two windows, and atunnel left to let go of
/// what the hostile actors held (their tunnels, descriptors, tasks,
/// buffers) before the second baseline, so that it is not taken under
/// them; after the last block, recovery to the first baseline's resources,
/// memory included. Its summary row.
async fn run_pattern(
    bench: &mut Bench,
    stage: &mut Stage,
    pattern: Pattern,
    sizes: &Sizes,
    cgroup_limit: u64,
) -> Result<summary::Pattern, BoxError> {
    bench.check_tunnel().await?;
    let plan = Plan::of(pattern, bench.actor_count(), fd_room());
    let hostiles = &plan.hostiles[..];
    let target = pattern.target(sizes, &plan);
    let mut pairs: Vec<(Window, Window)> = Vec::with_capacity(sizes.pairs);
    let mut first: Option<(Stats, atunnel_host::CgroupSample, Census, Resources, f64)> = None;
    let mut peaks: Option<Peaks> = None;
    let mut established_all = Vec::new();
    let mut probe = (0u64, None::<String>);
    let mut between = Vec::new();
    let (mut opened, mut ended, mut failed_opens, mut sent, mut held) = (0, 0, 0, 0, 0);
    let mut during = Stats::default();
    let mut after = Stats::default();
    let mut stopped = Instant::now();
    // Blocks of two pairs, baseline-hostile-hostile-baseline: one start and
    // one stop of the pattern per two pairs, and each pair's windows next
    // to each other (the last block of an odd count is one pair).
    for block in (0..sizes.pairs).step_by(2) {
        let two = block + 1 < sizes.pairs;
        let base = measure_victim(bench, &stage.victim, sizes).await;
        if first.is_none() {
            let before = bench.stats(true).await?;
            let cg0 = bench.cgroup_sample();
            let census0 = Census::take(bench, &stage.actors).await;
            let base_res = Resources::read(
                &before,
                cg0.memory_bytes,
                bench.tunnel_pid(),
                &census0,
                hostiles,
            );
            let soft = soft_threshold(&before, cgroup_limit);
            first = Some((before, cg0, census0, base_res, soft));
        }
        let start = bench.stats(false).await.unwrap_or_default();
        let hostile = Hostile::start(pattern, sizes, &plan, stage, &bench.topo.exec).await?;
        let ((established, now, unders, tried), seen) = with_peaks(bench, async {
            let established =
                establish(bench, pattern, target, &hostile.tally, &start, hostiles).await;
            let during = bench.stats(false).await.unwrap_or_default();
            let mut unders = Vec::with_capacity(2);
            let mut tried = (0, None);
            for _ in 0..if two { 2 } else { 1 } {
                unders.push(measure_victim(bench, &stage.victim, sizes).await);
                let (refused, first_error) = stage.victim.new_tunnels().await;
                tried.0 += refused;
                tried.1 = tried.1.or(first_error);
            }
            (established, during, unders, tried)
        })
        .await;
        after = bench.stats(false).await.unwrap_or_default();
        let tally = hostile.tally.clone();
        held = held.max(tally.holding.load(Ordering::Relaxed));
        opened += tally.opened.load(Ordering::Relaxed);
        ended += tally.ended.load(Ordering::Relaxed);
        failed_opens += tally.failed.load(Ordering::Relaxed);
        sent += tally.sent.load(Ordering::Relaxed);
        hostile.stop().await;
        stopped = Instant::now();
        during = now;
        established_all.push(established);
        probe.0 += tried.0;
        probe.1 = probe.1.or(tried.1);
        peaks = Some(match peaks {
            Some(p) => p.merged(seen),
            None => seen,
        });
        let mut unders = unders.into_iter();
        pairs.extend(unders.next().map(|u| (base, u)));
        if let Some(under) = unders.next() {
            // The second pair's baseline once atunnel let go of what the
            // hostile actors held (its memory is waited for at the end).
            let (_, _, _, base_res, _) = first.as_ref().expect("taken above");
            let (cleared, still, _) =
                recover(bench, &stage.actors, base_res, hostiles, Memory::NotChecked).await;
            between.push(summary::Between {
                cleared_s: cleared.map(|s| (s * 10.0).round() / 10.0),
                still_held: still,
            });
            pairs.push((measure_victim(bench, &stage.victim, sizes).await, under));
        }
    }
    let (before, cg0, census0, base_res, soft) = first.ok_or("a pattern ran no pair")?;
    let peaks = peaks.ok_or("a pattern ran no pair")?;
    // From the last stop, the last baseline window included.
    let (recovered, above, after_res) =
        recover(bench, &stage.actors, &base_res, hostiles, Memory::Checked).await;
    let recovered = recovered.map(|_| stopped.elapsed().as_secs_f64());
    let census = Census::take(bench, &stage.actors).await;
    let alive = bench.check_tunnel().await?;
    let oom_kills = bench
        .cgroup_sample()
        .oom_kills
        .saturating_sub(cg0.oom_kills);
    if !alive {
        *stage = Stage::open(bench).await?;
    }

    let (http, https, tcp) = figures(&pairs);
    let transitions_total =
        |s: &Stats| s.overload.as_ref().map_or(0, |o| o.transitions_total) as f64;
    let transitions = (transitions_total(&after) - transitions_total(&before)).max(0.0);
    let victim_errors: u64 = pairs.iter().map(|(_, u)| u.errors()).sum();
    let (victim_e0, victim_e1) = (egress_of(&before, &[VICTIM]), egress_of(&after, &[VICTIM]));
    let victim_refused = summary::VictimRefused {
        new_tunnels_tried: PROBE_TUNNELS * pairs.len(),
        new_tunnels_refused: probe.0,
        new_tunnels_first_error: probe.1,
        request_errors: victim_errors,
        egress_refused_overload: (victim_e1.refused_overload_total
            - victim_e0.refused_overload_total)
            .max(0.0),
        egress_refused_tunnels: (victim_e1.refused_tunnels_total - victim_e0.refused_tunnels_total)
            .max(0.0),
    };
    let (conclusion, failed, inconclusive) = verdict(&Checks {
        http: http.clone(),
        https: https.clone(),
        tcp: tcp.clone(),
        victim_errors,
        new_tunnels_refused: probe.0,
        oom_kills,
        alive,
        peak_memory: peaks.memory as f64,
        soft,
        guard_left_normal: peaks.overload > OverloadState::Normal || transitions > 0.0,
        recovered: recovered.is_some(),
    });
    let peak = peaks.memory;
    let hostile_egress_during = egress_of(&during, hostiles);
    let hostile_ingress_during = ingress_of(&during, hostiles);
    // The table's figures: the median window of each side.
    let med = |side: usize, f: &dyn Fn(&Window) -> f64| {
        median(
            pairs
                .iter()
                .map(|p| f(if side == 0 { &p.0 } else { &p.1 }))
                .collect(),
        )
    };
    let mean = |side: usize, f: &dyn Fn(&Window) -> f64| {
        let v: Vec<f64> = pairs
            .iter()
            .map(|p| f(if side == 0 { &p.0 } else { &p.1 }))
            .collect();
        (v.iter().sum::<f64>() / v.len().max(1) as f64 * 100.0).round() / 100.0
    };
    let (b, u) = (0, 1);
    let last_under = &pairs.last().expect("a pair").1;
    let victim = summary::Victim {
        victim_http_p99_us: med(u, &|w| w.http.latency.p99 as f64),
        baseline_http_p99_us: med(b, &|w| w.http.latency.p99 as f64),
        victim_http_p50_us: med(u, &|w| w.http.latency.p50 as f64),
        baseline_http_p50_us: med(b, &|w| w.http.latency.p50 as f64),
        victim_https_p99_us: med(u, &|w| w.https.latency.p99 as f64),
        baseline_https_p99_us: med(b, &|w| w.https.latency.p99 as f64),
        victim_tcp_mb_s: med(u, &Window::tcp_median),
        baseline_tcp_mb_s: med(b, &Window::tcp_median),
        victim_tcp_runs_mb_s: pairs
            .iter()
            .flat_map(|p| p.1.tcp_mb_s.iter().copied())
            .collect(),
        baseline_tcp_runs_mb_s: pairs
            .iter()
            .flat_map(|p| p.0.tcp_mb_s.iter().copied())
            .collect(),
        victim_errors,
        baseline_errors: pairs.iter().map(|(b, _)| b.errors()).sum(),
        victim_first_error: pairs.iter().find_map(|(_, u)| u.first_error()),
        victim_dispatch_lag_p99_us: pairs
            .iter()
            .map(|(_, u)| u.http.dispatch_lag_p99_us.max(u.https.dispatch_lag_p99_us))
            .max(),
        victim_shed: pairs.iter().map(|(_, u)| u.http.shed + u.https.shed).sum(),
        victim_achieved_per_s: [
            last_under.http.achieved.round(),
            last_under.https.achieved.round(),
        ],
    };
    let established_s = established_all.iter().map(|e| e.0).fold(0.0, f64::max);
    let context = summary::Context {
        tunnel_cores: mean(u, &|w| w.tunnel_cores),
        baseline_tunnel_cores: mean(b, &|w| w.tunnel_cores),
        tunnel_throttled: pairs.iter().any(|(_, u)| u.throttled),
        generator_cores: mean(u, &|w| w.generator_cores),
        baseline_generator_cores: mean(b, &|w| w.generator_cores),
        sink_cores: mean(u, &|w| w.sink_cores),
        baseline_sink_cores: mean(b, &|w| w.sink_cores),
        actors_cores: mean(u, &|w| w.actors_cores),
        baseline_actors_cores: mean(b, &|w| w.actors_cores),
        others_cores: mean(u, &|w| w.others_cores),
        baseline_others_cores: mean(b, &|w| w.others_cores),
        machine_saturated: pairs.iter().any(|(_, u)| u.machine_saturated()),
        baseline_machine_saturated: pairs.iter().any(|(b, _)| b.machine_saturated()),
        established_s: (established_s * 10.0).round() / 10.0,
        established: established_all.iter().all(|e| e.1),
        hostile: summary::Hostile {
            held,
            opened,
            reopened: ended,
            failed: failed_opens,
            sent,
            tunnels_in_atunnel: hostile_egress_during.tunnels,
            buffers_in_atunnel: hostile_egress_during.buffers,
            ingress_in_flight_in_atunnel: hostile_ingress_during.in_flight,
            actors: hostiles.iter().map(|a| format!("actor-{a}")).collect(),
            target,
            egress_each: plan.egress_each,
            fd_limited: plan.fd_limited,
        },
        refused: refusals(&before, &after, hostiles),
        during: summary::During {
            heap_bytes: during.process.heap_bytes,
            open_fds: during.process.open_fds,
            tasks: during.process.tasks,
            pool_in_use: during.pool.in_use,
            overload_state: during.overload.as_ref().map(|o| o.state),
            gateway_connections: bench.tunnel_pid().map_or(0.0, gateway_connections),
        },
        baseline_resources: base_res.summary(),
        recovered_resources: after_res.summary(),
        tunnel_sockets_before: census0.summary(),
        tunnel_sockets_after: census.summary(),
    };
    let row = summary::Pattern {
        pattern: pattern.name().into(),
        verdict: Some(conclusion),
        pass: conclusion == Conclusion::Pass,
        failed: failed.iter().map(|f| f.to_string()).collect(),
        inconclusive: inconclusive.iter().map(|f| f.to_string()).collect(),
        pairs: pairs.len(),
        confidence: Some(summary::Confidence {
            http_p99: Some(http.summary()),
            https_p99: Some(https.summary()),
            tcp_mb_s: Some(tcp.summary()),
        }),
        victim_p99_ratio: http.point(),
        victim_https_p99_ratio: https.point(),
        victim_tcp_ratio: tcp.point(),
        windows: pairs
            .iter()
            .map(|(b, u)| summary::WindowPair {
                baseline: window_figures(b),
                under: window_figures(u),
            })
            .collect(),
        between_pairs: between,
        oom_kills,
        tunnel_died: !alive,
        peak_memory_bytes: peak,
        baseline_memory_bytes: cg0.memory_bytes,
        soft_threshold_bytes: soft.round(),
        recovered_s: recovered.map(|s| (s * 10.0).round() / 10.0),
        not_recovered: above,
        victim_refused,
        overload: summary::Overload {
            worst_state: Some(peaks.overload),
            transitions,
            peak_open_fds: peaks.open_fds,
            descriptor_limit: before
                .overload
                .as_ref()
                .and_then(|o| o.descriptors)
                .map_or(0, |d| d.limit),
        },
        victim,
        context,
    };
    eprintln!(
        "         {}: {} pairs; ratio [95 % interval]: http p99 {}, https p99 {}, tcp {}; victim errors {} and {} of {} new tunnels refused, hostile held {held}, guard {}, peak {:.0} MiB (soft {:.0}), recovered {}: {}{}",
        pattern.name(),
        pairs.len(),
        http.text(),
        https.text(),
        tcp.text(),
        victim_errors,
        probe.0,
        PROBE_TUNNELS * pairs.len(),
        peaks.overload,
        peak as f64 / 1048576.0,
        soft / 1048576.0,
        recovered.map_or("never".into(), |s| format!("in {s:.1} s")),
        conclusion,
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    Ok(row)
}

/// The scenario: atunnel restarted with the scenario's flags (`run`
/// restores the run's afterwards), the victim's connections opened and
/// warmed, then each pattern in turn.
pub(super) async fn noisy_neighbour(bench: &mut Bench) -> Result<ScenarioResult, BoxError> {
    if bench.actor_count() < 2 {
        return Err("noisy-neighbour needs at least 2 actors (a victim and a hostile one)".into());
    }
    let sizes = Sizes::of(bench.quick);
    // The resolver that never answers: bound, never read.
    let topo = &bench.topo;
    let black_hole = topo
        .exec
        .run_in(&topo.sink, || std::net::UdpSocket::bind(BLACK_HOLE))
        .await??;
    let dir = tempfile::Builder::new()
        .prefix("atunnel-bench-noisy-")
        .tempdir()?;
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", BLACK_HOLE.ip()))?;
    let own = vec![
        format!("--stalled-write-timeout={RELAY_BOUND}"),
        format!("--half-closed-timeout={RELAY_BOUND}"),
        format!("--gateway-idle-timeout={RELAY_BOUND}"),
        format!("--actor-response-body-timeout={RELAY_BOUND}"),
        format!("--actor-request-body-timeout={RELAY_BOUND}"),
        format!("--resolv-conf={}", resolv.display()),
    ];
    let mut flags = bench.tunnel_args().to_vec();
    flags.extend(own.iter().cloned());
    // As the results name them: the file itself is gone after the run.
    let own: Vec<String> = own
        .into_iter()
        .map(|f| {
            if f.starts_with("--resolv-conf=") {
                format!("--resolv-conf=<a resolv.conf naming {}>", BLACK_HOLE.ip())
            } else {
                f
            }
        })
        .collect();
    bench.restart_tunnel(flags).await?;
    let cgroup_limit = bench.last_status().memory_bytes;
    let mut stage = Stage::open(bench).await?;
    // Warm-up, not kept: the fresh atunnel's first requests and uploads.
    let warm = Sizes {
        window: Duration::from_millis(500),
        tcp_runs: 1,
        ..Sizes::of(true)
    };
    let _ = measure_victim(bench, &stage.victim, &warm).await;

    let mut rows = Vec::new();
    for pattern in PATTERNS {
        eprintln!("         pattern {}", pattern.name());
        rows.push(run_pattern(bench, &mut stage, pattern, &sizes, cgroup_limit).await?);
    }
    drop(black_hole);

    // How far the baselines themselves moved over the run: the largest
    // over the smallest of every baseline window, per figure.
    let spread = |figure: fn(&summary::Window) -> f64| {
        let v: Vec<f64> = rows
            .iter()
            .flat_map(|r| &r.windows)
            .map(|w| figure(&w.baseline))
            .filter(|&x| x > 0.0)
            .collect();
        let lo = v.iter().copied().reduce(f64::min)?;
        let hi = v.iter().copied().reduce(f64::max)?;
        Some((hi / lo * 100.0).round() / 100.0)
    };
    let spread = summary::Spread {
        http_p99: spread(|w| w.http_p99_us as f64),
        https_p99: spread(|w| w.https_p99_us as f64),
        tcp_mb_s: spread(|w| w.tcp_mb_s),
    };
    let counts = Counts::of(rows.iter().map(|r| r.verdict.unwrap_or_default()));
    let mut notes = vec![
        format!(
            "each pattern runs {} pairs of windows, in blocks of two ordered baseline, pattern, pattern, baseline (a window: the victim's three figures; the pattern started and established once per block and stopped after its two windows; before the block's second baseline atunnel is given until the hostile actors' tunnels, descriptors, tasks and buffers are gone, between_pairs saying how long); the first pair of a block is its first two windows, the second its last two, so each pair's windows are next to each other and the order cancels a steady drift; each figure's ratio (under / baseline, per pair) is given as the geometric mean of the pairs with a 95 % interval (Student's t on the log ratios, docs/isolation.md says why); a figure passes when its whole interval is inside its bound, fails when it is wholly outside, and is inconclusive otherwise; a pattern fails on any figure or other check failing, is inconclusive when none failed but a figure was inconclusive, and passes otherwise; verdicts counts them",
            sizes.pairs
        ),
        format!(
            "victim actor-{VICTIM}, hostile actor-{HOSTILE}; the victim, measured the same way in each window: egress HTTP/1.1 requests at {RATE:.0}/s over {HTTP_CONNS} kept-alive connections to the sink's port 80 for {:.1} s (open loop, latency from each request's due time), then {} upload(s) of {} MiB to the sink's discard port (their median MB/s), then ingress HTTPS requests from the router at {RATE:.0}/s over {ROUTER_CONNS} HTTP/2 connections for {:.1} s",
            sizes.window.as_secs_f64(),
            sizes.tcp_runs,
            sizes.tcp_bytes >> 20,
            sizes.window.as_secs_f64()
        ),
        format!(
            "atunnel ran with {} (relay and ingress body bounds of {RELAY_BOUND} instead of 60 s, so a tunnel that cannot finish ends within the run; a resolver that never answers); budgets at their defaults",
            own.join(" ")
        ),
        "each baseline window is taken right before its pattern window, because latency on a shared 2-core machine drifts; baseline_spread is, per figure, the largest over the smallest of every baseline window of the run: the noise the intervals are made to see through".into(),
        format!(
            "pass: both p99 ratios' intervals <= {P99_RATIO_MAX}, the tcp ratio's interval >= {TCP_RATIO_MIN}, no victim errors, none of the victim's {PROBE_TUNNELS} new egress tunnels opened under the pattern in each pair refused (one byte there and back each: victim_refused), the overload guard normal throughout (its state read every 500 ms, and no state change between the readings before and after: overload), no OOM kill, peak cgroup memory (sampled every 100 ms from the pattern's start until it stopped) under the overload guard's soft threshold, and recovered_s not null: after the hostile actor stopped, /stats (after releasing free memory) every {} ms until heap within {} MiB, cgroup memory within {} MiB, descriptors and tasks within {COUNT_SLACK} (not counting atunnel's sockets in the other actors' sandboxes, one task each: the victim's tunnels and the ingress connections atunnel pools to the victim, which grow when the victim is slowed and are the victim's, shown as neighbour_sockets; tunnel_sockets_before/after say where every socket descriptor is listed), pooled buffers out no more than at baseline and no hostile egress tunnel, given up after {} s",
            POLL.as_millis(),
            HEAP_SLACK / 1048576.0,
            CGROUP_SLACK / 1048576.0,
            RECOVERY_LIMIT.as_secs()
        ),
        "the cores columns say who was busy during the victim's measurement: atunnel (its cgroup, held to its quota), the generator (the victim's clients and the hostile actor alike, one process), the sink (the victim's egress far end), the actors (its ingress far end) and other work on the machine (/proc/stat's busy time less all of those); machine_saturated when all of it came to 90 % of the machine's cores, when the victim's clients and far ends waited for CPU and what the victim saw is not atunnel's alone".into(),
    ];
    let actors = bench.actor_count();
    notes.extend(PATTERNS.iter().map(|p| p.what(&sizes, &p.hostiles(actors))));
    notes.extend(rows.iter().map(verdict_line));
    let summary = summary::Summary {
        patterns: rows,
        verdict: counts.overall(),
        verdicts: counts,
        pass: counts.overall() == Conclusion::Pass,
        pairs: sizes.pairs,
        victim: format!("actor-{VICTIM}"),
        hostile: format!("actor-{HOSTILE}"),
        tunnel_flags: own,
        rate_per_s: RATE,
        window_s: sizes.window.as_secs_f64(),
        tcp_bytes: sizes.tcp_bytes,
        baseline_spread: spread,
    };
    Ok(ScenarioResult::new(&summary, Vec::new(), notes))
}
