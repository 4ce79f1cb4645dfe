//! A router's HTTP/2 connection, served with `h2`'s server directly: its
//! streams are futures inside the connection's own task, each polled only
//! when its own waker fired, and answered through the same poll of the
//! connection that flushes them.
//!
//! Not through hyper's HTTP/2 server, which spawns a task per stream and
//! wraps each in its service and body layers: those layers and the spawn
//! were ~12,000 user instructions of an ingress request, a fifth of it
//! (`atunnel-bench run --quick --scenarios cost`, ingress-https; see
//! `docs/design.md`). What hyper did around h2 that ingress relies on is
//! here: a stream the router resets drops its request, a response body is
//! sent no faster than the router's window takes it, a body that fails
//! resets its stream, pings bound a silent router, and a cancelled
//! connection is shut down gracefully.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use futures_util::task::AtomicWaker;
use h2::server::SendResponse;
use h2::{Ping, PingPong, Reason, RecvStream, SendStream};
use http::{Request, Response, header};
use hyper::body::Body;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::https::{self, ProxyBody, RouterBody};
use super::routes::Routes;
use atunnel_connect::flood::{FloodGuard, Role};
use atunnel_connect::limits::{
    MAX_LOCAL_ERROR_RESET_STREAMS, MAX_PENDING_ACCEPT_RESET_STREAMS, PROXY_MAX_HEADER_LIST,
    PROXY_MAX_SEND_BUF, PROXY_ROUTER_CONNECTION_WINDOW, PROXY_ROUTER_MAX_CONCURRENT_STREAMS,
    PROXY_STREAM_WINDOW,
};
use atunnel_tls::{Activity, ActivityIo};

/// Serves the router's HTTP/2 connection (its preface already read) until
/// it ends, or `cancel` (then gracefully: a GOAWAY, and the streams in
/// flight finish).
pub(crate) fn serve(
    io: ActivityIo,
    activity: &Activity,
    routes: Arc<Routes>,
    client: SocketAddr,
    cancel: CancellationToken,
) -> impl Future<Output = ()> + Send + '_ {
    let io = FloodGuard::new(io, Role::Server, routes.router_h2_floods().clone());
    // Boxed, and made before the connection's future: an async fn keeps
    // its arguments for its whole life, and the handshake's 1.3 KB (with
    // the TLS stream) would stay beside the connection in its future, idle
    // too (ingress-idle's hibernated HTTP/2 connection: 39.8 KB of heap with
    // both inside, 38.7 KB without).
    let handshake = Box::pin(
        h2::server::Builder::new()
            // The connection's window covers every stream's, so one actor's
            // unread bodies never hold another actor's streams back.
            .max_concurrent_streams(PROXY_ROUTER_MAX_CONCURRENT_STREAMS)
            .initial_window_size(PROXY_STREAM_WINDOW)
            .initial_connection_window_size(PROXY_ROUTER_CONNECTION_WINDOW)
            .max_header_list_size(PROXY_MAX_HEADER_LIST)
            .max_send_buffer_size(PROXY_MAX_SEND_BUF)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
            .handshake::<_, Bytes>(io),
    );
    drive(handshake, activity, routes, client, cancel)
}

type Handshake = Pin<Box<h2::server::Handshake<FloodGuard<ActivityIo>, Bytes>>>;

async fn drive(
    handshake: Handshake,
    activity: &Activity,
    routes: Arc<Routes>,
    client: SocketAddr,
    cancel: CancellationToken,
) {
    let ping = routes.router_ping();
    let mut conn = tokio::select! {
        c = handshake => match c {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "atunnel router HTTP/2 handshake failed");
                return;
            }
        },
        _ = cancel.cancelled() => return,
    };
    let mut keep_alive = conn
        .ping_pong()
        .filter(|_| !ping.interval.is_zero())
        .map(|pong| KeepAlive::new(pong, ping.interval, ping.timeout));
    // `None` while a hibernating connection has no stream: the set keeps
    // two allocations of its own even when empty.
    let mut streams = None;
    let wakes = Arc::new(Wakes {
        woken: AtomicU8::new(CONN | RARE),
        polling: AtomicBool::new(false),
        task: AtomicWaker::new(),
    });
    let conn_waker = futures_util::task::waker(wakes.clone());
    let rare_waker = futures_util::task::waker(Arc::new(RareWaker(wakes.clone())));
    let mut cancelled = std::pin::pin!(cancel.cancelled());
    let mut closing = false;
    poll_fn(|cx| {
        wakes.task.register(cx.waker());
        wakes.polling.store(true, Ordering::SeqCst);
        loop {
            // Each part only when its own waker fired: a stream's wake-up
            // does not make the connection read and flush for nothing, nor
            // the timers look at the clock.
            let woken = wakes.woken.swap(0, Ordering::SeqCst);
            // Read before the connection's read takes it.
            let asked_to_sleep = activity.sleep_requested();
            if woken & RARE != 0
                && !closing
                && cancelled
                    .as_mut()
                    .poll(&mut Context::from_waker(&rare_waker))
                    .is_ready()
            {
                closing = true;
                conn.graceful_shutdown();
            }
            if woken & CONN != 0 || closing || asked_to_sleep {
                let mut conn_cx = Context::from_waker(&conn_waker);
                loop {
                    match conn.poll_accept(&mut conn_cx) {
                        Poll::Ready(Some(Ok((req, respond)))) => {
                            // Boxed: `FuturesUnordered` keeps a stub the size of
                            // its future for as long as it lives.
                            let set = streams.get_or_insert_with(FuturesUnordered::new);
                            set.push(Box::pin(serve_stream(routes.clone(), client, req, respond)));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            tracing::debug!(error = %e, "atunnel router HTTP/2 connection ended");
                            return Poll::Ready(());
                        }
                        Poll::Ready(None) => return Poll::Ready(()),
                        Poll::Pending => break,
                    }
                }
            }
            if let Some(set) = &mut streams {
                while let Poll::Ready(Some(())) = set.poll_next_unpin(cx) {}
                if asked_to_sleep && set.is_empty() {
                    streams = None;
                }
            }
            if woken & RARE != 0
                && let Some(k) = &mut keep_alive
                && k.poll_silent(&mut Context::from_waker(&rare_waker))
                    .is_ready()
            {
                tracing::debug!("atunnel router stopped answering pings: closing");
                return Poll::Ready(());
            }
            // Streams that queued frames woke the connection: it flushes
            // them in this same poll. A wake after `polling` is cleared
            // wakes the task instead.
            if wakes.woken.load(Ordering::SeqCst) == 0 {
                wakes.polling.store(false, Ordering::SeqCst);
                if wakes.woken.load(Ordering::SeqCst) == 0 {
                    return Poll::Pending;
                }
                wakes.polling.store(true, Ordering::SeqCst);
            }
        }
    })
    .await
}

