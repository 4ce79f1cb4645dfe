//! chaos: faults lose no data silently. Many concurrent egress tunnels, each
//! carrying a known pseudo-random stream both ways, checked byte for byte at
//! both ends, while one fault strikes mid-transfer: the gateway killed
//! (SIGKILL) and restarted, an actor deactivated (and activated again) by
//! the worker over atunnel's control API, atunnel killed and restarted by
//! the worker, a destination resetting (SO_LINGER 0) mid-stream; and a
//! phase with no fault. Every tunnel is classified from the actor's side: completed (all
//! bytes both ways, the destination's trailer confirming the upload, a clean
//! end), cut with a reset (ECONNRESET on either half of the actor's socket),
//! refused (closed with no byte before the destination ever saw it: a
//! CONNECT that failed), or silently truncated (a clean end after fewer
//! bytes, or bytes that differ): the verdict fails on any of the last.
//!
//! The far end is a forwarding gateway process the scenario owns (so it can
//! kill it) in the sink's namespace, and behind it a destination served by
//! this process; atunnel is pointed at that gateway for the scenario (`run`
//! restores its flags afterwards). Every phase's tunnels are half IPv4 (to
//! 198.18.0.2) and half IPv6 (to fd00:198:18::2, through the sandbox's
//! IPv6 redirect), alternating in pairs so destination resets strike both;
//! each row also counts each family's outcomes.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::markdown::Table;
use atunnel_bench::scenario::chaos::{Fault as FaultSummary, Outcomes, Summary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::role::{self, Role};
use crate::run::bench::Bench;
use crate::run::dial::Actors;
use crate::topology::{SINK_ADDR, SINK_ADDR6};

type BoxError = atunnel_process::BoxError;

/// The scenario's gateway (forward mode) and destination, in the sink's
/// namespace.
const GATEWAY_PORT: u16 = 4453;
const DESTINATION_PORT: u16 = 7070;
/// Header: tunnel id, bytes each way, bytes after which the destination
/// resets (0: never). Trailer: upload bytes and hash the destination got.
const HEADER: usize = 16;
const TRAILER: usize = 16;
/// How long one tunnel may take, the fault's recovery included.
const TUNNEL_LIMIT: Duration = Duration::from_secs(60);
/// Written and read in pieces of this size.
const PIECE: usize = 16 * 1024;

struct Sizes {
    tunnels: u64,
    bytes: u32,
    recovery_tunnels: u64,
}

impl Sizes {
    fn of(quick: bool) -> Self {
        if quick {
            Sizes {
                tunnels: 64,
                bytes: 2 << 20,
                recovery_tunnels: 8,
            }
        } else {
            Sizes {
                tunnels: 256,
                bytes: 8 << 20,
                recovery_tunnels: 32,
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    GatewayKill,
    ActorDeactivate,
    TunnelKill,
    DestinationReset,
}

const FAULTS: [Fault; 5] = [
    Fault::None,
    Fault::GatewayKill,
    Fault::ActorDeactivate,
    Fault::TunnelKill,
    Fault::DestinationReset,
];

/// The actor the deactivation fault strikes.
const STRUCK_ACTOR: u64 = 0;

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::GatewayKill => "gateway-kill",
            Fault::ActorDeactivate => "actor-deactivate",
            Fault::TunnelKill => "tunnel-kill",
            Fault::DestinationReset => "destination-reset",
        }
    }
}

/// The bytes of one direction of one tunnel: splitmix64 from a seed.
struct Stream {
    state: u64,
    word: [u8; 8],
    at: usize,
}

impl Stream {
    fn new(id: u64, direction: u64) -> Self {
        Self {
            state: id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (direction << 63) ^ 0x5eed,
            word: [0; 8],
            at: 8,
        }
    }

    fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            if self.at == 8 {
                self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = self.state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                self.word = (z ^ (z >> 31)).to_le_bytes();
                self.at = 0;
            }
            *b = self.word[self.at];
            self.at += 1;
        }
    }

    /// True if `got` is the stream's next bytes.
    fn matches(&mut self, got: &[u8]) -> bool {
        let mut want = vec![0u8; got.len()];
        self.fill(&mut want);
        want == got
    }
}

