//! The ingress scenarios: requests from the load namespace as the router
//! (with the router's certificate) through atunnel's router-facing
//! listeners to the actors: HTTPS (ingress-https) and CONNECT tunnels
//! (ingress-connect). ingress-https also runs with a peer (nginx, HAProxy)
//! in atunnel's place (`--compare peers`); atunnel's /stats figures are
//! left out then.

use std::future::Future;
use std::sync::Arc;

use atunnel_bench::load::results::{RungResult, ScenarioResult};
use atunnel_bench::scenario::{ingress_connect, ingress_https};
use atunnel_measure::schedule::Rung;
use bytes::Bytes;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::run::bench::Bench;
use crate::run::router::Alpn;
use crate::run::rung::{climb, ladder, measure, measure_saturated, sustainable};

/// Router connections each scenario spreads its units over.
const ROUTER_CONNS: usize = 4;

/// Requests each router connection keeps in flight when ingress-https
/// saturates the contender: a busy router multiplexes many streams.
const SATURATING_STREAMS: usize = 32;

/// [`ROUTER_CONNS`] HTTP/2 connections as the router to the tunnel's ingress
/// `port`, each made by `handshake` over the router's TLS.
async fn router_conns<S, F, Fut>(
    bench: &Bench,
    port: u16,
    handshake: F,
) -> Result<Arc<Vec<S>>, atunnel_process::BoxError>
where
    F: Fn(TlsStream<TcpStream>) -> Fut,
    Fut: Future<Output = Result<S, atunnel_process::BoxError>>,
{
    let mut conns = Vec::with_capacity(ROUTER_CONNS);
    for _ in 0..ROUTER_CONNS {
        conns.push(handshake(bench.router_tls(port, Alpn::H2).await?).await?);
    }
    Ok(Arc::new(conns))
}

/// An HTTP/2 client (hyper's) over `tls`, its connection driven by a task.
pub(super) async fn hyper_h2(
    tls: TlsStream<TcpStream>,
) -> Result<
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    atunnel_process::BoxError,
> {
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    tokio::spawn(conn);
    Ok(send)
}

