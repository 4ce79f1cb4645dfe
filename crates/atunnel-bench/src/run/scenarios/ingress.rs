//! The ingress scenarios: requests from the load namespace as the router
//! (with the router's certificate) through atunnel's router-facing
//! listeners to the actors: HTTPS (ingress-https) and CONNECT tunnels
//! (ingress-connect).

use std::sync::Arc;

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::load::schedule::{Rung, run_rung};
use atunnel_bench::scenario::Scenario;
use atunnel_support::stats_client::num;
use bytes::Bytes;
use serde_json::json;
use tokio::net::TcpStream;

use crate::run::bench::Bench;
use crate::run::router::Alpn;
use crate::run::rung::{Window, ladder, sustainable};

/// A router-side HTTP/2 connection to the tunnel's ingress.
async fn router_h2(
    bench: &Bench,
    port: u16,
) -> Result<
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    atunnel_process::BoxError,
> {
    let tls = router_tls(bench, port).await?;
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    tokio::spawn(conn);
    Ok(send)
}

async fn router_tls(
    bench: &Bench,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, atunnel_process::BoxError> {
    bench.router_tls(port, Alpn::H2).await
}

/// Requests through the router-facing HTTPS listener to the ingress actors.
pub(super) async fn ingress_https(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let mut senders = Vec::new();
    for _ in 0..4 {
        senders.push(router_h2(bench, 443).await?);
    }
    let senders = Arc::new(senders);
    let actors = bench.sandboxes.len().max(1) as u64;
    let (rates, duration) = ladder(
        bench,
        &[1000.0, 2000.0, 4000.0],
        &[1000.0, 2000.0, 4000.0, 8000.0, 12000.0],
    );
    let mut rungs = Vec::new();
    let mut new_conns = Vec::new();
    for rate in rates {
        let before = num(
            &bench.stats(false).await?,
            &["ingress", "new_upstream_connections"],
        );
        let window = Window::open(bench, bench.actors_pid());
        let s = senders.clone();
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 4096,
            },
            move |i| {
                let mut send = s[i as usize % s.len()].clone();
                async move {
                    let req = http::Request::builder()
                        .uri("https://worker.bench/")
                        .header("ate-target-actor", format!("bench/actor-{}", i % actors))
                        .body(http_body_util::Empty::<Bytes>::new())
                        .map_err(|e| e.to_string())?;
                    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
                    if !resp.status().is_success() {
                        return Err(format!("status {}", resp.status()));
                    }
                    http_body_util::BodyExt::collect(resp.into_body())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
            },
        )
        .await;
        let r = window.close(bench, &outcome).await;
        let after = num(
            &bench.stats(false).await?,
            &["ingress", "new_upstream_connections"],
        );
        new_conns.push((after - before, outcome.completed));
        rungs.push(r);
    }
    // After warm-up: every rung but the first.
    let (conns, reqs) = new_conns
        .iter()
        .skip(1)
        .fold((0.0, 0u64), |(c, r), (dc, dr)| (c + dc, r + dr));
    let per_1000 = if reqs > 0 {
        conns * 1000.0 / reqs as f64
    } else {
        0.0
    };
    Ok(ScenarioResult {
        name: Scenario::IngressHttps.name().into(),
        summary: json!({
            "sustainable_rps": sustainable(&rungs),
            "new_upstream_conns_per_1000": (per_1000 * 100.0).round() / 100.0,
        }),
        rungs,
        notes: vec!["4 router HTTP/2 connections with the router's certificate, GET / to actor-(i mod actors), HTTP/1.1 to the actor".into()],
    })
}

/// CONNECT tunnels through the router-facing CONNECT listener: open an h2
/// CONNECT stream to an actor's port 80, one request and answer, close.
pub(super) async fn ingress_connect(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let mut senders = Vec::new();
    for _ in 0..4 {
        let tls = router_tls(bench, 8443).await?;
        let (send, conn) = h2::client::handshake(tls).await?;
        tokio::spawn(conn);
        senders.push(send);
    }
    let senders = Arc::new(senders);
    let actors = bench.sandboxes.len().max(1) as u64;
    let (rates, duration) = ladder(
        bench,
        &[500.0, 1000.0, 2000.0],
        &[500.0, 1000.0, 2000.0, 4000.0, 8000.0],
    );
    let mut rungs = Vec::new();
    for rate in rates {
        let window = Window::open(bench, bench.actors_pid());
        let s = senders.clone();
        let outcome = run_rung(
            &Rung {
                rate,
                duration,
                max_in_flight: 2048,
            },
            move |i| {
                let send = s[i as usize % s.len()].clone();
                async move { connect_exchange(send, i % actors).await }
            },
        )
        .await;
        rungs.push(window.close(bench, &outcome).await);
    }
    Ok(ScenarioResult {
        name: Scenario::IngressConnect.name().into(),
        summary: json!({ "sustainable_rps": sustainable(&rungs) }),
        rungs,
        notes: vec!["each unit: a new HTTP/2 CONNECT stream to actor:80, one HTTP/1.1 request and answer inside it, close".into()],
    })
}

async fn connect_exchange(send: h2::client::SendRequest<Bytes>, actor: u64) -> Result<(), String> {
    let mut send = send.ready().await.map_err(|e| e.to_string())?;
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("actor:80")
        .header("ate-target-actor", format!("bench/actor-{actor}"))
        .body(())
        .map_err(|e| e.to_string())?;
    let (resp, mut stream) = send.send_request(req, false).map_err(|e| e.to_string())?;
    let resp = resp.await.map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("CONNECT status {}", resp.status()));
    }
    let mut body = resp.into_body();
    stream
        .send_data(
            Bytes::from_static(b"GET / HTTP/1.1\r\nHost: actor\r\nConnection: close\r\n\r\n"),
            true,
        )
        .map_err(|e| e.to_string())?;
    let mut got = 0usize;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        got += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if got == 0 {
        return Err("empty answer through the tunnel".into());
    }
    Ok(())
}
