//! A gateway a test scripts, for what the real one never does (hang up
//! mid-CONNECT, refuse streams, reset after its end, freeze, flood): TLS
//! with the gateway's certificate on loopback (no client authentication),
//! each accepted connection counted and handed to the test's script, as
//! the TLS stream or, for HTTP/2, as h2's server connection; and
//! [`far_gateway`], an HTTP/2 one scripted to echo or flood every CONNECT,
//! freeze and say when its connections end.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::server::TlsStream;

use crate::gateway::echo_h2;
use crate::pki::Pki;

/// h2's server connection over the gateway's TLS.
pub type H2Conn = h2::server::Connection<TlsStream<TcpStream>, Bytes>;

/// A scripted gateway, serving until dropped.
pub struct ScriptedGateway {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for ScriptedGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves TLS offering `alpn` and hands the `n`th connection (from 1) to
/// `script`, each in its own task; a failed handshake is dropped.
pub async fn scripted_tls_gateway<F, Fut>(pki: &Pki, alpn: &[&str], script: F) -> ScriptedGateway
where
    F: Fn(usize, TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(pki.gateway_cert.chain.clone(), pki.gateway_cert.key())
    .expect("server config");
    tls.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let (count, script) = (accepted.clone(), Arc::new(script));
    let task = tokio::spawn(async move {
        // Aborted with the gateway, and its connections with it.
        let mut connections = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let (acceptor, script) = (acceptor.clone(), script.clone());
            connections.spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    script(n, tls).await;
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    ScriptedGateway {
        addr,
        accepted,
        task,
    }
}

/// Serves HTTP/2 (ALPN `h2`) set up by `builder` and hands the `n`th
/// connection, once its handshake is done, to `script`.
pub async fn scripted_h2_gateway<F, Fut>(
    pki: &Pki,
    builder: h2::server::Builder,
    script: F,
) -> ScriptedGateway
where
    F: Fn(usize, H2Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let script = Arc::new(script);
    scripted_tls_gateway(pki, &["h2"], move |n, tls| {
        let (script, builder) = (script.clone(), builder.clone());
        async move {
            if let Ok(conn) = builder.handshake(tls).await {
                script(n, conn).await;
            }
        }
    })
    .await
}

/// What a [`far_gateway`] does with each CONNECT it answers 200.
#[derive(Clone, Copy)]
pub enum Far {
    /// Echoes the stream and its end.
    Echo,
    /// Once [`FarGateway::flood`] is set, sends as fast as the client's
    /// windows allow, forever.
    Flood,
}

/// A hand-made HTTP/2 gateway (rustls and h2's server), so a test sees
/// exactly what the client granted and when a connection ended.
pub struct FarGateway {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    /// Bytes sent on all flooded streams.
    pub flooded: Arc<AtomicUsize>,
    /// Flooded streams send once this is true: a test can open them all
    /// before any sends. It starts false.
    pub flood: watch::Sender<bool>,
    /// One message per connection, when it has ended.
    pub ended: mpsc::UnboundedReceiver<()>,
    /// Each connection's ping handle, to wait for the client to have seen
    /// everything sent before it.
    pub pings: mpsc::UnboundedReceiver<h2::PingPong>,
    /// Connections numbered up to this (from 1) stop being served.
    freeze: watch::Sender<usize>,
    /// Woken each time `flooded` grows.
    sent_more: Arc<Notify>,
    _gateway: ScriptedGateway,
}

impl FarGateway {
    /// Black-holes every connection accepted so far: their TCP stays up
    /// and nothing on them is answered, PINGs included, as a black-holed
    /// peer looks.
    pub fn freeze_open_connections(&self) {
        self.freeze
            .send_replace(self.accepted.load(Ordering::SeqCst));
    }

    /// Waits up to `within` until the flooded streams have sent `at_least`
    /// bytes in all.
    pub async fn flooded_to(&self, at_least: usize, within: Duration) {
        tokio::time::timeout(within, async {
            loop {
                // Made before the check: a send between the two still
                // wakes it.
                let more = self.sent_more.notified();
                if self.flooded.load(Ordering::SeqCst) >= at_least {
                    return;
                }
                more.await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the far end sent {} of {at_least} bytes",
                self.flooded.load(Ordering::SeqCst)
            )
        });
    }
}

/// A [`scripted_h2_gateway`] set up by `builder` answering every CONNECT
/// 200 and doing `far` with its stream.
pub async fn far_gateway(pki: &Pki, builder: h2::server::Builder, far: Far) -> FarGateway {
    let flooded = Arc::new(AtomicUsize::new(0));
    let sent_more = Arc::new(Notify::new());
    let (flood, gate) = watch::channel(false);
    let (ended_tx, ended) = mpsc::unbounded_channel();
    let (pings_tx, pings) = mpsc::unbounded_channel();
    let (freeze, frozen) = watch::channel(0);
    let sent = (flooded.clone(), sent_more.clone());
    let gateway = scripted_h2_gateway(pki, builder, move |n, mut conn| {
        let (sent, gate, ended, pings, mut frozen) = (
            sent.clone(),
            gate.clone(),
            ended_tx.clone(),
            pings_tx.clone(),
            frozen.clone(),
        );
        async move {
            let _ = pings.send(conn.ping_pong().expect("ping handle"));
            let mut streams = JoinSet::new();
            loop {
                // Biased to the freeze: a CONNECT that arrives before
                // this task saw the freeze must find it frozen, not be
                // answered by a coin toss.
                let next = tokio::select! {
                    biased;
                    () = async {
                        let _ = frozen.wait_for(|upto| n <= *upto).await;
                    } => {
                        // Held, never polled again.
                        let _conn = conn;
                        return std::future::pending().await;
                    }
                    next = conn.accept() => next,
                };
                let Some(Ok((request, mut respond))) = next else {
                    break;
                };
                let Ok(send) = respond.send_response(http::Response::new(()), false) else {
                    continue;
                };
                match far {
                    Far::Echo => streams.spawn(echo_h2(request.into_body(), send)),
                    Far::Flood => {
                        // The request body is kept, so the stream stays open.
                        let body = request.into_body();
                        streams.spawn(flood_stream(send, body, sent.clone(), gate.clone()))
                    }
                };
            }
            let _ = ended.send(());
        }
    })
    .await;
    FarGateway {
        addr: gateway.addr,
        accepted: gateway.accepted.clone(),
        flooded,
        flood,
        ended,
        pings,
        freeze,
        sent_more,
        _gateway: gateway,
    }
}

/// Once the gate opens, sends whatever window the client grants, counting it.
async fn flood_stream(
    mut send: h2::SendStream<Bytes>,
    _body: h2::RecvStream,
    (sent, more): (Arc<AtomicUsize>, Arc<Notify>),
    mut gate: watch::Receiver<bool>,
) {
    const PIECE: usize = 16 * 1024;
    // One piece for every stream: tests measure the whole process's heap,
    // the far end's included.
    static ZEROS: [u8; PIECE] = [0; PIECE];
    if gate.wait_for(|open| *open).await.is_err() {
        return;
    }
    let zeros = Bytes::from_static(&ZEROS);
    loop {
        send.reserve_capacity(PIECE);
        let granted = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            _ => return,
        };
        if send.send_data(zeros.slice(..granted), false).is_err() {
            return;
        }
        sent.fetch_add(granted, Ordering::SeqCst);
        more.notify_waiters();
    }
}
