//! An exhausted descriptor table (EMFILE) has a defined outcome on every
//! listener:
//!
//! - One free descriptor, warm gateway pool: the accepted socket takes it;
//!   the tunnel is a stream on the pooled HTTP/2 connection and needs no
//!   other, so it carries bytes.
//! - No free descriptor: accept fails and the accept loop backs off (50 ms)
//!   rather than spin. The connection waits in the kernel's backlog: its
//!   peer sees neither bytes nor a close, and once descriptors are free it
//!   is accepted and carries what it sent while waiting.
//! - One free descriptor, no gateway connection yet: the actor's connection
//!   is accepted but the gateway cannot be dialled. It is closed with no
//!   bytes and counted in `open_failed_total`, like any failed open; the
//!   next connection, with descriptors free, works.
//! - The ingress listeners (CONNECT and HTTPS), with no free descriptor: as
//!   above, the router's connections wait in the backlog and are served
//!   afterwards.
//!
//! The soft RLIMIT_NOFILE is per process, so every scenario runs in turn in
//! this binary's only test.

use atunnel_support::prelude::*;
use std::fs::File;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atunnel::egress::{Egress, EgressStats};
use atunnel_identity::clock::Clock;
use nix::errno::Errno;
use nix::sys::resource::{Resource, UsageWho, getrlimit, getrusage, setrlimit};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long "nothing happens" is watched: there is no event for absence.
const QUIET: Duration = Duration::from_millis(500);
/// The accept loops' pause after a failed accept.
const BACKOFF: Duration = Duration::from_millis(50);
/// A spinning accept loop takes a whole core; a backing-off one, next to none.
const MAX_CPU_SHARE: f64 = 0.3;
const EMFILE: &str = "os error 24";

/// Descriptors held to fill the process's table, under a soft
/// RLIMIT_NOFILE lowered to just above the highest descriptor open (so
/// filling takes dozens, not 20,000). Dropping it, on a panic too, closes
/// them and restores the limit.
struct Exhaustion {
    held: Vec<File>,
    original_soft: u64,
    hard: u64,
}

impl Exhaustion {
    /// Room above the highest descriptor open now, for the scenarios'
    /// connections.
    const HEADROOM: u64 = 64;

    fn new() -> Self {
        let (original_soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        let highest = atunnel_host::numbered_entries::<u64>("/proc/self/fd")
            .expect("/proc/self/fd")
            .map(|(fd, _)| fd)
            .max()
            .expect("descriptors are open");
        let soft = highest + 1 + Self::HEADROOM;
        assert!(soft <= original_soft, "the limit is already lower");
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).expect("lower RLIMIT_NOFILE");
        Self {
            held: Vec::with_capacity(soft as usize),
            original_soft,
            hard,
        }
    }

    /// Opens descriptors until `open` fails with EMFILE, so none is free;
    /// returns how many it took.
    fn fill(&mut self) -> usize {
        let before = self.held.len();
        loop {
            match File::open("/dev/null") {
                Ok(f) => self.held.push(f),
                Err(e) if e.raw_os_error() == Some(Errno::EMFILE as i32) => {
                    return self.held.len() - before;
                }
                Err(e) => panic!("filling the descriptor table: {e}"),
            }
        }
    }

    /// Frees exactly `n` descriptors.
    fn release(&mut self, n: usize) {
        assert!(n <= self.held.len(), "only {} held", self.held.len());
        self.held.truncate(self.held.len() - n);
    }

    fn release_all(&mut self) {
        self.held.clear();
    }
}

impl Drop for Exhaustion {
    fn drop(&mut self) {
        self.held.clear();
        // No panic in a drop that may run while unwinding.
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, self.original_soft, self.hard) {
            eprintln!("restoring RLIMIT_NOFILE: {e}");
        }
    }
}

/// The process's warnings, kept in memory: logging needs no descriptor.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    fn install() -> Self {
        let warnings = Self::default();
        let writer = warnings.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        warnings
    }

    fn lines(&self, message: &str) -> Vec<String> {
        let text = self.0.lock().expect("log lock");
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| l.contains(message))
            .map(str::to_owned)
            .collect()
    }
}

