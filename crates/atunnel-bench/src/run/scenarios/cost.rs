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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atunnel_bench::cost::{self, CallgrindProcess, PerfWindow, SyscallCounts};
use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::lockstep::Lockstep;
use atunnel_bench::peers::Contender;
use atunnel_bench::scenario::Scenario;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::{Value, json};
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

/// `--cost-units`' parser: a unit's name.
pub fn parse_unit(name: &str) -> Result<String, String> {
    match Unit::by_name(name) {
        Some(u) => Ok(u.name().to_string()),
        None => Err(format!(
            "no cost unit {name:?}; the units: {}",
            Unit::ALL.map(Unit::name).join(", ")
        )),
    }
}

/// A unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    IngressHttps,
    IngressConnect,
    EgressOpen,
    EgressUpload,
    EgressDownload,
    EgressHttp,
    IngressIdle,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::IngressHttps,
        Unit::IngressConnect,
        Unit::EgressOpen,
        Unit::EgressUpload,
        Unit::EgressDownload,
        Unit::EgressHttp,
        Unit::IngressIdle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Unit::IngressHttps => "ingress-https",
            Unit::IngressConnect => "ingress-connect",
            Unit::EgressOpen => "egress-open",
            Unit::EgressUpload => "egress-upload",
            Unit::EgressDownload => "egress-download",
            Unit::EgressHttp => "egress-http",
            Unit::IngressIdle => "ingress-idle",
        }
    }

    pub fn by_name(name: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name() == name)
    }

    /// What one unit is.
    pub fn per(self) -> &'static str {
        match self {
            Unit::IngressHttps => "request (router h2 -> actor h1, 64 B answer)",
            Unit::IngressConnect => "CONNECT tunnel with one request inside",
            Unit::EgressOpen => "egress tunnel opened and closed",
            Unit::EgressUpload => "MiB up (sandbox -> far end)",
            Unit::EgressDownload => "MiB down (far end -> sandbox)",
            Unit::EgressHttp => "HTTP/1.1 request on a kept egress tunnel",
            Unit::IngressIdle => "idle router connection hibernated and woken",
        }
    }

    /// N: units in the smaller window (the larger has 2N), in `pass`.
    fn count(self, pass: Pass, quick: bool) -> u64 {
        // Large enough that what runs in proportion to the window's length
        // (the contender's timers, ~50x longer under callgrind) stays small
        // beside the units: 16 opens moved their instructions by 8-10 %
        // between two quiet runs, 200 requests by 0.02 %.
        let n = match self {
            Unit::IngressHttps | Unit::EgressHttp => 200,
            Unit::IngressConnect | Unit::EgressOpen => 64,
            // Under perf 64 in the quick run too: what moves with wall
            // time (the trim task's 1 s tick, how many of the idle checks'
            // 125 ms grid ticks the connections' last requests spread
            // over) is a wake-up or two per window, which over 32
            // connections made 0.13 of 2 switches per connection between
            // two runs. Under callgrind 32: the set-up serves each
            // connection once, one after the other, ~50x slower, and with
            // 128 the first ones hibernated before their window opened
            // (105,157 instructions per connection against 128,156).
            Unit::IngressIdle => {
                return match pass {
                    Pass::Perf if quick => 64,
                    Pass::Perf => 160,
                    Pass::Callgrind => 32,
                };
            }
            // 64 under callgrind: HAProxy's choice between copying a
            // buffer and forwarding it, which follows where its buffers
            // stood, moved its instructions per MiB down by 6 % between
            // pairs of 32 and 64 MiB windows (its 64 MiB windows agreed
            // within 0.3 %); a 2N window of 128 MiB takes ~30 s there.
            // 256 under perf, where it takes a second: a switch more or
            // less in a window is then 1/256 per MiB, and HAProxy makes
            // about a third of one per MiB (up, 0.33 and 0.38 in two runs
            // with N = 64: three switches a window).
            Unit::EgressUpload | Unit::EgressDownload => {
                return match pass {
                    Pass::Perf => 256,
                    Pass::Callgrind => 64,
                };
            }
        };
        if quick { n } else { 5 * n }
    }

    /// Whether `contender` can do this unit at all.
    fn done_by(self, contender: Contender) -> bool {
        match contender {
            Contender::Atunnel => true,
            // nginx serves the router's HTTPS only: no CONNECT listener,
            // no sandboxes, no hibernation.
            Contender::Nginx => self == Unit::IngressHttps,
            // HAProxy also relays the sandboxes' egress bytes, TCP -> TLS
            // (no HTTP/2, so no HTTP request on a kept tunnel to compare:
            // that is the far end's work).
            Contender::Haproxy => matches!(
                self,
                Unit::IngressHttps | Unit::EgressOpen | Unit::EgressUpload | Unit::EgressDownload
            ),
        }
    }
}

