//! One accepted router connection on the HTTPS listener, after TLS: HTTP/2
//! when ALPN chose it, HTTP/1.1 otherwise.
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

use atunnel_core::endpoint::ReadReady;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::https::{self, ProxyBody};
use super::routes::Routes;
use crate::hibernate::{Activity, ActivityIo, Hibernation, InFlight, with_hibernation};
use crate::server_tls::{RustlsStream, ServerTls};

/// Serves `tls` until the router closes it or `cancel` (then gracefully).
pub async fn serve(
    tls: Box<RustlsStream>,
    routes: Arc<Routes>,
    client: SocketAddr,
    hibernation: Arc<Hibernation>,
    cancel: CancellationToken,
) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let activity = Arc::new(Activity::default());
    let io = ActivityIo::new(
        ServerTls::Rustls(tls),
        activity.clone(),
        hibernation.clone(),
    );
    // Boxed: hyper's connection state is large, and a future holds room
    // for its largest state for as long as the connection lives; on the heap
    // it exists only while in use (and not while hibernated).
    if h2 {
        let mut conn = Box::pin(serve_h2(io, routes, client, cancel));
        with_hibernation(conn.as_mut(), &activity, &hibernation).await
    } else {
        serve_h1(io, activity, routes, client, &hibernation, cancel).await
    }
}

async fn serve_h2(io: Io, routes: Arc<Routes>, client: SocketAddr, cancel: CancellationToken) {
    let service = hyper::service::service_fn(move |req| https::proxy(routes.clone(), client, req));
    let conn = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(256 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

type Io = ActivityIo;
type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<Response<Tracked>, std::convert::Infallible>> + Send>>;

enum Stopped {
    /// hyper finished: the router closed, sent `Connection: close`, or erred.
    Ended,
    Cancelled,
    Idle,
}

async fn serve_h1(
    mut io: Io,
    activity: Arc<Activity>,
    routes: Arc<Routes>,
    client: SocketAddr,
    hibernation: &Arc<Hibernation>,
    cancel: CancellationToken,
) {
    let mut service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| -> ServiceFuture {
            let in_flight = activity.request();
            let routes = routes.clone();
            Box::pin(async move {
                let response = https::proxy(routes, client, req).await?;
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
        .header_read_timeout(https::HEADER_READ_TIMEOUT)
        .max_buf_size(https::MAX_H1_BUFFER);
    loop {
        // Boxed so that hibernating frees hyper's state itself, not only
        // the buffers it points to.
        let mut conn = Box::new(builder.serve_connection(TokioIo::new(io), service));
        let stopped = tokio::select! {
            _ = poll_fn(|cx| conn.poll_without_shutdown(cx)) => Stopped::Ended,
            _ = cancel.cancelled() => Stopped::Cancelled,
            _ = hibernation.idle(&activity) => Stopped::Idle,
        };
        if !matches!(stopped, Stopped::Ended) {
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
        if !matches!(stopped, Stopped::Idle) {
            let _ = io.shutdown().await;
            return;
        }
        if !read_buf.is_empty() {
            // Bytes of a next request were already read: serve them now.
            io.set_replay(read_buf);
            continue;
        }
        drop(read_buf);
        // The TLS session too, when nothing of the connection is inside it.
        io.sleep();
        tokio::select! {
            r = poll_fn(|cx| io.poll_read_ready(cx)) => if r.is_err() { return },
            _ = cancel.cancelled() => {
                let _ = io.shutdown().await;
                return;
            }
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
