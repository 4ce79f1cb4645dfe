//! `atunnel-bench actors`: the actors' programs for ingress, one small HTTP
//! server (HTTP/1.1 and h2c) inside every sandbox's runtime namespace, at
//! 169.254.17.2:<port> (with paths for answers that never end or never
//! come after their head), and two ports for stalled peers (one that
//! floods, one that never reads). A process of its own, so its CPU is the far
//! end's, not the tunnel's or the generator's.
//!
//! With `--loopback-actors N` it serves the same HTTP server for N actors
//! on 127.0.0.1 in its own namespace instead, one port each from
//! `--loopback-base-port`: the backends of the peers that run in atunnel's
//! place (`--compare peers`), which cannot enter the sandboxes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_sandbox::sandbox::ACTOR_ADDR;
use atunnel_sandbox::{NetNs, NsExecutor};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_util::sync::CancellationToken;

use crate::traffic::closed_unread;

#[derive(clap::Args, Clone, Debug)]
pub struct ActorsArgs {
    /// Runtime namespaces to serve in, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "loopback_actors"
    )]
    pub netns: Vec<String>,
    /// Serve this many actors on 127.0.0.1 here instead (no sandboxes),
    /// actor i on `--loopback-base-port` + i.
    #[arg(long, conflicts_with = "netns")]
    pub loopback_actors: Option<usize>,
    /// The first loopback actor's port.
    #[arg(long, default_value_t = LOOPBACK_BASE_PORT)]
    pub loopback_base_port: u16,
    /// Port the actors listen on.
    #[arg(long, default_value_t = ACTOR_PORT)]
    pub port: u16,
    /// Body bytes of each response.
    #[arg(long, default_value_t = 64)]
    pub body_bytes: usize,
    /// A port where each connection gets an endless stream of bytes (for
    /// readers that stop reading).
    #[arg(long, default_value_t = 9000)]
    pub flood_port: u16,
    /// A port where each connection is accepted and never read (for
    /// uploads and request bodies that stall at the actor); held until the
    /// peer closes, or for 120 s at most.
    #[arg(long, default_value_t = 9001)]
    pub hold_port: u16,
}

/// The port the actors' HTTP server listens on by default (in each
/// sandbox, at 169.254.17.2).
pub const ACTOR_PORT: u16 = 80;

static FLOOD: [u8; 64 * 1024] = [b'f'; 64 * 1024];

/// The first loopback actor's port (`--loopback-actors`): clear of the
/// ephemeral range and of every port the bench serves on.
pub const LOOPBACK_BASE_PORT: u16 = 18000;

/// Loopback actor `i`'s address (`--loopback-actors`).
pub fn loopback_addr(base_port: u16, i: usize) -> Result<SocketAddr, String> {
    u16::try_from(i)
        .ok()
        .and_then(|i| base_port.checked_add(i))
        .map(|port| SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
        .ok_or_else(|| format!("loopback actor {i} has no port above {base_port}"))
}

/// Pause after a failed accept (out of descriptors), so a full descriptor
/// table does not turn an accept loop into a spin that skews CPU figures.
pub const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// The next connection, or `None` once cancelled. A failed accept (out of
/// descriptors) leaves the connection in the backlog and backs off.
async fn accept(
    listener: &tokio::net::TcpListener,
    cancel: &CancellationToken,
) -> Option<tokio::net::TcpStream> {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return None,
            a = listener.accept() => match a {
                Ok((tcp, _)) => return Some(tcp),
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
        }
    }
}

/// Writes to every connection until it fails.
async fn flood(listener: tokio::net::TcpListener, cancel: CancellationToken) {
    while let Some(mut tcp) = accept(&listener, &cancel).await {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while tcp.write_all(&FLOOD).await.is_ok() {}
        });
    }
}

/// The longest a held connection is kept: a peer whose FIN waits behind
/// bytes this side never reads is never seen to close (its FIN is outside
/// the zero window), so the descriptor goes after this at the latest.
pub const HOLD_LIMIT: Duration = Duration::from_secs(120);

/// Accepts every connection and never reads from it or writes to it.
async fn hold(listener: tokio::net::TcpListener, cancel: CancellationToken) {
    while let Some(tcp) = accept(&listener, &cancel).await {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(HOLD_LIMIT) => {}
                _ = closed_unread(&tcp) => {}
            }
        });
    }
}

/// A response body that never ends: 64 KiB chunks for as long as the
/// client takes them (HTTP/1.1 sends it chunked).
struct Endless;

impl hyper::body::Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&FLOOD)))))
    }
}

/// A response body that sends nothing and never ends, holding the
/// request's body unread (an actor that answered a head and hung): the
/// stalled response bodies of noisy-neighbour.
struct Stalled(#[allow(dead_code)] hyper::body::Incoming);

impl hyper::body::Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // Never ready, so no waker is kept: nothing is ever to come.
        Poll::Pending
    }
}

static PAGE: [u8; 60_000] = [b'p'; 60_000];

pub async fn run(
    args: ActorsArgs,
    cancel: CancellationToken,
) -> Result<(), atunnel_process::BoxError> {
    let body = Bytes::from(vec![b'a'; args.body_bytes]);
    if let Some(n) = args.loopback_actors {
        for i in 0..n {
            let addr = loopback_addr(args.loopback_base_port, i)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("loopback actor {i} on {addr}: {e}"))?;
            tokio::spawn(serve_http(listener, body.clone(), cancel.clone()));
        }
        println!("ready {n} loopback actors");
        cancel.cancelled().await;
        return Ok(());
    }
    let exec = NsExecutor::start()?;
    let addr = SocketAddr::from((ACTOR_ADDR, args.port));
    for name in &args.netns {
        let ns = NetNs::open(name)?;
        let listen = |addr| exec.run_in(&ns, move || atunnel_sandbox::sandbox::listen_tcp(addr));
        let listener = tokio::net::TcpListener::from_std(listen(addr).await??)?;
        let flood_addr = SocketAddr::from((ACTOR_ADDR, args.flood_port));
        let flooder = tokio::net::TcpListener::from_std(listen(flood_addr).await??)?;
        tokio::spawn(flood(flooder, cancel.clone()));
        let holder = tokio::net::TcpListener::from_std(
            listen(SocketAddr::from((ACTOR_ADDR, args.hold_port))).await??,
        )?;
        tokio::spawn(hold(holder, cancel.clone()));
        tokio::spawn(serve_http(listener, body.clone(), cancel.clone()));
    }
    println!("ready {} actors", args.netns.len());
    cancel.cancelled().await;
    Ok(())
}

/// The actor's HTTP server (HTTP/1.1 and h2c) on `listener` until `cancel`.
async fn serve_http(listener: tokio::net::TcpListener, body: Bytes, cancel: CancellationToken) {
    while let Some(tcp) = accept(&listener, &cancel).await {
        let body = body.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                // `/page`: a 60 KB answer (a rendered page, for the
                // hibernation table); `/endless`: an answer that never
                // ends (for routers that stop reading); `/stall`: a head,
                // then nothing, the request's body never read; anything
                // else the short body.
                let body = match req.uri().path() {
                    "/page" => Either::Left(Full::new(Bytes::from_static(&PAGE))),
                    "/endless" => Either::Right(Either::Left(Endless)),
                    "/stall" => Either::Right(Either::Right(Stalled(req.into_body()))),
                    _ => Either::Left(Full::new(body.clone())),
                };
                async move { Ok::<_, Infallible>(hyper::Response::new(body)) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Answer clients that half-close after their request (as a
            // CONNECT tunnel's client may), as most servers do.
            builder.http1().half_close(true);
            let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
        });
    }
}
