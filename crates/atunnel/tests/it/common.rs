//! What several of this binary's modules need and no other test binary
//! does (what they share with other binaries is in atunnel-support).

use std::net::SocketAddr;
use std::time::Duration;

use atunnel_sandbox::{NetNs, NsExecutor};
use atunnel_support::prelude::*;
use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Dials `dest` from the named runtime namespace, as the actor's program
/// started there by the worker would.
pub async fn dial_from(exec: &NsExecutor, runtime_netns: &str, dest: SocketAddr) -> TcpStream {
    let ns = NetNs::open(runtime_netns).expect("the runtime namespace exists");
    let stream = exec
        .run_in(&ns, move || {
            // The redirect hands it to atunnel's listener in the gateway
            // namespace next door: a local connect, it does not block long.
            let s = std::net::TcpStream::connect(dest)?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(s)
        })
        .await
        .expect("executor")
        .expect("actor dials");
    TcpStream::from_std(stream).expect("register")
}

/// `data` goes out on `a` and arrives intact on `b`, within 20 s.
pub async fn carries(
    a: &mut (impl AsyncWriteExt + Unpin),
    b: &mut (impl AsyncReadExt + Unpin),
    data: &[u8],
) {
    let write = async { a.write_all(data).await.expect("write") };
    let read = async {
        let mut got = vec![0u8; data.len()];
        b.read_exact(&mut got).await.expect("read");
        got
    };
    let ((), got) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(write, read) })
            .await
            .expect("carried within 20 s");
    assert!(got == data, "the bytes arrived corrupted");
}

/// `data` goes out on `s` (through a sandbox's egress, to an echo) and
/// comes back intact, within 20 s.
pub async fn echo_check(s: &mut TcpStream, data: &[u8]) {
    let (mut r, mut w) = s.split();
    carries(&mut w, &mut r, data).await;
}

/// The error opening a tunnel to `authority` through `egress` ends in.
pub async fn open_error(
    egress: &atunnel::egress::ActorEgress,
    authority: &str,
) -> atunnel_connect::OpenError {
    match egress.client().open_authority(authority).await {
        Err(e) => e,
        Ok(t) => panic!("expected an error, got a {} tunnel", t.protocol()),
    }
}

/// An actor answering every request at once with "now".
pub async fn quick_actor() -> SocketAddr {
    http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from_static(b"now"))) }).await
}

/// Activates alpha, answered at `alpha`, and beta, a [`quick_actor`]; a
/// router connection ready for a stream.
pub async fn alpha_and_quick_beta(
    pki: &IngressPki,
    running: &RunningIngress,
    alpha: SocketAddr,
) -> h2::client::SendRequest<Bytes> {
    let quick = quick_actor().await;
    activate_loopback(&running.ingress, "alpha", "uid-1", alpha.port());
    activate_loopback(&running.ingress, "beta", "uid-2", quick.port());
    ready_h2_router(pki, running.https).await
}

/// The gateway saw one tunnel, from `actor_name`, to exactly `authority`.
pub async fn expect_seen(gw: &mut RunningGateway, actor_name: &str, authority: &str) {
    let seen = tokio::time::timeout(Duration::from_secs(10), gw.seen.recv())
        .await
        .expect("gateway saw the tunnel within 10 s")
        .expect("gateway running");
    assert_eq!(seen.authority, authority, "original destination lost");
    assert_eq!(seen.identity.actor_name, actor_name);
}

/// `answer` comes within 10 s, a 504 (Gateway Timeout), and no sooner than
/// `bound` after `started`.
pub async fn answered_504_after(
    answer: h2::client::ResponseFuture,
    started: tokio::time::Instant,
    bound: Duration,
) {
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered within 10 s")
        .expect("an answer");
    assert_eq!(answer.status(), 504);
    assert!(started.elapsed() >= bound, "504 before {bound:?}");
}
