//! Per-actor budgets that fit the process, through a whole tunnel (root:
//! its namespace executor), real mTLS and a hand-made HTTP/2 gateway:
//!
//! - one actor's 4,096 unread downloads hold no more heap than its
//!   gateway-bytes bound, across all of its gateway connections;
//! - four actors at their descriptor budgets (egress tunnels and ingress
//!   requests together) leave the overload guard normal, and a fifth actor
//!   still gets new tunnels and requests;
//! - under hard overload the actor holding the most is shed on both
//!   sides: its ingress requests in flight end too.
//!
//! One binary with a counting allocator, its tests run one at a time: the
//! heap and the descriptor table are the process's.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use atunnel::egress::{ActorBudget, Destination};
use atunnel::holdings::{HoldingsConfig, derive_max_descriptors};
use atunnel::tunnel::{GatewaySpec, Tunnel, TunnelConfig};
use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use atunnel_process::overload::{OverloadConfig, OverloadState};
use atunnel_sandbox::require_root;
use atunnel_support::ingress::IngressPki;
use bytes::Bytes;
use http_body_util::Full;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use std::alloc::System;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

/// One test at a time: each measures the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DEST: &str = "192.0.2.10:443";

/// A gateway allowing 1,000 streams a connection, as atunnel-gateway does.
async fn fake_gateway(pki: &Pki, far: Far) -> FarGateway {
    let mut h2 = h2::server::Builder::new();
    h2.max_concurrent_streams(atunnel_connect::limits::MAX_CONCURRENT_STREAMS);
    far_gateway(pki, h2, far).await
}

fn gateway_spec(addr: SocketAddr) -> GatewaySpec {
    GatewaySpec {
        address: addr.to_string(),
        server_name: Some(GATEWAY_NAME.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_actors_unread_downloads_hold_no_more_than_its_gateway_bytes_bound() {
    require_root("actor budgets test");
    let _serial = SERIAL.lock().await;
    const TUNNELS: usize = 4096;
    let pki = Pki::new();
    let mut gateway = fake_gateway(&pki, Far::Flood).await;
    let mut cfg = pki.tunnel_config();
    cfg.overload = None;
    let budget = ActorBudget::default();
    let bound = budget.max_gateway_bytes as usize;
    assert!(bound <= 16 << 20, "the default is at most 16 MiB");
    let tunnel = Tunnel::start(cfg).await.expect("tunnel");
    let egress = tunnel
        .prepare_egress(&actor("alpha"), &gateway_spec(gateway.addr))
        .await
        .expect("prepare");
    let client = egress.client().clone();

    // 4,096 downloads whose actor reads nothing, opened before the far end
    // sends: what they cost idle is the baseline.
    let mut opening = JoinSet::new();
    let mut tunnels = Vec::with_capacity(TUNNELS);
    for _ in 0..TUNNELS {
        let client = client.clone();
        opening.spawn(async move { client.open_authority(DEST).await.expect("open") });
        if opening.len() == 256 {
            tunnels.push(opening.join_next().await.expect("one").expect("task"));
        }
    }
    while let Some(t) = opening.join_next().await {
        tunnels.push(t.expect("task"));
    }
    let connections = budget.max_gateway_connections() as usize;
    assert_eq!(gateway.accepted.load(Ordering::SeqCst), connections);
    let idle = live_bytes();

    // The far end sends all it may: every connection's window.
    gateway.flood.send_replace(true);
    let window = budget.gateway_connection_window(u32::MAX) as usize;
    let expected = window * connections;
    gateway.flooded_to(expected, Duration::from_secs(30)).await;
    // Every window update the client sent, and every byte sent before, is
    // in once each connection answers a PING.
    for _ in 0..connections {
        let mut ping = gateway.pings.recv().await.expect("ping handle");
        ping.ping(h2::Ping::opaque()).await.expect("pong");
    }
    let held = live_bytes() as i64 - idle as i64;
    let flooded = gateway.flooded.load(Ordering::SeqCst);
    eprintln!(
        "{TUNNELS} unread downloads on {connections} connections: far end sent {flooded} B, \
         heap grew {held} B over {idle} B idle (bound {bound} B)"
    );
    assert!(
        flooded <= bound,
        "the far end could send {flooded} B, past the actor's {bound} B"
    );
    // The received frames' bookkeeping (a few hundred bytes each) besides
    // the bytes themselves.
    let slack = 2 << 20;
    assert!(
        held <= (bound + slack) as i64,
        "heap grew {held} B, past {bound} B and {slack} B of bookkeeping"
    );
    drop(tunnels);
    tunnel.shutdown().await;
}

/// An actor that never answers: each request stays in flight.
async fn silent_actor() -> SocketAddr {
    http1_actor(|_req| std::future::pending::<http::Response<Full<Bytes>>>()).await
}

/// An egress tunnel of the actor listening at `addr` that echoes a byte;
/// `None` if the listener reset it (refused).
async fn echoing_tunnel(addr: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"x").await.ok()?;
    let mut got = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut got))
        .await
        .expect("answered or reset at once");
    match read {
        Ok(1) => Some(s),
        Ok(_) => panic!("a clean end, not a reset"),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
            None
        }
    }
}

