//! A mutual-TLS server for CONNECT tunnels over HTTP/2 and HTTP/1.1, shared
//! by the egress gateway and atunnel's ingress CONNECT listener. What a
//! tunnel may reach, and what happens inside it, is the handler's.
//!
//! HTTP/2 CONNECT streams are read and written in place (h2 crate, no
//! upgrade layer), HTTP/1.1 heads are read without over-reading, so the relay
//! gets bare streams it can wait on without a buffer. A connection that
//! idles for the hibernation period drops its rustls session for its
//! traffic keys (atunnel_tls::stream), tunnels open or not.

use atunnel_tls::{PreAuthGate, PreAuthLimits, PreAuthStats, ReloadableConfig};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use atunnel_core::H2Stream;
use atunnel_core::endpoint::Endpoint;
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{Listener, ListenerCounters, ListenerStats};
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use atunnel_tls::{Activity, ActivityIo, Hibernation, RustlsStream, ServerTls, with_hibernation};

use crate::flood::{FloodCount, FloodGuard, FloodLimits, Role};
use crate::http1;
use crate::limits::{
    HANDSHAKE_TIMEOUT, MAX_CONCURRENT_RESET_STREAMS, MAX_CONCURRENT_STREAMS,
    MAX_LOCAL_ERROR_RESET_STREAMS, MAX_PENDING_ACCEPT_RESET_STREAMS, TUNNEL_CONNECTION_WINDOW,
    TUNNEL_MAX_FRAME_SIZE, TUNNEL_MAX_HEADER_LIST, TUNNEL_MAX_SEND_BUF, TUNNEL_STREAM_WINDOW,
};
use crate::preface::read_h2_preface;

/// One CONNECT (or other) request as received.
pub struct ConnectRequest<'a> {
    pub protocol: &'static str,
    pub method: &'a str,
    pub authority: &'a str,
    /// Every header besides the method and authority (HTTP/2 pseudo-headers
    /// are not headers here).
    pub headers: &'a http::HeaderMap,
    pub client: SocketAddr,
}

/// The handler's answer to a request.
pub enum Answer<T> {
    Open(T),
    Refuse {
        status: u16,
        reason: &'static str,
        body: String,
        headers: &'static [(&'static str, &'static str)],
        /// Sent as `Retry-After`, in whole seconds (at least 1).
        retry_after: Option<std::time::Duration>,
    },
}

impl<T> Answer<T> {
    pub fn refuse(status: u16, reason: &'static str, body: impl Into<String>) -> Self {
        Answer::Refuse {
            status,
            reason,
            body: body.into(),
            headers: &[],
            retry_after: None,
        }
    }

    /// 503 with `Retry-After: retry_after` (the configured wait, not a
    /// constant).
    pub fn unavailable(body: impl Into<String>, retry_after: std::time::Duration) -> Self {
        Answer::Refuse {
            status: 503,
            reason: "Service Unavailable",
            body: body.into(),
            headers: &[],
            retry_after: Some(retry_after),
        }
    }
}

/// What a CONNECT server does with its peers and their tunnels.
pub trait ConnectHandler: Send + Sync + 'static {
    /// Who the TLS peer is, checked once per connection.
    type Peer: Clone + Send + Sync + 'static;
    /// What an accepted tunnel leads to.
    type Target: Send + 'static;

    fn peer(&self, tls: &rustls::ServerConnection) -> io::Result<Self::Peer>;

    /// Decides on a request; every method arrives here (refuse what is not
    /// CONNECT with 405).
    fn open(
        &self,
        peer: &Self::Peer,
        req: ConnectRequest<'_>,
    ) -> impl Future<Output = Answer<Self::Target>> + Send;

    /// Runs an accepted tunnel to its end.
    fn run<E: Endpoint + Send>(
        &self,
        target: Self::Target,
        tunnel: &mut E,
    ) -> impl Future<Output = ()> + Send;
}

