//! The cost scenario: what one unit of work costs each contender, in counts
//! that do not move with the machine's noise (`atunnel_bench::cost`):
//! user-space instructions (callgrind), system calls by name and context
//! switches (perf, on the uninstrumented contender), heap allocations
//! (atunnel's counting allocator; a peer has none to read).
//!
//! Each unit runs in pairs of windows, N units and 2N, and the figure per
//! unit is their difference over N: what a window costs whatever its size
//! (the window's own switches, the settling after the last unit) cancels.
//! [`rounds`] pairs per unit and pass; the figure is their median, reported
//! with the pairs' minimum and maximum, so a reader sees how firm it is. A zero-unit baseline would cancel the same,
//! but not the first unit's warm-up of a connection or pool, which both
//! windows share here because everything a unit reuses is set up and used
//! once before either window. Instructions come from a pass with the
//! contender under callgrind (~50x slower, one thread at a time), the rest
//! from a separate pass on the contender as it is.
//!
//! Units, from the same clients as the other scenarios (egress from inside
//! actor-0's sandbox, ingress from the load namespace as the router):
//!
//! - ingress-https: one HTTP/2 request as the router on a kept connection,
//!   HTTP/1.1 to actor-0, its 64 B answer back;
//! - ingress-connect: one HTTP/2 CONNECT stream to actor-0:80, one HTTP/1.1
//!   request and answer inside it, closed;
//! - egress-open: one egress tunnel opened (connect, a byte there and
//!   back) and closed (each side's close seen);
//! - egress-upload / egress-download: one MiB through an egress tunnel,
//!   to the sink's discard port / from its source port;
//! - egress-http: one HTTP/1.1 request and 64 B answer on a kept tunnel;
//! - ingress-idle: one router HTTP/1.1 connection, served once before the
//!   window, left to hibernate and woken by a second request (atunnel with
//!   `--hibernate-after=1s`, 4s under callgrind).
//!
//! nginx does ingress-https; HAProxy ingress-https across the sandboxes'
//! veths as atunnel, and the egress opens and bytes as a TCP -> TLS relay
//! in the sandbox (`peers.rs`); each unit's `path` says which way each
//! contender went.

mod summary;
mod units;
mod windows;

pub use summary::report_section;
use summary::*;
use units::*;
pub use units::{Unit, parse_unit};
use windows::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atunnel_bench::cost::{self, CallgrindProcess, PerfWindow, SyscallCounts};
use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::lockstep::Lockstep;
use atunnel_bench::markdown::Table;
use atunnel_bench::peers::Contender;
use atunnel_bench::scenario::Scenario;
use atunnel_bench::scenario::cost::{ContenderCounts, Spread as CountSpread, Summary, UnitCounts};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::egress::http_exchange;
use super::ingress::{connect_exchange, h2_client, hyper_h2, routed_request};
use crate::run::bench::Bench;
use crate::run::router::Alpn;
use crate::topology::FixedBuffers;
use crate::traffic::{DISCARD, ECHO, HTTP, SOURCE};

