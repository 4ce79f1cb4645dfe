//! What one actor's request bodies may make the router's connections hold,
//! across all of them (`--actor-max-router-bytes`), through real mTLS and
//! HTTP/2 from the router to loopback actors: each body of unknown length
//! takes its 256 KiB window until it ends, a body of known length only its
//! length, a request without a body nothing; past the bound the router gets
//! 503 for that actor alone, and what an ended body took comes back.
//! CONNECT tunnels take nothing of it (see `docs/isolation.md`).

use atunnel_support::prelude::*;

use atunnel::ingress::Ingress;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;

/// One body's window (`PROXY_STREAM_WINDOW`).
const WINDOW: u64 = 256 * 1024;
/// Four windows, and room for a small body of known length.
const BOUND: u64 = 4 * WINDOW + 64 * 1024;

/// Waits (bounded) until `uid`'s router bytes are `want`.
async fn router_bytes_are(ingress: &Ingress, uid: &str, want: u64) {
    let what = format!("router bytes never {want}");
    until_actor(ingress, uid, &what, |f| f.router_bytes == want).await;
}

/// Two HTTP/2 connections as the router, each ready for a stream: the
/// bound is per actor, across the router's connections.
async fn two_routers(
    pki: &IngressPki,
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    h2::client::SendRequest<Bytes>,
) {
    (
        ready_h2_router(pki, addr).await,
        ready_h2_router(pki, addr).await,
    )
}

/// An actor that never reads a request to `/hold` (nor answers it), and
/// echoes any other request's body.
async fn holding_actor() -> std::net::SocketAddr {
    http1_actor(|req: http::Request<Incoming>| async move {
        if req.uri().path() == "/hold" {
            std::future::pending::<()>().await;
        }
        let body = whole_body(req).await;
        http::Response::new(Full::new(body))
    })
    .await
}

/// A POST to `team-a/<actor>`'s `path` with `length` as its Content-Length
/// if given, its body left open; its answer and its sending half.
fn post(
    router: &mut h2::client::SendRequest<Bytes>,
    actor: &str,
    path: &str,
    length: Option<usize>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut req = http::Request::post(format!("https://w{path}"))
        .header("ate-target-actor", format!("team-a/{actor}"));
    if let Some(n) = length {
        req = req.header("content-length", n.to_string());
    }
    router
        .send_request(req.body(()).expect("request"), false)
        .expect("send")
}

/// Sends `body` whole and reads the answer's status and body.
async fn echoed(
    router: &mut h2::client::SendRequest<Bytes>,
    actor: &str,
    body: &[u8],
    known_length: bool,
) -> (u16, Vec<u8>) {
    let length = known_length.then_some(body.len());
    let (resp, mut send) = post(router, actor, "/", length);
    send.send_data(Bytes::copy_from_slice(body), true)
        .expect("body");
    let resp = resp.await.expect("answer");
    let status = resp.status().as_u16();
    let mut got = Vec::new();
    let mut recv = resp.into_body();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("data");
        recv.flow_control()
            .release_capacity(chunk.len())
            .expect("release");
        got.extend_from_slice(&chunk);
    }
    (status, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actors_unread_bodies_hold_no_more_than_its_router_bytes_across_connections() {
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.max_router_bytes = BOUND).await;
    let alpha = holding_actor().await;
    let alpha_echo = echo_server().await;
    let beta = holding_actor().await;
    // alpha's port 7 echoes, for its CONNECT tunnels.
    let ports = [(80, alpha.port()), (7, alpha_echo.port())];
    activate_ports(&running.ingress, "alpha", "uid-1", &ports);
    activate_loopback(&running.ingress, "beta", "uid-2", beta.port());
    let (mut one, mut two) = two_routers(&pki, running.https).await;

    // Four bodies of unknown length alpha never reads, two on each router
    // connection: a window each.
    let mut held = Vec::new();
    for mut router in [one.clone(), one.clone(), two.clone(), two.clone()] {
        let (resp, mut send) = post(&mut router, "alpha", "/hold", None);
        send.send_data(Bytes::from_static(&[7; 1024]), false)
            .expect("first bytes");
        held.push((resp, send));
    }
    router_bytes_are(&running.ingress, "uid-1", 4 * WINDOW).await;

    // A fifth is refused, on either connection.
    for router in [&mut one, &mut two] {
        let (resp, _send) = post(router, "alpha", "/hold", None);
        assert_eq!(resp.await.expect("answer").status(), 503);
    }
    // A body of known length takes only that; a GET takes nothing; both
    // are served, bytes end to end.
    let small: Vec<u8> = (0..16 * 1024u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(echoed(&mut two, "alpha", &small, true).await, (200, small));
    let resp = h2_get(&mut one, "alpha", "/");
    assert_eq!(resp.await.expect("answer").status(), 200);
    // Another actor on the same connections has its whole bound.
    let large: Vec<u8> = (0..600 * 1024u32).map(|i| (i % 241) as u8).collect();
    assert_eq!(echoed(&mut one, "beta", &large, false).await, (200, large));
    let f = actor_figures(&running.ingress, "uid-1");
    assert_eq!(f.refused_router_bytes_total, 2, "{f:?}");
    assert_eq!(
        actor_figures(&running.ingress, "uid-2").refused_router_bytes_total,
        0
    );
    router_bytes_are(&running.ingress, "uid-2", 0).await;

    // A CONNECT tunnel takes nothing of it, and carries bytes both ways.
    let mut connect = h2_router(&pki, running.connect)
        .await
        .ready()
        .await
        .expect("ready");
    let mut tunnel = h2_tunnel(&mut connect, "alpha", 7).await;
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 239) as u8).collect();
    assert_eq!(echoed_h2(&mut tunnel, &data).await, data);
    drop(tunnel);

    // The router gives up on one held body: its window comes back, and a
    // body of unknown length is served again, bytes end to end.
    let (_, mut send) = held.pop().expect("one");
    send.send_reset(h2::Reason::CANCEL);
    router_bytes_are(&running.ingress, "uid-1", 3 * WINDOW).await;
    let upload: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 233) as u8).collect();
    assert_eq!(
        echoed(&mut one, "alpha", &upload, false).await,
        (200, upload)
    );
    router_bytes_are(&running.ingress, "uid-1", 3 * WINDOW).await;
    drop(held);
    router_bytes_are(&running.ingress, "uid-1", 0).await;
    running.cancel.cancel();
}

