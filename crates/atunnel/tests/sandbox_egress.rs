//! Egress from real sandboxes (root): an unmodified program in an actor's
//! runtime namespace dials any address and is carried through the tunnel,
//! driven by the worker's calls.

mod support;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::clock::Clock;
use atunnel::gateway::Mode;
use atunnel::gateway::sink::{Service, SinkConfig};
use atunnel::tunnel::{GatewaySpec, Tunnel, TunnelConfig};
use atunnel_dns::RelayConfig;
use atunnel_sandbox::require_root;
use atunnel_sandbox::sandbox::GATEWAY_ADDR;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

fn echo_sink() -> Mode {
    Mode::Sink(SinkConfig {
        other_ports: Some(Service::Echo),
        ..SinkConfig::default()
    })
}

/// A tunnel whose namespace names are this process's and this test's alone.
async fn tunnel(pki: &Pki, dns: Option<SocketAddr>, test: &str) -> Arc<Tunnel> {
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let mut cfg = TunnelConfig::new(pki.gateway_roots(), source);
    cfg.netns_prefix = format!("atnt-{}-{test}-", std::process::id());
    cfg.dns = dns.map(|upstream| RelayConfig {
        upstreams: vec![upstream],
        ..RelayConfig::default()
    });
    Tunnel::start(cfg).await.expect("tunnel starts")
}

fn spec(gw: &RunningGateway) -> GatewaySpec {
    GatewaySpec {
        address: gw.addr.to_string(),
        server_name: Some(GATEWAY_NAME.to_string()),
    }
}

async fn echo_check(s: &mut TcpStream, data: &[u8]) {
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(data).await.expect("write");
    };
    let read = async {
        let mut got = vec![0u8; data.len()];
        r.read_exact(&mut got).await.expect("read");
        got
    };
    let ((), got) = tokio::join!(write, read);
    assert!(got == data, "echo through the sandbox tunnel corrupted");
}

