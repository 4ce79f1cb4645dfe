//! End to end over real Unix sockets, real mutual TLS and real tonic: the
//! source against the fake agent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use atunnel_identity::pki::{ATELET_SPIFFE_ID, WORKER_SPIFFE_ID, actor_csr, new_actor_key};
use atunnel_identity::{
    ActorIdentity, ActorRef, CertificateAuthority, CertificateSource, IssuedCert, MintError,
    RefusalCode, Usage, check_minted, verify_actor_leaf,
};
use atunnel_nodeagent::{
    Behavior, Code, FakeAgentTls, FakeNodeAgent, FakeNodeAgentHandle, NodeAgentConfig,
    NodeAgentError, NodeAgentSource,
};
use tempfile::TempDir;

const HOUR: Duration = Duration::from_secs(3600);
const IMPOSTOR_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/impostor";

/// A pod CA for workload certificates and an actor CA for actor certificates.
struct Pki {
    pod_ca: CertificateAuthority,
    actor_ca: Arc<CertificateAuthority>,
}

impl Pki {
    fn new() -> Self {
        Self {
            pod_ca: CertificateAuthority::new("pod ca").expect("pod ca"),
            actor_ca: Arc::new(CertificateAuthority::new("actor ca").expect("actor ca")),
        }
    }

    fn workload(&self, spiffe_id: &str, usage: Usage) -> IssuedCert {
        self.pod_ca
            .issue(Some(spiffe_id), &[], &[], usage, HOUR)
            .expect("workload cert")
    }
}

/// A fake agent on a socket in its own temporary directory.
struct Node {
    pki: Pki,
    // Kept so the directory outlives the socket.
    _dir: TempDir,
    socket: PathBuf,
    agent: FakeNodeAgentHandle,
}

impl Node {
    /// An agent presenting `agent_id` and admitting only the worker ID.
    async fn start(agent_id: &str) -> Self {
        let pki = Pki::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("ateom.sock");
        let agent = spawn_agent(&pki, &socket, agent_id).await;
        Self {
            pki,
            _dir: dir,
            socket,
            agent,
        }
    }

    /// A source presenting `worker_id` and expecting atelet.
    fn source(&self, worker_id: &str, timeout: Duration) -> NodeAgentSource {
        let worker = self.pki.workload(worker_id, Usage::Client);
        let mut cfg = NodeAgentConfig::new(
            &self.socket,
            worker.chain.clone(),
            worker.key(),
            vec![self.pki.pod_ca.cert_der()],
        );
        cfg.timeout = timeout;
        NodeAgentSource::new(cfg).expect("source")
    }

    fn worker_source(&self) -> NodeAgentSource {
        self.source(WORKER_SPIFFE_ID, Duration::from_secs(10))
    }
}

async fn spawn_agent(pki: &Pki, socket: &std::path::Path, agent_id: &str) -> FakeNodeAgentHandle {
    let server = pki.workload(agent_id, Usage::Server);
    let tls = FakeAgentTls {
        server_chain: server.chain.clone(),
        server_key: server.key(),
        client_roots: vec![pki.pod_ca.cert_der()],
        allowed_client_id: WORKER_SPIFFE_ID.to_owned(),
    };
    FakeNodeAgent::spawn(socket, tls, pki.actor_ca.clone())
        .await
        .expect("fake agent")
}

fn actor() -> ActorRef {
    ActorRef::new("team-a", "agent-1", "6f1c2a9e-uid").expect("valid actor")
}

/// Mints for `actor()` with a fresh key; returns the key's check of the chain.
async fn mint(source: &NodeAgentSource) -> Result<SystemTime, MintError> {
    let key = new_actor_key().expect("key");
    let csr = actor_csr(&key).expect("csr");
    let chain = source.mint(&actor(), &csr).await?;
    check_minted(&chain, &key, SystemTime::now())
}

#[tokio::test]
async fn mint_returns_a_chain_that_passes_the_callers_checks() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.worker_source();

    let key = new_actor_key().expect("key");
    let csr = actor_csr(&key).expect("csr");
    let chain = source.mint(&actor(), &csr).await.expect("minted");

    let now = SystemTime::now();
    let not_after = check_minted(&chain, &key, now).expect("the caller's checks pass");
    let remaining = not_after.duration_since(now).expect("in the future");
    assert!(
        remaining > HOUR - Duration::from_secs(10) && remaining <= HOUR,
        "default lifetime is one hour, got {remaining:?}"
    );
    assert_eq!(chain.len(), 2);
    assert_eq!(
        chain[1],
        node.pki.actor_ca.cert_der(),
        "signed by the actor CA"
    );
    assert_eq!(
        verify_actor_leaf(&chain[0]).expect("an actor leaf"),
        ActorIdentity::for_atunnel(&actor())
    );

    // A second mint reuses the connection.
    mint(&source).await.expect("second mint");
    assert_eq!(node.agent.calls(), 2);
    assert_eq!(node.agent.connections(), 1, "one connection for both mints");
}

