//! The control API (root: real sandboxes). A worker drives actors through
//! their whole lifecycle over gRPC on the Unix socket, bytes go both ways
//! through each sandbox's egress, every bad input gets its exact status and
//! changes nothing, a peer whose uid is not allowed is refused, and
//! `atunnel ctl` drives `atunnel serve`.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{dial_from, echo_check, expect_seen};
use atunnel::control::ControlConfig;
use atunnel::control::client::connect;
use atunnel::control::daemon::ServeReady;
use atunnel::control::listener::{ControlSocket, serve};
use atunnel::control::proto::{self, Phase, control_client::ControlClient};
use atunnel::control::service::ControlService;
use atunnel::tunnel::{Tunnel, TunnelConfig};
use atunnel_identity::cert_source::{CertificateSource, MintError, MintFuture};
use atunnel_identity::clock::Clock;
use atunnel_identity::identity::ActorRef;
use atunnel_sandbox::{NsExecutor, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

/// A destination the sink gateway echoes (any port but its special ones).
const ECHOED: &str = "192.0.2.10:443";
/// nobody/nogroup: a uid other than the test's (root).
const NOBODY: u32 = 65534;

fn echo_sink() -> SinkConfig {
    SinkConfig {
        other_ports: Some(Service::Echo),
        ..SinkConfig::default()
    }
}

/// Mints through a [`TestSource`] once the gate lets it: a test closes the
/// gate to hold a call in progress for as long as it likes.
struct GatedSource {
    inner: Arc<TestSource>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl CertificateSource for GatedSource {
    fn mint<'a>(&'a self, actor: &'a ActorRef, csr_der: &'a [u8]) -> MintFuture<'a> {
        Box::pin(async move {
            let _pass = self
                .gate
                .acquire()
                .await
                .map_err(|e| MintError::Failed(e.to_string()))?;
            self.inner.mint(actor, csr_der).await
        })
    }
}

/// Removes the namespaces named `<prefix>...` when dropped, so a test that
/// fails halfway leaves none behind (a passing one has closed them all).
struct NetnsSweep(String);

impl Drop for NetnsSweep {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir("/run/netns") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&self.0) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "delete", &name])
                    .status();
            }
        }
    }
}

/// An in-process `atunnel serve`: a tunnel, its control socket, a client.
struct Daemon {
    _sweep: NetnsSweep,
    tunnel: Arc<Tunnel>,
    source: Arc<TestSource>,
    /// Open (every mint passes) unless a test forgets its permits.
    gate: Arc<tokio::sync::Semaphore>,
    client: ControlClient<Channel>,
    socket: PathBuf,
    cancel: CancellationToken,
    served: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(pki: &Pki, test: &str, tune: impl FnOnce(&mut ControlConfig)) -> Self {
        let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(1 << 20));
        let gated = Arc::new(GatedSource {
            inner: source.clone(),
            gate: gate.clone(),
        });
        let mut cfg = TunnelConfig::new(pki.gateway_roots(), gated);
        let prefix = format!("atnc-{}-{test}-", std::process::id());
        cfg.netns_prefix = prefix.clone();
        // Each sandbox gets a relay (never asked here), so ServeSandbox
        // answers with the resolv.conf naming it.
        cfg.dns = Some(atunnel_dns::RelayConfig {
            upstreams: vec!["127.0.0.1:53".parse().expect("addr")],
            ..atunnel_dns::RelayConfig::default()
        });
        let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
        let dir = tempfile::tempdir().expect("dir");
        // Traversable by others: the refusal tests connect as nobody.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let socket = dir.path().join("control.sock");
        let mut control = ControlConfig::new(&socket);
        tune(&mut control);
        let bound = ControlSocket::bind(&control).await.expect("bind");
        let service = ControlService::new(tunnel.clone(), &prefix, control.call_timeout);
        let cancel = CancellationToken::new();
        let served = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                serve(bound, service, &control, cancel)
                    .await
                    .expect("control API served");
            })
        };
        Self {
            _sweep: NetnsSweep(prefix.clone()),
            tunnel,
            source,
            gate,
            client: connect(&socket),
            socket,
            cancel,
            served,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.served.await.expect("serving ended");
        assert!(!self.socket.exists(), "the socket file is removed");
        self.tunnel.shutdown().await;
    }

    async fn list(&mut self) -> Vec<proto::ActorStatus> {
        self.client
            .list(proto::ListRequest {})
            .await
            .expect("List")
            .into_inner()
            .actors
    }
}

