//! Egress from real sandboxes (root): an unmodified program in an actor's
//! runtime namespace dials any address and is carried through the tunnel,
//! driven by the worker's calls.

use atunnel_support::prelude::*;

use crate::common::{echo_check, expect_seen};
use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel::tunnel::{GatewaySpec, Tunnel};
use atunnel_dns::RelayConfig;
use atunnel_identity::identity::ActorRef;
use atunnel_sandbox::sandbox::{DNS_PORT, GATEWAY_ADDR, GATEWAY_ADDR6};
use atunnel_sandbox::{NetNs, NsExecutor, SandboxNetwork, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{oneshot, watch};

fn echo_sink() -> SinkConfig {
    SinkConfig {
        other_ports: Some(Service::Echo),
        ..SinkConfig::default()
    }
}

/// A tunnel whose namespace names are this process's and this test's alone.
async fn tunnel(pki: &Pki, dns: Option<SocketAddr>, test: &str) -> Arc<Tunnel> {
    let mut cfg = pki.tunnel_config();
    cfg.netns_prefix = format!("atnt-{}-{test}-", std::process::id());
    cfg.dns = dns.map(|upstream| RelayConfig {
        upstreams: vec![upstream],
        ..RelayConfig::default()
    });
    Tunnel::start(cfg).await.expect("tunnel starts")
}

/// Prepares `who`'s egress through `gw`, serves its sandbox and activates
/// it, as the worker does.
async fn serve_activated(tunnel: &Tunnel, gw: &RunningGateway, who: &ActorRef) -> SandboxNetwork {
    let spec = GatewaySpec {
        address: gw.addr.to_string(),
        server_name: Some(GATEWAY_NAME.to_string()),
    };
    let egress = tunnel.prepare_egress(who, &spec).await.expect("prepare");
    let sandbox = tunnel.serve_sandbox(who).await.expect("sandbox");
    tunnel.activate(who, Some(egress)).await.expect("activate");
    sandbox
}

/// A query for `a.` of type A with `id` (the relay does not parse DNS
/// beyond the header, so this is enough).
fn dns_query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1]);
    q
}

/// The fake server's answer: the query with the QR bit set.
fn fake_answer(query: &[u8]) -> Vec<u8> {
    let mut answer = query.to_vec();
    if let Some(flags) = answer.get_mut(2) {
        *flags |= 0x80;
    }
    answer
}

/// `message` with DNS-over-TCP's 2-byte length prefix.
fn tcp_frame(message: &[u8]) -> Vec<u8> {
    let len = u16::try_from(message.len()).expect("test messages are small");
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(message);
    frame
}

/// A DNS server on loopback, UDP and TCP on one port, that answers every
/// query with [`fake_answer`].
async fn fake_dns() -> SocketAddr {
    // The relay has one upstream address for both transports; retry the rare
    // case where the UDP port is taken for TCP.
    let (udp, tcp) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        match TcpListener::bind(udp.local_addr().expect("addr")).await {
            Ok(tcp) => break (udp, tcp),
            Err(e) if e.kind() == ErrorKind::AddrInUse => continue,
            Err(e) => panic!("bind fake DNS over TCP: {e}"),
        }
    };
    let addr = udp.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&fake_answer(&buf[..n]), from).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((stream, _)) = tcp.accept().await {
            tokio::spawn(answer_over_tcp(stream));
        }
    });
    addr
}

/// Answers length-prefixed queries on one connection until the client ends it.
async fn answer_over_tcp(mut stream: TcpStream) -> std::io::Result<()> {
    loop {
        let mut len = [0u8; 2];
        if let Err(e) = stream.read_exact(&mut len).await {
            return if e.kind() == ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut query).await?;
        stream.write_all(&tcp_frame(&fake_answer(&query))).await?;
    }
}

/// A UDP socket bound to `local` in `sandbox`'s runtime namespace, as the
/// actor's program would bind it.
async fn udp_in_runtime(
    exec: &NsExecutor,
    sandbox: &SandboxNetwork,
    local: SocketAddr,
) -> UdpSocket {
    let udp = exec
        .run_in(&sandbox.runtime, move || {
            let s = std::net::UdpSocket::bind(local)?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(s)
        })
        .await
        .expect("executor")
        .expect("socket");
    UdpSocket::from_std(udp).expect("register")
}

