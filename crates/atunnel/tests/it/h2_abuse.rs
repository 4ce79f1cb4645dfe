//! HTTP/2 abuse from a raw peer (issue 13, point 4), on each of atunnel's
//! HTTP/2 servers: ingress HTTPS (hyper, toward the router) and the CONNECT
//! server (the h2 crate; ingress CONNECT here, the gateway runs the same
//! code). Each abuse comes from `atunnel_support::h2_raw`, frames written by
//! hand over real TLS, and each test checks the outcome (GOAWAY
//! ENHANCE_YOUR_CALM, a refused stream, a bound on what atunnel was made to
//! hold) and that another, well-behaved connection on the same listener is
//! served, bytes checked.

use atunnel_support::h2_raw::{Ended, Frame, RawH2, code, kind, literal, request_block, setting};
use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atunnel::egress::ActorEgress;
use atunnel_connect::flood::FloodLimits;
use atunnel_connect::limits::{
    MAX_CONCURRENT_STREAMS, PROXY_MAX_HEADER_LIST, PROXY_ROUTER_MAX_CONCURRENT_STREAMS,
    TUNNEL_MAX_FRAME_SIZE, TUNNEL_MAX_HEADER_LIST,
};
use atunnel_core::sockopt::SocketOptions;
use atunnel_identity::clock::Clock;
use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};

/// Long enough for a busy 2-core host; every wait ends on an event first.
const WITHIN: Duration = Duration::from_secs(10);

/// The actor's ports (as the router names them) and what serves each.
const HELLO_PORT: u16 = 80;
const ECHO_PORT: u16 = 8080;
const SILENT_PORT: u16 = 81;
const ENDLESS_PORT: u16 = 82;

/// Each `test: args;` after `scenario;` is a test of its own running
/// `scenario(args)`: one scenario, the cases it is run for.
macro_rules! tests_of {
    ($scenario:ident; $($test:ident: $($arg:expr),+;)*) => {$(
        #[tokio::test]
        async fn $test() {
            $scenario($($arg),+).await;
        }
    )*};
}

/// The two HTTP/2 servers under test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    /// Ingress HTTPS: hyper's HTTP/2 server, requests proxied to actors.
    Https,
    /// Ingress CONNECT: the CONNECT server shared with the gateway.
    Connect,
}

struct Site {
    pki: IngressPki,
    running: RunningIngress,
    /// Bytes the endless actor managed to write, over all its connections.
    endless_written: Arc<AtomicU64>,
    /// Connections the silent actor holds, never answered.
    _silent: tokio::task::JoinHandle<()>,
}

impl Site {
    fn addr(&self, server: Server) -> SocketAddr {
        match server {
            Server::Https => self.running.https,
            Server::Connect => self.running.connect,
        }
    }
}

/// An echo actor for tunnels.
async fn echo_actor() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A 64 KiB send buffer on the actor's sockets, so what it manages to
/// write is what atunnel took, plus small kernel queues.
async fn small_buffer_listener() -> TcpListener {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_send_buffer_size(64 * 1024).expect("SO_SNDBUF");
    socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    socket.listen(1024).expect("listen")
}

/// An actor whose answer never ends: HTTP/1.1 with an endless chunked body
/// (HTTPS), or endless bytes down a tunnel (CONNECT, the same port). Each
/// byte it manages to write is counted.
async fn endless_actor(written: Arc<AtomicU64>) -> SocketAddr {
    let listener = small_buffer_listener().await;
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let written = written.clone();
            tokio::spawn(async move {
                // An HTTP request starts with a method; a tunnel's first
                // bytes are ours ("go").
                let mut first = [0u8; 2];
                if s.read_exact(&mut first).await.is_err() {
                    return;
                }
                if &first != b"go" {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if s.read_exact(&mut b).await.is_err() {
                            return;
                        }
                        head.push(b[0]);
                    }
                    let h = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                    if s.write_all(h).await.is_err() {
                        return;
                    }
                }
                let mut chunk = format!("{:x}\r\n", 16 * 1024).into_bytes();
                chunk.extend(std::iter::repeat_n(b'z', 16 * 1024));
                chunk.extend_from_slice(b"\r\n");
                while s.write_all(&chunk).await.is_ok() {
                    written.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
            });
        }
    });
    addr
}

/// Ingress with `team-a/alpha` active: "hello" on its port 80, echo on
/// 8080, silence on 81, an endless answer on 82. Sandbox-side sockets get
/// the production fixed buffers, so the bound on what a stalled peer pins
/// is the production one.
async fn site() -> Site {
    site_with(FloodLimits::default()).await
}

/// [`site`] with `floods` as its connections' control-frame budget.
async fn site_with(floods: FloodLimits) -> Site {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| {
        cfg.sandbox_socket = SocketOptions::sandbox_default();
        cfg.h2_floods = floods;
    })
    .await;
    let hello =
        http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from("hello"))) }).await;
    let echo = echo_actor().await;
    // An actor whose every connection is accepted and never answered.
    let (silent, silent_task) = silent_peer().await;
    let endless_written = Arc::new(AtomicU64::new(0));
    let endless = endless_actor(endless_written.clone()).await;
    running.activate_alpha(&[
        (HELLO_PORT, hello.port()),
        (ECHO_PORT, echo.port()),
        (SILENT_PORT, silent.port()),
        (ENDLESS_PORT, endless.port()),
    ]);
    Site {
        pki,
        running,
        endless_written,
        _silent: silent_task,
    }
}

/// A well-behaved router connection (hyper or the h2 crate) on the same
/// listener is served: "hello" through HTTPS, an echo through a tunnel.
async fn a_well_behaved_router_is_served(site: &Site, server: Server) {
    let served = async {
        match server {
            Server::Https => {
                let mut router = RouterConn::open(&site.pki, site.running.https, true).await;
                let req = http::Request::builder()
                    .uri("https://worker.test/")
                    .header("ate-target-actor", "team-a/alpha");
                assert_eq!(router.get_ok(req).await, "hello");
            }
            Server::Connect => {
                let mut router = h2_router(&site.pki, site.running.connect).await;
                let mut tunnel = h2_tunnel(&mut router, "alpha", ECHO_PORT).await;
                let data = random(16 * 1024, 13);
                assert_eq!(echoed_h2(&mut tunnel, &data).await, data);
            }
        }
    };
    tokio::time::timeout(WITHIN, served)
        .await
        .expect("a well-behaved router is served within 10 s");
}

