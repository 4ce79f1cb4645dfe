//! Ingress HTTPS: the router's requests, routed by `ate-target-actor` (never
//! by Host) to the actor's program inside its sandbox.
//!
//! gRPC (HTTP/2, POST, `application/grpc[+x|;x]`) goes to the actor as h2c
//! with prior knowledge, everything else as HTTP/1.1, so an actor that only
//! speaks HTTP/1.1 keeps working. Bodies stream both ways under hyper's flow
//! control: nothing is buffered beyond its per-connection buffers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::http1_pool::{ActorBody, Http1Pool, UpstreamBody};
use super::routes::{ActorRoute, RouterBytes, Routes, TARGET_ACTOR_NAME};
use atunnel_connect::limits::PROXY_STREAM_WINDOW;

/// Header selecting the actor's port (1-65535; default 80).
pub const TARGET_PORT: &str = "x-ate-target-port";
/// Set on 421 answers: the router's assignment is stale.
pub const ASSIGNMENT_STALE: &str = "x-ate-assignment-stale";
/// The actor's port when no valid `X-Ate-Target-Port` is given.
pub const DEFAULT_ACTOR_PORT: u16 = 80;

pub type ProxyBody = UnsyncBoxBody<Bytes, crate::BoxError>;

// The names this file looks up or sets on every request, as `HeaderName`s:
// a `&str` name is parsed and checked again at each lookup, which cost ~5 %
// of an ingress request's instructions (the cost scenario's profile).
static TARGET_PORT_NAME: HeaderName = HeaderName::from_static(TARGET_PORT);
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Hop-by-hop headers, which describe one connection and never cross a
/// proxy; with Transfer-Encoding, what [`strip_hop_by_hop`] removes.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
];

fn text(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// `Retry-After` of a 503 for an actor at its in-flight budget.
pub(crate) const ACTOR_BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// 503 with `Retry-After`: the process is overloaded and takes no new work,
/// or the actor has as much in flight as it may.
pub fn unavailable(retry_after: std::time::Duration) -> Response<ProxyBody> {
    let mut r = text(StatusCode::SERVICE_UNAVAILABLE, "overloaded\n");
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after.as_secs().max(1)),
    );
    r
}

/// 421 with `X-Ate-Assignment-Stale: true`: the router should re-resolve.
pub fn misdirected() -> Response<ProxyBody> {
    let mut r = text(StatusCode::MISDIRECTED_REQUEST, "misdirected request\n");
    r.headers_mut()
        .insert(ASSIGNMENT_STALE, HeaderValue::from_static("true"));
    r
}

fn bad_gateway() -> Response<ProxyBody> {
    text(StatusCode::BAD_GATEWAY, "bad gateway\n")
}

/// `X-Ate-Target-Port` if it is a valid port, else 80.
pub fn target_port(headers: &HeaderMap) -> u16 {
    headers
        .get(&TARGET_PORT_NAME)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u16>().ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_ACTOR_PORT)
}

/// HTTP/2, POST, and a gRPC content type.
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    if req.version() != Version::HTTP_2 || req.method() != Method::POST {
        return false;
    }
    let Some(ct) = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    match ct.strip_prefix("application/grpc") {
        Some(rest) => rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'),
        None => false,
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap, keep_te_trailers: bool) {
    // Most requests and answers carry none: one pass over the names that
    // are there is cheaper than a lookup of each that might be.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    for n in &HOP_BY_HOP {
        headers.remove(n);
    }
    if keep_te_trailers && te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Gives a refusal a gRPC status as well, so a gRPC client reads an error it
/// understands (UNAVAILABLE: retryable) instead of failing to decode a text
/// body. The HTTP status and headers stay for the router.
fn for_grpc(mut r: Response<ProxyBody>) -> Response<ProxyBody> {
    let message = r.status().canonical_reason().unwrap_or("unavailable");
    let message = HeaderValue::from_str(message).unwrap_or(HeaderValue::from_static("unavailable"));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_static("14"));
    headers.insert("grpc-message", message);
    *r.body_mut() = Full::new(Bytes::new())
        .map_err(|e| match e {})
        .boxed_unsync();
    r
}