/// Actors `actor-<i>`, one per port in `ports` (their ingress goes to that
/// loopback port), with egress through `gateway`; their egress listeners.
async fn serve_actors(
    tunnel: &Tunnel,
    gateway: SocketAddr,
    ports: &[u16],
    cancel: &CancellationToken,
) -> Vec<SocketAddr> {
    let mut listeners = Vec::new();
    for (i, &port) in ports.iter().enumerate() {
        let a = actor(&format!("actor-{i}"));
        let egress = tunnel
            .prepare_egress(&a, &gateway_spec(gateway))
            .await
            .expect("prepare");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listeners.push(listener.local_addr().expect("addr"));
        tunnel.egress().serve_listener(
            &a.uid,
            listener,
            Destination::Fixed(DEST.parse().expect("addr")),
            cancel.clone(),
        );
        let dialer = Box::new(LoopbackDialer([(80, port)].into_iter().collect()));
        tunnel
            .activate_with_dialer(&a, dialer, Some(egress))
            .await
            .expect("activate");
    }
    listeners
}

/// [`serve_actors`] on a tunnel with ingress, configured by `tune`, whose
/// egress goes to a fake gateway; a router connection to its ingress.
struct Actors {
    tunnel: Arc<Tunnel>,
    /// Each actor's egress listener.
    listeners: Vec<SocketAddr>,
    /// Ready for a stream.
    router: h2::client::SendRequest<Bytes>,
    /// Stops the egress listeners.
    cancel: CancellationToken,
    /// The gateway and ingress certificates, for as long as the test runs.
    _keep: (FarGateway, IngressPki),
}

/// [`actors_on_a_tunnel`] with an overload guard that reads `memory`'s use
/// every `interval`.
async fn actors_under_memory(
    ports: &[u16],
    memory: &FakeMemoryCgroup,
    interval: Duration,
) -> Actors {
    actors_on_a_tunnel(ports, |cfg| {
        cfg.overload = Some(OverloadConfig {
            memory_cgroup: Some(memory.path().to_path_buf()),
            interval,
            ..OverloadConfig::default()
        })
    })
    .await
}