/// A UDP query from the actor's runtime namespace to the relay at `relay`
/// comes back answered by the worker's resolver, from `relay` (a resolver
/// drops an answer from any other address).
async fn dns_over_udp_check(sandbox: &SandboxNetwork, exec: &NsExecutor, relay: SocketAddr) {
    let any: SocketAddr = if relay.is_ipv4() {
        "0.0.0.0:0".parse().expect("addr")
    } else {
        "[::]:0".parse().expect("addr")
    };
    let udp = udp_in_runtime(exec, sandbox, any).await;
    let query = dns_query(0x1234);
    udp.send_to(&query, relay).await.expect("send");
    let mut answer = [0u8; 512];
    let (n, from) = tokio::time::timeout(Duration::from_secs(10), udp.recv_from(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("DNS over UDP to {relay} answered"))
        .expect("recv");
    assert_eq!(&answer[..n], &fake_answer(&query)[..], "UDP answer");
    assert_eq!(from, relay, "the answer comes from the address asked");
}

/// A TCP query (length-prefixed) from the actor's runtime namespace to the
/// relay at `relay` comes back answered by the worker's resolver.
async fn dns_over_tcp_check(sandbox: &SandboxNetwork, exec: &NsExecutor, relay: SocketAddr) {
    let mut s = sandbox
        .connect_from_runtime(exec, relay)
        .await
        .expect("actor dials the DNS relay over TCP");
    let query = dns_query(0xabcd);
    s.write_all(&tcp_frame(&query)).await.expect("send");
    let read = async {
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await?;
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("DNS over TCP answered")
        .expect("read the answer");
    assert_eq!(&answer[..2], &[0xab, 0xcd], "answer has the query's id");
    assert!(answer[2] & 0x80 != 0, "answer has the QR bit");
    assert_eq!(answer, fake_answer(&query), "TCP answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_program_reaches_any_address_through_the_tunnel() {
    require_root("sandbox egress test");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let tunnel = tunnel(&pki, Some(fake_dns().await), "any").await;
    let a = actor("alpha");
    let sandbox = serve_activated(&tunnel, &gw, &a).await;
    let exec = tunnel.executor().clone();

    // Both families through the one dual-stack sandbox; an IPv6 original
    // destination goes to the gateway as CONNECT [addr]:port.
    for (i, (dest, authority)) in [
        ("192.0.2.10:443", "192.0.2.10:443"),
        ("[2001:db8::10]:443", "[2001:db8::10]:443"),
        ("198.51.100.7:8080", "198.51.100.7:8080"),
        ("[2001:db8:ff::7]:8080", "[2001:db8:ff::7]:8080"),
    ]
    .iter()
    .enumerate()
    {
        let dest: SocketAddr = dest.parse().expect("addr");
        let mut s = sandbox
            .connect_from_runtime(&exec, dest)
            .await
            .expect("actor dials");
        echo_check(&mut s, &random(256 * 1024, i as u64)).await;
        expect_seen(&mut gw, "alpha", authority).await;
    }
    let e = tunnel.egress().stats();
    assert_eq!(
        (e.tunnels_total, e.tunnels_ipv4_total, e.tunnels_ipv6_total),
        (4, 2, 2),
        "tunnels counted by family: {e:?}"
    );

    // DNS from the actor reaches the worker's resolver through the relay.
    // Over both families: the sandbox's resolv.conf lists both.
    let relays = [
        SocketAddr::from((GATEWAY_ADDR, DNS_PORT)),
        SocketAddr::from((GATEWAY_ADDR6, DNS_PORT)),
    ];
    assert_eq!(
        sandbox.resolv_conf(),
        "nameserver 169.254.17.1\nnameserver fd00:a7:17::1\n"
    );
    for relay in relays {
        dns_over_udp_check(&sandbox, &exec, relay).await;
        dns_over_tcp_check(&sandbox, &exec, relay).await;
    }
    // Counted for this sandbox, as /stats `dns_relays` serves them. The
    // relay counts an answer once it is sent, so the actor can read it
    // before the count moves: polled (a counter has nothing to await),
    // bounded.
    let counted = async {
        while tunnel.dns_stats().first().map(|d| d.relay.answered) != Some(4) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), counted).await;
    let dns = tunnel.dns_stats();
    assert_eq!(dns.len(), 1, "{dns:?}");
    let (who, relay) = (&dns[0].actor, dns[0].relay);
    assert_eq!(who, &a.uid);
    assert_eq!(
        (
            relay.udp_queries,
            relay.tcp_queries,
            relay.answered,
            relay.dropped
        ),
        (2, 2, 4, 0),
        "{relay:?}"
    );

    tunnel.close_sandbox(&a).await.expect("close");
    assert!(!atunnel_sandbox::netns::exists(sandbox.name()));
    assert!(
        tunnel.dns_stats().is_empty(),
        "a closed sandbox's relay is gone"
    );
    tunnel
        .close_sandbox(&a)
        .await
        .expect("closing twice is a no-op");
}

/// `s` is reset at once: refused, not tunnelled and not left to time out.
async fn is_reset(mut s: TcpStream) {
    written_to_is_reset(&mut s, "refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tunnel_budget_is_one_across_both_families() {
    require_root("sandbox egress budget test");
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    let mut cfg = pki.tunnel_config();
    cfg.netns_prefix = format!("atnt-{}-budget6-", std::process::id());
    cfg.egress.budget.max_tunnels = 2;
    let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
    let a = actor("alpha");
    let sandbox = serve_activated(&tunnel, &gw, &a).await;
    let exec = tunnel.executor().clone();
    let v4: SocketAddr = "192.0.2.10:443".parse().expect("addr");
    let v6: SocketAddr = "[2001:db8::10]:443".parse().expect("addr");

    let mut held = Vec::new();
    for (i, dest) in [v4, v6].into_iter().enumerate() {
        let mut s = sandbox
            .connect_from_runtime(&exec, dest)
            .await
            .expect("actor dials");
        echo_check(&mut s, &random(1024, i as u64)).await;
        held.push(s);
    }
    // One tunnel of each family fills the budget of two: neither family
    // has a budget of its own.
    for dest in [v6, v4] {
        // The reset can beat the connect's return, which then reports it.
        match sandbox.connect_from_runtime(&exec, dest).await {
            Ok(s) => is_reset(s).await,
            Err(atunnel_sandbox::SandboxError::Io { source, .. }) => {
                assert_eq!(source.kind(), ErrorKind::ConnectionReset, "{source}")
            }
            Err(e) => panic!("dial to {dest}: {e}"),
        }
    }
    let figures = tunnel
        .egress()
        .actor_stat(&a.uid)
        .expect("the actor's figures");
    assert_eq!(
        (figures.tunnels, figures.refused_tunnels_total),
        (2, 2),
        "{figures:?}"
    );
    for (i, s) in held.iter_mut().enumerate() {
        echo_check(s, &random(1024, 10 + i as u64)).await;
    }
    // A place an IPv4 tunnel frees is taken by an IPv6 one.
    drop(held.remove(0));
    let freed = async {
        while tunnel.egress().actor_stat(&a.uid).map(|f| f.tunnels) != Some(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), freed)
        .await
        .expect("the closed tunnel leaves the budget");
    let mut s = sandbox
        .connect_from_runtime(&exec, v6)
        .await
        .expect("actor dials");
    echo_check(&mut s, &random(1024, 20)).await;
    tunnel.close_sandbox(&a).await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ipv6_off_an_ipv6_dial_fails_at_once_and_ipv4_is_tunnelled() {
    require_root("IPv4-only sandbox egress test");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let mut cfg = pki.tunnel_config();
    cfg.netns_prefix = format!("atnt-{}-v4only-", std::process::id());
    cfg.sandbox_ipv6 = false;
    let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
    let a = actor("alpha");
    let sandbox = serve_activated(&tunnel, &gw, &a).await;
    assert!(!sandbox.ipv6());
    assert_eq!(sandbox.resolv_conf(), "nameserver 169.254.17.1\n");
    let exec = tunnel.executor().clone();
    let v6: SocketAddr = "[2001:db8::10]:7".parse().expect("addr");
    let err = tokio::time::timeout(
        Duration::from_secs(5),
        sandbox.connect_from_runtime(&exec, v6),
    )
    .await
    .expect("fails at once, not after a timeout")
    .expect_err("no IPv6 route in an IPv4-only sandbox");
    match &err {
        atunnel_sandbox::SandboxError::Io { source, .. } => {
            assert_eq!(
                source.raw_os_error(),
                Some(nix::errno::Errno::ENETUNREACH as i32),
                "{err}"
            )
        }
        _ => panic!("{err}"),
    }
    let v4: SocketAddr = "192.0.2.10:7".parse().expect("addr");
    let mut s = sandbox
        .connect_from_runtime(&exec, v4)
        .await
        .expect("actor dials");
    echo_check(&mut s, &random(4096, 1)).await;
    expect_seen(&mut gw, "alpha", "192.0.2.10:7").await;
    let e = tunnel.egress().stats();
    assert_eq!((e.tunnels_ipv4_total, e.tunnels_ipv6_total), (1, 0));
    tunnel.close_sandbox(&a).await.expect("close");
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
        let sandbox = serve_activated(&tunnel, &gw, who).await;
        let s = sandbox
            .connect_from_runtime(&exec, "192.0.2.10:443".parse().expect("addr"))
            .await
            .expect("dial");
        streams.push(s);
    }
    let mut sb = streams.pop().expect("b");
    let sa = streams.pop().expect("a");

    // A writes (and drains its echo) until told to pause, then, once its
    // tunnel is torn down, writes until that fails. The pause leaves the
    // reset to the reader: the kernel reports it to one call only, and a
    // read after a write took it sees EOF.
    let (mut a_read, mut a_write) = sa.into_split();
    let (a_sent_tx, mut a_sent) = watch::channel(0usize);
    let (a_pause_tx, mut a_pause) = oneshot::channel::<oneshot::Sender<()>>();
    let (a_resume_tx, a_resume) = oneshot::channel::<()>();
    let a_writer = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        let paused = loop {
            if let Ok(paused) = a_pause.try_recv() {
                break paused;
            }
            if let Err(e) = a_write.write_all(&chunk).await {
                return e;
            }
            a_sent_tx.send_modify(|n| *n += chunk.len());
        };
        let _ = paused.send(());
        let _ = a_resume.await;
        loop {
            if let Err(e) = a_write.write_all(&chunk).await {
                return e;
            }
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
    let (paused_tx, paused) = oneshot::channel();
    a_pause_tx.send(paused_tx).expect("A is writing");
    paused.await.expect("A's writer pauses");
    tunnel.deactivate(&a).await.expect("deactivate a");
    a_gone_tx.send(()).expect("B is still transferring");

    let read_end = tokio::time::timeout(Duration::from_secs(10), a_reader)
        .await
        .expect("A's reads end once it is deactivated")
        .expect("reader");
    // A reset, never a clean EOF: A's stream was cut, not finished.
    let e = read_end.expect_err("A's read half ended with a clean EOF");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "A's read half: {e}");
    a_resume_tx.send(()).expect("A's writer waits");
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

/// Fails (not skips) when a program the test runs is not installed.
fn require_program(name: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v \"$1\"", "sh", name])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{name} is not installed; this test runs it inside a sandbox \
         (nsenter is in util-linux)"
    );
}

/// Runs `program args` in `ns` through nsenter, as the actor's own unmodified
/// program would run there; bounded, and killed if the bound passes.
async fn run_in_netns(ns: &NetNs, program: &str, args: &[&str]) -> Output {
    require_program("nsenter");
    require_program(program);
    let run = tokio::process::Command::new("nsenter")
        .arg(format!("--net={}", ns.path().display()))
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| panic!("{program} in {} ran past 30 s", ns.name()))
        .expect("nsenter starts")
}