/// Proxies one request from the router to its actor.
/// `shared`: the router's connection is HTTP/2, carrying other actors'
/// requests too (each actor gets at most its share of its streams).
pub async fn proxy(
    routes: Arc<Routes>,
    client: SocketAddr,
    req: Request<RouterBody>,
    shared: bool,
) -> Result<Response<ProxyBody>, Infallible> {
    let grpc = is_grpc(&req);
    let answer = forward(routes, client, req, grpc, shared).await;
    let refused = answer.status().as_u16() >= 400 && !answer.headers().contains_key("grpc-status");
    Ok(if grpc && refused {
        for_grpc(answer)
    } else {
        answer
    })
}

async fn forward(
    routes: Arc<Routes>,
    client: SocketAddr,
    req: Request<RouterBody>,
    grpc: bool,
    shared: bool,
) -> Response<ProxyBody> {
    let Some(activation) = routes.target(req.headers()) else {
        return misdirected();
    };
    if let Some(refused) = routes.overloaded(&activation) {
        return unavailable(refused.retry_after);
    }
    let stream = match shared {
        true => match activation.admit_router_stream(client) {
            Some(s) => Some(s),
            None => return unavailable(ACTOR_BUSY_RETRY),
        },
        false => None,
    };
    let Some(token) = activation.admit() else {
        return unavailable(ACTOR_BUSY_RETRY);
    };
    let port = target_port(req.headers());
    if !activation.admits_port(port) {
        return unavailable(ACTOR_BUSY_RETRY);
    }
    let (parts, body) = req.into_parts();
    let host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });

    let (response_idle, request_idle) = activation.body_idle();
    // A request with no body (a GET) costs nothing here. One with a body
    // takes what h2 may hold of it unread (its window, or its length if
    // known and smaller; an HTTP/1.1 router connection buffers less) from
    // the actor's router bytes, and is watched if it can stall.
    let mut upload = None;
    let length = (!body.is_end_stream()).then(|| body.size_hint().exact());
    let body = if length.is_none() {
        None
    } else {
        let window = u64::from(PROXY_STREAM_WINDOW);
        let most = body.size_hint().upper().map_or(window, |n| n.min(window));
        let Some(reserved) = activation.reserve_router_bytes(most) else {
            return unavailable(ACTOR_BUSY_RETRY);
        };
        upload = (!request_idle.is_zero()).then(|| Arc::new(AtomicU64::new(0)));
        Some(
            Upload {
                inner: body,
                progress: upload.clone(),
                reserved: Some(reserved),
            }
            .boxed_unsync(),
        )
    };
    let upstream = if grpc {
        let Some(req) = grpc_request(parts, body, host.as_ref(), port, client) else {
            return text(StatusCode::BAD_REQUEST, "bad request target\n");
        };
        Upstream::H2c(Box::new((activation.h2c(port), req)))
    } else {
        let head_request = parts.method == Method::HEAD;
        let head = http1_head(&parts, host.as_ref(), port, client, length);
        Upstream::Http1(activation.http1().clone(), head, head_request, body)
    };
    let request = async move {
        match upstream {
            Upstream::Http1(pool, head, head_request, body) => {
                pool.request(port, head, head_request, body).await
            }
            Upstream::H2c(h2c) => match h2c.0.request(h2c.1).await {
                Ok(r) => Ok(r.map(ActorBody::plain)),
                Err(e) => Err(e.into()),
            },
        }
    };
    let mut watch = Box::pin(Watch::new(
        activation.work_token().cancelled_owned(),
        activation.response_timeout(),
        (response_idle, request_idle),
        upload,
    ));
    let mut request = std::pin::pin!(request);
    // Dropping the request on any of these closes the actor's connection
    // (hyper's HTTP/1.1 client does when the response is not waited for).
    let response = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = request.as_mut().poll(cx) {
            return Poll::Ready(Ok(r));
        }
        watch.as_mut().poll_stall(cx, true).map(Err)
    })
    .await;
    let response = match response {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(actor_uid = %activation.uid, port, error = %e, "atunnel upstream request failed");
            return bad_gateway();
        }
        Err(Stall::Cancelled) => return bad_gateway(),
        Err(Stall::Head) => {
            activation.response_timed_out();
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                "the actor did not answer in time\n",
            );
        }
        Err(Stall::Request) => {
            activation.body_idle_ended(false);
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                "the request body stopped moving\n",
            );
        }
        // Not before the head.
        Err(Stall::Response) => return bad_gateway(),
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    watch.as_mut().head_arrived();
    let body = Activated {
        inner: body,
        watch,
        activation,
        _token: token,
        _stream: stream,
    };
    Response::from_parts(parts, body.boxed_unsync())
}

