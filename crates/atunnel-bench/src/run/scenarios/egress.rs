//! The egress scenarios: traffic from inside the actors' sandboxes through
//! atunnel to the gateway sink. Idle connections held (egress-idle), bulk
//! throughput (egress-tcp), requests over reused connections (egress-http)
//! and new connections (egress-new).

use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::scenario::{PerFamily, egress_http, egress_idle, egress_new, egress_tcp};
use atunnel_measure::schedule::Rung;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::role::process_cpu_seconds;
use crate::run::bench::Bench;
use crate::run::dial::Actors;
use crate::run::rung::{climb, ladder, measure, sustainable};
use crate::traffic::{DISCARD, DISCARD6, ECHO, ECHO6, HTTP, HTTP_ANSWER_LEN};

/// The address families egress-tcp runs over, with the destination each
/// dials.
const FAMILIES: [(&str, &str); 2] = [("ipv4", DISCARD), ("ipv6", DISCARD6)];

async fn ping(s: &mut TcpStream) -> Result<(), String> {
    crate::traffic::ping(s).await.map_err(|e| e.to_string())
}

/// Hold N idle egress connections over every sandbox: heap, cgroup bytes
/// and tasks per connection, CPU while opening them at 200/s and holding them.
pub(super) async fn egress_idle(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let actors = Actors::of(bench);
    let mut notes = Vec::new();
    let mut n = bench.idle_conns;
    // This process holds one descriptor per connection.
    let soft = atunnel_host::nofile_soft_limit()?;
    let room = usize::try_from(soft)
        .unwrap_or(usize::MAX)
        .saturating_sub(500);
    if n > room {
        notes.push(format!(
            "the generator's fd limit ({soft}) capped the connections at {room} of {n}: the fd limit, not memory, stopped it"
        ));
        n = room;
    }
    // Warm up: each actor's pooled gateway connection exists before the
    // baseline (shared by all its tunnels, not a per-connection cost).
    for i in 0..actors.sandboxes.len() as u64 {
        let mut s = actors.dial(i, ECHO).await?;
        ping(&mut s).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = bench.stats(true).await?;
    let cg0 = bench.cgroup_sample();
    let held = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let rate = 200.0;
    let rung = Rung {
        rate,
        duration: Duration::from_secs_f64(n as f64 / rate),
        max_in_flight: 2000,
    };
    let (a, h) = (actors.clone(), held.clone());
    let (mut result, _) = measure(bench, Bench::sink_pid, &rung, move |i| {
        let (a, h) = (a.clone(), h.clone());
        async move {
            let mut s = a.dial(i, ECHO).await.map_err(|e| e.to_string())?;
            ping(&mut s).await?;
            h.lock().expect("held lock").push(s);
            Ok(())
        }
    })
    .await;
    let cg1 = bench.cgroup_sample();
    let opened = held.lock().expect("held lock").len();
    let open_cpu = cg1.cpu_seconds_since(&cg0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cg2 = bench.cgroup_sample();
    let hold_cores = cg2.cpu_seconds_since(&cg1) / 3.0;
    let after = bench.stats(true).await?;
    let cg3 = bench.cgroup_sample();
    let per = |v: f64| if opened > 0 { v / opened as f64 } else { 0.0 };
    let heap = per(after.process.heap_bytes as f64 - before.process.heap_bytes as f64);
    let tasks = per(after.process.tasks as f64 - before.process.tasks as f64);
    let cgroup = per(cg3.memory_bytes as f64 - cg0.memory_bytes as f64);
    let sock = per(cg3.socket_bytes as f64 - cg0.socket_bytes as f64);
    result.tunnel_heap_bytes = after.process.heap_bytes as u64;
    result.tunnel_cgroup_bytes = cg3.memory_bytes;
    drop(std::mem::take(&mut *held.lock().expect("held lock")));
    // Let the tunnel see every close before the next scenario.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let s = bench.stats(false).await?;
        if s.egress.is_none_or(|e| e.tunnels_open == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What the allocator keeps once they are all gone (fragmentation): the
    // cgroup and RSS above the baseline, after asking it to release memory.
    let closed = bench.stats(true).await?;
    let cg4 = bench.cgroup_sample();
    let retained_cgroup = cg4.memory_bytes as f64 - cg0.memory_bytes as f64;
    let retained_rss = closed.process.rss_bytes as f64 - before.process.rss_bytes as f64;
    let summary = egress_idle::Summary {
        conns: opened,
        heap_bytes_per_conn: heap.round(),
        cgroup_bytes_per_conn: cgroup.round(),
        socket_bytes_per_conn: sock.round(),
        tasks_per_conn: (tasks * 100.0).round() / 100.0,
        open_cpu_ms_per_conn: (per(open_cpu) * 1e3 * 1000.0).round() / 1000.0,
        hold_cpu_cores: (hold_cores * 1000.0).round() / 1000.0,
        actors: actors.sandboxes.len(),
        retained_cgroup_bytes_after_close: retained_cgroup.round(),
        retained_rss_bytes_after_close: retained_rss.round(),
        allocator: crate::allocator::NAME.into(),
        tunnel_worker_threads: after.process.worker_threads,
    };
    Ok(ScenarioResult::new(&summary, vec![result], notes))
}

/// Bulk throughput from an actor to a destination through the tunnel, three
/// runs over each family (half the bytes each, so the scenario takes as long
/// as it did over IPv4 alone).
pub(super) async fn egress_tcp(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let mut runs = PerFamily::default();
    let mut notes = vec![
        "one TCP connection from actor-0's sandbox to the sink's discard port, through the tunnel's HTTP/2 CONNECT path".to_string(),
        "three runs per family: the unsuffixed keys to 192.0.2.10:9 over IPv4, the _ipv6 keys to [2001:db8::10]:9 over IPv6 (the sandbox's IPv6 redirect, CONNECT [addr]:port)".into(),
        "when the tunnel is well under its quota, the sink (TLS decryption) or the generator, sharing the machine's other core, is the limit: compare tunnel_cores with sink_cores; mb_per_tunnel_cpu_s is each run's MB per CPU-second of the tunnel's cgroup, and its median the figure to compare".into(),
    ];
    let contender = bench.contender();
    if contender != atunnel_bench::peers::Contender::Atunnel {
        notes[0] = format!(
            "one TCP connection from actor-0's sandbox to the sink's discard port, through {contender} in atunnel's place: a TCP -> TLS relay to the sink's TLS discard service (no HTTP/2 framing; a TLS connection per tunnel)"
        );
    }
    let bytes: u64 = if bench.quick { 128 << 20 } else { 512 << 20 };
    for (family, dest) in FAMILIES {
        if family == "ipv6" && !contender.relays_egress_ipv6() {
            notes.push(format!("{contender} relays IPv4 only: no _ipv6 runs"));
            continue;
        }
        eprintln!("         {family}");
        let measured = egress_tcp_runs(bench, dest, bytes).await?;
        if family == "ipv4" {
            runs.ipv4 = measured;
        } else {
            runs.ipv6 = Some(measured);
        }
    }
    let summary = egress_tcp::Summary {
        runs,
        bytes_per_run: bytes,
    };
    Ok(ScenarioResult::new(&summary, Vec::new(), notes))
}

/// Three bulk uploads to `dest`.
async fn egress_tcp_runs(
    bench: &mut Bench,
    dest: &str,
    bytes: u64,
) -> Result<egress_tcp::Runs, atunnel_process::BoxError> {
    let actors = Actors::of(bench);
    let mut mbps = Vec::new();
    let mut cores = Vec::new();
    let mut sink_cores: Vec<f64> = Vec::new();
    let mut generator_cores: Vec<f64> = Vec::new();
    let sink = bench.sink_pid();
    for run in 0..3 {
        let cg0 = bench.cgroup_sample();
        let sink0 = sink.map_or(0.0, process_cpu_seconds);
        let gen0 = process_cpu_seconds(std::process::id());
        let t0 = Instant::now();
        crate::traffic::upload(actors.dial(0, dest).await?, bytes).await?;
        let secs = t0.elapsed().as_secs_f64();
        let cg1 = bench.cgroup_sample();
        let two = |x: f64| (x * 100.0).round() / 100.0;
        mbps.push((bytes as f64 / 1e6 / secs).round());
        cores.push(two(cg1.cpu_seconds_since(&cg0) / secs));
        sink_cores.push(two((sink.map_or(0.0, process_cpu_seconds) - sink0) / secs));
        generator_cores.push(two((process_cpu_seconds(std::process::id()) - gen0) / secs));
        eprintln!(
            "         run {}: {:.0} MB/s, tunnel {:.2} cores, sink {:.2}, generator {:.2}",
            run + 1,
            bytes as f64 / 1e6 / secs,
            cores[run],
            sink_cores[run],
            generator_cores[run]
        );
    }
    let mut per_cpu_s: Vec<f64> = mbps
        .iter()
        .zip(&cores)
        .map(|(mb, c)| if *c > 0.0 { (mb / c).round() } else { 0.0 })
        .collect();
    let per_cpu_s_runs = per_cpu_s.clone();
    per_cpu_s.sort_by(f64::total_cmp);
    Ok(egress_tcp::Runs {
        mb_per_s: mbps,
        mb_per_tunnel_cpu_s: per_cpu_s_runs,
        mb_per_tunnel_cpu_s_median: Some(per_cpu_s[per_cpu_s.len() / 2]),
        tunnel_cores: cores,
        sink_cores,
        generator_cores,
    })
}

/// One request over a persistent egress connection to the sink's HTTP port.
pub(super) async fn http_exchange(s: &mut TcpStream) -> Result<(), String> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; HTTP_ANSWER_LEN];
    s.read_exact(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Requests over reused egress connections, ladder up to 8,000 req/s and beyond.
pub(super) async fn egress_http(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let actors = Actors::of(bench);
    let conns = 64;
    let (tx, rx) = async_channel_pair(conns);
    for i in 0..conns as u64 {
        tx.send(actors.dial(i, HTTP).await?)
            .await
            .map_err(|_| "pool closed")?;
    }
    let ladder = ladder(
        bench,
        &[1000.0, 4000.0, 8000.0],
        &[1000.0, 2000.0, 4000.0, 8000.0, 12000.0, 16000.0],
    );
    let rungs = climb(bench, Bench::sink_pid, ladder, 4096, move |_| {
        let (tx, rx) = (tx.clone(), rx.clone());
        async move {
            let mut s = rx.recv().await.map_err(|_| "pool closed".to_string())?;
            let r = http_exchange(&mut s).await;
            if r.is_ok() {
                let _ = tx.send(s).await;
            }
            r
        }
    })
    .await;
    let cores_at_8000 = rungs
        .iter()
        .find(|r| r.offered == 8000.0)
        .map(|r| r.tunnel_cpu_cores);
    let summary = egress_http::Summary {
        cores_at_8000_rps: cores_at_8000.map(|c| (c * 1000.0).round() / 1000.0),
        connections: conns,
        sustainable_rps: sustainable(&rungs),
    };
    Ok(ScenarioResult::new(
        &summary,
        rungs,
        vec!["HTTP/1.1 keep-alive requests from the actors' sandboxes to the sink's port 80 over 64 reused tunnels".into()],
    ))
}

/// New egress connections per second: connect, one byte there and back,
/// close; a ladder over each family, each rung half as long as it was over
/// IPv4 alone. The rungs are IPv4's; the summary's `_ipv6` keys are IPv6's.
pub(super) async fn egress_new(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let mut summary = egress_new::Summary::default();
    let mut ipv4_rungs = Vec::new();
    for (family, dest) in [("ipv4", ECHO), ("ipv6", ECHO6)] {
        eprintln!("         {family}");
        let actors = Actors::of(bench);
        let (rates, duration) = ladder(
            bench,
            &[200.0, 500.0, 1000.0],
            &[200.0, 500.0, 1000.0, 2000.0, 3000.0],
        );
        let rungs = climb(
            bench,
            Bench::sink_pid,
            (rates, duration / 2),
            4096,
            move |i| {
                let a = actors.clone();
                async move {
                    let mut s = a.dial(i, dest).await.map_err(|e| e.to_string())?;
                    ping(&mut s).await
                }
            },
        )
        .await;
        // A rung's offered rate is its ladder rate (every rate is positive).
        let figures = egress_new::Family {
            sustainable_rate: sustainable(&rungs),
            cpu_per_conn: rungs
                .iter()
                .filter(|r| r.achieved > 0.0)
                .map(|r| egress_new::CpuPerConn {
                    rate: r.offered,
                    tunnel_cpu_ms_per_conn: (r.tunnel_cpu_cores / r.achieved * 1e3 * 1000.0)
                        .round()
                        / 1000.0,
                })
                .collect(),
        };
        if family == "ipv4" {
            summary.families.ipv4 = figures;
            ipv4_rungs = rungs;
        } else {
            summary.families.ipv6 = Some(figures);
            summary.rungs_ipv6 = rungs;
        }
    }
    Ok(ScenarioResult::new(
        &summary,
        ipv4_rungs,
        vec!["a ladder per family, each rung half the usual length: the rungs (and the unsuffixed keys) are IPv4's, to 192.0.2.10:7; the _ipv6 keys (rungs_ipv6 among them) IPv6's, to [2001:db8::10]:7 through the sandbox's IPv6 redirect".into()],
    ))
}

/// A bounded multi-producer multi-consumer queue of pooled connections.
fn async_channel_pair(cap: usize) -> (PoolTx, PoolRx) {
    let (tx, rx) = tokio::sync::mpsc::channel(cap);
    (PoolTx(tx), PoolRx(Arc::new(tokio::sync::Mutex::new(rx))))
}

#[derive(Clone)]
struct PoolTx(tokio::sync::mpsc::Sender<TcpStream>);
#[derive(Clone)]
struct PoolRx(Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<TcpStream>>>);

impl PoolTx {
    async fn send(&self, s: TcpStream) -> Result<(), TcpStream> {
        self.0.send(s).await.map_err(|e| e.0)
    }
}

impl PoolRx {
    async fn recv(&self) -> Result<TcpStream, ()> {
        self.0.lock().await.recv().await.ok_or(())
    }
}