/// The raw peer's connection as the router, offering h2.
async fn raw_router(site: &Site, server: Server, settings: &[(u16, u32)]) -> RawH2<RouterTls> {
    let tls = router_tls(&site.pki, site.addr(server), None, None, &[b"h2"])
        .await
        .expect("router TLS");
    RawH2::client(tls, settings).await.expect("h2 handshake")
}

/// A request's header block for `server`: GET / (HTTPS) or CONNECT (a
/// tunnel), to `team-a/alpha`'s `port`, plus `extra`.
fn request(server: Server, port: u16, extra: &[(&str, &str)]) -> Vec<u8> {
    let port_s = port.to_string();
    let mut headers = vec![("ate-target-actor", "team-a/alpha")];
    match server {
        Server::Https => {
            headers.push(("x-ate-target-port", &port_s));
            headers.extend_from_slice(extra);
            request_block("GET", "worker.test", "/", &headers)
        }
        Server::Connect => {
            headers.extend_from_slice(extra);
            request_block("CONNECT", &format!("actor:{port}"), "", &headers)
        }
    }
}

/// HEADERS opening `stream` with `block`: GET ends the stream, CONNECT
/// keeps it open for the tunnel.
fn opening(server: Server, stream: u32, block: Vec<u8>) -> Frame {
    Frame::headers(stream, block, server == Server::Https, true)
}

/// A header block split into HEADERS and CONTINUATION frames of at most
/// 16 KiB, END_HEADERS on the last.
fn split_block(server: Server, stream: u32, block: &[u8]) -> Vec<Frame> {
    let mut parts = block.chunks(atunnel_support::h2_raw::DEFAULT_MAX_FRAME);
    let first = parts.next().unwrap_or_default().to_vec();
    let rest: Vec<_> = parts.collect();
    let mut frames = vec![Frame::headers(
        stream,
        first,
        server == Server::Https,
        rest.is_empty(),
    )];
    for (i, part) in rest.iter().enumerate() {
        frames.push(Frame::continuation(
            stream,
            part.to_vec(),
            i + 1 == rest.len(),
        ));
    }
    frames
}

/// The raw connection still serves `stream`: "hello" in its DATA (HTTPS),
/// or a 200 and an echo (CONNECT).
async fn the_raw_connection_serves(raw: &mut RawH2<RouterTls>, server: Server, stream: u32) {
    match server {
        Server::Https => {
            raw.send(&opening(server, stream, request(server, HELLO_PORT, &[])))
                .await
                .expect("request");
            let mut body = Vec::new();
            loop {
                let f = raw
                    .wait_for(WITHIN, |f| {
                        f.stream == stream && f.kind != kind::WINDOW_UPDATE
                    })
                    .await
                    .expect("the request is answered on the same connection");
                assert_ne!(f.kind, kind::RST_STREAM, "stream {stream} reset: {f:?}");
                if f.kind == kind::DATA {
                    body.extend_from_slice(&f.payload);
                }
                if f.has(atunnel_support::h2_raw::flag::END_STREAM) {
                    break;
                }
            }
            assert_eq!(body, b"hello");
        }
        Server::Connect => {
            raw.send(&opening(server, stream, request(server, ECHO_PORT, &[])))
                .await
                .expect("CONNECT");
            let head = raw
                .wait_for(WITHIN, |f| {
                    f.stream == stream && f.kind != kind::WINDOW_UPDATE
                })
                .await
                .expect("the CONNECT is answered on the same connection");
            assert!(head.is_status_200(), "CONNECT answered {head:?}");
            raw.send(&Frame::data(stream, b"ping", false))
                .await
                .expect("data");
            let mut back = Vec::new();
            while back.len() < 4 {
                let f = raw
                    .wait_for(WITHIN, |f| f.stream == stream && f.kind == kind::DATA)
                    .await
                    .expect("echo");
                back.extend_from_slice(&f.payload);
            }
            assert_eq!(back, b"ping");
        }
    }
}

/// Opens stream 1 to the actor's `port` and waits for its 200.
async fn stream_one_answered(raw: &mut RawH2<RouterTls>, server: Server, port: u16) {
    raw.send(&opening(server, 1, request(server, port, &[])))
        .await
        .expect("request");
    let head = raw
        .wait_for(WITHIN, |f| f.stream == 1 && f.kind != kind::WINDOW_UPDATE)
        .await
        .expect("answered");
    assert!(head.is_status_200(), "{server:?}: answered {head:?}");
}

// ---- frame size ----

/// The CONNECT server (the gateway's too) takes DATA frames up to its
/// SETTINGS_MAX_FRAME_SIZE, relayed intact, and ends a connection that
/// sends a larger one with FRAME_SIZE_ERROR rather than buffer it.
#[tokio::test]
async fn ingress_connect_takes_frames_up_to_its_max_frame_size_and_no_larger() {
    let site = site().await;
    let server = Server::Connect;
    // Windows with room for the echo: the raw peer grants no more later.
    let mut raw = raw_router(&site, server, &[(setting::INITIAL_WINDOW_SIZE, 1 << 20)]).await;
    raw.send(&Frame::window_update(0, 1 << 20))
        .await
        .expect("WINDOW_UPDATE");
    assert_eq!(
        raw.peer_setting(setting::MAX_FRAME_SIZE),
        Some(TUNNEL_MAX_FRAME_SIZE),
        "the CONNECT server's SETTINGS"
    );
    stream_one_answered(&mut raw, server, ECHO_PORT).await;
    // One frame of the largest size, echoed byte for byte.
    let largest: Vec<u8> = (0..TUNNEL_MAX_FRAME_SIZE)
        .map(|i| (i % 251) as u8)
        .collect();
    raw.send(&Frame::data(1, &largest, false))
        .await
        .expect("DATA");
    let mut back = Vec::new();
    while back.len() < largest.len() {
        let f = raw
            .wait_for(WITHIN, |f| f.stream == 1 && f.kind == kind::DATA)
            .await
            .expect("echo");
        back.extend_from_slice(&f.payload);
    }
    assert!(back == largest, "the largest frame came back altered");
    // One byte more ends the connection.
    let past = vec![b'x'; TUNNEL_MAX_FRAME_SIZE as usize + 1];
    raw.send(&Frame::data(1, &past, false))
        .await
        .expect("DATA past the limit");
    ends_with_goaway(
        &mut raw,
        code::FRAME_SIZE_ERROR,
        &format!("a frame of {} bytes", past.len()),
    )
    .await;
    a_well_behaved_router_is_served(&site, server).await;
}

