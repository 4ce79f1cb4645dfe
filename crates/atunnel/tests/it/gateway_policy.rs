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

/// The gateway as its binary runs it (`run_forward` with flags parsed as
/// the command line's), listening on a free loopback port, its policy
/// from `policy` (checked every `poll`; "0": on SIGHUP only) with loopback
/// not denied by default. Its address and what stops it.
async fn forward_from_flags(
    pki: &Pki,
    dir: &std::path::Path,
    policy: &std::path::Path,
    poll: &str,
) -> (SocketAddr, tokio_util::sync::CancellationToken) {
    use clap::Parser;
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write");
        path.display().to_string()
    };
    let cert = write("cert.pem", pki.gateway_cert.cert_pem.clone());
    let key = write("key.pem", pki.gateway_cert.key_pem.clone());
    let actor_ca = write("actor-ca.pem", pki.actor_ca.cert_pem());
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let args = atunnel_gateway::cli::ForwardArgs::try_parse_from([
        "atunnel-gateway".to_string(),
        format!("--listen={listen}"),
        format!("--cert={cert}"),
        format!("--key={key}"),
        format!("--actor-ca={actor_ca}"),
        format!("--policy-file={}", policy.display()),
        format!("--policy-file-poll-interval={poll}"),
        "--skip-default-deny=loopback".to_string(),
    ])
    .expect("flags");
    let cancel = tokio_util::sync::CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move { atunnel_gateway::cli::run_forward(&args, stop).await });
    // Bound once a connection is accepted (bounded: binding is the
    // gateway's own, with nothing to await).
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(listen).await.is_err() {
        assert!(
            tokio::time::Instant::now() < until,
            "the gateway never listened"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (listen, cancel)
}

/// A tunnel of `egress`'s to `dest` opens (`what` says why it should).
async fn opens(egress: &atunnel::egress::ActorEgress, dest: SocketAddr, what: &str) {
    drop(
        egress
            .client()
            .open_authority(&dest.to_string())
            .await
            .expect(what),
    );
}

/// Opens tunnels to `dest` until one is refused 403 (bounded: the reload
/// is the gateway's own, with nothing to await).
async fn refused_within(client: &atunnel_connect::GatewayClient, dest: SocketAddr) -> String {
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match client.open_authority(&dest.to_string()).await {
            Err(OpenError::ConnectRefused { status, body, .. }) => {
                assert_eq!(status, 403, "{body}");
                return body;
            }
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the new policy never applied"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_file_is_reloaded_when_it_changes_and_on_sighup_without_a_restart() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    let (dest, _) = counted_destination().await;
    let deny = format!("deny 127.0.0.1:{}\n", dest.port());
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));

    // A change of the file, seen by the poll.
    let polled = dir.path().join("polled");
    std::fs::write(&polled, "allow 127.0.0.0/8\n").expect("write");
    let (gw, stop) = forward_from_flags(&pki, dir.path(), &polled, "50ms").await;
    let alpha = prepare(&pki, gw, actor("alpha"), source.clone()).await;
    opens(&alpha, dest, "allowed").await;
    std::fs::write(&polled, format!("allow 127.0.0.0/8\n{deny}")).expect("write");
    let body = refused_within(alpha.client(), dest).await;
    assert_eq!(body, format!("egress denied by {}", deny.trim_end()));
    stop.cancel();

    // SIGHUP alone: the poll is off, so the changed file waits for it.
    let signalled = dir.path().join("signalled");
    std::fs::write(&signalled, "allow 127.0.0.0/8\n").expect("write");
    let (gw, stop) = forward_from_flags(&pki, dir.path(), &signalled, "0").await;
    let bravo = prepare(&pki, gw, actor("bravo"), source).await;
    // Answered: the gateway serves, so its reloader (joined with it) has
    // started and holds the SIGHUP handler.
    opens(&bravo, dest, "allowed").await;
    std::fs::write(&signalled, format!("allow 127.0.0.0/8\n{deny}")).expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    opens(&bravo, dest, "still allowed: no poll, no signal yet").await;
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGHUP)
        .expect("SIGHUP");
    let body = refused_within(bravo.client(), dest).await;
    assert_eq!(body, format!("egress denied by {}", deny.trim_end()));
    stop.cancel();
}