/// Waits (bounded) until `uid` has `want` requests in flight.
async fn in_flight_is(ingress: &Ingress, uid: &str, want: usize) {
    let what = format!("never {want} in flight");
    until_actor(ingress, uid, &what, |f| f.in_flight == want).await;
}

/// `--actor-max-router-streams`: an actor that never answers holds at most
/// its share of one router connection's streams; the others on it are
/// served, and its own requests on another connection are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_holds_at_most_its_share_of_a_router_connections_streams() {
    const SHARE: u32 = 5;
    let pki = IngressPki::new();
    let running = ingress_pools(&pki, |pools| pools.max_router_streams = SHARE).await;
    let alpha = holding_actor().await;
    let beta = holding_actor().await;
    activate_loopback(&running.ingress, "alpha", "uid-1", alpha.port());
    activate_loopback(&running.ingress, "beta", "uid-2", beta.port());
    let (mut one, mut two) = two_routers(&pki, running.https).await;

    let mut held: Vec<_> = (0..SHARE)
        .map(|_| h2_get(&mut one, "alpha", "/hold"))
        .collect();
    in_flight_is(&running.ingress, "uid-1", SHARE as usize).await;
    let refused = h2_get(&mut one, "alpha", "/hold").await.expect("answer");
    assert_eq!(
        refused.status(),
        503,
        "past alpha's share of the connection"
    );
    // The other actor on the same connection is served, bytes intact.
    let body: Vec<u8> = (0..10_000u32).map(|i| (i % 199) as u8).collect();
    assert_eq!(echoed(&mut one, "beta", &body, true).await, (200, body));
    // alpha's share is per connection: on another it is admitted.
    held.push(h2_get(&mut two, "alpha", "/hold"));
    in_flight_is(&running.ingress, "uid-1", SHARE as usize + 1).await;
    assert_eq!(
        actor_figures(&running.ingress, "uid-1").refused_router_streams_total,
        1
    );
    assert_eq!(
        actor_figures(&running.ingress, "uid-2").refused_router_streams_total,
        0
    );

    // One of alpha's held requests on the first connection ends: its place
    // there comes back.
    drop(held.remove(0));
    in_flight_is(&running.ingress, "uid-1", SHARE as usize).await;
    held.push(h2_get(&mut one, "alpha", "/hold"));
    in_flight_is(&running.ingress, "uid-1", SHARE as usize + 1).await;
    assert_eq!(
        actor_figures(&running.ingress, "uid-1").refused_router_streams_total,
        1
    );
    drop(held);
    running.cancel.cancel();
}