#[tokio::test]
async fn sign_behavior_sets_the_lifetime() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    node.agent.set_behavior(Behavior::Sign {
        lifetime: Duration::from_secs(60),
    });
    let now = SystemTime::now();
    let not_after = mint(&node.worker_source()).await.expect("minted");
    assert!(not_after <= now + Duration::from_secs(61), "{not_after:?}");
}

#[tokio::test]
async fn denial_is_terminal() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    node.agent.set_behavior(Behavior::Deny);
    let err = mint(&node.worker_source()).await.expect_err("denied");
    assert!(
        matches!(
            err,
            MintError::Refused {
                code: RefusalCode::PermissionDenied,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_terminal());
    assert_eq!(node.agent.calls(), 1);
}

#[tokio::test]
async fn aborted_and_failed_precondition_are_terminal() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.worker_source();
    for (code, want) in [
        (Code::Aborted, RefusalCode::Aborted),
        (Code::FailedPrecondition, RefusalCode::FailedPrecondition),
        (Code::PermissionDenied, RefusalCode::PermissionDenied),
    ] {
        node.agent
            .set_behavior(Behavior::Fail(code, format!("actor gone ({code:?})")));
        let err = mint(&source).await.expect_err("refused");
        match &err {
            MintError::Refused { code: got, message } => {
                assert_eq!(*got, want);
                assert!(message.contains("actor gone"), "{message}");
            }
            other => panic!("{code:?} gave {other:?}"),
        }
        assert!(err.is_terminal(), "{err}");
    }
}

#[tokio::test]
async fn unavailable_is_retryable() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.worker_source();
    node.agent
        .set_behavior(Behavior::Fail(Code::Unavailable, "restarting".into()));
    let err = mint(&source).await.expect_err("unavailable");
    let MintError::Failed(message) = &err else {
        panic!("want Failed, got {err:?}");
    };
    assert!(!err.is_terminal());
    assert!(message.contains("Unavailable"), "{message}");
    assert!(message.contains("restarting"), "{message}");
    assert!(
        message.contains(&node.socket.display().to_string()),
        "{message}"
    );

    // The agent answered, so the connection is healthy and is kept.
    node.agent.set_behavior(Behavior::default());
    mint(&source).await.expect("retry succeeds");
    assert_eq!(node.agent.connections(), 1);
}

#[tokio::test]
async fn late_answer_times_out() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.source(WORKER_SPIFFE_ID, Duration::from_millis(200));
    node.agent
        .set_behavior(Behavior::Late(Duration::from_secs(2)));

    let started = std::time::Instant::now();
    let err = mint(&source).await.expect_err("too late");
    let waited = started.elapsed();
    let MintError::Failed(message) = &err else {
        panic!("want Failed, got {err:?}");
    };
    assert!(message.contains("timeout"), "{message}");
    assert!(!err.is_terminal());
    assert!(waited < Duration::from_secs(2), "gave up after {waited:?}");

    node.agent.set_behavior(Behavior::default());
    mint(&source)
        .await
        .expect("the next mint on the same source");
    assert_eq!(node.agent.calls(), 2);
    // The timed-out connection was dropped and a new one dialled.
    assert_eq!(node.agent.connections(), 2);
}

#[tokio::test]
async fn agent_with_the_wrong_identity_is_refused() {
    let node = Node::start(IMPOSTOR_ID).await;
    let err = mint(&node.worker_source()).await.expect_err("impostor");
    let MintError::Failed(message) = &err else {
        panic!("want Failed, got {err:?}");
    };
    assert!(!err.is_terminal());
    assert!(message.contains("impostor"), "{message}");
    assert_eq!(node.agent.calls(), 0);
    assert_eq!(node.agent.connections(), 0);
}