/// User and system CPU time of the whole process.
fn cpu_time() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    [usage.user_time(), usage.system_time()]
        .iter()
        .map(|t| Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64))
        .sum()
}

/// `msg` comes back through `s`'s tunnel intact (it was written already).
async fn reads_back(s: &mut TcpStream, msg: &[u8], what: &str) {
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .unwrap_or_else(|_| panic!("{what}: no echo within 10 s"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(got == msg, "{what}: echo corrupted");
}

async fn echoes(s: &mut TcpStream, msg: &[u8], what: &str) {
    s.write_all(msg)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    reads_back(s, msg, what).await;
}

/// With no free descriptor, `s` (connected, not accepted) gets no byte and
/// no close for [`QUIET`], while the accept loop logs `accept_failed` with
/// EMFILE at the back-off's pace: it retries, and neither spins (by its
/// count of attempts and by the process's CPU time) nor gives up.
async fn waits_in_the_backlog(
    s: &mut TcpStream,
    warnings: &Warnings,
    accept_failed: &str,
    what: &str,
) {
    let failed_before = warnings.lines(accept_failed).len();
    let (cpu, start) = (cpu_time(), Instant::now());
    let mut byte = [0u8; 1];
    match tokio::time::timeout(QUIET, s.read(&mut byte)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("{what}: closed while no descriptor was free"),
        Ok(Ok(_)) => panic!("{what}: got bytes while no descriptor was free"),
        Ok(Err(e)) => panic!("{what}: {e} while no descriptor was free"),
    }
    let cpu_share = (cpu_time() - cpu).as_secs_f64() / start.elapsed().as_secs_f64();
    let failed = warnings.lines(accept_failed);
    let attempts = failed.len() - failed_before;
    let most = (start.elapsed().as_millis() / BACKOFF.as_millis()) as usize + 2;
    assert!(
        (2..=most).contains(&attempts),
        "{what}: {attempts} failed accepts in {:?} (2 to {most} with a {BACKOFF:?} back-off)",
        start.elapsed()
    );
    assert!(
        failed[failed_before..].iter().all(|l| l.contains(EMFILE)),
        "{what}: {:?}",
        &failed[failed_before..]
    );
    assert!(
        cpu_share < MAX_CPU_SHARE,
        "{what}: the process used {:.0}% of a core while exhausted",
        cpu_share * 100.0
    );
}

/// `before` and one more tunnel, opened and still open.
/// `before` with one more tunnel open, its open counted in the latency
/// histogram `now` shows (which bucket depends on the host's speed).
fn one_more_open(before: EgressStats, now: &EgressStats) -> EgressStats {
    assert_eq!(
        now.open_latency.count,
        before.open_latency.count + 1,
        "the open is in the histogram"
    );
    EgressStats {
        tunnels_open: before.tunnels_open + 1,
        tunnels_total: before.tunnels_total + 1,
        tunnels_ipv4_total: before.tunnels_ipv4_total + 1,
        open_latency: now.open_latency,
        ..before
    }
}

/// The egress scenarios, each on a table filled but for the descriptors
/// it leaves free, watching the egress's figures and warnings.
struct EgressScenes<'a> {
    table: &'a mut Exhaustion,
    egress: &'a Egress,
    warnings: &'a Warnings,
}

impl EgressScenes<'_> {
    /// The egress's figures are `before`'s with one more tunnel open.
    fn assert_one_more_open(&self, before: EgressStats) {
        let now = self.egress.stats();
        assert_eq!(now, one_more_open(before, &now));
    }

    /// Fills the table but for `free` descriptors and connects `client`
    /// (made before, so connecting it takes none) to `listener`; the
    /// egress's figures from before.
    async fn connect_with_free(
        &mut self,
        free: usize,
        client: TcpSocket,
        listener: SocketAddr,
    ) -> (EgressStats, TcpStream) {
        self.table.fill();
        let before = self.egress.stats();
        self.table.release(free);
        // The kernel completes the handshake; accepting it is atunnel's part.
        let s = client.connect(listener).await.expect("connect");
        (before, s)
    }

    /// Exactly one free descriptor and a pooled gateway connection: the
    /// accepted socket takes the descriptor and the tunnel carries bytes.
    async fn one_free_descriptor_serves_a_warm_tunnel(
        &mut self,
        client: TcpSocket,
        listener: SocketAddr,
    ) -> TcpStream {
        let (before, mut s) = self.connect_with_free(1, client, listener).await;
        echoes(
            &mut s,
            &random(64 << 10, 1),
            "warm tunnel, one free descriptor",
        )
        .await;
        assert_eq!(self.table.fill(), 0, "the tunnel holds its accepted socket");
        self.assert_one_more_open(before);
        s
    }

    /// No free descriptor: the connection waits unaccepted, then is served,
    /// with the bytes it sent meanwhile.
    async fn no_free_descriptor_leaves_the_connection_in_the_backlog(
        &mut self,
        client: TcpSocket,
        listener: SocketAddr,
    ) -> TcpStream {
        let (before, mut s) = self.connect_with_free(0, client, listener).await;
        let early = random(16 << 10, 2);
        s.write_all(&early).await.expect("write while unaccepted");
        waits_in_the_backlog(
            &mut s,
            self.warnings,
            "listener=\"egress\"",
            "egress, no free descriptor",
        )
        .await;
        assert_eq!(self.egress.stats(), before, "nothing admitted or refused");
        self.table.release(4);
        reads_back(&mut s, &early, "bytes sent while unaccepted").await;
        echoes(&mut s, b"accepted from the backlog", "after release").await;
        self.assert_one_more_open(before);
        s
    }

    /// One free descriptor and no gateway connection yet: accepted, but the
    /// dial fails; the connection is closed with no bytes, a failed open.
    async fn no_descriptor_to_dial_the_gateway_fails_the_open(
        &mut self,
        client: TcpSocket,
        listener: SocketAddr,
    ) -> TcpStream {
        let (before, mut s) = self.connect_with_free(1, client, listener).await;
        let mut got = Vec::new();
        // A reset is a close too; either way no byte may arrive.
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("closed within 10 s");
        assert!(got.is_empty(), "{} bytes on a failed open", got.len());
        let after_failed = EgressStats {
            tunnels_total: before.tunnels_total + 1,
            tunnels_ipv4_total: before.tunnels_ipv4_total + 1,
            open_failed_total: before.open_failed_total + 1,
            ..before
        };
        assert_eq!(self.egress.stats(), after_failed);
        let failed = self.warnings.lines("failed to open egress tunnel");
        assert!(
            failed.len() == 1 && failed[0].contains(EMFILE),
            "{failed:?}"
        );

        self.table.release_all();
        let mut again = TcpStream::connect(listener).await.expect("connect");
        echoes(
            &mut again,
            b"descriptors free again",
            "cold tunnel after release",
        )
        .await;
        self.assert_one_more_open(after_failed);
        again
    }
}

