//! The victim's side: its router and egress connections, and one window
//! of its egress-http, ingress-https and egress-tcp figures with the CPU
//! around it.

use super::*;

/// The router's TLS and the namespaces, owned, for tasks of their own.
#[derive(Clone)]
pub(super) struct Router {
    pub(super) tls: Arc<RouterTls>,
    pub(super) topo: Arc<Topology>,
}

impl Router {
    pub(super) fn of(bench: &Bench) -> Result<Self, BoxError> {
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
    pub(super) async fn h2(&self) -> Result<H2Sender, BoxError> {
        hyper_h2(self.tls.connect(&self.topo, 443, Alpn::H2).await?).await
    }
}

/// The victim's connections, kept for the whole scenario (a broken one is
/// made again by the next unit that needs it).
#[derive(Clone)]
pub(super) struct Victim {
    pub(super) actors: Actors,
    pub(super) router: Router,
    pub(super) http: Arc<Vec<tokio::sync::Mutex<Option<TcpStream>>>>,
    pub(super) https: Arc<Vec<tokio::sync::Mutex<Option<H2Sender>>>>,
}

impl Victim {
    pub(super) async fn open(actors: Actors, router: Router) -> Result<Self, BoxError> {
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
    pub(super) async fn http_unit(&self, i: u64) -> Result<(), String> {
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
    pub(super) async fn https_unit(&self, i: u64) -> Result<(), String> {
        let send = shared_sender(&self.https, i, &self.router).await?;
        let result = super::super::ingress::routed_request(send, VICTIM).await;
        if result.is_err() {
            *self.https[i as usize % self.https.len()].lock().await = None;
        }
        result
    }

    /// The victim's new egress tunnels: [`PROBE_TUNNELS`] opened one after
    /// another, each one byte there and back; how many failed, and the
    /// first error.
    pub(super) async fn new_tunnels(&self) -> (u64, Option<String>) {
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
pub(super) async fn shared_sender(
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
pub(super) async fn stalled_request(
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
pub(super) async fn body_ended(resp: hyper::Response<hyper::body::Incoming>) {
    let mut body = resp.into_body();
    while let Some(Ok(_)) = body.frame().await {}
}

/// One request over a kept-alive egress connection to the sink's HTTP port.
pub(super) async fn http_exchange(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
        .await?;
    let mut answer = [0u8; HTTP_ANSWER_LEN];
    s.read_exact(&mut answer).await?;
    Ok(())
}

/// One victim rung as the scheduler counted it.
#[derive(Clone, Debug, Default)]
pub(super) struct Figures {
    pub(super) latency: Latency,
    pub(super) achieved: f64,
    pub(super) errors: u64,
    pub(super) shed: u64,
    pub(super) dispatch_lag_p99_us: u64,
    pub(super) first_error: Option<String>,
}

impl Figures {
    pub(super) fn of(out: &RungOutcome) -> Self {
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
pub(super) struct Window {
    pub(super) http: Figures,
    pub(super) https: Figures,
    /// MB/s of each upload; 0 for one that failed.
    pub(super) tcp_mb_s: Vec<f64>,
    pub(super) tcp_error: Option<String>,
    pub(super) tunnel_cores: f64,
    pub(super) throttled: bool,
    pub(super) generator_cores: f64,
    /// The gateway sink: the far end of the victim's egress.
    pub(super) sink_cores: f64,
    /// The actors' process: the far end of the victim's ingress.
    pub(super) actors_cores: f64,
    /// The machine's busy CPU not used by any of the bench's processes
    /// (other work on a shared machine).
    pub(super) others_cores: f64,
}

impl Window {
    /// Every core the machine had busy: the bench's processes and others'.
    pub(super) fn machine_cores(&self) -> f64 {
        self.tunnel_cores
            + self.generator_cores
            + self.sink_cores
            + self.actors_cores
            + self.others_cores
    }

    /// Whether the machine had no core to spare (90 % of its cores busy):
    /// then the victim's clients and far ends waited for CPU, and what the
    /// victim saw is not atunnel's alone.
    pub(super) fn machine_saturated(&self) -> bool {
        let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
        self.machine_cores() >= 0.9 * cores
    }

    pub(super) fn tcp_median(&self) -> f64 {
        let mut v = self.tcp_mb_s.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    pub(super) fn errors(&self) -> u64 {
        self.http.errors
            + self.https.errors
            + self.tcp_mb_s.iter().filter(|&&x| x == 0.0).count() as u64
    }

    /// The first error seen, for the notes.
    pub(super) fn first_error(&self) -> Option<String> {
        let tagged = |what: &str, e: &Option<String>| e.as_ref().map(|e| format!("{what}: {e}"));
        tagged("egress http", &self.http.first_error)
            .or_else(|| tagged("ingress https", &self.https.first_error))
            .or_else(|| tagged("egress tcp", &self.tcp_error))
    }
}

/// Measures the victim: egress HTTP at [`RATE`], open loop, then
/// `tcp_runs` uploads to the sink's discard port, then ingress HTTPS at
/// [`RATE`], open loop; latency from each request's due time.
pub(super) async fn measure_victim(bench: &Bench, victim: &Victim, sizes: &Sizes) -> Window {
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
pub(super) struct Cpu {
    pub(super) tunnel: atunnel_host::CgroupSample,
    pub(super) generator: f64,
    pub(super) sink: f64,
    pub(super) actors: f64,
    pub(super) machine: f64,
}

impl Cpu {
    pub(super) fn sample(bench: &Bench) -> Self {
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
pub(super) fn machine_busy_seconds() -> f64 {
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
