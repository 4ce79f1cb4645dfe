//! The `atunnel` binary as an operator runs it: `/metrics` in the
//! Prometheus text format whose values move with the traffic, `/healthz`
//! and `/readyz` (answered while silent connections hold every /stats
//! place), and SIGTERM draining (stop accepting, let open tunnels
//! finish within `--drain-timeout`, exit 0). A real gateway, real sockets,
//! loopback network (no root).

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use atunnel::host::HostReady;
use atunnel_support::stats_client::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Daemon {
    ready: HostReady,
    child: tokio::process::Child,
    /// The actor's egress listener for the echo destination.
    listener: SocketAddr,
    _gateway: RunningGateway,
    _dir: tempfile::TempDir,
}

async fn start(drain_timeout: &str) -> Daemon {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let dir = tempfile::tempdir().expect("dir");
    let (child, ready): (_, HostReady) = spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .args(["host", "--network=loopback", "--actors=1", "--resolv-conf="])
            .arg(format!("--gateway={}", gw.addr))
            .arg(format!("--gateway-name={GATEWAY_NAME}"))
            .args(pki.write_ca_files(dir.path()).args())
            .arg(format!("--destinations={echo}"))
            .arg(format!("--drain-timeout={drain_timeout}")),
    )
    .await;
    let listener = ready.actors[0].listeners[&echo];
    Daemon {
        ready,
        child,
        listener,
        _gateway: gw,
        _dir: dir,
    }
}

/// A tunnel through the actor's listener, with `data` echoed once.
async fn echoing(listener: SocketAddr, data: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(listener).await.expect("connect");
    s.write_all(data).await.expect("write");
    let mut back = vec![0; data.len()];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(back, data);
    s
}

/// `/metrics`, parsed as a Prometheus scraper would.
async fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let (status, body) = get(addr, "/metrics").await.expect("/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.ends_with("# EOF\n"),
        "an OpenMetrics page ends with # EOF"
    );
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parses")
}

/// The cumulative count of histogram `name`'s bucket `le`.
fn scrape_bucket(scrape: &prometheus_parse::Scrape, name: &str, le: f64) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no histogram {name}"));
    let prometheus_parse::Value::Histogram(buckets) = &sample.value else {
        panic!("{name} is not a histogram: {:?}", sample.value)
    };
    buckets
        .iter()
        .find(|b| b.less_than == le)
        .unwrap_or_else(|| panic!("{name}: no bucket {le}: {buckets:?}"))
        .count
}

