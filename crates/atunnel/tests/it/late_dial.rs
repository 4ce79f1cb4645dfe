//! A connection dialed for an activation that completes only after the actor
//! was deactivated is closed, never used, and never handed to the next
//! activation of the same name: ingress over the HTTPS and the CONNECT
//! listener, and egress toward the gateway.

use atunnel_support::prelude::*;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use atunnel::ingress::Ingress;
use atunnel::ingress::{ActorDialer, ActorRoute};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// Upper bound on waiting for an event that should come at once.
const PROMPTLY: Duration = Duration::from_secs(5);

async fn promptly<T>(what: &str, event: impl Future<Output = T>) -> T {
    tokio::time::timeout(PROMPTLY, event)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {PROMPTLY:?}"))
}

/// What the actor's program saw, each connection named by its peer address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActorEvent {
    Request(SocketAddr),
    Closed(SocketAddr),
}

struct ActorLog {
    events: mpsc::UnboundedReceiver<ActorEvent>,
    seen: Vec<ActorEvent>,
}

impl ActorLog {
    /// Waits for the connection from `peer` to be closed by atunnel.
    async fn closed(&mut self, peer: SocketAddr) {
        while !self.seen.contains(&ActorEvent::Closed(peer)) {
            let event = promptly("the late connection's EOF at the actor", self.events.recv())
                .await
                .expect("actor running");
            self.seen.push(event);
        }
    }

    /// The peer of every request the actor has answered so far.
    fn request_peers(&mut self) -> Vec<SocketAddr> {
        while let Ok(event) = self.events.try_recv() {
            self.seen.push(event);
        }
        self.seen
            .iter()
            .filter_map(|e| match e {
                ActorEvent::Request(peer) => Some(*peer),
                ActorEvent::Closed(_) => None,
            })
            .collect()
    }
}

/// An HTTP/1.1 actor on loopback answering every request with the address
/// of the connection's peer (atunnel's end), so a test can tell which
/// dialed connection carried it.
async fn peer_naming_actor() -> (SocketAddr, ActorLog) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (events, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let events = events.clone();
            tokio::spawn(async move {
                let requests = events.clone();
                let svc = hyper::service::service_fn(move |_req| {
                    let _ = requests.send(ActorEvent::Request(peer));
                    let body = Full::new(Bytes::from(peer.to_string()));
                    async move { Ok::<_, Infallible>(http::Response::new(body)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
                let _ = events.send(ActorEvent::Closed(peer));
            });
        }
    });
    let log = ActorLog {
        events: rx,
        seen: Vec::new(),
    };
    (addr, log)
}

enum DialEvent {
    Started,
    /// A TCP connection to the actor completed, from this local address.
    Connected(SocketAddr),
}

/// Dials the actor once `gate` is open, reporting each dial's start and each
/// connection it made. The connection is made in a task of its own and
/// handed back through a channel, so it really completes even when the
/// dial that asked for it was dropped meanwhile; it is then dropped.
struct RecordingDialer {
    actor: SocketAddr,
    gate: watch::Receiver<bool>,
    events: mpsc::UnboundedSender<DialEvent>,
}

impl ActorDialer for RecordingDialer {
    fn dial(&self, _port: u16) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        let _ = self.events.send(DialEvent::Started);
        let (handoff, dialed) = oneshot::channel();
        let (actor, mut gate, events) = (self.actor, self.gate.clone(), self.events.clone());
        tokio::spawn(async move {
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            let tcp = TcpStream::connect(actor).await;
            if let Some(local) = tcp.as_ref().ok().and_then(|t| t.local_addr().ok()) {
                let _ = events.send(DialEvent::Connected(local));
            }
            let _ = handoff.send(tcp);
        });
        Box::pin(async move {
            dialed
                .await
                .unwrap_or_else(|_| Err(io::Error::other("dialing task ended")))
        })
    }
}

struct Dials(mpsc::UnboundedReceiver<DialEvent>);

impl Dials {
    async fn started(&mut self) {
        loop {
            let event = promptly("a dial to start", self.0.recv()).await;
            if let DialEvent::Started = event.expect("dialer alive") {
                return;
            }
        }
    }

    async fn next_connection(&mut self) -> SocketAddr {
        loop {
            let event = promptly("the gated dial to connect", self.0.recv()).await;
            if let DialEvent::Connected(local) = event.expect("dialer alive") {
                return local;
            }
        }
    }

    /// Local addresses of the connections made since the last look.
    fn connections(&mut self) -> Vec<SocketAddr> {
        std::iter::from_fn(|| self.0.try_recv().ok())
            .filter_map(|e| match e {
                DialEvent::Connected(local) => Some(local),
                DialEvent::Started => None,
            })
            .collect()
    }
}

