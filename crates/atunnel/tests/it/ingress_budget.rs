//! Ingress per-actor in-flight budget and the overload guard, through real
//! mTLS and HTTP/2 from the router to loopback actors: an actor that holds
//! its budget's worth of requests gets 503 for the next while another
//! actor is served, an actor that never answers gets 504 after the response
//! timeout while another is served, and an overloaded process answers 503
//! with Retry-After.

use atunnel_support::prelude::*;

use crate::common::{alpha_and_quick_beta, answered_504_after};
use std::sync::Arc;
use std::time::Duration;

use atunnel_process::overload::OverloadConfig;
use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_that_never_answers_gets_504_after_the_response_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(400);
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.response_timeout = TIMEOUT).await;
    let silent = http1_actor(|_req| async {
        std::future::pending::<()>().await;
        http::Response::new(Full::new(Bytes::new()))
    })
    .await;
    let mut router = alpha_and_quick_beta(&pki, &running, silent).await;
    let started = tokio::time::Instant::now();
    let waiting = h2_get(&mut router, "alpha", "/");
    // The router's other streams are served while alpha's waits.
    let served = h2_get(&mut router, "beta", "/").await.expect("an answer");
    assert_eq!(served.status(), 200);
    answered_504_after(waiting, started, TIMEOUT).await;
    let stats = running.ingress.stats();
    let of = |uid: &str| {
        stats
            .actors
            .iter()
            .find(|a| a.actor == uid)
            .map(|a| (a.response_timeouts_total, a.in_flight))
    };
    // The request is gone from alpha's in-flight budget.
    assert_eq!(of("uid-1"), Some((1, 0)));
    assert_eq!(of("uid-2"), Some((0, 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_at_its_in_flight_budget_gets_503_and_another_is_served() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.max_in_flight = 2).await;
    // alpha answers nothing until released; beta answers at once.
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let slow = http1_actor(move |_req| {
        let r = r.clone();
        async move {
            r.notified().await;
            http::Response::new(Full::new(Bytes::from_static(b"late")))
        }
    })
    .await;
    let mut router = alpha_and_quick_beta(&pki, &running, slow).await;
    let held = [
        h2_get(&mut router, "alpha", "/"),
        h2_get(&mut router, "alpha", "/"),
    ];
    until_actor(
        &running.ingress,
        "uid-1",
        "the requests never reached alpha",
        |f| f.in_flight == 2,
    )
    .await;
    let refused = h2_get(&mut router, "alpha", "/").await.expect("an answer");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let served = h2_get(&mut router, "beta", "/").await.expect("an answer");
    assert_eq!(served.status(), 200, "another actor is served as usual");
    let alpha = actor_figures(&running.ingress, "uid-1");
    assert_eq!(alpha.refused_in_flight_total, 1);
    let beta = actor_figures(&running.ingress, "uid-2");
    assert_eq!(beta.refused_in_flight_total, 0);
    // The held requests were never cut: released, they are answered.
    release.notify_waiters();
    for r in held {
        assert_eq!(r.await.expect("answered").status(), 200);
    }
}

/// The status of a GET to alpha.
async fn status_of_alpha(router: &mut h2::client::SendRequest<Bytes>) -> http::StatusCode {
    h2_get(router, "alpha", "/").await.expect("answer").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_process_answers_503_with_retry_after() {
    let pki = IngressPki::new();
    let memory = FakeMemoryCgroup::new(100);
    let guard = memory.guard(OverloadConfig {
        retry_after: Duration::from_secs(7),
        ..OverloadConfig::default()
    });
    let running = ingress_guarded(&pki, guard.clone()).await;
    let (ingress, https) = (&running.ingress, running.https);
    let actor =
        http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from_static(b"ok"))) })
            .await;
    activate_loopback(ingress, "alpha", "uid-1", actor.port());
    let mut router = ready_h2_router(&pki, https).await;
    assert_eq!(status_of_alpha(&mut router).await, 200);
    memory.set(900);
    guard.sample();
    let refused = h2_get(&mut router, "alpha", "/").await.expect("answer");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "7");
    assert_eq!(ingress.stats().refused_overload_total, 1);
    memory.set(100);
    guard.sample();
    assert_eq!(status_of_alpha(&mut router).await, 200);
    running.cancel.cancel();
}