/// The connection ends (within [`WITHIN`]) with a GOAWAY of `error`; `what`
/// ended it.
async fn ends_with_goaway<S: AsyncRead + AsyncWrite + Unpin>(
    raw: &mut RawH2<S>,
    error: u32,
    what: &str,
) {
    let ended = raw.until_goaway(WITHIN).await.expect("GOAWAY or close");
    assert!(
        matches!(ended, Ended::GoAway { error: e, .. } if e == error),
        "{what} ended with {ended:?}"
    );
}

// ---- rapid reset ----

async fn rapid_reset_gets_goaway(server: Server) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    // 200 streams opened and reset back to back, ten times the bound of
    // streams reset before being accepted (MAX_PENDING_ACCEPT_RESET_STREAMS).
    let mut frames = Vec::new();
    for i in 0..200u32 {
        let stream = 1 + 2 * i;
        frames.push(opening(server, stream, request(server, HELLO_PORT, &[])));
        frames.push(Frame::rst_stream(stream, code::CANCEL));
    }
    // The server may close while the burst is still going out.
    let _ = raw.send_all(&frames).await;
    ends_with_goaway(
        &mut raw,
        code::ENHANCE_YOUR_CALM,
        &format!("{server:?}: a rapid reset"),
    )
    .await;
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    rapid_reset_gets_goaway;
    a_rapid_reset_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https;
    a_rapid_reset_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect;
}

// ---- CONTINUATION flood ----

async fn continuation_flood_gets_goaway(server: Server) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    raw.send(&Frame::headers(
        1,
        request(server, HELLO_PORT, &[]),
        true,
        false,
    ))
    .await
    .expect("HEADERS");
    // Up to 1 MiB of CONTINUATION (64 frames of 16 KiB, never END_HEADERS):
    // far under h2's default header list (16 MiB), so only our limit stops
    // it, after a handful of frames.
    let mut frames_out = 0;
    for i in 0..64 {
        let mut block = Vec::new();
        literal(&mut block, &format!("x-flood-{i}"), &[b'f'; 16 * 1024 - 32]);
        match tokio::time::timeout(WITHIN, raw.send(&Frame::continuation(1, block, false))).await {
            Ok(Ok(())) => frames_out += 1,
            // Closed, or no longer read: the server gave up on us.
            _ => break,
        }
    }
    ends_with_goaway(
        &mut raw,
        code::ENHANCE_YOUR_CALM,
        &format!("{server:?}: a CONTINUATION flood of {frames_out} frames"),
    )
    .await;
    assert!(
        raw.closes_within(WITHIN).await,
        "the connection is closed after its GOAWAY"
    );
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    continuation_flood_gets_goaway;
    a_continuation_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https;
    a_continuation_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect;
}

// ---- oversized headers ----

async fn oversized_headers_are_refused_and_the_connection_serves_on(server: Server) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    // Past the header-list limit (64 KiB on HTTPS, 16 KiB on tunnels),
    // under four times it (where h2 would close the connection instead).
    let limit = match server {
        Server::Https => PROXY_MAX_HEADER_LIST,
        Server::Connect => TUNNEL_MAX_HEADER_LIST,
    } as usize;
    let padding = "p".repeat(limit + limit / 2);
    let block = request(server, HELLO_PORT, &[("x-padding", &padding)]);
    raw.send_all(&split_block(server, 1, &block))
        .await
        .expect("request");
    // h2 answers 431 and, if the request was not over (CONNECT), resets
    // the stream; nothing of it reaches an actor.
    let answer = raw
        .wait_for(WITHIN, |f| {
            f.stream == 1 && (f.kind == kind::HEADERS || f.kind == kind::RST_STREAM)
        })
        .await
        .expect("the oversized request is answered");
    assert_eq!(
        answer.status(),
        Some(431),
        "{server:?}: answered {answer:?}"
    );
    the_raw_connection_serves(&mut raw, server, 3).await;
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    oversized_headers_are_refused_and_the_connection_serves_on;
    headers_past_the_limit_on_ingress_https_are_refused_and_the_connection_serves_on:
        Server::Https;
    headers_past_the_limit_on_ingress_connect_are_refused_and_the_connection_serves_on:
        Server::Connect;
}

// ---- too many streams ----

async fn streams_past_the_limit_are_refused(server: Server, limit: u32) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    assert_eq!(
        raw.peer_setting(setting::MAX_CONCURRENT_STREAMS),
        Some(limit),
        "{server:?} announces its stream limit"
    );
    // `limit` streams held open by an actor that never answers, then one
    // more, all in one write.
    let mut frames = Vec::new();
    for i in 0..=limit {
        frames.push(opening(
            server,
            1 + 2 * i,
            request(server, SILENT_PORT, &[]),
        ));
    }
    raw.send_all(&frames).await.expect("streams");
    let last = 1 + 2 * limit;
    let reset = raw
        .wait_for(WITHIN, |f| {
            f.kind == kind::RST_STREAM || f.kind == kind::GOAWAY
        })
        .await
        .expect("a stream past the limit is reset");
    assert_eq!(
        (reset.kind, reset.stream, reset.error_code()),
        (kind::RST_STREAM, last, Some(code::REFUSED_STREAM)),
        "{server:?}: only the stream past {limit} is refused"
    );
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    streams_past_the_limit_are_refused;
    streams_past_max_concurrent_streams_on_ingress_https_are_refused:
        Server::Https, PROXY_ROUTER_MAX_CONCURRENT_STREAMS;
    streams_past_max_concurrent_streams_on_ingress_connect_are_refused:
        Server::Connect, MAX_CONCURRENT_STREAMS;
}