/// HTTP/2 settings of a CONNECT server.
#[derive(Clone, Copy, Debug)]
pub struct H2Settings {
    pub max_concurrent_streams: u32,
    pub stream_window: u32,
    pub connection_window: u32,
    /// Largest frame a client may send (see [`TUNNEL_MAX_FRAME_SIZE`]).
    pub max_frame_size: u32,
    /// How long a client has, once TLS is done, to send its preface
    /// ([`read_h2_preface`]; default [`HANDSHAKE_TIMEOUT`]).
    pub preface_timeout: Duration,
    /// How long a client has to finish TLS (default [`HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// Connections still in their TLS handshake, in total and per source
    /// address; past either, new ones are closed at once.
    pub pre_auth: PreAuthLimits,
    /// An HTTP/2 client is pinged this often, and its connection closed
    /// (its tunnels cut) if a ping goes unanswered for `ping_timeout`;
    /// zero: never (the gateway, whose clients ping it; TCP keepalive
    /// still finds a vanished one). Ingress CONNECT pings its routers.
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// Each connection's control-frame budget ([`crate::flood`]).
    pub floods: FloodLimits,
}

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            stream_window: TUNNEL_STREAM_WINDOW,
            connection_window: TUNNEL_CONNECTION_WINDOW,
            max_frame_size: TUNNEL_MAX_FRAME_SIZE,
            preface_timeout: HANDSHAKE_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            pre_auth: PreAuthLimits::default(),
            ping_interval: Duration::ZERO,
            ping_timeout: Duration::ZERO,
            floods: FloodLimits::default(),
        }
    }
}

/// Pings the client every `interval`; ends when a ping goes unanswered
/// for `timeout` (or the connection can no longer ping): it is dead.
async fn unanswered_ping(mut pinger: h2::PingPong, interval: Duration, timeout: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pinger.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            _ => return,
        }
    }
}

pub struct ConnectServer<H: ConnectHandler> {
    handler: Arc<H>,
    tls: Arc<ReloadableConfig>,
    socket: SocketOptions,
    h2: H2Settings,
    hibernation: Arc<Hibernation>,
    listeners: ListenerCounters,
    pre_auth: Arc<PreAuthGate>,
    /// HTTP/2 connections ended for a control-frame flood.
    floods: Arc<FloodCount>,
}

impl<H: ConnectHandler> ConnectServer<H> {
    pub fn new(
        handler: Arc<H>,
        tls: Arc<ReloadableConfig>,
        socket: SocketOptions,
        h2: H2Settings,
        hibernation: Arc<Hibernation>,
    ) -> Arc<Self> {
        Arc::new(Self {
            handler,
            tls,
            socket,
            h2,
            hibernation,
            listeners: ListenerCounters::default(),
            pre_auth: PreAuthGate::new(h2.pre_auth),
            floods: Arc::new(FloodCount::with_limits(h2.floods)),
        })
    }

    /// Connections in their TLS handshake now, and those refused for it.
    pub fn pre_auth(&self) -> PreAuthStats {
        self.pre_auth.stats()
    }

    /// The handler every connection's tunnels go to.
    pub fn handler(&self) -> &Arc<H> {
        &self.handler
    }

    /// HTTP/2 connections ended for a control-frame flood, so far.
    pub fn h2_floods(&self) -> u64 {
        self.floods.total()
    }

    /// Connections accepted and open, and one connection's task size.
    pub fn listener_stats(&self) -> ListenerStats {
        self.listeners.stats()
    }