fn recording_dialer(actor: SocketAddr, gate: watch::Receiver<bool>) -> (RecordingDialer, Dials) {
    let (events, rx) = mpsc::unbounded_channel();
    let dialer = RecordingDialer {
        actor,
        gate,
        events,
    };
    (dialer, Dials(rx))
}

/// `team-a/alpha` active as uid-1 behind a closed gate; its next dial hangs.
struct LateDial {
    pki: IngressPki,
    running: RunningIngress,
    actor: SocketAddr,
    actor_log: ActorLog,
    gate: watch::Sender<bool>,
    dials: Dials,
    /// uid-1, held so that a late connection kept in its pool would stay
    /// open and be caught.
    first: Arc<ActorRoute>,
}

impl LateDial {
    async fn start() -> Self {
        let pki = IngressPki::new();
        let running = ingress(&pki).await;
        let (actor, actor_log) = peer_naming_actor().await;
        let (gate, gate_rx) = watch::channel(false);
        let (dialer, dials) = recording_dialer(actor, gate_rx);
        running
            .ingress
            .activate("team-a", "alpha", "uid-1", Box::new(dialer))
            .expect("activate uid-1");
        let first = running
            .ingress
            .route("team-a", "alpha")
            .expect("uid-1 routed");
        Self {
            pki,
            running,
            actor,
            actor_log,
            gate,
            dials,
            first,
        }
    }

    /// Activates uid-2, then lets uid-1's dial complete; returns the late
    /// connection's local address (once the actor saw it closed) and uid-2's
    /// dials.
    async fn reactivate_then_complete_the_late_dial(&mut self) -> (SocketAddr, Dials) {
        // Open from the start (a closed channel keeps its last value).
        let (_, open) = watch::channel(true);
        let (dialer, dials) = recording_dialer(self.actor, open);
        self.running
            .ingress
            .activate("team-a", "alpha", "uid-2", Box::new(dialer))
            .expect("activate uid-2");
        self.gate.send(true).expect("gated dialer alive");
        let late = self.dials.next_connection().await;
        self.actor_log.closed(late).await;
        (late, dials)
    }

    /// uid-2's request was answered over its own single new connection, and
    /// nothing ever travelled over the late one.
    fn assert_served_by_uid2(&mut self, answered_by: &str, late: SocketAddr, mut dials: Dials) {
        let peer: SocketAddr = answered_by.parse().expect("the actor names its peer");
        assert_eq!(
            dials.connections(),
            vec![peer],
            "uid-2 dialed exactly one connection and was served over it"
        );
        assert_ne!(peer, late, "uid-2 was served over the late connection");
        let second = self
            .running
            .ingress
            .route("team-a", "alpha")
            .expect("uid-2 routed");
        assert_eq!(second.uid(), "uid-2");
        assert_eq!(second.new_connections(), 1);
        assert_eq!(
            self.first.new_connections(),
            0,
            "the late connection was counted as uid-1's"
        );
        assert_eq!(self.running.ingress.stats().new_upstream_connections, 1);
        assert_eq!(
            self.actor_log.request_peers(),
            vec![peer],
            "a request reached the actor over another connection"
        );
    }
}

/// Waits for uid-1's dial to start, then deactivates uid-1.
async fn deactivate_while_dialing(dials: &mut Dials, ingress: &Ingress) {
    dials.started().await;
    ingress.deactivate("team-a", "alpha", "uid-1").await;
}