// ---- zero window ----

/// Waits until `counter` has not moved for three looks 200 ms apart (the
/// writer is blocked), at most `within`; its value then.
async fn settled(counter: &AtomicU64, within: Duration) -> u64 {
    let deadline = tokio::time::Instant::now() + within;
    let mut last = counter.load(Ordering::SeqCst);
    let mut still = 0;
    while still < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = counter.load(Ordering::SeqCst);
        if now == last {
            still += 1;
        } else {
            (last, still) = (now, 0);
        }
    }
    last
}

async fn a_zero_window_peer_pins_a_bounded_amount(server: Server) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[(setting::INITIAL_WINDOW_SIZE, 0)]).await;
    stream_one_answered(&mut raw, server, ENDLESS_PORT).await;
    if server == Server::Connect {
        // The tunnel's first bytes start the endless actor; a window of 0
        // binds only what atunnel sends.
        raw.send(&Frame::data(1, b"go", false)).await.expect("data");
    }
    // The actor writes for ever; what it got out before blocking is what
    // atunnel took from it and the kernel queues between them: 64 KiB
    // buffers on both sockets, which Linux doubles (256 KiB), and at most
    // an HTTP/1.1 read buffer (64 KiB) in atunnel; 230-250 KB measured. A
    // proxy or relay that read on regardless of the window would let it
    // write on: granting the window without reading took 850 KB, queued
    // toward the stalled router.
    let written = settled(&site.endless_written, WITHIN).await;
    eprintln!("{server:?}: the actor wrote {written} bytes toward a zero window");
    assert!(
        written < 512 * 1024,
        "{server:?}: a zero-window peer made atunnel take {written} bytes"
    );
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    a_zero_window_peer_pins_a_bounded_amount;
    a_zero_window_router_on_ingress_https_pins_a_bounded_amount_and_others_are_served:
        Server::Https;
    a_zero_window_router_on_ingress_connect_pins_a_bounded_amount_and_others_are_served:
        Server::Connect;
}

// ---- control-frame floods (atunnel_connect::flood) ----

/// The control frames a flood is made of, one kind a test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flood {
    Settings,
    Ping,
    WindowUpdate,
    Priority,
    /// Empty DATA on an open stream (stream 1, a request whose body the
    /// peer never ends).
    EmptyData,
    /// HEADERS (trailers) on stream 1, which the server reset (a request
    /// past the header-list limit, its body left open): h2 ignores frames
    /// on a stream it reset for a while rather than end the connection.
    HeadersOnClosedStream,
}

/// More than twice the budget: a flood the guard must have cut.
const FLOOD_FRAMES: u32 = 20_000;

fn flood_frame(flood: Flood, i: u32) -> Frame {
    match flood {
        Flood::Settings => Frame::settings(&[(setting::MAX_FRAME_SIZE, 16 * 1024)]),
        Flood::Ping => Frame::ping(u64::from(i).to_be_bytes()),
        Flood::WindowUpdate => Frame::window_update(0, 1),
        // PRIORITY on an idle stream: stream 3 depends on 0, weight 16.
        Flood::Priority => Frame::new(0x2, 0, 3, vec![0, 0, 0, 0, 15]),
        Flood::EmptyData => Frame::data(1, b"", false),
        Flood::HeadersOnClosedStream => {
            let mut block = Vec::new();
            literal(&mut block, "x-trailer", b"t");
            Frame::headers(1, block, true, true)
        }
    }
}

/// Writes `frames` frames of `flood` back to back, in one write. The
/// peer may cut the connection mid-flood: the write may fail.
async fn send_flood<S: AsyncRead + AsyncWrite + Unpin>(
    raw: &mut RawH2<S>,
    flood: Flood,
    frames: u32,
) {
    let mut batch = Vec::new();
    for i in 0..frames {
        flood_frame(flood, i).encode_into(&mut batch);
    }
    let _ = tokio::time::timeout(WITHIN, raw.write_raw(&batch)).await;
}

/// The HTTPS or CONNECT listener's flood count.
fn floods_counted(site: &Site, server: Server) -> u64 {
    let f = site.running.ingress.stats().h2_floods;
    match server {
        Server::Https => f.https_total,
        Server::Connect => f.connect_total,
    }
}

/// A raw router floods `flood` frames, reading whatever comes back: the
/// connection ends with GOAWAY ENHANCE_YOUR_CALM within 10 s, the flood is
/// counted, and another router is served meanwhile.
async fn a_control_frame_flood_gets_goaway_enhance_your_calm(server: Server, flood: Flood) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    match flood {
        Flood::EmptyData => {
            // A request whose body stays open: the silent actor takes it.
            let open = Frame::headers(1, request(server, SILENT_PORT, &[]), false, true);
            raw.send(&open).await.expect("request");
        }
        Flood::HeadersOnClosedStream => {
            let limit = match server {
                Server::Https => PROXY_MAX_HEADER_LIST,
                Server::Connect => TUNNEL_MAX_HEADER_LIST,
            } as usize;
            let padding = "p".repeat(limit + limit / 2);
            let block = request(server, HELLO_PORT, &[("x-padding", &padding)]);
            raw.send_all(&split_block(Server::Connect, 1, &block))
                .await
                .expect("request");
            raw.wait_for(WITHIN, |f| f.stream == 1 && f.kind == kind::RST_STREAM)
                .await
                .expect("the server resets stream 1");
        }
        _ => {}
    }
    send_flood(&mut raw, flood, FLOOD_FRAMES).await;
    ends_with_goaway(
        &mut raw,
        code::ENHANCE_YOUR_CALM,
        &format!("{server:?} {flood:?}"),
    )
    .await;
    // h2 0.4.20 ends a stream's empty DATA flood itself, first
    // (`MAX_RECV_EMPTY_DATA_FRAMES`); the guard counts every other kind.
    if flood != Flood::EmptyData {
        assert_eq!(floods_counted(&site, server), 1, "{server:?} {flood:?}");
    }
    a_well_behaved_router_is_served(&site, server).await;
}

