//! The peers `--compare peers` runs in atunnel's place (root: a namespace
//! of their own): nginx and HAProxy, each started from the configuration
//! `atunnel_bench::peers` writes, do atunnel's ingress HTTPS job. A request
//! as the router (its certificate, HTTP/2) reaches the actor it names and
//! comes back with the actor's body; a client without a certificate never
//! reaches an actor; an actor it does not know gets 421 with
//! `X-Ate-Assignment-Stale`. nginx reaches the actors' program on loopback;
//! HAProxy reaches it as atunnel does, inside a sandbox built as atunnel
//! builds one (veth, nftables), dialling 169.254.17.2 from the sandbox's
//! gateway side: nothing answers there but across the veth.
//!
//! The config routes two actors: actor-1 to a live actor, actor-0 to a
//! port nothing listens on, so that actor-0's 502 (HAProxy: 503) shows
//! each actor is routed to its own backend.
//!
//! HAProxy's egress relay: bytes an actor's program sends from inside its
//! sandbox (redirected as atunnel's egress is) reach the sink's echo over
//! TLS (the far end counts the handshake) and come back intact.
//!
//! Needs `apt-get install nginx haproxy`. README's test command must pass
//! on a machine with nothing but the Rust toolchain, so without them these
//! tests say so and pass, unless `ATUNNEL_REQUIRE_PEERS=1` (`.ci/run` sets
//! it, after installing both): then a missing peer fails its test and names
//! the packages.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use atunnel_bench::peers::{Backend, EgressRelay, Peer, PeerSetup};
use atunnel_sandbox::sandbox::{DEFAULT_EGRESS_PORT, actor_addr};
use atunnel_sandbox::{NetNs, NsExecutor, SandboxNetwork};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;

use common::{namespace_with_loopback, write_pki};

/// The actors' program's answer (`actors --body-bytes` default).
const ACTOR_BODY: [u8; 64] = [b'a'; 64];
/// Where the peer serves the router, inside the test's namespace.
const LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8443);
/// actor-0's backend (nothing listens there) and actor-1's (the actors'
/// program).
const DEAD_PORT: u16 = 18100;
const LIVE_PORT: u16 = 18101;
/// The actors' program's port in a sandbox (`actors --port` default).
const ACTOR_PORT: u16 = 80;
/// Where the egress relay's far end listens: the sink's ports plus this.
const FAR_END_OFFSET: u16 = 7000;

/// A TCP connection from inside `ns`.
async fn connect_in(exec: &NsExecutor, ns: &NetNs, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = exec
        .run_in(ns, move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.set_nonblocking(true)?;
            Ok::<std::net::TcpStream, std::io::Error>(s.into())
        })
        .await
        .map_err(std::io::Error::other)??;
    tokio::net::TcpSocket::from_std_stream(socket)
        .connect(addr)
        .await
}

/// Starts `args` inside `ns`, its output to this test's.
async fn spawn_in(
    exec: &NsExecutor,
    ns: &NetNs,
    args: Vec<String>,
    stdout: Stdio,
) -> tokio::process::Child {
    let runtime = tokio::runtime::Handle::current();
    exec.run_in(ns, move || {
        let _enter = runtime.enter();
        tokio::process::Command::new(&args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(stdout)
            .kill_on_drop(true)
            .spawn()
    })
    .await
    .expect("executor")
    .expect("spawns")
}

/// The router's TLS (its certificate unless `anonymous`), offering h2.
fn router_tls(pki: &Path, anonymous: bool) -> Arc<rustls::ClientConfig> {
    use atunnel_identity::pem_files::{load_certs, load_key, load_roots};
    let roots = load_roots(&pki.join("pod-ca.pem")).expect("pod CA");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let mut cfg = if anonymous {
        builder.with_no_client_auth()
    } else {
        builder
            .with_client_auth_cert(
                load_certs(&pki.join("router.pem")).expect("router cert"),
                load_key(&pki.join("router.key")).expect("router key"),
            )
            .expect("client auth")
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// What the peer answered one request for `actor`: status, the
/// stale-assignment header, the body.
type Answer = (u16, Option<String>, Vec<u8>);

/// One HTTP/2 GET naming `actor`, over a fresh TLS connection from `ns`.
async fn get(
    exec: &NsExecutor,
    ns: &NetNs,
    tls: Arc<rustls::ClientConfig>,
    actor: &str,
) -> Result<Answer, String> {
    let tcp = connect_in(exec, ns, LISTEN)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name =
        rustls::pki_types::ServerName::try_from("worker.bench").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err("the peer did not choose h2".into());
    }
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("https://worker.bench/")
        .header("ate-target-actor", actor)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let stale = resp
        .headers()
        .get("x-ate-assignment-stale")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes()
        .to_vec();
    Ok((status, stale, body))
}

/// The peer's program, or `None` when it is missing and not required
/// (the test then says so and passes).
fn installed(peer: Peer) -> Option<std::path::PathBuf> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the peers run in a namespace of their own; run the tests as root"
    );
    let found = peer.find();
    if found.is_none() {
        let missing = format!(
            "{} is not installed: apt-get install nginx haproxy",
            peer.name()
        );
        assert!(
            std::env::var_os("ATUNNEL_REQUIRE_PEERS").is_none_or(|v| v != "1"),
            "{missing}"
        );
        eprintln!("not run: {missing} (ATUNNEL_REQUIRE_PEERS=1 makes this a failure)");
    }
    found
}