/// FNV-1a, the checksum the destination reports of the upload.
fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The destination: what it saw, by tunnel id.
#[derive(Default)]
struct Seen {
    ids: Mutex<HashSet<u64>>,
}

/// Serves one tunnel: the download while reading (and checking) the
/// upload, then the trailer and a FIN; or a reset after `reset_after`.
async fn destination_conn(mut s: TcpStream, seen: Arc<Seen>) -> io::Result<()> {
    let mut header = [0u8; HEADER];
    s.read_exact(&mut header).await?;
    let id = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as u64;
    let reset_after = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as u64;
    if let Ok(mut ids) = seen.ids.lock() {
        ids.insert(id);
    }
    let (mut r, mut w) = s.split();
    let upload = async {
        let (mut got, mut hash) = (0u64, FNV_START);
        let mut buf = vec![0u8; PIECE];
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, io::Error>((got, hash));
            }
            got += n as u64;
            hash = fnv(hash, &buf[..n]);
        }
    };
    let download = async {
        let mut stream = Stream::new(id, 1);
        let mut buf = vec![0u8; PIECE];
        let mut sent = 0u64;
        while sent < len {
            let n = (len - sent).min(PIECE as u64) as usize;
            let n = if reset_after > 0 {
                n.min((reset_after - sent) as usize)
            } else {
                n
            };
            stream.fill(&mut buf[..n]);
            w.write_all(&buf[..n]).await?;
            sent += n as u64;
            if reset_after > 0 && sent >= reset_after {
                return Ok::<_, io::Error>(true);
            }
        }
        Ok(false)
    };
    let (got, hash) = {
        let (mut upload, mut download) = (std::pin::pin!(upload), std::pin::pin!(download));
        let mut uploaded = None;
        // The upload is read all along; a reset is due as soon as the
        // download reaches it, however far the upload is.
        let reset = loop {
            tokio::select! {
                d = &mut download => break d?,
                u = &mut upload, if uploaded.is_none() => uploaded = Some(u),
            }
        };
        if reset {
            None
        } else {
            Some(match uploaded {
                Some(u) => u?,
                None => upload.await?,
            })
        }
    }
    .map_or((None, 0), |(got, hash)| (Some(got), hash));
    let Some(got) = got else {
        s.set_zero_linger()?;
        return Ok(());
    };
    let mut trailer = [0u8; TRAILER];
    trailer[..8].copy_from_slice(&got.to_le_bytes());
    trailer[8..].copy_from_slice(&hash.to_le_bytes());
    s.write_all(&trailer).await?;
    s.shutdown().await
}

/// How one tunnel ended, from the actor's side.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Completed,
    Reset,
    Refused,
    Truncated(String),
    Other(String),
}

