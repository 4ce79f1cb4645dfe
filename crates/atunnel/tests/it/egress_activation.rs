//! Per-actor egress activation: admission, expiry, renewal, deactivation.

use atunnel_support::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use atunnel_identity::cert_source::{MintError, RefusalCode};
use atunnel_identity::clock::Clock;
use atunnel_identity::credential::{ActorCredential, renew_until_cancelled};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The certificate and key the credential would present now.
fn current_cert(cred: &ActorCredential) -> Arc<rustls::sign::CertifiedKey> {
    use rustls::client::ResolvesClientCert;
    cred.resolve(&[], &[]).expect("a valid certificate")
}

/// Alpha's credential minted from `source` (on the source's clock), and
/// the source, to script and count its mints.
async fn minted(source: TestSource) -> (Arc<TestSource>, Arc<ActorCredential>) {
    let source = Arc::new(source);
    let clock = source.clock.clone();
    let cred = ActorCredential::mint(actor("alpha"), source.as_ref(), clock)
        .await
        .expect("mint");
    (source, Arc::new(cred))
}

/// `cred` renewed from `source` until `cancel`, in a task of its own.
fn renewing(
    cred: &Arc<ActorCredential>,
    source: &Arc<TestSource>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(renew_until_cancelled(
        cred.clone(),
        source.clone(),
        cancel.clone(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_before_activation_are_closed_with_no_bytes() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let a = actor("alpha");
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, SINK_ECHO.parse().expect("addr"), &cancel).await;
    let mut early = TcpStream::connect(addr).await.expect("connect");
    assert!(closes_with_no_bytes(&mut early).await);
    assert_eq!(egress.stats().rejected_total, 1);

    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    egress
        .activate(&a.uid, prepare(&pki, gw.addr, a.clone(), source).await)
        .expect("activate");
    let mut s = TcpStream::connect(addr).await.expect("connect");
    assert!(echoes(&mut s, b"armed").await);
}

#[tokio::test]
async fn failed_mint_fails_closed() {
    let pki = Pki::new();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    source.fail_next(MintError::Refused {
        code: RefusalCode::PermissionDenied,
        message: "not yours".into(),
    });
    let result = atunnel::egress::ActorEgress::prepare(
        actor("alpha"),
        client_config(&pki, "127.0.0.1:1".parse().expect("addr")),
        source,
        Clock::new(),
    )
    .await;
    let err = result.err().expect("no egress without a certificate");
    assert!(err.to_string().contains("not yours"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_rejects_new_but_preserves_established() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let a = actor("alpha");
    let clock = Clock::new();
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), clock.clone()));
    let egress = egress();
    let cancel = CancellationToken::new();
    let addr = listen(&egress, &a.uid, SINK_ECHO.parse().expect("addr"), &cancel).await;
    egress
        .activate(
            &a.uid,
            prepare(&pki, gw.addr, a.clone(), source.clone()).await,
        )
        .expect("activate");

    let mut established = TcpStream::connect(addr).await.expect("connect");
    assert!(echoes(&mut established, b"before expiry").await);

    // The certificate (1 h) expires; the renewal timer (54 min of real time)
    // has not fired, so nothing renews it.
    clock.advance(Duration::from_secs(3601));
    let mut late = TcpStream::connect(addr).await.expect("connect");
    assert!(
        closes_with_no_bytes(&mut late).await,
        "a new tunnel opened on an expired certificate"
    );
    // Refused at admission for the expired certificate, not a tunnel that
    // tried to open and failed.
    let counts = TunnelCounts {
        rejected: 1,
        admitted: 1,
        failed: 0,
    };
    assert_eq!(tunnel_counts(&egress), counts);
    assert!(echoes(&mut established, b"after expiry, still draining").await);
    assert_eq!(source.mints.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn renews_at_ninety_percent_of_the_remaining_lifetime() {
    let pki = Pki::new();
    let (source, cred) = minted(TestSource::new(pki.actor_ca.clone(), Clock::new())).await;
    let first_expiry = cred.expires_at().expect("valid");
    let first = current_cert(&cred);
    let cancel = CancellationToken::new();
    let task = renewing(&cred, &source, &cancel);
    // 90% of 3600 s = 3240 s.
    tokio::time::sleep(Duration::from_secs(3230)).await;
    assert_eq!(source.mints.load(Ordering::SeqCst), 1, "renewed too early");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(source.mints.load(Ordering::SeqCst), 2, "not renewed at 90%");
    let second_expiry = cred.expires_at().expect("valid");
    assert!(second_expiry > first_expiry);
    let second = current_cert(&cred);
    assert_ne!(first.cert[0], second.cert[0], "a new certificate is served");
    assert!(
        Arc::ptr_eq(&first.key, &second.key),
        "the activation's key is reused across renewals"
    );
    cancel.cancel();
    task.await.expect("renewal task ends on cancel");
}

#[tokio::test(start_paused = true)]
async fn failed_renewal_is_retried_on_the_reference_schedule() {
    let pki = Pki::new();
    let (source, cred) = minted(TestSource::new(pki.actor_ca.clone(), Clock::new())).await;
    source.fail_next(MintError::Failed("atelet unavailable".into()));
    let cancel = CancellationToken::new();
    let task = renewing(&cred, &source, &cancel);
    tokio::time::sleep(Duration::from_secs(3241)).await;
    assert_eq!(
        source.mints.load(Ordering::SeqCst),
        2,
        "first renewal attempted"
    );
    // About 360 s remain: retry after min(30 s, max(1 s, 36 s), 360 s) = 30 s
    // (certificate times are whole seconds, so allow a second either way).
    tokio::time::sleep(Duration::from_secs(27)).await;
    assert_eq!(source.mints.load(Ordering::SeqCst), 2, "retried too early");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        source.mints.load(Ordering::SeqCst),
        3,
        "not retried after 30 s"
    );
    assert!(cred.is_valid());
    cancel.cancel();
    task.await.expect("join");
}

#[tokio::test(start_paused = true)]
async fn after_expiry_renewal_is_retried_every_25_to_35_seconds() {
    let pki = Pki::new();
    let mut source = TestSource::new(pki.actor_ca.clone(), Clock::new());
    source.lifetime = Duration::from_secs(10);
    let (source, cred) = minted(source).await;
    for _ in 0..200 {
        source.fail_next(MintError::Failed("down".into()));
    }
    let cancel = CancellationToken::new();
    let task = renewing(&cred, &source, &cancel);
    // Let it fail until the certificate has expired (10 s of lifetime).
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!cred.is_valid(), "expired certificate still admits");
    let before = source.mints.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(24)).await;
    assert!(source.mints.load(Ordering::SeqCst) <= before + 1);
    // Over 10 minutes, retries every 25-35 s: 17 to 24 attempts, no spinning.
    let start = source.mints.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(600)).await;
    let attempts = source.mints.load(Ordering::SeqCst) - start;
    assert!(
        (17..=24).contains(&attempts),
        "{attempts} attempts in 600 s"
    );
    cancel.cancel();
    task.await.expect("join");
}

