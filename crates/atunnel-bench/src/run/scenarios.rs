//! The scenarios. Load is open loop (`load::schedule`): units are due on a
//! fixed schedule whatever earlier ones take, latency counts from the due
//! time. Egress traffic starts inside the sandboxes (sockets made in each
//! actor's runtime namespace, as its program's would be); ingress comes from
//! the load namespace as the router, with the router's certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel::stats::num;
use atunnel_bench::cgroup::CgroupSample;
use atunnel_bench::load::results::{Latency, RungResult, ScenarioResult};
use atunnel_bench::load::schedule::{Rung, RungOutcome, run_rung};
use atunnel_bench::load::verdict::{RungEvidence, Verdict, sustainable_rate, verdict};
use atunnel_sandbox::{NetNs, NsExecutor};
use bytes::Bytes;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::load::Bench;
use super::topology::WORKER_LOAD_SIDE;
use crate::role::{self, Role, process_cpu_seconds};

const ECHO: &str = "192.0.2.10:7";
const DISCARD: &str = "192.0.2.10:9";
const HTTP: &str = "192.0.2.10:80";
const SOURCE: &str = "192.0.2.10:19";
/// The sink's answer to each request on port 80 (64-byte body).
const HTTP_ANSWER_LEN: usize = "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n".len() + 64;

/// Runs scenario `name`. One that restarts atunnel with other flags gets
/// it back with the ones it started with afterwards, even when it failed.
pub async fn run(bench: &mut Bench, name: &str) -> Result<ScenarioResult, atunnel::BoxError> {
    bench.check_tunnel().await?;
    let flags = bench.tunnel_args().to_vec();
    let result = run_scenario(bench, name).await;
    if bench.tunnel_args() == flags {
        return result;
    }
    let restored = bench.restart_tunnel(flags).await;
    let result = result?;
    restored?;
    Ok(result)
}

async fn run_scenario(bench: &mut Bench, name: &str) -> Result<ScenarioResult, atunnel::BoxError> {
    match name {
        "egress-idle" => egress_idle(bench).await,
        "egress-tcp" => egress_tcp(bench).await,
        "egress-http" => egress_http(bench).await,
        "egress-new" => egress_new(bench).await,
        "ingress-https" => ingress_https(bench).await,
        "ingress-connect" => ingress_connect(bench).await,
        "socket-memory" => socket_memory(bench).await,
        "ingress-idle" => super::ingress_idle::ingress_idle(bench).await,
        other => Err(format!("unknown scenario {other}").into()),
    }
}

/// Dials from inside the actors' sandboxes.
#[derive(Clone)]
struct Actors {
    exec: NsExecutor,
    sandboxes: Arc<Vec<NetNs>>,
}

impl Actors {
    fn of(bench: &Bench) -> Self {
        Self {
            exec: bench.topo.exec.clone(),
            sandboxes: Arc::new(bench.sandboxes.clone()),
        }
    }