/// GET `$3` from `$1:$2` over bash's /dev/tcp: prints the response head's
/// lines (CR dropped), an empty line, then Content-Length bytes of body.
const BASH_HTTP_GET: &str = r#"exec 3<>"/dev/tcp/$1/$2" || exit 1
printf 'GET %s HTTP/1.1\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
len=0
while IFS= read -r line <&3; do
  line=${line%$'\r'}
  printf '%s\n' "$line"
  [ -z "$line" ] && break
  case $line in [Cc]ontent-[Ll]ength:*) len=${line#*:}; len=${len// /} ;; esac
done
head -c "$len" <&3"#;

/// Sends the file `$1` on a TCP connection to `$3:$4` (bash's /dev/tcp) while
/// printing the first `$2` bytes received, so bytes move both ways at once.
const BASH_ROUND_TRIP: &str = r#"exec 3<>"/dev/tcp/$3/$4" || exit 1
cat "$1" >&3 &
head -c "$2" <&3
wait "$!""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmodified_programs_in_the_sandbox_reach_any_address_through_the_tunnel() {
    require_root("sandbox egress test with external programs");
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let tunnel = tunnel(&pki, None, "prog").await;
    let a = actor("alpha");
    let sandbox = serve_activated(&tunnel, &gw, &a).await;

    // bash speaks HTTP to the sink's HTTP responder (port 80) over its
    // /dev/tcp: an unmodified program every Linux machine has.
    let out = run_in_netns(
        &sandbox.runtime,
        "bash",
        &[
            "-c",
            BASH_HTTP_GET,
            "bash",
            "198.51.100.7",
            "80",
            "/from-the-sandbox",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "bash's HTTP GET in the sandbox: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = String::from_utf8_lossy(&out.stdout);
    let (head, got) = answer.split_once("\n\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    let body = "x".repeat(SinkConfig::default().http_body_bytes);
    assert_eq!(got, body, "the body bash read");
    expect_seen(&mut gw, "alpha", "198.51.100.7:80").await;

    // bash sends 1 MiB to the sink's echo service and reads it back.
    let data = random(1 << 20, 5);
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), &data).expect("write temp file");
    let path = file.path().to_str().expect("utf-8 temp path");
    let len = data.len().to_string();
    let out = run_in_netns(
        &sandbox.runtime,
        "bash",
        &[
            "-c",
            BASH_ROUND_TRIP,
            "bash",
            path,
            &len,
            "203.0.113.9",
            "7",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "bash in the sandbox: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == data,
        "bash's echo came back corrupted ({} of {} bytes)",
        out.stdout.len(),
        data.len()
    );
    expect_seen(&mut gw, "alpha", "203.0.113.9:7").await;

    tunnel.close_sandbox(&a).await.expect("close");
    tunnel.shutdown().await;
}

/// The probed runtime's thread name, so its threads (workers and blocking
/// pool alike) can be picked out of /proc/self/task. At most 15 bytes: the
/// kernel keeps no more of a thread's name.
const PROBED_RUNTIME: &str = "atnt-probed-rt";

/// A network namespace's identity (nsfs device and inode), by a path to it.
fn netns_at(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).expect("stat network namespace");
    (meta.dev(), meta.ino())
}

fn this_threads_netns() -> (u64, u64) {
    netns_at(Path::new("/proc/thread-self/ns/net"))
}

/// This thread's kernel id, from `/proc/thread-self` (`<pid>/task/<tid>`).
fn this_threads_tid() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("read /proc/thread-self");
    link.file_name()
        .and_then(|t| t.to_str())
        .and_then(|t| t.parse().ok())
        .expect("/proc/thread-self names the thread id")
}

