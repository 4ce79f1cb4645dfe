//! The admin listener every process may serve: HTTP/1.1 on a local address,
//! with a bound on each resource a local peer can make it hold. One app for
//! the tunnel and the gateway ([`AdminApp`], [`serve_app`]): `/stats` (one
//! snapshot of the process's figures as JSON), `/metrics` (the same
//! snapshot for scrapers), `/healthz` and `/readyz`.
//!
//! Health probes are answered even when every /stats connection is held:
//! a connection past that cap takes a place in a small reserve that
//! answers only [`PROBE_PATHS`] (anything else 503), one request, within a
//! short deadline. Past the reserve's cap the OLDEST reserve connection is
//! closed, not the newcomer (as `atunnel_tls::PreAuthGate` does for
//! handshakes): a kubelet's probe sends its request at once and is
//! answered in well under a millisecond, so a peer holding the places
//! would have to open a reserve's worth of connections within that time to
//! push it out.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atunnel_core::{Listener, ListenerCounters, ListenerStats};
use atunnel_tls::{PreAuthGate, PreAuthLimits};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::FlagDuration;

/// What a request to the admin listener gets answered with.
pub type Response = hyper::Response<Full<Bytes>>;
pub type Request = hyper::Request<hyper::body::Incoming>;

/// The paths the probe reserve answers: liveness and readiness.
pub const PROBE_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Bounds of the admin listener. A reader or two use it, and a kubelet's
/// probes; a local peer that opens connections and sends nothing, or never
/// reads its answer, holds at most `max_connections` tasks, each for at
/// most `connection_timeout`, and `probe_connections` more, each for at
/// most `probe_timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a connection has to send a request head (also the most it
    /// may sit idle between requests).
    pub header_timeout: Duration,
    /// The most one connection lives, whatever it does (a reader that
    /// stops reading a large answer included).
    pub connection_timeout: Duration,
    /// Connections past `max_connections` answered for [`PROBE_PATHS`]
    /// only; past these the oldest is closed.
    pub probe_connections: usize,
    /// The most a probe-reserve connection lives: its one request and its
    /// answer. A kubelet's probe times out at 1 s by default.
    pub probe_timeout: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            max_connections: 4,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
            // A liveness and a readiness probe at once.
            probe_connections: 2,
            probe_timeout: Duration::from_secs(1),
        }
    }
}

/// The admin listener's flags (`--stats` names its address).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct AdminArgs {
    /// /stats connections served at once; past them a connection takes a
    /// probe-reserve place (--stats-probe-connections).
    #[arg(long, default_value_t = AdminLimits::default().max_connections,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub stats_max_connections: usize,
    /// Time a /stats connection has to send its request head (and the most
    /// it may idle between requests).
    #[arg(long, default_value_t = FlagDuration(AdminLimits::default().header_timeout))]
    pub stats_header_timeout: FlagDuration,
    /// The most one /stats connection lives, whatever it does.
    #[arg(long, default_value_t = FlagDuration(AdminLimits::default().connection_timeout))]
    pub stats_connection_timeout: FlagDuration,
    /// Connections past --stats-max-connections answered for /healthz and
    /// /readyz only (anything else 503); past these the oldest is closed.
    #[arg(long, default_value_t = AdminLimits::default().probe_connections,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub stats_probe_connections: usize,
    /// The most a probe connection past --stats-max-connections lives: one
    /// request and its answer.
    #[arg(long, default_value_t = FlagDuration(AdminLimits::default().probe_timeout))]
    pub stats_probe_timeout: FlagDuration,
}

impl Default for AdminArgs {
    fn default() -> Self {
        let limits = AdminLimits::default();
        Self {
            stats_max_connections: limits.max_connections,
            stats_header_timeout: FlagDuration(limits.header_timeout),
            stats_connection_timeout: FlagDuration(limits.connection_timeout),
            stats_probe_connections: limits.probe_connections,
            stats_probe_timeout: FlagDuration(limits.probe_timeout),
        }
    }
}

impl AdminArgs {
    pub fn limits(&self) -> AdminLimits {
        AdminLimits {
            max_connections: self.stats_max_connections,
            header_timeout: self.stats_header_timeout.0,
            connection_timeout: self.stats_connection_timeout.0,
            probe_connections: self.stats_probe_connections,
            probe_timeout: self.stats_probe_timeout.0,
        }
    }
}