#[tokio::test(start_paused = true)]
async fn terminal_refusals_stop_renewal_and_block_new_tunnels() {
    for code in [
        RefusalCode::Aborted,
        RefusalCode::FailedPrecondition,
        RefusalCode::PermissionDenied,
    ] {
        let pki = Pki::new();
        let (source, cred) = minted(TestSource::new(pki.actor_ca.clone(), Clock::new())).await;
        source.fail_next(MintError::Refused {
            code,
            message: "actor deleted".into(),
        });
        let task = renewing(&cred, &source, &CancellationToken::new());
        tokio::time::timeout(Duration::from_secs(4000), task)
            .await
            .expect("renewal stops by itself")
            .expect("join");
        assert!(!cred.is_valid(), "{code:?} left egress open");
        assert_eq!(source.mints.load(Ordering::SeqCst), 2, "{code:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivation_closes_one_actors_tunnels_and_leaves_the_others() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let (a, b) = (actor("alpha"), actor("bravo"));
    let egress = egress();
    let cancel = CancellationToken::new();
    let mut addrs = Vec::new();
    for who in [&a, &b] {
        let (addr, _) = listen_activated(&pki, &egress, who, gw.addr, &cancel).await;
        addrs.push(addr);
    }
    let mut sa = TcpStream::connect(addrs[0]).await.expect("connect a");
    let mut sb = TcpStream::connect(addrs[1]).await.expect("connect b");
    assert!(echoes(&mut sa, b"a1").await);
    assert!(echoes(&mut sb, b"b1").await);

    egress
        .deactivate(&a.uid)
        .await
        .expect("deactivate waits for a's tunnels");
    assert!(
        closes_with_no_bytes(&mut sa).await,
        "a's open tunnel survived deactivation"
    );
    let mut again = TcpStream::connect(addrs[0]).await.expect("connect a again");
    assert!(
        closes_with_no_bytes(&mut again).await,
        "a admitted after deactivation"
    );
    // Refused at admission, not a tunnel of the old activation that closed.
    let stats = egress.stats();
    assert_eq!(
        (stats.rejected_total, stats.tunnels_total),
        (1, 2),
        "{stats:?}"
    );
    assert!(echoes(&mut sb, b"b unaffected").await);
    // Idempotent.
    egress
        .deactivate(&a.uid)
        .await
        .expect("second deactivate is a no-op");
    assert_eq!(egress.stats().tunnels_open, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_opening_during_deactivation_is_never_handed_to_the_next_activation() {
    let pki = Pki::new();
    // A gateway that accepts TCP and never answers: the open hangs.
    let (hanging, _hanging) = silent_peer().await;
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let a = actor("alpha");
    let egress = egress();
    let cancel = CancellationToken::new();
    let (addr, source) = listen_activated(&pki, &egress, &a, hanging, &cancel).await;
    let mut opening = TcpStream::connect(addr).await.expect("connect");
    // Wait until the tunnel task exists (it is counted open from its start).
    while egress.stats().tunnels_open == 0 {
        tokio::task::yield_now().await;
    }
    egress.deactivate(&a.uid).await.expect("deactivate");
    egress
        .activate(&a.uid, prepare(&pki, gw.addr, a.clone(), source).await)
        .expect("reactivate");
    assert!(
        closes_with_no_bytes(&mut opening).await,
        "the old activation's connection lived on"
    );
    let mut fresh = TcpStream::connect(addr).await.expect("connect");
    assert!(echoes(&mut fresh, b"new activation").await);
}

#[tokio::test]
async fn a_second_activation_of_the_same_actor_is_refused() {
    let pki = Pki::new();
    let a = actor("alpha");
    let egress = egress();
    let dead = "127.0.0.1:1".parse().expect("addr");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    egress
        .activate(&a.uid, prepare(&pki, dead, a.clone(), source.clone()).await)
        .expect("activate");
    let err = egress
        .activate(&a.uid, prepare(&pki, dead, a.clone(), source).await)
        .expect_err("already active");
    assert!(err.to_string().contains("already activated"), "{err}");
}

/// Deactivation is bounded even when the actor's tunnels cannot finish: here
/// the runtime that runs them is wedged (its only thread blocked), so no
/// tunnel task can see its cancellation.
#[test]
fn deactivation_of_tunnels_that_cannot_finish_is_bounded() {
    let drain = Duration::from_millis(300);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (wedge_tx, mut wedge_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (unwedge_tx, unwedge_rx) = std::sync::mpsc::channel::<()>();
    // The tunnel's own runtime: one thread, so blocking it stops every task.
    let tunnel_side = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let pki = Pki::new();
            let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
            let a = actor("alpha");
            let egress = atunnel::egress::Egress::new(
                atunnel::egress::EgressConfig {
                    drain_timeout: drain,
                    ..Default::default()
                },
                atunnel_core::BufferPool::default(),
            );
            let cancel = CancellationToken::new();
            let (addr, _) = listen_activated(&pki, &egress, &a, gw.addr, &cancel).await;
            let mut s = TcpStream::connect(addr).await.expect("connect");
            assert!(echoes(&mut s, b"open").await);
            ready_tx
                .send((egress, a.uid.clone(), s.into_std().expect("std socket")))
                .expect("hand over");
            wedge_rx.recv().await;
            unwedge_rx.recv().expect("unwedge");
            // Running again: the cancelled tunnel ends now.
            tokio::task::yield_now().await;
            drop(gw);
        });
    });
    let (egress, uid, actor) = ready_rx.recv().expect("tunnel side ready");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut actor = TcpStream::from_std(actor).expect("register");
        assert_eq!(egress.stats().tunnels_open, 1);
        wedge_tx.send(()).expect("wedge");
        let started = std::time::Instant::now();
        let err = egress.deactivate(&uid).await.expect_err("cannot drain");
        let took = started.elapsed();
        assert!(
            matches!(
                err,
                // The tunnel and the certificate renewal.
                atunnel::egress::EgressError::DrainTimeout { open: 2, .. }
            ),
            "{err}"
        );
        assert!(
            took >= drain && took < drain * 2 + Duration::from_secs(1),
            "deactivate took {took:?} with a {drain:?} drain bound"
        );
        unwedge_tx.send(()).expect("unwedge");
        // The tunnel was cancelled all the same: it is reset (its stream was
        // cut, not finished) once its runtime runs.
        next_read_is_reset(&mut actor, "the cancelled tunnel").await;
        assert_eq!(egress.stats().tunnels_open, 0);
    });
    tunnel_side.join().expect("tunnel side");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_listeners_whose_callers_never_cancel_them() {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let a = actor("alpha");
    let egress = egress();
    let never = CancellationToken::new();
    let (addr, _) = listen_activated(&pki, &egress, &a, gw.addr, &never).await;
    let mut open = TcpStream::connect(addr).await.expect("connect");
    assert!(echoes(&mut open, b"before shutdown").await);
    tokio::time::timeout(Duration::from_secs(10), egress.shutdown())
        .await
        .expect("shutdown returns");
    assert!(!never.is_cancelled());
    assert!(
        closes_with_no_bytes(&mut open).await,
        "the tunnel outlived shutdown"
    );
    let refused = TcpStream::connect(addr)
        .await
        .expect_err("the listener outlived shutdown");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );
}

