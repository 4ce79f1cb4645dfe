//! The gateway's per-identity budget and its overload guard, with real
//! TLS, real actor certificates and a real destination: an identity past
//! its tunnel budget is refused (429) while another opens as usual, and an
//! overloaded gateway refuses new CONNECTs (503).

use atunnel_support::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use atunnel_connect::client::OpenError;
use atunnel_gateway::budget::IdentityBudget;
use atunnel_identity::clock::Clock;
use atunnel_process::overload::OverloadConfig;

fn refused_with(r: Result<atunnel_connect::GatewayTunnel, OpenError>) -> u16 {
    match r {
        Err(OpenError::ConnectRefused { status, .. }) => status,
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, the tunnel opened"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_past_its_budget_is_refused_and_another_opens_as_usual() {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |cfg| {
        cfg.budget = IdentityBudget {
            max_tunnels: 2,
            ..IdentityBudget::default()
        };
    })
    .await;
    let echo = echo_server().await.to_string();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let alpha = prepare(&pki, gw.addr, actor("alpha"), source.clone()).await;
    let beta = prepare(&pki, gw.addr, actor("beta"), source).await;
    let mut open = open_at_once(alpha.client(), 2, &echo).await;
    assert_eq!(
        refused_with(alpha.client().open_authority(&echo).await),
        429
    );
    let others = open_at_once(beta.client(), 2, &echo).await;
    assert_eq!(others.len(), 2, "another identity has its whole budget");
    // A tunnel that ends frees its place.
    drop(open.pop());
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match alpha.client().open_authority(&echo).await {
            Ok(t) => {
                open.push(t);
                break;
            }
            Err(OpenError::ConnectRefused { status: 429, .. }) => {
                assert!(tokio::time::Instant::now() < until, "the place never freed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_gateway_refuses_new_tunnels_with_503() {
    let pki = Pki::new();
    let memory = FakeMemoryCgroup::new(100);
    let guard = memory.guard(OverloadConfig::default());
    let g = guard.clone();
    let gw = gateway(&pki, forward_loopback(), move |cfg| cfg.overload = Some(g)).await;
    let echo = echo_server().await.to_string();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let alpha = prepare(&pki, gw.addr, actor("alpha"), source).await;
    let _first = open_at_once(alpha.client(), 1, &echo).await;
    memory.set(900);
    guard.sample();
    assert_eq!(
        refused_with(alpha.client().open_authority(&echo).await),
        503
    );
    memory.set(100);
    guard.sample();
    let _again = open_at_once(alpha.client(), 1, &echo).await;
}