fn is_reset(e: &io::Error) -> bool {
    // A broken pipe on a write comes only after the reset was reported to
    // the read (the kernel reports it once).
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

/// What the actor's read half saw.
struct ReadEnd {
    got: u64,
    wrong: bool,
    trailer: Option<(u64, u64)>,
    /// Bytes after the trailer.
    extra: bool,
}

/// One tunnel from actor `actor`'s sandbox; `progress` counts download
/// bytes across tunnels.
#[allow(clippy::too_many_arguments)]
async fn actor_tunnel(
    actors: Actors,
    actor: u64,
    dest: SocketAddr,
    id: u64,
    len: u32,
    reset_after: u32,
    progress: Arc<AtomicU64>,
    seen: Arc<Seen>,
) -> Outcome {
    let dest = dest.to_string();
    let s = match actors.dial(actor, &dest).await {
        Ok(s) => s,
        Err(e) if is_reset(&e) => return Outcome::Reset,
        Err(e) => return Outcome::Other(format!("connect: {e}")),
    };
    let (mut r, mut w) = s.into_split();
    let mut up_hash = FNV_START;
    let writer = async {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&id.to_le_bytes());
        header[8..12].copy_from_slice(&len.to_le_bytes());
        header[12..].copy_from_slice(&reset_after.to_le_bytes());
        w.write_all(&header).await?;
        let mut stream = Stream::new(id, 0);
        let mut buf = vec![0u8; PIECE];
        let mut sent = 0u64;
        while sent < u64::from(len) {
            let n = (u64::from(len) - sent).min(PIECE as u64) as usize;
            stream.fill(&mut buf[..n]);
            up_hash = fnv(up_hash, &buf[..n]);
            w.write_all(&buf[..n]).await?;
            sent += n as u64;
        }
        w.shutdown().await
    };
    let reader = async {
        let mut stream = Stream::new(id, 1);
        let mut buf = vec![0u8; PIECE];
        let mut end = ReadEnd {
            got: 0,
            wrong: false,
            trailer: None,
            extra: false,
        };
        let mut tail = Vec::new();
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                if tail.len() == TRAILER {
                    let count = u64::from_le_bytes(tail[..8].try_into().expect("8 bytes"));
                    let hash = u64::from_le_bytes(tail[8..].try_into().expect("8 bytes"));
                    end.trailer = Some((count, hash));
                } else if !tail.is_empty() {
                    end.extra = true;
                }
                return Ok::<_, io::Error>(end);
            }
            let mut chunk = &buf[..n];
            let body_left = (u64::from(len) - end.got) as usize;
            let body = chunk.len().min(body_left);
            if body > 0 {
                if !stream.matches(&chunk[..body]) {
                    end.wrong = true;
                }
                end.got += body as u64;
                progress.fetch_add(body as u64, Ordering::Relaxed);
                chunk = &chunk[body..];
            }
            tail.extend_from_slice(chunk);
            if tail.len() > TRAILER {
                end.extra = true;
            }
        }
    };
    let ended = tokio::time::timeout(TUNNEL_LIMIT, async { tokio::join!(writer, reader) }).await;
    let Ok((wrote, read)) = ended else {
        return Outcome::Other(format!("not ended within {TUNNEL_LIMIT:?}"));
    };
    let reset =
        wrote.as_ref().err().is_some_and(is_reset) || read.as_ref().err().is_some_and(is_reset);
    match read {
        Ok(end) if end.wrong || end.extra => {
            Outcome::Truncated(format!("tunnel {id}: bytes that differ from those sent"))
        }
        Ok(end)
            if end.got == u64::from(len)
                && wrote.is_ok()
                && end.trailer == Some((u64::from(len), up_hash)) =>
        {
            Outcome::Completed
        }
        _ if reset => Outcome::Reset,
        Ok(end) if end.got == 0 && end.trailer.is_none() => {
            let reached = seen.ids.lock().map(|ids| ids.contains(&id)).unwrap_or(true);
            if reached {
                Outcome::Truncated(format!(
                    "tunnel {id}: a clean end with no byte after reaching the destination"
                ))
            } else {
                Outcome::Refused
            }
        }
        Ok(end) => Outcome::Truncated(format!(
            "tunnel {id}: a clean end after {} of {len} bytes, trailer {:?} (upload {len} bytes, hash {up_hash:x}), upload {:?}",
            end.got, end.trailer, wrote
        )),
        Err(e) => Outcome::Other(format!("read: {e}")),
    }
}

/// The scenario's gateway process.
struct Gateway {
    role: Option<Role>,
}

impl Gateway {
    async fn start(bench: &Bench) -> Result<Role, BoxError> {
        let p = &bench.pki;
        let args = vec![
            "gateway".into(),
            role::arg("listen", SocketAddr::from((SINK_ADDR, GATEWAY_PORT))),
            role::arg("cert", p.gateway_cert().display()),
            role::arg("key", p.gateway_key().display()),
            role::arg("actor-ca", p.actor_ca_cert().display()),
            role::arg("allow", "198.18.0.0/30,[fd00:198:18::2/128]"),
        ];
        role::start_in(&bench.topo.exec, &bench.topo.sink, &args, None).await
    }

