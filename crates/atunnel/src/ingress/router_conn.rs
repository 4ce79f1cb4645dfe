//! One accepted router connection on the HTTPS listener, after TLS: HTTP/2
//! when ALPN chose it, HTTP/1.1 otherwise.
//!
//! Over HTTP/1.1, hyper runs its header read timer whenever it waits for a
//! head, the keep-alive wait between requests included, so on its own it
//! would close every idle connection after the timeout (10 s), before it
//! could hibernate (15 s). An idle connection therefore waits with hyper
//! stopped, and a fresh hyper starts on the next request's first byte: the
//! timeout bounds sending a head, never the wait for one.
//!
//! Over HTTP/2, the same timeout bounds the client's preface after TLS,
//! never the wait for a request.
//!
//! An HTTP/1.1 keep-alive connection hibernates: once it has been idle for
//! `hibernate_after`, hyper is stopped between requests (it is idle then, so
//! nothing is sent and the peer sees no change), which frees its read and
//! write buffers and parsed state, and the TLS stream drops its rustls
//! session for its traffic keys; only that is kept, waiting for
//! readability, and the next byte starts a fresh hyper connection on it.
//!
//! An HTTP/2 connection hibernates its TLS stream the same way, but h2 keeps
//! its codec buffers and HPACK tables for the connection's life and cannot
//! hand them back without a GOAWAY, which the router would see. Routers
//! multiplex many requests over few HTTP/2 connections, so there are few of
//! them to idle.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_core::endpoint::ReadReady;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::https::{self, ProxyBody};
use super::routes::Routes;
use atunnel_connect::limits::PROXY_H1_MAX_BUFFER;
use atunnel_connect::preface::read_h2_preface;
use atunnel_tls::hibernate::InFlight;
use atunnel_tls::{Activity, ActivityIo, Hibernation, RustlsStream, ServerTls, with_hibernation};

/// Serves `tls` until the router closes it or `cancel` (then gracefully).
pub async fn serve(
    tls: Box<RustlsStream>,
    routes: Arc<Routes>,
    client: SocketAddr,
    hibernation: Arc<Hibernation>,
    header_read_timeout: Duration,
    cancel: CancellationToken,
) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let activity = Arc::new(Activity::default());
    let mut io = ActivityIo::new(
        ServerTls::Rustls(tls),
        activity.clone(),
        hibernation.clone(),
    );
    // Boxed: hyper's connection state is large, and a future holds room
    // for its largest state for as long as the connection lives; on the heap
    // it exists only while in use (and not while hibernated).
    if h2 {
        // The preface is bounded like an HTTP/1.1 head; hyper would wait
        // for it for ever.
        let preface = Box::pin(read_h2_preface(&mut io, header_read_timeout));
        let started = tokio::select! {
            r = preface => r.is_ok(),
            _ = cancel.cancelled() => false,
        };
        if !started {
            let _ = io.shutdown().await;
            return;
        }
        let mut conn = Box::pin(super::router_h2::serve(
            io, &activity, routes, client, cancel,
        ));
        with_hibernation(conn.as_mut(), &activity, &hibernation).await
    } else {
        serve_h1(
            io,
            activity,
            routes,
            client,
            header_read_timeout,
            &hibernation,
            cancel,
        )
        .await
    }
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<Response<Tracked>, std::convert::Infallible>> + Send>>;

enum Stopped {
    /// hyper finished: the router closed, sent `Connection: close`, or erred.
    Ended,
    Cancelled,
    Idle,
    /// hyper's header read timer fired. It starts when hyper begins waiting
    /// for a head: on a fresh hyper, at the head's first byte (see
    /// `wait_for_request`); after a response, when the keep-alive wait
    /// begins.
    HeadTimeout,
}

async fn serve_h1(
    mut io: ActivityIo,
    activity: Arc<Activity>,
    routes: Arc<Routes>,
    client: SocketAddr,
    header_read_timeout: Duration,
    hibernation: &Arc<Hibernation>,
    cancel: CancellationToken,
) {
    let mut service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| -> ServiceFuture {
            let in_flight = activity.request();
            let routes = routes.clone();
            Box::pin(async move {
                let req = req.map(https::RouterBody::H1);
                let response = https::proxy(routes, client, req, false).await?;
                Ok(response.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                }))
            })
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(PROXY_H1_MAX_BUFFER);
    loop {
        if !wait_for_request(&mut io, &activity, hibernation, &cancel).await {
            return;
        }
        let requests = activity.requests();
        // Boxed so that hibernating frees hyper's state itself, not only
        // the buffers it points to.
        let mut conn = Box::new(builder.serve_connection(TokioIo::new(io), service));
        let stopped = tokio::select! {
            r = poll_fn(|cx| conn.poll_without_shutdown(cx)) => match r {
                Err(e) if e.is_timeout() => Stopped::HeadTimeout,
                _ => Stopped::Ended,
            },
            _ = cancel.cancelled() => Stopped::Cancelled,
            _ = hibernation.idle(&activity) => Stopped::Idle,
        };
        if matches!(stopped, Stopped::Cancelled | Stopped::Idle) {
            // Idle, or finishing the request in flight before closing.
            Pin::new(&mut *conn).graceful_shutdown();
            if poll_fn(|cx| conn.poll_without_shutdown(cx)).await.is_err() {
                return;
            }
        }
        let parts = (*conn).into_parts();
        io = parts.io.into_inner();
        service = parts.service;
        // Even empty, this `Bytes` shares hyper's whole read buffer: it must
        // not outlive this point unless it has bytes to replay.
        let read_buf = parts.read_buf;
        let ends = match stopped {
            Stopped::Ended | Stopped::Cancelled => true,
            // A head not sent within a timeout of its first byte: this
            // hyper started at that byte and served nothing.
            Stopped::HeadTimeout => !read_buf.is_empty() && activity.requests() == requests,
            Stopped::Idle => false,
        };
        if ends {
            let _ = io.shutdown().await;
            return;
        }
        if !read_buf.is_empty() {
            // Bytes of a next request were already read: serve them now.
            // After a timeout, they are a head begun during the keep-alive
            // wait, which the timer partly covered: it gets a whole timeout
            // from now, so between one and two from its first byte.
            io.set_replay(read_buf);
            continue;
        }
        drop(read_buf);
        // Idle, or nothing of a next request came during the keep-alive
        // wait: the connection waits with hyper stopped, so that no timer
        // runs until a head begins.
        if matches!(stopped, Stopped::Idle) {
            // The TLS session too, when nothing of the connection is inside it.
            io.sleep();
        }
    }
}

/// Waits, with hyper stopped, for the first byte of the next request (at
/// once if there are bytes to replay), hibernating the connection once it
/// has been idle for a period unless it is asleep already. False when the
/// connection ended instead: closed, failed or cancelled.
async fn wait_for_request(
    io: &mut ActivityIo,
    activity: &Activity,
    hibernation: &Hibernation,
    cancel: &CancellationToken,
) -> bool {
    loop {
        tokio::select! {
            r = poll_fn(|cx| io.poll_read_ready(cx)) => return r.is_ok(),
            _ = cancel.cancelled() => {
                let _ = io.shutdown().await;
                return false;
            }
            _ = hibernation.idle(activity), if !io.is_asleep() => io.sleep(),
        }
    }
}

/// A response body that keeps its request counted as in flight until hyper
/// has taken all of it (or dropped it).
pub struct Tracked {
    body: ProxyBody,
    _in_flight: InFlight,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
