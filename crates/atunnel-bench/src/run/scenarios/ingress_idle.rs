//! `ingress-idle`: what an idle router connection costs atunnel, awake and
//! hibernated, for each case (HTTP/1.1 keep-alive after a short and after a
//! 60 KB answer, HTTP/2 after one request, a CONNECT tunnel after one
//! exchange), and what hibernating costs.
//!
//! Two passes on fresh atunnels: hibernation off (`--hibernate-after=0`),
//! then on with a short period. In each, for every case, connections are
//! opened and serve one request, atunnel's heap and cgroup are read (after
//! asking the allocator to release free memory) once they are idle, and then
//! each connection serves one more request: the first after waking when
//! hibernated. With hibernation on, that first request after waking is
//! then paired with the next request on the same connections while they
//! are still awake, and the idle-wake-awake round repeated
//! ([`WAKE_ROUNDS`]), so that the ratio woken / awake has a 95 % interval
//! and a verdict against [`WAKE_RATIO_MAX`]. Last, keep-alive throughput at
//! a fixed rate with hibernation off and on.
//!
//! With a peer (nginx, HAProxy) in atunnel's place (`--compare peers`):
//! one pass as it is (it has no hibernation), the HTTPS cases only (it has
//! no CONNECT listener), cgroup bytes only (its heap is not in /stats).

use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel_bench::load::confidence::{Bound, Counts, Figure, ratio};
use atunnel_bench::load::results::{RungResult, ScenarioResult};
use atunnel_bench::scenario::ingress_idle::{Case as CaseSummary, OffOn, Summary, WakeRound};
use atunnel_measure::schedule::{Rung, new_histogram};
use atunnel_support::stats_client::Stats;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::run::bench::Bench;
use crate::run::router::Alpn;
use crate::run::rung::{measure, rung_duration};
use crate::run::scenarios::ingress::hyper_h2;

/// The bench's hibernation period: short so the scenario stays quick. What
/// a hibernation frees and costs does not depend on it (default 15 s).
const PERIOD: Duration = Duration::from_secs(2);

/// How long the connections stay idle in each pass: past the two periods
/// by which every one has hibernated.
const IDLE_WINDOW: Duration = Duration::from_millis(4500);

/// How long the connections stay idle between the requests that woke them
/// and the next ones, which must find them awake: well inside the one
/// period before which none hibernates.
const AWAKE_IDLE: Duration = Duration::from_millis(500);

/// Rounds of (idle past hibernation, a request on each, [`AWAKE_IDLE`],
/// a request on each) with hibernation on: the quick run's and the full
/// one's.
const WAKE_ROUNDS: (usize, usize) = (4, 6);

/// The bound on the first request after waking: its median latency over
/// the connections at most this many times the next request's on the same
/// connections awake (docs/memory.md: waking derives no key and costs
/// about what an awake request does).
const WAKE_RATIO_MAX: f64 = 1.1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// HTTP/1.1 keep-alive after a short response.
    H1Short,
    /// HTTP/1.1 keep-alive after a 60 KB response.
    H1Page,
    /// HTTP/2 after one request.
    H2,
    /// An HTTP/1.1 CONNECT tunnel after one exchange through it.
    Connect,
}

const CASES: [Case; 4] = [Case::H1Short, Case::H1Page, Case::H2, Case::Connect];

/// The cases a peer in atunnel's place can serve (it has no CONNECT
/// listener).
const PEER_CASES: [Case; 3] = [Case::H1Short, Case::H1Page, Case::H2];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::H1Short => "http1-keepalive-short",
            Case::H1Page => "http1-keepalive-60kb",
            Case::H2 => "http2-one-request",
            Case::Connect => "connect-tunnel",
        }
    }
}

enum Conn {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
    Connect(Box<TlsStream<TcpStream>>),
}