    /// SIGKILL, then a fresh one on the same address.
    async fn kill_and_restart(&mut self, bench: &Bench) -> Result<(), BoxError> {
        if let Some(mut old) = self.role.take() {
            let _ = old.child.start_kill();
            let _ = old.child.wait().await;
        }
        self.role = Some(Self::start(bench).await?);
        Ok(())
    }

    async fn stop(self) {
        if let Some(role) = self.role {
            role.stop().await;
        }
    }
}

/// One family's outcomes in a phase: completed, cut_rst, refused,
/// silently_truncated, other.
#[derive(Default, Debug, Clone, Copy)]
struct Tally([u64; 5]);

impl Tally {
    fn add(&mut self, o: &Outcome) {
        let i = match o {
            Outcome::Completed => 0,
            Outcome::Reset => 1,
            Outcome::Refused => 2,
            Outcome::Truncated(_) => 3,
            Outcome::Other(_) => 4,
        };
        self.0[i] += 1;
    }

    fn outcomes(&self) -> Outcomes {
        let [completed, cut_rst, refused, silently_truncated, other] = self.0;
        Outcomes {
            completed,
            cut_rst,
            refused,
            silently_truncated,
            other,
        }
    }
}

/// The family of phase tunnel `i`: pairs alternate, so that every other
/// tunnel (the ones a destination reset strikes) is of both families.
fn is_ipv6(i: u64) -> bool {
    (i / 2) % 2 == 1
}

/// Counts of one phase's tunnels.
#[derive(Default, Debug)]
struct Counts {
    completed: u64,
    reset: u64,
    refused: u64,
    truncated: u64,
    other: u64,
    first_truncated: Option<String>,
    first_other: Option<String>,
    /// Tunnels of the actors the fault did not strike that did not complete
    /// (the deactivation fault only: it must touch one actor).
    bystanders_incomplete: u64,
    /// The same outcomes, IPv4 and IPv6 tunnels apart.
    by_family: [Tally; 2],
}

impl Counts {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Completed => self.completed += 1,
            Outcome::Reset => self.reset += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Truncated(why) => {
                self.truncated += 1;
                self.first_truncated.get_or_insert(why);
            }
            Outcome::Other(why) => {
                self.other += 1;
                self.first_other.get_or_insert(why);
            }
        }
    }
}