/// One contender's figures per unit: each count's per-unit estimate from
/// every pair of windows (keys: `instructions`, `syscalls`,
/// `context_switches`, `preemptions`, `allocations`, and `sys:<name>` per
/// syscall name).
#[derive(Clone, Debug, Default)]
struct PerUnit {
    rounds: BTreeMap<String, Vec<f64>>,
}

impl PerUnit {
    fn push(&mut self, key: impl Into<String>, v: f64) {
        self.rounds.entry(key.into()).or_default().push(v);
    }

    /// The median of `key`'s estimates and their minimum and maximum.
    fn get(&self, key: &str) -> Option<Spread> {
        Spread::of(self.rounds.get(key)?)
    }
}

/// A count's median over the pairs of windows, and their range.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(v: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

/// What one window counted (each pass fills its part).
#[derive(Debug, Default)]
struct Window {
    instructions: Option<u64>,
    /// perf's counts, read once it has stopped (`StoppingPerf`): the
    /// windows after it go on meanwhile.
    sys: Option<tokio::task::JoinHandle<Result<SyscallCounts, cost::CostError>>>,
    allocations: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// The contender as it is, perf attached: syscalls, switches,
    /// allocations.
    Perf,
    /// The contender under callgrind: instructions.
    Callgrind,
}