/// What the admin listener counts: its accepts, and its probe reserve.
#[derive(Debug, Default)]
pub struct AdminCounters {
    pub listener: ListenerCounters,
    probe_connections: AtomicU64,
    probe_evicted: AtomicU64,
}

/// What [`AdminCounters`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdminStats {
    #[serde(flatten)]
    pub listener: ListenerStats,
    /// Connections taken into the probe reserve: every /stats connection
    /// was held.
    pub probe_connections_total: u64,
    /// Probe-reserve connections closed to make room for a newer one.
    pub probe_evicted_total: u64,
}

impl AdminCounters {
    pub fn stats(&self) -> AdminStats {
        AdminStats {
            listener: self.listener.stats(),
            probe_connections_total: self.probe_connections.load(Ordering::Relaxed),
            probe_evicted_total: self.probe_evicted.load(Ordering::Relaxed),
        }
    }
}

/// Serves `answer` on `listener` until `cancel`, then closes its
/// connections and waits for them. `stats` counts what was accepted.
///
/// The listener itself is uncapped: each connection takes a /stats place
/// or a probe-reserve place (closing the oldest there), so what is held
/// stays within the two caps while a probe never waits in the backlog
/// behind connections that hold every /stats place.
pub async fn serve<A>(
    listener: TcpListener,
    limits: AdminLimits,
    counters: &AdminCounters,
    answer: A,
    cancel: CancellationToken,
) where
    A: Fn(&Request) -> Response + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let places = Arc::new(Semaphore::new(limits.max_connections));
    // One source for all (local peers): no per-source cap, so at the
    // total the oldest goes, whoever it is.
    let probes = PreAuthGate::new(PreAuthLimits {
        total: limits.probe_connections,
        per_source: usize::MAX,
    });
    let mut listener = Listener::new(listener, "admin");
    listener
        .serve(&cancel, &counters.listener, |tcp, _| {
            let (answer, cancel) = (answer.clone(), cancel.clone());
            let (place, probe) = match places.clone().try_acquire_owned() {
                Ok(place) => (Some(place), None),
                Err(_) => {
                    counters.probe_connections.fetch_add(1, Ordering::Relaxed);
                    let before = probes.stats().evicted_total;
                    let probe = probes.admit(IpAddr::V4(Ipv4Addr::UNSPECIFIED))?;
                    let evicted = probes.stats().evicted_total - before;
                    counters.probe_evicted.fetch_add(evicted, Ordering::Relaxed);
                    (None, Some(probe))
                }
            };
            Some(async move {
                let probe_only = probe.is_some();
                let service = service_fn(move |req: Request| {
                    let answer = answer.clone();
                    async move {
                        Ok::<_, Infallible>(
                            if probe_only && !PROBE_PATHS.contains(&req.uri().path()) {
                                status(503, "busy: every /stats connection is in use\n")
                            } else {
                                answer(&req)
                            },
                        )
                    }
                });
                let (header_timeout, lifetime) = match probe_only {
                    false => (limits.header_timeout, limits.connection_timeout),
                    true => (limits.probe_timeout, limits.probe_timeout),
                };
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    // A probe-reserve place is for one request.
                    .keep_alive(!probe_only)
                    .serve_connection(TokioIo::new(tcp), service);
                let served = async {
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = tokio::time::sleep(lifetime) => {}
                        _ = conn => {}
                    }
                };
                match probe {
                    Some(probe) => {
                        probe.run(served).await;
                    }
                    None => served.await,
                }
                drop(place);
            })
        })
        .await
}

/// What a process's admin listener answers from.
pub trait AdminApp: Send + Sync + 'static {
    /// One snapshot of the process's figures: `/stats` serves it as JSON,
    /// and readers deserialize it as this type.
    type Snapshot: serde::Serialize;

    /// The figures now; with `release`, free pool buffers and free memory
    /// are handed back first, so heap figures are taken the same way every
    /// time.
    fn snapshot(&self, release: bool) -> Self::Snapshot;

    /// A snapshot's figures in the OpenMetrics text format (`/metrics`).
    fn metrics(&self) -> String;

    /// Whether the process takes new work (`/readyz`: 200, else 503 once it
    /// drains); `/healthz` is 200 whenever the process answers.
    fn ready(&self) -> bool;

    /// The admin listener's own figures (part of every snapshot).
    fn admin_counters(&self) -> &Arc<AdminCounters>;
}

