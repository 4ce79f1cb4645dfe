//! The node agent's refusals as they come off the wire (real Unix socket,
//! mutual TLS, tonic): any status code with any message becomes a
//! `MintError` without a panic, terminal only for the agent's Aborted,
//! FailedPrecondition and PermissionDenied, and carrying the agent's words.

use std::sync::OnceLock;
use std::time::Duration;

use atunnel_identity::pki::{ATELET_SPIFFE_ID, WORKER_SPIFFE_ID, actor_csr, new_actor_key};
use atunnel_identity::{ActorRef, CertificateAuthority, CertificateSource, MintError, Usage};
use atunnel_nodeagent::{
    Behavior, Code, FakeAgentTls, FakeNodeAgent, FakeNodeAgentHandle, NodeAgentConfig,
    NodeAgentSource,
};
use proptest::prelude::*;

const HOUR: Duration = Duration::from_secs(3600);

/// One agent and one source for all cases: the runtime that serves the
/// agent lives as long as the binary.
struct Node {
    runtime: tokio::runtime::Runtime,
    agent: FakeNodeAgentHandle,
    source: NodeAgentSource,
    csr: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let pod_ca = CertificateAuthority::new("pod ca").expect("pod ca");
        let actor_ca = std::sync::Arc::new(CertificateAuthority::new("actor ca").expect("ca"));
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("ateom.sock");
        let server = pod_ca
            .issue(Some(ATELET_SPIFFE_ID), &[], &[], Usage::Server, HOUR)
            .expect("agent cert");
        let tls = FakeAgentTls {
            server_chain: server.chain.clone(),
            server_key: server.key(),
            client_roots: vec![pod_ca.cert_der()],
            allowed_client_id: WORKER_SPIFFE_ID.to_owned(),
        };
        let agent = runtime
            .block_on(FakeNodeAgent::spawn(&socket, tls, actor_ca))
            .expect("fake agent");
        let worker = pod_ca
            .issue(Some(WORKER_SPIFFE_ID), &[], &[], Usage::Client, HOUR)
            .expect("worker cert");
        let source = NodeAgentSource::new(NodeAgentConfig::new(
            &socket,
            worker.chain.clone(),
            worker.key(),
            vec![pod_ca.cert_der()],
        ))
        .expect("source");
        let csr = actor_csr(&new_actor_key().expect("key")).expect("csr");
        Node {
            runtime,
            agent,
            source,
            csr,
            _dir: dir,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn any_status_from_the_agent_is_a_mint_error_terminal_only_for_its_refusals(
        code in 1i32..=16,
        message in "\\PC{0,60}",
    ) {
        let node = node();
        let code = Code::from(code);
        node.agent.set_behavior(Behavior::Fail(code, message.clone()));
        let actor = ActorRef::new("team-a", "agent-1", "uid-1").expect("actor");
        let got = node.runtime.block_on(node.source.mint(&actor, &node.csr));
        let error = got.err().ok_or_else(|| TestCaseError::fail("a failing agent minted"))?;
        let terminal = matches!(code, Code::Aborted | Code::FailedPrecondition | Code::PermissionDenied);
        prop_assert_eq!(error.is_terminal(), terminal, "{:?} gave {}", code, error);
        match &error {
            MintError::Refused { message: text, .. } | MintError::Failed(text) => {
                prop_assert!(text.contains(&message), "{:?} lost in {:?}", message, text);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}
