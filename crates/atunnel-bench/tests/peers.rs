//! The peers `--compare peers` runs in atunnel's place (root: a namespace
//! of their own): nginx and HAProxy, each started from the configuration
//! `atunnel_bench::peers` writes, in front of the actors' program on
//! loopback, do atunnel's ingress HTTPS job. A request as the router (its
//! certificate, HTTP/2) reaches the actor it names and comes back with the
//! actor's body; a client without a certificate never reaches an actor; an
//! actor it does not know gets 421 with `X-Ate-Assignment-Stale`.
//!
//! The config routes two actors: actor-1 to a live loopback actor, actor-0
//! to a port nothing listens on, so that actor-0's 502 (HAProxy: 503)
//! shows each actor is routed to its own backend.
//!
//! Needs `apt-get install nginx haproxy`. README's test command must pass
//! on a machine with nothing but the Rust toolchain, so without them these
//! tests say so and pass, unless `ATUNNEL_REQUIRE_PEERS=1` (`.ci/run` sets
//! it, after installing both): then a missing peer fails its test and names
//! the packages.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use atunnel_bench::peers::{Peer, PeerSetup};
use atunnel_sandbox::link::Netlink;
use atunnel_sandbox::{NetNs, NsExecutor};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;

/// The actors' program's answer (`actors --body-bytes` default).
const ACTOR_BODY: [u8; 64] = [b'a'; 64];
/// Where the peer serves the router, inside the test's namespace.
const LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8443);
/// actor-0's backend (nothing listens there) and actor-1's (the actors'
/// program).
const DEAD_PORT: u16 = 18100;
const LIVE_PORT: u16 = 18101;

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

/// Runs `peer` from its written configuration in a namespace of its own in
/// front of one live loopback actor, and checks what the router sees.
async fn a_peer_does_atunnels_ingress_job(peer: Peer) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the peers run in a namespace of their own; run the tests as root"
    );
    let Some(binary) = peer.find() else {
        let missing = format!(
            "{} is not installed: apt-get install nginx haproxy",
            peer.name()
        );
        assert!(
            std::env::var_os("ATUNNEL_REQUIRE_PEERS").is_none_or(|v| v != "1"),
            "{missing}"
        );
        eprintln!("not run: {missing} (ATUNNEL_REQUIRE_PEERS=1 makes this a failure)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_atunnel-bench");
    let pki = dir.path().join("pki");
    let status = std::process::Command::new(bin)
        .arg("pki")
        .arg("--out")
        .arg(&pki)
        .stdout(Stdio::null())
        .status()
        .expect("pki runs");
    assert!(status.success(), "pki: {status}");

    let name = format!("atbpeer-{}-{}", peer.name(), std::process::id() % 100_000);
    let exec = NsExecutor::start().expect("netns executor");
    let ns = exec.create(&name).await.expect("namespace");
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        exercise(peer, &binary, &exec, &ns, &pki, dir.path()),
    )
    .await;
    // Whatever happened (a timeout drops the children, and a killed
    // nginx master leaves its worker running): nothing outlives the test.
    kill_processes_in(&name);
    let _ = exec.delete(&name).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{}: {e}", peer.name()),
        Err(_) => panic!("{}: not done within 30 s", peer.name()),
    }
}

/// The checks; the caller removes the namespace whatever happens here
/// (the children are killed when dropped).
async fn exercise(
    peer: Peer,
    binary: &Path,
    exec: &NsExecutor,
    ns: &NetNs,
    pki: &Path,
    dir: &Path,
) -> Result<(), String> {
    Netlink::open(exec, ns)
        .await
        .map_err(|e| e.to_string())?
        .up("lo")
        .await
        .map_err(|e| e.to_string())?;
    let bin = env!("CARGO_BIN_EXE_atunnel-bench");
    let mut actors = spawn_in(
        exec,
        ns,
        vec![
            bin.into(),
            "actors".into(),
            "--loopback-actors=1".into(),
            format!("--loopback-base-port={LIVE_PORT}"),
        ],
        Stdio::piped(),
    )
    .await;
    let stdout = actors.stdout.take().ok_or("actors without stdout")?;
    let mut ready = String::new();
    BufReader::new(stdout)
        .read_line(&mut ready)
        .await
        .map_err(|e| e.to_string())?;
    if !ready.starts_with("ready") {
        return Err(format!("actors did not start: {ready:?}"));
    }
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let setup = PeerSetup {
        listen: LISTEN,
        cert_bundle: pki.join("worker-credential-bundle.pem"),
        client_ca: pki.join("pod-ca.pem"),
        backends: vec![
            ("bench/actor-0".into(), local(DEAD_PORT)),
            ("bench/actor-1".into(), local(LIVE_PORT)),
        ],
        dir: dir.join("peers"),
    };
    let config = peer.write_config(&setup).map_err(|e| e.to_string())?;
    let proxy = spawn_in(exec, ns, peer.command(binary, &config), Stdio::null()).await;
    let result = check(proxy_ready(proxy, exec, ns, &config).await, exec, ns, pki).await;
    stop(actors).await;
    result
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
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(m) = std::fs::metadata(entry.path().join("ns/net")) else {
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