/// Serves `app`'s four routes on `listener`, within `limits`, until
/// `cancel`, then closes its connections and waits for them.
pub async fn serve_app<A: AdminApp>(
    listener: TcpListener,
    limits: AdminLimits,
    app: A,
    cancel: CancellationToken,
) {
    let counters = app.admin_counters().clone();
    serve(
        listener,
        limits,
        &counters,
        move |req| answer(&app, req),
        cancel,
    )
    .await
}

/// `app`'s answer to `req`: `/stats`, `/metrics`, `/healthz`, `/readyz`, or
/// 404.
pub fn answer<A: AdminApp>(app: &A, req: &Request) -> Response {
    match req.uri().path() {
        "/stats" => {
            let snapshot = app.snapshot(wants_release(req.uri().query()));
            json(serde_json::to_vec(&snapshot).unwrap_or_default())
        }
        "/metrics" => text(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            app.metrics(),
        ),
        // Alive: the process answers.
        "/healthz" => text("text/plain", "ok\n".into()),
        "/readyz" => {
            if app.ready() {
                text("text/plain", "ready\n".into())
            } else {
                status(503, "draining\n")
            }
        }
        _ => not_found(),
    }
}

/// Whether a request's query asks for free memory to be released before
/// the figures are read: `release=1` (or `trim=1`), as a whole parameter.
pub fn wants_release(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "release=1" || p == "trim=1"))
}

