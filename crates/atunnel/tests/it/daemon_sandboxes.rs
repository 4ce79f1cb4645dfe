//! `atunnel serve` with real sandboxes (root) at both ends of its life: a
//! process killed with live tunnels is replaced by one that adopts what it
//! left and serves the same actors, bytes both ways through egress and
//! ingress; leftovers no actor claims go after the grace period; two live
//! processes never share a prefix; and SIGTERM with actors holding stuck
//! requests and tunnels ends within the deploy manifest's grace period,
//! leaving no namespace behind.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{carries, dial_from, echo_check};
use atunnel::control::client::connect;
use atunnel::control::daemon::ServeReady;
use atunnel::control::proto::{self, control_client::ControlClient};
use atunnel::leftovers::LeftoverStats;
use atunnel_sandbox::netns::list_prefixed;
use atunnel_sandbox::{NetNs, NsExecutor, require_root};
use atunnel_support::stats_client::fetch_stats;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

/// A destination the sink gateway echoes.
const ECHOED: &str = "192.0.2.10:443";
/// A destination the sink gateway never reads from (its stall service).
const STALLED: &str = "192.0.2.10:13";
/// The port the actors' programs listen on, for ingress.
const PROGRAM_PORT: u16 = 8080;

/// Removes the namespaces named `<prefix>...` when dropped, so a test that
/// fails halfway leaves none behind (a passing one has none left to remove).
struct NetnsSweep(String);

impl Drop for NetnsSweep {
    fn drop(&mut self) {
        for name in list_prefixed(&self.0).unwrap_or_default() {
            let _ = std::process::Command::new("ip")
                .args(["netns", "delete", &name])
                .status();
        }
    }
}

/// What `atunnel serve` is started with: PKI files, the control socket,
/// the namespace prefix.
struct Setup {
    pki: Pki,
    ca: CaFiles,
    ingress: IngressPki,
    dir: tempfile::TempDir,
    socket: PathBuf,
    prefix: String,
    _sweep: NetnsSweep,
}

impl Setup {
    fn new(test: &str) -> Self {
        let pki = Pki::new();
        let dir = tempfile::tempdir().expect("dir");
        let ca = pki.write_ca_files(dir.path());
        let prefix = format!("atnd-{}-{test}-", std::process::id());
        Self {
            pki,
            ca,
            ingress: IngressPki::new(),
            socket: dir.path().join("run/control.sock"),
            dir,
            _sweep: NetnsSweep(prefix.clone()),
            prefix,
        }
    }

    fn command(&self, socket: &Path, extra: &[String]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"));
        cmd.arg("serve")
            .args(self.ca.args())
            .arg("--control-socket")
            .arg(socket)
            .arg("--credential-bundle")
            .arg(self.ingress.bundle_path())
            .arg("--trust-bundle")
            .arg(self.ingress.trust_path())
            .args([
                "--ingress-https=127.0.0.1:0",
                "--ingress-connect=127.0.0.1:0",
                "--resolv-conf=",
                "--netns-prefix",
                &self.prefix,
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn start(&self, extra: &[String]) -> Serve {
        let (child, ready): (_, ServeReady) =
            spawn_ready(self.command(&self.socket, extra).stderr(Stdio::inherit())).await;
        Serve {
            child,
            client: connect(&self.socket),
            ready,
        }
    }
}

struct Serve {
    child: tokio::process::Child,
    ready: ServeReady,
    client: ControlClient<Channel>,
}

impl Serve {
    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            signal,
        )
        .expect("signal");
    }

    async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("atunnel serve still runs {within:?} later"))
            .expect("wait")
    }

    /// PrepareEgress, ServeSandbox and Activate, as the worker brings an
    /// actor up; returns its runtime namespace.
    async fn bring_up(&mut self, actor: &proto::Actor, gw: SocketAddr) -> String {
        self.client
            .prepare_egress(proto::PrepareEgressRequest {
                actor: Some(actor.clone()),
                gateway: Some(proto::Gateway {
                    address: gw.to_string(),
                    server_name: GATEWAY_NAME.into(),
                }),
            })
            .await
            .expect("PrepareEgress");
        let served = self
            .client
            .serve_sandbox(proto::ServeSandboxRequest {
                actor: Some(actor.clone()),
            })
            .await
            .expect("ServeSandbox")
            .into_inner();
        self.client
            .activate(proto::ActivateRequest {
                actor: Some(actor.clone()),
            })
            .await
            .expect("Activate");
        served.runtime_netns
    }

    async fn leftovers(&self) -> LeftoverStats {
        let figures = fetch_stats(self.ready.stats, false).await.expect("/stats");
        figures
            .leftovers
            .expect("/stats has the leftovers' figures")
    }

    fn connect_addr(&self) -> SocketAddr {
        self.ready.ingress.expect("ingress is on").1
    }

    fn https_addr(&self) -> SocketAddr {
        self.ready.ingress.expect("ingress is on").0
    }
}