/// Runs `n` tunnels spread over the actors; `fault` strikes once a quarter
/// of their download bytes arrived.
async fn phase(
    bench: &mut Bench,
    gateway: &mut Gateway,
    fault: Fault,
    n: u64,
    len: u32,
    first_id: u64,
    seen: &Arc<Seen>,
) -> Result<(Counts, Option<String>), BoxError> {
    let actors = Actors::of(bench);
    let count = bench.actor_count();
    let progress = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        // Destination resets: every other tunnel, halfway through.
        let reset_after = if fault == Fault::DestinationReset && i % 2 == 0 {
            len / 2
        } else {
            0
        };
        let actor = i % count;
        let family = usize::from(is_ipv6(i));
        let dest = if is_ipv6(i) {
            SocketAddr::from((SINK_ADDR6, DESTINATION_PORT))
        } else {
            SocketAddr::from((SINK_ADDR, DESTINATION_PORT))
        };
        let tunnel = actor_tunnel(
            actors.clone(),
            actor,
            dest,
            first_id + i,
            len,
            reset_after,
            progress.clone(),
            seen.clone(),
        );
        tasks.spawn(async move { (actor, family, tunnel.await) });
    }
    let mut counts = Counts::default();
    let mut struck = None;
    if matches!(
        fault,
        Fault::GatewayKill | Fault::ActorDeactivate | Fault::TunnelKill
    ) {
        // Mid-transfer: a quarter of the download bytes arrived (polled: a
        // counter has nothing to await).
        let target = n * u64::from(len) / 4;
        let mid = tokio::time::timeout(Duration::from_secs(30), async {
            while progress.load(Ordering::Relaxed) < target {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let at = progress.load(Ordering::Relaxed);
        struck = Some(format!(
            "{} at {:.0} % of the download bytes{}",
            fault.name(),
            at as f64 * 100.0 / (n * u64::from(len)) as f64,
            if mid.is_err() { " (30 s passed)" } else { "" }
        ));
        match fault {
            Fault::GatewayKill => gateway.kill_and_restart(bench).await?,
            Fault::ActorDeactivate => bench.deactivate_actor(STRUCK_ACTOR).await?,
            Fault::TunnelKill => {
                let generation = bench.last_status().generation;
                let pid = bench.tunnel_pid().ok_or("atunnel is not running")?;
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )?;
                bench.worker.wait_generation(generation + 1).await?;
                bench.check_tunnel().await?;
            }
            _ => {}
        }
    }
    while let Some(done) = tasks.join_next().await {
        let (actor, family, outcome) =
            done.unwrap_or_else(|e| (STRUCK_ACTOR, 0, Outcome::Other(format!("task: {e}"))));
        counts.by_family[family].add(&outcome);
        if fault == Fault::ActorDeactivate && actor != STRUCK_ACTOR && outcome != Outcome::Completed
        {
            counts.bystanders_incomplete += 1;
        }
        counts.add(outcome);
    }
    if fault == Fault::ActorDeactivate {
        // Back for the recovery tunnels, as a worker re-activates an actor.
        bench.activate_actor(STRUCK_ACTOR).await?;
    }
    Ok((counts, struck))
}

pub(super) async fn chaos(bench: &mut Bench) -> Result<ScenarioResult, BoxError> {
    let sizes = Sizes::of(bench.quick);
    let topo = &bench.topo;
    let listener = topo
        .exec
        .run_in(&topo.sink, || {
            // Both families' destinations on one socket.
            atunnel_sandbox::sandbox::listen_tcp_dual_stack(DESTINATION_PORT)
        })
        .await??;
    let listener = TcpListener::from_std(listener)?;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let destination = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(destination_conn(conn, s.clone()));
        }
    });
    let mut gateway = Gateway {
        role: Some(Gateway::start(bench).await?),
    };
    let result = async {
        let mut flags = bench.tunnel_args().to_vec();
        flags.push(role::arg(
            "gateway",
            SocketAddr::from((SINK_ADDR, GATEWAY_PORT)),
        ));
        bench.restart_tunnel(flags).await?;
        let mut rows = Vec::new();
        let mut next_id = 0;
        for fault in FAULTS {
            eprintln!("         fault {}", fault.name());
            let (counts, struck) = phase(
                bench,
                &mut gateway,
                fault,
                sizes.tunnels,
                sizes.bytes,
                next_id,
                &seen,
            )
            .await?;
            next_id += sizes.tunnels;
            // After the fault: fresh tunnels all complete again.
            let (after, _) = phase(
                bench,
                &mut gateway,
                Fault::None,
                sizes.recovery_tunnels,
                64 << 10,
                next_id,
                &seen,
            )
            .await?;
            next_id += sizes.recovery_tunnels;
            let recovered = |t: &Tally| t.0[0] == t.0.iter().sum::<u64>();
            rows.push(FaultSummary {
                fault: fault.name().into(),
                tunnels: sizes.tunnels,
                completed: counts.completed,
                cut_rst: counts.reset,
                silently_truncated: counts.truncated,
                refused: counts.refused,
                other: counts.other,
                struck,
                first_truncated: counts.first_truncated,
                first_other: counts.first_other,
                bystanders_incomplete: (fault == Fault::ActorDeactivate)
                    .then_some(counts.bystanders_incomplete),
                recovered: after.completed == sizes.recovery_tunnels,
                recovery_completed: after.completed,
                recovery_tunnels: sizes.recovery_tunnels,
                ipv4: counts.by_family[0].outcomes(),
                ipv6: counts.by_family[1].outcomes(),
                recovered_ipv4: recovered(&after.by_family[0]),
                recovered_ipv6: recovered(&after.by_family[1]),
            });
        }
        Ok::<_, BoxError>(rows)
    }
    .await;
    gateway.stop().await;
    destination.abort();
    let rows = result?;
    let truncated: u64 = rows.iter().map(|r| r.silently_truncated).sum();
    let baseline_clean = rows.first().is_some_and(|r| r.completed == sizes.tunnels);
    // Deactivating one actor cuts its tunnels and no one else's.
    let bystanders_clean = rows
        .iter()
        .all(|r| r.bystanders_incomplete.unwrap_or(0) == 0);
    let pass = truncated == 0 && baseline_clean && bystanders_clean;
    let family_truncated = |family: fn(&FaultSummary) -> &Outcomes| -> u64 {
        rows.iter().map(|r| family(r).silently_truncated).sum()
    };
    let summary = Summary {
        silently_truncated: truncated,
        silently_truncated_ipv4: family_truncated(|r| &r.ipv4),
        silently_truncated_ipv6: family_truncated(|r| &r.ipv6),
        pass,
        tunnels_per_fault: sizes.tunnels,
        bytes_each_way: sizes.bytes,
        faults: rows,
    };
    Ok(ScenarioResult::new(
        &summary,
        Vec::new(),
        vec![
            format!(
                "per fault, {} concurrent egress tunnels spread over the actors, each {} MiB each way of a pseudo-random stream (splitmix64 from the tunnel's id), through atunnel and a forwarding gateway process (the scenario's, in the sink's namespace) to a destination in the load process; the actor checks every byte of the download and the destination's trailer (the upload's byte count and FNV-1a hash as it received them), then a clean end",
                sizes.tunnels,
                sizes.bytes >> 20
            ),
            "gateway-kill: the gateway SIGKILLed once a quarter of the download bytes arrived, and a fresh one started on its address; actor-deactivate: at the same point the worker deactivates actor-0 over atunnel's control API (Deactivate), and once every tunnel ended prepares and activates it again (PrepareEgress, Activate); tunnel-kill: atunnel SIGKILLed at the same point, the worker starting a fresh one (new sandboxes); destination-reset: every other tunnel's destination resets (SO_LINGER 0, close) halfway through its download".into(),
            "completed: every byte both ways and the trailer, then a clean end; cut_rst: ECONNRESET on either half of the actor's socket (a broken pipe on a write counts: the kernel reports the reset to one call only); refused: closed with no byte before the destination saw the tunnel (a CONNECT that failed); silently_truncated: a clean end after fewer bytes, without the trailer or with bytes that differ; other: a connect or read error that is not a reset, or not ended within 60 s".into(),
            format!(
                "pass: silently_truncated 0 in every phase, all {} tunnels completed with no fault, and with actor-0 deactivated every other actor's tunnels completed (bystanders_incomplete 0); recovered: {} fresh 64 KiB tunnels all completed right after each fault",
                sizes.tunnels, sizes.recovery_tunnels
            ),
        ],
    ))
}

/// The faults as a table for report.md.
pub(in crate::run) fn report_section(s: &ScenarioResult) -> String {
    let Some(summary) = s.summary::<Summary>() else {
        return String::new();
    };
    let mut t = Table::new(&[
        "fault",
        "tunnels",
        "completed",
        "cut with RST",
        "silently truncated",
        "refused",
        "other",
        "recovered",
        "other actors' tunnels not completed",
        "IPv4 completed / RST / truncated",
        "IPv6 completed / RST / truncated",
    ]);
    let family =
        |f: &Outcomes| format!("{} / {} / {}", f.completed, f.cut_rst, f.silently_truncated);
    for r in &summary.faults {
        t.row([
            r.fault.to_string(),
            r.tunnels.to_string(),
            r.completed.to_string(),
            r.cut_rst.to_string(),
            r.silently_truncated.to_string(),
            r.refused.to_string(),
            r.other.to_string(),
            r.recovered.to_string(),
            r.bystanders_incomplete
                .map_or("-".to_string(), |n| n.to_string()),
            family(&r.ipv4),
            family(&r.ipv6),
        ]);
    }
    t.end()
}