/// Pairs of windows per unit and pass. The median of several stands when
/// one pair catches something else (a ping, a late close); their spread is
/// reported beside it. ingress-idle's windows each wait out the
/// hibernation (~7 s under perf, ~13 s under callgrind), so it takes one pair fewer. Under
/// callgrind the quick run takes one pair fewer again, as three kept it
/// over its 15 minutes (the cost scenario alone took 371 s with three; the
/// figure is then the mean of two, with both in its range). The perf pass
/// takes nine (five in the quick run): its windows take about a second at most, and a relay's
/// reads and sleeps per MiB move from pair to pair (HAProxy's switches per
/// MiB down spread 0.63..0.80 over five pairs of 256 and 512 MiB, its
/// syscalls per MiB down 199..217 over two pairs of 32 and 64).
fn rounds(unit: Unit, pass: Pass, quick: bool) -> usize {
    match (unit, pass) {
        (Unit::IngressIdle, _) => {
            if quick {
                1
            } else {
                2
            }
        }
        // Five in the quick run, to keep it under 15 minutes: the
        // medians of the first five of nine pairs were within 1.6 % of
        // each other in three runs (HAProxy's switches per MiB down, 0.746,
        // 0.746 and 0.734), as the nine's were.
        (_, Pass::Perf) => {
            if quick {
                5
            } else {
                9
            }
        }
        // One in the quick run for the MiB units: their windows under
        // callgrind were 193 s of the scenario's 424 (two pairs each of
        // 64 and 128 MiB, atunnel and HAProxy both ways), over the quick
        // run's 15 minutes (925 s in all), and their pairs agree closely
        // within a run (atunnel's down 0.5 %, HAProxy's 0.05 %).
        (Unit::EgressUpload | Unit::EgressDownload, Pass::Callgrind) if quick => 1,
        (_, Pass::Callgrind) => {
            if quick {
                2
            } else {
                3
            }
        }
    }
}

/// A window closes once the contender ran nothing for this long
/// (`cost::settle`), so that what the last unit asked of it (closes) is
/// inside, whatever the machine's load; a fixed wait was either long or,
/// under a neighbour, short.
const QUIET: Duration = Duration::from_millis(60);
/// The same under callgrind, ~50x slower and one thread at a time.
const QUIET_CALLGRIND: Duration = Duration::from_millis(250);
/// How long settling may take before the window is an error.
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// atunnel's work that runs in proportion to wall time, off in this
/// scenario: it is a cost per second, not per unit, and a window of 2N
/// lasts longer than one of N (under callgrind ~50x longer), so it did not
/// cancel. The overload guard samples memory and descriptors 4 times a
/// second (openat, read, close, prlimit64 of /proc; ~0.2 syscalls per kept
/// egress request and, under callgrind, 5-10 % of a CONNECT tunnel's
/// instructions moving with how long its window took); the trust bundle's
/// file is polled every 10 s (statx). Pings (15 s and more) stay: rare
/// beside a window, and part of how a connection is kept.
const QUIET_FLAGS: [&str; 2] = ["--no-overload-guard", "--trust-bundle-poll-interval=0"];
/// atunnel's hibernation period for the ingress-idle unit in `pass`. The
/// window opens once every connection is set up and atunnel went quiet, and
/// each connection must hibernate inside it: a connection hibernates one to
/// two periods after its last byte, so the set-up (each connection's
/// handshake and request, one after the other) must take less than a
/// period. Under callgrind 1 s was too short on a busy machine: 5 of 64
/// and 6 of 32 connections hibernated before their window opened, which put
/// the unit's instructions at 114,735 and 138,785 against 128,538 (the
/// window's check read the count before the wait for quiet). The period
/// sets how long a window waits, not what hibernating costs (one idle check
/// of a timer per period, on a grid of 8 ticks per period).
fn hibernate_after(pass: Pass) -> Duration {
    match pass {
        Pass::Perf => Duration::from_secs(1),
        Pass::Callgrind => Duration::from_secs(4),
    }
}

/// How long the ingress-idle window's connections stay idle: two periods
/// and a grid tick, so that each has hibernated, then the trim: one trim
/// tick with nothing more hibernated after up to two that saw some (the
/// connections hibernate over a tick or two of the idle checks' grid).
fn idle_for(pass: Pass) -> Duration {
    2 * hibernate_after(pass) + Duration::from_millis(4500)
}
/// The download's reader's receive buffer (`SO_RCVBUF`; the kernel doubles
/// it for its own bookkeeping).
const DOWNLOAD_RECEIVE_BUFFER: usize = 256 * 1024;
/// The upload's writer's send buffer (`SO_SNDBUF`).
const UPLOAD_SEND_BUFFER: usize = 256 * 1024;
/// The top syscalls by name the report lists per unit.
pub const TOP_SYSCALLS: usize = 5;

