//! socket-memory: the total memory one stalled connection holds on the
//! proxy that holds it (kernel socket memory plus heap), in every stall
//! case, against a bound of 64 KiB: an actor that stops reading a download,
//! a destination that stops reading an upload (measured on atunnel and on
//! the forwarding gateway), a router that stops reading a CONNECT tunnel or
//! an HTTPS response, and an actor that stops reading an ingress request
//! body. All with the run's flags; and bulk throughput with them.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::scenario::socket_memory as summary;
use atunnel_measure::sockmem::SocketMemory;
use atunnel_support::stats_client::fetch_as_over;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;

use crate::role::{self, Role};
use crate::run::bench::Bench;
use crate::run::dial::Actors;
use crate::run::router::Alpn;
use crate::topology::SINK_ADDR;
use crate::traffic::{DISCARD, SOURCE};

/// Stalled connections per case.
const CONNS: usize = 100;
/// What one stalled connection may hold, heap plus kernel, in KiB.
const BOUND_KIB: f64 = 64.0;
/// The actors' port whose every connection gets an endless stream of bytes.
const FLOOD_PORT: u16 = 9000;
/// The actors' port that accepts and never reads (`actors --hold-port`).
const HOLD_PORT: u16 = 9001;
/// The request body the router sends in actor-stops-reading-body: larger
/// than anything a stalled path can take.
const ENDLESS_BODY: u64 = 1 << 30;

/// A stall case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Egress: the actor stops reading a download from the sink's source port.
    ActorStopsReading,
    /// Egress: the destination behind the forwarding gateway stops reading
    /// an upload the actor keeps writing.
    DestinationStopsReading,
    /// Ingress: the router stops reading an HTTP/1.1 CONNECT tunnel to the
    /// actor's flood port.
    RouterStopsReading,
    /// Ingress: the router stops reading an HTTPS response that never ends.
    RouterStopsReadingHttps,
    /// Ingress: the actor stops reading the body of an HTTPS request.
    ActorStopsReadingBody,
}

/// The proxy whose memory a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proxy {
    Atunnel,
    /// The forwarding gateway (a second gateway process, in the sink's
    /// namespace).
    Gateway,
}

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Atunnel => "atunnel",
            Proxy::Gateway => "gateway",
        }
    }
}

/// The table's rows, in order: a case and the proxy measured.
const ROWS: [(Case, Proxy); 6] = [
    (Case::ActorStopsReading, Proxy::Atunnel),
    (Case::DestinationStopsReading, Proxy::Atunnel),
    (Case::DestinationStopsReading, Proxy::Gateway),
    (Case::RouterStopsReading, Proxy::Atunnel),
    (Case::RouterStopsReadingHttps, Proxy::Atunnel),
    (Case::ActorStopsReadingBody, Proxy::Atunnel),
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::ActorStopsReading => "actor-stops-reading",
            Case::DestinationStopsReading => "destination-stops-reading",
            Case::RouterStopsReading => "router-stops-reading",
            Case::RouterStopsReadingHttps => "router-stops-reading-https",
            Case::ActorStopsReadingBody => "actor-stops-reading-body",
        }
    }

    /// What a row's figure holds, for the notes.
    fn holds(self, proxy: Proxy) -> &'static str {
        match (self, proxy) {
            (Case::ActorStopsReading, _) => {
                "actor-stops-reading (atunnel): an egress download from the sink's source port that the actor never reads; atunnel's sandbox-side socket to the actor (send queue), its HTTP/2 connections to the gateway carrying the tunnels (receive queues) and atunnel's heap"
            }
            (Case::DestinationStopsReading, Proxy::Atunnel) => {
                "destination-stops-reading (atunnel): the actor writes without pause through atunnel and a forwarding gateway to a destination that accepts and never reads; atunnel's sandbox-side sockets from the actor (receive queues), its HTTP/2 connections to the forwarding gateway (send queues) and atunnel's heap"
            }
            (Case::DestinationStopsReading, Proxy::Gateway) => {
                "destination-stops-reading (gateway): the same stalled uploads, measured on the forwarding gateway (a second gateway process in forward mode in the sink's namespace, with the run's --sink-arg flags that it takes): its sockets to the destination (send queues), its TLS connections from atunnel (receive queues) and the gateway's heap (its /stats); the destination's own receive queues are not counted"
            }
            (Case::RouterStopsReading, _) => {
                "router-stops-reading (atunnel): an HTTP/1.1 CONNECT tunnel over TLS from the router to the actor's flood port, the router reading nothing after the answer's head; atunnel's TLS socket to the router (send queue), its socket to the actor (receive queue) and atunnel's heap"
            }
            (Case::RouterStopsReadingHttps, _) => {
                "router-stops-reading-https (atunnel): one HTTP/1.1 request over TLS per router connection to the actor's /endless (a response that never ends), the router reading nothing after the response head; atunnel's TLS socket to the router (send queue), its HTTP/1.1 connection to the actor (receive queue) and atunnel's heap (TLS, hyper's buffers on both sides)"
            }
            (Case::ActorStopsReadingBody, _) => {
                "actor-stops-reading-body (atunnel): one HTTP/1.1 POST over TLS per router connection with a 1 GiB body the router writes without pause, to an actor port that accepts and never reads; atunnel's TLS socket from the router (receive queue), its socket to the actor (send queue) and atunnel's heap"
            }
        }
    }
}

