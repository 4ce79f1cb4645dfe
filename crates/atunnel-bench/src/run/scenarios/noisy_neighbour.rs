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

mod report;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atunnel_bench::load::confidence::{Bound, Conclusion, Counts, Figure, ratio};
use atunnel_bench::load::results::{Latency, ScenarioResult};
use atunnel_bench::load::schedule::{Rung, RungOutcome, run_rung};
use atunnel_bench::scenario::Scenario;
use atunnel_sandbox::NsExecutor;
use atunnel_support::stats_client::num;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::{Value, json};
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
use crate::topology::{SINK_ADDR, Topology};
use crate::traffic::{DISCARD, ECHO, HTTP, HTTP_ANSWER_LEN, SOURCE};

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

/// How big a run is: the quick one is short.
struct Sizes {
    /// Pairs of windows per pattern (a baseline, then one under the
    /// pattern), for each figure's confidence interval.
    pairs: usize,
    /// Each victim rung (egress HTTP, then ingress HTTPS) of a window.
    window: Duration,
    tcp_bytes: u64,
    tcp_runs: usize,
    /// Unread downloads and stalled uploads held.
    stalled: usize,
    /// Stalled ingress CONNECT tunnels held.
    ingress: usize,
    /// Connection-flood workers, each opening one connection after another.
    flood_workers: usize,
    /// Stalled response bodies held on the victim's router connections.
    stalled_bodies: usize,
}

impl Sizes {
    fn of(quick: bool) -> Self {
        if quick {
            Sizes {
                pairs: 4,
                window: Duration::from_millis(1000),
                tcp_bytes: 64 << 20,
                tcp_runs: 1,
                stalled: 1000,
                ingress: 200,
                flood_workers: 16,
                stalled_bodies: 800,
            }
        } else {
            Sizes {
                pairs: 6,
                window: Duration::from_secs(5),
                tcp_bytes: 256 << 20,
                tcp_runs: 1,
                stalled: 3000,
                ingress: 1000,
                flood_workers: 32,
                stalled_bodies: 1000,
            }
        }
    }
}

/// What the hostile actor does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    UnreadDownloads,
    StalledUploads,
    ConnectionFlood,
    DnsFlood,
    StalledIngressConnect,
    StalledResponseBodies,
    ActorsAtBudget,
}