/// What the HTTP actor behind the ingress answers.
const ACTOR_ANSWER: &str = "served after the backlog";

/// No free descriptor: the router's connections to both ingress listeners
/// wait unaccepted, then do TLS and a CONNECT (relayed to the echo actor)
/// and a request (answered by the HTTP actor).
async fn ingress_connections_wait_in_the_backlog(
    table: &mut Exhaustion,
    [connect_client, https_client]: [TcpSocket; 2],
    pki: &IngressPki,
    running: &RunningIngress,
    warnings: &Warnings,
) {
    table.fill();
    let mut connect = connect_client
        .connect(running.connect)
        .await
        .expect("connect");
    let mut https = https_client.connect(running.https).await.expect("connect");
    waits_in_the_backlog(
        &mut connect,
        warnings,
        "listener=\"connect\"",
        "ingress CONNECT, no free descriptor",
    )
    .await;
    waits_in_the_backlog(
        &mut https,
        warnings,
        "listener=\"ingress-https\"",
        "ingress HTTPS, no free descriptor",
    )
    .await;
    table.release_all();

    let mut tls = router_tls_over(pki, connect).await;
    tls.write_all(
        b"CONNECT actor:8080 HTTP/1.1\r\nHost: actor:8080\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await
    .expect("CONNECT");
    let head = atunnel_connect::http1::read_head(&mut tls)
        .await
        .expect("answer");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let data = random(64 << 10, 3);
    tls.write_all(&data).await.expect("write");
    tls.shutdown().await.expect("close_notify");
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut back))
        .await
        .expect("the actor ends within 10 s")
        .expect("read");
    assert!(back == data, "ingress echo corrupted");

    let mut tls = router_tls_over(pki, https).await;
    tls.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: team-a/alpha\r\n\r\n")
        .await
        .expect("request");
    let head = atunnel_connect::http1::read_head(&mut tls)
        .await
        .expect("answer");
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = vec![0u8; ACTOR_ANSWER.len()];
    tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut body))
        .await
        .expect("the body within 10 s")
        .expect("read");
    assert_eq!(body, ACTOR_ANSWER.as_bytes());
}