    async fn dial(&self, actor: u64, dest: &str) -> std::io::Result<TcpStream> {
        let dest: SocketAddr = dest.parse().map_err(std::io::Error::other)?;
        let ns = &self.sandboxes[actor as usize % self.sandboxes.len()];
        let socket = self
            .exec
            .run_in(ns, move || {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                s.set_nonblocking(true)?;
                Ok::<std::net::TcpStream, std::io::Error>(s.into())
            })
            .await
            .map_err(std::io::Error::other)??;
        let s = tokio::net::TcpSocket::from_std_stream(socket)
            .connect(dest)
            .await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

async fn ping(s: &mut TcpStream) -> Result<(), String> {
    crate::traffic::ping(s).await.map_err(|e| e.to_string())
}

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

fn ladder(bench: &Bench, quick: &[f64], full: &[f64]) -> (Vec<f64>, Duration) {
    if bench.quick {
        (quick.to_vec(), Duration::from_secs(3))
    } else {
        (full.to_vec(), Duration::from_secs(10))
    }
}

/// Hold N idle egress connections over every sandbox: heap, cgroup bytes
/// and tasks per connection, CPU while opening them at 200/s and holding them.
async fn egress_idle(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let actors = Actors::of(bench);
    let mut notes = Vec::new();
    let mut n = bench.idle_conns;
    // This process holds one descriptor per connection.
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    let room = (soft as usize).saturating_sub(500);
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
    let window = Window::open(bench, bench.sink_pid());
    let (a, h) = (actors.clone(), held.clone());
    let outcome = run_rung(&rung, move |i| {
        let (a, h) = (a.clone(), h.clone());
        async move {
            let mut s = a.dial(i, ECHO).await.map_err(|e| e.to_string())?;
            ping(&mut s).await?;
            h.lock().expect("held lock").push(s);
            Ok(())
        }
    })
    .await;
    let mut result = window.close(bench, &outcome).await;
    let cg1 = bench.cgroup_sample();
    let opened = held.lock().expect("held lock").len();
    let open_cpu = cg1.cpu_seconds_since(&cg0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cg2 = bench.cgroup_sample();
    let hold_cores = cg2.cpu_seconds_since(&cg1) / 3.0;
    let after = bench.stats(true).await?;
    let cg3 = bench.cgroup_sample();
    let per = |v: f64| if opened > 0 { v / opened as f64 } else { 0.0 };
    let heap =
        per(num(&after, &["process", "heap_bytes"]) - num(&before, &["process", "heap_bytes"]));
    let tasks = per(num(&after, &["process", "tasks"]) - num(&before, &["process", "tasks"]));
    let cgroup = per(cg3.memory_bytes as f64 - cg0.memory_bytes as f64);
    let sock = per(cg3.socket_bytes as f64 - cg0.socket_bytes as f64);
    result.tunnel_heap_bytes = num(&after, &["process", "heap_bytes"]) as u64;
    result.tunnel_cgroup_bytes = cg3.memory_bytes;
    drop(std::mem::take(&mut *held.lock().expect("held lock")));
    // Let the tunnel see every close before the next scenario.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let s = bench.stats(false).await?;
        if num(&s, &["egress", "tunnels_open"]) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What the allocator keeps once they are all gone (fragmentation): the
    // cgroup and RSS above the baseline, after asking it to release memory.
    let closed = bench.stats(true).await?;
    let cg4 = bench.cgroup_sample();
    let retained_cgroup = cg4.memory_bytes as f64 - cg0.memory_bytes as f64;
    let retained_rss =
        num(&closed, &["process", "rss_bytes"]) - num(&before, &["process", "rss_bytes"]);
    Ok(ScenarioResult {
        name: "egress-idle".into(),
        rungs: vec![result],
        summary: json!({
            "conns": opened,
            "heap_bytes_per_conn": heap.round(),
            "cgroup_bytes_per_conn": cgroup.round(),
            "socket_bytes_per_conn": sock.round(),
            "tasks_per_conn": (tasks * 100.0).round() / 100.0,
            "open_cpu_ms_per_conn": (per(open_cpu) * 1e3 * 1000.0).round() / 1000.0,
            "hold_cpu_cores": (hold_cores * 1000.0).round() / 1000.0,
            "actors": actors.sandboxes.len(),
            "retained_cgroup_bytes_after_close": retained_cgroup.round(),
            "retained_rss_bytes_after_close": retained_rss.round(),
            "allocator": crate::allocator::NAME,
            "tunnel_worker_threads": num(&after, &["process", "worker_threads"]),
        }),
        notes,
    })
}

/// Bulk throughput from an actor to a destination through the tunnel, three runs.
async fn egress_tcp(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let actors = Actors::of(bench);
    let bytes: u64 = if bench.quick { 256 << 20 } else { 1 << 30 };
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
        crate::traffic::upload(actors.dial(0, DISCARD).await?, bytes).await?;
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
    Ok(ScenarioResult {
        name: "egress-tcp".into(),
        rungs: Vec::new(),
        summary: json!({
            "mb_per_s": mbps,
            "tunnel_cores": cores,
            "sink_cores": sink_cores,
            "generator_cores": generator_cores,
            "bytes_per_run": bytes,
        }),
        notes: vec![
            "one TCP connection from actor-0's sandbox to the sink's discard port, through the tunnel's HTTP/2 CONNECT path".into(),
            "when the tunnel is well under its quota, the sink (TLS decryption) or the generator, sharing the machine's other core, is the limit: compare tunnel_cores with sink_cores".into(),
        ],
    })
}

/// One request over a persistent egress connection to the sink's HTTP port.
async fn http_exchange(s: &mut TcpStream) -> Result<(), String> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; HTTP_ANSWER_LEN];
    s.read_exact(&mut answer).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Requests over reused egress connections, ladder up to 8,000 req/s and beyond.
async fn egress_http(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let actors = Actors::of(bench);
    let conns = 64;
    let (tx, rx) = async_channel_pair(conns);
    for i in 0..conns as u64 {
        tx.send(actors.dial(i, HTTP).await?)
            .await
            .map_err(|_| "pool closed")?;
    }
    let (rates, duration) = ladder(
        bench,
        &[1000.0, 4000.0, 8000.0],
        &[1000.0, 2000.0, 4000.0, 8000.0, 12000.0, 16000.0],
    );
    let mut rungs = Vec::new();
    for rate in rates {
        let window = Window::open(bench, bench.sink_pid());
        let (tx2, rx2) = (tx.clone(), rx.clone());
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 4096,
            },
            move |_| {
                let (tx, rx) = (tx2.clone(), rx2.clone());
                async move {
                    let mut s = rx.recv().await.map_err(|_| "pool closed".to_string())?;
                    let r = http_exchange(&mut s).await;
                    if r.is_ok() {
                        let _ = tx.send(s).await;
                    }
                    r
                }
            },
        )
        .await;
        rungs.push(window.close(bench, &outcome).await);
    }
    let cores_at_8000 = rungs
        .iter()
        .find(|r| r.offered == 8000.0)
        .map(|r| r.tunnel_cpu_cores);
    Ok(ScenarioResult {
        name: "egress-http".into(),
        summary: json!({
            "cores_at_8000_rps": cores_at_8000.map(|c| (c * 1000.0).round() / 1000.0),
            "connections": conns,
            "sustainable_rps": sustainable(&rungs),
        }),
        rungs,
        notes: vec!["HTTP/1.1 keep-alive requests from the actors' sandboxes to the sink's port 80 over 64 reused tunnels".into()],
    })
}