#[tokio::test]
async fn worker_with_the_wrong_identity_is_refused() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.source(IMPOSTOR_ID, Duration::from_secs(10));
    let err = mint(&source).await.expect_err("impostor worker");
    let MintError::Failed(message) = &err else {
        panic!("want Failed, got {err:?}");
    };
    assert!(!err.is_terminal());
    // Reached this agent's socket and was refused in the TLS handshake.
    assert!(
        message.contains(&node.socket.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains("received fatal alert: CertificateUnknown"),
        "{message}"
    );
    assert_eq!(node.agent.calls(), 0);
    assert_eq!(node.agent.connections(), 0);

    // Positive control: the same agent serves the real worker identity.
    mint(&node.worker_source())
        .await
        .expect("the worker identity is served by the same agent");
    assert_eq!((node.agent.calls(), node.agent.connections()), (1, 1));
}

#[tokio::test]
async fn agent_gone_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("missing.sock");
    let pki = Pki::new();
    let worker = pki.workload(WORKER_SPIFFE_ID, Usage::Client);
    let source = NodeAgentSource::new(NodeAgentConfig::new(
        &socket,
        worker.chain.clone(),
        worker.key(),
        vec![pki.pod_ca.cert_der()],
    ))
    .expect("source");

    let err = mint(&source).await.expect_err("no agent");
    let MintError::Failed(message) = &err else {
        panic!("want Failed, got {err:?}");
    };
    assert!(!err.is_terminal());
    assert!(message.contains(&socket.display().to_string()), "{message}");
    assert!(message.contains("No such file"), "{message}");
}

#[tokio::test]
async fn source_reconnects_after_the_agent_restarts() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.worker_source();
    mint(&source).await.expect("first agent");

    let Node {
        pki,
        _dir,
        socket,
        agent,
    } = node;
    agent.shutdown().await;
    assert!(!socket.exists(), "shutdown removes the socket");
    let err = mint(&source).await.expect_err("agent down");
    assert!(matches!(err, MintError::Failed(_)), "{err:?}");

    let agent = spawn_agent(&pki, &socket, ATELET_SPIFFE_ID).await;
    mint(&source).await.expect("same source, restarted agent");
    assert_eq!(agent.calls(), 1);
    drop(agent);
    assert!(!socket.exists(), "drop removes the socket");
}

#[tokio::test]
async fn fake_agent_refuses_malformed_requests() {
    let node = Node::start(ATELET_SPIFFE_ID).await;
    let source = node.worker_source();

    let err = source
        .mint(&actor(), b"not a csr")
        .await
        .expect_err("bad csr");
    assert!(err.to_string().contains("InvalidArgument"), "{err}");
    assert!(!err.is_terminal());

    // Bypasses ActorRef::new, as a buggy or hostile client could.
    let nameless = ActorRef {
        atespace: "team-a".into(),
        name: String::new(),
        uid: "uid".into(),
    };
    let csr = actor_csr(&new_actor_key().expect("key")).expect("csr");
    let err = source.mint(&nameless, &csr).await.expect_err("no name");
    assert!(err.to_string().contains("InvalidArgument"), "{err}");
    assert_eq!(node.agent.calls(), 2);
}

#[tokio::test]
async fn setup_errors_name_what_is_wrong() {
    let pki = Pki::new();
    let worker = pki.workload(WORKER_SPIFFE_ID, Usage::Client);

    let mut cfg = NodeAgentConfig::new(
        "/run/atelet/ateom.sock",
        worker.chain.clone(),
        worker.key(),
        vec![],
    );
    let err = NodeAgentSource::new(cfg).expect_err("no roots");
    assert!(
        matches!(&err, NodeAgentError::Verifier { peer_id, .. } if peer_id == ATELET_SPIFFE_ID),
        "{err:?}"
    );

    cfg = NodeAgentConfig::new(
        format!("/{}", "s".repeat(200)),
        worker.chain.clone(),
        worker.key(),
        vec![pki.pod_ca.cert_der()],
    );
    let err = NodeAgentSource::new(cfg).expect_err("path too long");
    assert!(matches!(err, NodeAgentError::SocketPath { .. }), "{err:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_socket = dir.path().join("file");
    std::fs::write(&not_a_socket, b"keep me").expect("write");
    let server = pki.workload(ATELET_SPIFFE_ID, Usage::Server);
    let err = FakeNodeAgent::spawn(
        &not_a_socket,
        FakeAgentTls {
            server_chain: server.chain.clone(),
            server_key: server.key(),
            client_roots: vec![pki.pod_ca.cert_der()],
            allowed_client_id: WORKER_SPIFFE_ID.into(),
        },
        pki.actor_ca.clone(),
    )
    .await
    .expect_err("not a socket");
    assert!(
        matches!(&err, NodeAgentError::NotASocket { path } if *path == not_a_socket),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read(&not_a_socket).expect("still there"),
        b"keep me"
    );
}