/// A namespace for the test (`name`, loopback up) and, if `sandboxed`, a
/// sandbox built as atunnel builds one (`name-sb`, its gateway side
/// `name-sb-at`); `body` runs with them, then both are removed and every
/// process in the namespace killed, whatever happened.
async fn in_namespace<F, Fut>(name: &str, sandboxed: bool, body: F)
where
    F: FnOnce(NsExecutor, NetNs, Option<SandboxNetwork>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let exec = NsExecutor::start().expect("netns executor");
    let ns = namespace_with_loopback(&exec, name).await;
    let sandbox = if sandboxed {
        let sb = SandboxNetwork::create(&exec, &format!("{name}-sb"), DEFAULT_EGRESS_PORT, true)
            .await
            .expect("sandbox");
        Some(sb)
    } else {
        None
    };
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        body(exec.clone(), ns, sandbox.clone()),
    )
    .await;
    // Whatever happened (a timeout drops the children, and a killed
    // nginx master leaves its worker running): nothing outlives the test.
    kill_processes_in(name);
    let _ = exec.delete(name).await;
    if let Some(sb) = sandbox {
        let _ = sb.destroy(&exec).await;
    }
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{name}: {e}"),
        Err(_) => panic!("{name}: not done within 30 s"),
    }
}

/// Runs `peer` from its written configuration in a namespace of its own in
/// front of one live actor (in a sandbox for a peer that enters them, on
/// loopback for one that cannot), and checks what the router sees.
async fn a_peer_does_atunnels_ingress_job(peer: Peer) {
    let Some(binary) = installed(peer) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = write_pki(dir.path());
    let name = format!("atbpeer-{}-{}", peer.name(), std::process::id() % 100_000);
    in_namespace(
        &name,
        peer.reaches_sandboxes(),
        |exec, ns, sandbox| async move {
            exercise(
                peer,
                &binary,
                &exec,
                &ns,
                sandbox.as_ref(),
                &pki,
                dir.path(),
            )
            .await
        },
    )
    .await;
}

/// The actors' program, started in `ns`, once it says it is ready: in
/// `sandbox` if given, else one loopback actor on [`LIVE_PORT`].
async fn start_actors(
    exec: &NsExecutor,
    ns: &NetNs,
    sandbox: Option<&SandboxNetwork>,
) -> Result<tokio::process::Child, String> {
    let bin = env!("CARGO_BIN_EXE_atunnel-bench");
    let serve = match sandbox {
        Some(sb) => vec![format!("--netns={}", sb.name())],
        None => vec![
            "--loopback-actors=1".into(),
            format!("--loopback-base-port={LIVE_PORT}"),
        ],
    };
    let mut args = vec![bin.to_string(), "actors".into()];
    args.extend(serve);
    let mut actors = spawn_in(exec, ns, args, Stdio::piped()).await;
    let stdout = actors.stdout.take().ok_or("actors without stdout")?;
    let mut ready = String::new();
    BufReader::new(stdout)
        .read_line(&mut ready)
        .await
        .map_err(|e| e.to_string())?;
    if !ready.starts_with("ready") {
        return Err(format!("actors did not start: {ready:?}"));
    }
    Ok(actors)
}