/// The actor's address and `port` as a URI authority (`169.254.17.2:80`).
fn actor_authority(port: u16) -> http::uri::Authority {
    let mut s = Vec::with_capacity(24);
    atunnel_core::addr_text::push_socket_addr(&mut s, atunnel_sandbox::sandbox::actor_addr(port));
    http::uri::Authority::from_maybe_shared(Bytes::from(s))
        .unwrap_or_else(|_| http::uri::Authority::from_static("169.254.17.2"))
}

/// Where a request goes: the activation's HTTP/1.1 pool with the head
/// already written, or its h2c client for gRPC.
enum Upstream {
    Http1(Arc<Http1Pool>, Vec<u8>, bool, Option<UpstreamBody>),
    /// Boxed: the client and request are large, and gRPC is the rarer case.
    H2c(
        Box<(
            hyper_util::client::legacy::Client<super::routes::ActivationConnector, UpstreamBody>,
            Request<UpstreamBody>,
        )>,
    ),
}

/// The router's request as the actor's HTTP/1.1 head, written straight
/// from the router's headers in one pass: the routing headers, hop-by-hop
/// ones and those the proxy sets are left out as they are met, and Host
/// and the X-Forwarded headers added at the end (editing the header map
/// first, then writing it, cost ~3,000 instructions a request more).
fn http1_head(
    parts: &http::request::Parts,
    host: Option<&HeaderValue>,
    port: u16,
    client: SocketAddr,
    length: Option<Option<u64>>,
) -> Vec<u8> {
    let headers = &parts.headers;
    // Names the router's Connection header lists are hop-by-hop too.
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    let skip = |n: &HeaderName| {
        n == header::HOST
            || *n == TARGET_ACTOR_NAME
            || *n == TARGET_PORT_NAME
            || *n == X_FORWARDED_FOR
            || *n == X_FORWARDED_PROTO
            || (host.is_some() && *n == X_FORWARDED_HOST)
            || HOP_BY_HOP.contains(n)
            || listed.contains(n)
    };
    let fallback;
    let host_bytes = match host {
        Some(h) => h.as_bytes(),
        None => {
            // As an HTTP/1.1 client writes it from the URI: the port only
            // if not the default.
            fallback = actor_authority(port);
            let a = &fallback;
            if port == 80 { a.host() } else { a.as_str() }.as_bytes()
        }
    };
    let xff = forwarded_for(headers, client);
    let mut extra: [(&[u8], &[u8]); 4] = [
        (b"host", host_bytes),
        (b"x-forwarded-for", &xff),
        (b"x-forwarded-proto", b"https"),
        (b"x-forwarded-host", b""),
    ];
    let extra = match host {
        Some(h) => {
            extra[3].1 = h.as_bytes();
            &extra[..]
        }
        None => &extra[..3],
    };
    // The router's path and query as parsed (origin form).
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = Vec::with_capacity(256 + 64 * headers.len());
    super::http1_wire::encode_request_head(
        &mut head,
        &parts.method,
        path,
        headers,
        skip,
        extra,
        length,
    );
    head
}

/// The router's request as gRPC over h2c: the router's authority kept as
/// `:authority` (its h2c client dials by port, whatever the URI says), the
/// headers rewritten in the map.
fn grpc_request(
    mut parts: http::request::Parts,
    body: Option<UpstreamBody>,
    host: Option<&HeaderValue>,
    port: u16,
    client: SocketAddr,
) -> Option<Request<UpstreamBody>> {
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let authority = match host.and_then(|h| http::uri::Authority::try_from(h.as_bytes()).ok()) {
        Some(a) => a,
        None => actor_authority(port),
    };
    let mut target = http::uri::Parts::default();
    target.scheme = Some(http::uri::Scheme::HTTP);
    target.authority = Some(authority);
    target.path_and_query = Some(path);
    parts.uri = http::Uri::from_parts(target).ok()?;
    parts.version = Version::HTTP_2;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers, true);
    headers.remove(&TARGET_ACTOR_NAME);
    headers.remove(&TARGET_PORT_NAME);
    // Carried as :authority instead.
    headers.remove(header::HOST);
    set_forwarded(headers, client, host);
    let body = body.unwrap_or_else(|| {
        http_body_util::Empty::new()
            .map_err(|e| match e {})
            .boxed_unsync()
    });
    Some(Request::from_parts(parts, body))
}