const PATTERNS: [Pattern; 7] = [
    Pattern::UnreadDownloads,
    Pattern::StalledUploads,
    Pattern::ConnectionFlood,
    Pattern::DnsFlood,
    Pattern::StalledIngressConnect,
    Pattern::StalledResponseBodies,
    Pattern::ActorsAtBudget,
];

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::UnreadDownloads => "unread-downloads",
            Pattern::StalledUploads => "stalled-uploads",
            Pattern::ConnectionFlood => "connection-flood",
            Pattern::DnsFlood => "dns-flood",
            Pattern::StalledIngressConnect => "stalled-ingress-connect",
            Pattern::StalledResponseBodies => "stalled-response-bodies",
            Pattern::ActorsAtBudget => "actors-at-budget",
        }
    }

    /// The hostile actors of the pattern, of the `actors` the worker hosts.
    fn hostiles(self, actors: u64) -> Vec<u64> {
        match self {
            Pattern::ActorsAtBudget => (HOSTILE..actors.min(HOSTILE + AT_BUDGET_ACTORS)).collect(),
            _ => vec![HOSTILE],
        }
    }

    /// How many connections or requests the pattern holds when established:
    /// `None` for those that hold no fixed number.
    fn target(self, s: &Sizes, plan: &Plan) -> Option<usize> {
        match self {
            Pattern::UnreadDownloads | Pattern::StalledUploads => Some(s.stalled),
            Pattern::StalledIngressConnect => Some(s.ingress),
            // No more than the victim's connections have streams for.
            Pattern::StalledResponseBodies => {
                Some(s.stalled_bodies.min(ROUTER_CONNS * ACTOR_ROUTER_STREAMS))
            }
            Pattern::ActorsAtBudget => {
                Some(plan.hostiles.len() * (plan.egress_each + INGRESS_BUDGET))
            }
            Pattern::ConnectionFlood | Pattern::DnsFlood => None,
        }
    }

    fn what(self, s: &Sizes, hostiles: &[u64]) -> String {
        match self {
            Pattern::UnreadDownloads => format!(
                "unread-downloads: {} egress connections to the sink's source port (19, sends without end), never read; each one a bound resets is opened again",
                s.stalled
            ),
            Pattern::StalledUploads => format!(
                "stalled-uploads: {} egress connections to the sink's stall port (13, accepts and never reads, so the tunnel's HTTP/2 window is never returned), each written to until blocked; each one a bound resets is opened again; stopping closes them normally (FIN behind unsent bytes, which atunnel cannot see until its stalled-write bound)",
                s.stalled
            ),
            Pattern::ConnectionFlood => format!(
                "connection-flood: {} workers each opening egress connections to the sink's echo port one after another as fast as they go (one byte there and back to tell held from reset), holding every one atunnel admits, past the actor's tunnel budget",
                s.flood_workers
            ),
            Pattern::DnsFlood => format!(
                "dns-flood: UDP queries from the hostile actor's sandbox to its DNS relay (169.254.17.1:53) at {DNS_RATE:.0}/s; the resolver never answers, so each admitted query holds the relay's work for its 5 s timeout"
            ),
            Pattern::StalledIngressConnect => format!(
                "stalled-ingress-connect: {} HTTP/1.1 CONNECT tunnels over TLS from the router to the hostile actor's flood port ({FLOOD_PORT}, sends without end), never read after the answer's head; each one a bound resets is opened again",
                s.ingress
            ),
            Pattern::StalledResponseBodies => format!(
                "stalled-response-bodies: {} HTTPS GETs from the router to the hostile actor's /stall (a 200 head, then not a byte of body, nor an end), spread over the victim's own {ROUTER_CONNS} router HTTP/2 connections, as a router shares its connections among actors (atunnel allows {ROUTER_STREAMS} streams on each, {ACTOR_ROUTER_STREAMS} of them to one actor, so the hostile holds at most {}); each one that ends is opened again",
                s.stalled_bodies,
                ROUTER_CONNS * ACTOR_ROUTER_STREAMS
            ),
            Pattern::ActorsAtBudget => format!(
                "actors-at-budget: actors {} each try to hold {EGRESS_BUDGET} idle egress tunnels to the sink's echo port (one byte there and back, then nothing) and {INGRESS_BUDGET} HTTPS requests to their /stall over {} router connections of their own, today's default budgets; an open atunnel refuses is tried again {} s later; the generator holds at most what its descriptor limit leaves ({FD_RESERVE} kept back; fd_limited says when that cut the tunnels); verdict: whether the victim was refused (new tunnels, requests) and whether the overload guard left normal",
                hostiles
                    .iter()
                    .map(|a| format!("actor-{a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                INGRESS_BUDGET.div_ceil(ACTOR_ROUTER_STREAMS),
                AT_BUDGET_RETRY.as_secs()
            ),
        }
    }
}

/// What a pattern is run with: its hostile actors, and the egress tunnels
/// each tries to hold (fewer than its budget when the generator's
/// descriptors would not do).
#[derive(Clone, Debug, PartialEq)]
struct Plan {
    hostiles: Vec<u64>,
    egress_each: usize,
    fd_limited: bool,
}

impl Plan {
    /// `pattern`'s plan with `actors` hosted and `fd_room` descriptors the
    /// generator can still open.
    fn of(pattern: Pattern, actors: u64, fd_room: usize) -> Self {
        let hostiles = pattern.hostiles(actors);
        let (egress_each, fd_limited) = match pattern {
            Pattern::ActorsAtBudget => {
                let room = fd_room.saturating_sub(FD_RESERVE) / hostiles.len().max(1);
                (EGRESS_BUDGET.min(room), room < EGRESS_BUDGET)
            }
            _ => (0, false),
        };
        Self {
            hostiles,
            egress_each,
            fd_limited,
        }
    }
}

/// Descriptors this process can still open: its soft `RLIMIT_NOFILE` less
/// those open now.
fn fd_room() -> usize {
    let limit = atunnel_host::nofile_soft_limit().unwrap_or(1024);
    let open = atunnel_host::open_descriptors().unwrap_or(0);
    usize::try_from(limit.saturating_sub(open)).unwrap_or(usize::MAX)
}

/// The router's TLS and the namespaces, owned, for tasks of their own.
#[derive(Clone)]
struct Router {
    tls: Arc<RouterTls>,
    topo: Arc<Topology>,
}

impl Router {
    fn of(bench: &Bench) -> Result<Self, BoxError> {
        let t = &bench.topo;
        Ok(Self {
            tls: Arc::new(RouterTls::new(&bench.pki)?),
            topo: Arc::new(Topology {
                exec: t.exec.clone(),
                worker: t.worker.clone(),
                sink: t.sink.clone(),
                load: t.load.clone(),
            }),
        })
    }

    /// An HTTP/2 connection to the HTTPS listener, driven by a task that
    /// ends with the connection.
    async fn h2(&self) -> Result<H2Sender, BoxError> {
        let tls = self.tls.connect(&self.topo, 443, Alpn::H2).await?;
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await?;
        tokio::spawn(conn);
        Ok(send)
    }
}

/// The victim's connections, kept for the whole scenario (a broken one is
/// made again by the next unit that needs it).
#[derive(Clone)]
struct Victim {
    actors: Actors,
    router: Router,
    http: Arc<Vec<tokio::sync::Mutex<Option<TcpStream>>>>,
    https: Arc<Vec<tokio::sync::Mutex<Option<H2Sender>>>>,
}

impl Victim {
    async fn open(actors: Actors, router: Router) -> Result<Self, BoxError> {
        let mut http = Vec::with_capacity(HTTP_CONNS);
        for _ in 0..HTTP_CONNS {
            let mut s = actors.dial(VICTIM, HTTP).await?;
            http_exchange(&mut s).await?;
            http.push(tokio::sync::Mutex::new(Some(s)));
        }
        let mut https = Vec::with_capacity(ROUTER_CONNS);
        for _ in 0..ROUTER_CONNS {
            https.push(tokio::sync::Mutex::new(Some(router.h2().await?)));
        }
        let victim = Self {
            actors,
            router,
            http: Arc::new(http),
            https: Arc::new(https),
        };
        for i in 0..ROUTER_CONNS as u64 {
            victim.https_unit(i).await?;
        }
        Ok(victim)
    }

    /// One request over the victim's kept-alive egress connection `i`.
    async fn http_unit(&self, i: u64) -> Result<(), String> {
        let mut slot = self.http[i as usize % self.http.len()].lock().await;
        if slot.is_none() {
            *slot = Some(
                self.actors
                    .dial(VICTIM, HTTP)
                    .await
                    .map_err(|e| format!("dialing the sink's HTTP port: {e}"))?,
            );
        }
        let s = slot.as_mut().expect("filled above");
        let result = http_exchange(s).await.map_err(|e| e.to_string());
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// One HTTPS request from the router to the victim, over its router
    /// connection `i`.
    async fn https_unit(&self, i: u64) -> Result<(), String> {
        let send = shared_sender(&self.https, i, &self.router).await?;
        let result = super::ingress::routed_request(send, VICTIM).await;
        if result.is_err() {
            *self.https[i as usize % self.https.len()].lock().await = None;
        }
        result
    }

    /// The victim's new egress tunnels: [`PROBE_TUNNELS`] opened one after
    /// another, each one byte there and back; how many failed, and the
    /// first error.
    async fn new_tunnels(&self) -> (u64, Option<String>) {
        const TRY_FOR: Duration = Duration::from_secs(2);
        let mut refused = 0;
        let mut first = None;
        for _ in 0..PROBE_TUNNELS {
            let attempt = async {
                let mut s = self.actors.dial(VICTIM, ECHO).await?;
                crate::traffic::ping(&mut s).await
            };
            let err = match tokio::time::timeout(TRY_FOR, attempt).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no echo within 2 s".to_string(),
            };
            refused += 1;
            first.get_or_insert(err);
        }
        (refused, first)
    }
}

/// Router connection `i` of `slots` (modulo their number), made afresh if
/// it is missing or closed.
async fn shared_sender(
    slots: &[tokio::sync::Mutex<Option<H2Sender>>],
    i: u64,
    router: &Router,
) -> Result<H2Sender, String> {
    let mut guard = slots[i as usize % slots.len()].lock().await;
    if guard.as_ref().is_none_or(|s| s.is_closed()) {
        *guard = Some(router.h2().await.map_err(|e| e.to_string())?);
    }
    Ok(guard.clone().expect("filled above"))
}

/// A request from the router to `actor`'s /stall over `send`, once its
/// answer's head came (within [`HEAD_LIMIT`]); its body is what holds it.
async fn stalled_request(
    mut send: H2Sender,
    actor: u64,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let req = http::Request::builder()
        .uri("https://worker.bench/stall")
        .header("ate-target-actor", format!("bench/actor-{actor}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(HEAD_LIMIT, send.send_request(req))
        .await
        .map_err(|_| format!("no head within {} s", HEAD_LIMIT.as_secs()))?
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    Ok(resp)
}

/// Returns once `resp`'s body ends or fails (atunnel or a bound reset it).
async fn body_ended(resp: hyper::Response<hyper::body::Incoming>) {
    let mut body = resp.into_body();
    while let Some(Ok(_)) = body.frame().await {}
}

/// One request over a kept-alive egress connection to the sink's HTTP port.
async fn http_exchange(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
        .await?;
    let mut answer = [0u8; HTTP_ANSWER_LEN];
    s.read_exact(&mut answer).await?;
    Ok(())
}

/// One victim rung as the scheduler counted it.
#[derive(Clone, Debug, Default)]
struct Figures {
    latency: Latency,
    achieved: f64,
    errors: u64,
    shed: u64,
    dispatch_lag_p99_us: u64,
    first_error: Option<String>,
}

impl Figures {
    fn of(out: &RungOutcome) -> Self {
        Self {
            latency: Latency::from_histogram(&out.latency),
            achieved: out.achieved,
            errors: out.errors,
            shed: out.shed,
            dispatch_lag_p99_us: out.dispatch_lag_p99_us(),
            first_error: out.first_error.clone(),
        }
    }
}

/// The victim's figures over one measurement, and the CPU around it.
#[derive(Clone, Debug, Default)]
struct Window {
    http: Figures,
    https: Figures,
    /// MB/s of each upload; 0 for one that failed.
    tcp_mb_s: Vec<f64>,
    tcp_error: Option<String>,
    tunnel_cores: f64,
    throttled: bool,
    generator_cores: f64,
    /// The gateway sink: the far end of the victim's egress.
    sink_cores: f64,
    /// The actors' process: the far end of the victim's ingress.
    actors_cores: f64,
    /// The machine's busy CPU not used by any of the bench's processes
    /// (other work on a shared machine).
    others_cores: f64,
}

impl Window {
    /// Every core the machine had busy: the bench's processes and others'.
    fn machine_cores(&self) -> f64 {
        self.tunnel_cores
            + self.generator_cores
            + self.sink_cores
            + self.actors_cores
            + self.others_cores
    }

    /// Whether the machine had no core to spare (90 % of its cores busy):
    /// then the victim's clients and far ends waited for CPU, and what the
    /// victim saw is not atunnel's alone.
    fn machine_saturated(&self) -> bool {
        let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
        self.machine_cores() >= 0.9 * cores
    }

    fn tcp_median(&self) -> f64 {
        let mut v = self.tcp_mb_s.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    fn errors(&self) -> u64 {
        self.http.errors
            + self.https.errors
            + self.tcp_mb_s.iter().filter(|&&x| x == 0.0).count() as u64
    }

    /// The first error seen, for the notes.
    fn first_error(&self) -> Option<String> {
        let tagged = |what: &str, e: &Option<String>| e.as_ref().map(|e| format!("{what}: {e}"));
        tagged("egress http", &self.http.first_error)
            .or_else(|| tagged("ingress https", &self.https.first_error))
            .or_else(|| tagged("egress tcp", &self.tcp_error))
    }
}

/// Measures the victim: egress HTTP at [`RATE`], open loop, then
/// `tcp_runs` uploads to the sink's discard port, then ingress HTTPS at
/// [`RATE`], open loop; latency from each request's due time.
async fn measure_victim(bench: &Bench, victim: &Victim, sizes: &Sizes) -> Window {
    let cpu0 = Cpu::sample(bench);
    let t0 = Instant::now();
    let rung = Rung {
        rate: RATE,
        duration: sizes.window,
        max_in_flight: 1024,
    };
    let v = victim.clone();
    let http = run_rung(&rung, move |i| {
        let v = v.clone();
        async move { v.http_unit(i).await }
    })
    .await;
    let mut tcp_mb_s = Vec::with_capacity(sizes.tcp_runs);
    let mut tcp_error = None;
    for _ in 0..sizes.tcp_runs {
        let t = Instant::now();
        let upload = async {
            let s = victim.actors.dial(VICTIM, DISCARD).await?;
            crate::traffic::upload(s, sizes.tcp_bytes).await
        };
        match upload.await {
            Ok(bytes) => tcp_mb_s.push((bytes as f64 / 1e6 / t.elapsed().as_secs_f64()).round()),
            Err(e) => {
                tcp_mb_s.push(0.0);
                tcp_error.get_or_insert(e.to_string());
            }
        }
    }
    let v = victim.clone();
    let https = run_rung(&rung, move |i| {
        let v = v.clone();
        async move { v.https_unit(i).await }
    })
    .await;
    let cpu1 = Cpu::sample(bench);
    let secs = t0.elapsed().as_secs_f64().max(1e-3);
    let cores = |f: fn(&Cpu) -> f64| (f(&cpu1) - f(&cpu0)).max(0.0) / secs;
    let tunnel = cpu1.tunnel.cpu_seconds_since(&cpu0.tunnel) / secs;
    let ours = tunnel + cores(|c| c.generator) + cores(|c| c.sink) + cores(|c| c.actors);
    Window {
        http: Figures::of(&http),
        https: Figures::of(&https),
        tcp_mb_s,
        tcp_error,
        tunnel_cores: tunnel,
        throttled: cpu1.tunnel.throttled_since(&cpu0.tunnel),
        generator_cores: cores(|c| c.generator),
        sink_cores: cores(|c| c.sink),
        actors_cores: cores(|c| c.actors),
        others_cores: (cores(|c| c.machine) - ours).max(0.0),
    }
}

/// CPU seconds used so far by each participant, and by the whole machine.
struct Cpu {
    tunnel: atunnel_host::CgroupSample,
    generator: f64,
    sink: f64,
    actors: f64,
    machine: f64,
}

impl Cpu {
    fn sample(bench: &Bench) -> Self {
        Self {
            tunnel: bench.cgroup_sample(),
            generator: process_cpu_seconds(std::process::id()),
            sink: bench.sink_pid().map_or(0.0, process_cpu_seconds),
            actors: bench.actors_pid().map_or(0.0, process_cpu_seconds),
            machine: machine_busy_seconds(),
        }
    }
}

/// CPU seconds the machine has spent busy (not idle or waiting for I/O),
/// from the first line of /proc/stat; 0 if it cannot be read.
fn machine_busy_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    // cpu user nice system idle iowait irq softirq steal ...
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let busy: f64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    busy / hz
}

/// What the hostile actor's tasks counted.
#[derive(Default)]
struct Tally {
    /// Connections opened (or, for the flood, held).
    opened: AtomicU64,
    /// Held connections that ended (reset by a bound, mostly) and were
    /// opened again.
    ended: AtomicU64,
    /// Opens that failed; for the flood, connections atunnel reset.
    failed: AtomicU64,
    /// Connections held now.
    holding: AtomicU64,
    /// Flood attempts, or DNS queries sent.
    sent: AtomicU64,
}

/// A hostile pattern running: its tasks, what they hold, and how to stop
/// them. Stopping drops every socket they hold (closed as a program's
/// exit closes them: FIN, or RST where unread bytes wait).
struct Hostile {
    cancel: CancellationToken,
    tasks: TaskTracker,
    tally: Arc<Tally>,
}

impl Hostile {
    async fn start(
        pattern: Pattern,
        sizes: &Sizes,
        plan: &Plan,
        stage: &Stage,
        exec: &NsExecutor,
    ) -> Result<Self, BoxError> {
        let (actors, router) = (&stage.actors, &stage.router);
        let h = Hostile {
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            tally: Arc::new(Tally::default()),
        };
        let gate = Arc::new(Semaphore::new(OPENING_AT_ONCE));
        match pattern {
            Pattern::UnreadDownloads => {
                for _ in 0..sizes.stalled {
                    let a = actors.clone();
                    h.tasks.spawn(persistent(
                        h.cancel.clone(),
                        gate.clone(),
                        h.tally.clone(),
                        RETRY,
                        move || {
                            let a = a.clone();
                            async move {
                                let s = a.dial(HOSTILE, SOURCE).await.map_err(|e| e.to_string())?;
                                // Open once the first bytes came through.
                                tokio::time::timeout(Duration::from_secs(5), s.readable())
                                    .await
                                    .map_err(|_| "no byte within 5 s".to_string())?
                                    .map_err(|e| e.to_string())?;
                                Ok(s)
                            }
                        },
                        |s: TcpStream| async move { closed_unread(&s).await },
                    ));
                }
            }
            Pattern::StalledUploads => {
                for _ in 0..sizes.stalled {
                    let a = actors.clone();
                    h.tasks.spawn(persistent(
                        h.cancel.clone(),
                        gate.clone(),
                        h.tally.clone(),
                        RETRY,
                        move || {
                            let a = a.clone();
                            async move { a.dial(HOSTILE, STALL).await.map_err(|e| e.to_string()) }
                        },
                        |mut s: TcpStream| async move {
                            static CHUNK: [u8; 64 * 1024] = [b'u'; 64 * 1024];
                            while s.write_all(&CHUNK).await.is_ok() {}
                        },
                    ));
                }
            }
            Pattern::StalledIngressConnect => {
                for _ in 0..sizes.ingress {
                    let r = router.clone();
                    h.tasks.spawn(persistent(
                        h.cancel.clone(),
                        gate.clone(),
                        h.tally.clone(),
                        RETRY,
                        move || {
                            let r = r.clone();
                            async move {
                                r.tls
                                    .connect_tunnel(&r.topo, HOSTILE, FLOOD_PORT)
                                    .await
                                    .map_err(|e| e.to_string())
                            }
                        },
                        |tls: tokio_rustls::client::TlsStream<TcpStream>| async move {
                            closed_unread(tls.get_ref().0).await
                        },
                    ));
                }
            }
            Pattern::StalledResponseBodies => {
                for k in 0..sizes.stalled_bodies as u64 {
                    let v = stage.victim.clone();
                    h.tasks.spawn(persistent(
                        h.cancel.clone(),
                        gate.clone(),
                        h.tally.clone(),
                        RETRY,
                        move || {
                            let v = v.clone();
                            async move {
                                let send = shared_sender(&v.https, k, &v.router).await?;
                                stalled_request(send, HOSTILE).await
                            }
                        },
                        body_ended,
                    ));
                }
            }
            Pattern::ActorsAtBudget => {
                for &actor in &plan.hostiles {
                    // A gate per actor: each stays inside its own opening
                    // budget, as one actor's programs would.
                    let gate = Arc::new(Semaphore::new(OPENING_AT_ONCE));
                    for _ in 0..plan.egress_each {
                        let a = actors.clone();
                        h.tasks.spawn(persistent(
                            h.cancel.clone(),
                            gate.clone(),
                            h.tally.clone(),
                            AT_BUDGET_RETRY,
                            move || {
                                let a = a.clone();
                                async move {
                                    let mut s =
                                        a.dial(actor, ECHO).await.map_err(|e| e.to_string())?;
                                    tokio::time::timeout(HEAD_LIMIT, crate::traffic::ping(&mut s))
                                        .await
                                        .map_err(|_| "no echo within 5 s".to_string())?
                                        .map_err(|e| e.to_string())?;
                                    Ok(s)
                                }
                            },
                            |s: TcpStream| async move { closed_unread(&s).await },
                        ));
                    }
                    let conns: Arc<Vec<tokio::sync::Mutex<Option<H2Sender>>>> = Arc::new(
                        (0..INGRESS_BUDGET.div_ceil(ACTOR_ROUTER_STREAMS))
                            .map(|_| tokio::sync::Mutex::new(None))
                            .collect(),
                    );
                    for k in 0..INGRESS_BUDGET as u64 {
                        let (conns, r) = (conns.clone(), router.clone());
                        h.tasks.spawn(persistent(
                            h.cancel.clone(),
                            gate.clone(),
                            h.tally.clone(),
                            AT_BUDGET_RETRY,
                            move || {
                                let (conns, r) = (conns.clone(), r.clone());
                                async move {
                                    let send = shared_sender(&conns, k, &r).await?;
                                    stalled_request(send, actor).await
                                }
                            },
                            body_ended,
                        ));
                    }
                }
            }
            Pattern::ConnectionFlood => {
                let held = Arc::new(std::sync::Mutex::new(Vec::new()));
                for _ in 0..sizes.flood_workers {
                    h.tasks.spawn(flood_worker(
                        h.cancel.clone(),
                        actors.clone(),
                        h.tally.clone(),
                        held.clone(),
                    ));
                }
            }
            Pattern::DnsFlood => {
                let ns = actors.sandboxes[HOSTILE as usize % actors.sandboxes.len()].clone();
                let socket = exec
                    .run_in(&ns, || {
                        let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                        s.set_nonblocking(true)?;
                        Ok::<_, std::io::Error>(s)
                    })
                    .await??;
                let socket = tokio::net::UdpSocket::from_std(socket)?;
                socket.connect(DNS_RELAY).await?;
                h.tasks
                    .spawn(dns_flood(h.cancel.clone(), socket, h.tally.clone()));
            }
        }
        Ok(h)
    }

    /// Stops the tasks and waits for them (their sockets closed).
    async fn stop(self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Holds one connection from `open` with `hold` until it ends, then opens
/// another, until cancelled: a hostile actor that keeps what a bound
/// resets. At most [`OPENING_AT_ONCE`] opens at once across those sharing
/// `gate`; a failed open is tried again `retry` later.
async fn persistent<C, O, OFut, H, HFut>(
    cancel: CancellationToken,
    gate: Arc<Semaphore>,
    tally: Arc<Tally>,
    retry: Duration,
    open: O,
    hold: H,
) where
    O: Fn() -> OFut,
    OFut: Future<Output = Result<C, String>>,
    H: Fn(C) -> HFut,
    HFut: Future<Output = ()>,
{
    loop {
        let conn = {
            let _permit = tokio::select! {
                _ = cancel.cancelled() => return,
                p = gate.acquire() => p,
            };
            let conn = tokio::select! {
                _ = cancel.cancelled() => return,
                c = open() => c,
            };
            tokio::time::sleep(OPEN_SPACING).await;
            conn
        };
        let Ok(conn) = conn else {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(retry) => continue,
            }
        };
        tally.opened.fetch_add(1, Ordering::Relaxed);
        tally.holding.fetch_add(1, Ordering::Relaxed);
        let ended = tokio::select! {
            _ = cancel.cancelled() => false,
            () = hold(conn) => true,
        };
        tally.holding.fetch_sub(1, Ordering::Relaxed);
        if !ended {
            return;
        }
        tally.ended.fetch_add(1, Ordering::Relaxed);
    }
}

/// Returns once the peer has closed or reset `tcp`, without reading a byte:
/// readiness is cleared by hand until it says the read side is closed.
async fn closed_unread(tcp: &TcpStream) {
    use tokio::io::Interest;
    loop {
        match tcp.ready(Interest::READABLE | Interest::ERROR).await {
            Ok(r) if !r.is_read_closed() && !r.is_error() => {
                let _ = tcp.try_io(Interest::READABLE, || {
                    Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                });
            }
            _ => return,
        }
    }
}

/// Opens egress connections one after another as fast as they go; keeps
/// each that atunnel admits (one byte there and back), counts each it
/// resets.
async fn flood_worker(
    cancel: CancellationToken,
    actors: Actors,
    tally: Arc<Tally>,
    held: Arc<std::sync::Mutex<Vec<TcpStream>>>,
) {
    const TRY_FOR: Duration = Duration::from_secs(2);
    loop {
        let attempt = async {
            let mut s = tokio::time::timeout(TRY_FOR, actors.dial(HOSTILE, ECHO))
                .await
                .map_err(|_| ())?
                .map_err(|_| ())?;
            tokio::time::timeout(TRY_FOR, crate::traffic::ping(&mut s))
                .await
                .map_err(|_| ())?
                .map_err(|_| ())?;
            Ok::<_, ()>(s)
        };
        let attempt = tokio::select! {
            _ = cancel.cancelled() => break,
            a = attempt => a,
        };
        tally.sent.fetch_add(1, Ordering::Relaxed);
        match attempt {
            Ok(s) => {
                tally.opened.fetch_add(1, Ordering::Relaxed);
                tally.holding.fetch_add(1, Ordering::Relaxed);
                held.lock().expect("held lock").push(s);
            }
            Err(()) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // The last worker out closes what the flood holds.
    let mut held = held.lock().expect("held lock");
    tally
        .holding
        .fetch_sub(held.len() as u64, Ordering::Relaxed);
    held.clear();
}

/// Sends DNS queries on `socket` at [`DNS_RATE`] until cancelled; a late
/// wake-up sends what is due at once, but never more than 100 ms' worth.
async fn dns_flood(cancel: CancellationToken, socket: tokio::net::UdpSocket, tally: Arc<Tally>) {
    // A header (ID, RD, one question) and `noisy.bench. IN A`.
    let mut query = *b"\0\0\x01\0\0\x01\0\0\0\0\0\0\x05noisy\x05bench\0\0\x01\0\x01";
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let due = (start.elapsed().as_secs_f64() * DNS_RATE) as u64;
        sent = sent.max(due.saturating_sub((DNS_RATE / 10.0) as u64));
        while sent < due {
            query[..2].copy_from_slice(&(sent as u16).to_be_bytes());
            // A full socket buffer drops the query, as the kernel would.
            let _ = socket.try_send(&query);
            sent += 1;
            tally.sent.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
}

/// The numeric figures of the entries of `list` whose `actor` is one of
/// `names`, summed field by field (an object; empty when none is there).
fn summed(list: &Value, names: &[String]) -> Value {
    let mut sum = serde_json::Map::new();
    for entry in list.as_array().into_iter().flatten() {
        if !names.iter().any(|n| entry["actor"] == n.as_str()) {
            continue;
        }
        for (key, v) in entry.as_object().into_iter().flatten() {
            if let Some(x) = v.as_f64() {
                let total = sum.get(key).and_then(Value::as_f64).unwrap_or(0.0) + x;
                sum.insert(key.clone(), json!(total));
            }
        }
    }
    Value::Object(sum)
}

/// The egress figures of `actors` in atunnel's /stats, summed.
fn egress_of(stats: &Value, actors: &[u64]) -> Value {
    let names: Vec<String> = actors.iter().map(|a| format!("uid-{a}")).collect();
    summed(&stats["egress_actors"], &names)
}

/// The ingress figures of `actors` in atunnel's /stats, summed.
fn ingress_of(stats: &Value, actors: &[u64]) -> Value {
    let names: Vec<String> = actors.iter().map(|a| format!("bench/actor-{a}")).collect();
    summed(&stats["ingress"]["actors"], &names)
}

/// What a pattern made atunnel refuse or end, from two /stats readings:
/// the hostile actors' refusals and the process's.
fn refusals(before: &Value, after: &Value, hostiles: &[u64]) -> Value {
    let d = |path: &[&str]| (num(after, path) - num(before, path)).max(0.0);
    let (eb, ea) = (egress_of(before, hostiles), egress_of(after, hostiles));
    let de = |key: &str| (num(&ea, &[key]) - num(&eb, &[key])).max(0.0);
    let (ib, ia) = (ingress_of(before, hostiles), ingress_of(after, hostiles));
    json!({
        "refused_tunnels": de("refused_tunnels_total"),
        "refused_opening": de("refused_opening_total"),
        "refused_overload": de("refused_overload_total"),
        "shed": de("shed_total"),
        "buffer_waits": de("buffer_waits_total"),
        "refusal_pauses": de("refusal_pauses_total"),
        "stalled_write_ends": d(&["egress", "stalled_write_ends_total"]),
        "half_closed_ends": d(&["egress", "half_closed_ends_total"]),
        "overload_refused": d(&["overload", "refused_total"]),
        "overload_shed": d(&["overload", "shed_total"]),
        "ingress_refused_in_flight": (num(&ia, &["refused_in_flight_total"]) - num(&ib, &["refused_in_flight_total"])).max(0.0),
        "ingress_refused_overload": d(&["ingress", "refused_overload_total"]),
    })
}

/// Whether recovery waits for memory too: between a pattern's pairs only
/// what the hostile actors held (tunnels, descriptors, tasks, buffers) has
/// to be gone for the next baseline; after the last, memory as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    Checked,
    NotChecked,
}

/// What atunnel holds, as recovery compares it.
#[derive(Clone, Copy, Debug, Default)]
struct Resources {
    heap: f64,
    fds: f64,
    tasks: f64,
    pool_in_use: f64,
    hostile_tunnels: f64,
    hostile_opening: f64,
    cgroup: f64,
    /// atunnel's established connections to the gateway (a diagnostic:
    /// the descriptors they hold are counted in `fds`).
    gateway_conns: f64,
    /// atunnel's sockets in the other actors' sandboxes (the victim's
    /// tunnels, pooled ingress connections to them), each with its task:
    /// left out of `fds` and `tasks` when recovery compares them, since
    /// what the victim's own load made atunnel pool is the victim's.
    neighbours: f64,
}

impl Resources {
    fn read(
        stats: &Value,
        cgroup_bytes: u64,
        tunnel_pid: Option<u32>,
        census: &Census,
        hostiles: &[u64],
    ) -> Self {
        let h = egress_of(stats, hostiles);
        Self {
            heap: num(stats, &["process", "heap_bytes"]),
            fds: num(stats, &["process", "open_fds"]),
            tasks: num(stats, &["process", "tasks"]),
            pool_in_use: num(stats, &["pool", "in_use"]),
            hostile_tunnels: num(&h, &["tunnels"]),
            hostile_opening: num(&h, &["opening"]),
            cgroup: cgroup_bytes as f64,
            gateway_conns: tunnel_pid.map_or(0.0, gateway_connections),
            neighbours: census.neighbours(hostiles) as f64,
        }
    }

    /// What is not back within the tolerances of `base`, named; heap and
    /// cgroup memory only if `memory` says so.
    fn above(&self, base: &Resources, memory: Memory) -> Vec<String> {
        let mut out = Vec::new();
        let mib = |x: f64| x / 1048576.0;
        if memory == Memory::Checked && self.heap > base.heap + HEAP_SLACK {
            out.push(format!("heap +{:.1} MiB", mib(self.heap - base.heap)));
        }
        if memory == Memory::Checked && self.cgroup > base.cgroup + CGROUP_SLACK {
            out.push(format!(
                "cgroup memory +{:.1} MiB",
                mib(self.cgroup - base.cgroup)
            ));
        }
        let own = |x: f64, r: &Resources| x - r.neighbours;
        if own(self.fds, self) > own(base.fds, base) + COUNT_SLACK {
            out.push(format!(
                "descriptors +{} (gateway connections +{})",
                own(self.fds, self) - own(base.fds, base),
                self.gateway_conns - base.gateway_conns
            ));
        }
        if own(self.tasks, self) > own(base.tasks, base) + COUNT_SLACK {
            out.push(format!(
                "tasks +{}",
                own(self.tasks, self) - own(base.tasks, base)
            ));
        }
        if self.pool_in_use > base.pool_in_use {
            out.push(format!(
                "pooled buffers out +{}",
                self.pool_in_use - base.pool_in_use
            ));
        }
        if self.hostile_tunnels > 0.0 || self.hostile_opening > 0.0 {
            out.push(format!(
                "hostile tunnels {} (opening {})",
                self.hostile_tunnels, self.hostile_opening
            ));
        }
        out
    }

    fn json(&self) -> Value {
        json!({
            "heap_bytes": self.heap,
            "cgroup_bytes": self.cgroup,
            "open_fds": self.fds,
            "tasks": self.tasks,
            "pool_in_use": self.pool_in_use,
            "gateway_connections": self.gateway_conns,
            "neighbour_sockets": self.neighbours,
        })
    }
}

/// How many TCP connections process `pid` has established to the gateway
/// (the sink's :443), from its namespace's /proc/<pid>/net/tcp.
fn gateway_connections(pid: u32) -> f64 {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return 0.0;
    };
    // Addresses are hex, the IPv4 address as a little-endian word.
    let gateway = format!("{:08X}:{:04X}", u32::from_le_bytes(SINK_ADDR.octets()), 443);
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&gateway.as_str()) && f.get(3) == Some(&"01")
        })
        .count() as f64
}

/// atunnel's socket descriptors by where the kernel lists them: in the
/// worker namespace's TCP/UDP/Unix tables, in each actor's sandbox gateway
/// namespace's TCP/UDP tables, or in none (a TCP socket closed or reset
/// whose descriptor is still held: the kernel unlists it).
#[derive(Clone, Debug, Default)]
struct Census {
    sockets: usize,
    worker: usize,
    /// Per actor, in the order of `Actors::sandboxes`.
    sandboxes: Vec<usize>,
    unlisted: usize,
}

impl Census {
    async fn take(bench: &Bench, actors: &Actors) -> Self {
        use std::collections::HashMap;
        let Some(pid) = bench.tunnel_pid() else {
            return Self::default();
        };
        // Where each listed socket inode is: `None` the worker namespace,
        // `Some(i)` actor i's sandbox. Column 10 of /proc/net/{tcp,udp} is
        // the inode, column 7 of /proc/net/unix.
        fn place(tables: &[String], at: Option<usize>, out: &mut HashMap<String, Option<usize>>) {
            for t in tables {
                for line in t.lines().skip(1) {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let inode = if f.len() >= 10 && f[0].ends_with(':') {
                        f[9]
                    } else {
                        f.get(6).copied().unwrap_or("")
                    };
                    out.insert(inode.to_string(), at);
                }
            }
        }
        let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
        let mut listed = HashMap::new();
        place(
            &["tcp", "tcp6", "udp", "udp6", "unix"].map(|t| read(format!("/proc/{pid}/net/{t}"))),
            None,
            &mut listed,
        );
        for (i, runtime) in actors.sandboxes.iter().enumerate() {
            let name = atunnel_sandbox::sandbox::gateway_ns_name(runtime.name());
            let Ok(ns) = atunnel_sandbox::NetNs::open(&name) else {
                continue;
            };
            let tables = bench
                .topo
                .exec
                .run_in(&ns, || {
                    ["tcp", "tcp6", "udp", "udp6"].map(|t| {
                        std::fs::read_to_string(format!("/proc/thread-self/net/{t}"))
                            .unwrap_or_default()
                    })
                })
                .await;
            if let Ok(tables) = tables {
                place(&tables, Some(i), &mut listed);
            }
        }
        let mut census = Self {
            sandboxes: vec![0; actors.sandboxes.len()],
            ..Self::default()
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return census;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            else {
                continue;
            };
            census.sockets += 1;
            match listed.get(inode) {
                Some(None) => census.worker += 1,
                Some(Some(i)) => census.sandboxes[*i] += 1,
                None => census.unlisted += 1,
            }
        }
        census
    }

    /// Sockets in the sandboxes of actors other than the hostile ones: the
    /// victim's tunnels and atunnel's pooled ingress connections to those
    /// actors.
    fn neighbours(&self, hostiles: &[u64]) -> usize {
        self.sandboxes
            .iter()
            .enumerate()
            .filter(|(i, _)| !hostiles.contains(&(*i as u64)))
            .map(|(_, n)| n)
            .sum()
    }

    fn json(&self) -> Value {
        let sandboxes: serde_json::Map<String, Value> = self
            .sandboxes
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("actor-{i}"), json!(n)))
            .collect();
        json!({
            "sockets": self.sockets,
            "worker_namespace": self.worker,
            "sandboxes": sandboxes,
            "unlisted": self.unlisted,
        })
    }
}

