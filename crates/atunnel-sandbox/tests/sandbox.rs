//! Real sandboxes (root): namespaces, veth, the nftables redirect.

use std::net::SocketAddr;
use std::time::Duration;

use atunnel_core::original_dst::original_dst;
use atunnel_sandbox::sandbox::{DEFAULT_EGRESS_PORT, GATEWAY_ADDR, SandboxNetwork};
use atunnel_sandbox::{NsExecutor, netns, require_root};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn name(tag: &str) -> String {
    format!("atnt-{}-{tag}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirected_connections_keep_their_original_destination() {
    require_root("redirect test");
    let exec = NsExecutor::start().expect("executor");
    let sb = SandboxNetwork::create(&exec, &name("redir"), DEFAULT_EGRESS_PORT)
        .await
        .expect("sandbox");
    let listener = sb.listen_egress(&exec).await.expect("egress listener");
    for dest in ["192.0.2.10:443", "198.51.100.7:8080", "203.0.113.99:9999"] {
        let dest: SocketAddr = dest.parse().expect("addr");
        let (client, accepted) =
            tokio::join!(sb.connect_from_runtime(&exec, dest), listener.accept());
        let mut client = client.expect("actor dials any address");
        let (mut server, peer) = accepted.expect("redirected to the egress listener");
        assert_eq!(peer.ip(), std::net::IpAddr::from([169, 254, 17, 2]));
        assert_eq!(original_dst(&server).expect("original destination"), dest);
        client.write_all(b"hello").await.expect("write");
        let mut got = [0u8; 5];
        server.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");
        server.write_all(b"world").await.expect("write back");
        client.read_exact(&mut got).await.expect("read back");
        assert_eq!(&got, b"world");
    }
    sb.destroy(&exec).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tcp_and_dns_leave_the_actor() {
    require_root("filter test");
    let exec = NsExecutor::start().expect("executor");
    let sb = SandboxNetwork::create(&exec, &name("udp"), DEFAULT_EGRESS_PORT)
        .await
        .expect("sandbox");
    let dns = sb
        .bind_udp(&exec, SocketAddr::from((GATEWAY_ADDR, 53)))
        .await
        .expect("dns socket");
    let other = sb
        .bind_udp(&exec, SocketAddr::from((GATEWAY_ADDR, 5353)))
        .await
        .expect("other socket");
    let runtime = sb.runtime.clone();
    let sender = exec
        .run_in(&runtime, || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(s)
        })
        .await
        .expect("executor")
        .expect("udp socket in the runtime namespace");
    let sender = tokio::net::UdpSocket::from_std(sender).expect("register");
    // Send to the filtered port first: if it were let through, it would be
    // waiting on `other` by the time DNS arrives on `dns`.
    sender
        .send_to(b"not dns", (GATEWAY_ADDR, 5353))
        .await
        .expect("send");
    sender
        .send_to(b"dns query", (GATEWAY_ADDR, 53))
        .await
        .expect("send");
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), dns.recv_from(&mut buf))
        .await
        .expect("DNS arrives")
        .expect("recv");
    assert_eq!(&buf[..n], b"dns query");
    assert!(
        other.try_recv_from(&mut buf).is_err(),
        "UDP other than DNS got through"
    );
    sb.destroy(&exec).await.expect("destroy");
}

#[tokio::test]
async fn destroying_twice_is_harmless() {
    require_root("sandbox destroy test");
    let exec = NsExecutor::start().expect("executor");
    let sb = SandboxNetwork::create(&exec, &name("twice"), DEFAULT_EGRESS_PORT)
        .await
        .expect("sandbox");
    sb.clone().destroy(&exec).await.expect("first destroy");
    assert!(!netns::exists(sb.name()));
    sb.destroy(&exec).await.expect("second destroy is a no-op");
}