/// A DNS server on loopback that answers every query with the query itself,
/// QR bit set (the relay does not parse DNS, so this is enough).
async fn fake_dns() -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let mut answer = buf[..n].to_vec();
            if answer.len() > 2 {
                answer[2] |= 0x80;
            }
            let _ = socket.send_to(&answer, from).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_program_reaches_any_address_through_the_tunnel() {
    require_root("sandbox egress test");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let tunnel = tunnel(&pki, Some(fake_dns().await), "any").await;
    let a = actor("alpha");
    let egress = tunnel
        .prepare_egress(&a, &spec(&gw))
        .await
        .expect("prepare");
    let sandbox = tunnel.serve_sandbox(&a).await.expect("sandbox");
    tunnel.activate(&a, Some(egress)).await.expect("activate");
    let exec = tunnel.executor().clone();

    for (i, dest) in ["192.0.2.10:443", "198.51.100.7:8080"].iter().enumerate() {
        let dest: SocketAddr = dest.parse().expect("addr");
        let mut s = sandbox
            .connect_from_runtime(&exec, dest)
            .await
            .expect("actor dials");
        echo_check(&mut s, &random(256 * 1024, i as u64)).await;
        let seen = gw.seen.recv().await.expect("gateway saw the tunnel");
        assert_eq!(
            seen.authority,
            dest.to_string(),
            "original destination lost"
        );
        assert_eq!(seen.identity.actor_name, "alpha");
    }

    // DNS from the actor reaches the worker's resolver through the relay.
    let runtime = sandbox.runtime.clone();
    let udp = exec
        .run_in(&runtime, || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(s)
        })
        .await
        .expect("executor")
        .expect("socket");
    let udp = tokio::net::UdpSocket::from_std(udp).expect("register");
    let query = [
        0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
    ];
    udp.send_to(&query, (GATEWAY_ADDR, 53)).await.expect("send");
    let mut answer = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), udp.recv_from(&mut answer))
        .await
        .expect("DNS answered")
        .expect("recv");
    assert_eq!(&answer[..2], &[0x12, 0x34], "answer has the query's id");
    assert!(answer[2] & 0x80 != 0 && n == query.len());

    tunnel.close_sandbox(&a).await.expect("close");
    assert!(!atunnel_sandbox::netns::exists(sandbox.name()));
    tunnel
        .close_sandbox(&a)
        .await
        .expect("closing twice is a no-op");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivating_one_actor_mid_transfer_leaves_the_other_untouched() {
    require_root("sandbox deactivation test");
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    let tunnel = tunnel(&pki, None, "deact").await;
    let exec = tunnel.executor().clone();
    let (a, b) = (actor("alpha"), actor("bravo"));
    let mut streams = Vec::new();
    for who in [&a, &b] {
        let egress = tunnel
            .prepare_egress(who, &spec(&gw))
            .await
            .expect("prepare");
        let sandbox = tunnel.serve_sandbox(who).await.expect("sandbox");
        tunnel.activate(who, Some(egress)).await.expect("activate");
        let s = sandbox
            .connect_from_runtime(&exec, "192.0.2.10:443".parse().expect("addr"))
            .await
            .expect("dial");
        streams.push(s);
    }
    let mut sb = streams.pop().expect("b");
    let sa = streams.pop().expect("a");

    // A writes (and drains its echo) until its tunnel is torn down.
    let (mut a_read, mut a_write) = sa.into_split();
    let (a_sent_tx, mut a_sent) = watch::channel(0usize);
    let a_writer = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        loop {
            if let Err(e) = a_write.write_all(&chunk).await {
                return e;
            }
            a_sent_tx.send_modify(|n| *n += chunk.len());
        }
    });
    let a_reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match a_read.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    });
    // B echoes 16 MiB; its second half goes only once A is deactivated, so
    // B is mid-transfer when that happens.
    let (b_got_tx, mut b_got) = watch::channel(0usize);
    let (a_gone_tx, a_gone) = oneshot::channel::<()>();
    let b_transfer = tokio::spawn(async move {
        let data = random(16 << 20, 2);
        let (mut r, mut w) = sb.split();
        let write = async {
            let (first, rest) = data.split_at(data.len() / 2);
            w.write_all(first).await?;
            let _ = a_gone.await;
            w.write_all(rest).await
        };
        let read = async {
            let mut got = vec![0u8; data.len()];
            let mut n = 0;
            while n < got.len() {
                match r.read(&mut got[n..]).await? {
                    0 => return Err(std::io::Error::from(ErrorKind::UnexpectedEof)),
                    m => n += m,
                }
                b_got_tx.send_replace(n);
            }
            Ok(got)
        };
        let (written, got) = tokio::join!(write, read);
        written.expect("B writes");
        let got = got.expect("B reads its echo");
        assert!(got == data, "B's bytes corrupted");
        sb
    });

    let both_moving = async {
        a_sent.wait_for(|n| *n >= 1 << 20).await.expect("A writing");
        b_got.wait_for(|n| *n >= 1 << 20).await.expect("B echoing");
    };
    tokio::time::timeout(Duration::from_secs(30), both_moving)
        .await
        .expect("both actors move a MiB");
    tunnel.deactivate(&a).await.expect("deactivate a");
    a_gone_tx.send(()).expect("B is still transferring");

    let write_err = tokio::time::timeout(Duration::from_secs(10), a_writer)
        .await
        .expect("A's writes fail once it is deactivated")
        .expect("writer");
    assert!(
        matches!(
            write_err.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
        ),
        "A's write half: {write_err}"
    );
    let read_end = tokio::time::timeout(Duration::from_secs(10), a_reader)
        .await
        .expect("A's reads end once it is deactivated")
        .expect("reader");
    if let Err(e) = read_end {
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "A's read half: {e}");
    }

    let mut sb = tokio::time::timeout(Duration::from_secs(60), b_transfer)
        .await
        .expect("B's transfer completes")
        .expect("B's transfer intact");
    echo_check(&mut sb, &random(64 * 1024, 3)).await;
    tunnel
        .deactivate(&a)
        .await
        .expect("deactivating again is a no-op");
    echo_check(&mut sb, &random(64 * 1024, 4)).await;
    // a's sandbox admits nothing now.
    let sandbox_a = tunnel.sandbox(&a).expect("a's sandbox still exists");
    let mut late = sandbox_a
        .connect_from_runtime(&exec, "192.0.2.10:443".parse().expect("addr"))
        .await
        .expect("dial");
    let mut got = Vec::new();
    let _ = late.read_to_end(&mut got).await;
    assert!(got.is_empty());
    tunnel.shutdown().await;
}