/// The highest readings while a pattern ran: the cgroup's memory, and
/// from /stats the overload guard's state and atunnel's descriptors.
#[derive(Clone, Debug, PartialEq)]
struct Peaks {
    memory: u64,
    overload: String,
    open_fds: f64,
}

/// The overload guard's states in order of severity.
fn overload_rank(state: &str) -> u8 {
    match state {
        "hard" => 2,
        "soft" => 1,
        _ => 0,
    }
}

impl Peaks {
    fn new(memory: u64) -> Self {
        Self {
            memory,
            overload: "normal".into(),
            open_fds: 0.0,
        }
    }

    /// The highest of `self` and `other`.
    fn merged(mut self, other: Peaks) -> Self {
        self.memory = self.memory.max(other.memory);
        if overload_rank(&other.overload) > overload_rank(&self.overload) {
            self.overload = other.overload;
        }
        self.open_fds = self.open_fds.max(other.open_fds);
        self
    }

    fn note(&mut self, memory: u64, stats: Option<&Value>) {
        self.memory = self.memory.max(memory);
        if let Some(stats) = stats {
            if let Some(state) = stats["overload"]["state"].as_str()
                && overload_rank(state) > overload_rank(&self.overload)
            {
                self.overload = state.to_string();
            }
            self.open_fds = self.open_fds.max(num(stats, &["process", "open_fds"]));
        }
    }
}