/// New egress connections per second: connect, one byte there and back, close.
async fn egress_new(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let actors = Actors::of(bench);
    let (rates, duration) = ladder(
        bench,
        &[200.0, 500.0, 1000.0],
        &[200.0, 500.0, 1000.0, 2000.0, 3000.0],
    );
    let mut rungs = Vec::new();
    let mut cpu_per_conn = Vec::new();
    for rate in rates {
        let window = Window::open(bench, bench.sink_pid());
        let a = actors.clone();
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 4096,
            },
            move |i| {
                let a = a.clone();
                async move {
                    let mut s = a.dial(i, ECHO).await.map_err(|e| e.to_string())?;
                    ping(&mut s).await
                }
            },
        )
        .await;
        let r = window.close(bench, &outcome).await;
        if r.achieved > 0.0 {
            cpu_per_conn.push(json!({"rate": rate, "tunnel_cpu_ms_per_conn": (r.tunnel_cpu_cores / r.achieved * 1e3 * 1000.0).round() / 1000.0}));
        }
        rungs.push(r);
    }
    Ok(ScenarioResult {
        name: "egress-new".into(),
        summary: json!({ "sustainable_rate": sustainable(&rungs), "cpu_per_conn": cpu_per_conn }),
        rungs,
        notes: Vec::new(),
    })
}

fn sustainable(rungs: &[RungResult]) -> Option<f64> {
    let list: Vec<(f64, f64, Verdict)> = rungs
        .iter()
        .map(|r| (r.offered, r.achieved, r.verdict))
        .collect();
    sustainable_rate(&list)
}

/// A router-side HTTP/2 connection to the tunnel's ingress.
async fn router_h2(
    bench: &Bench,
    port: u16,
) -> Result<hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>, atunnel::BoxError>
{
    let tls = router_tls(bench, port).await?;
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    tokio::spawn(conn);
    Ok(send)
}

/// The protocol the router offers (ALPN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Alpn {
    H2,
    Http1,
}

/// The router's TLS client settings (its certificate, trusting the pod CA),
/// one per ALPN offer, built once for the run. Session resumption is off:
/// every connection makes a full handshake, as a router's first one does.
pub(super) struct RouterTls {
    h2: Arc<rustls::ClientConfig>,
    http1: Arc<rustls::ClientConfig>,
}

impl RouterTls {
    pub(super) fn new(pki: &crate::pki::PkiFiles) -> Result<Self, atunnel::BoxError> {
        let roots = atunnel::config::load_roots(&pki.pod_ca())?;
        let certs = atunnel::config::load_certs(&pki.router_cert())?;
        let key = atunnel::config::load_key(&pki.router_key())?;
        let config = |alpn: &[u8]| -> Result<_, atunnel::BoxError> {
            let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key.clone_key())?;
            cfg.alpn_protocols = vec![alpn.to_vec()];
            cfg.resumption = rustls::client::Resumption::disabled();
            Ok(Arc::new(cfg))
        };
        Ok(Self {
            h2: config(b"h2")?,
            http1: config(b"http/1.1")?,
        })
    }

    fn config(&self, alpn: Alpn) -> Arc<rustls::ClientConfig> {
        match alpn {
            Alpn::H2 => self.h2.clone(),
            Alpn::Http1 => self.http1.clone(),
        }
    }
}