/// Runs `units` on `contender` in `pass`; its counts per unit into
/// `results`.
async fn measure_contender(
    bench: &mut Bench,
    contender: Contender,
    units: &[Unit],
    dir: &Path,
    pass: Pass,
    results: &mut BTreeMap<&'static str, PerUnit>,
) -> Result<(), atunnel_process::BoxError> {
    let units: Vec<Unit> = units
        .iter()
        .copied()
        .filter(|u| u.done_by(contender))
        .collect();
    {
        let wrapper = match pass {
            Pass::Perf => Vec::new(),
            Pass::Callgrind => cost::callgrind_command(dir),
        };
        // Each set of flags once: the plain units, then ingress-idle's.
        let flag_sets: [(Vec<String>, bool); 2] = [
            (Vec::new(), false),
            (
                vec![format!(
                    "--hibernate-after={}ms",
                    hibernate_after(pass).as_millis()
                )],
                true,
            ),
        ];
        for (flags, idle) in flag_sets {
            let these: Vec<Unit> = units
                .iter()
                .copied()
                .filter(|&u| (u == Unit::IngressIdle) == idle)
                .collect();
            if these.is_empty() {
                continue;
            }
            let flags = if contender == Contender::Atunnel {
                QUIET_FLAGS
                    .iter()
                    .map(|f| f.to_string())
                    .chain(flags)
                    .collect()
            } else {
                Vec::new()
            };
            if bench.contender() != contender
                || bench.wrapper() != wrapper.as_slice()
                || bench.tunnel_args() != flags.as_slice()
            {
                eprintln!(
                    "         cost: {contender}{}{}",
                    if wrapper.is_empty() {
                        ""
                    } else {
                        " under callgrind"
                    },
                    if flags.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", flags.join(" "))
                    }
                );
                bench
                    .restart_wrapped(contender, flags, wrapper.clone())
                    .await?;
            }
            for unit in these {
                let n = unit.count(pass, bench.quick);
                let pass_name = match pass {
                    Pass::Perf => "perf",
                    Pass::Callgrind => "callgrind",
                };
                let label = |round: usize, k: u64| {
                    format!("{contender}-{}-{pass_name}-r{round}-{}", unit.name(), k * n)
                };
                let r = results.entry(unit.name()).or_default();
                let rounds = rounds(unit, pass, bench.quick);
                let mut pairs = Vec::with_capacity(rounds);
                for round in 1..=rounds {
                    let small = window(bench, pass, unit, n, dir, &label(round, 1)).await?;
                    let big = window(bench, pass, unit, 2 * n, dir, &label(round, 2)).await?;
                    pairs.push((small, big));
                }
                for (mut small, mut big) in pairs {
                    if let (Some(a), Some(b)) = (small.instructions, big.instructions) {
                        r.push("instructions", per(a, b, n));
                    }
                    let counts = |w: &mut Window| w.sys.take();
                    let (a, b) = match (counts(&mut small), counts(&mut big)) {
                        (Some(a), Some(b)) => (Some(a.await??), Some(b.await??)),
                        _ => (None, None),
                    };
                    if let (Some(a), Some(b)) = (&a, &b) {
                        r.push("syscalls", per(a.syscalls, b.syscalls, n));
                        r.push(
                            "context_switches",
                            per(a.context_switches, b.context_switches, n),
                        );
                        r.push("preemptions", per(a.preemptions, b.preemptions, n));
                        // Every name either window made, 0 where the other
                        // made none, so that each round has each name.
                        let names: std::collections::BTreeSet<&String> =
                            a.by_name.keys().chain(b.by_name.keys()).collect();
                        for k in names {
                            let get = |c: &SyscallCounts| c.by_name.get(k).copied().unwrap_or(0);
                            r.push(format!("sys:{k}"), per(get(a), get(b), n));
                        }
                    }
                    // From the perf pass only: the contender as it is.
                    if let (Pass::Perf, Some(a), Some(b)) =
                        (pass, small.allocations, big.allocations)
                    {
                        r.push("allocations", per(a, b, n));
                    }
                }
                let show = |k: &str| {
                    r.get(k)
                        .map(|s| format!("{k} {:.2} ({:.2}..{:.2})", s.median, s.min, s.max))
                };
                eprintln!(
                    "         cost: {contender} {} ({pass_name}): {}",
                    unit.name(),
                    [
                        "instructions",
                        "syscalls",
                        "context_switches",
                        "preemptions",
                        "allocations"
                    ]
                    .iter()
                    .filter_map(|k| show(k))
                    .collect::<Vec<_>>()
                    .join(", ")
                );
            }
        }
    }
    Ok(())
}