fn get_alpha() -> http::Request<Full<Bytes>> {
    http::Request::get(format!("https://{WORKER_NAME}/"))
        .header("ate-target-actor", "team-a/alpha")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_a_dial_completing_after_deactivation_is_closed_and_never_reused() {
    let mut f = LateDial::start().await;
    let mut router = RouterConn::open(&f.pki, f.running.https, false).await;
    let (answer, ()) = promptly("the request to be cancelled", async {
        tokio::join!(
            router.send(get_alpha()),
            deactivate_while_dialing(&mut f.dials, &f.running.ingress)
        )
    })
    .await;
    let answer = answer.expect("an answer, not a hang");
    // forward() answers a request cancelled by deactivation with 502.
    assert_eq!(answer.status(), 502);
    assert_eq!(body_text(answer).await, "bad gateway\n");

    let (late, dials) = f.reactivate_then_complete_the_late_dial().await;
    let answer = router.send(get_alpha()).await.expect("uid-2 answers");
    assert_eq!(answer.status(), 200);
    let peer = body_text(answer).await;
    f.assert_served_by_uid2(&peer, late, dials);
}

/// Opens an HTTP/1.1 CONNECT to `team-a/alpha` port 80; returns the stream
/// and the answer's head.
async fn connect_alpha(
    pki: &IngressPki,
    addr: SocketAddr,
) -> (tokio_rustls::client::TlsStream<TcpStream>, String) {
    let mut tls = router_tls(pki, addr, None, None, &[b"http/1.1"])
        .await
        .expect("router TLS");
    tls.write_all(
        b"CONNECT actor:80 HTTP/1.1\r\nHost: actor:80\r\nate-target-actor: team-a/alpha\r\n\r\n",
    )
    .await
    .expect("write head");
    let head = atunnel_connect::http1::read_head(&mut tls)
        .await
        .expect("answer head");
    (tls, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_a_dial_completing_after_deactivation_is_closed_and_never_reused() {
    let mut f = LateDial::start().await;
    let ((_refused, head), ()) = promptly("the CONNECT to be refused", async {
        tokio::join!(
            connect_alpha(&f.pki, f.running.connect),
            deactivate_while_dialing(&mut f.dials, &f.running.ingress)
        )
    })
    .await;
    // The connector gives up a dial on deactivation; open() answers 502.
    assert!(head.starts_with("HTTP/1.1 502 "), "{head}");

    let (late, dials) = f.reactivate_then_complete_the_late_dial().await;
    let (tunnel, head) = connect_alpha(&f.pki, f.running.connect).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .expect("HTTP/1.1 through the tunnel");
    tokio::spawn(conn);
    let request = http::Request::get("/")
        .header("host", "actor")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let answer = send.send_request(request).await.expect("uid-2 answers");
    assert_eq!(answer.status(), 200);
    let peer = body_text(answer).await;
    f.assert_served_by_uid2(&peer, late, dials);
}

enum ProxyEvent {
    Accepted,
    /// A held connection was relayed to the end.
    Relayed,
}

/// A TCP proxy in front of `upstream` that holds each connection, unread and
/// not yet forwarded, until `gate` opens, then relays it both ways.
async fn gated_proxy(
    upstream: SocketAddr,
    gate: watch::Receiver<bool>,
) -> (SocketAddr, mpsc::UnboundedReceiver<ProxyEvent>) {
    let (events, rx) = mpsc::unbounded_channel();
    let addr = destination(move |mut client| {
        let _ = events.send(ProxyEvent::Accepted);
        let (mut gate, events) = (gate.clone(), events.clone());
        async move {
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            let _ = events.send(ProxyEvent::Relayed);
        }
    })
    .await;
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_a_gateway_answer_after_deactivation_is_never_handed_to_the_next_activation() {
    let pki = Pki::new();
    let mut gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let (gate, gate_rx) = watch::channel(false);
    let (held, mut proxied) = gated_proxy(gw.addr, gate_rx).await;
    let a = actor("alpha");
    let egress = egress();
    let cancel = CancellationToken::new();
    let (addr, source) = listen_activated(&pki, &egress, &a, held, &cancel).await;
    let mut opening = TcpStream::connect(addr).await.expect("connect");
    let accepted = promptly("the tunnel to dial the gateway", proxied.recv()).await;
    assert!(matches!(accepted, Some(ProxyEvent::Accepted)));

    egress.deactivate(&a.uid).await.expect("deactivate");
    egress
        .activate(&a.uid, prepare(&pki, gw.addr, a.clone(), source).await)
        .expect("reactivate");
    // The gateway now gets the old tunnel's handshake and answers it.
    gate.send(true).expect("proxy alive");
    let relayed = promptly("the late gateway connection to end", proxied.recv()).await;
    assert!(
        matches!(relayed, Some(ProxyEvent::Relayed)),
        "the late gateway connection was kept"
    );
    assert!(
        closes_with_no_bytes(&mut opening).await,
        "the old activation's connection got bytes"
    );

    let mut fresh = TcpStream::connect(addr).await.expect("connect");
    assert!(echoes(&mut fresh, b"new activation").await);
    // Both activations carry the same identity: the gateway must have seen
    // exactly one CONNECT, the fresh tunnel's.
    let connects: Vec<_> = std::iter::from_fn(|| gw.seen.try_recv().ok()).collect();
    assert_eq!(connects.len(), 1, "CONNECTs seen: {}", connects.len());
    assert_eq!(connects[0].authority, SINK_ECHO);
    assert_eq!(connects[0].identity.actor_uid, a.uid);
}
