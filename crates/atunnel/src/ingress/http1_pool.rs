//! One activation's HTTP/1.1 connections to its actor, kept by port, and
//! each request's exchange on one of them, in the request's own task: a
//! request takes the most recently used idle connection (or dials), writes
//! its head with as much of its body as is ready in one write, and reads
//! the response head into a buffer it is parsed in (`http1_wire`); the
//! response body is read from the connection as the router's side polls
//! it, and the connection goes back the moment that body ends.
//!
//! Written here rather than with hyper's clients: hyper-util's legacy
//! client (still used for h2c) hashed its pool key and spawned a task per
//! request to return the connection, and hyper's `client::conn::http1`
//! runs each connection as a task of its own that the request reaches over
//! a channel; together ~24,000 user instructions of an ingress request
//! (`atunnel-bench run --quick --scenarios cost`, ingress-https, see
//! `docs/design.md`). An idle connection here is its socket and nothing
//! else: no task, no buffers.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::Response;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Instant;

use super::actor_io::ActorIo;
use super::http1_wire::{self, Decoded, Framing, ResponseHead};
use atunnel_connect::limits::PROXY_H1_MAX_BUFFER;

/// Body type sent to actors.
pub(crate) type UpstreamBody =
    http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, crate::BoxError>;

/// How the pool reaches its actor: a new connection to `port` (the
/// activation's bounded dial, `routes::ActivationConnector`).
pub(crate) trait Dial: Send + Sync + 'static {
    fn dial(
        &self,
        port: u16,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<ActorIo>> + Send>>;
}

/// Room kept free in a read buffer before each read: a response head or a
/// small answer in one read, a download in reads of this size or more.
const READ_ROOM: usize = 16 * 1024;

/// The idle connections of one port, most recently used last.
struct PortIdle {
    port: u16,
    conns: Vec<IdleConn>,
}

struct IdleConn {
    io: ActorIo,
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

