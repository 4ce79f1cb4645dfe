//! Actor certificates from the node agent drive egress: minted before the
//! workload starts, refused closed.

use atunnel_support::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use atunnel::egress::ActorEgress;
use atunnel_identity::clock::Clock;
use atunnel_identity::pki::{ATELET_SPIFFE_ID, CertificateAuthority, Usage, WORKER_SPIFFE_ID};
use atunnel_nodeagent::{Behavior, FakeAgentTls, FakeNodeAgent, NodeAgentConfig, NodeAgentSource};
use tokio_util::sync::CancellationToken;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_runs_on_certificates_the_node_agent_mints_and_fails_closed_when_it_refuses() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let pod_ca = CertificateAuthority::new("pod identity CA").expect("ca");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("ateom-support.sock");
    let atelet = pod_ca
        .issue(Some(ATELET_SPIFFE_ID), &[], &[], Usage::Server, HOUR)
        .expect("atelet cert");
    let agent = FakeNodeAgent::spawn(
        &socket,
        FakeAgentTls {
            server_chain: atelet.chain.clone(),
            server_key: atelet.key(),
            client_roots: vec![pod_ca.cert_der()],
            allowed_client_id: WORKER_SPIFFE_ID.to_string(),
        },
        pki.actor_ca.clone(),
    )
    .await
    .expect("fake node agent");
    let worker = pod_ca
        .issue(Some(WORKER_SPIFFE_ID), &[], &[], Usage::Client, HOUR)
        .expect("worker cert");
    let source = Arc::new(
        NodeAgentSource::new(NodeAgentConfig::new(
            &socket,
            worker.chain.clone(),
            worker.key(),
            vec![pod_ca.cert_der()],
        ))
        .expect("source"),
    );

    // Minted through the agent, accepted by the gateway, bytes flow.
    let a = actor("alpha");
    let prepared = ActorEgress::prepare(
        a.clone(),
        client_config(&pki, gw.addr),
        source.clone(),
        Clock::new(),
    )
    .await
    .expect("prepared with the agent's certificate");
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(
        &egress,
        &a.uid,
        "192.0.2.10:7".parse().expect("addr"),
        &cancel,
    )
    .await;
    egress.activate(&a.uid, prepared).expect("activate");
    let data = random(100_000, 9);
    assert_eq!(round_trip(addr, data.clone()).await, data);
    assert_eq!(agent.calls(), 1);

    // A denial before the workload starts leaves no egress at all.
    agent.set_behavior(Behavior::Deny);
    let denied = ActorEgress::prepare(
        actor("bravo"),
        client_config(&pki, gw.addr),
        source,
        Clock::new(),
    )
    .await;
    let err = denied.err().expect("denied fails closed");
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
}