fn who(name: &str) -> proto::Actor {
    proto::Actor {
        atespace: "team-a".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn gateway_of(gw: &RunningGateway) -> proto::Gateway {
    proto::Gateway {
        address: gw.addr.to_string(),
        server_name: GATEWAY_NAME.into(),
    }
}

async fn prepare(
    c: &mut ControlClient<Channel>,
    actor: &proto::Actor,
    gw: &RunningGateway,
) -> Result<proto::PrepareEgressResponse, tonic::Status> {
    c.prepare_egress(proto::PrepareEgressRequest {
        actor: Some(actor.clone()),
        gateway: Some(gateway_of(gw)),
    })
    .await
    .map(|r| r.into_inner())
}

async fn serve_sandbox(
    c: &mut ControlClient<Channel>,
    actor: &proto::Actor,
) -> Result<proto::ServeSandboxResponse, tonic::Status> {
    c.serve_sandbox(proto::ServeSandboxRequest {
        actor: Some(actor.clone()),
    })
    .await
    .map(|r| r.into_inner())
}

async fn activate(
    c: &mut ControlClient<Channel>,
    actor: &proto::Actor,
) -> Result<proto::ActivateResponse, tonic::Status> {
    c.activate(proto::ActivateRequest {
        actor: Some(actor.clone()),
    })
    .await
    .map(|r| r.into_inner())
}

async fn deactivate(
    c: &mut ControlClient<Channel>,
    actor: &proto::Actor,
) -> Result<proto::DeactivateResponse, tonic::Status> {
    c.deactivate(proto::DeactivateRequest {
        actor: Some(actor.clone()),
    })
    .await
    .map(|r| r.into_inner())
}

async fn close(
    c: &mut ControlClient<Channel>,
    actor: &proto::Actor,
) -> Result<proto::CloseSandboxResponse, tonic::Status> {
    c.close_sandbox(proto::CloseSandboxRequest {
        actor: Some(actor.clone()),
    })
    .await
    .map(|r| r.into_inner())
}

async fn status(c: &mut ControlClient<Channel>, uid: &str) -> proto::ActorStatus {
    c.status(proto::StatusRequest { uid: uid.into() })
        .await
        .expect("Status")
        .into_inner()
        .status
        .expect("a status")
}

fn phase(s: &proto::ActorStatus) -> Phase {
    Phase::try_from(s.phase).expect("a known phase")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_actors_go_through_the_whole_lifecycle_with_bytes_both_ways() {
    require_root("control API lifecycle test");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let mut d = Daemon::start(&pki, "life", |_| {}).await;
    let exec = d.tunnel.executor().clone();
    let actors = [who("alpha"), who("bravo"), who("charlie")];
    let dest: SocketAddr = ECHOED.parse().expect("addr");

    let mut runtime = Vec::new();
    for a in &actors {
        let p = prepare(&mut d.client, a, &gw).await.expect("PrepareEgress");
        assert!(!p.replaced);
        let s = p.status.expect("status");
        assert_eq!(phase(&s), Phase::Prepared);
        assert!(s.egress_prepared && s.runtime_netns.is_empty());
        assert_eq!(s.gateway_address, gw.addr.to_string());
        assert!(s.certificate_expires_unix_ms > 0, "{s:?}");

        let sb = serve_sandbox(&mut d.client, a).await.expect("ServeSandbox");
        assert!(sb.created);
        assert_eq!(
            sb.resolv_conf, "nameserver 169.254.17.1\nnameserver fd00:a7:17::1\n",
            "the sandbox's DNS relay, both families"
        );
        let s = sb.status.expect("status");
        assert_eq!(phase(&s), Phase::Sandboxed);
        assert_eq!(s.runtime_netns, sb.runtime_netns);
        assert!(atunnel_sandbox::netns::exists(&sb.runtime_netns));
        assert!(atunnel_sandbox::netns::exists(&s.gateway_netns));

        let s = activate(&mut d.client, a)
            .await
            .expect("Activate")
            .status
            .expect("status");
        assert_eq!(phase(&s), Phase::Active);
        assert!(!s.egress_prepared, "activation spends the prepared egress");
        runtime.push(sb.runtime_netns);
    }
    assert_eq!(runtime.len(), 3);
    assert!(
        runtime[0] != runtime[1] && runtime[1] != runtime[2],
        "{runtime:?}"
    );

    // Bytes both ways through each sandbox, each tunnel the gateway sees
    // carrying that actor's identity; each open tunnel counted for it.
    let mut conns = Vec::new();
    for (i, a) in actors.iter().enumerate() {
        let mut s = dial_from(&exec, &runtime[i], dest).await;
        echo_check(&mut s, &random(256 * 1024, i as u64)).await;
        expect_seen(&mut gw, &a.name, ECHOED).await;
        let st = status(&mut d.client, &a.uid).await;
        assert_eq!(st.egress.expect("counts").tunnels, 1, "{st:?}");
        conns.push(s);
    }

    // Deactivating one ends its tunnel and leaves the others carrying.
    let r = deactivate(&mut d.client, &actors[0])
        .await
        .expect("Deactivate");
    assert!(r.was_active && r.drained, "{r:?}");
    assert_eq!(phase(&r.status.expect("status")), Phase::Sandboxed);
    ends(&mut conns[0], "the deactivated actor's tunnel").await;
    for (i, s) in conns.iter_mut().enumerate().skip(1) {
        echo_check(s, &random(64 * 1024, 10 + i as u64)).await;
    }
    // A new activation needs a new prepared egress (a fresh key), then
    // carries again through the same sandbox.
    let e = activate(&mut d.client, &actors[0])
        .await
        .expect_err("no egress");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    prepare(&mut d.client, &actors[0], &gw)
        .await
        .expect("prepare again");
    activate(&mut d.client, &actors[0])
        .await
        .expect("activate again");
    let mut s = dial_from(&exec, &runtime[0], dest).await;
    echo_check(&mut s, &random(64 * 1024, 20)).await;
    drop(s);

    let listed = d.list().await;
    let uids: Vec<&str> = listed
        .iter()
        .map(|s| s.actor.as_ref().expect("actor").uid.as_str())
        .collect();
    assert_eq!(uids, ["uid-alpha", "uid-bravo", "uid-charlie"]);
    assert!(listed.iter().all(|s| phase(s) == Phase::Active));

    // Closing removes each sandbox; a second close is OK and does nothing.
    for (i, a) in actors.iter().enumerate() {
        let r = close(&mut d.client, a).await.expect("CloseSandbox");
        assert!(r.existed && r.drained, "{r:?}");
        assert!(!atunnel_sandbox::netns::exists(&runtime[i]));
        let r = close(&mut d.client, a).await.expect("closing again");
        assert!(!r.existed, "{r:?}");
    }
    for mut s in conns.drain(1..) {
        ends(&mut s, "the deactivated actor's tunnel").await;
    }
    assert!(d.list().await.is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_exact_status_and_changes_nothing() {
    require_root("control API refusals test");
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    let mut d = Daemon::start(&pki, "bad", |_| {}).await;
    let exec = d.tunnel.executor().clone();
    let c = &mut d.client;
    // alpha is active, bravo only prepared, charlie only sandboxed, and
    // alpha-2 is alpha's next incarnation, prepared and sandboxed.
    let (alpha, bravo, charlie) = (who("alpha"), who("bravo"), who("charlie"));
    let alpha2 = proto::Actor {
        uid: "uid-alpha-2".into(),
        ..who("alpha")
    };
    prepare(c, &alpha, &gw).await.expect("prepare");
    let alpha_ns = serve_sandbox(c, &alpha)
        .await
        .expect("sandbox")
        .runtime_netns;
    activate(c, &alpha).await.expect("activate");
    prepare(c, &bravo, &gw).await.expect("prepare");
    let charlie_ns = serve_sandbox(c, &charlie)
        .await
        .expect("sandbox")
        .runtime_netns;
    prepare(c, &alpha2, &gw).await.expect("prepare");
    serve_sandbox(c, &alpha2).await.expect("sandbox");
    let before = d.list().await;
    assert_eq!(before.len(), 4);
    let c = &mut d.client;

    let with = |f: &dyn Fn(&mut proto::Actor)| {
        let mut a = who("delta");
        f(&mut a);
        a
    };
    let bad_names = [
        (with(&|a| a.atespace = "Team_A".into()), "actor.atespace"),
        (with(&|a| a.atespace = String::new()), "actor.atespace"),
        (with(&|a| a.name = String::new()), "actor.name"),
        (with(&|a| a.name = "x".repeat(254)), "actor.name"),
        (with(&|a| a.uid = String::new()), "actor.uid"),
        (with(&|a| a.uid = "a b".into()), "actor.uid"),
        (with(&|a| a.uid = "../../tmp/x".into()), "actor.uid"),
        (with(&|a| a.uid = "..".into()), "actor.uid"),
        (with(&|a| a.uid = "u".repeat(250)), "actor.uid"),
        // A uid is a namespace name and a Prometheus label value.
        (with(&|a| a.uid = "uid\"delta".into()), "actor.uid"),
        (with(&|a| a.uid = "uid\\delta".into()), "actor.uid"),
    ];
    let expect = |r: Result<_, tonic::Status>, code: Code, needle: &str, what: &str| {
        let e = r.err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(
            e.message().contains(needle),
            "{what}: {:?} does not name {needle:?}",
            e.message()
        );
    };
    for (actor, field) in &bad_names {
        let what = format!("{actor:?}");
        let r = prepare(c, actor, &gw).await.map(|_| ());
        expect(r, Code::InvalidArgument, field, &what);
        let r = serve_sandbox(c, actor).await.map(|_| ());
        expect(r, Code::InvalidArgument, field, &what);
        let r = activate(c, actor).await.map(|_| ());
        expect(r, Code::InvalidArgument, field, &what);
        let r = deactivate(c, actor).await.map(|_| ());
        expect(r, Code::InvalidArgument, field, &what);
        let r = close(c, actor).await.map(|_| ());
        expect(r, Code::InvalidArgument, field, &what);
    }
    let r = c
        .activate(proto::ActivateRequest { actor: None })
        .await
        .map(|_| ());
    expect(r, Code::InvalidArgument, "actor", "no actor");

    // Gateways: missing, malformed, unresolvable; a failed replacement of
    // bravo's prepared egress keeps the old one.
    for (gateway, field) in [
        (None, "gateway"),
        (Some(("", "")), "gateway.address"),
        (Some(("no-port", "")), "gateway.address"),
        (Some(("127.0.0.1:http", "")), "gateway.address"),
        (
            Some(("127.0.0.1:443", "not a name!")),
            "gateway.server_name",
        ),
    ] {
        for actor in [&bravo, &who("delta")] {
            let r = c
                .prepare_egress(proto::PrepareEgressRequest {
                    actor: Some(actor.clone()),
                    gateway: gateway.map(|(address, server_name)| proto::Gateway {
                        address: address.into(),
                        server_name: server_name.into(),
                    }),
                })
                .await
                .map(|_| ());
            expect(r, Code::InvalidArgument, field, &format!("{gateway:?}"));
        }
    }
    // The node agent refusing: UNAVAILABLE, bravo keeps what it had.
    d.source.fail_next(MintError::Failed("agent down".into()));
    let r = prepare(c, &bravo, &gw).await.map(|_| ());
    expect(r, Code::Unavailable, "agent down", "mint failure");
    d.source.fail_next(MintError::Failed("agent down".into()));
    let r = prepare(c, &who("delta"), &gw).await.map(|_| ());
    expect(r, Code::Unavailable, "agent down", "mint failure");

    // Out of order, or twice.
    let r = activate(c, &who("delta")).await.map(|_| ());
    expect(
        r,
        Code::NotFound,
        "uid-delta",
        "activating an unknown actor",
    );
    let r = activate(c, &alpha).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "already active",
        "second activation",
    );
    let r = activate(c, &bravo).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "no sandbox",
        "activate before sandbox",
    );
    let r = activate(c, &charlie).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "no prepared egress",
        "before prepare",
    );
    let r = activate(c, &alpha2).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "uid-alpha",
        "same name, another uid",
    );
    let r = prepare(c, &alpha, &gw).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "deactivate",
        "preparing while active",
    );
    // A uid names one actor.
    let renamed = proto::Actor {
        name: "zulu".into(),
        ..alpha.clone()
    };
    let r = serve_sandbox(c, &renamed).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "team-a/alpha",
        "uid under a new name",
    );
    let r = deactivate(c, &renamed).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "team-a/alpha",
        "uid under a new name",
    );
    let r = close(c, &renamed).await.map(|_| ());
    expect(
        r,
        Code::FailedPrecondition,
        "team-a/alpha",
        "uid under a new name",
    );
    // Status.
    let r = c.status(proto::StatusRequest { uid: String::new() }).await;
    expect(
        r.map(|_| ()),
        Code::InvalidArgument,
        "uid",
        "Status without uid",
    );
    let r = c
        .status(proto::StatusRequest {
            uid: "uid-delta".into(),
        })
        .await;
    expect(
        r.map(|_| ()),
        Code::NotFound,
        "uid-delta",
        "Status of unknown",
    );

    // Idempotent calls that have nothing to do: OK, and nothing changes.
    let r = deactivate(c, &who("delta")).await.expect("unknown: OK");
    assert!(!r.was_active && r.status.is_none(), "{r:?}");
    let r = deactivate(c, &charlie).await.expect("inactive: OK");
    assert!(!r.was_active, "{r:?}");
    let r = close(c, &who("delta")).await.expect("unknown: OK");
    assert!(!r.existed, "{r:?}");
    let r = serve_sandbox(c, &charlie).await.expect("served again: OK");
    assert!(!r.created && r.runtime_netns == charlie_ns, "{r:?}");

    assert_eq!(d.list().await, before, "a refused call changed something");
    // And alpha still carries bytes.
    let mut s = dial_from(&exec, &alpha_ns, ECHOED.parse().expect("addr")).await;
    echo_check(&mut s, &random(64 * 1024, 1)).await;
    drop(s);

    // Preparing again while prepared and inactive replaces the egress.
    let r = prepare(&mut d.client, &bravo, &gw).await.expect("replace");
    assert!(r.replaced, "{r:?}");
    assert_eq!(phase(&r.status.expect("status")), Phase::Prepared);
    for a in [&alpha, &bravo, &charlie, &alpha2] {
        close(&mut d.client, a).await.expect("close");
    }
    assert!(d.list().await.is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_uid_is_not_allowed_is_closed_at_accept_and_changes_nothing() {
    require_root("control API peer credentials test");
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    // Root passes the file's mode but not the uid check: only uid 4242 may.
    let mut d = Daemon::start(&pki, "peer", |c| c.allowed_uids = vec![4242]).await;
    let a = who("alpha");
    let refused = [
        prepare(&mut d.client, &a, &gw).await.map(|_| ()),
        serve_sandbox(&mut d.client, &a).await.map(|_| ()),
        activate(&mut d.client, &a).await.map(|_| ()),
        d.client.list(proto::ListRequest {}).await.map(|_| ()),
    ];
    for r in refused {
        // A transport error (UNKNOWN, UNAVAILABLE or CANCELLED, by when
        // the client saw the close), not an answer.
        let e = r.expect_err("refused");
        let transport =
            std::error::Error::source(&e).is_some_and(|s| s.is::<tonic::transport::Error>());
        assert!(transport, "{e:?}");
    }
    // Each refusal is counted before its connection closes, but tonic may
    // fail a call on the broken connection of the one before without
    // dialling again: four calls make one to four connections, all refused.
    let figures = d.tunnel.control_counters().stats();
    assert!((1..=4).contains(&figures.refused_uid_total), "{figures:?}");
    assert_eq!(figures.accepted_total, figures.refused_uid_total);
    let actor = ActorRef::new(&a.atespace, &a.name, &a.uid).expect("actor");
    assert!(
        d.tunnel.sandbox(&actor).is_none(),
        "a refused call built a sandbox"
    );
    assert!(d.tunnel.egress().actor_stats().is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_call_timeout_is_deadline_exceeded_and_its_operation_still_completes() {
    require_root("control API call timeout test");
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    let timeout = Duration::from_millis(300);
    let mut d = Daemon::start(&pki, "slow", |c| c.call_timeout = timeout).await;
    // The node agent does not answer until the gate opens.
    let held = d.gate.forget_permits(usize::MAX);
    let a = who("alpha");
    let e = tokio::time::timeout(Duration::from_secs(20), prepare(&mut d.client, &a, &gw))
        .await
        .expect("answered within 20 s")
        .expect_err("the mint is held");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("Status"), "{e:?}");
    // The operation was not cancelled with the call: once the agent
    // answers, it completes (Status waits for the call in progress).
    d.gate.add_permits(held);
    let s = status(&mut d.client, &a.uid).await;
    assert_eq!(phase(&s), Phase::Prepared, "{s:?}");
    assert!(s.egress_prepared);
    close(&mut d.client, &a).await.expect("close");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_until_one_closes() {
    require_root("control API connection cap test");
    let pki = Pki::new();
    let mut d = Daemon::start(&pki, "cap", |c| c.max_connections = 1).await;
    // The first connection takes the only place, and keeps it.
    assert!(d.list().await.is_empty());
    let mut second = connect(&d.socket);
    let waited =
        tokio::time::timeout(Duration::from_secs(1), second.list(proto::ListRequest {})).await;
    assert!(
        waited.is_err(),
        "a second connection was served: {waited:?}"
    );
    // Closing the first lets the second in.
    d.client = connect(&d.socket);
    let listed = tokio::time::timeout(Duration::from_secs(20), second.list(proto::ListRequest {}))
        .await
        .expect("served once the first connection closed")
        .expect("List");
    assert!(listed.into_inner().actors.is_empty());
    drop(second);
    d.stop().await;
}

/// Connects to `socket` as `uid` from a thread of its own: the raw
/// setresuid syscall changes only the calling thread's credentials (glibc's
/// wrapper changes every thread's), and the kernel records them for
/// SO_PEERCRED at connect. The saved uid stays root's, so the thread takes
/// root back before it ends.
fn connect_as(uid: u32, socket: &Path) -> tokio::net::UnixStream {
    let socket = socket.to_path_buf();
    let stream = std::thread::spawn(move || {
        let keep = nix::libc::uid_t::MAX;
        // SAFETY: setresuid reads no memory; it sets this thread's effective
        // uid only.
        let r = unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, keep, uid, keep) };
        assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
        let stream = std::os::unix::net::UnixStream::connect(&socket);
        // SAFETY: as above, back to the saved uid (root).
        let r = unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, keep, 0u32, keep) };
        assert_eq!(r, 0, "setresuid back: {}", std::io::Error::last_os_error());
        stream.expect("connects: the socket is group-writable for the test's group")
    })
    .join()
    .expect("the connecting thread");
    stream.set_nonblocking(true).expect("nonblocking");
    tokio::net::UnixStream::from_std(stream).expect("registered")
}