/// The checks; the caller removes the namespaces whatever happens here
/// (the children are killed when dropped).
async fn exercise(
    peer: Peer,
    binary: &Path,
    exec: &NsExecutor,
    ns: &NetNs,
    sandbox: Option<&SandboxNetwork>,
    pki: &Path,
    dir: &Path,
) -> Result<(), String> {
    let actors = start_actors(exec, ns, sandbox).await?;
    let backend = |actor: &str, addr, netns: Option<&NetNs>| Backend {
        actor: actor.into(),
        addr,
        netns: netns.map(|n| n.name().to_string()),
    };
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let backends = match sandbox {
        // Across the sandbox's veth, from its gateway side; actor-0's port
        // has nothing listening in the sandbox.
        Some(sb) => vec![
            backend(
                "bench/actor-0",
                actor_addr(ACTOR_PORT + 1),
                Some(&sb.gateway),
            ),
            backend("bench/actor-1", actor_addr(ACTOR_PORT), Some(&sb.gateway)),
        ],
        None => vec![
            backend("bench/actor-0", local(DEAD_PORT), None),
            backend("bench/actor-1", local(LIVE_PORT), None),
        ],
    };
    let setup = PeerSetup {
        listen: LISTEN,
        cert_bundle: pki.join("worker-credential-bundle.pem"),
        client_ca: pki.join("pod-ca.pem"),
        backends,
        egress: None,
        dir: dir.join("peers"),
    };
    let config = peer.write_config(&setup).map_err(|e| e.to_string())?;
    let proxy = spawn_in(exec, ns, peer.command(binary, &config), Stdio::null()).await;
    let result = check(proxy_ready(proxy, exec, ns, &config).await, exec, ns, pki).await;
    stop(actors).await;
    result
}

/// HAProxy as atunnel's egress: a connection an actor's program makes from
/// inside its sandbox to the sink's echo (192.0.2.10:7) is redirected to
/// HAProxy's frontend in the sandbox's gateway namespace, relayed over TLS
/// (verified against the gateway CA, SNI set) to the far end's echo at
/// port 7 + the offset, and a known pattern comes back intact after the
/// half-close; the far end counts one TLS handshake per connection, the
/// second resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_relays_a_sandboxs_egress_over_tls_to_the_far_end_and_back() {
    let Some(binary) = installed(Peer::Haproxy) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = write_pki(dir.path());
    let name = format!("atbrelay-{}", std::process::id() % 100_000);
    in_namespace(&name, true, |exec, ns, sandbox| async move {
        let sb = sandbox.expect("sandboxed");
        relay(&binary, &exec, &ns, &sb, &pki, dir.path()).await
    })
    .await;
}

async fn relay(
    binary: &Path,
    exec: &NsExecutor,
    ns: &NetNs,
    sb: &SandboxNetwork,
    pki: &Path,
    dir: &Path,
) -> Result<(), String> {
    use atunnel_support::sink_tls;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let far_ip = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let listeners = exec
        .run_in(ns, move || sink_tls::bind(far_ip, FAR_END_OFFSET))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("far end: {e}"))?;
    let tls = sink_tls::server_config(&pki.join("gateway.pem"), &pki.join("gateway.key"))
        .map_err(|e| e.to_string())?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let _stop_far_end = cancel.clone().drop_guard();
    let far =
        sink_tls::spawn(listeners, tls, Default::default(), cancel).map_err(|e| e.to_string())?;
    let setup = PeerSetup {
        listen: LISTEN,
        cert_bundle: pki.join("worker-credential-bundle.pem"),
        client_ca: pki.join("pod-ca.pem"),
        backends: Vec::new(),
        egress: Some(EgressRelay {
            port: sb.egress_port(),
            netns: vec![sb.gateway.name().to_string()],
            far_end: far_ip,
            port_offset: FAR_END_OFFSET,
            server_name: atunnel_support::pki::GATEWAY_NAME.into(),
            ca: pki.join("servicedns-ca.pem"),
        }),
        dir: dir.join("peers"),
    };
    let config = Peer::Haproxy
        .write_config(&setup)
        .map_err(|e| e.to_string())?;
    let proxy = spawn_in(
        exec,
        ns,
        Peer::Haproxy.command(binary, &config),
        Stdio::null(),
    )
    .await;
    let proxy = proxy_ready(proxy, exec, ns, &config).await?;
    let echo: SocketAddr = atunnel_support::gateway::SINK_ECHO
        .parse()
        .map_err(|e| format!("{e}"))?;
    let pattern: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut result = Ok(());
    for round in 0..2 {
        let s = sb
            .connect_from_runtime(exec, echo)
            .await
            .map_err(|e| format!("dial from the sandbox: {e}"))?;
        let (mut r, mut w) = s.into_split();
        let up = pattern.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&up).await?;
            w.shutdown().await
        });
        let mut back = Vec::new();
        let read = r.read_to_end(&mut back).await;
        let wrote = writer.await.map_err(|e| e.to_string())?;
        if let Err(e) = read.and(wrote) {
            result = Err(format!("round {round}: {e}"));
            break;
        }
        if back != pattern {
            result = Err(format!(
                "round {round}: {} bytes came back, not the {} sent",
                back.len(),
                pattern.len()
            ));
            break;
        }
    }
    stop(proxy).await;
    result?;
    // One handshake per connection, so the bytes crossed TLS; HAProxy
    // keeps the first session and resumes it for the second (its default
    // for a server line: the cost scenario's relay does too).
    let (full, resumed) = (far.handshakes.full(), far.handshakes.resumed());
    if (full, resumed) != (1, 1) {
        return Err(format!(
            "the far end saw {full} full and {resumed} resumed handshakes for 2 connections, \
             not 1 and 1"
        ));
    }
    Ok(())
}

