//! The router's side of ingress: mutual-TLS connections, CONNECT over
//! HTTP/1.1 and HTTP/2, HTTPS requests, and reading what comes back.

use std::io;
use std::net::SocketAddr;

use atunnel_core::H2Stream;
use atunnel_identity::pki::{CertificateAuthority, IssuedCert};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ingress::*;
use crate::pki::*;

/// The router's TLS connection to either listener.
pub type RouterTls = tokio_rustls::client::TlsStream<TcpStream>;

/// TLS to the ingress as the router (or as `identity`), offering `alpn`.
pub async fn router_tls(
    pki: &IngressPki,
    addr: SocketAddr,
    identity: Option<&IssuedCert>,
    roots_from: Option<&CertificateAuthority>,
    alpn: &[&[u8]],
) -> io::Result<RouterTls> {
    let id = identity.unwrap_or(&pki.router);
    let cfg = mtls_client_config(
        roots_from.unwrap_or(&pki.pod_ca).cert_der(),
        id.chain.clone(),
        id.key(),
        rustls::DEFAULT_VERSIONS,
        alpn,
    );
    tls_connect(&cfg, addr, WORKER_NAME).await
}

/// Sends an HTTP/1.1 request head to `addr` as the router and reads the
/// response head; returns the stream and that head.
pub async fn h1_connect(pki: &IngressPki, addr: SocketAddr, head: &str) -> (RouterTls, String) {
    let mut tls = router_tls(pki, addr, None, None, &[b"http/1.1"])
        .await
        .expect("TLS");
    tls.write_all(head.as_bytes()).await.expect("write head");
    // Written may mean taken into rustls only (tokio's cooperative budget
    // can refuse the socket write): flushed, so it goes out now.
    tls.flush().await.expect("flush head");
    let head = atunnel_connect::http1::read_head(&mut tls)
        .await
        .expect("response head");
    (tls, String::from_utf8_lossy(&head).into_owned())
}

/// An HTTP/1.1 CONNECT tunnel through the listener at `addr` to
/// `team-a/<actor>`'s `port`, answered 200.
pub async fn h1_tunnel(pki: &IngressPki, addr: SocketAddr, actor: &str, port: u16) -> RouterTls {
    let head = format!("CONNECT actor:{port} HTTP/1.1\r\nate-target-actor: team-a/{actor}\r\n\r\n");
    let (tls, answer) = h1_connect(pki, addr, &head).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tls
}