/// Waits until a process's socket memory stops growing (the stalled
/// connections' queues are full), then returns it.
async fn settled_socket_memory(pid: u32) -> Result<SocketMemory, atunnel_process::BoxError> {
    let mut last = atunnel_measure::sockmem::of_process(pid)?;
    let mut steady = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = atunnel_measure::sockmem::of_process(pid)?;
        let grew = now.total().abs_diff(last.total()) > last.total() / 100 + 4096;
        steady = if grew { 0 } else { steady + 1 };
        last = now;
        if steady >= 4 {
            break;
        }
    }
    Ok(last)
}

/// Where the forwarding gateway listens.
const FORWARD_GATEWAY_PORT: u16 = 4443;
/// The forwarding gateway's /stats, in the sink's namespace.
const FORWARD_GATEWAY_STATS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4444);
/// The destination that never reads, in the sink's namespace.
const STALLED_DESTINATION: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(SINK_ADDR), 9999);
/// Flags of the forwarding gateway that the scenario sets itself; the
/// sink's values of these are not taken.
const GATEWAY_OWN_FLAGS: [&str; 6] = ["listen", "cert", "key", "actor-ca", "allow", "stats"];

/// A second gateway, in forward mode, in the sink's namespace, and behind
/// it a destination that accepts connections and never reads them: the far
/// end of destination-stops-reading (the bench sink answers by itself and
/// dials nothing). The destination's sockets belong to this process and are
/// not measured.
struct ForwardGateway {
    role: Role,
    /// What the destination accepted (held unread until `release`).
    held: Arc<std::sync::Mutex<Vec<TcpStream>>>,
    /// How many connections the destination accepted so far.
    accepted: tokio::sync::watch::Receiver<u64>,
    accept: JoinHandle<()>,
}