async fn open(bench: &Bench, case: Case, actor: u64) -> Result<Conn, String> {
    let e = |e: atunnel_process::BoxError| e.to_string();
    Ok(match case {
        Case::H1Short | Case::H1Page => {
            let tls = bench.router_tls(443, Alpn::Http1).await.map_err(e)?;
            let (send, conn) = http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Conn::H1(send)
        }
        Case::H2 => {
            let tls = bench.router_tls(443, Alpn::H2).await.map_err(e)?;
            Conn::H2(hyper_h2(tls).await.map_err(e)?)
        }
        Case::Connect => Conn::Connect(Box::new(bench.connect_tunnel(actor, 80).await.map_err(e)?)),
    })
}

/// One request over `conn`; the answer is read entirely.
async fn request(conn: &mut Conn, case: Case, actor: u64) -> Result<(), String> {
    let path = if case == Case::H1Page { "/page" } else { "/" };
    let h1 = matches!(conn, Conn::H1(_));
    let req = || {
        let builder = if h1 {
            // HTTP/1.1 as a router sends it: origin form and a Host header
            // (nginx refuses a request without one with 400).
            http::Request::builder()
                .uri(path)
                .header(http::header::HOST, "worker.bench")
        } else {
            http::Request::builder().uri(format!("https://worker.bench{path}"))
        };
        builder
            .header("ate-target-actor", format!("bench/actor-{actor}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())
    };
    let resp = match conn {
        Conn::H1(s) => {
            s.ready().await.map_err(|e| e.to_string())?;
            s.send_request(req()?).await
        }
        Conn::H2(s) => {
            s.ready().await.map_err(|e| e.to_string())?;
            s.send_request(req()?).await
        }
        Conn::Connect(tls) => return exchange_in_tunnel(tls).await,
    }
    .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    resp.into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// An HTTP/1.1 request to the actor inside a CONNECT tunnel, its answer
/// read by Content-Length; the tunnel stays open.
async fn exchange_in_tunnel(tls: &mut TlsStream<TcpStream>) -> Result<(), String> {
    tls.write_all(b"GET / HTTP/1.1\r\nHost: actor\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let head = atunnel_connect::http1::read_head(tls)
        .await
        .map_err(|e| e.to_string())?;
    let answer = atunnel_connect::http1::parse_response(&head).map_err(|e| e.to_string())?;
    if !(200..300).contains(&answer.status) {
        return Err(format!("status {}", answer.status));
    }
    let len = answer
        .content_length
        .ok_or("answer without content-length")?;
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// One case's figures in one pass.
#[derive(Default)]
struct Held {
    /// atunnel's heap (none for a peer).
    heap_per_conn: Option<f64>,
    cgroup_per_conn: f64,
    /// Tunnel CPU while the connections went idle (and hibernated), per connection.
    idle_cpu_us_per_conn: f64,
    /// The next request on each idle connection: CPU and latency.
    next_cpu_us: f64,
    next_p50_us: u64,
    next_p99_us: u64,
    /// With hibernation on, per round: the median latency of the request
    /// that woke each connection, and of the next one, awake (`None` if
    /// some connection had hibernated again before it).
    wake_rounds: Vec<(u64, Option<u64>)>,
}

impl Held {
    /// The woken / awake ratio of each round against [`WAKE_RATIO_MAX`].
    fn wake_figure(&self) -> Figure {
        Figure::of(
            self.wake_rounds
                .iter()
                .map(|&(woken, awake)| awake.and_then(|a| ratio(woken as f64, a as f64)))
                .collect(),
            Bound::AtMost(WAKE_RATIO_MAX),
        )
    }
}

/// Waits until all `n` connections have hibernated (late ones on a busy
/// host), within 10 s.
async fn all_hibernated(bench: &Bench, n: usize) -> Result<(), atunnel_process::BoxError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let hibernated = hibernated_now(&bench.stats(false).await?);
        if hibernated as usize >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{hibernated} of {n} connections hibernated within {:?} of their last request",
                IDLE_WINDOW + Duration::from_secs(10)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One request on each of `conns`, one at a time so that latency is the
/// connection's own: their latencies.
async fn one_each(
    conns: &mut [Conn],
    case: Case,
    actors: u64,
) -> Result<hdrhistogram::Histogram<u64>, atunnel_process::BoxError> {
    let mut latency = new_histogram();
    for (i, c) in conns.iter_mut().enumerate() {
        let t0 = Instant::now();
        request(c, case, i as u64 % actors).await?;
        let _ = latency.record(t0.elapsed().as_micros() as u64);
    }
    Ok(latency)
}

async fn hold(
    bench: &mut Bench,
    case: Case,
    n: usize,
    hibernating: bool,
) -> Result<Held, atunnel_process::BoxError> {
    let actors = bench.actor_count();
    // The connections to the actors are pooled per actor, not per router
    // connection: open them before the baseline (one request of the case's
    // size to each actor on a connection of its own, closed after; hyper
    // keeps a pooled connection's grown read buffer) so that the
    // per-connection figures do not carry them.
    let warm = if case == Case::H1Page {
        Case::H1Page
    } else {
        Case::H1Short
    };
    for i in 0..actors {
        let mut c = open(bench, warm, i).await?;
        request(&mut c, warm, i).await?;
    }
    let before = atunnel_stats(bench, true).await?;
    let fds0 = open_fds(bench).await?;
    let cg0 = bench.cgroup_sample();
    let mut conns = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let mut c = open(bench, case, i % actors).await?;
        request(&mut c, case, i % actors).await?;
        conns.push(c);
    }
    let cg1 = bench.cgroup_sample();
    // Idle for the same fixed window in both passes, with nothing else
    // asked of atunnel meanwhile (a /stats poll costs more CPU than a
    // hibernation), so the passes' CPU differs only by what hibernating
    // costs. A connection hibernates one to two periods after its last byte.
    tokio::time::sleep(IDLE_WINDOW).await;
    let cg2 = bench.cgroup_sample();
    let waking = hibernating && bench.is_atunnel();
    if waking {
        // On a busy host the last few may be late: wait for them (outside
        // the CPU window), so the memory figures are of hibernated ones.
        all_hibernated(bench, n).await?;
    }
    let after = atunnel_stats(bench, true).await?;
    let cg3 = bench.cgroup_sample();
    let per = |x: f64| x / n as f64;
    let heap = |s: &Stats| s.process.heap_bytes as f64;
    let mut held = Held {
        heap_per_conn: before
            .zip(after)
            .map(|(before, after)| per(heap(&after) - heap(&before))),
        cgroup_per_conn: per(cg3.memory_bytes as f64 - cg0.memory_bytes as f64),
        idle_cpu_us_per_conn: per(cg2.cpu_seconds_since(&cg1) * 1e6),
        ..Held::default()
    };
    // The next request on each, one at a time so latency is the
    // connection's own.
    let cg4 = bench.cgroup_sample();
    let latency = one_each(&mut conns, case, actors).await?;
    let cg5 = bench.cgroup_sample();
    held.next_cpu_us = per(cg5.cpu_seconds_since(&cg4) * 1e6);
    held.next_p50_us = latency.value_at_quantile(0.5);
    held.next_p99_us = latency.value_at_quantile(0.99);
    if waking {
        let rounds = if bench.quick {
            WAKE_ROUNDS.0
        } else {
            WAKE_ROUNDS.1
        };
        let mut woken = latency.value_at_quantile(0.5);
        for round in 0..rounds {
            if round > 0 {
                tokio::time::sleep(IDLE_WINDOW).await;
                all_hibernated(bench, n).await?;
                woken = one_each(&mut conns, case, actors)
                    .await?
                    .value_at_quantile(0.5);
            }
            tokio::time::sleep(AWAKE_IDLE).await;
            let awake = one_each(&mut conns, case, actors)
                .await?
                .value_at_quantile(0.5);
            // A pair counts only if every connection was awake for it.
            let asleep = hibernated_now(&bench.stats(false).await?);
            held.wake_rounds
                .push((woken, (asleep == 0.0).then_some(awake)));
        }
    }
    drop(conns);
    // atunnel closes its side asynchronously: the next case's baseline must
    // not include these connections being torn down.
    // Done when back to the starting count, or when the count stops falling
    // (connections to the actors that the case opened stay pooled).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = f64::MAX;
    while Instant::now() < deadline {
        let fds = open_fds(bench).await?;
        if fds <= fds0 + 2.0 || fds >= last {
            break;
        }
        last = fds;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(held)
}

/// Ingress connections hibernated now (none without ingress).
fn hibernated_now(stats: &Stats) -> f64 {
    stats.hibernation.map_or(0, |h| h.hibernating) as f64
}

/// atunnel's /stats (after releasing free memory when `release`); none
/// for a peer.
async fn atunnel_stats(
    bench: &Bench,
    release: bool,
) -> Result<Option<Stats>, atunnel_process::BoxError> {
    if !bench.is_atunnel() {
        return Ok(None);
    }
    Ok(Some(bench.stats(release).await?))
}

/// Descriptors the contender holds: atunnel's own count (/stats), or those
/// of every process in the cgroup for a peer (nginx's master and worker).
async fn open_fds(bench: &Bench) -> Result<f64, atunnel_process::BoxError> {
    if bench.is_atunnel() {
        return Ok(bench.stats(false).await?.process.open_fds as f64);
    }
    let pids = bench.last_status().cgroup.processes()?;
    let fds = pids
        .iter()
        .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
        .map(|dir| dir.count())
        .sum::<usize>();
    Ok(fds as f64)
}

/// Keep-alive requests at a fixed rate over a few HTTP/1.1 connections.
async fn keepalive(bench: &mut Bench, rate: f64) -> Result<RungResult, atunnel_process::BoxError> {
    let actors = bench.actor_count();
    let mut conns = Vec::new();
    for i in 0..50u64 {
        conns.push(tokio::sync::Mutex::new(
            open(bench, Case::H1Short, i % actors).await?,
        ));
    }
    let conns = Arc::new(conns);
    let c = conns.clone();
    let (result, _) = measure(
        bench,
        Bench::actors_pid,
        &Rung {
            rate,
            duration: rung_duration(bench),
            max_in_flight: 2048,
        },
        move |i| {
            let c = c.clone();
            // One request at a time on a keep-alive connection.
            async move {
                let mut conn = c[i as usize % c.len()].lock().await;
                request(&mut conn, Case::H1Short, i % actors).await
            }
        },
    )
    .await;
    // The connections stay open until the rung's window has closed.
    drop(conns);
    Ok(result)
}

pub(super) async fn ingress_idle(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let n = if bench.quick { 150 } else { 1000 };
    let rate = if bench.quick { 1000.0 } else { 2000.0 };
    let mut passes: Vec<Vec<Held>> = Vec::new();
    let mut rungs = Vec::new();
    let period_s = PERIOD.as_secs_f64();
    // A peer runs one pass as it is: it has no hibernation to turn on.
    let peer = !bench.is_atunnel();
    let (passes_run, cases): (&[bool], &[Case]) = if peer {
        (&[false], &PEER_CASES)
    } else {
        (&[false, true], &CASES)
    };
    for &hibernating in passes_run {
        let period = if hibernating { PERIOD } else { Duration::ZERO };
        if !peer {
            bench
                .restart_tunnel(vec![format!("--hibernate-after={}ms", period.as_millis())])
                .await?;
        }
        let mut pass = Vec::new();
        for &case in cases {
            eprintln!(
                "         {} ({}): {n} connections",
                case.name(),
                if hibernating { "hibernation on" } else { "off" }
            );
            if peer {
                // A fresh peer for each case: its allocator keeps what an
                // earlier case grew (HAProxy's pools, nginx's), which
                // atunnel's /stats release gives back, so a later case
                // would otherwise look free.
                bench.restart_tunnel(Vec::new()).await?;
            }
            pass.push(hold(bench, case, n, hibernating).await?);
        }
        passes.push(pass);
        let mut rung = keepalive(bench, rate).await?;
        rung.notes = format!(
            "keep-alive over 50 HTTP/1.1 connections, hibernation {}",
            if hibernating {
                format!("on ({period_s} s)")
            } else {
                "off".into()
            }
        );
        rungs.push(rung);
    }
    let round = |x: f64| x.round();
    if peer {
        return Ok(peer_result(bench, n, cases, &passes[0], rungs));
    }
    let wake: Vec<Figure> = passes[1].iter().map(Held::wake_figure).collect();
    let wake_counts = Counts::of(wake.iter().map(|f| f.conclusion));
    let cases: Vec<CaseSummary> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let (off, on) = (&passes[0][i], &passes[1][i]);
            let heap = |h: &Held| h.heap_per_conn.map(round);
            CaseSummary {
                case: case.name().into(),
                heap_bytes_per_conn: heap(off),
                hibernated_heap_bytes_per_conn: heap(on),
                cgroup_bytes_per_conn: round(off.cgroup_per_conn),
                hibernated_cgroup_bytes_per_conn: Some(round(on.cgroup_per_conn)),
                idle_cpu_us_per_conn: round(off.idle_cpu_us_per_conn),
                hibernated_idle_cpu_us_per_conn: Some(round(on.idle_cpu_us_per_conn)),
                // What hibernating adds: the same idle window's CPU with
                // hibernation on, less with it off.
                hibernating_cpu_us_per_conn: Some(round(
                    on.idle_cpu_us_per_conn - off.idle_cpu_us_per_conn,
                )),
                next_request_cpu_us: round(off.next_cpu_us),
                first_request_after_wake_cpu_us: Some(round(on.next_cpu_us)),
                next_request_p50_us: off.next_p50_us,
                next_request_p99_us: off.next_p99_us,
                first_request_after_wake_p50_us: Some(on.next_p50_us),
                first_request_after_wake_p99_us: Some(on.next_p99_us),
                // Per round, the median first request after waking and the
                // next one awake; their ratio's interval and verdict.
                wake_rounds: Some(
                    on.wake_rounds
                        .iter()
                        .map(|&(woken_p50_us, awake_p50_us)| WakeRound {
                            woken_p50_us,
                            awake_p50_us,
                        })
                        .collect(),
                ),
                first_request_after_wake_ratio: Some(wake[i].summary()),
            }
        })
        .collect();
    let summary = Summary {
        conns: n,
        hibernate_after_s: Some(PERIOD.as_secs()),
        cases,
        keepalive_rps: OffOn {
            off: rungs[0].achieved,
            on: Some(rungs[1].achieved),
        },
        keepalive_cores_per_1000_rps: OffOn {
            off: cores_per_krps(&rungs[0]),
            on: Some(cores_per_krps(&rungs[1])),
        },
        wake_verdict: Some(wake_counts.overall()),
        wake_verdicts: Some(wake_counts),
    };
    Ok(ScenarioResult::new(
        &summary,
        rungs,
        [
            format!("first request after waking, per case: {} rounds of the connections idle past hibernation, one request on each (the first after waking), {} ms idle, one request on each again (awake); each round's ratio is the woken median over the awake median, on the same connections a moment apart, so that the host's drift cancels; the interval is 95 % (Student's t on the log ratios, as noisy-neighbour's), and a case passes when the whole interval is at most {WAKE_RATIO_MAX}, fails when it is wholly above, and is inconclusive otherwise (wake_verdicts counts them; a round in which a connection had hibernated again before its awake request has no ratio)", if bench.quick { WAKE_ROUNDS.0 } else { WAKE_ROUNDS.1 }, AWAKE_IDLE.as_millis()),
        ]
        .into_iter()
        .chain(CASES.iter().zip(&wake).map(|(case, f)| {
            format!("{}: first request after waking / awake {}", case.name(), f.text())
        }))
        .chain([
            format!("{n} router connections per case, each served one request, then idle; heap and cgroup bytes per connection read after asking the allocator to release free memory; the hibernation period is {period_s} s here (default 15 s), which changes when, not what, it frees"),
            "every case hibernates its TLS session down to its traffic keys; HTTP/1.1 also drops hyper's buffers and state, while HTTP/2 keeps h2's buffers and HPACK tables for the connection's life (only a GOAWAY, which the router sees, would free them)".into(),
            format!("idle CPU is atunnel's CPU over the {:.1} s after the last request, per connection, the same window in both passes with nothing else asked of atunnel; hibernating_cpu_us_per_conn is that with hibernation on less that with it off; the next-request figures are one request at a time on each idle connection", IDLE_WINDOW.as_secs_f64()),
        ])
        .collect(),
    ))
}

/// Cores per 1,000 requests/s of a keep-alive rung.
fn cores_per_krps(r: &RungResult) -> f64 {
    if r.achieved > 0.0 {
        (r.tunnel_cpu_cores / r.achieved * 1000.0 * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// ingress-idle's result for a peer in atunnel's place: its one pass, the
/// cgroup figures only, in the keys atunnel's result uses for the same
/// figures (awake, hibernation off).
fn peer_result(
    bench: &Bench,
    n: usize,
    cases: &[Case],
    pass: &[Held],
    rungs: Vec<RungResult>,
) -> ScenarioResult {
    let round = |x: f64| x.round();
    let cases = cases
        .iter()
        .zip(pass)
        .map(|(case, h)| CaseSummary {
            case: case.name().into(),
            cgroup_bytes_per_conn: round(h.cgroup_per_conn),
            idle_cpu_us_per_conn: round(h.idle_cpu_us_per_conn),
            next_request_cpu_us: round(h.next_cpu_us),
            next_request_p50_us: h.next_p50_us,
            next_request_p99_us: h.next_p99_us,
            ..CaseSummary::default()
        })
        .collect();
    let summary = Summary {
        conns: n,
        cases,
        keepalive_rps: OffOn {
            off: rungs[0].achieved,
            on: None,
        },
        keepalive_cores_per_1000_rps: OffOn {
            off: cores_per_krps(&rungs[0]),
            on: None,
        },
        ..Summary::default()
    };
    ScenarioResult::new(
        &summary,
        rungs,
        vec![format!(
            "{} in atunnel's place, fresh for each case, reaching the actors {}: {n} router connections per case, each served one request, then idle for as long as atunnel's pass with hibernation off; cgroup bytes per connection (its heap is not in /stats); no CONNECT case (it has no CONNECT listener) and no hibernation",
            bench.contender(),
            bench.contender().peer().map_or("", |p| p.path()),
        )],
    )
}

#[cfg(test)]
mod tests {
    use atunnel_bench::load::confidence::Conclusion;

    use super::*;

    fn held(rounds: &[(u64, Option<u64>)]) -> Held {
        Held {
            wake_rounds: rounds.to_vec(),
            ..Held::default()
        }
    }

    #[test]
    fn a_wake_that_costs_what_an_awake_request_does_passes_and_one_twice_as_slow_fails() {
        let same = held(&[
            (310, Some(300)),
            (295, Some(300)),
            (305, Some(300)),
            (300, Some(300)),
        ]);
        assert_eq!(same.wake_figure().conclusion, Conclusion::Pass);
        let slow = held(&[
            (600, Some(300)),
            (640, Some(310)),
            (590, Some(300)),
            (610, Some(290)),
        ]);
        assert_eq!(slow.wake_figure().conclusion, Conclusion::Fail);
        // The host's noise: one round 3x, the others even.
        let noisy = held(&[
            (900, Some(300)),
            (300, Some(310)),
            (290, Some(300)),
            (310, Some(300)),
        ]);
        assert_eq!(noisy.wake_figure().conclusion, Conclusion::Inconclusive);
        assert_eq!(
            noisy.wake_figure().summary().bound,
            Some(Bound::AtMost(WAKE_RATIO_MAX))
        );
    }

    #[test]
    fn a_round_in_which_a_connection_slept_again_before_its_awake_request_has_no_ratio() {
        let f = held(&[(300, Some(300)), (9000, None), (300, Some(300))]).wake_figure();
        assert_eq!(f.ratios, vec![Some(1.0), None, Some(1.0)]);
        assert_eq!(f.conclusion, Conclusion::Pass);
        let none = held(&[(300, None)]).wake_figure();
        assert_eq!(none.conclusion, Conclusion::Inconclusive);
    }
}