/// Which parts of the connection's task were woken: the connection
/// itself, or its rare parts (its pings and its cancellation, which share
/// a waker: one allocation less per connection, for a timer that fires
/// once an interval).
const CONN: u8 = 1;
const RARE: u8 = 2;

/// What the connection's parts were woken for. As a waker, the
/// connection's own; [`RareWaker`] is the other's.
struct Wakes {
    woken: AtomicU8,
    polling: AtomicBool,
    task: AtomicWaker,
}

impl Wakes {
    /// Marks `part` for polling and wakes the task, unless the task is
    /// polling and will see the mark.
    fn mark(&self, part: u8) {
        self.woken.fetch_or(part, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl futures_util::task::ArcWake for Wakes {
    fn wake_by_ref(this: &Arc<Self>) {
        this.mark(CONN);
    }
}

struct RareWaker(Arc<Wakes>);

impl futures_util::task::ArcWake for RareWaker {
    fn wake_by_ref(this: &Arc<Self>) {
        this.0.mark(RARE);
    }
}

/// One stream: the request proxied to its actor, the answer sent back.
/// Dropped (with the request to the actor) the moment the router resets
/// the stream.
async fn serve_stream(
    routes: Arc<Routes>,
    client: SocketAddr,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let (parts, recv) = req.into_parts();
    let body = RouterBody::h2(recv, &parts.headers);
    let proxy = https::proxy(routes, client, Request::from_parts(parts, body), true);
    let mut proxy = std::pin::pin!(proxy);
    let answer = poll_fn(|cx| {
        if let Poll::Ready(Ok(answer)) = proxy.as_mut().poll(cx) {
            return Poll::Ready(Some(answer));
        }
        match respond.poll_reset(cx) {
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    let Some(answer) = answer else {
        return;
    };
    let (mut parts, body) = answer.into_parts();
    // As hyper's server did: a body of known length says so.
    if let Some(n) = body.size_hint().exact()
        && !parts.headers.contains_key(header::CONTENT_LENGTH)
        && (n > 0 || !body.is_end_stream())
    {
        parts.headers.insert(header::CONTENT_LENGTH, n.into());
    }
    let end = body.is_end_stream();
    let Ok(send) = respond.send_response(Response::from_parts(parts, ()), end) else {
        return;
    };
    if !end {
        send_body(body, send).await;
    }
}

/// Sends `body` on `send`, a frame at a time and only while the router's
/// window has room: what waits on a router that stops reading is one frame
/// here and h2's send buffer, not the whole body.
async fn send_body(mut body: ProxyBody, mut send: SendStream<Bytes>) {
    poll_fn(|cx| {
        loop {
            send.reserve_capacity(1);
            if send.capacity() == 0 {
                match ready!(send.poll_capacity(cx)) {
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => return Poll::Ready(()),
                }
            }
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(());
            }
            let frame = match ready!(Pin::new(&mut body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "atunnel response body ended early");
                    send.send_reset(Reason::INTERNAL_ERROR);
                    return Poll::Ready(());
                }
                None => {
                    let _ = send.send_data(Bytes::new(), true);
                    return Poll::Ready(());
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => {
                    let end = body.is_end_stream();
                    if send.send_data(data, end).is_err() || end {
                        return Poll::Ready(());
                    }
                    continue;
                }
                Err(frame) => frame,
            };
            if let Ok(trailers) = frame.into_trailers() {
                let _ = send.send_trailers(trailers);
                return Poll::Ready(());
            }
        }
    })
    .await
}

/// Pings the router every interval and reports it silent when a ping goes
/// unanswered for the timeout: a router that vanished without a FIN would
/// otherwise hold its connection, and every stream on it, for ever.
struct KeepAlive {
    pong: PingPong,
    interval: Duration,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    waiting: bool,
}

impl KeepAlive {
    fn new(pong: PingPong, interval: Duration, timeout: Duration) -> Self {
        Self {
            pong,
            interval,
            timeout,
            timer: Box::pin(tokio::time::sleep(interval)),
            waiting: false,
        }
    }

    /// Ready when the router has not answered a ping in time (or the
    /// connection can no longer send one).
    fn poll_silent(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.waiting {
                match self.pong.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.waiting = false;
                        self.timer.as_mut().reset(Instant::now() + self.interval);
                        continue;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => {}
                }
                ready!(self.timer.as_mut().poll(cx));
                return Poll::Ready(());
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.pong.send_ping(Ping::opaque()).is_err() {
                return Poll::Ready(());
            }
            self.waiting = true;
            self.timer.as_mut().reset(Instant::now() + self.timeout);
        }
    }
}