impl ForwardGateway {
    /// Starts both, the gateway with `flags` besides its own.
    async fn start(bench: &Bench, flags: &[String]) -> Result<Self, atunnel_process::BoxError> {
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
        let mut args = vec![
            "gateway".into(),
            role::arg(
                "listen",
                SocketAddr::from((SINK_ADDR, FORWARD_GATEWAY_PORT)),
            ),
            role::arg("cert", p.gateway_cert().display()),
            role::arg("key", p.gateway_key().display()),
            role::arg("actor-ca", p.actor_ca_cert().display()),
            // The sink's link (198.18.0.0/30): the destination only.
            role::arg("allow", "198.18.0.0/30"),
            role::arg("stats", FORWARD_GATEWAY_STATS),
        ];
        args.extend(flags.iter().cloned());
        match role::start_in(&topo.exec, &topo.sink, &args, None).await {
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

    fn pid(&self) -> Result<u32, atunnel_process::BoxError> {
        Ok(self.role.pid().ok_or("the forwarding gateway is gone")?)
    }

    /// The gateway's /stats (after it released free memory).
    async fn stats(
        &self,
        bench: &Bench,
    ) -> Result<atunnel_gateway::Stats, atunnel_process::BoxError> {
        let s = bench
            .topo
            .connect_in(&bench.topo.sink, FORWARD_GATEWAY_STATS)
            .await?;
        fetch_as_over(s, true).await
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

/// The flags the forwarding gateway takes from the sink's command line
/// (`/proc/<sink>/cmdline`): every `--name[=value]` that the `gateway` role
/// also has (windows, relay bounds, socket and pool options), but not those
/// in [`GATEWAY_OWN_FLAGS`]. So a run's `--sink-arg` applies to both
/// gateways without the load role being told them.
fn sink_flags_for_gateway(bench: &Bench) -> Result<Vec<String>, atunnel_process::BoxError> {
    use clap::CommandFactory;
    let pid = bench.sink_pid().ok_or("the sink's pid is not known")?;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| format!("the sink's command line (/proc/{pid}/cmdline): {e}"))?;
    let gateway = atunnel_gateway::cli::ForwardArgs::command();
    let known: HashSet<&str> = gateway
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|name| !GATEWAY_OWN_FLAGS.contains(name))
        .collect();
    Ok(raw
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .filter(|a| {
            a.strip_prefix("--")
                .and_then(|flag| flag.split('=').next())
                .is_some_and(|name| known.contains(name))
        })
        .map(str::to_string)
        .collect())
}

/// Writes until the connection fails: a peer that keeps sending.
async fn keep_writing<W: AsyncWrite + Unpin>(mut s: W) {
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
) -> Result<(), atunnel_process::BoxError> {
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

/// One row's measurement per stalled connection, KiB.
#[derive(Clone, Copy, Debug)]
struct Stalled {
    /// Kernel socket memory on the measured proxy.
    kernel: f64,
    /// Its parts: receive queues, send queues, reserved (forward alloc).
    parts: [f64; 3],
    /// The measured proxy's live heap.
    heap: f64,
}

impl Stalled {
    fn total(&self) -> f64 {
        self.kernel + self.heap
    }
}

/// What a case's stalled connections are, held until dropped.
#[derive(Default)]
struct Held {
    sockets: Vec<TcpStream>,
    tls: Vec<TlsStream<TcpStream>>,
    writers: Vec<JoinHandle<()>>,
}

impl Held {
    async fn close(self) {
        drop(self.sockets);
        drop(self.tls);
        for w in &self.writers {
            w.abort();
        }
        for w in self.writers {
            let _ = w.await;
        }
    }
}

/// `conns` stalled connections of `case`, into `held` (so that those
/// opened before a failure are closed too).
async fn open_stalled(
    bench: &Bench,
    case: Case,
    conns: usize,
    held: &mut Held,
) -> Result<(), atunnel_process::BoxError> {
    let actors = Actors::of(bench);
    let n = actors.sandboxes.len() as u64;
    for i in 0..conns as u64 {
        match case {
            Case::ActorStopsReading => held.sockets.push(actors.dial(i, SOURCE).await?),
            Case::DestinationStopsReading => {
                let s = actors.dial(i, &STALLED_DESTINATION.to_string()).await?;
                held.writers.push(tokio::spawn(keep_writing(s)));
            }
            Case::RouterStopsReading => held
                .tls
                .push(bench.connect_tunnel(i % n, FLOOD_PORT).await?),
            Case::RouterStopsReadingHttps => {
                let mut tls = bench.router_tls(443, Alpn::Http1).await?;
                let head = format!(
                    "GET /endless HTTP/1.1\r\nHost: worker.bench\r\nate-target-actor: bench/actor-{}\r\n\r\n",
                    i % n
                );
                tls.write_all(head.as_bytes()).await?;
                let answer = atunnel_connect::http1::read_head(&mut tls).await?;
                if atunnel_connect::http1::parse_response(&answer)?.status != 200 {
                    return Err(format!(
                        "GET /endless refused: {}",
                        String::from_utf8_lossy(&answer)
                    )
                    .into());
                }
                held.tls.push(tls);
            }
            Case::ActorStopsReadingBody => {
                let mut tls = bench.router_tls(443, Alpn::Http1).await?;
                let head = format!(
                    "POST /upload HTTP/1.1\r\nHost: worker.bench\r\nate-target-actor: bench/actor-{}\r\nx-ate-target-port: {HOLD_PORT}\r\ncontent-length: {ENDLESS_BODY}\r\n\r\n",
                    i % n
                );
                tls.write_all(head.as_bytes()).await?;
                held.writers.push(tokio::spawn(keep_writing(tls)));
            }
        }
    }
    Ok(())
}

/// A proxy's live heap from its /stats, after it released free memory.
async fn heap_bytes(
    bench: &Bench,
    proxy: Proxy,
    gateway: Option<&ForwardGateway>,
) -> Result<f64, atunnel_process::BoxError> {
    let process = match (proxy, gateway) {
        (Proxy::Atunnel, _) => bench.stats(true).await?.process,
        (Proxy::Gateway, Some(g)) => g.stats(bench).await?.process,
        (Proxy::Gateway, None) => return Err("no forwarding gateway to measure".into()),
    };
    Ok(process.heap_bytes as f64)
}

fn pid_of(
    bench: &Bench,
    proxy: Proxy,
    gateway: Option<&ForwardGateway>,
) -> Result<u32, atunnel_process::BoxError> {
    match (proxy, gateway) {
        (Proxy::Atunnel, _) => Ok(bench.tunnel_pid().ok_or("atunnel is not running")?),
        (Proxy::Gateway, Some(g)) => g.pid(),
        (Proxy::Gateway, None) => Err("no forwarding gateway to measure".into()),
    }
}

/// One measurement of `case`: `conns` stalled connections, and on each of
/// `measured` its socket memory and heap per stalled connection over its
/// idle baseline (heap read after releasing free memory, before and after).
async fn stalled_case(
    bench: &Bench,
    case: Case,
    conns: usize,
    gateway: Option<&ForwardGateway>,
    measured: &[Proxy],
) -> Result<Vec<Stalled>, atunnel_process::BoxError> {
    let mut pids = Vec::new();
    let mut before = Vec::new();
    for &p in measured {
        let pid = pid_of(bench, p, gateway)?;
        let heap = heap_bytes(bench, p, gateway).await?;
        before.push((atunnel_measure::sockmem::of_process(pid)?, heap));
        pids.push(pid);
    }
    let mut held = Held::default();
    let after = async {
        open_stalled(bench, case, conns, &mut held).await?;
        let mut after = Vec::new();
        for (&p, &pid) in measured.iter().zip(&pids) {
            let sockets = settled_socket_memory(pid).await?;
            after.push((sockets, heap_bytes(bench, p, gateway).await?));
        }
        Ok::<_, atunnel_process::BoxError>(after)
    }
    .await;
    held.close().await;
    let after = after?;
    if let Some(g) = gateway {
        g.release();
    }
    // Back to the baseline before the next measurement.
    let deadline = Instant::now() + Duration::from_secs(30);
    'wait: while Instant::now() < deadline {
        if bench
            .stats(false)
            .await?
            .egress
            .is_some_and(|e| e.tunnels_open != 0)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        for (&pid, (base, _)) in pids.iter().zip(&before) {
            if settled_socket_memory(pid).await?.total() > base.total() + 65536 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'wait;
            }
        }
        break;
    }
    let per = |now: u64, then: u64| now.saturating_sub(then) as f64 / conns as f64 / 1024.0;
    let mut rows = Vec::new();
    for ((&p, (base, heap0)), (settled, heap1)) in measured.iter().zip(&before).zip(&after) {
        let s = Stalled {
            kernel: per(settled.total(), base.total()),
            parts: [
                per(settled.receive_queued, base.receive_queued),
                per(settled.send_queued, base.send_queued),
                per(settled.forward_alloc, base.forward_alloc),
            ],
            heap: (heap1 - heap0).max(0.0) / conns as f64 / 1024.0,
        };
        eprintln!(
            "         {} on {}: {:.1} KiB kernel (receive {:.1}, send {:.1}, reserved {:.1}) + {:.1} KiB heap = {:.1} KiB per stalled connection",
            case.name(),
            p.name(),
            s.kernel,
            s.parts[0],
            s.parts[1],
            s.parts[2],
            s.heap,
            s.total(),
        );
        rows.push(s);
    }
    Ok(rows)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The median of each figure over repeats (the total is the median
/// kernel plus the median heap).
fn median_stalled(runs: &[Stalled]) -> Stalled {
    let pick = |f: &dyn Fn(&Stalled) -> f64| median(runs.iter().map(f).collect());
    Stalled {
        kernel: pick(&|s| s.kernel),
        parts: [
            pick(&|s| s.parts[0]),
            pick(&|s| s.parts[1]),
            pick(&|s| s.parts[2]),
        ],
        heap: pick(&|s| s.heap),
    }
}

/// `reps` measurements of `case` on each of `measured`; the median of each
/// figure per proxy.
async fn measure_case(
    bench: &Bench,
    case: Case,
    reps: usize,
    gateway: Option<&ForwardGateway>,
    measured: &[Proxy],
    table: &mut Vec<((Case, Proxy), Stalled)>,
) -> Result<(), atunnel_process::BoxError> {
    let mut runs: Vec<Vec<Stalled>> = vec![Vec::new(); measured.len()];
    for _ in 0..reps {
        for (run, s) in runs
            .iter_mut()
            .zip(stalled_case(bench, case, CONNS, gateway, measured).await?)
        {
            run.push(s);
        }
    }
    for (&p, run) in measured.iter().zip(&runs) {
        table.push(((case, p), median_stalled(run)));
    }
    Ok(())
}

/// The destination-stops-reading rows: a forwarding gateway with the run's
/// sink flags, atunnel restarted pointed at it (`run` restores atunnel's
/// flags afterwards), both measured on the same stalled uploads.
async fn through_forwarding_gateway(
    bench: &mut Bench,
    reps: usize,
    flags: &[String],
    table: &mut Vec<((Case, Proxy), Stalled)>,
) -> Result<(), atunnel_process::BoxError> {
    eprintln!("         forwarding gateway, atunnel pointed at it");
    let gateway = ForwardGateway::start(bench, flags).await?;
    let measured = async {
        let mut extra = bench.tunnel_args().to_vec();
        extra.push(role::arg(
            "gateway",
            SocketAddr::from((SINK_ADDR, FORWARD_GATEWAY_PORT)),
        ));
        bench.restart_tunnel(extra).await?;
        warm_gateway_connections(&Actors::of(bench), &gateway).await?;
        measure_case(
            bench,
            Case::DestinationStopsReading,
            reps,
            Some(&gateway),
            &[Proxy::Atunnel, Proxy::Gateway],
            table,
        )
        .await
    }
    .await;
    gateway.stop().await;
    measured
}

/// Heap plus kernel socket memory per stalled connection in every stall
/// case, on the proxy holding it, with the run's flags; and bulk throughput
/// with them.
pub(super) async fn socket_memory(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let reps = if bench.quick { 1 } else { 3 };
    let (gateway_flags, flags_note) = match sink_flags_for_gateway(bench) {
        Ok(flags) if flags.is_empty() => (
            flags,
            "the forwarding gateway ran with the sink's flags it takes: none (its defaults)".into(),
        ),
        Ok(flags) => {
            let note = format!(
                "the forwarding gateway ran with the sink's flags it takes: {}",
                flags.join(" ")
            );
            (flags, note)
        }
        Err(e) => (
            Vec::new(),
            format!("the forwarding gateway ran with its defaults: {e}"),
        ),
    };
    let mut table = Vec::new();
    for case in [
        Case::ActorStopsReading,
        Case::RouterStopsReading,
        Case::RouterStopsReadingHttps,
        Case::ActorStopsReadingBody,
    ] {
        measure_case(bench, case, reps, None, &[Proxy::Atunnel], &mut table).await?;
    }
    // Bulk throughput with the same flags (one run).
    let bytes: u64 = if bench.quick { 128 << 20 } else { 512 << 20 };
    let t0 = Instant::now();
    crate::traffic::upload(Actors::of(bench).dial(0, DISCARD).await?, bytes).await?;
    let throughput = (bytes as f64 / 1e6 / t0.elapsed().as_secs_f64()).round();
    through_forwarding_gateway(bench, reps, &gateway_flags, &mut table).await?;

    let round = |x: f64| (x * 10.0).round() / 10.0;
    // A figure that is not a number (nothing measured) is written as null.
    let kib = |x: f64| Some(round(x)).filter(|x| x.is_finite());
    let cases: Vec<summary::Case> = ROWS
        .iter()
        .filter_map(|row| table.iter().find(|(r, _)| r == row))
        .map(|((case, proxy), s)| summary::Case {
            case: case.name().into(),
            measured: proxy.name().into(),
            kernel_kib: kib(s.kernel),
            heap_kib: kib(s.heap),
            total_kib: kib(s.total()),
            parts_kib: summary::Parts {
                receive: kib(s.parts[0]),
                send: kib(s.parts[1]),
                reserved: kib(s.parts[2]),
            },
            pass: Some(s.total() <= BOUND_KIB),
        })
        .collect();
    let mut notes = vec![
        format!(
            "median of {reps} at {CONNS} stalled connections per case, with the run's flags; per stalled connection on the proxy that holds it: kernel socket memory (SO_MEMINFO receive + send queues + forward allocation summed over all of the proxy's sockets, duplicated with pidfd_getfd, minus its idle baseline; parts_kib splits it) plus heap (the proxy's /stats heap_bytes after it released free memory, minus the same before); pass when the total is <= {BOUND_KIB} KiB"
        ),
        flags_note,
    ];
    notes.extend(
        ROWS.iter()
            .map(|(case, proxy)| case.holds(*proxy).to_string()),
    );
    notes.push(format!(
        "bulk throughput with the same flags: {throughput} MB/s, one egress upload of {} MiB to the sink's discard port",
        bytes >> 20
    ));
    notes.push(netem_note(bench).await);
    let summary = summary::Summary {
        cases,
        conns: CONNS,
        repeats: reps,
        bound_kib: Some(BOUND_KIB),
        throughput_mb_per_s: throughput,
    };
    Ok(ScenarioResult::new(&summary, Vec::new(), notes))
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