/// TLS to the tunnel's ingress `port` from the load namespace, as the router
/// (its certificate), offering `alpn`.
pub(super) async fn router_tls_with(
    bench: &Bench,
    port: u16,
    alpn: Alpn,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, atunnel::BoxError> {
    let tcp = bench
        .topo
        .connect_in(&bench.topo.load, SocketAddr::from((WORKER_LOAD_SIDE, port)))
        .await?;
    let name = rustls::pki_types::ServerName::try_from(crate::pki::WORKER_NAME)?;
    Ok(
        tokio_rustls::TlsConnector::from(bench.router_tls.config(alpn))
            .connect(name, tcp)
            .await?,
    )
}

async fn router_tls(
    bench: &Bench,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, atunnel::BoxError> {
    router_tls_with(bench, port, Alpn::H2).await
}

/// Requests through the router-facing HTTPS listener to the ingress actors.
async fn ingress_https(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let mut senders = Vec::new();
    for _ in 0..4 {
        senders.push(router_h2(bench, 443).await?);
    }
    let senders = Arc::new(senders);
    let actors = bench.sandboxes.len().max(1) as u64;
    let (rates, duration) = ladder(
        bench,
        &[1000.0, 2000.0, 4000.0],
        &[1000.0, 2000.0, 4000.0, 8000.0, 12000.0],
    );
    let mut rungs = Vec::new();
    let mut new_conns = Vec::new();
    for rate in rates {
        let before = num(
            &bench.stats(false).await?,
            &["ingress", "new_upstream_connections"],
        );
        let window = Window::open(bench, bench.actors_pid());
        let s = senders.clone();
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 4096,
            },
            move |i| {
                let mut send = s[i as usize % s.len()].clone();
                async move {
                    let req = http::Request::builder()
                        .uri("https://worker.bench/")
                        .header("ate-target-actor", format!("bench/actor-{}", i % actors))
                        .body(http_body_util::Empty::<Bytes>::new())
                        .map_err(|e| e.to_string())?;
                    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
                    if !resp.status().is_success() {
                        return Err(format!("status {}", resp.status()));
                    }
                    http_body_util::BodyExt::collect(resp.into_body())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
            },
        )
        .await;
        let r = window.close(bench, &outcome).await;
        let after = num(
            &bench.stats(false).await?,
            &["ingress", "new_upstream_connections"],
        );
        new_conns.push((after - before, outcome.completed));
        rungs.push(r);
    }
    // After warm-up: every rung but the first.
    let (conns, reqs) = new_conns
        .iter()
        .skip(1)
        .fold((0.0, 0u64), |(c, r), (dc, dr)| (c + dc, r + dr));
    let per_1000 = if reqs > 0 {
        conns * 1000.0 / reqs as f64
    } else {
        0.0
    };
    Ok(ScenarioResult {
        name: "ingress-https".into(),
        summary: json!({
            "sustainable_rps": sustainable(&rungs),
            "new_upstream_conns_per_1000": (per_1000 * 100.0).round() / 100.0,
        }),
        rungs,
        notes: vec!["4 router HTTP/2 connections with the router's certificate, GET / to actor-(i mod actors), HTTP/1.1 to the actor".into()],
    })
}

/// CONNECT tunnels through the router-facing CONNECT listener: open an h2
/// CONNECT stream to an actor's port 80, one request and answer, close.
async fn ingress_connect(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let mut senders = Vec::new();
    for _ in 0..4 {
        let tls = router_tls(bench, 8443).await?;
        let (send, conn) = h2::client::handshake(tls).await?;
        tokio::spawn(conn);
        senders.push(send);
    }
    let senders = Arc::new(senders);
    let actors = bench.sandboxes.len().max(1) as u64;
    let (rates, duration) = ladder(
        bench,
        &[500.0, 1000.0, 2000.0],
        &[500.0, 1000.0, 2000.0, 4000.0, 8000.0],
    );
    let mut rungs = Vec::new();
    for rate in rates {
        let window = Window::open(bench, bench.actors_pid());
        let s = senders.clone();
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 2048,
            },
            move |i| {
                let send = s[i as usize % s.len()].clone();
                async move { connect_exchange(send, i % actors).await }
            },
        )
        .await;
        rungs.push(window.close(bench, &outcome).await);
    }
    Ok(ScenarioResult {
        name: "ingress-connect".into(),
        summary: json!({ "sustainable_rps": sustainable(&rungs) }),
        rungs,
        notes: vec!["each unit: a new HTTP/2 CONNECT stream to actor:80, one HTTP/1.1 request and answer inside it, close".into()],
    })
}