/// The value of sample `name` whose labels include `labels`.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_move_with_the_traffic() {
    let d = start("10s").await;
    let admin = d.ready.stats;
    let before = scrape(admin).await;
    let actor = "uid-0";
    assert_eq!(value(&before, "atunnel_egress_tunnels_open", &[]), 0.0);
    let opened_before = value(&before, "atunnel_egress_tunnels_total", &[]);
    let tunnel = echoing(d.listener, b"counted").await;
    let during = scrape(admin).await;
    assert_eq!(value(&during, "atunnel_egress_tunnels_open", &[]), 1.0);
    assert_eq!(
        value(&during, "atunnel_egress_tunnels_total", &[]),
        opened_before + 1.0
    );
    assert!(
        value(&during, "atunnel_egress_actor_tunnels", &[("actor", actor)]) == 1.0,
        "per-actor series"
    );
    assert!(value(&during, "atunnel_process_open_fds", &[]) > 0.0);
    assert!(value(&during, "atunnel_process_resident_memory_bytes", &[]) > 0.0);
    assert_eq!(
        value(&during, "atunnel_egress_open_latency_seconds_count", &[]),
        value(&before, "atunnel_egress_open_latency_seconds_count", &[]) + 1.0,
        "the open is in the latency histogram"
    );
    let inf = scrape_bucket(
        &during,
        "atunnel_egress_open_latency_seconds",
        f64::INFINITY,
    );
    assert_eq!(
        inf,
        value(&during, "atunnel_egress_open_latency_seconds_count", &[])
    );
    // Its bytes are counted once it has ended (both directions closed).
    drop(tunnel);
    let started = Instant::now();
    let after = loop {
        let after = scrape(admin).await;
        if value(&after, "atunnel_egress_tunnels_open", &[]) == 0.0 {
            break after;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the tunnel never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let counted = |name| value(&after, name, &[]) - value(&before, name, &[]);
    assert_eq!(
        counted("atunnel_egress_bytes_up_bytes_total"),
        7.0,
        "\"counted\" went up"
    );
    assert_eq!(
        counted("atunnel_egress_bytes_down_bytes_total"),
        7.0,
        "and came back"
    );
    let (status, body) = get(admin, "/healthz").await.expect("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _) = get(admin, "/readyz").await.expect("/readyz");
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_while_silent_connections_hold_every_stats_place() {
    let d = start("20s").await;
    let admin = d.ready.stats;
    // As many as `--stats-max-connections` (default 4), sending nothing.
    let mut silent = Vec::new();
    for _ in 0..atunnel_process::AdminLimits::default().max_connections {
        silent.push(TcpStream::connect(admin).await.expect("connect"));
    }
    let started = Instant::now();
    let (status, body) = get(admin, "/healthz").await.expect("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = get(admin, "/readyz").await.expect("/readyz");
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    let (status, _) = get(admin, "/stats").await.expect("/stats");
    assert_eq!(status, 503, "/stats past its cap is busy");
    // Well under the 5 s header timeout that would free a /stats place.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_lets_open_tunnels_finish_and_exits_0() {
    let mut d = start("20s").await;
    let admin = d.ready.stats;
    let mut tunnel = echoing(d.listener, b"before").await;
    let pid = nix::unistd::Pid::from_raw(d.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    // Not ready from now on; new tunnels are refused, the open one goes on.
    let started = Instant::now();
    loop {
        let (status, _) = get(admin, "/readyz").await.expect("/readyz while draining");
        if status == 503 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still ready");
        tokio::task::yield_now().await;
    }
    let refused = TcpStream::connect(d.listener).await;
    assert!(refused.is_err(), "a new tunnel was accepted while draining");
    tunnel
        .write_all(b"during")
        .await
        .expect("write while draining");
    let mut back = [0u8; 6];
    tunnel
        .read_exact(&mut back)
        .await
        .expect("echo while draining");
    assert_eq!(&back, b"during");
    // Its end lets the process exit, well before the drain timeout.
    tunnel.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    tunnel.read_to_end(&mut rest).await.expect("a clean end");
    let status = tokio::time::timeout(Duration::from_secs(10), d.child.wait())
        .await
        .expect("exits once the tunnel ended")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_tunnel_still_open_at_the_drain_timeout_and_exits_0() {
    let mut d = start("1s").await;
    let mut tunnel = echoing(d.listener, b"held").await;
    let pid = nix::unistd::Pid::from_raw(d.child.id().expect("pid") as i32);
    let started = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(15), d.child.wait())
        .await
        .expect("exits after the drain timeout")
        .expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // Cut, not ended cleanly: an RST (or at least no more echo).
    let mut buf = [0u8; 8];
    let read = tunnel.read(&mut buf).await;
    assert!(
        matches!(read, Err(_) | Ok(0)),
        "the held tunnel was ended: {read:?}"
    );
}

/// Whether a router with `identity` gets an HTTP answer from ingress HTTPS
/// at `addr` (whose serving certificate `server_ca` signed): its TLS, and
/// its client certificate, were accepted.
async fn router_accepted(
    addr: SocketAddr,
    pki: &IngressPki,
    identity: &atunnel_identity::pki::IssuedCert,
    server_ca: &atunnel_identity::CertificateAuthority,
) -> bool {
    let Ok(mut tls) = router_tls(pki, addr, Some(identity), Some(server_ca), &[b"http/1.1"]).await
    else {
        return false;
    };
    // TLS 1.3 checks the client's certificate after the client is done: a
    // refusal shows on the first exchange.
    let head = "GET / HTTP/1.1\r\nHost: w\r\nate-target-actor: bench/actor-0\r\n\r\n";
    if tls.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(tls.read(&mut buf).await, Ok(n) if n > 0 && buf.starts_with(b"HTTP/1.1"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_trust_bundle_for_new_connections() {
    trust_bundle_reloads(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_trust_bundle_file_is_reloaded_without_a_signal() {
    trust_bundle_reloads(false).await;
}

/// A router of a new CA is admitted once the trust bundle's file holds that
/// CA, after a SIGHUP (`signal`) or by the file's change alone (checked every
/// 100 ms here), and the old CA's router no longer is.
async fn trust_bundle_reloads(signal: bool) {
    let old = IngressPki::new();
    let new = IngressPki::new();
    let gw_pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    let p = |n: &str| dir.path().join(n);
    let trust = p("trust.pem");
    std::fs::copy(old.trust_path(), &trust).expect("the first trust bundle");
    let (child, ready): (_, HostReady) = spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .args(["host", "--network=loopback", "--actors=1", "--resolv-conf="])
            .args(["--gateway=127.0.0.1:1", "--destinations=192.0.2.10:7"])
            .args([
                "--ingress-https=127.0.0.1:0",
                "--ingress-connect=127.0.0.1:0",
            ])
            .args(gw_pki.write_ca_files(dir.path()).args())
            .arg(format!(
                "--credential-bundle={}",
                old.bundle_path().display()
            ))
            .arg(format!("--trust-bundle={}", trust.display()))
            .arg(if signal {
                "--trust-bundle-poll-interval=0"
            } else {
                "--trust-bundle-poll-interval=100ms"
            }),
    )
    .await;
    let (https, _) = ready.ingress.expect("ingress is on");
    assert!(router_accepted(https, &old, &old.router, &old.pod_ca).await);
    assert!(!router_accepted(https, &new, &new.router, &old.pod_ca).await);

    // Replaced by rename, as the kubelet swaps a projected file.
    let next = p("trust.pem.next");
    std::fs::copy(new.trust_path(), &next).expect("the next trust bundle");
    std::fs::rename(&next, &trust).expect("swap the trust bundle");
    if signal {
        let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    }
    // The reload runs when the signal is taken or the change is seen:
    // polled, bounded.
    let started = Instant::now();
    while !router_accepted(https, &new, &new.router, &old.pod_ca).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !router_accepted(https, &old, &old.router, &old.pod_ca).await,
        "the old trust bundle still admits its router"
    );
}
