//! Ingress connections to actors: pooled per activation, reused under load,
//! closed when idle and when their activation ends. Connections are counted
//! where the actor accepts them; atunnel's own counter (for /stats) is
//! checked against that count.

use atunnel_support::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use atunnel::ingress::PoolSettings;
use bytes::Bytes;
use http_body_util::Full;
use tokio::time::MissedTickBehavior;

/// The actor's answer: this long after the request arrives.
const ANSWER_AFTER: Duration = Duration::from_millis(50);
/// The load: 1,000 requests/s answered after 50 ms keeps ~50 in flight.
const RATE: usize = 1000;
/// Requests are sent in batches this often (tokio's timers have 1 ms ticks).
const BATCH_EVERY: Duration = Duration::from_millis(10);
const PER_BATCH: usize = RATE / 100;

fn get() -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .uri(format!("https://{WORKER_NAME}/"))
        .header("ate-target-actor", "team-a/alpha")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

async fn ok(router: &mut RouterConn) {
    let resp = router.send(get()).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert_eq!(body_text(resp).await, "ok");
}

fn answer_ok() -> http::Response<Full<Bytes>> {
    http::Response::new(Full::new(Bytes::from_static(b"ok")))
}

/// Requests being answered by the actor now, and the most seen at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl InFlight {
    fn enter(self: &Arc<Self>) -> Answering {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Answering(self.clone())
    }
}

struct Answering(Arc<InFlight>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends `requests` on an open-loop schedule (RATE per second whatever the
/// answers do), spread over the router connections, and waits for all the
/// answers. Returns how long sending took. A sender the machine stalls skips
/// the ticks it missed rather than bursting them: a burst would measure the
/// test host's scheduler, not the pool.
async fn open_loop(routers: &[RouterConn], requests: usize) -> Duration {
    let mut tick = tokio::time::interval(BATCH_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut answers = tokio::task::JoinSet::new();
    let start = Instant::now();
    for i in 0..requests {
        if i % PER_BATCH == 0 {
            tick.tick().await;
        }
        let RouterConn::H2(send) = &routers[i % routers.len()] else {
            unreachable!("the router multiplexes over HTTP/2")
        };
        let mut router = RouterConn::H2(send.clone());
        answers.spawn(async move { ok(&mut router).await });
    }
    let sending = start.elapsed();
    while let Some(answer) = answers.join_next().await {
        answer.expect("request");
    }
    sending
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_in_flight_at_a_thousand_per_second_reuse_actor_connections() {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let in_flight = Arc::new(InFlight::default());
    let answering = in_flight.clone();
    let (actor, connections) = counted_http1_actor(move |_req| {
        let answering = answering.clone();
        async move {
            let _busy = answering.enter();
            tokio::time::sleep(ANSWER_AFTER).await;
            answer_ok()
        }
    })
    .await;
    running.activate_alpha(&[(80, actor.port())]);
    let mut routers = Vec::new();
    for _ in 0..4 {
        routers.push(RouterConn::open(&pki, running.https, true).await);
    }

    // Warm-up: the pool grows to the load's concurrency, including the
    // peaks a busy test host adds to it.
    open_loop(&routers, 2 * RATE).await;
    let warm = connections.accepted();
    in_flight.peak.store(0, Ordering::SeqCst);

    const MEASURED: usize = 3 * RATE;
    let sending = open_loop(&routers, MEASURED).await;
    let new = connections.accepted() - warm;
    let peak = in_flight.peak.load(Ordering::SeqCst);
    let per_1000 = new as f64 * 1000.0 / MEASURED as f64;
    println!(
        "{MEASURED} requests at {:.0}/s, peak {peak} in flight at the actor: {warm} actor \
         connections after warm-up, then {new} new ({per_1000:.2} per 1,000 requests)",
        MEASURED as f64 / sending.as_secs_f64()
    );
    assert!(
        peak >= 40,
        "only {peak} requests were in flight at once: the load did not reach ~50"
    );
    // A busy host can push concurrency past the warm-up's peak; the pool
    // must then grow by about that much, never by a connection per request.
    let grown = peak.saturating_sub(warm);
    assert!(
        per_1000 < 5.0 || new <= grown + 5,
        "{new} new actor connections for {MEASURED} requests after warm-up \
         (concurrency rose {grown} past the warm pool)"
    );
}

#[tokio::test]
async fn each_activation_has_its_own_connections_closed_when_it_ends() {
    let pki = IngressPki::new();
    let running = ingress(&pki).await;
    let (actor, mut connections) = counted_http1_actor(|_req| async { answer_ok() }).await;
    running.activate_alpha(&[(80, actor.port())]);
    let mut router = RouterConn::open(&pki, running.https, false).await;
    // atunnel's counter agrees with the actor, including connections of
    // activations that have ended.
    let counted = || running.ingress.stats().new_upstream_connections;
    ok(&mut router).await;
    assert_eq!(connections.accepted(), 1);
    assert_eq!(counted(), 1);

    running.ingress.deactivate("team-a", "alpha", "uid-1").await;
    assert!(
        connections.closed(0, Duration::from_secs(5)).await,
        "uid-1's pooled connection outlived its deactivation"
    );

    let dialer = || Box::new(LoopbackDialer([(80, actor.port())].into()));
    running
        .ingress
        .activate("team-a", "alpha", "uid-2", dialer())
        .expect("activate uid-2");
    ok(&mut router).await;
    assert_eq!(
        connections.accepted(),
        2,
        "the new activation dials its own connection"
    );
    assert_eq!(counted(), 2);

    // A newer activation replacing uid-2 without a deactivate closes uid-2's
    // connection just the same, and dials its own.
    running
        .ingress
        .activate("team-a", "alpha", "uid-3", dialer())
        .expect("activate uid-3");
    assert!(
        connections.closed(1, Duration::from_secs(5)).await,
        "uid-2's pooled connection outlived its replacement"
    );
    ok(&mut router).await;
    assert_eq!(connections.accepted(), 3);
    assert_eq!(counted(), 3);
}

#[tokio::test]
async fn idle_actor_connections_close_after_the_idle_timeout() {
    const IDLE: Duration = Duration::from_millis(200);
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| cfg.pools.idle_timeout = IDLE).await;
    let (actor, mut connections) = counted_http1_actor(|_req| async { answer_ok() }).await;
    running.activate_alpha(&[(80, actor.port())]);
    let mut router = RouterConn::open(&pki, running.https, false).await;
    ok(&mut router).await;
    let idle_since = Instant::now();
    assert!(
        connections.closed(0, Duration::from_secs(5)).await,
        "an idle pooled connection stayed open"
    );
    let idled = idle_since.elapsed();
    println!("idle actor connection closed after {idled:?} (timeout {IDLE:?})");
    // The pool may mark it idle a moment before the router has the answer.
    assert!(
        idled >= IDLE - Duration::from_millis(20),
        "closed after {idled:?}, before the idle timeout"
    );
    // The actor is still active: the next request dials again.
    ok(&mut router).await;
    assert_eq!(connections.accepted(), 2);
}

#[test]
fn pool_defaults_keep_many_idle_connections_for_90_s() {
    let defaults = PoolSettings::default();
    assert_eq!(defaults.idle_timeout, Duration::from_secs(90));
    assert_eq!(defaults.max_idle_per_actor, 128);
}