    /// Accepts until `cancel`, then closes connections (their tunnels reset)
    /// and waits for them.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, cancel: CancellationToken) {
        let mut listener = Listener::new(listener, "connect");
        listener
            .serve(&cancel, &self.listeners, |tcp, client| {
                // Closed at once past the cap: no task, no handshake state.
                // Admitted here, in accept order, so that a source's first
                // connections are the ones that keep their places.
                let handshaking = self.pre_auth.admit(client.ip())?;
                if let Err(e) = self.socket.apply(&tcp) {
                    tracing::debug!(%client, error = %e, "CONNECT connection socket options");
                    return None;
                }
                // The handshake's state and its place under the cap are
                // boxed: a future keeps room for its largest state for the
                // whole connection, idle or not. The config is the one
                // current at the accept (it may be reloaded).
                let acceptor = TlsAcceptor::from(self.tls.current());
                let timeout = self.h2.handshake_timeout;
                let handshake = Box::pin(
                    handshaking
                        .run(async move { atunnel_tls::accept(&acceptor, tcp, timeout).await }),
                );
                let (this, cancel) = (self.clone(), cancel.clone());
                Some(async move {
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        r = this.connection(handshake, client) => if let Err(e) = r {
                            tracing::debug!(%client, error = %e, "CONNECT connection ended");
                        }
                    }
                })
            })
            .await
    }

    /// One admitted connection: its TLS handshake, then HTTP/2 or HTTP/1.1
    /// as ALPN chose. The TLS stream (over a kilobyte, copied into each
    /// future it moves through) and h2's connection state are boxed.
    async fn connection(
        self: &Arc<Self>,
        handshake: Pin<Box<impl Future<Output = Option<io::Result<Box<RustlsStream>>>>>>,
        client: SocketAddr,
    ) -> io::Result<()> {
        let Some(tls) = handshake.await else {
            return Ok(());
        };
        let tls = tls?;
        let peer = self.handler.peer(tls.get_ref().1)?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let activity = Arc::new(Activity::default());
        let io = ActivityIo::new(
            ServerTls::Rustls(tls),
            activity.clone(),
            self.hibernation.clone(),
        );
        if h2 {
            Box::pin(self.serve_h2(io, &activity, peer, client)).await
        } else {
            self.serve_h1(io, &activity, peer, client).await
        }
    }

    async fn serve_h2(
        self: &Arc<Self>,
        mut io: ActivityIo,
        activity: &Activity,
        peer: H::Peer,
        client: SocketAddr,
    ) -> io::Result<()> {
        Box::pin(read_h2_preface(&mut io, self.h2.preface_timeout)).await?;
        let io = FloodGuard::new(io, Role::Server, self.floods.clone());
        let mut conn = h2::server::Builder::new()
            .max_concurrent_streams(self.h2.max_concurrent_streams)
            .initial_window_size(self.h2.stream_window)
            .initial_connection_window_size(self.h2.connection_window)
            .max_frame_size(self.h2.max_frame_size)
            .max_header_list_size(TUNNEL_MAX_HEADER_LIST)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
            .max_concurrent_reset_streams(MAX_CONCURRENT_RESET_STREAMS)
            .max_send_buffer_size(TUNNEL_MAX_SEND_BUF)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(io::Error::other)?;
        let streams = TaskTracker::new();
        // Boxed: the timers live on the heap, not in every idle
        // connection's future.
        let mut dead = match (self.h2.ping_interval.is_zero(), conn.ping_pong()) {
            (false, Some(pinger)) => Some(Box::pin(unanswered_ping(
                pinger,
                self.h2.ping_interval,
                self.h2.ping_timeout,
            ))),
            _ => None,
        };
        // Accepting drives the whole connection, open streams included.
        loop {
            let accept = pin!(conn.accept());
            let accept = with_hibernation(accept, activity, &self.hibernation);
            let accepted = match dead.as_mut() {
                Some(dead) => tokio::select! {
                    accepted = accept => accepted,
                    () = dead.as_mut() => {
                        tracing::debug!(%client, "an HTTP/2 ping went unanswered; closing the connection");
                        break;
                    }
                },
                None => accept.await,
            };
            let Some(accepted) = accepted else { break };
            let (request, mut respond) = accepted.map_err(io::Error::other)?;
            let this = self.clone();
            let peer = peer.clone();
            streams.spawn(async move {
                // The request head lives only in this block, not for the
                // tunnel's whole life.
                let (answer, body) = {
                    let (parts, body) = request.into_parts();
                    let authority = parts
                        .uri
                        .authority()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    let req = ConnectRequest {
                        protocol: "h2",
                        method: parts.method.as_str(),
                        authority: &authority,
                        headers: &parts.headers,
                        client,
                    };
                    (Box::pin(this.handler.open(&peer, req)).await, body)
                };
                match answer {
                    Answer::Refuse {
                        status,
                        body,
                        headers,
                        retry_after,
                        ..
                    } => {
                        let _ = respond_h2(&mut respond, status, headers, retry_after, &body);
                    }
                    Answer::Open(target) => {
                        let Ok(send) = respond.send_response(http::Response::new(()), false) else {
                            return;
                        };
                        let mut stream = H2Stream::new(send, body);
                        this.handler.run(target, &mut stream).await;
                    }
                }
            });
        }
        // A dead connection's streams end with it (h2 tells them at drop).
        drop(conn);
        streams.close();
        streams.wait().await;
        Ok(())
    }

    async fn serve_h1(
        &self,
        mut tls: ActivityIo,
        activity: &Activity,
        peer: H::Peer,
        client: SocketAddr,
    ) -> io::Result<()> {
        // The request head and its parsed form live only in this block, not
        // for the tunnel's whole life; boxed, so that neither does room for
        // reading the head and opening the target (a dial and its timers).
        let answer = Box::pin(async {
            let head = tokio::time::timeout(HANDSHAKE_TIMEOUT, http1::read_head(&mut tls))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "CONNECT head timed out"))??;
            let request = match http1::parse_request(&head) {
                Ok(r) => r,
                Err(e) => return Ok(Answer::refuse(400, "Bad Request", e.to_string())),
            };
            let mut headers = http::HeaderMap::new();
            for (name, value) in &request.headers {
                if let (Ok(n), Ok(v)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_str(value),
                ) {
                    headers.append(n, v);
                }
            }
            let req = ConnectRequest {
                protocol: "http/1.1",
                method: &request.method,
                authority: &request.target,
                headers: &headers,
                client,
            };
            io::Result::Ok(self.handler.open(&peer, req).await)
        })
        .await?;
        match answer {
            Answer::Refuse {
                status,
                reason,
                body,
                headers,
                retry_after,
            } => respond_h1(&mut tls, status, reason, headers, retry_after, &body).await,
            Answer::Open(target) => {
                tls.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await?;
                tls.flush().await?;
                let run = pin!(self.handler.run(target, &mut tls));
                with_hibernation(run, activity, &self.hibernation).await;
                Ok(())
            }
        }
    }
}