/// What samples of threads' namespaces found.
#[derive(Debug, Default)]
struct NetnsSamples {
    samples: u64,
    /// Threads sampled.
    threads: HashSet<u32>,
    /// Threads found in a namespace other than the host's: (thread, namespace).
    elsewhere: HashSet<(u32, (u64, u64))>,
}

impl NetnsSamples {
    fn record(&mut self, tid: u32, ns: (u64, u64), host: (u64, u64)) {
        self.samples += 1;
        self.threads.insert(tid);
        if ns != host {
            self.elsewhere.insert((tid, ns));
        }
    }
}

/// From outside the runtime: samples the namespace of every thread of the
/// probed runtime through /proc until `stop`, so a thread that entered a
/// namespace is caught even if no task of ours runs on it meanwhile.
fn scan_runtime_threads(host: (u64, u64), stop: &AtomicBool) -> NetnsSamples {
    let mut found = NetnsSamples::default();
    while !stop.load(Ordering::Relaxed) {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            // A thread may end between listing and reading: skip it.
            let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else {
                continue;
            };
            if name.trim_end() != PROBED_RUNTIME {
                continue;
            }
            if let Ok(meta) = std::fs::metadata(task.path().join("ns/net")) {
                found.record(tid, (meta.dev(), meta.ino()), host);
            }
        }
        // The sampling period, not a synchronisation.
        std::thread::sleep(Duration::from_micros(200));
    }
    found
}