/// `--h2-control-frame-budget` sets where a flood is cut: 40 PINGs, far
/// inside the default budget, are a flood past a budget of 10.
#[tokio::test]
async fn the_configured_control_frame_budget_is_where_a_flood_is_cut() {
    for (budget, cut) in [(10, true), (FloodLimits::default().budget, false)] {
        let site = site_with(FloodLimits {
            budget,
            per_second: 1,
        })
        .await;
        let mut raw = raw_router(&site, Server::Https, &[]).await;
        send_flood(&mut raw, Flood::Ping, 40).await;
        if cut {
            ends_with_goaway(
                &mut raw,
                code::ENHANCE_YOUR_CALM,
                "40 PINGs past a budget of 10",
            )
            .await;
        } else {
            // Answered: the 40th PING's ACK comes back.
            raw.wait_for(WITHIN, |f| {
                f.kind == kind::PING && f.payload[..] == 39u64.to_be_bytes()[..]
            })
            .await
            .expect("every PING answered");
        }
        assert_eq!(floods_counted(&site, Server::Https), u64::from(cut));
    }
}

tests_of! {
    a_control_frame_flood_gets_goaway_enhance_your_calm;
    a_settings_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::Settings;
    a_settings_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::Settings;
    a_ping_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::Ping;
    a_ping_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::Ping;
    a_window_update_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::WindowUpdate;
    a_window_update_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::WindowUpdate;
    a_priority_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::Priority;
    a_priority_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::Priority;
    an_empty_data_flood_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::EmptyData;
    an_empty_data_flood_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::EmptyData;
    a_flood_of_headers_on_a_closed_stream_on_ingress_https_gets_goaway_enhance_your_calm:
        Server::Https, Flood::HeadersOnClosedStream;
    a_flood_of_headers_on_a_closed_stream_on_ingress_connect_gets_goaway_enhance_your_calm:
        Server::Connect, Flood::HeadersOnClosedStream;
}

/// A router that behaves: a few SETTINGS and PINGs, then a 32 MiB answer
/// read with a WINDOW_UPDATE for every DATA frame (stream and connection,
/// the most a client sends), then another request: none of it is cut.
async fn a_well_behaved_peers_control_frames_are_not_cut(server: Server) {
    let site = site().await;
    let mut raw = raw_router(&site, server, &[]).await;
    // Room for what is in flight on stream 1 when it is reset below.
    raw.send(&Frame::window_update(0, 1 << 30))
        .await
        .expect("connection window");
    for i in 0..20u8 {
        raw.send_all(&[
            Frame::ping([i; 8]),
            Frame::settings(&[(setting::MAX_FRAME_SIZE, 16 * 1024)]),
        ])
        .await
        .expect("pings and settings");
    }
    // The endless actor's answer: a chunked body (HTTPS), or bytes down a
    // tunnel once it hears "go" (CONNECT).
    raw.send(&opening(server, 1, request(server, ENDLESS_PORT, &[])))
        .await
        .expect("request");
    if server == Server::Connect {
        raw.send(&Frame::data(1, b"go", false)).await.expect("go");
    }
    let want = 32 * 1024 * 1024;
    let mut got = 0;
    while got < want {
        let f = raw
            .wait_for(WITHIN, |f| f.stream == 1 || f.kind == kind::GOAWAY)
            .await
            .expect("the answer flows");
        assert_ne!(
            f.kind,
            kind::GOAWAY,
            "{server:?}: cut after {got} bytes: {f:?}"
        );
        assert_ne!(
            f.kind,
            kind::RST_STREAM,
            "{server:?}: reset after {got} bytes"
        );
        if f.kind == kind::DATA && !f.payload.is_empty() {
            got += f.payload.len();
            let n = f.payload.len() as u32;
            raw.send_all(&[Frame::window_update(1, n), Frame::window_update(0, n)])
                .await
                .expect("window updates");
        }
    }
    raw.send(&Frame::rst_stream(1, code::CANCEL))
        .await
        .expect("reset");
    the_raw_connection_serves(&mut raw, server, 3).await;
    assert_eq!(floods_counted(&site, server), 0, "{server:?}");
}

tests_of! {
    a_well_behaved_peers_control_frames_are_not_cut;
    a_well_behaved_routers_control_frames_on_ingress_https_are_not_cut:
        Server::Https;
    a_well_behaved_routers_control_frames_on_ingress_connect_are_not_cut:
        Server::Connect;
}

// ---- the clients: a hostile gateway, a hostile actor ----

/// How a hostile HTTP/2 server misbehaves once a client is connected.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hostile {
    /// PINGs without end, never reading what the client sends.
    PingFlood,
    /// SETTINGS without end, never reading.
    SettingsFlood,
    /// Answers the first request with HEADERS and endless CONTINUATION.
    ContinuationAnswer,
    /// Answers the first request with headers past the client's limit.
    OversizedAnswer,
    /// Floods control frames of a kind once the first request is in.
    Control(Flood),
}

/// What a hostile server saw of the client.
#[derive(Debug, Default)]
struct Seen {
    /// Bytes of flood written before the client stopped reading (floods).
    flooded: usize,
    /// The client's GOAWAY error code, if it sent one.
    goaway: Option<u32>,
    /// The client's RST_STREAM error code on the request, if it sent one.
    reset: Option<u32>,
    /// The client closed the connection within the wait.
    closed: bool,
}

/// 64 MiB of a flood: millions of answers, if the client read on while
/// its answers went unread.
const FLOOD: usize = 64 * 1024 * 1024;