async fn connect_exchange(send: h2::client::SendRequest<Bytes>, actor: u64) -> Result<(), String> {
    let mut send = send.ready().await.map_err(|e| e.to_string())?;
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("actor:80")
        .header("ate-target-actor", format!("bench/actor-{actor}"))
        .body(())
        .map_err(|e| e.to_string())?;
    let (resp, mut stream) = send.send_request(req, false).map_err(|e| e.to_string())?;
    let resp = resp.await.map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("CONNECT status {}", resp.status()));
    }
    let mut body = resp.into_body();
    stream
        .send_data(
            Bytes::from_static(b"GET / HTTP/1.1\r\nHost: actor\r\nConnection: close\r\n\r\n"),
            true,
        )
        .map_err(|e| e.to_string())?;
    let mut got = 0usize;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        got += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if got == 0 {
        return Err("empty answer through the tunnel".into());
    }
    Ok(())
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

/// Waits until atunnel's socket memory stops growing (the stalled
/// connections' queues are full), then returns it.
async fn settled_socket_memory(
    pid: u32,
) -> Result<atunnel_bench::sockmem::SocketMemory, atunnel::BoxError> {
    let mut last = atunnel_bench::sockmem::of_process(pid)?;
    let mut steady = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = atunnel_bench::sockmem::of_process(pid)?;
        let grew = now.total().abs_diff(last.total()) > last.total() / 100 + 4096;
        steady = if grew { 0 } else { steady + 1 };
        last = now;
        if steady >= 4 {
            break;
        }
    }
    Ok(last)
}

/// An HTTP/1.1 CONNECT tunnel over TLS from the router, through the
/// CONNECT listener, to `actor:port`, once atunnel answered 200; nothing
/// after the answer's head is read.
pub(super) async fn connect_tunnel(
    bench: &Bench,
    actor: u64,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, atunnel::BoxError> {
    let mut tls = router_tls_with(bench, 8443, Alpn::Http1).await?;
    tls.write_all(
        format!("CONNECT actor:{port} HTTP/1.1\r\nate-target-actor: bench/actor-{actor}\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let head = atunnel::http1::read_head(&mut tls).await?;
    if atunnel::http1::parse_response(&head)?.status != 200 {
        return Err(format!("CONNECT refused: {}", String::from_utf8_lossy(&head)).into());
    }
    Ok(tls)
}

/// A second gateway, in forward mode, in the sink's namespace, and behind
/// it a destination that accepts connections and never reads them: the far
/// end of socket-memory's third case (the bench sink answers by itself and
/// dials nothing). The destination's sockets belong to this process and are
/// not measured; only the gateway's are.
struct ForwardGateway {
    role: Role,
    /// What the destination accepted (held unread until `release`).
    held: Arc<std::sync::Mutex<Vec<TcpStream>>>,
    /// How many connections the destination accepted so far.
    accepted: tokio::sync::watch::Receiver<u64>,
    accept: tokio::task::JoinHandle<()>,
}

/// Where the forwarding gateway listens.
const FORWARD_GATEWAY_PORT: u16 = 4443;
/// The destination that never reads, in the sink's namespace.
const STALLED_DESTINATION: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(super::topology::SINK_ADDR), 9999);

impl ForwardGateway {
    /// Starts both, the gateway with TCP_NOTSENT_LOWAT at `lowat`.
    async fn start(bench: &Bench, lowat: i64) -> Result<Self, atunnel::BoxError> {
        let topo = &bench.topo;
        let listener = topo
            .exec
            .run_in(&topo.sink, || {
                let l = std::net::TcpListener::bind(STALLED_DESTINATION)?;
                l.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(l)
            })
            .await??;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = held.clone();
        let (count, accepted) = tokio::sync::watch::channel(0u64);
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                if let Ok(mut held) = h.lock() {
                    held.push(s);
                }
                count.send_modify(|n| *n += 1);
            }
        });
        let p = &bench.pki;
        let role = role::start_in(
            &topo.exec,
            &topo.sink,
            &[
                "sink".into(),
                format!(
                    "--listen={}",
                    SocketAddr::from((super::topology::SINK_ADDR, FORWARD_GATEWAY_PORT))
                ),
                format!("--cert={}", p.gateway_cert().display()),
                format!("--key={}", p.gateway_key().display()),
                format!("--actor-ca={}", p.actor_ca_cert().display()),
                "--mode=forward".into(),
                // The sink's link (198.18.0.0/30): the destination only.
                "--allow=198.18.0.0/30".into(),
                format!("--tcp-notsent-lowat={lowat}"),
            ],
            None,
        )
        .await;
        match role {
            Ok(role) => Ok(Self {
                role,
                held,
                accepted,
                accept,
            }),
            Err(e) => {
                accept.abort();
                Err(e)
            }
        }
    }

    fn pid(&self) -> Result<u32, atunnel::BoxError> {
        Ok(self.role.pid().ok_or("the forwarding gateway is gone")?)
    }

    /// Closes what the destination accepted.
    fn release(&self) {
        if let Ok(mut held) = self.held.lock() {
            held.clear();
        }
    }

    async fn stop(self) {
        self.accept.abort();
        self.release();
        self.role.stop().await;
    }
}