/// What a unit reuses, set up (and used once) before the windows.
enum Prepared {
    Https(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
    Connect(h2::client::SendRequest<Bytes>),
    Egress,
    KeptTunnel(tokio::net::TcpStream),
    /// An egress tunnel for bytes, opened before the window.
    Tunnel(tokio::net::TcpStream),
    Idle(Vec<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>),
}

fn err(e: impl std::fmt::Display) -> atunnel_process::BoxError {
    e.to_string().into()
}

/// Sets up what `unit` reuses; for ingress-idle, the `n` connections.
async fn prepare(bench: &Bench, unit: Unit, n: u64) -> Result<Prepared, atunnel_process::BoxError> {
    let actors = super::super::dial::Actors::of(bench);
    Ok(match unit {
        Unit::IngressHttps => {
            let send = hyper_h2(bench.router_tls(443, Alpn::H2).await?).await?;
            routed_request(send.clone(), 0).await?;
            Prepared::Https(send)
        }
        Unit::IngressConnect => {
            let send = h2_client(bench.router_tls(8443, Alpn::H2).await?).await?;
            connect_exchange(send.clone(), 0).await?;
            Prepared::Connect(send)
        }
        Unit::EgressOpen => {
            // actor-0's pooled gateway connection exists before either
            // window (shared by all its tunnels).
            open_and_close(&actors).await?;
            Prepared::Egress
        }
        Unit::EgressUpload | Unit::EgressDownload => {
            open_and_close(&actors).await?;
            // The tunnel is opened before the window, so that the window
            // holds bytes only: a TLS relay's handshake per tunnel
            // (HAProxy's, resumed or in full as the far end's tickets
            // allow) moved its instructions per MiB by 10 % between
            // windows otherwise.
            // The writer's send buffer is fixed, as the download's reader's
            // receive buffer is: autotuned, how much of the window's bytes
            // a relay found waiting per wake-up moved with it (HAProxy's
            // switches per MiB up spread 0.44..0.70 over five pairs; fixed,
            // 1.98..2.02). The source streams without end: a window moves n
            // MiB plus however much more the buffers behind the contender
            // hold at its end than at its start. With the kernel's
            // autotuning, the reader's buffer grew between windows (one
            // window of 32 MiB carried 15 % more than another); fixed, it
            // is full at both ends.
            let (dest, buffers) = if unit == Unit::EgressUpload {
                let send = Some(UPLOAD_SEND_BUFFER);
                (
                    DISCARD,
                    FixedBuffers {
                        send,
                        receive: None,
                    },
                )
            } else {
                let receive = Some(DOWNLOAD_RECEIVE_BUFFER);
                (
                    SOURCE,
                    FixedBuffers {
                        receive,
                        send: None,
                    },
                )
            };
            let mut s = actors.dial_with_buffers(0, dest, buffers).await?;
            if unit == Unit::EgressDownload {
                // The source is streaming once a byte arrives.
                let mut first = [0u8; 1];
                s.read_exact(&mut first).await?;
            }
            Prepared::Tunnel(s)
        }
        Unit::EgressHttp => {
            let mut s = actors.dial(0, HTTP).await?;
            http_exchange(&mut s).await?;
            Prepared::KeptTunnel(s)
        }
        Unit::IngressIdle => {
            let mut conns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let tls = bench.router_tls(443, Alpn::Http1).await?;
                let (mut send, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                        .await?;
                tokio::spawn(conn);
                h1_request(&mut send).await?;
                conns.push(send);
            }
            Prepared::Idle(conns)
        }
    })
}

/// One egress tunnel from actor-0's sandbox: opened, a byte there and back,
/// closed, and the far end's close seen.
async fn open_and_close(
    actors: &super::super::dial::Actors,
) -> Result<(), atunnel_process::BoxError> {
    let mut s = actors.dial(0, ECHO).await?;
    crate::traffic::ping(&mut s).await?;
    s.shutdown().await?;
    let mut rest = [0u8; 16];
    while s.read(&mut rest).await? > 0 {}
    Ok(())
}

/// `bytes` written into the tunnel `s` (left open: the window ends once the
/// contender relayed them all and went quiet).
async fn upload_on(s: &mut tokio::net::TcpStream, bytes: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        s.write_all(&zeros[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

/// A router HTTP/1.1 request to actor-0, its answer read.
async fn h1_request(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
) -> Result<(), atunnel_process::BoxError> {
    send.ready().await?;
    let req = http::Request::builder()
        .uri("/")
        .header(http::header::HOST, "worker.bench")
        .header("ate-target-actor", "bench/actor-0")
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()).into());
    }
    resp.into_body().collect().await?;
    Ok(())
}

/// `n` units of `unit` on what `prepared` holds.
async fn work(
    bench: &Bench,
    pass: Pass,
    unit: Unit,
    prepared: &mut Prepared,
    n: u64,
) -> Result<(), atunnel_process::BoxError> {
    let actors = super::super::dial::Actors::of(bench);
    match (unit, prepared) {
        (Unit::IngressHttps, Prepared::Https(send)) => {
            for _ in 0..n {
                routed_request(send.clone(), 0).await?;
            }
        }
        (Unit::IngressConnect, Prepared::Connect(send)) => {
            for _ in 0..n {
                connect_exchange(send.clone(), 0).await?;
            }
        }
        (Unit::EgressOpen, Prepared::Egress) => {
            for _ in 0..n {
                open_and_close(&actors).await?;
            }
        }
        (Unit::EgressUpload, Prepared::Tunnel(s)) => {
            upload_on(s, n << 20).await?;
        }
        (Unit::EgressDownload, Prepared::Tunnel(s)) => {
            let mut buf = vec![0u8; 256 * 1024];
            let mut left = n << 20;
            while left > 0 {
                let want = buf.len().min(left as usize);
                let got = s.read(&mut buf[..want]).await?;
                if got == 0 {
                    return Err("the source closed early".into());
                }
                left -= got as u64;
            }
        }
        (Unit::EgressHttp, Prepared::KeptTunnel(s)) => {
            for _ in 0..n {
                http_exchange(s).await?;
            }
        }
        (Unit::IngressIdle, Prepared::Idle(conns)) => {
            tokio::time::sleep(idle_for(pass)).await;
            for send in conns.iter_mut() {
                h1_request(send).await?;
            }
        }
        _ => return Err(format!("{}: prepared for another unit", unit.name()).into()),
    }
    Ok(())
}

/// atunnel's allocations so far (none for a peer).
async fn allocations(bench: &Bench) -> Result<Option<u64>, atunnel_process::BoxError> {
    if !bench.is_atunnel() {
        return Ok(None);
    }
    Ok(Some(bench.stats(false).await?.process.allocations))
}

/// One window of `n` units: the pass's counts, its callgrind dump kept as
/// `dir/<label>.callgrind` (the profile of the unit).
async fn window(
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
async fn opened_then_work(
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
async fn opened(
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
fn engage(on: bool, spare: &[u32]) -> Result<Option<Lockstep>, atunnel_process::BoxError> {
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
struct Asleep {
    hibernations: f64,
    trims: f64,
}

/// atunnel's hibernations and trims so far, for the ingress-idle unit
/// (which fails unless every connection of the window hibernated in it).
async fn hibernations(
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
fn per(small: u64, big: u64, n: u64) -> f64 {
    (big as f64 - small as f64) / n as f64
}

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

/// The path `contender` takes for `unit`: to the actors' program
/// (ingress), or from actor-0's sandbox to the far end (egress).
fn path_of(contender: Contender, unit: Unit) -> &'static str {
    let egress = matches!(
        unit,
        Unit::EgressOpen | Unit::EgressUpload | Unit::EgressDownload | Unit::EgressHttp
    );
    match (contender.peer(), egress) {
        (None, false) => "across a veth into each actor's sandbox (its nftables rules)",
        (None, true) => {
            "redirected from actor-0's sandbox to atunnel; HTTP/2 CONNECT on a kept mTLS connection to the gateway sink"
        }
        (Some(peer), false) => peer.path(),
        (Some(_), true) => {
            "redirected from actor-0's sandbox to HAProxy (mode tcp); a TLS connection per tunnel (session resumed) to the sink's TLS services"
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The run folder's `cost` part: per unit, each contender's counts.
fn units_json(
    units: &[Unit],
    quick: bool,
    measured: &[(Contender, BTreeMap<&'static str, PerUnit>)],
) -> Value {
    let units: Vec<Value> = units
        .iter()
        .map(|u| {
            let contenders: Vec<Value> = measured
                .iter()
                .filter_map(|(c, m)| {
                    let r = m.get(u.name())?;
                    let by_name: serde_json::Map<String, Value> = r
                        .rounds
                        .keys()
                        .filter_map(|k| {
                            let name = k.strip_prefix("sys:")?;
                            let v = r.get(k)?.median;
                            (v.abs() >= 0.005).then(|| (name.to_string(), json!(round2(v))))
                        })
                        .collect();
                    let median = |k: &str, round: fn(f64) -> f64| r.get(k).map(|s| round(s.median));
                    // [min, max] of the pairs' estimates, beside each median.
                    let spread: serde_json::Map<String, Value> = [
                        ("instructions", f64::round as fn(f64) -> f64),
                        ("syscalls", round2),
                        ("context_switches", round2),
                        ("preemptions", round2),
                        ("allocations", round2),
                    ]
                    .into_iter()
                    .filter_map(|(k, round)| {
                        let s = r.get(k)?;
                        Some((k.to_string(), json!([round(s.min), round(s.max)])))
                    })
                    .collect();
                    Some(json!({
                        "name": c.name(),
                        "path": path_of(*c, *u),
                        "instructions": median("instructions", f64::round),
                        "syscalls": median("syscalls", round2),
                        "syscalls_by_name": by_name,
                        "context_switches": median("context_switches", round2),
                        "preemptions": median("preemptions", round2),
                        "allocations": median("allocations", round2),
                        "spread": spread,
                    }))
                })
                .collect();
            json!({
                "name": u.name(),
                "per": u.per(),
                "n": u.count(Pass::Callgrind, quick),
                "n_perf": u.count(Pass::Perf, quick),
                "rounds": rounds(*u, Pass::Callgrind, quick),
                "rounds_perf": rounds(*u, Pass::Perf, quick),
                "contenders": contenders,
            })
        })
        .collect();
    json!({ "units": units })
}

/// The cost scenario: every unit on atunnel, then on each installed peer
/// that can do it; atunnel back as it was afterwards.
pub(super) async fn cost(bench: &mut Bench) -> Result<ScenarioResult, atunnel_process::BoxError> {
    // Left out, as a missing peer is, so that the quick run works on a
    // machine with nothing installed; CI installs both and its test
    // requires them (`ATUNNEL_REQUIRE_COST_TOOLS`).
    if let Err(e) = cost::require_tools() {
        return Ok(ScenarioResult {
            name: Scenario::Cost.name().into(),
            notes: vec![format!("left out: {e}")],
            ..ScenarioResult::default()
        });
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
    Ok(ScenarioResult {
        name: Scenario::Cost.name().into(),
        rungs: Vec::new(),
        summary: units_json(&units, bench.quick, &measured),
        notes,
    })
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

/// report.md's tables: per unit, each contender's counts (the median over
/// the pairs of windows, their range in brackets) and atunnel's ratio to it.
pub fn report_section(summary: &Value) -> String {
    use std::fmt::Write;
    let mut md = String::new();
    let num = |v: &Value| match v.as_f64() {
        Some(x) if x.abs() >= 1000.0 => format!("{:.0}", x),
        Some(x) => format!("{x:.2}"),
        None => "n/a".into(),
    };
    // `key`'s median and, when the pairs disagreed, their min..max.
    let fmt = |c: &Value, key: &str| {
        let median = num(&c[key]);
        match c["spread"][key]
            .as_array()
            .map(|r| (num(&r[0]), num(&r[1])))
        {
            Some((lo, hi)) if lo != hi || lo != median => format!("{median} ({lo}..{hi})"),
            _ => median,
        }
    };
    for unit in summary["units"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "### cost: {} (per {}; N = {} under callgrind, median of {} pairs of windows; N = {} under perf, median of {})\n",
            unit["name"].as_str().unwrap_or(""),
            unit["per"].as_str().unwrap_or(""),
            unit["n"],
            unit["rounds"].as_u64().unwrap_or(1),
            unit["n_perf"],
            unit["rounds_perf"].as_u64().unwrap_or(1),
        );
        let _ = writeln!(
            md,
            "| contender | instructions | syscalls | top {TOP_SYSCALLS} syscalls | context switches | preemptions | allocations | path |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        let contenders = unit["contenders"].as_array().cloned().unwrap_or_default();
        for c in &contenders {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                c["name"].as_str().unwrap_or(""),
                fmt(c, "instructions"),
                fmt(c, "syscalls"),
                top_syscalls(&c["syscalls_by_name"]),
                fmt(c, "context_switches"),
                fmt(c, "preemptions"),
                fmt(c, "allocations"),
                c["path"].as_str().unwrap_or(""),
            );
        }
        let atunnel = contenders.iter().find(|c| c["name"] == "atunnel");
        for peer in contenders.iter().filter(|c| c["name"] != "atunnel") {
            let Some(a) = atunnel else { break };
            let ratio = |k: &str| match (a[k].as_f64(), peer[k].as_f64()) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "n/a".into(),
            };
            let _ = writeln!(
                md,
                "| atunnel / {} | {} | {} | | {} | | n/a | |",
                peer["name"].as_str().unwrap_or(""),
                ratio("instructions"),
                ratio("syscalls"),
                ratio("context_switches"),
            );
        }
        let _ = writeln!(md);
    }
    md
}

/// The top syscalls by name, `name count` each, the most first.
fn top_syscalls(by_name: &Value) -> String {
    let mut v: Vec<(&String, f64)> = by_name
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k, v.as_f64()?)))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter()
        .take(TOP_SYSCALLS)
        .map(|(k, n)| format!("{k} {n:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_the_median_of_the_pairs_with_their_range() {
        let s = Spread::of(&[84_500.0, 84_300.0, 91_000.0]).expect("some");
        assert_eq!(
            s,
            Spread {
                median: 84_500.0,
                min: 84_300.0,
                max: 91_000.0
            }
        );
        assert_eq!(Spread::of(&[2.0, 4.0]).map(|s| s.median), Some(3.0));
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn the_report_carries_each_figures_spread_beside_it_and_json_keeps_its_fields() {
        let mut r = PerUnit::default();
        for (i, s, c) in [
            (84_500.0, 6.0, 2.0),
            (84_300.0, 6.1, 2.0),
            (91_000.0, 6.0, 2.0),
        ] {
            r.push("instructions", i);
            r.push("syscalls", s);
            r.push("context_switches", c);
            r.push("sys:writev", 2.0);
        }
        let measured = vec![(
            Contender::Atunnel,
            BTreeMap::from([(Unit::IngressHttps.name(), r)]),
        )];
        let summary = units_json(&[Unit::IngressHttps], true, &measured);
        let c = &summary["units"][0]["contenders"][0];
        for key in [
            "name",
            "instructions",
            "syscalls",
            "syscalls_by_name",
            "context_switches",
            "allocations",
        ] {
            assert!(c.get(key).is_some(), "{key} missing: {c}");
        }
        assert_eq!(c["instructions"], json!(84_500.0));
        assert_eq!(c["spread"]["instructions"], json!([84_300.0, 91_000.0]));
        assert_eq!(c["syscalls_by_name"]["writev"], json!(2.0));
        let md = report_section(&summary);
        assert!(md.contains("| 84500 (84300..91000) |"), "{md}");
        assert!(md.contains("| 6.00 (6.00..6.10) |"), "{md}");
        // A count every pair agreed on stands alone.
        assert!(md.contains("| 2.00 |"), "{md}");
    }
}