/// Serves one connection as `mode` says and reports what the client did.
async fn hostile_h2<S>(io: S, mode: Hostile, header_limit: u32) -> Seen
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut seen = Seen::default();
    let Ok(mut raw) = RawH2::server(io, &[]).await else {
        return seen;
    };
    match mode {
        Hostile::PingFlood | Hostile::SettingsFlood => {
            let frame = match mode {
                Hostile::PingFlood => Frame::ping(*b"flooding"),
                _ => Frame::settings(&[(setting::MAX_FRAME_SIZE, 16 * 1024)]),
            };
            let one = frame.encode();
            let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
            seen.flooded = raw
                .write_until_stalled(&batch, FLOOD, Duration::from_secs(1))
                .await
                .unwrap_or(0);
        }
        Hostile::Control(flood) => {
            if raw
                .wait_for(WITHIN, |f| f.kind == kind::HEADERS)
                .await
                .is_err()
            {
                return seen;
            }
            send_flood(&mut raw, flood, FLOOD_FRAMES).await;
        }
        Hostile::ContinuationAnswer | Hostile::OversizedAnswer => {
            let Ok(request) = raw.wait_for(WITHIN, |f| f.kind == kind::HEADERS).await else {
                return seen;
            };
            let stream = request.stream;
            let frames = if mode == Hostile::OversizedAnswer {
                // Past the limit, under four times it (where h2 would end
                // the connection rather than the stream).
                let padding = vec![b'p'; header_limit as usize * 3 / 2];
                let block =
                    atunnel_support::h2_raw::response_block(200, &[("x-padding", &padding)]);
                let mut parts = block.chunks(atunnel_support::h2_raw::DEFAULT_MAX_FRAME);
                let mut frames = vec![Frame::headers(
                    stream,
                    parts.next().unwrap_or_default().to_vec(),
                    false,
                    false,
                )];
                let rest: Vec<_> = parts.collect();
                for (i, part) in rest.iter().enumerate() {
                    frames.push(Frame::continuation(
                        stream,
                        part.to_vec(),
                        i + 1 == rest.len(),
                    ));
                }
                frames
            } else {
                let block = atunnel_support::h2_raw::response_block(200, &[]);
                let mut frames = vec![Frame::headers(stream, block, false, false)];
                for i in 0..64 {
                    let mut block = Vec::new();
                    literal(&mut block, &format!("x-flood-{i}"), &[b'f'; 16 * 1024 - 32]);
                    frames.push(Frame::continuation(stream, block, false));
                }
                frames
            };
            for f in &frames {
                match tokio::time::timeout(WITHIN, raw.send(f)).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
            }
        }
    }
    // What the client says and does now.
    let watch = async {
        loop {
            match raw.read_frame().await {
                Ok(Some(f)) if f.kind == kind::GOAWAY => seen.goaway = f.error_code(),
                Ok(Some(f)) if f.kind == kind::RST_STREAM => {
                    seen.reset = f.error_code();
                    // A stream error leaves the connection to the client.
                    if mode == Hostile::OversizedAnswer {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    seen.closed = true;
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(WITHIN, watch).await;
    seen
}

/// A gateway with the gateway's certificate that misbehaves as `mode` on
/// every connection, reporting each one. Its sockets have small kernel
/// buffers, so a client that stops reading is seen after little.
async fn hostile_gateway(
    pki: &Pki,
    mode: Hostile,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(rustls::DEFAULT_VERSIONS)
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(pki.gateway_cert.chain.clone(), pki.gateway_cert.key())
    .expect("server config");
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = small_buffer_listener().await;
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = tx.send(hostile_h2(tls, mode, TUNNEL_MAX_HEADER_LIST).await);
                }
            });
        }
    });
    (addr, rx)
}

/// The hostile peer's first report fits `mode`: a flood of its cut short
/// and its connection closed (counted by `floods`, the side under test's
/// count of flooded connections), a CONTINUATION answer cut with GOAWAY, an
/// oversized answer's stream reset. `(peer, side)` name the two in messages.
async fn hostile_peer_was_cut(
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
    mode: Hostile,
    (peer, side): (&str, &str),
    floods: impl Fn() -> u64,
) {
    let first = tokio::time::timeout(WITHIN, seen.recv())
        .await
        .unwrap_or_else(|_| panic!("the hostile {peer} reports"))
        .expect("report");
    eprintln!("{mode:?}: the hostile {peer} saw {first:?}");
    match mode {
        Hostile::PingFlood | Hostile::SettingsFlood => {
            assert!(
                first.flooded < FLOOD,
                "{mode:?}: {side} read the whole flood while its answers went unread"
            );
            assert!(
                first.closed,
                "{mode:?}: {side} kept the connection: {first:?}"
            );
            assert!(floods() >= 1, "{mode:?}");
        }
        Hostile::Control(_) => {
            assert_eq!(
                first.goaway,
                Some(code::ENHANCE_YOUR_CALM),
                "{mode:?}: {first:?}"
            );
            assert!(first.closed, "{mode:?}: {first:?}");
            assert!(floods() >= 1, "{mode:?}");
        }
        Hostile::ContinuationAnswer => {
            assert_eq!(
                first.goaway,
                Some(code::ENHANCE_YOUR_CALM),
                "{mode:?}: {first:?}"
            );
            assert!(first.closed, "{mode:?}: {first:?}");
        }
        // A stream error (RFC 9113 §8.1.1): the stream is reset, no tunnel
        // opens or no answer comes, and h2 keeps the connection.
        Hostile::OversizedAnswer => {
            assert_eq!(
                first.reset,
                Some(code::PROTOCOL_ERROR),
                "{mode:?}: {first:?}"
            )
        }
    }
}

/// A tunnel of beta's, through a real gateway, opens within [`WITHIN`] and
/// echoes 16 KiB (random from `seed`).
async fn beta_is_served(beta: &ActorEgress, seed: u64) {
    let mut tunnel = tokio::time::timeout(WITHIN, beta.client().open_authority(SINK_ECHO))
        .await
        .expect("beta opens within 10 s")
        .expect("beta's tunnel");
    let data = random(16 * 1024, seed);
    assert_eq!(echoed(&mut tunnel, &data).await, data);
}

