//! The one accept loop (`atunnel_core::listener`) over real sockets: a cap
//! leaves the next peer in the backlog until a connection ends, a refused
//! connection is closed at once, and stopping waits for every connection
//! task it spawned.

use std::sync::Arc;
use std::time::Duration;

use atunnel_core::{Listener, ListenerCounters};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Each connection is greeted with its number, then held until the test
/// sends on its release channel; a connection numbered in `refused` is not
/// taken.
struct Served {
    addr: std::net::SocketAddr,
    releases: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    cancel: CancellationToken,
    stats: Arc<ListenerCounters>,
    done: tokio::task::JoinHandle<()>,
}

async fn serve(cap: Option<usize>, refused: &'static [u8]) -> Served {
    let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let mut listener = Listener::new(tcp, "test");
    if let Some(n) = cap {
        listener = listener.with_cap(Arc::new(Semaphore::new(n)));
    }
    let (tx, releases) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let stats = Arc::new(ListenerCounters::default());
    let done = tokio::spawn({
        let (cancel, stats) = (cancel.clone(), stats.clone());
        async move {
            let mut n = 0u8;
            listener
                .serve(&cancel, &stats, |mut tcp, _| {
                    n += 1;
                    if refused.contains(&n) {
                        return None;
                    }
                    let (release, released) = oneshot::channel();
                    tx.send(release).expect("test alive");
                    Some(async move {
                        tcp.write_all(&[n]).await.expect("greet");
                        let _ = released.await;
                    })
                })
                .await
        }
    });
    Served {
        addr,
        releases,
        cancel,
        stats,
        done,
    }
}

async fn greeting(s: &mut TcpStream) -> u8 {
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b))
        .await
        .expect("greeted within 10 s")
        .expect("greeting");
    b[0]
}

#[tokio::test]
async fn a_capped_listener_leaves_the_next_peer_waiting_until_a_connection_ends() {
    let mut served = serve(Some(1), &[]).await;
    let mut first = TcpStream::connect(served.addr).await.expect("connect");
    assert_eq!(greeting(&mut first).await, 1);
    let release_first = served.releases.recv().await.expect("first taken");
    // Connected (the kernel's backlog took it) but not accepted: no greeting.
    let mut second = TcpStream::connect(served.addr).await.expect("connect");
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), second.read(&mut b))
            .await
            .is_err(),
        "the second peer was served past the cap"
    );
    assert_eq!(served.stats.stats().accepted_total, 1);
    release_first.send(()).expect("first still held");
    assert_eq!(
        greeting(&mut second).await,
        2,
        "served once the first ended"
    );
    served.cancel.cancel();
    drop(served.releases);
    served.done.await.expect("serve ends");
}

#[tokio::test]
async fn a_refused_connection_is_closed_at_once_and_the_next_is_served() {
    let served = serve(None, &[1]).await;
    let mut refused = TcpStream::connect(served.addr).await.expect("connect");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut got))
        .await
        .expect("closed within 10 s")
        .expect("a clean close");
    assert!(got.is_empty(), "no byte for a refused connection");
    let mut next = TcpStream::connect(served.addr).await.expect("connect");
    assert_eq!(greeting(&mut next).await, 2);
    assert_eq!(served.stats.stats().accepted_total, 2);
    served.cancel.cancel();
}

#[tokio::test]
async fn stopping_closes_the_listener_and_waits_for_every_connection() {
    let mut served = serve(None, &[]).await;
    let mut held = TcpStream::connect(served.addr).await.expect("connect");
    assert_eq!(greeting(&mut held).await, 1);
    let release = served.releases.recv().await.expect("taken");
    assert!(served.stats.connection_future_bytes() > 0);
    served.cancel.cancel();
    // Not done while its connection runs.
    let mut done = served.done;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut done)
            .await
            .is_err(),
        "serve returned with a connection still running"
    );
    assert!(
        TcpStream::connect(served.addr).await.is_err(),
        "the listening socket is closed once stopped"
    );
    release.send(()).expect("connection still held");
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("serve ends once its connections have")
        .expect("serve task");
}
