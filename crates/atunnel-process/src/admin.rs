//! The admin listener every process may serve (`/stats` today): HTTP/1.1 on
//! a local address, with a bound on each resource a local peer can make it
//! hold. One server for the tunnel and the gateway; each passes the
//! function that answers its requests.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use atunnel_core::{Listener, ListenerStats};
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

/// Bounds of the admin listener. A reader or two use it; anything past the
/// caps waits in the backlog, so a local peer that opens connections and
/// sends nothing, or never reads its answer, holds at most
/// `max_connections` tasks, each for at most `connection_timeout`.
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
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            max_connections: 4,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// The admin listener's flags (`--stats` names its address).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct AdminArgs {
    /// /stats connections served at once; more wait in the backlog.
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
}

impl Default for AdminArgs {
    fn default() -> Self {
        let limits = AdminLimits::default();
        Self {
            stats_max_connections: limits.max_connections,
            stats_header_timeout: FlagDuration(limits.header_timeout),
            stats_connection_timeout: FlagDuration(limits.connection_timeout),
        }
    }
}

impl AdminArgs {
    pub fn limits(&self) -> AdminLimits {
        AdminLimits {
            max_connections: self.stats_max_connections,
            header_timeout: self.stats_header_timeout.0,
            connection_timeout: self.stats_connection_timeout.0,
        }
    }
}

/// Serves `answer` on `listener` until `cancel`, then closes its
/// connections and waits for them. `stats` counts what was accepted.
pub async fn serve<A>(
    listener: TcpListener,
    limits: AdminLimits,
    stats: &ListenerStats,
    answer: A,
    cancel: CancellationToken,
) where
    A: Fn(&Request) -> Response + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let mut listener =
        Listener::new(listener, "admin").with_cap(Arc::new(Semaphore::new(limits.max_connections)));
    listener
        .serve(&cancel, stats, |tcp, _| {
            let (answer, cancel) = (answer.clone(), cancel.clone());
            Some(async move {
                let service = service_fn(move |req: Request| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(&req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout)
                    .serve_connection(TokioIo::new(tcp), service);
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(limits.connection_timeout) => {}
                    _ = conn => {}
                }
            })
        })
        .await
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

    async fn start(limits: AdminLimits, body: usize) -> (std::net::SocketAddr, CancellationToken) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let stats = ListenerStats::default();
            // `/big` gets `body` bytes, anything else ten.
            let answer = move |req: &Request| {
                let len = if req.uri().path() == "/big" { body } else { 10 };
                json(vec![b'x'; len])
            };
            serve(tcp, limits, &stats, answer, stop).await
        });
        (addr, cancel)
    }

    /// Reads one response head and its `len`-byte body.
    async fn read_answer(s: &mut TcpStream, len: usize) {
        let mut raw = Vec::new();
        let mut buf = [0; 4096];
        loop {
            let n = s.read(&mut buf).await.expect("read");
            assert_ne!(n, 0, "closed before the answer: {raw:?}");
            raw.extend_from_slice(&buf[..n]);
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n")
                && raw.len() >= at + 4 + len
            {
                assert!(raw.starts_with(b"HTTP/1.1 200"), "{raw:?}");
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
        assert!(<Cli as clap::Parser>::try_parse_from(["x", "--stats-max-connections=0"]).is_err());
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_until_silent_and_idle_ones_time_out() {
        let limits = AdminLimits {
            max_connections: 2,
            header_timeout: Duration::from_millis(400),
            connection_timeout: Duration::from_secs(60),
        };
        let (addr, cancel) = start(limits, 10).await;
        // One slot held by a connection that never sends, one by a
        // keep-alive connection idle after its answer.
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(GET).await.expect("write");
        read_answer(&mut idle, 10).await;
        let started = Instant::now();
        let mut waiting = TcpStream::connect(addr).await.expect("connect");
        waiting.write_all(GET).await.expect("write");
        tokio::time::timeout(Duration::from_secs(10), read_answer(&mut waiting, 10))
            .await
            .expect("served once a slot is free");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "served past the cap after {:?}",
            started.elapsed()
        );
        closed_by_server(&mut silent).await;
        closed_by_server(&mut idle).await;
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_is_closed_at_the_connection_timeout() {
        let limits = AdminLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(60),
            connection_timeout: Duration::from_millis(500),
        };
        // Far larger than the socket buffers: the answer cannot be written
        // while its reader does not read.
        let body = 64 << 20;
        let (addr, cancel) = start(limits, body).await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        stalled
            .write_all(b"GET /big HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await
            .expect("write");
        let started = Instant::now();
        let mut next = TcpStream::connect(addr).await.expect("connect");
        next.write_all(GET).await.expect("write");
        tokio::time::timeout(Duration::from_secs(20), read_answer(&mut next, 10))
            .await
            .expect("served once the stalled one is closed");
        assert!(started.elapsed() >= Duration::from_millis(400));
        let mut rest = Vec::new();
        let _ = stalled.read_to_end(&mut rest).await;
        assert!(rest.len() < body, "the stalled reader got its whole answer");
        cancel.cancel();
    }
}