/// Runs `work` while sampling the cgroup's memory every 100 ms and
/// atunnel's /stats every 500 ms: its output and the highest readings.
async fn with_peaks<T>(bench: &Bench, work: impl Future<Output = T>) -> (T, Peaks) {
    let peaks = std::sync::Mutex::new(Peaks::new(bench.cgroup_sample().memory_bytes));
    let out = {
        let watch = async {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for n in 0u64.. {
                tick.tick().await;
                let memory = bench.cgroup_sample().memory_bytes;
                let stats = if n % 5 == 0 {
                    bench.stats(false).await.ok()
                } else {
                    None
                };
                peaks
                    .lock()
                    .expect("peaks lock")
                    .note(memory, stats.as_ref());
            }
        };
        tokio::pin!(work, watch);
        loop {
            tokio::select! {
                out = &mut work => break out,
                () = &mut watch => {}
            }
        }
    };
    let mut peaks = peaks.into_inner().expect("peaks lock");
    peaks.note(bench.cgroup_sample().memory_bytes, None);
    (out, peaks)
}

/// Waits until `pattern` is established: for those that hold connections,
/// 95 % of them held (and 1 s more for their queues to fill), or, for the
/// actors at their budgets, as many as atunnel admits (no more held for
/// [`PLATEAU`]); for the flood, atunnel refusing the hostile actor; for
/// DNS, 1 s of it. Returns how long it took and whether it was reached.
/// The others stop waiting too once what they hold has not grown for
/// [`PLATEAU`], unreached: what atunnel lets them hold is then held
/// (unread downloads stop at the gateway connection's window, far short
/// of their target), and waiting the whole [`ESTABLISH_LIMIT`] for more,
/// once per two pairs, would make the scenario twice as long.
async fn establish(
    bench: &Bench,
    pattern: Pattern,
    target: Option<usize>,
    tally: &Tally,
    before: &Value,
    hostiles: &[u64],
) -> (f64, bool) {
    let t0 = Instant::now();
    let (mut most, mut grew) = (0, t0);
    let plateau = |most: u64, grew: Instant| most > 0 && grew.elapsed() >= PLATEAU;
    let reached = loop {
        let holding = tally.holding.load(Ordering::Relaxed);
        if holding > most {
            (most, grew) = (holding, Instant::now());
        }
        let reached = match (pattern, target) {
            (Pattern::ActorsAtBudget, Some(n)) => {
                holding >= (n as f64 * 0.95) as u64 || plateau(most, grew)
            }
            (_, Some(n)) => holding >= (n as f64 * 0.95) as u64,
            (Pattern::ConnectionFlood, None) => match bench.stats(false).await {
                Ok(now) => {
                    let r = refusals(before, &now, hostiles);
                    num(&r, &["refused_tunnels"])
                        + num(&r, &["refused_opening"])
                        + num(&r, &["refused_overload"])
                        > 0.0
                }
                Err(_) => false,
            },
            (_, None) => t0.elapsed() >= Duration::from_secs(1),
        };
        if reached {
            break true;
        }
        let holds = target.is_some() || pattern == Pattern::ConnectionFlood;
        if (holds && plateau(most, grew)) || t0.elapsed() >= ESTABLISH_LIMIT {
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    if target.is_some() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (secs, reached)
}

/// Polls atunnel until what it holds is back within the tolerances of
/// `base` (its memory too if `memory` says so): seconds it took, or `None` after [`RECOVERY_LIMIT`] with what
/// was still above.
async fn recover(
    bench: &Bench,
    actors: &Actors,
    base: &Resources,
    hostiles: &[u64],
    memory: Memory,
) -> (Option<f64>, Vec<String>, Resources) {
    let t0 = Instant::now();
    let mut above = vec!["no /stats answer".to_string()];
    let mut last = Resources::default();
    while t0.elapsed() < RECOVERY_LIMIT {
        if let Ok(stats) = bench.stats(true).await {
            let census = Census::take(bench, actors).await;
            last = Resources::read(
                &stats,
                bench.cgroup_sample().memory_bytes,
                bench.tunnel_pid(),
                &census,
                hostiles,
            );
            above = last.above(base, memory);
            if above.is_empty() {
                return (Some(t0.elapsed().as_secs_f64()), above, last);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    (None, above, last)
}

/// The memory pressure at which the overload guard refuses new work, in
/// bytes: its soft threshold of the limit it watches, or 0.85 of the
/// cgroup's limit if /stats does not say.
fn soft_threshold(stats: &Value, cgroup_limit: u64) -> f64 {
    let soft = stats["overload"]["soft"].as_f64().unwrap_or(0.85);
    let limit = stats["overload"]["memory"]["limit"]
        .as_f64()
        .unwrap_or(cgroup_limit as f64);
    soft * limit
}

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

/// What a pattern's verdict is made of.
struct Checks {
    /// The victim's figures over the pattern's pairs of windows.
    http: Figure,
    https: Figure,
    tcp: Figure,
    victim_errors: u64,
    /// Of the victim's [`PROBE_TUNNELS`] new egress tunnels in each pair.
    new_tunnels_refused: u64,
    oom_kills: u64,
    alive: bool,
    peak_memory: f64,
    soft: f64,
    /// The overload guard was seen past normal, or changed state.
    guard_left_normal: bool,
    recovered: bool,
}

/// The pattern's verdict from `c`, with what failed and what was
/// inconclusive: a figure whose interval is wholly outside its bound, or
/// that no pair measured at all (the victim got nothing through), fails
/// it, as does any of the checks that are counts (errors, refusals, OOM
/// kills, memory, the guard, recovery); a figure whose interval straddles
/// its bound leaves it inconclusive unless something failed.
fn verdict(c: &Checks) -> (Conclusion, Vec<&'static str>, Vec<&'static str>) {
    let mut failed = Vec::new();
    let mut unsure = Vec::new();
    for (figure, name) in [
        (&c.http, "victim egress-http p99"),
        (&c.https, "victim ingress-https p99"),
        (&c.tcp, "victim egress-tcp throughput"),
    ] {
        if figure.estimate.is_none() || figure.conclusion == Conclusion::Fail {
            failed.push(name);
        } else if figure.conclusion == Conclusion::Inconclusive {
            unsure.push(name);
        }
    }
    if c.victim_errors > 0 {
        failed.push("victim errors");
    }
    if c.new_tunnels_refused > 0 {
        failed.push("victim new tunnels refused");
    }
    if c.oom_kills > 0 || !c.alive {
        failed.push("atunnel died");
    }
    if c.peak_memory >= c.soft {
        failed.push("memory over the soft threshold");
    }
    if c.guard_left_normal {
        failed.push("overload guard left normal");
    }
    if !c.recovered {
        failed.push("not back to baseline");
    }
    let conclusion = if !failed.is_empty() {
        Conclusion::Fail
    } else if !unsure.is_empty() {
        Conclusion::Inconclusive
    } else {
        Conclusion::Pass
    };
    (conclusion, failed, unsure)
}

/// The middle value of `v` (the upper one of an even count), 0 if empty.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The victim's three figures of one window, as a pair compares them.
fn window_figures(w: &Window) -> Value {
    json!({
        "http_p99_us": w.http.latency.p99,
        "http_p50_us": w.http.latency.p50,
        "https_p99_us": w.https.latency.p99,
        "tcp_mb_s": w.tcp_median(),
        "errors": w.errors(),
        "machine_saturated": w.machine_saturated(),
    })
}

/// The victim's three figures over `pairs` of (baseline, under) windows:
/// each pair's ratio against its bound.
fn figures(pairs: &[(Window, Window)]) -> (Figure, Figure, Figure) {
    let of = |f: fn(&Window) -> f64, bound| {
        Figure::of(
            pairs
                .iter()
                .map(|(base, under)| ratio(f(under), f(base)))
                .collect(),
            bound,
        )
    };
    (
        of(|w| w.http.latency.p99 as f64, Bound::AtMost(P99_RATIO_MAX)),
        of(|w| w.https.latency.p99 as f64, Bound::AtMost(P99_RATIO_MAX)),
        of(Window::tcp_median, Bound::AtLeast(TCP_RATIO_MIN)),
    )
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
) -> Result<Value, BoxError> {
    bench.check_tunnel().await?;
    let plan = Plan::of(pattern, bench.actor_count(), fd_room());
    let hostiles = &plan.hostiles[..];
    let target = pattern.target(sizes, &plan);
    let mut pairs: Vec<(Window, Window)> = Vec::with_capacity(sizes.pairs);
    let mut first: Option<(Value, atunnel_host::CgroupSample, Census, Resources, f64)> = None;
    let mut peaks: Option<Peaks> = None;
    let mut established_all = Vec::new();
    let mut probe = (0u64, None::<String>);
    let mut between = Vec::new();
    let (mut opened, mut ended, mut failed_opens, mut sent, mut held) = (0, 0, 0, 0, 0);
    let mut during = Value::Null;
    let mut after = Value::Null;
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
            between.push(json!({
                "cleared_s": cleared.map(|s| (s * 10.0).round() / 10.0),
                "still_held": still,
            }));
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
    let transitions = (num(&after, &["overload", "transitions_total"])
        - num(&before, &["overload", "transitions_total"]))
    .max(0.0);
    let victim_errors: u64 = pairs.iter().map(|(_, u)| u.errors()).sum();
    let (victim_e0, victim_e1) = (egress_of(&before, &[VICTIM]), egress_of(&after, &[VICTIM]));
    let victim_refused = json!({
        "new_tunnels_tried": PROBE_TUNNELS * pairs.len(),
        "new_tunnels_refused": probe.0,
        "new_tunnels_first_error": probe.1,
        "request_errors": victim_errors,
        "egress_refused_overload": (num(&victim_e1, &["refused_overload_total"]) - num(&victim_e0, &["refused_overload_total"])).max(0.0),
        "egress_refused_tunnels": (num(&victim_e1, &["refused_tunnels_total"]) - num(&victim_e0, &["refused_tunnels_total"])).max(0.0),
    });
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
        guard_left_normal: overload_rank(&peaks.overload) > 0 || transitions > 0.0,
        recovered: recovered.is_some(),
    });
    let peak = peaks.memory;
    let hostile_egress_during = egress_of(&during, hostiles);
    let hostile_ingress_during = ingress_of(&during, hostiles);
    let mut row = json!({
        "pattern": pattern.name(),
        "verdict": conclusion.as_str(),
        "pass": conclusion == Conclusion::Pass,
        "failed": failed,
        "inconclusive": inconclusive,
        "pairs": pairs.len(),
        "confidence": {
            "http_p99": http.json(),
            "https_p99": https.json(),
            "tcp_mb_s": tcp.json(),
        },
        "victim_p99_ratio": http.point(),
        "victim_https_p99_ratio": https.point(),
        "victim_tcp_ratio": tcp.point(),
        "windows": pairs.iter().map(|(b, u)| json!({"baseline": window_figures(b), "under": window_figures(u)})).collect::<Vec<_>>(),
        "between_pairs": between,
        "oom_kills": oom_kills,
        "tunnel_died": !alive,
        "peak_memory_bytes": peak,
        "baseline_memory_bytes": cg0.memory_bytes,
        "soft_threshold_bytes": soft.round(),
        "recovered_s": recovered.map(|s| (s * 10.0).round() / 10.0),
        "not_recovered": above,
        "victim_refused": victim_refused,
        "overload": {
            "worst_state": peaks.overload,
            "transitions": transitions,
            "peak_open_fds": peaks.open_fds,
            "descriptor_limit": num(&before, &["overload", "descriptors", "limit"]),
        },
    });
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
    let victim = json!({
        "victim_http_p99_us": med(u, &|w| w.http.latency.p99 as f64),
        "baseline_http_p99_us": med(b, &|w| w.http.latency.p99 as f64),
        "victim_http_p50_us": med(u, &|w| w.http.latency.p50 as f64),
        "baseline_http_p50_us": med(b, &|w| w.http.latency.p50 as f64),
        "victim_https_p99_us": med(u, &|w| w.https.latency.p99 as f64),
        "baseline_https_p99_us": med(b, &|w| w.https.latency.p99 as f64),
        "victim_tcp_mb_s": med(u, &Window::tcp_median),
        "baseline_tcp_mb_s": med(b, &Window::tcp_median),
        "victim_tcp_runs_mb_s": pairs.iter().flat_map(|p| p.1.tcp_mb_s.iter().copied()).collect::<Vec<_>>(),
        "baseline_tcp_runs_mb_s": pairs.iter().flat_map(|p| p.0.tcp_mb_s.iter().copied()).collect::<Vec<_>>(),
        "victim_errors": victim_errors,
        "baseline_errors": pairs.iter().map(|(b, _)| b.errors()).sum::<u64>(),
        "victim_first_error": pairs.iter().find_map(|(_, u)| u.first_error()),
        "victim_dispatch_lag_p99_us": pairs.iter().map(|(_, u)| u.http.dispatch_lag_p99_us.max(u.https.dispatch_lag_p99_us)).max(),
        "victim_shed": pairs.iter().map(|(_, u)| u.http.shed + u.https.shed).sum::<u64>(),
        "victim_achieved_per_s": [last_under.http.achieved.round(), last_under.https.achieved.round()],
    });
    let established_s = established_all.iter().map(|e| e.0).fold(0.0, f64::max);
    let context = json!({
        "tunnel_cores": mean(u, &|w| w.tunnel_cores),
        "baseline_tunnel_cores": mean(b, &|w| w.tunnel_cores),
        "tunnel_throttled": pairs.iter().any(|(_, u)| u.throttled),
        "generator_cores": mean(u, &|w| w.generator_cores),
        "baseline_generator_cores": mean(b, &|w| w.generator_cores),
        "sink_cores": mean(u, &|w| w.sink_cores),
        "baseline_sink_cores": mean(b, &|w| w.sink_cores),
        "actors_cores": mean(u, &|w| w.actors_cores),
        "baseline_actors_cores": mean(b, &|w| w.actors_cores),
        "others_cores": mean(u, &|w| w.others_cores),
        "machine_saturated": pairs.iter().any(|(_, u)| u.machine_saturated()),
        "baseline_machine_saturated": pairs.iter().any(|(b, _)| b.machine_saturated()),
        "baseline_others_cores": mean(b, &|w| w.others_cores),
        "established_s": (established_s * 10.0).round() / 10.0,
        "established": established_all.iter().all(|e| e.1),
        "hostile": {
            "held": held,
            "opened": opened,
            "reopened": ended,
            "failed": failed_opens,
            "sent": sent,
            "tunnels_in_atunnel": num(&hostile_egress_during, &["tunnels"]),
            "buffers_in_atunnel": num(&hostile_egress_during, &["buffers"]),
            "ingress_in_flight_in_atunnel": num(&hostile_ingress_during, &["in_flight"]),
            "actors": hostiles.iter().map(|a| format!("actor-{a}")).collect::<Vec<_>>(),
            "target": target,
            "egress_each": plan.egress_each,
            "fd_limited": plan.fd_limited,
        },
        "refused": refusals(&before, &after, hostiles),
        "during": {
            "heap_bytes": num(&during, &["process", "heap_bytes"]),
            "open_fds": num(&during, &["process", "open_fds"]),
            "tasks": num(&during, &["process", "tasks"]),
            "pool_in_use": num(&during, &["pool", "in_use"]),
            "overload_state": during["overload"]["state"].clone(),
            "gateway_connections": bench.tunnel_pid().map_or(0.0, gateway_connections),
        },
        "baseline_resources": base_res.json(),
        "recovered_resources": after_res.json(),
        "tunnel_sockets_before": census0.json(),
        "tunnel_sockets_after": census.json(),
    });
    for part in [victim, context] {
        if let (Some(row), Value::Object(part)) = (row.as_object_mut(), part) {
            row.extend(part);
        }
    }
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
    let spread = |key: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(|r| r["windows"].as_array())
            .flatten()
            .filter_map(|w| w["baseline"][key].as_f64())
            .filter(|&x| x > 0.0)
            .collect();
        let lo = v.iter().copied().reduce(f64::min)?;
        let hi = v.iter().copied().reduce(f64::max)?;
        Some((hi / lo * 100.0).round() / 100.0)
    };
    let spread = json!({
        "http_p99": spread("http_p99_us"),
        "https_p99": spread("https_p99_us"),
        "tcp_mb_s": spread("tcp_mb_s"),
    });
    let counts = Counts::of(rows.iter().map(|r| match r["verdict"].as_str() {
        Some("pass") => Conclusion::Pass,
        Some("fail") => Conclusion::Fail,
        _ => Conclusion::Inconclusive,
    }));
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
    Ok(ScenarioResult {
        name: Scenario::NoisyNeighbour.name().into(),
        rungs: Vec::new(),
        summary: json!({
            "patterns": rows,
            "verdict": counts.overall().as_str(),
            "verdicts": counts.json(),
            "pass": counts.overall() == Conclusion::Pass,
            "pairs": sizes.pairs,
            "victim": format!("actor-{VICTIM}"),
            "hostile": format!("actor-{HOSTILE}"),
            "tunnel_flags": own,
            "rate_per_s": RATE,
            "window_s": sizes.window.as_secs_f64(),
            "tcp_bytes": sizes.tcp_bytes,
            "baseline_spread": spread,
        }),
        notes,
    })
}

/// A pattern's verdict in one line, with each figure's interval:
/// `unread-downloads: inconclusive (http p99 1.02 [0.95, 1.14] <= 1.1:
/// inconclusive; ...)`.
fn verdict_line(row: &Value) -> String {
    let figure = |key: &str| {
        let f = &row["confidence"][key];
        let point = f["estimate"]
            .as_f64()
            .map_or("-".into(), |x| format!("{x:.2}"));
        let interval = match (f["ci95"][0].as_f64(), f["ci95"][1].as_f64()) {
            (Some(lo), Some(hi)) => format!("[{lo:.2}, {hi:.2}]"),
            _ => "[no interval]".into(),
        };
        format!(
            "{point} {interval}: {}",
            f["verdict"].as_str().unwrap_or("-")
        )
    };
    let failed: Vec<&str> = row["failed"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "{}: {}{} over {} pairs; http p99 ratio {}, https p99 ratio {}, tcp ratio {}",
        row["pattern"].as_str().unwrap_or("?"),
        row["verdict"].as_str().unwrap_or("?"),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        },
        row["pairs"],
        figure("http_p99"),
        figure("https_p99"),
        figure("tcp_mb_s"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_at_budget_takes_four_hostile_actors_beside_the_victim_if_hosted() {
        assert_eq!(Pattern::ActorsAtBudget.hostiles(16), vec![1, 2, 3, 4]);
        assert_eq!(Pattern::ActorsAtBudget.hostiles(5), vec![1, 2, 3, 4]);
        assert_eq!(Pattern::ActorsAtBudget.hostiles(3), vec![1, 2]);
        assert_eq!(Pattern::StalledResponseBodies.hostiles(16), vec![HOSTILE]);
    }

    #[test]
    fn the_generators_descriptor_limit_cuts_the_tunnels_each_hostile_actor_tries() {
        let room = Plan::of(Pattern::ActorsAtBudget, 5, 19_900);
        assert_eq!((room.egress_each, room.fd_limited), (EGRESS_BUDGET, false));
        // 4 actors in 9,000 - 1,000 kept back: 2,000 each.
        let tight = Plan::of(Pattern::ActorsAtBudget, 5, 9_000);
        assert_eq!((tight.egress_each, tight.fd_limited), (2000, true));
        let none = Plan::of(Pattern::ActorsAtBudget, 5, 500);
        assert_eq!((none.egress_each, none.fd_limited), (0, true));
        let other = Plan::of(Pattern::StalledResponseBodies, 5, 500);
        assert_eq!((other.egress_each, other.fd_limited), (0, false));
    }

    #[test]
    fn stalled_response_bodies_target_no_more_than_the_victims_connections_have_streams_for() {
        let plan = Plan::of(Pattern::StalledResponseBodies, 5, 20_000);
        let mut sizes = Sizes::of(false);
        sizes.stalled_bodies = 1000;
        assert_eq!(
            Pattern::StalledResponseBodies.target(&sizes, &plan),
            Some(ROUTER_CONNS * ACTOR_ROUTER_STREAMS)
        );
        sizes.stalled_bodies = 100;
        assert_eq!(
            Pattern::StalledResponseBodies.target(&sizes, &plan),
            Some(100)
        );
        let budget = Plan::of(Pattern::ActorsAtBudget, 5, 20_000);
        assert_eq!(
            Pattern::ActorsAtBudget.target(&sizes, &budget),
            Some(4 * (EGRESS_BUDGET + INGRESS_BUDGET))
        );
        assert_eq!(Pattern::DnsFlood.target(&sizes, &plan), None);
    }

    #[test]
    fn the_hostile_actors_figures_are_summed_and_the_victims_left_out() {
        let stats = json!({
            "egress_actors": [
                {"actor": "uid-0", "tunnels": 7, "refused_overload_total": 3},
                {"actor": "uid-1", "tunnels": 100, "refused_overload_total": 1},
                {"actor": "uid-2", "tunnels": 50},
            ],
            "ingress": {"actors": [
                {"actor": "bench/actor-1", "in_flight": 10},
                {"actor": "bench/actor-3", "in_flight": 5},
            ]},
        });
        let h = egress_of(&stats, &[1, 2, 3]);
        assert_eq!(num(&h, &["tunnels"]), 150.0);
        assert_eq!(num(&h, &["refused_overload_total"]), 1.0);
        assert_eq!(num(&egress_of(&stats, &[VICTIM]), &["tunnels"]), 7.0);
        assert_eq!(num(&ingress_of(&stats, &[1, 2, 3]), &["in_flight"]), 15.0);
        assert_eq!(num(&egress_of(&stats, &[9]), &["tunnels"]), 0.0);
        assert_eq!(
            num(&ingress_of(&json!({"ingress": null}), &[1]), &["in_flight"]),
            0.0
        );
    }

    #[test]
    fn the_worst_overload_state_seen_is_kept() {
        let mut peaks = Peaks::new(10);
        let at = |state: &str, fds: f64| json!({"overload": {"state": state}, "process": {"open_fds": fds}});
        peaks.note(20, Some(&at("soft", 17_100.0)));
        peaks.note(15, Some(&at("normal", 900.0)));
        peaks.note(5, None);
        assert_eq!(
            peaks,
            Peaks {
                memory: 20,
                overload: "soft".into(),
                open_fds: 17_100.0
            }
        );
        peaks.note(5, Some(&at("hard", 0.0)));
        assert_eq!(peaks.overload, "hard");
    }

    fn steady(r: f64, bound: Bound) -> Figure {
        Figure::of(vec![Some(r); 4], bound)
    }

    fn passing() -> Checks {
        Checks {
            http: steady(1.0, Bound::AtMost(P99_RATIO_MAX)),
            https: steady(1.05, Bound::AtMost(P99_RATIO_MAX)),
            tcp: steady(0.95, Bound::AtLeast(TCP_RATIO_MIN)),
            victim_errors: 0,
            new_tunnels_refused: 0,
            oom_kills: 0,
            alive: true,
            peak_memory: 100.0,
            soft: 870.0,
            guard_left_normal: false,
            recovered: true,
        }
    }

    #[test]
    fn a_victim_refused_or_a_guard_gone_soft_fails_the_pattern() {
        assert_eq!(verdict(&passing()), (Conclusion::Pass, vec![], vec![]));
        let refused = Checks {
            new_tunnels_refused: 3,
            ..passing()
        };
        assert_eq!(
            verdict(&refused),
            (Conclusion::Fail, vec!["victim new tunnels refused"], vec![])
        );
        let soft = Checks {
            guard_left_normal: true,
            ..passing()
        };
        assert_eq!(verdict(&soft).1, vec!["overload guard left normal"]);
        // No request of any pair completed: no ratio at all, a failure.
        let starved = Checks {
            https: Figure::of(vec![None; 4], Bound::AtMost(P99_RATIO_MAX)),
            victim_errors: 2500,
            ..passing()
        };
        assert_eq!(
            verdict(&starved).1,
            vec!["victim ingress-https p99", "victim errors"]
        );
    }

    #[test]
    fn a_figure_straddling_its_bound_leaves_the_pattern_inconclusive_unless_something_failed() {
        let noisy = Figure::of(
            vec![Some(0.9), Some(2.4), Some(1.0), Some(1.1)],
            Bound::AtMost(P99_RATIO_MAX),
        );
        let unsure = Checks {
            http: noisy.clone(),
            ..passing()
        };
        assert_eq!(
            verdict(&unsure),
            (
                Conclusion::Inconclusive,
                vec![],
                vec!["victim egress-http p99"]
            )
        );
        let unsure_and_failed = Checks {
            http: noisy,
            tcp: steady(0.5, Bound::AtLeast(TCP_RATIO_MIN)),
            ..passing()
        };
        assert_eq!(
            verdict(&unsure_and_failed),
            (
                Conclusion::Fail,
                vec!["victim egress-tcp throughput"],
                vec!["victim egress-http p99"]
            )
        );
    }

    fn window(http_p99: u64, https_p99: u64, tcp: f64) -> Window {
        let mut w = Window::default();
        w.http.latency.p99 = http_p99;
        w.https.latency.p99 = https_p99;
        w.tcp_mb_s = vec![tcp];
        w
    }

    #[test]
    fn each_pair_is_its_own_ratio_so_a_drifting_baseline_cancels() {
        // The machine slows down 3x over the pattern, the pattern itself
        // costs the victim nothing: each pair's ratio is 1.
        let pairs: Vec<(Window, Window)> = [1.0, 2.0, 3.0, 1.5]
            .iter()
            .map(|&slow| {
                (
                    window((1000.0 * slow) as u64, (2000.0 * slow) as u64, 600.0 / slow),
                    window((1000.0 * slow) as u64, (2000.0 * slow) as u64, 600.0 / slow),
                )
            })
            .collect();
        let (http, https, tcp) = figures(&pairs);
        for f in [&http, &https, &tcp] {
            assert_eq!(f.conclusion, Conclusion::Pass, "{f:?}");
            assert_eq!(f.point(), Some(1.0));
        }
        // A victim that got nothing through in one window: that pair has
        // no ratio, the others still count.
        let mut gap = pairs.clone();
        gap[1].1.https.latency.p99 = 0;
        let (_, https, _) = figures(&gap);
        assert_eq!(https.ratios, vec![Some(1.0), None, Some(1.0), Some(1.0)]);
    }

    #[test]
    fn the_verdict_line_shows_each_figures_interval() {
        let (http, https, tcp) = (
            steady(1.0, Bound::AtMost(P99_RATIO_MAX)),
            Figure::of(
                vec![Some(0.9), Some(2.4), Some(1.0), Some(1.1)],
                Bound::AtMost(P99_RATIO_MAX),
            ),
            steady(0.95, Bound::AtLeast(TCP_RATIO_MIN)),
        );
        let row = json!({
            "pattern": "dns-flood", "verdict": "inconclusive", "failed": [], "pairs": 4,
            "confidence": {"http_p99": http.json(), "https_p99": https.json(), "tcp_mb_s": tcp.json()},
        });
        let line = verdict_line(&row);
        let (lo, hi) = https.interval().expect("interval");
        assert!(
            line.starts_with(&format!(
                "dns-flood: inconclusive over 4 pairs; http p99 ratio 1.00 [1.00, 1.00]: pass, https p99 ratio {:.2} [",
                https.point().expect("estimate")
            )),
            "{line}"
        );
        assert!(
            line.contains(&format!("[{lo:.2}, {hi:.2}]: inconclusive")),
            "{line}"
        );
        assert!(
            line.ends_with("tcp ratio 0.95 [0.95, 0.95]: pass"),
            "{line}"
        );
    }
}
