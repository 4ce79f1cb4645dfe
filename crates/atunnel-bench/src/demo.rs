//! `atunnel-bench demo`: egress end to end on one machine, measured.
//!
//! Starts the gateway in bench mode and atunnel hosting a few actors, each in
//! its own process (this binary re-run as `sink` and `tunnel`), then, from
//! this process: checks bytes come back intact, measures bulk throughput
//! both ways, and holds N idle tunnels to read atunnel's heap and tasks per
//! idle tunnel from its `/stats` (a counting allocator, not RSS).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use std::sync::Arc;

use atunnel::host::{HostReady, Network};
use atunnel_sandbox::{NsExecutor, SandboxNetwork};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::pki;
use crate::role::{self, Role};
use crate::traffic::{DISCARD, ECHO, SOURCE, upload};
use atunnel_support::stats_client::{Stats, fetch_stats};

#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Actors hosted by the tunnel; idle tunnels are spread over them.
    #[arg(long, default_value_t = 4)]
    pub actors: usize,
    /// Idle tunnels held for the memory figure.
    #[arg(long, default_value_t = 2000)]
    pub idle: usize,
    /// MiB moved per throughput run.
    #[arg(long, default_value_t = 512)]
    pub bulk_mib: u64,
    /// Throughput runs per direction.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// How actors reach the tunnel: real sandboxes (root) or loopback listeners.
    #[arg(long, value_enum, default_value = "sandbox")]
    pub network: Network,
}

/// Dials as an actor's program would: from inside its sandbox's runtime
/// namespace to any address, or to its loopback listener for that address.
#[derive(Clone)]
struct ActorDialer {
    exec: Option<NsExecutor>,
    actors: Arc<Vec<ActorSide>>,
}

enum ActorSide {
    Sandbox(SandboxNetwork),
    Loopback(BTreeMap<SocketAddr, SocketAddr>),
}

impl ActorDialer {
    fn new(ready: &HostReady) -> Result<Self, atunnel_process::BoxError> {
        let mut exec = None;
        let mut actors = Vec::new();
        for a in &ready.actors {
            match &a.runtime_netns {
                Some(name) => {
                    if exec.is_none() {
                        exec = Some(NsExecutor::start()?);
                    }
                    actors.push(ActorSide::Sandbox(SandboxNetwork::open(name, 0, true)?));
                }
                None => actors.push(ActorSide::Loopback(a.listeners.clone())),
            }
        }
        Ok(Self {
            exec,
            actors: Arc::new(actors),
        })
    }

    fn count(&self) -> usize {
        self.actors.len()
    }

    async fn dial(&self, actor: usize, dest: &str) -> Result<TcpStream, atunnel_process::BoxError> {
        let dest: SocketAddr = dest.parse()?;
        match &self.actors[actor % self.actors.len()] {
            ActorSide::Sandbox(sb) => {
                let exec = self.exec.as_ref().ok_or("no namespace executor")?;
                Ok(sb.connect_from_runtime(exec, dest).await?)
            }
            ActorSide::Loopback(listeners) => {
                let addr = listeners
                    .get(&dest)
                    .ok_or_else(|| format!("no listener for {dest}"))?;
                Ok(TcpStream::connect(addr).await?)
            }
        }
    }
}

fn network_arg(n: Network) -> &'static str {
    match n {
        Network::Sandbox => "sandbox",
        Network::Loopback => "loopback",
    }
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

pub async fn run(args: DemoArgs) -> Result<(), atunnel_process::BoxError> {
    let prefix = format!("atb-{}-", std::process::id());
    let mut roles = Vec::new();
    let result = run_with(args, &prefix, &mut roles).await;
    // Stop the roles gracefully (the tunnel removes its sandboxes), then
    // sweep whatever a role that failed or was killed left behind.
    for role in roles.into_iter().rev() {
        role.stop().await;
    }
    role::sweep_namespaces(&prefix).await;
    result
}