/// X-Forwarded-For with the router's client appended to any prior chain.
fn forwarded_for(headers: &HeaderMap, client: SocketAddr) -> Vec<u8> {
    let mut xff = Vec::with_capacity(48);
    if let Some(prior) = headers
        .get(&X_FORWARDED_FOR)
        .and_then(|v| v.to_str().ok())
        .filter(|p| !p.is_empty())
    {
        xff.extend_from_slice(prior.as_bytes());
        xff.extend_from_slice(b", ");
    }
    atunnel_core::addr_text::push_ip(&mut xff, client.ip());
    xff
}

fn set_forwarded(headers: &mut HeaderMap, client: SocketAddr, host: Option<&HeaderValue>) {
    let xff = forwarded_for(headers, client);
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(xff)) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("https"));
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST.clone(), host.clone());
    }
}

/// A request body from the router: hyper's over HTTP/1.1, h2's own stream
/// over HTTP/2 (`router_h2` serves those connections with h2 directly).
pub enum RouterBody {
    H1(Incoming),
    H2 {
        recv: h2::RecvStream,
        /// Bytes still to come, when the request gave a Content-Length
        /// (h2 holds the stream to it).
        left: Option<u64>,
        /// The data has ended: trailers, if any, are next.
        data_done: bool,
    },
}

impl RouterBody {
    pub(crate) fn h2(recv: h2::RecvStream, headers: &HeaderMap) -> Self {
        let left = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Self::H2 {
            recv,
            left,
            data_done: false,
        }
    }
}