async fn a_hostile_gateway_loses_its_connection_and_others_are_unaffected(mode: Hostile) {
    let pki = Pki::new();
    let (hostile, mut seen) = hostile_gateway(&pki, mode).await;
    let good = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let mut cfg = client_config(&pki, hostile);
    // An open on a connection that does not answer is retried once on a
    // fresh one; 2 s each keeps the test short.
    cfg.open_timeout = Duration::from_secs(2);
    let alpha = ActorEgress::prepare(actor("alpha"), cfg, source.clone(), Clock::new())
        .await
        .expect("prepare alpha");
    let beta = prepare(&pki, good.addr, actor("beta"), source).await;
    let open = alpha.client().open_authority("192.0.2.10:443");
    let open = tokio::time::timeout(WITHIN, open)
        .await
        .expect("the open ends");
    assert!(
        open.is_err(),
        "{mode:?}: a tunnel opened through a hostile gateway"
    );
    hostile_peer_was_cut(&mut seen, mode, ("gateway", "the client"), || {
        alpha.client().stats().h2_floods_total
    })
    .await;
    // Another actor's tunnels, through a real gateway, are untouched.
    beta_is_served(&beta, 7).await;
}

tests_of! {
    a_hostile_gateway_loses_its_connection_and_others_are_unaffected;
    a_gateway_flooding_pings_is_dropped_and_other_actors_tunnels_are_unaffected:
        Hostile::PingFlood;
    a_gateway_flooding_settings_is_dropped_and_other_actors_tunnels_are_unaffected:
        Hostile::SettingsFlood;
    a_gateway_answering_with_a_continuation_flood_gets_goaway_enhance_your_calm:
        Hostile::ContinuationAnswer;
    a_gateway_answering_with_headers_past_the_limit_opens_no_tunnel:
        Hostile::OversizedAnswer;
    a_gateway_flooding_window_updates_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::WindowUpdate);
    a_gateway_flooding_priority_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Priority);
    a_gateway_flooding_pings_after_a_request_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Ping);
    a_gateway_flooding_settings_after_a_request_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Settings);
    a_gateway_flooding_headers_on_the_request_stream_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::HeadersOnClosedStream);
}

/// An actor speaking h2c that misbehaves as `mode` on every connection.
async fn hostile_actor(mode: Hostile) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let listener = small_buffer_listener().await;
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(hostile_h2(tcp, mode, PROXY_MAX_HEADER_LIST).await);
            });
        }
    });
    (addr, rx)
}

async fn a_hostile_h2c_actor_gets_an_error_answer_and_others_are_served(mode: Hostile) {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| {
        cfg.pools.response_timeout = Duration::from_secs(2);
        // A connection with no request left is closed after this.
        cfg.pools.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let (hostile, mut seen) = hostile_actor(mode).await;
    running.activate_alpha(&[(GRPC_PORT, hostile.port())]);
    let hello =
        http1_actor(|_req| async { http::Response::new(Full::new(Bytes::from("hello"))) }).await;
    activate_loopback(&running.ingress, "beta", "uid-2", hello.port());
    let mut router = RouterConn::open(&pki, running.https, true).await;
    let call = grpc_to_alpha("https://app.example.com/atunnel.test.Echo/Call")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("request");
    let resp = tokio::time::timeout(WITHIN, router.send(call))
        .await
        .expect("the router is answered within 10 s")
        .expect("response");
    assert!(
        resp.status() == 502 || resp.status() == 504,
        "{mode:?}: a hostile actor's answer came back as {}",
        resp.status()
    );
    hostile_peer_was_cut(&mut seen, mode, ("actor", "ingress"), || {
        running.ingress.stats().h2_floods.actors_total
    })
    .await;
    // Another actor, on the same router connection, is served.
    let req = http::Request::builder()
        .uri("https://worker.test/")
        .header("ate-target-actor", "team-a/beta")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = tokio::time::timeout(WITHIN, router.send(req))
        .await
        .expect("beta is served within 10 s")
        .expect("response");
    assert_eq!(resp.status(), 200);
    assert_eq!(body_text(resp).await, "hello");
}

tests_of! {
    a_hostile_h2c_actor_gets_an_error_answer_and_others_are_served;
    an_h2c_actor_flooding_pings_gets_the_router_an_error_and_others_are_served:
        Hostile::PingFlood;
    an_h2c_actor_flooding_settings_gets_the_router_an_error_and_others_are_served:
        Hostile::SettingsFlood;
    an_h2c_actor_answering_with_a_continuation_flood_gets_goaway_enhance_your_calm:
        Hostile::ContinuationAnswer;
    an_h2c_actor_answering_with_headers_past_the_limit_gets_the_router_an_error:
        Hostile::OversizedAnswer;
    an_h2c_actor_flooding_window_updates_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::WindowUpdate);
    an_h2c_actor_flooding_priority_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Priority);
    an_h2c_actor_flooding_pings_after_a_request_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Ping);
    an_h2c_actor_flooding_settings_after_a_request_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::Settings);
    an_h2c_actor_flooding_headers_on_the_request_stream_gets_goaway_enhance_your_calm:
        Hostile::Control(Flood::HeadersOnClosedStream);
}

/// An h2c actor that takes a request and then never reads or answers
/// again (no PING ACK): ingress's pings find it, the router gets 502 long
/// before the response timeout, and the connection is closed.
#[tokio::test]
async fn an_h2c_actor_that_stops_answering_pings_is_dropped_before_the_response_timeout() {
    let pki = IngressPki::new();
    let running = ingress_tuned(&pki, |cfg| {
        cfg.pools.response_timeout = Duration::from_secs(30);
        cfg.pools.ping_interval = Duration::from_millis(300);
        cfg.pools.ping_timeout = Duration::from_millis(300);
    })
    .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut raw = RawH2::server(tcp, &[]).await.expect("h2 handshake");
        // The request arrives; nothing is answered, pings included.
        let _ = raw
            .wait_for(WITHIN, |f| f.kind == kind::HEADERS)
            .await
            .expect("a request");
        let _ = closed_tx.send(raw.closes_within(WITHIN).await);
    });
    running.activate_alpha(&[(GRPC_PORT, port)]);
    let mut router = RouterConn::open(&pki, running.https, true).await;
    let call = grpc_to_alpha("https://app.example.com/atunnel.test.Echo/Call")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("request");
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(WITHIN, router.send(call))
        .await
        .expect("answered long before the 30 s response timeout")
        .expect("response");
    assert_eq!(resp.status(), 502, "after {:?}", started.elapsed());
    assert!(
        tokio::time::timeout(WITHIN, closed)
            .await
            .expect("reported")
            .expect("sent"),
        "ingress kept the connection to the silent actor"
    );
}