/// The cost scenario: every unit on atunnel, then on each installed peer
/// that can do it; atunnel back as it was afterwards.
pub(super) async fn cost(bench: &mut Bench) -> Result<ScenarioResult, atunnel_process::BoxError> {
    // Left out, as a missing peer is, so that the quick run works on a
    // machine with nothing installed; CI installs both and its test
    // requires them (`ATUNNEL_REQUIRE_COST_TOOLS`).
    if let Err(e) = cost::require_tools() {
        return Ok(ScenarioResult::without_summary(
            Scenario::Cost,
            vec![format!("left out: {e}")],
        ));
    }
    let dir = bench.out_dir().join("cost");
    std::fs::create_dir_all(&dir)?;
    // nginx's workers drop to its user (www-data) and write their own
    // callgrind dumps here.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let flags = bench.tunnel_args().to_vec();
    let mut notes = vec![
        format!("per unit: (counts of a window of 2N units - counts of a window of N) / N, so what a window costs whatever its size cancels; the median of {} such pairs under callgrind ({} for the MiB units) and {} under perf ({} for ingress-idle, whose windows wait out the hibernation), their minimum..maximum in brackets; a window closes once the contender ran nothing for {} ms ({} ms under callgrind); instructions from callgrind (user space, the contender under valgrind), syscalls and context switches from perf's tracepoints on the contender's processes as they are, allocations from atunnel's counting allocator (a peer's: n/a)", rounds(Unit::EgressHttp, Pass::Callgrind, bench.quick), rounds(Unit::EgressUpload, Pass::Callgrind, bench.quick), rounds(Unit::EgressHttp, Pass::Perf, bench.quick), rounds(Unit::IngressIdle, Pass::Perf, bench.quick), QUIET.as_millis(), QUIET_CALLGRIND.as_millis()),
        "context switches: every sched_switch of the contender's threads; preemptions: those where the thread was still runnable (not prev_state & 3), most often preempted by the process its write woke or by a neighbour's time slice; whether a thread blocks or is preempted first moves with the scheduling, their sum less".to_string(),
        format!("atunnel runs here with {}: its work per second of wall time (the overload guard's 4 samples a second, the trust bundle's poll) would otherwise land in a window in proportion to how long it took", QUIET_FLAGS.join(" ")),
    ];
    notes.push("egress-upload and -download: the tunnel is opened before each window, which holds bytes only; the download's reader has a fixed 256 KiB SO_RCVBUF, so that the buffers behind the contender are as full at a window's end as at its start, and the upload's writer a fixed 256 KiB SO_SNDBUF".to_string());
    notes.push(if bench.cost_lockstep {
        "windows in lockstep (atunnel_bench::lockstep): for each window every thread of the run's processes (the load, the contender, the actors, the sink) on one CPU under SCHED_FIFO at one priority, real-time throttling off, so that each step runs until it blocks, in the same order whatever the neighbours do; counts are those of that regime (each read takes all that is there), for every contender alike".to_string()
    } else {
        "windows under the normal scheduler (--cost-free-scheduling): the chain spread over the CPUs, its reads' sizes and wake-ups following who ran when".to_string()
    });
    let chosen = if bench.cost_contenders.is_empty() {
        Contender::ALL.to_vec()
    } else {
        bench.cost_contenders.clone()
    };
    let mut contenders = Vec::new();
    for c in chosen {
        match c.peer() {
            Some(p) if p.find().is_none() => notes.push(format!("{c} is not installed: left out")),
            _ => contenders.push(c),
        }
    }
    let units: Vec<Unit> = Unit::ALL
        .into_iter()
        .filter(|u| bench.cost_units.is_empty() || bench.cost_units.iter().any(|n| n == u.name()))
        .collect();
    if units.len() < Unit::ALL.len() || contenders.len() < Contender::ALL.len() {
        notes.push(format!(
            "this run counted {} of the units and {} of the contenders (--cost-units, --cost-contenders)",
            units.len(),
            contenders.len()
        ));
    }
    let mut measured = Vec::new();
    let mut failure = None;
    'contenders: for &c in &contenders {
        let mut m = BTreeMap::new();
        for pass in [Pass::Perf, Pass::Callgrind] {
            match measure_contender(bench, c, &units, &dir, pass, &mut m).await {
                Ok(()) => {}
                // nginx's workers fork from its master and drop to its
                // user; callgrind_control does not find them (valgrind
                // 3.19): its instructions are n/a, its other counts stand.
                Err(e) if pass == Pass::Callgrind && c != Contender::Atunnel => {
                    notes.push(format!("{c}: no instruction counts: {e}"));
                }
                Err(e) => {
                    failure = Some(format!("{c}: {e}"));
                    break 'contenders;
                }
            }
        }
        measured.push((c, m));
    }
    // atunnel back as it was, uninstrumented, whatever happened.
    let restored = bench
        .restart_wrapped(Contender::Atunnel, flags, Vec::new())
        .await;
    if let Some(f) = failure {
        return Err(f.into());
    }
    restored?;
    let profiled = [Unit::IngressHttps, Unit::EgressUpload, Unit::EgressDownload]
        .into_iter()
        .filter(|u| units.contains(u) && contenders.contains(&Contender::Atunnel));
    for unit in profiled {
        let profile = largest_dump(&dir, &format!("atunnel-{}-callgrind-r1-", unit.name()))
            .and_then(|dump| cost::annotate_inclusive(&dump, 80).map_err(err));
        match profile {
            Ok(p) => std::fs::write(dir.join(format!("profile-atunnel-{}.txt", unit.name())), p)?,
            Err(e) => notes.push(format!("no profile of atunnel's {}: {e}", unit.name())),
        }
    }
    notes.push("callgrind dumps of every window are in cost/ (callgrind_annotate reads them); profile-atunnel-ingress-https.txt, profile-atunnel-egress-upload.txt and profile-atunnel-egress-download.txt are the 2N windows' per-function inclusive counts".into());
    notes.push("egress on HAProxy: a TCP -> TLS relay (mode tcp) listening where actor-0's sandbox redirects its TCP, dialled by the same code from the same sandbox-side socket as atunnel, its sandbox-side buffers fixed at atunnel's 64 KiB (tune.rcvbuf.client, tune.sndbuf.client). atunnel's HTTP/2 framing (CONNECT streams over one kept mTLS connection to the gateway) is work the relay does not do; the relay makes a TLS handshake per tunnel instead, resuming the session it kept from its first (HAProxy's default for a server; the sink's log counts full and resumed handshakes)".into());
    Ok(ScenarioResult::new(
        &summary(&units, bench.quick, &measured),
        Vec::new(),
        notes,
    ))
}

/// The callgrind dump of the larger window whose name starts with `prefix`.
fn largest_dump(dir: &Path, prefix: &str) -> Result<PathBuf, atunnel_process::BoxError> {
    let mut dumps: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let rest = name.strip_prefix(prefix)?;
            let n: u64 = rest.split('.').next()?.parse().ok()?;
            name.ends_with(".callgrind").then(|| (n, e.path()))
        })
        .collect();
    dumps.sort();
    dumps
        .pop()
        .map(|(_, p)| p)
        .ok_or_else(|| format!("no callgrind dump {prefix}* in {}", dir.display()).into())
}