async fn actors_on_a_tunnel(ports: &[u16], tune: impl FnOnce(&mut TunnelConfig)) -> Actors {
    let pki = Pki::new();
    let ingress_pki = IngressPki::new();
    let gateway = fake_gateway(&pki, Far::Echo).await;
    let mut cfg = tunnel_with_ingress(&ingress_pki, &pki, Duration::from_secs(2));
    tune(&mut cfg);
    let tunnel = Tunnel::start(cfg).await.expect("tunnel");
    let cancel = CancellationToken::new();
    let listeners = serve_actors(&tunnel, gateway.addr, ports, &cancel).await;
    let (_, https, _) = tunnel.ingress().expect("ingress");
    let router = ready_h2_router(&ingress_pki, https).await;
    Actors {
        tunnel,
        listeners,
        router,
        cancel,
        _keep: (gateway, ingress_pki),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_soft_overload_the_actors_above_their_share_are_refused_and_a_fifth_is_served() {
    require_root("actor budgets test");
    let _serial = SERIAL.lock().await;
    let memory = FakeMemoryCgroup::new(100);
    let answering =
        http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from_static(b"ok"))) })
            .await;
    // Sampled by the test alone.
    let never = Duration::from_secs(3600);
    let mut actors = actors_under_memory(&[answering.port(); 5], &memory, never).await;
    let guard = actors.tunnel.overload().expect("guard").clone();
    // Four actors hold five tunnels each, the fifth none.
    let mut held = Vec::new();
    for &listener in &actors.listeners[..4] {
        for _ in 0..5 {
            held.push(
                echoing_tunnel(listener)
                    .await
                    .expect("admitted while normal"),
            );
        }
    }

    // Soft on memory (0.88, below the 0.90 line): the four are above the
    // fair share of the bytes actors hold, the fifth below it.
    memory.set(880);
    assert_eq!(guard.sample(), OverloadState::Soft);
    let f = guard.stats();
    assert!(!f.refusing_everyone, "{f:?}");
    assert_eq!(f.consumers, 5, "{f:?}");
    assert!(
        echoing_tunnel(actors.listeners[0]).await.is_none(),
        "above its share"
    );
    let busy = h2_get(&mut actors.router, "actor-0", "/")
        .await
        .expect("answer");
    assert_eq!(busy.status(), 503);
    held.push(
        echoing_tunnel(actors.listeners[4])
            .await
            .expect("the fifth's tunnel"),
    );
    let answer = h2_get(&mut actors.router, "actor-4", "/")
        .await
        .expect("answer");
    assert_eq!(answer.status(), 200);
    let f = guard.stats();
    assert_eq!(f.refused_over_share_total, 2, "{f:?}");
    for s in &mut held {
        // Established tunnels go on.
        s.write_all(b"y").await.expect("write");
        let mut got = [0u8; 1];
        s.read_exact(&mut got).await.expect("echo");
    }

    // Past the second line: everyone.
    memory.set(920);
    assert_eq!(guard.sample(), OverloadState::Soft);
    assert!(guard.stats().refusing_everyone);
    assert!(
        echoing_tunnel(actors.listeners[4]).await.is_none(),
        "everyone refused"
    );
    drop(held);
    actors.cancel.cancel();
    actors.tunnel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_hard_overload_the_actor_holding_most_loses_its_ingress_requests_too() {
    require_root("actor budgets test");
    let _serial = SERIAL.lock().await;
    const REQUESTS: usize = 20;
    let memory = FakeMemoryCgroup::new(100);
    // Answers at once, but never a request to /hold.
    let holding = http1_actor(|req: http::Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/hold" {
            std::future::pending::<()>().await;
        }
        http::Response::new(Full::new(Bytes::from_static(b"ok")))
    })
    .await;
    let interval = Duration::from_millis(20);
    let mut actors = actors_under_memory(&[holding.port(); 2], &memory, interval).await;
    let guard = actors.tunnel.overload().expect("guard").clone();
    let ingress = actors.tunnel.ingress().expect("ingress").0.clone();

    // actor-0 holds requests in flight and nothing else; actor-1 holds
    // egress tunnels, fewer bytes in all.
    let pending: Vec<_> = (0..REQUESTS)
        .map(|_| h2_get(&mut actors.router, "actor-0", "/hold"))
        .collect();
    let uid0 = actor("actor-0").uid;
    let in_flight = |uid: &str| {
        ingress
            .stats()
            .actors
            .iter()
            .find(|a| a.actor == uid)
            .map_or(0, |a| a.in_flight)
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while in_flight(&uid0) < REQUESTS {
        assert!(tokio::time::Instant::now() < until, "requests in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        tunnels.push(echoing_tunnel(actors.listeners[1]).await.expect("admitted"));
    }

    // Hard: the guard sheds the actor holding the most bytes first, and
    // that ends its requests in flight, not only egress tunnels.
    memory.set(990);
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(first) = guard.stats().recent_shed.first().cloned() {
                return first;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("shed within 10 s");
    memory.set(100);
    assert_eq!(first.who, uid0, "{first:?}");
    assert_eq!(
        (first.requests, first.tunnels),
        (REQUESTS as u64, 0),
        "{first:?}"
    );
    for answer in pending {
        let answer = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("ended at once")
            .expect("answered");
        assert_eq!(answer.status(), 502);
    }
    // The activation stays: once the pressure is gone, actor-0 is served.
    tokio::time::timeout(Duration::from_secs(10), async {
        while guard.stats().state != OverloadState::Normal {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("normal again");
    let answer = h2_get(&mut actors.router, "actor-0", "/");
    assert_eq!(answer.await.expect("answer").status(), 200);
    drop(tunnels);
    actors.cancel.cancel();
    actors.tunnel.shutdown().await;
}

/// Restores RLIMIT_NOFILE when dropped, on a panic too.
struct NofileLimit(u64, u64);

impl Drop for NofileLimit {
    fn drop(&mut self) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, self.0, self.1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_actors_at_their_budgets_leave_the_guard_normal_and_a_fifth_is_served() {
    require_root("actor budgets test");
    let _serial = SERIAL.lock().await;
    // The test holds the other end of every connection atunnel holds, so
    // the process's table fills twice as fast as atunnel's own would: the
    // budget is derived for atunnel's half, NOFILE descriptors, and the
    // process's limit is twice that, plus what the test's own runtime,
    // listeners and router hold (counted once).
    const NOFILE: u64 = 600;
    const ACTORS: u64 = 4;
    const REQUESTS: usize = 20;
    let (soft_limit, hard_limit) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let _restore = NofileLimit(soft_limit, hard_limit);
    const TEST_OWN: u64 = 128;
    setrlimit(Resource::RLIMIT_NOFILE, 2 * NOFILE + TEST_OWN, hard_limit)
        .expect("lower RLIMIT_NOFILE");
    let soft = OverloadConfig::default().soft;
    let budget = derive_max_descriptors(NOFILE, soft, ACTORS, 0);

    let silent = silent_actor().await;
    let answering =
        http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from_static(b"ok"))) })
            .await;
    let mut ports = vec![silent.port(); ACTORS as usize];
    ports.push(answering.port());
    let Actors {
        tunnel,
        listeners,
        mut router,
        cancel,
        _keep,
    } = actors_on_a_tunnel(&ports, |cfg| {
        cfg.overload = Some(OverloadConfig {
            interval: Duration::from_millis(20),
            ..OverloadConfig::default()
        });
        cfg.holdings = HoldingsConfig {
            max_descriptors: budget,
            actors_at_budget: ACTORS,
        };
    })
    .await;

    // Four actors each hold requests in flight, then tunnels until their
    // descriptor budget refuses one.
    let mut held = Vec::new();
    let mut pending = Vec::new();
    for (i, &listener) in listeners.iter().enumerate().take(ACTORS as usize) {
        let name = format!("actor-{i}");
        for _ in 0..REQUESTS {
            pending.push(h2_get(&mut router, &name, "/"));
        }
        let uid = actor(&name).uid;
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while tunnel
            .egress()
            .actor_stat(&uid)
            .expect("figures")
            .held_descriptors
            < REQUESTS as u64
        {
            assert!(tokio::time::Instant::now() < until, "requests in flight");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut tunnels = 0;
        for _ in 0..2 * budget {
            match echoing_tunnel(listener).await {
                Some(s) => {
                    held.push(s);
                    tunnels += 1;
                }
                None => break,
            }
        }
        let f = tunnel.egress().actor_stat(&uid).expect("figures");
        assert_eq!(
            (tunnels + REQUESTS as u64, f.held_descriptors),
            (budget, budget),
            "{name} holds its budget: {f:?}"
        );
        assert_eq!(f.refused_descriptors_total, 1, "{f:?}");
        // At its budget, an ingress request is refused too.
        let busy = h2_get(&mut router, &name, "/").await.expect("answer");
        assert_eq!(busy.status(), 503);
    }
    let sampled = tunnel.overload().expect("guard").sample();
    let figures = tunnel.overload().expect("guard").stats();
    eprintln!(
        "four actors at {budget} descriptors each: {:?} of {:?}",
        figures.descriptors.map(|d| d.used),
        figures.descriptors.map(|d| d.limit)
    );
    assert_eq!(sampled, OverloadState::Normal, "{figures:?}");

    // The fifth actor gets new tunnels and requests.
    let fifth = listeners[ACTORS as usize];
    for _ in 0..10 {
        held.push(echoing_tunnel(fifth).await.expect("the fifth's tunnel"));
    }
    let answer = h2_get(&mut router, &format!("actor-{ACTORS}"), "/")
        .await
        .expect("answer");
    assert_eq!(answer.status(), 200);
    assert_eq!(
        tunnel.overload().expect("guard").sample(),
        OverloadState::Normal
    );
    drop(held);
    drop(pending);
    cancel.cancel();
    tunnel.shutdown().await;
}