/// TLS as the router over an already connected `tcp`.
async fn router_tls_over(
    pki: &IngressPki,
    tcp: TcpStream,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let cfg = mtls_client_config(
        pki.pod_ca.cert_der(),
        pki.router.chain.clone(),
        pki.router.key(),
        rustls::DEFAULT_VERSIONS,
        &[b"http/1.1"],
    );
    tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from(WORKER_NAME).expect("name"), tcp)
        .await
        .expect("TLS once accepted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_descriptor_table_has_a_defined_outcome() {
    let warnings = Warnings::install();
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let egress = egress();
    let cancel = CancellationToken::new();
    let echo = SINK_ECHO.parse().expect("addr");
    let (warm, cold) = (actor("warm"), actor("cold"));
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let warm_listener = listen(&egress, &warm.uid, echo, &cancel).await;
    let cold_listener = listen(&egress, &cold.uid, echo, &cancel).await;
    for a in [&warm, &cold] {
        let prepared = prepare(&pki, gw.addr, a.clone(), source.clone()).await;
        egress.activate(&a.uid, prepared).expect("activate");
    }
    let ingress_pki = IngressPki::new();
    let running = ingress(&ingress_pki).await;
    let http_actor = http1_actor(|_| async {
        http::Response::new(http_body_util::Full::new(bytes::Bytes::from(ACTOR_ANSWER)))
    })
    .await;
    running.activate_alpha(&[(8080, echo_server().await.port()), (80, http_actor.port())]);

    // The warm actor's HTTP/2 gateway connection, kept by an open tunnel.
    let mut first = TcpStream::connect(warm_listener).await.expect("connect");
    echoes(&mut first, b"warm", "first tunnel").await;

    // Every client's socket exists before the table fills: connecting an
    // existing socket takes no descriptor.
    let [
        one_free,
        none_free,
        cold_client,
        router_connect,
        router_https,
    ] = [(); 5].map(|_| TcpSocket::new_v4().expect("socket"));
    let mut table = Exhaustion::new();
    let mut scenes = EgressScenes {
        table: &mut table,
        egress: &egress,
        warnings: &warnings,
    };
    let _one = scenes
        .one_free_descriptor_serves_a_warm_tunnel(one_free, warm_listener)
        .await;
    let _pending = scenes
        .no_free_descriptor_leaves_the_connection_in_the_backlog(none_free, warm_listener)
        .await;
    let _cold = scenes
        .no_descriptor_to_dial_the_gateway_fails_the_open(cold_client, cold_listener)
        .await;
    ingress_connections_wait_in_the_backlog(
        &mut table,
        [router_connect, router_https],
        &ingress_pki,
        &running,
        &warnings,
    )
    .await;
    drop(table);
    echoes(&mut first, b"still open", "first tunnel, at the end").await;
}