/// Writes until the connection fails: an actor that keeps sending.
async fn keep_writing(mut s: TcpStream) {
    static CHUNK: [u8; 64 * 1024] = [b'w'; 64 * 1024];
    while s.write_all(&CHUNK).await.is_ok() {}
}

/// Opens each actor's pooled gateway connection before the baseline is
/// taken (a connection shared by all the actor's tunnels, not a cost of the
/// stalled ones), with one tunnel per actor to the destination, awaited
/// until the destination accepted it (so the path is known to work), then
/// closed.
async fn warm_gateway_connections(
    actors: &Actors,
    gateway: &ForwardGateway,
) -> Result<(), atunnel::BoxError> {
    let mut accepted = gateway.accepted.clone();
    let target = *accepted.borrow() + actors.sandboxes.len() as u64;
    let dest = STALLED_DESTINATION.to_string();
    let mut warm = Vec::new();
    for i in 0..actors.sandboxes.len() as u64 {
        warm.push(actors.dial(i, &dest).await?);
    }
    tokio::time::timeout(Duration::from_secs(30), accepted.wait_for(|n| *n >= target))
        .await
        .map_err(
            |_| "no tunnel reached the destination through the forwarding gateway within 30 s",
        )?
        .map_err(|_| "the destination stopped accepting")?;
    drop(warm);
    gateway.release();
    Ok(())
}

/// One case's measurement per stalled connection.
struct Stalled {
    /// Kernel socket memory on the measured proxy, KiB.
    kib: f64,
    /// Its parts: receive queues, send queues, reserved (forward alloc), KiB.
    parts: [f64; 3],
    /// atunnel's heap, KiB.
    heap_kib: f64,
}