/// An HTTP/2 connection to `addr` as the router, for streams built by hand
/// (CONNECT, unread bodies).
pub async fn h2_router(pki: &IngressPki, addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tls = router_tls(pki, addr, None, None, &[b"h2"])
        .await
        .expect("TLS");
    let (send_request, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    send_request
}

/// [`h2_router`], once ready for a stream: the server's SETTINGS are in.
pub async fn ready_h2_router(pki: &IngressPki, addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    h2_router(pki, addr).await.ready().await.expect("ready")
}

/// Sends `method authority` (to `team-a/<actor>` if given) on a new stream;
/// returns the answer and the stream's sending half.
pub async fn h2_request(
    router: &mut h2::client::SendRequest<Bytes>,
    method: &str,
    authority: &str,
    actor: Option<&str>,
) -> (http::Response<h2::RecvStream>, h2::SendStream<Bytes>) {
    // Only CONNECT has an authority-form target.
    let uri = if method == "CONNECT" {
        authority.to_string()
    } else {
        format!("https://{authority}/")
    };
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(actor) = actor {
        req = req.header("ate-target-actor", format!("team-a/{actor}"));
    }
    let req = req.body(()).expect("request");
    router.clone().ready().await.expect("h2 ready");
    let (resp, send) = router.send_request(req, false).expect("send");
    (resp.await.expect("response"), send)
}

/// A GET of `path` to `team-a/<actor>` on a new stream, its end sent, not
/// awaited: a test may leave it in flight.
pub fn h2_get(
    router: &mut h2::client::SendRequest<Bytes>,
    actor: &str,
    path: &str,
) -> h2::client::ResponseFuture {
    let req = http::Request::get(format!("https://w{path}"))
        .header("ate-target-actor", format!("team-a/{actor}"))
        .body(())
        .expect("request");
    router.send_request(req, true).expect("send").0
}

/// An HTTP/2 CONNECT tunnel to `team-a/<actor>`'s `port`, answered 200, as
/// a relay endpoint.
pub async fn h2_tunnel(
    router: &mut h2::client::SendRequest<Bytes>,
    actor: &str,
    port: u16,
) -> H2Stream {
    let (resp, send) = h2_request(router, "CONNECT", &format!("actor:{port}"), Some(actor)).await;
    assert_eq!(resp.status(), 200, "CONNECT to team-a/{actor}:{port}");
    H2Stream::new(send, resp.into_body())
}

/// Reads one HTTP/1.1 response with a Content-Length body: its head as
/// text, and its body. The head is read byte by byte, so nothing after the
/// body is taken.
pub async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> (String, Vec<u8>) {
    let head = atunnel_connect::http1::read_head(stream)
        .await
        .expect("response head");
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("response body");
    (head, body)
}

/// A gRPC call to `team-a/alpha`'s [`GRPC_PORT`] at `uri`, as the router
/// sends it.
pub fn grpc_to_alpha(uri: &str) -> http::request::Builder {
    http::Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("ate-target-actor", "team-a/alpha")
        .header("x-ate-target-port", GRPC_PORT.to_string())
}

/// An HTTP/1.1 connection to `addr` as the router, sending bodies of type
/// `B` (a streamed one, say), its connection task spawned.
pub async fn h1_router<B>(
    pki: &IngressPki,
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = router_tls(pki, addr, None, None, &[b"http/1.1"])
        .await
        .expect("router TLS");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    send
}

/// A router-side HTTP connection (h1 or h2 by ALPN).
pub enum RouterConn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl RouterConn {
    pub async fn open(pki: &IngressPki, addr: SocketAddr, h2: bool) -> Self {
        if !h2 {
            return RouterConn::H1(h1_router(pki, addr).await);
        }
        let tls = router_tls(pki, addr, None, None, &[b"h2"])
            .await
            .expect("router TLS");
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        RouterConn::H2(send)
    }

    pub async fn send(
        &mut self,
        req: http::Request<Full<Bytes>>,
    ) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        match self {
            RouterConn::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            RouterConn::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }

    /// Sends `req` with no body, asserts it was answered 200, and returns
    /// the answer's whole body.
    pub async fn get_ok(&mut self, req: http::request::Builder) -> Bytes {
        let resp = self
            .send(req.body(Full::new(Bytes::new())).expect("request"))
            .await
            .expect("response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body").to_bytes()
    }

    /// Sends `req` with no body and counts its answer's body to the end,
    /// keeping none of it (a download may be far larger than the heap a
    /// test measures).
    pub async fn download_len(&mut self, req: http::request::Builder) -> u64 {
        let resp = self
            .send(req.body(Full::new(Bytes::new())).expect("request"))
            .await
            .expect("response");
        crate::ingress::body_len(resp.into_body())
            .await
            .map_err(|(_, e)| e)
            .expect("body")
    }
}

/// Reads a whole body as text.
pub async fn body_text(resp: http::Response<hyper::body::Incoming>) -> String {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Sends `data` down a tunnel and reads as much back.
pub async fn echoed_h2(tunnel: &mut atunnel_core::H2Stream, data: &[u8]) -> Vec<u8> {
    use atunnel_core::endpoint::{read_chunk, write_chunk};
    let chunk = atunnel_core::Chunk::Shared(bytes::Bytes::copy_from_slice(data));
    write_chunk(tunnel, chunk).await.expect("write");
    let pool = atunnel_core::BufferPool::default();
    let mut back = Vec::new();
    while back.len() < data.len() {
        match read_chunk(tunnel, &pool).await.expect("read") {
            Some(chunk) => {
                back.extend_from_slice(chunk.remaining());
                atunnel_core::endpoint::Endpoint::consumed(tunnel, chunk.len());
            }
            None => break,
        }
    }
    back
}