impl Body for RouterBody {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::H1(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::H2 {
                recv,
                left,
                data_done,
            } => {
                if !*data_done {
                    match ready!(recv.poll_data(cx)) {
                        Some(Ok(data)) => {
                            // Taken from h2: the router may send as much again.
                            let _ = recv.flow_control().release_capacity(data.len());
                            if let Some(n) = left {
                                *n = n.saturating_sub(data.len() as u64);
                            }
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                        None => *data_done = true,
                    }
                }
                match ready!(recv.poll_trailers(cx)) {
                    Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                    Ok(None) => Poll::Ready(None),
                    Err(e) => Poll::Ready(Some(Err(e.into()))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::H1(body) => body.is_end_stream(),
            Self::H2 { recv, .. } => recv.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Self::H1(body) => body.size_hint(),
            Self::H2 { left: Some(n), .. } => hyper::body::SizeHint::with_exact(*n),
            Self::H2 { .. } => hyper::body::SizeHint::default(),
        }
    }
}

/// A request body's frames passed to the actor so far, or [`UPLOADED`]:
/// written by [`Upload`] inside hyper's client, read by the [`Watch`].
type Progress = Arc<AtomicU64>;

/// [`Progress`] of a request body that has ended: nothing left to stall.
const UPLOADED: u64 = u64::MAX;

/// A request body on its way to the actor, counting its frames (a relaxed
/// store per frame: it is the only writer) so that the router side can
/// tell it stopped moving while hyper, blocked on an actor that does not
/// read, no longer polls it; and holding its place in the actor's router
/// bytes until it ends.
struct Upload {
    inner: RouterBody,
    /// `None` when request bodies have no idle bound.
    progress: Option<Progress>,
    reserved: Option<RouterBytes>,
}

impl Body for Upload {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let moving = matches!(frame, Some(Ok(_))) && !self.inner.is_end_stream();
        if let Some(p) = &self.progress {
            let n = if moving {
                p.load(Ordering::Relaxed).wrapping_add(1) % UPLOADED
            } else {
                UPLOADED
            };
            p.store(n, Ordering::Relaxed);
        }
        if !moving {
            // Ended: h2 holds nothing more of it.
            self.reserved = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end && let Some(p) = &self.progress {
            p.store(UPLOADED, Ordering::Relaxed);
        }
        end
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Why a request is ended before it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// The actor was deactivated.
    Cancelled,
    /// No response head within the response timeout.
    Head,
    /// The request body moved nothing for its idle bound.
    Request,
    /// The response body moved nothing for its idle bound.
    Response,
}

/// Ticks per body idle bound: a body is ended between its bound and a
/// quarter more after it stopped moving.
const TICKS_PER_BOUND: u32 = 4;

pin_project_lite::pin_project! {
    /// Everything that may end one request early, in the request's one
    /// allocation: deactivation, the response timeout, and the bodies'
    /// idle bounds. One timer serves them all, and it is not reset per
    /// frame: each direction counts its frames, and a tick (a quarter of
    /// the shorter bound) compares them with the last tick's; a direction
    /// unchanged for its bound's worth of ticks has stalled. A tick costs
    /// one timer reset, so a request streaming for a minute pays four.
    struct Watch {
        #[pin]
        cancelled: WaitForCancellationFutureOwned,
        #[pin]
        timer: Sleep,
        // Until the response head: when it is due.
        head_due: Option<Instant>,
        // Zero when no body is bounded.
        tick: Duration,
        upload: Option<Progress>,
        // Ticks a direction may stay unchanged (zero: unbounded), the
        // count seen at the last tick and the ticks it has stayed so.
        up_limit: u32,
        up_seen: u64,
        up_idle: u32,
        down_limit: u32,
        down_frames: u64,
        down_seen: u64,
        down_idle: u32,
    }
}

impl Watch {
    fn new(
        cancelled: WaitForCancellationFutureOwned,
        response_timeout: Duration,
        (response_idle, request_idle): (Duration, Duration),
        upload: Option<Progress>,
    ) -> Self {
        let now = Instant::now();
        let bounds = [response_idle, request_idle].into_iter();
        let tick = bounds
            .filter(|b| !b.is_zero())
            .min()
            .map_or(Duration::ZERO, |b| b / TICKS_PER_BOUND);
        let ticks = |bound: Duration| {
            if bound.is_zero() || tick.is_zero() {
                return 0;
            }
            u32::try_from(bound.as_nanos().div_ceil(tick.as_nanos()))
                .unwrap_or(u32::MAX)
                .max(1)
        };
        let head_due = now + response_timeout;
        // Ticking from the start, so that the head's arrival need not
        // reset the timer.
        let first = if tick.is_zero() {
            head_due
        } else {
            head_due.min(now + tick)
        };
        Self {
            cancelled,
            timer: tokio::time::sleep_until(first),
            head_due: Some(head_due),
            tick,
            up_limit: ticks(request_idle),
            up_seen: 0,
            up_idle: 0,
            down_limit: ticks(response_idle),
            down_frames: 0,
            // The first tick after the head may come early: it only
            // records the count.
            down_seen: u64::MAX,
            down_idle: 0,
            upload,
        }
    }

    /// The response head is here: from now on the response body is
    /// watched, and the response timeout no longer.
    fn head_arrived(self: Pin<&mut Self>) {
        *self.project().head_due = None;
    }

    /// Ready with the reason the request must end; pending (its waker
    /// registered) while nothing does. `head`: still waiting for the
    /// response head, when the response body is not watched.
    fn poll_stall(self: Pin<&mut Self>, cx: &mut Context<'_>, head: bool) -> Poll<Stall> {
        let mut this = self.project();
        if this.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Stall::Cancelled);
        }
        let uploading = *this.up_limit > 0
            && this
                .upload
                .as_ref()
                .is_some_and(|p| p.load(Ordering::Relaxed) != UPLOADED);
        let watching = uploading || (!head && *this.down_limit > 0);
        if this.head_due.is_none() && !watching {
            // Nothing can stall: no timer is polled, so none is registered.
            return Poll::Pending;
        }
        loop {
            ready!(this.timer.as_mut().poll(cx));
            let now = Instant::now();
            if let Some(due) = *this.head_due
                && now >= due
            {
                return Poll::Ready(Stall::Head);
            }
            if uploading {
                let n = this
                    .upload
                    .as_ref()
                    .map_or(0, |p| p.load(Ordering::Relaxed));
                if tick_idle(n, this.up_seen, this.up_idle) >= *this.up_limit {
                    return Poll::Ready(Stall::Request);
                }
            }
            if !head && *this.down_limit > 0 {
                let n = *this.down_frames;
                if tick_idle(n, this.down_seen, this.down_idle) >= *this.down_limit {
                    return Poll::Ready(Stall::Response);
                }
            }
            let next = match *this.head_due {
                Some(due) if this.tick.is_zero() => due,
                Some(due) => due.min(now + *this.tick),
                None => now + *this.tick,
            };
            this.timer.as_mut().reset(next);
        }
    }
}

/// One tick of a direction that has moved `n` frames in all: its ticks
/// without progress, now.
fn tick_idle(n: u64, seen: &mut u64, idle: &mut u32) -> u32 {
    if n == *seen {
        *idle = idle.saturating_add(1);
    } else {
        *seen = n;
        *idle = 0;
    }
    *idle
}

/// How often a response body that keeps moving looks at its watch anyway
/// (in frames): a request body can stall while the response streams.
const FRAMES_PER_LOOK: u64 = 32;

/// A response body that belongs to an activation: it ends with an error
/// (the router's stream reset, its HTTP/1.1 connection closed) the moment
/// the actor is deactivated or a body stops moving for its bound, and
/// keeps the activation's in-flight count until it is done.
struct Activated {
    inner: ActorBody,
    watch: Pin<Box<Watch>>,
    activation: Arc<ActorRoute>,
    _token: super::routes::InFlight,
    /// Its place among the actor's streams on a shared router connection.
    _stream: Option<super::routes::RouterStream>,
}

impl Body for Activated {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        let look = match &frame {
            Poll::Ready(Some(Ok(_))) => {
                let w = this.watch.as_mut().project();
                *w.down_frames += 1;
                (*w.down_frames).is_multiple_of(FRAMES_PER_LOOK)
            }
            Poll::Ready(_) => false,
            Poll::Pending => true,
        };
        if look && let Poll::Ready(stall) = this.watch.as_mut().poll_stall(cx, false) {
            let why = match stall {
                Stall::Cancelled => "actor deactivated",
                Stall::Request => "the request body stopped moving",
                _ => "the response body stopped moving",
            };
            match stall {
                Stall::Request => this.activation.body_idle_ended(false),
                Stall::Response | Stall::Head => this.activation.body_idle_ended(true),
                Stall::Cancelled => {}
            }
            return Poll::Ready(Some(Err(why.into())));
        }
        frame.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_actor_authority_is_its_address_and_port() {
        assert_eq!(actor_authority(80).as_str(), "169.254.17.2:80");
        assert_eq!(actor_authority(65535).as_str(), "169.254.17.2:65535");
    }

    #[test]
    fn forwarded_headers_append_the_client_to_a_prior_chain() {
        let client: SocketAddr = "[::ffff:198.51.100.4]:5000".parse().expect("addr");
        let mut h = HeaderMap::new();
        set_forwarded(&mut h, client, None);
        assert_eq!(h["x-forwarded-for"], "198.51.100.4");
        assert_eq!(h["x-forwarded-proto"], "https");
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        set_forwarded(&mut h, client, Some(&HeaderValue::from_static("app")));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 198.51.100.4");
        assert_eq!(h["x-forwarded-host"], "app");
    }

    #[test]
    fn hop_by_hop_headers_go_and_others_stay() {
        let mut h = HeaderMap::new();
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "nothing hop-by-hop: nothing removed");
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-secret, close"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h, true);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["te", "x-keep"], "{left:?}");
    }

    fn req(version: Version, method: Method, ct: Option<&str>) -> Request<()> {
        let mut b = Request::builder().version(version).method(method).uri("/");
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn grpc_is_http2_post_with_a_grpc_content_type() {
        assert!(is_grpc(&req(
            Version::HTTP_2,
            Method::POST,
            Some("application/grpc")
        )));
        assert!(is_grpc(&req(
            Version::HTTP_2,
            Method::POST,
            Some("application/grpc+proto")
        )));
        assert!(is_grpc(&req(
            Version::HTTP_2,
            Method::POST,
            Some("application/grpc;charset=utf-8")
        )));
        assert!(!is_grpc(&req(
            Version::HTTP_2,
            Method::POST,
            Some("application/grpcx")
        )));
        assert!(!is_grpc(&req(
            Version::HTTP_2,
            Method::GET,
            Some("application/grpc")
        )));
        assert!(!is_grpc(&req(
            Version::HTTP_11,
            Method::POST,
            Some("application/grpc")
        )));
        assert!(!is_grpc(&req(
            Version::HTTP_2,
            Method::POST,
            Some("application/json")
        )));
        assert!(!is_grpc(&req(Version::HTTP_2, Method::POST, None)));
    }

    #[test]
    fn target_port_falls_back_to_80_unless_valid() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(TARGET_PORT, HeaderValue::from_str(v).expect("value"));
            target_port(&h)
        };
        assert_eq!(with("8080"), 8080);
        assert_eq!(with("65535"), 65535);
        assert_eq!(with("0"), 80);
        assert_eq!(with("65536"), 80);
        assert_eq!(with("-1"), 80);
        assert_eq!(with("http"), 80);
        assert_eq!(target_port(&HeaderMap::new()), 80);
    }
}