/// Answers every CSR with a certificate for a key of its own: a node agent
/// that mixed up two requests.
struct SwappedKeySource(TestSource);

impl atunnel_identity::cert_source::CertificateSource for SwappedKeySource {
    fn mint<'a>(
        &'a self,
        actor: &'a atunnel_identity::identity::ActorRef,
        _csr_der: &'a [u8],
    ) -> atunnel_identity::cert_source::MintFuture<'a> {
        Box::pin(async move {
            let other = rcgen::KeyPair::generate().expect("key");
            let csr = rcgen::CertificateParams::new(Vec::<String>::new())
                .expect("params")
                .serialize_request(&other)
                .expect("csr");
            self.0.mint(actor, csr.der()).await
        })
    }
}

#[tokio::test]
async fn a_minted_certificate_that_fails_its_checks_fails_closed() {
    let pki = Pki::new();
    let gw: std::net::SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let prepare_with = |source: Arc<dyn atunnel_identity::cert_source::CertificateSource>,
                        clock: Clock| {
        atunnel::egress::ActorEgress::prepare(
            actor("alpha"),
            client_config(&pki, gw),
            source,
            clock,
        )
    };
    // For another key than the CSR's.
    let swapped = Arc::new(SwappedKeySource(TestSource::new(
        pki.actor_ca.clone(),
        Clock::new(),
    )));
    let err = prepare_with(swapped, Clock::new())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("public key"), "{err}");
    // Without ClientAuth.
    let mut no_client_auth = TestSource::new(pki.actor_ca.clone(), Clock::new());
    no_client_auth.options.client_auth_eku = false;
    let err = prepare_with(Arc::new(no_client_auth), Clock::new())
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("the leaf lacks the ClientAuth extended key usage"),
        "{err}"
    );
    // Expired by the time it arrives: the worker's clock is two hours ahead
    // of the node agent's.
    let late = Clock::new();
    late.advance(Duration::from_secs(7200));
    let err = prepare_with(
        Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new())),
        late,
    )
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains("expired"), "{err}");
    // Positive control: the same preparation with a certificate that passes
    // its checks succeeds, so the refusals above are the checks' doing.
    prepare_with(
        Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new())),
        Clock::new(),
    )
    .await
    .expect("a certificate that passes its checks is accepted");
}
