//! Per-actor egress budgets and the overload guard, over real sockets and a
//! real TLS gateway: an actor past a bound has its new connections reset
//! (counted for it), its established tunnels go on, and another actor sees
//! no change; an overloaded process refuses new tunnels and sheds the actor
//! holding the most.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::egress::{ActorBudget, ActorEgressStats, Egress, EgressConfig};
use atunnel_core::BufferPool;
use atunnel_identity::clock::Clock;
use atunnel_process::overload::{Held, OverloadConfig, Shed, ShedAction};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Actors `names` with egress on `egress`, each through `gateway` to `dest`;
/// their listeners' addresses.
async fn actors_through(
    pki: &Pki,
    egress: &Arc<Egress>,
    gateway: SocketAddr,
    dest: SocketAddr,
    names: &[&str],
    cancel: &CancellationToken,
) -> Vec<SocketAddr> {
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let mut addrs = Vec::new();
    for name in names {
        let a = actor(name);
        let prepared = prepare(pki, gateway, a.clone(), source.clone()).await;
        addrs.push(listen(egress, &a.uid, dest, cancel).await);
        egress.activate(&a.uid, prepared).expect("activate");
    }
    addrs
}

/// A tunnel that echoed `n` bytes both ways, still open.
async fn echoing(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"ping").await.expect("write");
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await.expect("echo");
    assert_eq!(&got, b"ping");
    s
}

/// Still carries bytes both ways.
async fn still_echoes(s: &mut TcpStream) {
    s.write_all(b"more").await.expect("write");
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await.expect("echo");
    assert_eq!(&got, b"more");
}

/// A connection the listener accepted and reset with no bytes (on loopback
/// the reset can beat `connect`'s return, which then reports it).
async fn is_reset(addr: SocketAddr) {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    };
    written_to_is_reset(&mut s, "refused").await;
}

fn stats_of(egress: &Egress, name: &str) -> ActorEgressStats {
    let uid = actor(name).uid;
    egress
        .actor_stats()
        .into_iter()
        .find(|s| s.actor == uid)
        .expect("the actor's figures")
}