/// Waits (up to `within`) for the server to close `s` without a byte.
async fn closed_within(s: &mut tokio::net::UnixStream, within: Duration) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(within, s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("not closed within {within:?}"));
    assert_eq!(read.unwrap_or(0), 0, "closed without a byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_and_a_refused_uid_do_not_keep_the_worker_out() {
    require_root("control API admission test");
    let pki = Pki::new();
    let preface_timeout = Duration::from_secs(20);
    // Group-writable for root's group: a thread that is only nobody by
    // its uid can connect, and is refused by the uid check.
    let d = Daemon::start(&pki, "admit", |c| {
        c.mode = 0o660;
        c.preface_timeout = preface_timeout;
    })
    .await;
    assert_eq!(d.tunnel.control_counters().stats().accepted_total, 0);
    // As many connections as are served at once, none sending a byte;
    // then one from a uid not allowed, which is closed at once.
    let mut silent = Vec::new();
    for _ in 0..atunnel::control::DEFAULT_MAX_CONNECTIONS {
        silent.push(
            tokio::net::UnixStream::connect(&d.socket)
                .await
                .expect("connect"),
        );
    }
    let mut refused = connect_as(NOBODY, &d.socket);
    closed_within(&mut refused, Duration::from_secs(5)).await;

    // The worker's `atunnel ctl list` is answered at once, not after the
    // silent ones' preface timeout: the oldest of them gives its place.
    let started = std::time::Instant::now();
    let (code, json) = ctl_as(None, &d.socket, &["list"]).await;
    let took = started.elapsed();
    assert_eq!(
        (code, &json["actors"]),
        (0, &serde_json::json!([])),
        "{json}"
    );
    assert!(
        took < Duration::from_secs(5),
        "ctl list took {took:?} (preface timeout {preface_timeout:?})"
    );
    closed_within(&mut silent[0], Duration::from_secs(5)).await;
    let figures = d.tunnel.control_counters().stats();
    assert_eq!(figures.refused_uid_total, 1, "{figures:?}");
    assert_eq!(figures.evicted_total, 1, "{figures:?}");
    assert_eq!(figures.accepted_total, 18, "{figures:?}");
    drop(silent);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_its_preface_is_closed_at_the_preface_timeout() {
    require_root("control API preface timeout test");
    let pki = Pki::new();
    let timeout = Duration::from_millis(300);
    let mut d = Daemon::start(&pki, "preface", |c| c.preface_timeout = timeout).await;
    let started = std::time::Instant::now();
    let mut silent = tokio::net::UnixStream::connect(&d.socket)
        .await
        .expect("connect");
    closed_within(&mut silent, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() >= timeout - Duration::from_millis(50),
        "closed after {:?}",
        started.elapsed()
    );
    // Not HTTP/2: closed at once.
    let mut other = tokio::net::UnixStream::connect(&d.socket)
        .await
        .expect("connect");
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    closed_within(&mut other, Duration::from_secs(10)).await;
    let figures = d.tunnel.control_counters().stats();
    assert_eq!(
        (figures.preface_timeouts_total, figures.bad_preface_total),
        (1, 1),
        "{figures:?}"
    );
    // A client that speaks is served as ever.
    assert!(d.list().await.is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_after_its_preface_is_pinged_and_closed() {
    require_root("control API ping test");
    let pki = Pki::new();
    let ping = Duration::from_millis(300);
    let mut d = Daemon::start(&pki, "ping", |c| c.ping_interval = ping).await;
    let started = std::time::Instant::now();
    let mut quiet = tokio::net::UnixStream::connect(&d.socket)
        .await
        .expect("connect");
    quiet
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), quiet.read_to_end(&mut got))
        .await
        .expect("closed within 10 s")
        .expect("read");
    assert!(
        started.elapsed() >= ping,
        "closed after {:?}",
        started.elapsed()
    );
    // Its frames: the server's SETTINGS, a PING it never answered, GOAWAY.
    let mut kinds = Vec::new();
    let mut rest = &got[..];
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        kinds.push((rest[3], rest[4]));
        rest = &rest[(9 + len).min(rest.len())..];
    }
    assert!(kinds.contains(&(6, 0)), "no PING among {kinds:?}");
    // A client's library answers PINGs: its connection stays served past
    // several (a new one would be counted).
    assert!(d.list().await.is_empty());
    let accepted = d.tunnel.control_counters().stats().accepted_total;
    tokio::time::sleep(ping * 4).await;
    assert!(d.list().await.is_empty());
    assert_eq!(
        d.tunnel.control_counters().stats().accepted_total,
        accepted,
        "the client reconnected"
    );
    d.stop().await;
}