/// One measurement: socket memory of the proxy in the middle (atunnel, or
/// the forwarding gateway when `gateway` is given) and atunnel's heap per
/// stalled connection.
async fn stalled_case(
    bench: &mut Bench,
    case: &str,
    conns: usize,
    gateway: Option<&ForwardGateway>,
) -> Result<Stalled, atunnel::BoxError> {
    let tunnel = bench.tunnel_pid().ok_or("atunnel is not running")?;
    let pid = match gateway {
        Some(g) => g.pid()?,
        None => tunnel,
    };
    let actors = Actors::of(bench);
    let heap0 = num(&bench.stats(true).await?, &["process", "heap_bytes"]);
    let base = atunnel_bench::sockmem::of_process(pid)?;
    let mut egress = Vec::new();
    let mut ingress = Vec::new();
    let mut writers = Vec::new();
    let destination = STALLED_DESTINATION.to_string();
    for i in 0..conns as u64 {
        match case {
            "actor-stops-reading" => egress.push(actors.dial(i, SOURCE).await?),
            "destination-stops-reading" => {
                let s = actors.dial(i, &destination).await?;
                writers.push(tokio::spawn(keep_writing(s)));
            }
            // The actor's flood port: its answer never ends.
            _ => {
                ingress.push(connect_tunnel(bench, i % actors.sandboxes.len() as u64, 9000).await?)
            }
        }
    }
    let settled = settled_socket_memory(pid).await?;
    let heap1 = num(&bench.stats(false).await?, &["process", "heap_bytes"]);
    drop(egress);
    drop(ingress);
    for w in &writers {
        w.abort();
    }
    for w in writers {
        let _ = w.await;
    }
    if let Some(g) = gateway {
        g.release();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let s = bench.stats(false).await?;
        if num(&s, &["egress", "tunnels_open"]) == 0.0
            && settled_socket_memory(pid).await?.total() <= base.total() + 65536
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let per = |now: u64, then: u64| now.saturating_sub(then) as f64 / conns as f64 / 1024.0;
    let kib = per(settled.total(), base.total());
    let heap_kib = (heap1 - heap0).max(0.0) / conns as f64 / 1024.0;
    let parts = [
        per(settled.receive_queued, base.receive_queued),
        per(settled.send_queued, base.send_queued),
        per(settled.forward_alloc, base.forward_alloc),
    ];
    eprintln!(
        "         {case}: {kib:.1} KiB socket memory on {} (receive {:.1}, send {:.1}, reserved {:.1}), {heap_kib:.1} KiB atunnel heap per stalled connection",
        if gateway.is_some() {
            "the gateway"
        } else {
            "atunnel"
        },
        parts[0],
        parts[1],
        parts[2],
    );
    Ok(Stalled {
        kib,
        parts,
        heap_kib,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The median of each figure over repeats.
fn median_stalled(runs: Vec<Stalled>) -> Stalled {
    let pick = |f: &dyn Fn(&Stalled) -> f64| median(runs.iter().map(f).collect());
    Stalled {
        kib: pick(&|s| s.kib),
        parts: [
            pick(&|s| s.parts[0]),
            pick(&|s| s.parts[1]),
            pick(&|s| s.parts[2]),
        ],
        heap_kib: pick(&|s| s.heap_kib),
    }
}

/// The cases: name, the proxy whose sockets are measured, and what the
/// figure includes.
const STALL_CASES: [(&str, &str, &str); 3] = [
    (
        "actor-stops-reading",
        "atunnel",
        "actor-stops-reading: atunnel's sockets: the sandbox-side socket to the actor that stopped reading the sink's source port (send queue) and the HTTP/2 connections to the gateway that carry it (receive queues)",
    ),
    (
        "router-stops-reading",
        "atunnel",
        "router-stops-reading: atunnel's sockets: the TLS socket to the router that stopped reading an HTTP/1.1 CONNECT tunnel (send queue) and the socket to the actor's flood port feeding it (receive queue)",
    ),
    (
        "destination-stops-reading",
        "gateway",
        "destination-stops-reading: the gateway's sockets, not atunnel's: a second gateway process in forward mode in the sink namespace (the setting on it and on atunnel), the actor writing without pause to a destination behind it that accepts and never reads; its sockets to the destination (send queues) and its TLS connections from atunnel (receive queues); the destination's own receive queues are not counted; the heap columns are atunnel's",
    ),
];

/// Kernel socket memory per stalled connection with TCP_NOTSENT_LOWAT off
/// and at 16 KiB, and bulk throughput with each (`run` restores atunnel's
/// flags afterwards).
async fn socket_memory(bench: &mut Bench) -> Result<ScenarioResult, atunnel::BoxError> {
    let conns = 100;
    let reps = if bench.quick { 1 } else { 3 };
    // Per case: (off, lowat).
    let mut table: Vec<[Option<Stalled>; 2]> = STALL_CASES.iter().map(|_| [None, None]).collect();
    let mut throughput = serde_json::Map::new();
    for (column, (setting, lowat)) in [("off", -1i64), ("lowat", 16384)].into_iter().enumerate() {
        let lowat_arg = format!("--tcp-notsent-lowat={lowat}");
        eprintln!("         TCP_NOTSENT_LOWAT {setting}: restarting atunnel");
        bench.restart_tunnel(vec![lowat_arg.clone()]).await?;
        for (row, (case, _, _)) in STALL_CASES.iter().enumerate().take(2) {
            let mut runs = Vec::new();
            for _ in 0..reps {
                runs.push(stalled_case(bench, case, conns, None).await?);
            }
            table[row][column] = Some(median_stalled(runs));
        }
        // Bulk throughput with this setting (one run).
        let actors = Actors::of(bench);
        let bytes: u64 = if bench.quick { 128 << 20 } else { 512 << 20 };
        let t0 = Instant::now();
        crate::traffic::upload(actors.dial(0, DISCARD).await?, bytes).await?;
        throughput.insert(
            setting.into(),
            json!((bytes as f64 / 1e6 / t0.elapsed().as_secs_f64()).round()),
        );
        // The third case: atunnel through a forwarding gateway with the
        // same setting.
        eprintln!(
            "         TCP_NOTSENT_LOWAT {setting}: forwarding gateway, atunnel pointed at it"
        );
        let gateway = ForwardGateway::start(bench, lowat).await?;
        let measured = async {
            bench
                .restart_tunnel(vec![
                    lowat_arg.clone(),
                    format!(
                        "--gateway={}",
                        SocketAddr::from((super::topology::SINK_ADDR, FORWARD_GATEWAY_PORT))
                    ),
                ])
                .await?;
            warm_gateway_connections(&Actors::of(bench), &gateway).await?;
            let mut runs = Vec::new();
            for _ in 0..reps {
                runs.push(stalled_case(bench, STALL_CASES[2].0, conns, Some(&gateway)).await?);
            }
            Ok::<_, atunnel::BoxError>(median_stalled(runs))
        }
        .await;
        gateway.stop().await;
        table[2][column] = Some(measured?);
    }
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let figure = |s: &Option<Stalled>, f: &dyn Fn(&Stalled) -> f64| s.as_ref().map(|s| round(f(s)));
    let parts = |s: &Option<Stalled>| {
        s.as_ref().map(|s| {
            json!({"receive": round(s.parts[0]), "send": round(s.parts[1]), "reserved": round(s.parts[2])})
        })
    };
    let cases_json: Vec<_> = STALL_CASES
        .iter()
        .zip(&table)
        .map(|((case, proxy, _), [off, on])| {
            json!({
                "case": case,
                "off_kib": figure(off, &|s| s.kib),
                "lowat_kib": figure(on, &|s| s.kib),
                "heap_off_kib": figure(off, &|s| s.heap_kib),
                "heap_lowat_kib": figure(on, &|s| s.heap_kib),
                "measured": proxy,
                "parts_off_kib": parts(off),
                "parts_lowat_kib": parts(on),
            })
        })
        .collect();
    let mut notes = vec![format!(
        "median of {reps} at {conns} stalled connections per case; socket memory is SO_MEMINFO receive + send queues + forward allocation summed over all of the measured proxy's sockets (duplicated with pidfd_getfd), minus its idle baseline, per connection; parts_*_kib splits it"
    )];
    notes.extend(STALL_CASES.iter().map(|(_, _, what)| what.to_string()));
    notes.push(netem_note(bench).await);
    Ok(ScenarioResult {
        name: "socket-memory".into(),
        rungs: Vec::new(),
        summary: json!({ "cases": cases_json, "conns": conns, "repeats": reps, "throughput_mb_per_s": throughput }),
        notes,
    })
}

/// Why socket memory at 5 ms of added round trip was not measured, in the
/// system's own words: the bench would use netem, and says what trying it
/// in the load namespace gave.
async fn netem_note(bench: &Bench) -> String {
    let ns = bench.topo.load.name().to_string();
    let tc = run_quoted(
        "tc",
        &[
            "-n", &ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "5ms",
        ],
    )
    .await;
    match tc {
        Ok(_) => {
            let _ = run_quoted("tc", &["-n", &ns, "qdisc", "del", "dev", "lo", "root"]).await;
            "5 ms added round trip: did not run: netem is available on this machine, but the bench does not run that case yet".into()
        }
        Err(tc_error) => {
            let modprobe = match run_quoted("modprobe", &["sch_netem"]).await {
                Ok(_) => "succeeded, but tc still refused netem".to_string(),
                Err(e) => format!("says \"{e}\""),
            };
            format!(
                "5 ms added round trip: did not run: this kernel has no netem (sch_netem): `tc qdisc add dev lo root netem delay 5ms` in the load namespace says \"{tc_error}\" and `modprobe sch_netem` {modprobe}; the delay is not emulated another way (no TUN delay line), so socket memory at 5 ms RTT is not measured"
            )
        }
    }
}

/// Runs a command; its failure as the text it printed (or why it could not run).
async fn run_quoted(program: &str, args: &[&str]) -> Result<(), String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(if text.is_empty() {
        format!("{program} failed ({})", out.status)
    } else {
        text
    })
}