/// An egress whose actors' budget, the default otherwise, is changed by
/// `tune`.
fn egress_budgeted(tune: impl FnOnce(&mut ActorBudget)) -> std::sync::Arc<atunnel::egress::Egress> {
    let mut budget = ActorBudget::default();
    tune(&mut budget);
    egress_config(EgressConfig {
        budget,
        ..EgressConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_past_its_tunnel_budget_is_reset_and_no_one_else_notices() {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let egress = egress_budgeted(|budget| budget.max_tunnels = 3);
    let cancel = CancellationToken::new();
    let addrs = actors_through(&pki, &egress, gw.addr, echo, &["alpha", "beta"], &cancel).await;
    let (alpha, beta) = (addrs[0], addrs[1]);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(echoing(alpha).await);
    }
    is_reset(alpha).await;
    is_reset(alpha).await;
    let a = stats_of(&egress, "alpha");
    assert_eq!((a.tunnels, a.refused_tunnels_total), (3, 2), "{a:?}");
    // Its established tunnels go on; the other actor has its whole budget.
    for s in &mut held {
        still_echoes(s).await;
    }
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(echoing(beta).await);
    }
    let b = stats_of(&egress, "beta");
    assert_eq!((b.tunnels, b.refused_tunnels_total), (3, 0), "{b:?}");
    // A place that frees is taken by the next tunnel.
    drop(held.pop());
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats_of(&egress, "alpha").tunnels > 2 {
        assert!(
            tokio::time::Instant::now() < until,
            "the closed tunnel never ended"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut again = echoing(alpha).await;
    still_echoes(&mut again).await;
    assert_eq!(stats_of(&egress, "alpha").refused_tunnels_total, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_past_the_budget_is_refused_at_the_actors_refusal_rate() {
    const RATE: u32 = 50;
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let egress = egress_budgeted(|budget| {
        budget.max_tunnels = 1;
        budget.max_refusals_per_second = RATE;
    });
    let cancel = CancellationToken::new();
    let addrs = actors_through(&pki, &egress, gw.addr, echo, &["alpha", "beta"], &cancel).await;
    let (alpha, beta) = (addrs[0], addrs[1]);
    let mut held = echoing(alpha).await;

    // Alpha connects as fast as 32 loops can, each attempt given 50 ms.
    let started = tokio::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..32 {
        flood.spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_millis(50), TcpStream::connect(alpha))
                    .await;
            }
        });
    }
    // Beta is served meanwhile, and alpha's tunnel goes on.
    let mut b = echoing(beta).await;
    still_echoes(&mut b).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    still_echoes(&mut held).await;
    flood.shutdown().await;
    let elapsed = started.elapsed().as_secs_f64();
    let a = stats_of(&egress, "alpha");
    // One second's burst, then the rate; without the pace a loopback flood
    // is reset thousands of times a second.
    let most = f64::from(RATE) * (1.0 + elapsed) + 10.0;
    assert!(
        (a.refused_tunnels_total as f64) <= most,
        "{} refusals in {elapsed:.2} s at {RATE}/s: {a:?}",
        a.refused_tunnels_total
    );
    assert!(a.refused_tunnels_total >= u64::from(RATE), "{a:?}");
    assert!(a.refusal_pauses_total > 0, "{a:?}");
    let b = stats_of(&egress, "beta");
    assert_eq!((b.refused_tunnels_total, b.refusal_pauses_total), (0, 0));

    // Once its tunnel ends the actor gets a new one, connections the flood
    // left in the backlog notwithstanding.
    drop(held);
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(2), async {
            let mut s = TcpStream::connect(alpha).await.ok()?;
            s.write_all(b"ping").await.ok()?;
            let mut got = [0u8; 4];
            s.read_exact(&mut got).await.ok()?;
            Some(got)
        })
        .await;
        if let Ok(Some(got)) = attempt {
            assert_eq!(&got, b"ping");
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "alpha never got a tunnel back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_opening_past_its_budget_is_reset_and_another_opens_as_usual() {
    let pki = Pki::new();
    // A gateway that accepts TCP and never answers: every open hangs.
    let (silent, _silent) = silent_peer().await;
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let egress = egress_budgeted(|budget| budget.max_opening = 2);
    let cancel = CancellationToken::new();
    let alpha = actors_through(&pki, &egress, silent, echo, &["alpha"], &cancel).await[0];
    let beta = actors_through(&pki, &egress, gw.addr, echo, &["beta"], &cancel).await[0];
    // Two opens hang on the silent gateway (until the open timeout).
    let _hanging = [
        TcpStream::connect(alpha).await.expect("connect"),
        TcpStream::connect(alpha).await.expect("connect"),
    ];
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while stats_of(&egress, "alpha").opening < 2 {
        assert!(
            tokio::time::Instant::now() < until,
            "the opens never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    is_reset(alpha).await;
    let a = stats_of(&egress, "alpha");
    assert_eq!((a.opening, a.refused_opening_total), (2, 1), "{a:?}");
    let mut b = echoing(beta).await;
    still_echoes(&mut b).await;
    assert_eq!(stats_of(&egress, "beta").refused_opening_total, 0);
}

/// Sheds through the egress, like the tunnel's own shedder, and says so.
struct ShedVia(Arc<Egress>, tokio::sync::mpsc::UnboundedSender<String>);

impl Shed for ShedVia {
    fn holdings(&self) -> Vec<(String, Held)> {
        self.0
            .actor_stats()
            .into_iter()
            .map(|a| {
                let held = Held {
                    descriptors: a.held_descriptors,
                    bytes: a.held_bytes,
                };
                (a.actor, held)
            })
            .collect()
    }

    fn shed(&self, who: &str) -> Option<ShedAction> {
        let tunnels = self.0.shed(who)?;
        let _ = self.1.send(who.to_string());
        Some(ShedAction {
            who: who.to_string(),
            bytes: 0,
            tunnels: tunnels as u64,
            requests: 0,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_process_refuses_new_tunnels_and_sheds_the_largest_actor() {
    let pki = Pki::new();
    let gw = gateway(&pki, forward_loopback(), |_| {}).await;
    let echo = echo_server().await;
    let memory = FakeMemoryCgroup::new(100);
    let guard = memory.guard(OverloadConfig {
        interval: Duration::from_millis(20),
        ..OverloadConfig::default()
    });
    let egress = Egress::with_overload(
        EgressConfig {
            drain_timeout: Duration::from_secs(5),
            ..EgressConfig::default()
        },
        BufferPool::default(),
        Some(guard.clone()),
    );
    let (shed_tx, mut shed_rx) = tokio::sync::mpsc::unbounded_channel();
    guard.set_shedder(Arc::new(ShedVia(egress.clone(), shed_tx)));
    let cancel = CancellationToken::new();
    let addrs = actors_through(&pki, &egress, gw.addr, echo, &["alpha", "beta"], &cancel).await;
    let (alpha, beta) = (addrs[0], addrs[1]);
    let mut greedy = Vec::new();
    for _ in 0..3 {
        greedy.push(echoing(alpha).await);
    }
    let mut modest = echoing(beta).await;

    // Soft (90 % of the limit): new tunnels are reset, established ones go on.
    memory.set(900);
    guard.sample();
    is_reset(beta).await;
    still_echoes(&mut modest).await;
    assert_eq!(stats_of(&egress, "beta").refused_overload_total, 1);

    // Hard: the run loop sheds the actor with the most tunnels first.
    let run = tokio::spawn(guard.clone().run(cancel.clone()));
    memory.set(990);
    let first = tokio::time::timeout(Duration::from_secs(5), shed_rx.recv())
        .await
        .expect("a shed within 5 s")
        .expect("shedder alive");
    memory.set(100);
    assert_eq!(first, actor("alpha").uid, "the largest goes first");
    for mut s in greedy {
        next_read_is_reset_within(&mut s, "a shed tunnel", Duration::from_secs(5)).await;
    }
    assert_eq!(stats_of(&egress, "alpha").shed_total, 3);
    // Back to normal: new tunnels are admitted again.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while guard.admit().is_err() {
        assert!(
            tokio::time::Instant::now() < until,
            "the guard never recovered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut after = echoing(alpha).await;
    still_echoes(&mut after).await;
    assert!(guard.stats().shed_total >= 1);
    cancel.cancel();
    run.await.expect("the guard's loop ends at cancel");
}