/// A JSON answer.
pub fn json(body: Vec<u8>) -> Response {
    hyper::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// A text answer of `content_type`.
pub fn text(content_type: &'static str, body: String) -> Response {
    hyper::Response::builder()
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// A short plain answer with `status`.
pub fn status(status: u16, body: &'static str) -> Response {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response parts are valid")
}

/// 404 for any path the process does not serve.
pub fn not_found() -> Response {
    hyper::Response::builder()
        .status(404)
        .body(Full::new(Bytes::from_static(b"not found\n")))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: admin\r\n\r\n";

    async fn start(
        limits: AdminLimits,
        body: usize,
    ) -> (std::net::SocketAddr, CancellationToken, Arc<AdminCounters>) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let stats = Arc::new(AdminCounters::default());
        let counted = stats.clone();
        tokio::spawn(async move {
            // `/big` gets `body` bytes, anything else ten.
            let answer = move |req: &Request| {
                let len = if req.uri().path() == "/big" { body } else { 10 };
                json(vec![b'x'; len])
            };
            serve(tcp, limits, &counted, answer, stop).await
        });
        (addr, cancel, stats)
    }

    /// Reads one response head and its `len`-byte body.
    async fn read_answer(s: &mut TcpStream, len: usize) {
        read_status(s, 200, len).await
    }

    /// Reads one response head, which must have `status`, and its
    /// `len`-byte body.
    async fn read_status(s: &mut TcpStream, status: u16, len: usize) {
        let mut raw = Vec::new();
        let mut buf = [0; 4096];
        loop {
            let n = s.read(&mut buf).await.expect("read");
            assert_ne!(n, 0, "closed before the answer: {raw:?}");
            raw.extend_from_slice(&buf[..n]);
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n")
                && raw.len() >= at + 4 + len
            {
                let head = format!("HTTP/1.1 {status}");
                assert!(raw.starts_with(head.as_bytes()), "{raw:?}");
                return;
            }
        }
    }

    async fn closed_by_server(s: &mut TcpStream) {
        let mut buf = [0; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the server closes it")
            .unwrap_or(0);
        assert_eq!(n, 0, "no more bytes");
    }

    #[test]
    fn release_is_asked_by_either_name_and_only_as_a_whole_parameter() {
        assert!(wants_release(Some("release=1")));
        assert!(wants_release(Some("x=2&trim=1")));
        assert!(!wants_release(None));
        assert!(!wants_release(Some("release=10")));
        assert!(!wants_release(Some("norelease=1")));
    }

    #[test]
    fn the_flags_defaults_are_the_limits_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            admin: AdminArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["x"]).expect("parses");
        assert_eq!(cli.admin, AdminArgs::default());
        assert_eq!(cli.admin.limits(), AdminLimits::default());
        let set = <Cli as clap::Parser>::try_parse_from(["x", "--stats-max-connections=9"]);
        assert_eq!(set.expect("parses").admin.limits().max_connections, 9);
        let set = <Cli as clap::Parser>::try_parse_from(["x", "--stats-probe-connections=3"]);
        assert_eq!(set.expect("parses").admin.limits().probe_connections, 3);
        assert!(
            <Cli as clap::Parser>::try_parse_from(["x", "--stats-probe-connections=0"]).is_err()
        );
        assert!(<Cli as clap::Parser>::try_parse_from(["x", "--stats-max-connections=0"]).is_err());
    }

    #[tokio::test]
    async fn probes_are_answered_at_once_while_silent_and_idle_connections_hold_every_stats_place()
    {
        let limits = AdminLimits {
            max_connections: 2,
            header_timeout: Duration::from_secs(3),
            connection_timeout: Duration::from_secs(60),
            probe_connections: 1,
            probe_timeout: Duration::from_secs(30),
        };
        let (addr, cancel, stats) = start(limits, 10).await;
        // One place held by a connection that never sends, one by a
        // keep-alive connection idle after its answer.
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(GET).await.expect("write");
        read_answer(&mut idle, 10).await;
        let started = Instant::now();
        // Past the cap, /stats is busy at once rather than a wait.
        let mut busy = TcpStream::connect(addr).await.expect("connect");
        busy.write_all(GET).await.expect("write");
        read_status(&mut busy, 503, 0).await;
        closed_by_server(&mut busy).await;
        // The reserve's one place taken by a connection that sends
        // nothing: a probe after it is answered, and it is closed.
        let mut squatter = TcpStream::connect(addr).await.expect("connect");
        for path in PROBE_PATHS {
            let mut probe = TcpStream::connect(addr).await.expect("connect");
            let get = format!("GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n");
            probe.write_all(get.as_bytes()).await.expect("write");
            read_answer(&mut probe, 10).await;
            closed_by_server(&mut probe).await;
        }
        closed_by_server(&mut squatter).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "probes waited {:?}, near the header timeout that frees a /stats place",
            started.elapsed()
        );
        let figures = stats.stats();
        assert_eq!(figures.probe_connections_total, 4, "{figures:?}");
        assert!(figures.probe_evicted_total >= 1, "{figures:?}");
        // Once the silent and idle ones time out, /stats is served again.
        closed_by_server(&mut silent).await;
        closed_by_server(&mut idle).await;
        let mut next = TcpStream::connect(addr).await.expect("connect");
        next.write_all(GET).await.expect("write");
        read_answer(&mut next, 10).await;
        assert!(started.elapsed() >= Duration::from_secs(2));
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_silent_probe_connection_is_closed_at_the_probe_timeout() {
        let limits = AdminLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(60),
            connection_timeout: Duration::from_secs(60),
            probe_connections: 2,
            probe_timeout: Duration::from_millis(300),
        };
        let (addr, cancel, stats) = start(limits, 10).await;
        let _holder = TcpStream::connect(addr).await.expect("connect");
        let started = Instant::now();
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        closed_by_server(&mut silent).await;
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "closed after {:?}",
            started.elapsed()
        );
        let figures = stats.stats();
        assert_eq!(
            (figures.probe_connections_total, figures.probe_evicted_total),
            (1, 0)
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_is_closed_at_the_connection_timeout() {
        let limits = AdminLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(60),
            connection_timeout: Duration::from_millis(500),
            ..AdminLimits::default()
        };
        // Far larger than the socket buffers: the answer cannot be written
        // while its reader does not read.
        let body = 64 << 20;
        let (addr, cancel, _) = start(limits, body).await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        stalled
            .write_all(b"GET /big HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await
            .expect("write");
        let started = Instant::now();
        // Past the cap /stats is busy (503) until the stalled one is
        // closed and its place freed; then it is served.
        let served = async {
            loop {
                let mut next = TcpStream::connect(addr).await.expect("connect");
                next.write_all(GET).await.expect("write");
                let mut head = [0; 12];
                next.read_exact(&mut head).await.expect("a status line");
                match &head {
                    b"HTTP/1.1 200" => return,
                    b"HTTP/1.1 503" => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("{other:?}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), served)
            .await
            .expect("served once the stalled one is closed");
        assert!(started.elapsed() >= Duration::from_millis(400));
        let mut rest = Vec::new();
        let _ = stalled.read_to_end(&mut rest).await;
        assert!(rest.len() < body, "the stalled reader got its whole answer");
        cancel.cancel();
    }
}
