//! One activation's HTTP/1.1 connections to its actor, kept by port: a
//! request takes the most recently used idle one (or dials), and its
//! connection goes back the moment its response body ends.
//!
//! Written here rather than with hyper-util's legacy client (still used for
//! h2c) because that client, for each request, hashes the URI's scheme and
//! authority (SipHash) to find its pool, moves a future of over a kilobyte
//! through several layers, and spawns a task that waits for the connection
//! to be ready before it returns it to the pool (two of the four task
//! spawns per ingress request); together ~12,000 user instructions per
//! request (`atunnel-bench run --quick --scenarios cost`, ingress-https,
//! see `docs/design.md`). The connections themselves are hyper's
//! (`hyper::client::conn::http1`).

use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::{Builder, SendRequest};
use tokio::time::Instant;

use super::actor_io::ActorIo;
use atunnel_connect::limits::PROXY_H1_MAX_BUFFER;

/// Body type sent to actors.
pub(crate) type UpstreamBody =
    http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, hyper::Error>;

/// How the pool reaches its actor: a new connection to `port` (the
/// activation's bounded dial, `routes::ActivationConnector`).
pub(crate) trait Dial: Send + Sync + 'static {
    fn dial(
        &self,
        port: u16,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<ActorIo>> + Send>>;
}

/// The idle connections of one port, most recently used last.
struct PortIdle {
    port: u16,
    conns: Vec<IdleConn>,
}

struct IdleConn {
    send: SendRequest<UpstreamBody>,
    since: Instant,
}

#[derive(Default)]
struct Idle {
    ports: Vec<PortIdle>,
    /// Whether a task is evicting connections idle past the timeout (one
    /// per pool, only while it holds idle connections).
    reaping: bool,
}

pub(crate) struct Http1Pool {
    connector: Box<dyn Dial>,
    /// Idle connections kept per port.
    max_idle: usize,
    idle_timeout: Duration,
    idle: Mutex<Idle>,
}

impl Http1Pool {
    pub(crate) fn new(connector: Box<dyn Dial>, max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            connector,
            max_idle,
            idle_timeout,
            idle: Mutex::default(),
        }
    }

    /// Sends `req` to the actor's `port` on an idle connection, or on a new
    /// one. A request that an idle connection gave back unsent (the actor
    /// had closed it) goes on the next one.
    pub(crate) async fn request(
        self: &Arc<Self>,
        port: u16,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<ActorBody>, crate::BoxError> {
        let mut busy = Vec::new();
        while let Some(mut send) = self.checkout(port) {
            // Put back as its last response ended, a connection has taken
            // up its next request by now, unless it is still sending the
            // last request's body (an actor may answer before reading
            // it): that one is passed over, not waited for, and stays in
            // the pool. One the actor closed fails here.
            match std::future::poll_fn(|cx| Poll::Ready(send.poll_ready(cx))).await {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => continue,
                Poll::Pending => {
                    busy.push(send);
                    continue;
                }
            }
            self.keep_oldest(port, std::mem::take(&mut busy));
            match send.try_send_request(req).await {
                Ok(resp) => return Ok(self.body_of(resp, port, send)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(e.into_error().into()),
                },
            }
        }
        self.keep_oldest(port, busy);
        let io = self.connector.dial(port).await?;
        let (mut send, conn) = Builder::new()
            .max_buf_size(PROXY_H1_MAX_BUFFER)
            .handshake(io)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "atunnel actor HTTP/1.1 connection ended");
            }
        });
        let resp = send.send_request(req).await?;
        Ok(self.body_of(resp, port, send))
    }

    /// The response with a body that puts `send` back when it ends.
    fn body_of(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        port: u16,
        send: SendRequest<UpstreamBody>,
    ) -> Response<ActorBody> {
        let mut back = Some(PutBack {
            pool: Arc::downgrade(self),
            port,
            send,
        });
        let (parts, inner) = resp.into_parts();
        if inner.is_end_stream()
            && let Some(b) = back.take()
        {
            b.put_back();
        }
        Response::from_parts(parts, ActorBody { inner, back })
    }

    /// The most recently used idle connection to `port` that is still open.
    fn checkout(&self, port: u16) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().expect("HTTP/1.1 pool lock poisoned");
        let p = idle.ports.iter_mut().find(|p| p.port == port)?;
        while let Some(c) = p.conns.pop() {
            if !c.send.is_closed() {
                return Some(c.send);
            }
        }
        None
    }

    /// Puts connections passed over as busy back, as the oldest idle.
    fn keep_oldest(&self, port: u16, busy: Vec<SendRequest<UpstreamBody>>) {
        if busy.is_empty() {
            return;
        }
        let mut idle = self.idle.lock().expect("HTTP/1.1 pool lock poisoned");
        let Some(p) = idle.ports.iter_mut().find(|p| p.port == port) else {
            return;
        };
        let since = Instant::now();
        p.conns
            .splice(0..0, busy.into_iter().map(|send| IdleConn { send, since }));
    }

    fn put_back(self: Arc<Self>, port: u16, send: SendRequest<UpstreamBody>) {
        if send.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("HTTP/1.1 pool lock poisoned");
        let i = match idle.ports.iter().position(|p| p.port == port) {
            Some(i) => i,
            None => {
                idle.ports.push(PortIdle {
                    port,
                    conns: Vec::new(),
                });
                idle.ports.len() - 1
            }
        };
        let conns = &mut idle.ports[i].conns;
        // Past the bound the connection is dropped, and hyper closes it.
        if conns.len() >= self.max_idle {
            return;
        }
        conns.push(IdleConn {
            send,
            since: Instant::now(),
        });
        if !idle.reaping {
            idle.reaping = true;
            tokio::spawn(reap(Arc::downgrade(&self)));
        }
    }
}

/// Closes connections idle past the pool's timeout, oldest first, until the
/// pool holds none (or is gone with its activation).
async fn reap(pool: Weak<Http1Pool>) {
    loop {
        let wait = {
            let Some(pool) = pool.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut idle = pool.idle.lock().expect("HTTP/1.1 pool lock poisoned");
            let mut oldest: Option<Instant> = None;
            for p in &mut idle.ports {
                p.conns
                    .retain(|c| !c.send.is_closed() && now - c.since < pool.idle_timeout);
                for c in &p.conns {
                    oldest = Some(oldest.map_or(c.since, |o| o.min(c.since)));
                }
            }
            match oldest {
                Some(o) => o + pool.idle_timeout - now,
                None => {
                    idle.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Where a connection goes back once its response body ended.
struct PutBack {
    pool: Weak<Http1Pool>,
    port: u16,
    send: SendRequest<UpstreamBody>,
}

impl PutBack {
    fn put_back(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put_back(self.port, self.send);
        }
    }
}

/// A response body from the actor; over HTTP/1.1 it puts its connection
/// back in the pool when it ends (dropped before, the connection closes:
/// hyper cannot reuse it).
pub(crate) struct ActorBody {
    inner: Incoming,
    back: Option<PutBack>,
}

impl ActorBody {
    /// A body whose connection is not pooled here (h2c).
    pub(crate) fn plain(inner: Incoming) -> Self {
        Self { inner, back: None }
    }
}

impl Body for ActorBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = ready!(std::pin::Pin::new(&mut self.inner).poll_frame(cx));
        let ended = match &frame {
            None => true,
            Some(Ok(_)) => self.inner.is_end_stream(),
            // A body that failed leaves its connection unusable.
            Some(Err(_)) => {
                self.back = None;
                false
            }
        };
        if ended && let Some(b) = self.back.take() {
            b.put_back();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