type ExtraHeaders = &'static [(&'static str, &'static str)];

/// A `Retry-After` value: whole seconds, at least 1.
fn retry_secs(retry_after: std::time::Duration) -> u64 {
    retry_after.as_secs().max(1)
}

fn respond_h2(
    respond: &mut h2::server::SendResponse<Bytes>,
    status: u16,
    headers: ExtraHeaders,
    retry_after: Option<std::time::Duration>,
    body: &str,
) -> Result<(), h2::Error> {
    let mut response = http::Response::builder()
        .status(status)
        .header("content-type", "text/plain");
    for (k, v) in headers {
        response = response.header(*k, *v);
    }
    if let Some(r) = retry_after {
        response = response.header("retry-after", retry_secs(r));
    }
    let response = response.body(()).expect("static response parts are valid");
    let mut send = respond.send_response(response, false)?;
    send.send_data(Bytes::copy_from_slice(body.as_bytes()), true)
}

async fn respond_h1(
    tls: &mut (impl tokio::io::AsyncWrite + Unpin),
    status: u16,
    reason: &str,
    headers: ExtraHeaders,
    retry_after: Option<std::time::Duration>,
    body: &str,
) -> io::Result<()> {
    let mut extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    if let Some(r) = retry_after {
        extra.push_str(&format!("Retry-After: {}\r\n", retry_secs(r)));
    }
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(response.as_bytes()).await?;
    tls.shutdown().await
}