// ---- malformed request headers ----

/// What a malformed request costs: its stream, or (where h2 cannot do
/// better) the whole connection.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Malformed {
    /// The stream is reset (RST_STREAM PROTOCOL_ERROR) or answered 400;
    /// the connection serves on.
    Stream,
    /// GOAWAY PROTOCOL_ERROR: h2 reports the field as an HPACK decoding
    /// error, a connection error. See docs/design.md, "Malformed headers".
    Connection,
}

/// Each malformed field h2 sees in a request, and what it does today.
const MALFORMED: &[(&str, &[u8], Malformed)] = &[
    ("connection", b"keep-alive", Malformed::Stream),
    ("keep-alive", b"5", Malformed::Stream),
    ("transfer-encoding", b"chunked", Malformed::Stream),
    ("upgrade", b"h2c", Malformed::Stream),
    ("te", b"gzip", Malformed::Stream),
    // A pseudo-header after a regular one.
    (":path", b"/late", Malformed::Stream),
    ("X-Upper", b"case", Malformed::Connection),
    ("bad name", b"v", Malformed::Connection),
    ("x-nul", b"a\0b", Malformed::Connection),
    (":unknown", b"pseudo", Malformed::Connection),
];

async fn a_malformed_request_header_costs_what_h2_allows(server: Server) {
    let site = site().await;
    for (i, (name, value, cost)) in MALFORMED.iter().enumerate() {
        let mut raw = raw_router(&site, server, &[]).await;
        let mut block = request(server, HELLO_PORT, &[]);
        literal(&mut block, name, value);
        raw.send(&opening(server, 1, block)).await.expect("request");
        let answer = raw
            .wait_for(WITHIN, |f| {
                f.kind == kind::GOAWAY || (f.stream == 1 && f.kind != kind::WINDOW_UPDATE)
            })
            .await
            .expect("the malformed request is answered");
        let seen = match answer.kind {
            kind::GOAWAY => {
                assert_eq!(answer.error_code(), Some(code::PROTOCOL_ERROR), "{name}");
                Malformed::Connection
            }
            kind::RST_STREAM => {
                assert_eq!(answer.error_code(), Some(code::PROTOCOL_ERROR), "{name}");
                Malformed::Stream
            }
            _ => {
                assert_eq!(answer.status(), Some(400), "{server:?} {name}: {answer:?}");
                Malformed::Stream
            }
        };
        assert_eq!(seen, *cost, "{server:?}: case {i}, {name:?}: {answer:?}");
        if seen == Malformed::Stream {
            the_raw_connection_serves(&mut raw, server, 3).await;
        }
    }
    a_well_behaved_router_is_served(&site, server).await;
}

tests_of! {
    a_malformed_request_header_costs_what_h2_allows;
    a_malformed_request_header_on_ingress_https_resets_its_stream_where_h2_allows:
        Server::Https;
    a_malformed_request_header_on_ingress_connect_resets_its_stream_where_h2_allows:
        Server::Connect;
}

// ---- the gateway's server ----

/// A raw actor connection to the gateway (an actor certificate, ALPN h2).
async fn raw_actor_to_gateway(
    pki: &Pki,
    addr: SocketAddr,
    name: &str,
) -> RawH2<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let key = atunnel_identity::pki::new_actor_key().expect("key");
    let csr = atunnel_identity::pki::actor_csr(&key).expect("csr");
    let now = std::time::SystemTime::now();
    let chain = pki
        .actor_ca
        .sign_actor_csr(
            &actor(name),
            &csr,
            now - Duration::from_secs(60),
            now + Duration::from_secs(3600),
        )
        .expect("actor cert");
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
    let cfg = mtls_client_config(
        pki.gateway_ca.cert_der(),
        chain,
        key,
        rustls::DEFAULT_VERSIONS,
        &[b"h2"],
    );
    let tls = tls_connect(&cfg, addr, GATEWAY_NAME)
        .await
        .expect("actor TLS to the gateway");
    RawH2::client(tls, &[]).await.expect("h2 handshake")
}

/// An actor's connection flooding the gateway with `flood` frames gets
/// GOAWAY ENHANCE_YOUR_CALM, counted, and another actor's tunnel through
/// the same gateway carries its bytes meanwhile.
async fn a_flood_on_the_gateway_gets_goaway_enhance_your_calm(flood: Flood) {
    let pki = Pki::new();
    let gw = gateway(&pki, SinkConfig::default(), |_| {}).await;
    let mut raw = raw_actor_to_gateway(&pki, gw.addr, "alpha").await;
    send_flood(&mut raw, flood, FLOOD_FRAMES).await;
    ends_with_goaway(&mut raw, code::ENHANCE_YOUR_CALM, &format!("{flood:?}")).await;
    assert_eq!((gw.h2_floods)(), 1, "{flood:?}");
    let source = Arc::new(TestSource::new(pki.actor_ca.clone(), Clock::new()));
    let beta = prepare(&pki, gw.addr, actor("beta"), source).await;
    beta_is_served(&beta, 9).await;
}

tests_of! {
    a_flood_on_the_gateway_gets_goaway_enhance_your_calm;
    a_settings_flood_on_the_gateway_gets_goaway_enhance_your_calm:
        Flood::Settings;
    a_ping_flood_on_the_gateway_gets_goaway_enhance_your_calm:
        Flood::Ping;
    a_window_update_flood_on_the_gateway_gets_goaway_enhance_your_calm:
        Flood::WindowUpdate;
    a_priority_flood_on_the_gateway_gets_goaway_enhance_your_calm:
        Flood::Priority;
}