    /// Sends a request (its head written by the proxy with the body's
    /// framing, `http1_wire::encode_request_head`) to the actor's `port` on
    /// an idle connection, or on a new one, and returns the response once
    /// its head is here. A request with
    /// no body that an idle connection failed before any answer (the actor
    /// had closed it) goes on the next one.
    pub(crate) async fn request(
        self: &Arc<Self>,
        port: u16,
        head: Vec<u8>,
        head_request: bool,
        body: Option<UpstreamBody>,
    ) -> Result<Response<ActorBody>, crate::BoxError> {
        let length = body.as_ref().map(|b| b.size_hint().exact());
        let mut upload = Upload::new(head, body, length.flatten());
        loop {
            let (io, reused) = match self.checkout(port) {
                Some(io) => (io, true),
                None => (self.connector.dial(port).await?, false),
            };
            let mut ex = Exchange {
                io: Some(io),
                rbuf: BytesMut::new(),
                eof: false,
                answered: false,
                upload,
            };
            match poll_fn(|cx| ex.poll_head(cx, head_request)).await {
                Ok(head) => return Ok(self.response(port, head, ex)),
                Err(e) => {
                    if reused && !ex.answered && ex.upload.rewind() {
                        upload = std::mem::take(&mut ex.upload);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    fn response(
        self: &Arc<Self>,
        port: u16,
        head: ResponseHead,
        ex: Exchange,
    ) -> Response<ActorBody> {
        let mut body = H1Body {
            ex: Some(ex),
            framing: head.framing,
            reusable: head.reusable,
            pool: Arc::downgrade(self),
            port,
        };
        if body.framing.is_end() {
            body.finish();
        }
        let mut r = Response::new(ActorBody(Inner::H1(body)));
        *r.status_mut() = head.status;
        *r.headers_mut() = head.headers;
        r
    }

    /// The most recently used idle connection to `port` that is still open.
    fn checkout(&self, port: u16) -> Option<ActorIo> {
        let mut idle = self.idle.lock().expect("HTTP/1.1 pool lock poisoned");
        let p = idle.ports.iter_mut().find(|p| p.port == port)?;
        while let Some(mut c) = p.conns.pop() {
            if c.io.idle_and_open() {
                return Some(c.io);
            }
        }
        None
    }

    fn put_back(self: Arc<Self>, port: u16, io: ActorIo) {
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
        // Past the bound the connection is dropped, which closes it.
        if conns.len() >= self.max_idle {
            return;
        }
        conns.push(IdleConn {
            io,
            since: Instant::now(),
        });
        if !idle.reaping {
            idle.reaping = true;
            tokio::spawn(reap(Arc::downgrade(&self)));
        }
    }
}

/// Closes connections idle past the pool's timeout, or closed by the
/// actor, until the pool holds none (or is gone with its activation).
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
                    .retain_mut(|c| now - c.since < pool.idle_timeout && c.io.idle_and_open());
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

/// Why sending the request stopped.
enum SendError {
    /// The router's request body failed (its stream was reset): the
    /// exchange ends.
    Router(crate::BoxError),
    /// Writing to the actor failed; it may still have answered.
    Actor(io::Error),
}

/// The request on its way out: its head, then its body's frames one at a
/// time (a chunk line, the data and its CRLF when chunked), each write
/// gathering what is ready.
#[derive(Default)]
struct Upload {
    head: Vec<u8>,
    head_sent: usize,
    body: Option<UpstreamBody>,
    /// The body is sent chunked (its length is not known).
    chunked: bool,
    /// Bytes of a known length still to come.
    left: u64,
    /// Written after what is left of the head, in order.
    queued: [Bytes; 3],
    /// A frame was taken from the body: the request cannot be sent again.
    body_touched: bool,
    /// Writing failed: nothing more is sent.
    failed: bool,
}

impl Upload {
    fn new(head: Vec<u8>, body: Option<UpstreamBody>, length: Option<u64>) -> Self {
        Self {
            head,
            head_sent: 0,
            chunked: body.is_some() && length.is_none(),
            left: length.unwrap_or(0),
            body,
            queued: Default::default(),
            body_touched: false,
            failed: false,
        }
    }

    /// Whether it can be sent again from the start, and if so, readies it.
    fn rewind(&mut self) -> bool {
        if self.body_touched {
            return false;
        }
        self.head_sent = 0;
        self.failed = false;
        true
    }

    fn sending(&self) -> bool {
        !self.failed
            && (self.head_sent < self.head.len()
                || self.body.is_some()
                || self.queued.iter().any(|b| !b.is_empty()))
    }

    fn queue(&mut self, frame: Frame<Bytes>) -> Result<(), SendError> {
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if self.chunked => {
                self.queued = [
                    http1_wire::chunk_line(data.len()),
                    data,
                    Bytes::from_static(b"\r\n"),
                ];
            }
            Ok(data) => {
                self.left = self.left.checked_sub(data.len() as u64).ok_or_else(|| {
                    SendError::Router("request body longer than its length".into())
                })?;
                self.queued[0] = data;
            }
            // Trailers end the body; HTTP/1.1 carries them only chunked.
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    self.end(Some(&trailers))?;
                }
            }
        }
        Ok(())
    }

    fn end(&mut self, trailers: Option<&http::HeaderMap>) -> Result<(), SendError> {
        self.body = None;
        if self.chunked {
            self.queued[0] = http1_wire::last_chunk(trailers);
        } else if self.left != 0 {
            return Err(SendError::Router(
                "request body shorter than its length".into(),
            ));
        }
        Ok(())
    }

    /// Ready once the whole request is written; pending while the router's
    /// body or the actor's socket is.
    fn poll_send(&mut self, io: &mut ActorIo, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        loop {
            let queued = self.queued.iter().any(|b| !b.is_empty());
            if !queued && let Some(body) = &mut self.body {
                match Pin::new(body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        self.body_touched = true;
                        self.queue(frame)?;
                    }
                    Poll::Ready(None) => {
                        self.body_touched = true;
                        self.end(None)?;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(SendError::Router(e)));
                    }
                    // The head goes now, without waiting for the body.
                    Poll::Pending if self.head_sent < self.head.len() => {}
                    Poll::Pending => return Poll::Pending,
                }
            }
            let mut slices = [IoSlice::new(&[]); 4];
            let mut n = 0;
            if self.head_sent < self.head.len() {
                slices[0] = IoSlice::new(&self.head[self.head_sent..]);
                n = 1;
            }
            for b in self.queued.iter().filter(|b| !b.is_empty()) {
                slices[n] = IoSlice::new(b);
                n += 1;
            }
            if n == 0 {
                if self.body.is_none() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let wrote = match io.poll_write_gathered(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            };
            let mut wrote = wrote.map_err(|e| {
                self.failed = true;
                SendError::Actor(e)
            })?;
            let head = wrote.min(self.head.len() - self.head_sent);
            self.head_sent += head;
            wrote -= head;
            for b in &mut self.queued {
                let k = wrote.min(b.len());
                b.advance(k);
                wrote -= k;
            }
        }
    }
}

/// One request's exchange on one connection, until its response ends.
struct Exchange {
    /// `None` once handed back to the pool.
    io: Option<ActorIo>,
    rbuf: BytesMut,
    /// The actor closed its side.
    eof: bool,
    /// Anything of a response arrived.
    answered: bool,
    upload: Upload,
}

impl Exchange {
    /// Sends what it can of the request while it waits for the response
    /// head: an actor may answer before it has read the whole body.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        head_request: bool,
    ) -> Poll<Result<ResponseHead, crate::BoxError>> {
        let mut failed = None;
        loop {
            if self.upload.sending() {
                let Some(io) = &mut self.io else {
                    return Poll::Ready(Err("the connection was handed back".into()));
                };
                match self.upload.poll_send(io, cx) {
                    Poll::Ready(Err(SendError::Router(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(SendError::Actor(e))) => failed = Some(e),
                    _ => {}
                }
            }
            if !self.rbuf.is_empty()
                && let Some(head) = http1_wire::parse_response_head(
                    &mut self.rbuf,
                    head_request,
                    PROXY_H1_MAX_BUFFER,
                )?
            {
                return Poll::Ready(Ok(head));
            }
            if self.eof {
                return Poll::Ready(Err(match failed {
                    Some(e) => e.into(),
                    None => "the actor closed the connection before answering".into(),
                }));
            }
            match std::task::ready!(self.poll_read(cx)) {
                Ok(()) => {}
                // A write that failed because the actor reset the
                // connection says more than the read that follows.
                Err(e) => return Poll::Ready(Err(failed.unwrap_or(e).into())),
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_ROOM / 4 {
            self.rbuf.reserve(READ_ROOM);
        }
        let Some(io) = &mut self.io else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let n = std::task::ready!(io.poll_read_buf(cx, &mut self.rbuf))?;
        if n == 0 {
            self.eof = true;
        } else {
            self.answered = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for Exchange {
    /// Ended with its request still going (a stall, a timeout, the router
    /// gone): closed with a reset, as a FIN would wait behind bytes the
    /// actor may never read, and the actor would see no end.
    fn drop(&mut self) {
        if self.upload.sending()
            && let Some(io) = &self.io
        {
            io.reset_on_close();
        }
    }
}

/// A response body over HTTP/1.1: read off its connection as it is
/// polled, with what is left of the request body sent on the way.
struct H1Body {
    /// `None` once the body has ended (its connection back in the pool or
    /// closed).
    ex: Option<Exchange>,
    framing: Framing,
    reusable: bool,
    pool: Weak<Http1Pool>,
    port: u16,
}

impl H1Body {
    /// The body ended: its connection goes back to the pool if it can carry
    /// another request (the request was sent whole, the actor sent nothing
    /// past the response and keeps the connection open), else closes.
    fn finish(&mut self) {
        let Some(mut ex) = self.ex.take() else {
            return;
        };
        let clean = self.reusable && !ex.upload.sending() && !ex.upload.failed;
        if clean
            && !ex.eof
            && ex.rbuf.is_empty()
            && let Some(pool) = self.pool.upgrade()
            && let Some(io) = ex.io.take()
        {
            pool.put_back(self.port, io);
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, crate::BoxError>>> {
        let Some(ex) = &mut self.ex else {
            return Poll::Ready(None);
        };
        if ex.upload.sending()
            && let Some(io) = &mut ex.io
        {
            match ex.upload.poll_send(io, cx) {
                Poll::Ready(Err(SendError::Router(e))) => {
                    self.ex = None;
                    return Poll::Ready(Some(Err(e)));
                }
                // The response goes on; the connection will not.
                Poll::Ready(Err(SendError::Actor(_))) => self.reusable = false,
                _ => {}
            }
        }
        loop {
            let Some(ex) = &mut self.ex else {
                return Poll::Ready(None);
            };
            match self.framing.decode(&mut ex.rbuf, ex.eof) {
                Ok(Decoded::Data(data)) => {
                    if self.framing.is_end() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    self.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {
                    if let Err(e) = std::task::ready!(ex.poll_read(cx)) {
                        self.ex = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
                Err(e) => {
                    self.ex = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }
}

// The body lives in its response's one allocation (`boxed_unsync`); boxing
// the larger variant would add another to every request.
#[allow(clippy::large_enum_variant)]
enum Inner {
    H1(H1Body),
    H2c(Incoming),
}

/// A response body from the actor; over HTTP/1.1 it puts its connection
/// back in the pool when it ends (dropped before, the connection closes).
pub(crate) struct ActorBody(Inner);

impl ActorBody {
    /// A body whose connection is not pooled here (h2c).
    pub(crate) fn plain(inner: Incoming) -> Self {
        Self(Inner::H2c(inner))
    }
}

impl Body for ActorBody {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.0 {
            Inner::H1(body) => body.poll_frame(cx),
            Inner::H2c(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::H1(body) => body.ex.is_none() || body.framing.is_end(),
            Inner::H2c(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::H1(body) => match body.framing.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
            Inner::H2c(body) => body.size_hint(),
        }
    }
}