/// An HTTP/2 client (h2's, for CONNECT streams) over `tls`, its connection
/// driven by a task.
pub(super) async fn h2_client(
    tls: TlsStream<TcpStream>,
) -> Result<h2::client::SendRequest<Bytes>, atunnel_process::BoxError> {
    let (send, conn) = h2::client::handshake(tls).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// Requests through the router-facing HTTPS listener to the ingress actors.
pub(super) async fn ingress_https(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let senders = router_conns(bench, 443, hyper_h2).await?;
    let actors = bench.actor_count();
    let (rates, duration) = ladder(
        bench,
        &[1000.0, 2000.0, 4000.0],
        &[1000.0, 2000.0, 4000.0, 8000.0, 12000.0],
    );
    let mut rungs = Vec::new();
    let mut new_conns = Vec::new();
    // Upstream connections opened, from atunnel's /stats (a peer has none).
    let upstream_conns = async |bench: &Bench| -> Result<Option<f64>, atunnel_process::BoxError> {
        if !bench.is_atunnel() {
            return Ok(None);
        }
        let stats = bench.stats(false).await?;
        Ok(Some(
            stats.ingress.map_or(0, |i| i.new_upstream_connections) as f64,
        ))
    };
    for rate in rates {
        let before = upstream_conns(bench).await?;
        let s = senders.clone();
        let (r, outcome) = measure(
            bench,
            Bench::actors_pid,
            &Rung {
                rate,
                duration,
                max_in_flight: 4096,
            },
            move |i| routed_request(s[i as usize % s.len()].clone(), i % actors),
        )
        .await;
        let after = upstream_conns(bench).await?;
        if let (Some(before), Some(after)) = (before, after) {
            new_conns.push((after - before, outcome.completed));
        }
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
    let sustained = sustainable(&rungs);
    // Then saturated: every router connection keeps SATURATING_STREAMS
    // requests in flight, for as long as a rung.
    let s = senders.clone();
    let saturated = measure_saturated(
        bench,
        Bench::actors_pid,
        ROUTER_CONNS * SATURATING_STREAMS,
        duration,
        move |i| routed_request(s[i as usize % s.len()].clone(), i % actors),
    )
    .await;
    let mut summary = ingress_https::Summary {
        sustainable_rps: sustained,
        cpu_us_per_request: cpu_us_per_request(&rungs, sustained),
        saturated: Some(ingress_https::Saturated {
            streams_in_flight: ROUTER_CONNS * SATURATING_STREAMS,
            rps: saturated.achieved.round(),
            errors: saturated.errors,
            tunnel_cores: (saturated.tunnel_cpu_cores * 100.0).round() / 100.0,
            cpu_us_per_request: cpu_us_per_request(std::slice::from_ref(&saturated), None),
            verdict: Some(saturated.verdict),
        }),
        new_upstream_conns_per_1000: None,
    };
    let mut notes = vec![
        "4 router HTTP/2 connections with the router's certificate, GET / to actor-(i mod actors), HTTP/1.1 to the actor".to_string(),
        format!("saturated: the 4 connections kept {SATURATING_STREAMS} requests each in flight for a rung's length, closed-loop; its verdict says whose CPU ran out first (the generator shares the machine's other core with the actors)"),
    ];
    if bench.is_atunnel() {
        summary.new_upstream_conns_per_1000 = Some((per_1000 * 100.0).round() / 100.0);
    } else {
        let path = bench.contender().peer().map_or("", |p| p.path());
        notes.push(format!(
            "{} in atunnel's place, in its cgroup, routing to the same actors' program {path}; no /stats figures",
            bench.contender()
        ));
    }
    Ok(ScenarioResult::new(&summary, rungs, notes))
}

/// One request as the router sends it: GET / to `bench/actor-<actor>`
/// over `send`, its whole answer read; an error unless it is a success.
pub(super) async fn routed_request(
    mut send: hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    actor: u64,
) -> Result<(), String> {
    let req = http::Request::builder()
        .uri("https://worker.bench/")
        .header("ate-target-actor", format!("bench/actor-{actor}"))
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

/// The contender's CPU per request, in microseconds, at the sustainable
/// rate's rung (the fastest that kept up; the last rung when none did), so
/// that contenders sustaining the same rate are compared at the same load.
fn cpu_us_per_request(rungs: &[RungResult], sustained: Option<f64>) -> Option<f64> {
    let rung = match sustained {
        Some(rate) => rungs.iter().find(|r| r.offered == rate),
        None => rungs.last(),
    }?;
    (rung.achieved > 0.0)
        .then(|| (rung.tunnel_cpu_cores / rung.achieved * 1e6 * 100.0).round() / 100.0)
}

/// CONNECT tunnels through the router-facing CONNECT listener: open an h2
/// CONNECT stream to an actor's port 80, one request and answer, close.
pub(super) async fn ingress_connect(
    bench: &mut Bench,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    let senders = router_conns(bench, 8443, h2_client).await?;
    let actors = bench.actor_count();
    let ladder = ladder(
        bench,
        &[500.0, 1000.0, 2000.0],
        &[500.0, 1000.0, 2000.0, 4000.0, 8000.0],
    );
    let rungs = climb(bench, Bench::actors_pid, ladder, 2048, move |i| {
        let send = senders[i as usize % senders.len()].clone();
        async move { connect_exchange(send, i % actors).await }
    })
    .await;
    let summary = ingress_connect::Summary {
        sustainable_rps: sustainable(&rungs),
    };
    Ok(ScenarioResult::new(
        &summary,
        rungs,
        vec!["each unit: a new HTTP/2 CONNECT stream to actor:80, one HTTP/1.1 request and answer inside it, close".into()],
    ))
}

pub(super) async fn connect_exchange(
    send: h2::client::SendRequest<Bytes>,
    actor: u64,
) -> Result<(), String> {
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