async fn run_with(
    args: DemoArgs,
    prefix: &str,
    roles: &mut Vec<Role>,
) -> Result<(), atunnel_process::BoxError> {
    let dir = tempfile::tempdir()?;
    let files = pki::write(dir.path())?;
    let bulk = args.bulk_mib << 20;

    let sink = role::start(&[
        s("sink"),
        s("--listen=127.0.0.1:0"),
        format!("--cert={}", files.gateway_cert().display()),
        format!("--key={}", files.gateway_key().display()),
        format!("--actor-ca={}", files.actor_ca_cert().display()),
        format!("--source-bytes={bulk}"),
    ])
    .await?;
    let sink_pid = sink.child.id().unwrap_or(0);
    let gateway = sink
        .first_line
        .strip_prefix("listening ")
        .map(str::parse::<SocketAddr>);
    roles.push(sink);
    let gateway = gateway.ok_or("sink did not say where it listens")??;

    let tunnel = role::start(&[
        s("tunnel"),
        format!("--actors={}", args.actors),
        format!("--gateway={gateway}"),
        format!("--gateway-name={}", pki::GATEWAY_NAME),
        format!("--network={}", network_arg(args.network)),
        format!("--netns-prefix={prefix}"),
        format!("--gateway-ca={}", files.gateway_ca().display()),
        format!("--actor-ca-cert={}", files.actor_ca_cert().display()),
        format!("--actor-ca-key={}", files.actor_ca_key().display()),
        format!("--destinations={ECHO},{DISCARD},{SOURCE}"),
    ])
    .await?;
    let ready: Result<HostReady, _> = serde_json::from_str(&tunnel.first_line);
    let tunnel_pid = tunnel.child.id().unwrap_or(0);
    roles.push(tunnel);
    let ready = ready?;
    let dialer = ActorDialer::new(&ready)?;
    println!(
        "atunnel-bench demo: gateway (sink) pid {}, tunnel pid {} hosting {} actors",
        sink_pid, tunnel_pid, args.actors
    );

    // 1. Integrity: 1 MiB of random bytes through the tunnel and back.
    let payload: Vec<u8> = (0..1 << 20).map(|_| rand::random::<u8>()).collect();
    let back = round_trip(dialer.dial(0, ECHO).await?, &payload).await?;
    let intact = back == payload;
    println!(
        "echo 1 MiB through tunnel and gateway: {}",
        if intact { "intact" } else { "CORRUPTED" }
    );

    // 2. Bulk throughput, each direction, `runs` times.
    let mut up = Vec::new();
    let mut down = Vec::new();
    for _ in 0..args.runs {
        up.push(
            measure(ready.stats, || async {
                Ok(upload(dialer.dial(0, DISCARD).await?, bulk).await?)
            })
            .await?,
        );
        down.push(
            measure(ready.stats, || async {
                download(dialer.dial(0, SOURCE).await?, bulk).await
            })
            .await?,
        );
    }

    // 3. Idle tunnels: heap and tasks per tunnel, read from the tunnel's /stats.
    // Twice: what the first round leaves behind is retained capacity (slabs,
    // pools) if the second round leaves no more, a leak if it grows.
    let idle = hold_idle(&ready, &dialer, args.idle).await?;
    let again = hold_idle(&ready, &dialer, args.idle).await?;

    println!();
    println!("| what | figure |");
    println!("|---|---|");
    println!(
        "| echo 1 MiB both ways | {} |",
        if intact { "intact" } else { "CORRUPTED" }
    );
    for (name, runs) in [
        ("actor -> gateway (upload)", &up),
        ("gateway -> actor (download)", &down),
    ] {
        let mbps: Vec<String> = runs.iter().map(|r| format!("{:.0}", r.mb_per_s)).collect();
        let cores: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.2}", r.tunnel_cores))
            .collect();
        println!(
            "| {name}, {} MiB x {}, MB/s | {} |",
            args.bulk_mib,
            args.runs,
            mbps.join(", ")
        );
        println!(
            "| {name}, tunnel CPU cores while moving | {} |",
            cores.join(", ")
        );
    }
    println!(
        "| idle tunnels held | {} (over {} actors) |",
        idle.conns, args.actors
    );
    println!(
        "| tunnel heap per idle tunnel | {:.0} B |",
        idle.heap_per_conn
    );
    println!(
        "| tunnel tasks per idle tunnel | {:.2} |",
        idle.tasks_per_conn
    );
    println!(
        "| tunnel RSS per idle tunnel | {:.0} B |",
        idle.rss_per_conn
    );
    println!(
        "| relay buffers borrowed while idle | {} |",
        idle.pool_in_use
    );
    println!(
        "| tunnel heap left after closing them, round 1 / round 2 | {:+.0} B / {:+.0} B |",
        idle.heap_after_close_delta, again.heap_after_close_delta
    );
    println!();
    println!("heap: live bytes from the tunnel's counting allocator; reproduce with");
    println!(
        "  cargo run --release -p atunnel-bench -- demo --idle {}",
        args.idle
    );
    if !intact {
        return Err("bytes came back corrupted".into());
    }
    Ok(())
}