/// The proxy once it accepts connections (neither peer says when it is
/// ready), or why it exited.
async fn proxy_ready(
    mut proxy: tokio::process::Child,
    exec: &NsExecutor,
    ns: &NetNs,
    config: &Path,
) -> Result<tokio::process::Child, String> {
    loop {
        if let Some(status) = proxy.try_wait().map_err(|e| e.to_string())? {
            let text = std::fs::read_to_string(config).unwrap_or_default();
            return Err(format!(
                "exited ({status}) with this configuration:\n{text}"
            ));
        }
        if connect_in(exec, ns, LISTEN).await.is_ok() {
            return Ok(proxy);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the router sees through the running `proxy`, which is stopped
/// (SIGTERM) afterwards whatever the outcome.
async fn check(
    proxy: Result<tokio::process::Child, String>,
    exec: &NsExecutor,
    ns: &NetNs,
    pki: &Path,
) -> Result<(), String> {
    let proxy = proxy?;
    let result = requests(exec, ns, pki).await;
    stop(proxy).await;
    result
}

/// The router's requests and the answers each must get.
async fn requests(exec: &NsExecutor, ns: &NetNs, pki: &Path) -> Result<(), String> {
    let router = router_tls(pki, false);
    let (status, _, body) = get(exec, ns, router.clone(), "bench/actor-1").await?;
    if status != 200 || body != ACTOR_BODY {
        return Err(format!(
            "actor-1: {status} {:?}, not the actor's 200",
            String::from_utf8_lossy(&body)
        ));
    }
    // Routed to actor-0's own backend, which is down, not to actor-1's:
    // 502 (nginx, as atunnel) or 503 (HAProxy, once its retries failed).
    let (status, _, body) = get(exec, ns, router.clone(), "bench/actor-0").await?;
    if status != 502 && status != 503 {
        return Err(format!(
            "actor-0 (its backend down): {status} {:?}, not 502 or 503",
            String::from_utf8_lossy(&body)
        ));
    }
    let (status, stale, body) = get(exec, ns, router.clone(), "bench/actor-9").await?;
    if status != 421 || stale.as_deref() != Some("true") || body == ACTOR_BODY {
        return Err(format!(
            "an unknown actor: {status}, stale header {stale:?}, body {:?}",
            String::from_utf8_lossy(&body)
        ));
    }
    // HAProxy fails the handshake; nginx answers 400 after it. Either way
    // the request never reaches an actor.
    match get(exec, ns, router_tls(pki, true), "bench/actor-1").await {
        Err(_) => {}
        Ok((status, _, body)) if !(200..300).contains(&status) && body != ACTOR_BODY => {}
        Ok((status, _, body)) => {
            return Err(format!(
                "a client without a certificate got {status} {:?}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    Ok(())
}

/// SIGKILLs every process in the named namespace (compared by the inode
/// of `/run/netns/<name>` and `/proc/<pid>/ns/net`).
fn kill_processes_in(name: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(ns) = std::fs::metadata(Path::new(atunnel_sandbox::netns::NETNS_DIR).join(name)) else {
        return;
    };
    let Ok(procs) = atunnel_host::numbered_entries::<i32>("/proc") else {
        return;
    };
    for (pid, path) in procs {
        let Ok(m) = std::fs::metadata(path.join("ns/net")) else {
            continue;
        };
        if (m.dev(), m.ino()) == (ns.dev(), ns.ino()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// SIGTERM, and SIGKILL after 5 s: nginx's master stops its worker only
/// when asked (killed, it leaves the worker running).
async fn stop(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_in_atunnels_place_routes_the_routers_requests_by_actor() {
    a_peer_does_atunnels_ingress_job(Peer::Nginx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_in_atunnels_place_routes_the_routers_requests_by_actor() {
    a_peer_does_atunnels_ingress_job(Peer::Haproxy).await;
}