fn who(name: &str) -> proto::Actor {
    proto::Actor {
        atespace: "team-a".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn echo_sink() -> SinkConfig {
    SinkConfig {
        other_ports: Some(Service::Echo),
        ..SinkConfig::default()
    }
}

/// The namespace a name in /run/netns is bound to (its nsfs inode).
fn ns_inode(name: &str) -> u64 {
    std::fs::metadata(Path::new(atunnel_sandbox::netns::NETNS_DIR).join(name))
        .expect("the namespace's mount point")
        .ino()
}

/// The actor's program: a listener on [`PROGRAM_PORT`] in its runtime
/// namespace, held by the test, so it outlives any atunnel process.
async fn program_in(exec: &NsExecutor, runtime: &str) -> TcpListener {
    let ns = NetNs::open(runtime).expect("the runtime namespace exists");
    let listener = exec
        .run_in(&ns, || {
            atunnel_sandbox::sandbox::listen_tcp(SocketAddr::from(([0, 0, 0, 0], PROGRAM_PORT)))
        })
        .await
        .expect("executor")
        .expect("the program listens");
    TcpListener::from_std(listener).expect("register")
}

/// An egress tunnel from `runtime` to the echo destination, carrying
/// `data` out and back.
async fn egress_echo(exec: &NsExecutor, runtime: &str, data: &[u8]) -> TcpStream {
    let mut s = dial_from(exec, runtime, ECHOED.parse().expect("addr")).await;
    echo_check(&mut s, data).await;
    s
}

/// An ingress CONNECT tunnel to `actor`'s program, bytes both ways.
async fn ingress_both_ways(
    pki: &IngressPki,
    connect: SocketAddr,
    actor: &str,
    program: &TcpListener,
    seed: u64,
) -> (RouterTls, TcpStream) {
    let (mut router, accepted) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(
            h1_tunnel(pki, connect, actor, PROGRAM_PORT),
            program.accept()
        )
    })
    .await
    .expect("ingress reaches the program within 20 s");
    let (mut at_actor, _) = accepted.expect("the program accepts");
    carries(&mut router, &mut at_actor, &random(64 * 1024, seed)).await;
    carries(&mut at_actor, &mut router, &random(64 * 1024, seed + 1)).await;
    (router, at_actor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemon_is_replaced_by_one_that_serves_the_same_actors() {
    require_root("daemon restart test");
    let setup = Setup::new("kill");
    let mut gw = gateway(&setup.pki, echo_sink(), |_| {}).await;
    let exec = NsExecutor::start().expect("executor");
    let mut first = setup.start(&[]).await;
    let (alpha, beta, gamma) = (who("alpha"), who("beta"), who("gamma"));
    let mut runtimes = Vec::new();
    for actor in [&alpha, &beta, &gamma] {
        runtimes.push(first.bring_up(actor, gw.addr).await);
    }
    // Alpha's program runs in its sandbox and has a live ingress tunnel;
    // alpha and beta each have a live egress tunnel.
    let program = program_in(&exec, &runtimes[0]).await;
    let (mut router, _at_actor) =
        ingress_both_ways(&setup.ingress, first.connect_addr(), "alpha", &program, 1).await;
    let mut live = Vec::new();
    for runtime in &runtimes[..2] {
        live.push(egress_echo(&exec, runtime, &random(64 * 1024, 3)).await);
    }
    let inodes: Vec<u64> = runtimes.iter().map(|r| ns_inode(r)).collect();

    first.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = first.exit(Duration::from_secs(10)).await;
    assert!(!killed.success(), "{killed:?}");
    for s in &mut live {
        ends(s, "an egress tunnel of the killed process").await;
    }
    ends(&mut router, "the ingress tunnel of the killed process").await;
    let left = list_prefixed(&setup.prefix).expect("list");
    assert_eq!(
        left.len(),
        6,
        "the crash leaves both namespaces of each sandbox: {left:?}"
    );

    // Its successor, on the same prefix and socket (the kernel released the
    // dead one's lock), finds what it left.
    let mut second = setup.start(&[]).await;
    let leftovers = second.leftovers().await;
    assert_eq!(leftovers.pending, 6, "{leftovers:?}");
    // A third process on the same prefix (its own control socket), while
    // the second lives, refuses to start rather than take the second's
    // sandboxes.
    let other_socket = setup.dir.path().join("run/other.sock");
    let third = tokio::time::timeout(
        Duration::from_secs(30),
        setup.command(&other_socket, &[]).output(),
    )
    .await
    .expect("the third process ends at once")
    .expect("runs");
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(
        !third.status.success() && stderr.contains("another live atunnel holds the lock"),
        "{:?}: {stderr}",
        third.status
    );

    // The worker serves alpha and beta again: the same namespaces, adopted.
    for (i, actor) in [&alpha, &beta].into_iter().enumerate() {
        let runtime = second.bring_up(actor, gw.addr).await;
        assert_eq!(runtime, runtimes[i]);
        assert_eq!(
            ns_inode(&runtime),
            inodes[i],
            "{} keeps its runtime namespace",
            actor.name
        );
    }
    let leftovers = second.leftovers().await;
    assert_eq!(leftovers.adopted_total, 2, "{leftovers:?}");
    assert_eq!(leftovers.pending, 2, "gamma's two wait: {leftovers:?}");
    let (status, metrics) = atunnel_support::stats_client::get(second.ready.stats, "/metrics")
        .await
        .expect("/metrics");
    assert_eq!(status, 200);
    for line in [
        "atunnel_leftovers_adopted_total 2",
        "atunnel_leftovers_pending 2",
        "atunnel_leftovers_removed_total 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in {metrics}"
        );
    }
    // Bytes both ways through each adopted sandbox's egress...
    while gw.seen.try_recv().is_ok() {}
    for (i, runtime) in runtimes[..2].iter().enumerate() {
        let mut s = egress_echo(&exec, runtime, &random(256 * 1024, 10 + i as u64)).await;
        let seen = tokio::time::timeout(Duration::from_secs(10), gw.seen.recv())
            .await
            .expect("the gateway saw the tunnel")
            .expect("gateway running");
        assert_eq!(seen.authority, ECHOED);
        assert_eq!(seen.identity.actor_name, ["alpha", "beta"][i]);
        s.shutdown().await.expect("close");
    }
    // ...and through ingress to the program that ran through the crash.
    let (mut router, mut at_actor) =
        ingress_both_ways(&setup.ingress, second.connect_addr(), "alpha", &program, 20).await;

    // A clean shutdown leaves no namespace under the prefix: the served
    // sandboxes are closed, gamma's unclaimed pair removed.
    second.signal(nix::sys::signal::Signal::SIGTERM);
    let exit = second.exit(Duration::from_secs(30)).await;
    assert!(exit.success(), "{exit:?}");
    ends(&mut router, "the ingress tunnel at shutdown").await;
    ends(&mut at_actor, "the program's side at shutdown").await;
    assert_eq!(
        list_prefixed(&setup.prefix).expect("list"),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_no_actor_claims_are_removed_after_the_grace_period() {
    require_root("leftover grace test");
    let setup = Setup::new("grace");
    let exec = NsExecutor::start().expect("executor");
    // An earlier process's sandbox, and a mount point it never mounted.
    let p = &setup.prefix;
    exec.create(&format!("{p}uid-x")).await.expect("namespace");
    exec.create(&format!("{p}uid-x-at"))
        .await
        .expect("namespace");
    std::fs::write(
        Path::new(atunnel_sandbox::netns::NETNS_DIR).join(format!("{p}uid-y")),
        b"",
    )
    .expect("a stale mount point");
    let mut serve = setup.start(&["--netns-leftover-grace=3s".into()]).await;
    let leftovers = serve.leftovers().await;
    assert_eq!(
        leftovers.pending, 3,
        "not removed before the grace period: {leftovers:?}"
    );
    assert_eq!(list_prefixed(p).expect("list").len(), 3);
    let started = Instant::now();
    loop {
        let leftovers = serve.leftovers().await;
        if leftovers.removed_total == 3 {
            assert_eq!(leftovers.pending, 0, "{leftovers:?}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "leftovers not removed: {leftovers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list_prefixed(p).expect("list"), Vec::<String>::new());
    serve.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(serve.exit(Duration::from_secs(30)).await.success());
}

/// The deploy manifest's terminationGracePeriodSeconds and the
/// drain-timeout its config sets.
fn manifest_grace_and_drain() -> (Duration, String) {
    use yaml_rust2::YamlLoader;
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/atunnel.yaml");
    let docs = YamlLoader::load_from_str(&std::fs::read_to_string(path).expect("the manifest"))
        .expect("YAML");
    let of = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let grace = of("DaemonSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds");
    let config: toml::Table = of("ConfigMap")["data"]["atunnel.toml"]
        .as_str()
        .expect("atunnel.toml")
        .parse()
        .expect("TOML");
    let drain = config["drain-timeout"]
        .as_str()
        .expect("drain-timeout")
        .to_string();
    (
        Duration::from_secs(u64::try_from(grace).expect("positive")),
        drain,
    )
}

/// A TCP proxy to `to` that, once `freeze` is cancelled, stops reading
/// either side and holds its connections open: a gateway that hangs.
async fn freezable_proxy(
    to: SocketAddr,
    freeze: tokio_util::sync::CancellationToken,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut a, _)) = listener.accept().await {
            let freeze = freeze.clone();
            tokio::spawn(async move {
                let Ok(mut b) = TcpStream::connect(to).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                    _ = freeze.cancelled() => {
                        // Held, never read again, closed only when the test ends.
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    });
    addr
}

/// Writes to `s` until a write fails (it blocks once the far end stops
/// reading and every buffer on the way is full).
fn write_until_stuck(
    mut s: impl AsyncWriteExt + Unpin + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        while s.write_all(&chunk).await.is_ok() {}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stuck_requests_and_tunnels_ends_within_the_manifests_grace_period() {
    require_root("daemon shutdown test");
    const ACTORS: usize = 4;
    const HUNG: usize = 5;
    let (grace, drain) = manifest_grace_and_drain();
    let setup = Setup::new("term");
    let gw = gateway(&setup.pki, echo_sink(), |_| {}).await;
    let exec = NsExecutor::start().expect("executor");
    let mut serve = setup.start(&[format!("--drain-timeout={drain}")]).await;
    let mut held = Vec::new();
    let mut writers = Vec::new();
    for i in 0..ACTORS {
        let name = format!("a{i}");
        let runtime = serve.bring_up(&who(&name), gw.addr).await;
        let program = program_in(&exec, &runtime).await;
        // An ingress CONNECT tunnel whose actor never reads...
        let (router, accepted) = tokio::join!(
            h1_tunnel(&setup.ingress, serve.connect_addr(), &name, PROGRAM_PORT),
            program.accept()
        );
        held.push(accepted.expect("the program accepts the tunnel").0);
        writers.push(write_until_stuck(router));
        // ...an ingress request it never answers...
        let mut request = router_tls(
            &setup.ingress,
            serve.https_addr(),
            None,
            None,
            &[b"http/1.1"],
        )
        .await
        .expect("TLS to ingress HTTPS");
        request
            .write_all(
                format!(
                    "POST / HTTP/1.1\r\nHost: app\r\nate-target-actor: team-a/{name}\r\nX-Ate-Target-Port: {PROGRAM_PORT}\r\ncontent-length: 1000000000\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .expect("request head");
        let (accepted, _) = program.accept().await.expect("ingress dials the program");
        held.push(accepted);
        writers.push(write_until_stuck(request));
        // ...and an egress tunnel whose destination never reads.
        let up = dial_from(&exec, &runtime, STALLED.parse().expect("addr")).await;
        writers.push(write_until_stuck(up));
    }
    // More actors whose gateway hangs with their tunnels open: each one's
    // close waits for its gateway connection (bounded), and enough of them
    // closed one after another would outlast the grace period.
    let freeze = tokio_util::sync::CancellationToken::new();
    let hung_gateway = freezable_proxy(gw.addr, freeze.clone()).await;
    let mut hung = Vec::new();
    for i in 0..HUNG {
        let runtime = serve
            .bring_up(&who(&format!("hung{i}")), hung_gateway)
            .await;
        hung.push(egress_echo(&exec, &runtime, &random(1024, 5)).await);
    }
    freeze.cancel();
    writers.extend(hung.into_iter().map(write_until_stuck));
    let stats = fetch_stats(serve.ready.stats, false).await.expect("/stats");
    assert_eq!(
        stats.egress.map(|e| e.tunnels_open),
        Some((ACTORS + HUNG) as u64),
        "{stats:?}"
    );

    let started = Instant::now();
    serve.signal(nix::sys::signal::Signal::SIGTERM);
    let exit = serve.exit(grace + Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(exit.success(), "{exit:?}");
    assert!(
        took < grace,
        "SIGTERM to exit took {took:?}, past the manifest's grace period of {grace:?} (drain {drain})"
    );
    eprintln!("SIGTERM to exit: {took:?} (grace {grace:?}, drain {drain})");
    assert_eq!(
        list_prefixed(&setup.prefix).expect("list"),
        Vec::<String>::new()
    );
    for w in writers {
        w.abort();
    }
}