/// From inside the runtime: tasks that sample the namespace of the worker
/// they run on between every other task's polls, and say which workers they
/// have seen since the last `reset`.
struct WorkerProbe {
    host: (u64, u64),
    samples: Mutex<NetnsSamples>,
    /// Worker threads seen since the last reset.
    seen: watch::Sender<HashSet<u32>>,
    stop: AtomicBool,
}

impl WorkerProbe {
    fn start(host: (u64, u64), tasks: usize) -> (Arc<Self>, Vec<tokio::task::JoinHandle<()>>) {
        let probe = Arc::new(Self {
            host,
            samples: Mutex::new(NetnsSamples::default()),
            seen: watch::Sender::new(HashSet::new()),
            stop: AtomicBool::new(false),
        });
        let handles = (0..tasks)
            .map(|_| {
                let probe = probe.clone();
                tokio::spawn(async move {
                    while !probe.stop.load(Ordering::Relaxed) {
                        probe.sample();
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        (probe, handles)
    }

    fn sample(&self) {
        let (tid, ns) = (this_threads_tid(), this_threads_netns());
        self.samples
            .lock()
            .expect("samples lock")
            .record(tid, ns, self.host);
        self.seen.send_if_modified(|seen| seen.insert(tid));
    }

    /// Waits until tasks have sampled `workers` distinct threads since the
    /// last reset, then resets.
    async fn wait_for_workers(&self, workers: usize) {
        let mut seen = self.seen.subscribe();
        tokio::time::timeout(
            Duration::from_secs(20),
            seen.wait_for(|s| s.len() >= workers),
        )
        .await
        .expect("every worker sampled within 20 s")
        .expect("probe alive");
        self.seen.send_replace(HashSet::new());
    }
}

/// Two sandboxes built, tunnelled through and closed. `host` is the
/// namespace the test started in.
async fn two_sandboxes_round_trip(host: (u64, u64)) {
    let pki = Pki::new();
    let mut gw = gateway(&pki, echo_sink(), |_| {}).await;
    let tunnel = tunnel(&pki, Some(fake_dns().await), "threads").await;
    let exec = tunnel.executor().clone();
    for (i, name) in ["alpha", "bravo"].into_iter().enumerate() {
        let sandbox = serve_activated(&tunnel, &gw, &actor(name)).await;
        assert_ne!(netns_at(&sandbox.runtime.path()), host);
        let dest: SocketAddr = "192.0.2.10:443".parse().expect("addr");
        let mut s = sandbox
            .connect_from_runtime(&exec, dest)
            .await
            .expect("actor dials");
        echo_check(&mut s, &random(64 * 1024, 10 + i as u64)).await;
        expect_seen(&mut gw, name, &dest.to_string()).await;
        dns_over_tcp_check(&sandbox, &exec, SocketAddr::from((GATEWAY_ADDR, DNS_PORT))).await;
    }
    for name in ["alpha", "bravo"] {
        tunnel.close_sandbox(&actor(name)).await.expect("close");
    }
    tunnel.shutdown().await;
}

#[test]
fn the_async_runtime_threads_never_change_namespace() {
    require_root("sandbox namespace test");
    const WORKERS: usize = 2;
    let host = this_threads_netns();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name(PROBED_RUNTIME)
        .enable_all()
        .build()
        .expect("runtime");
    let stop_scan = AtomicBool::new(false);
    let (scanned, sampled, round_trip) = std::thread::scope(|scope| {
        // Stops the scanner however this closure ends, so a panic here
        // fails the test instead of leaving the scope waiting on it.
        let _stop = StopOnDrop(&stop_scan);
        let scanner = scope.spawn(|| scan_runtime_threads(host, &stop_scan));
        let (probe, round_trip) = runtime.block_on(async {
            // Spawned from outside the runtime, so the probe tasks land in
            // the shared queue that both workers take from.
            let (probe, handles) = WorkerProbe::start(host, 2 * WORKERS);
            probe.wait_for_workers(WORKERS).await;
            // On a worker, like a worker's atunnel tasks. Bounded: a worker
            // left in a sandbox's namespace can make dials hang, not fail.
            let round_trip = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::spawn(two_sandboxes_round_trip(host)),
            )
            .await;
            probe.wait_for_workers(WORKERS).await;
            probe.stop.store(true, Ordering::Relaxed);
            for h in handles {
                h.await.expect("probe task");
            }
            (probe, round_trip)
        });
        stop_scan.store(true, Ordering::Relaxed);
        let scanned = scanner.join().expect("scanner thread");
        let sampled = std::mem::take(&mut *probe.samples.lock().expect("samples lock"));
        (scanned, sampled, round_trip)
    });
    drop(runtime);
    eprintln!(
        "runtime threads: {} samples from tasks on {:?}, {} from /proc of {} threads",
        sampled.samples,
        sampled.threads,
        scanned.samples,
        scanned.threads.len()
    );
    assert_eq!(this_threads_netns(), host, "the test's thread moved");
    assert_eq!(sampled.threads.len(), WORKERS, "tasks ran on both workers");
    assert!(
        sampled.elsewhere.is_empty(),
        "a worker was in another namespace when a task ran on it: {:?}",
        sampled.elsewhere
    );
    assert!(
        scanned.threads.is_superset(&sampled.threads),
        "the /proc scan saw every worker"
    );
    assert!(
        scanned.elsewhere.is_empty(),
        "a runtime thread was in another namespace: {:?}",
        scanned.elsewhere
    );
    round_trip
        .expect("sandboxes round trip within 60 s")
        .expect("sandboxes round trip");
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The overload guard weighs an actor's DNS queries in flight as its own:
/// two descriptors and 68 KiB each (`DNS_QUERY_HELD_*`), beside what its
/// tunnels and requests hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actors_dns_queries_in_flight_count_as_what_it_holds() {
    use atunnel::holdings::{DNS_QUERY_HELD_BYTES, DNS_QUERY_HELD_DESCRIPTORS};
    use atunnel_process::overload::{Held, OverloadConfig, OverloadState};
    require_root("sandbox egress test");
    const QUERIES: u16 = 10;
    let pki = Pki::new();
    let gw = gateway(&pki, echo_sink(), |_| {}).await;
    // A resolver that reads and never answers: each query stays in flight
    // for the relay's timeout.
    let silent = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let upstream = silent.local_addr().expect("addr");
    let memory = FakeMemoryCgroup::new(100);
    let mut cfg = pki.tunnel_config();
    cfg.netns_prefix = format!("atnt-{}-dnsheld-", std::process::id());
    cfg.dns = Some(RelayConfig {
        upstreams: vec![upstream],
        timeout: Duration::from_secs(30),
        ..RelayConfig::default()
    });
    cfg.overload = Some(OverloadConfig {
        memory_cgroup: Some(memory.path().to_path_buf()),
        // Sampled by the test alone.
        interval: Duration::from_secs(3600),
        ..OverloadConfig::default()
    });
    let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
    let guard = tunnel.overload().expect("guard").clone();
    let a = actor("alpha");
    let sandbox = serve_activated(&tunnel, &gw, &a).await;
    let exec = tunnel.executor().clone();
    let udp = udp_in_runtime(&exec, &sandbox, "0.0.0.0:0".parse().expect("addr")).await;
    for id in 0..QUERIES {
        udp.send_to(&dns_query(id), (GATEWAY_ADDR, DNS_PORT))
            .await
            .expect("send");
    }
    // Each reaches the resolver: then it is in flight.
    let mut buf = [0u8; 512];
    for _ in 0..QUERIES {
        tokio::time::timeout(Duration::from_secs(10), silent.recv_from(&mut buf))
            .await
            .expect("forwarded")
            .expect("recv");
    }
    assert_eq!(
        tunnel.dns_stats()[0].relay.in_flight,
        u64::from(QUERIES),
        "in /stats dns_relays[]"
    );

    // Soft: the fair share is what the one actor holds, its DNS alone.
    memory.set(880);
    assert_eq!(guard.sample(), OverloadState::Soft);
    let f = guard.stats();
    let n = u64::from(QUERIES);
    assert_eq!(
        (f.consumers, f.fair_share),
        (
            1,
            Some(Held {
                descriptors: n * DNS_QUERY_HELD_DESCRIPTORS,
                bytes: n * DNS_QUERY_HELD_BYTES,
            })
        ),
        "{f:?}"
    );
    tunnel.close_sandbox(&a).await.expect("close");
    tunnel.shutdown().await;
}
