//! socket-memory: kernel socket memory per stalled connection, with
//! TCP_NOTSENT_LOWAT off and at 16 KiB, on atunnel's sockets (an actor or
//! the router that stops reading) and on a forwarding gateway's (a
//! destination that stops reading), and bulk throughput with each setting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::scenario::Scenario;
use atunnel_support::stats_client::num;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::role::{self, Role};
use crate::run::bench::Bench;
use crate::run::dial::Actors;
use crate::topology::SINK_ADDR;
use crate::traffic::{DISCARD, SOURCE};

/// Waits until atunnel's socket memory stops growing (the stalled
/// connections' queues are full), then returns it.
async fn settled_socket_memory(
    pid: u32,
) -> Result<atunnel_bench::sockmem::SocketMemory, atunnel_process::BoxError> {
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
const STALLED_DESTINATION: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(SINK_ADDR), 9999);

impl ForwardGateway {
    /// Starts both, the gateway with TCP_NOTSENT_LOWAT at `lowat`.
    async fn start(bench: &Bench, lowat: i64) -> Result<Self, atunnel_process::BoxError> {
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
                "gateway".into(),
                format!(
                    "--listen={}",
                    SocketAddr::from((SINK_ADDR, FORWARD_GATEWAY_PORT))
                ),
                format!("--cert={}", p.gateway_cert().display()),
                format!("--key={}", p.gateway_key().display()),
                format!("--actor-ca={}", p.actor_ca_cert().display()),
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

    fn pid(&self) -> Result<u32, atunnel_process::BoxError> {
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
) -> Result<Stalled, atunnel_process::BoxError> {
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
            _ => ingress.push(
                bench
                    .connect_tunnel(i % actors.sandboxes.len() as u64, 9000)
                    .await?,
            ),
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
pub(super) async fn socket_memory(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
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
                        SocketAddr::from((SINK_ADDR, FORWARD_GATEWAY_PORT))
                    ),
                ])
                .await?;
            warm_gateway_connections(&Actors::of(bench), &gateway).await?;
            let mut runs = Vec::new();
            for _ in 0..reps {
                runs.push(stalled_case(bench, STALL_CASES[2].0, conns, Some(&gateway)).await?);
            }
            Ok::<_, atunnel_process::BoxError>(median_stalled(runs))
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
        name: Scenario::SocketMemory.name().into(),
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