async fn round_trip(s: TcpStream, data: &[u8]) -> Result<Vec<u8>, atunnel_process::BoxError> {
    let (mut r, mut w) = s.into_split();
    let data = data.to_vec();
    let writer = tokio::spawn(async move {
        w.write_all(&data).await?;
        w.shutdown().await
    });
    let mut got = Vec::new();
    r.read_to_end(&mut got).await?;
    writer.await??;
    Ok(got)
}

struct Throughput {
    mb_per_s: f64,
    tunnel_cores: f64,
}

async fn measure<F, Fut>(stats: SocketAddr, f: F) -> Result<Throughput, atunnel_process::BoxError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<u64, atunnel_process::BoxError>>,
{
    let before = fetch_stats(stats, false).await?;
    let started = Instant::now();
    let bytes = f().await?;
    let elapsed = started.elapsed().as_secs_f64();
    let after = fetch_stats(stats, false).await?;
    let cpu = |s: &Stats| s.process.cpu_user_s + s.process.cpu_system_s;
    Ok(Throughput {
        mb_per_s: bytes as f64 / 1e6 / elapsed,
        tunnel_cores: (cpu(&after) - cpu(&before)) / elapsed,
    })
}

async fn download(mut s: TcpStream, bytes: u64) -> Result<u64, atunnel_process::BoxError> {
    s.shutdown().await?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    if got != bytes {
        return Err(format!("download got {got} bytes, expected {bytes}").into());
    }
    Ok(got)
}

struct Idle {
    conns: usize,
    heap_per_conn: f64,
    tasks_per_conn: f64,
    rss_per_conn: f64,
    pool_in_use: f64,
    heap_after_close_delta: f64,
}

async fn hold_idle(
    ready: &HostReady,
    dialer: &ActorDialer,
    n: usize,
) -> Result<Idle, atunnel_process::BoxError> {
    // Warm up: one tunnel per actor so each has its pooled gateway connection,
    // which is shared by all its tunnels and is not a per-tunnel cost.
    for i in 0..dialer.count() {
        let mut s = dialer.dial(i, ECHO).await?;
        crate::traffic::ping(&mut s).await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = fetch_stats(ready.stats, true).await?;
    let mut held = Vec::with_capacity(n);
    for batch in (0..n).collect::<Vec<_>>().chunks(200) {
        let opens = batch.iter().map(|&i| {
            let dialer = dialer.clone();
            async move {
                let mut s = dialer.dial(i, ECHO).await?;
                crate::traffic::ping(&mut s).await?;
                Ok::<_, atunnel_process::BoxError>(s)
            }
        });
        for r in join_all(opens).await {
            held.push(r?);
        }
    }
    // Let the last acknowledgements and window updates settle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = fetch_stats(ready.stats, true).await?;
    let per = |f: fn(&Stats) -> f64| (f(&during) - f(&before)) / n as f64;
    let idle = Idle {
        conns: n,
        heap_per_conn: per(|s| s.process.heap_bytes as f64),
        tasks_per_conn: per(|s| s.process.tasks as f64),
        rss_per_conn: per(|s| s.process.rss_bytes as f64),
        pool_in_use: during.pool.in_use as f64,
        heap_after_close_delta: 0.0,
    };
    drop(held);
    // Wait for the tunnel to see every close.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = fetch_stats(ready.stats, true).await?;
        if now.egress.is_none_or(|e| e.tunnels_open == 0) || Instant::now() > deadline {
            return Ok(Idle {
                heap_after_close_delta: now.process.heap_bytes as f64
                    - before.process.heap_bytes as f64,
                ..idle
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn join_all<F>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}
