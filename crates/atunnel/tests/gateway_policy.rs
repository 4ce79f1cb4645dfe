//! The gateway's destination policy through real tunnels: real TLS, actor
//! certificates and loopback destinations. A refused CONNECT is a 403
//! naming the rule, counted by rule, and the destination is never dialled,
//! whichever form its address is written in; an allowed one carries bytes
//! end to end.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use atunnel_connect::client::OpenError;
use atunnel_gateway::policy::{DefaultDeny, PolicySpec};
use atunnel_identity::clock::Clock;

fn refusal(r: Result<atunnel_connect::GatewayTunnel, OpenError>) -> (u16, String) {
    match r {
        Err(OpenError::ConnectRefused { status, body, .. }) => (status, body),
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, the tunnel opened"),
    }
}

/// A loopback destination that counts the connections it accepts.
async fn counted_destination() -> (SocketAddr, Arc<AtomicUsize>) {
    let dialled = Arc::new(AtomicUsize::new(0));
    let count = dialled.clone();
    let addr = destination(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        async {}
    })
    .await;
    (addr, dialled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_destination_is_refused_with_403_in_every_address_form_and_never_dialled() {
    let pki = Pki::new();
    let (denied, dialled) = counted_destination().await;
    let echo = echo_server().await;
    let deny = format!("127.0.0.1:{}", denied.port());
    let far = forward_with(PolicySpec {
        allow: vec![
            "0.0.0.0/0".parse().expect("rule"),
            "::/0".parse().expect("rule"),
        ],
        deny: vec![deny.parse().expect("rule")],
        skip_default: vec![DefaultDeny::Loopback],
        ..Default::default()
    });
    let policy = far.policy.clone();
    let gw = gateway(&pki, far, |_| {}).await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let alpha = prepare(&pki, gw.addr, actor("alpha"), source).await;
    let client = alpha.client();
    let port = denied.port();
    for authority in [
        format!("127.0.0.1:{port}"),
        // IPv4-mapped: the bypass of an IPv4 rule under `::/0`.
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::ffff:7f00:1]:{port}"),
    ] {
        assert_eq!(
            refusal(client.open_authority(&authority).await),
            (403, format!("egress denied by deny {deny}")),
            "{authority}"
        );
    }
    // The metadata address, under allow-everything.
    assert_eq!(
        refusal(client.open_authority("169.254.169.254:80").await),
        (
            403,
            "egress denied by default link-local 169.254.0.0/16".to_string()
        )
    );
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        0,
        "a refused destination was dialled"
    );
    let stats = policy.stats();
    assert_eq!(
        stats.refused_by_rule[&format!("deny {deny}")],
        3,
        "{stats:?}"
    );
    assert_eq!(
        stats.refused_by_rule["default link-local 169.254.0.0/16"], 1,
        "{stats:?}"
    );

    // Allowed, in mapped form: dialled as IPv4, the bytes intact both ways.
    let mut tunnel = client
        .open_authority(&format!("[::ffff:127.0.0.1]:{}", echo.port()))
        .await
        .expect("an allowed tunnel");
    let up = random(128 * 1024, 5);
    assert!(
        echoed(&mut tunnel, &up).await == up,
        "the echo came back altered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_denied_by_default_until_the_operator_lifts_it() {
    let pki = Pki::new();
    let (dest, dialled) = counted_destination().await;
    let gw = gateway(
        &pki,
        forward_with(atunnel_gateway::policy::allowing(&["0.0.0.0/0"])),
        |_| {},
    )
    .await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let alpha = prepare(&pki, gw.addr, actor("alpha"), source).await;
    assert_eq!(
        refusal(alpha.client().open_authority(&dest.to_string()).await),
        (
            403,
            "egress denied by default loopback 127.0.0.0/8".to_string()
        )
    );
    assert_eq!(dialled.load(Ordering::SeqCst), 0);
}