/// Runs `atunnel ctl --socket <socket> <args>` as `uid` (through setpriv
/// when it is not ours): its exit code and its one line of JSON.
async fn ctl_as(uid: Option<u32>, socket: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let bin = env!("CARGO_BIN_EXE_atunnel");
    let mut cmd = match uid {
        Some(uid) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(bin);
            c
        }
        None => tokio::process::Command::new(bin),
    };
    cmd.arg("ctl").arg("--socket").arg(socket).args(args);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("ctl answers within 30 s")
        .expect("setpriv and atunnel run (setpriv is util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "ctl {args:?}: not JSON ({e}): {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_as_another_uid_is_kept_out_by_the_mode_or_refused_by_the_uid_check() {
    require_root("control API uid test");
    let pki = Pki::new();
    // Owner-only socket: nobody cannot even connect.
    let d = Daemon::start(&pki, "mode", |_| {}).await;
    let mode = std::fs::metadata(&d.socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (code, json) = ctl_as(Some(NOBODY), &d.socket, &["list"]).await;
    assert_eq!(
        (code, json["code"].as_str()),
        (1, Some("UNAVAILABLE")),
        "{json}"
    );
    d.stop().await;

    // Group-readable for nogroup: nobody connects, and is refused by uid
    // until it is allowed.
    let group = |c: &mut ControlConfig| {
        c.mode = 0o660;
        c.group = Some(NOBODY);
    };
    let d = Daemon::start(&pki, "uid", group).await;
    let (code, json) = ctl_as(Some(NOBODY), &d.socket, &["list"]).await;
    assert_eq!(
        (code, json["code"].as_str()),
        (1, Some("UNAVAILABLE")),
        "{json}"
    );
    assert!(
        json["message"]
            .as_str()
            .is_some_and(|m| m.contains("uid (65534)")),
        "{json}"
    );
    assert_eq!(d.tunnel.control_counters().stats().refused_uid_total, 1);
    d.stop().await;
    let d = Daemon::start(&pki, "uid2", |c| {
        group(c);
        c.allowed_uids = vec![0, NOBODY];
    })
    .await;
    let (code, json) = ctl_as(Some(NOBODY), &d.socket, &["list"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["actors"], serde_json::json!([]), "{json}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atunnel_ctl_drives_atunnel_serve_through_a_lifecycle() {
    require_root("atunnel serve test");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let dir = tempfile::tempdir().expect("dir");
    let ca = pki.write_ca_files(dir.path());
    let socket = dir.path().join("run/control.sock");
    let prefix = format!("atnc-{}-ctl-", std::process::id());
    let _sweep = NetnsSweep(prefix.clone());
    let (mut daemon, ready): (_, ServeReady) = spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .arg("serve")
            .args(ca.args())
            .arg("--control-socket")
            .arg(&socket)
            .args(["--netns-prefix", &prefix, "--resolv-conf", ""])
            .stderr(Stdio::inherit()),
    )
    .await;
    assert_eq!(ready.control_socket, socket);

    let actor = [
        "--atespace",
        "team-a",
        "--name",
        "alpha",
        "--uid",
        "uid-alpha",
    ];
    let ctl = |args: Vec<&'static str>| {
        let socket = socket.clone();
        async move { ctl_as(None, &socket, &args).await }
    };
    let with = |call: &'static str, extra: &[&'static str]| {
        let mut v = vec![call];
        v.extend_from_slice(&actor);
        v.extend_from_slice(extra);
        v
    };
    let gw_addr: &'static str = Box::leak(gw.addr.to_string().into_boxed_str());
    let (code, json) = ctl(with(
        "prepare-egress",
        &["--gateway", gw_addr, "--gateway-name", GATEWAY_NAME],
    ))
    .await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["status"]["phase"], "PHASE_PREPARED", "{json}");
    let (code, json) = ctl(with("serve-sandbox", &[])).await;
    assert_eq!(code, 0, "{json}");
    let runtime = json["runtime_netns"]
        .as_str()
        .expect("a namespace")
        .to_string();
    assert_eq!(runtime, format!("{prefix}uid-alpha"));
    let (code, json) = ctl(with("activate", &[])).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["status"]["phase"], "PHASE_ACTIVE", "{json}");
    let (code, json) = ctl(with("activate", &[])).await;
    assert_eq!(
        (code, json["code"].as_str()),
        (1, Some("FAILED_PRECONDITION"))
    );

    // The actor's program, started in that namespace, reaches the world.
    let exec = NsExecutor::start().expect("executor");
    let mut s = dial_from(&exec, &runtime, ECHOED.parse().expect("addr")).await;
    echo_check(&mut s, &random(128 * 1024, 7)).await;
    expect_seen(&mut gw, "alpha", ECHOED).await;
    let (code, json) = ctl(vec!["status", "--uid", "uid-alpha"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["status"]["egress"]["tunnels"], 1, "{json}");

    let (code, json) = ctl(with("deactivate", &[])).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["was_active"], true, "{json}");
    ends(&mut s, "the deactivated actor's tunnel").await;
    let (code, json) = ctl(with("close-sandbox", &[])).await;
    assert_eq!(
        (code, &json["existed"]),
        (0, &serde_json::json!(true)),
        "{json}"
    );
    assert!(!atunnel_sandbox::netns::exists(&runtime));
    let (code, json) = ctl(vec!["list"]).await;
    assert_eq!(
        (code, &json["actors"]),
        (0, &serde_json::json!([])),
        "{json}"
    );

    // SIGTERM: it stops, removing its socket.
    let pid = daemon.id().expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let exit = tokio::time::timeout(Duration::from_secs(30), daemon.wait())
        .await
        .expect("stops within 30 s")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
    assert!(!socket.exists(), "the socket file is removed");
}
