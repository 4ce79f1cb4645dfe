//! The sink's services over TLS, without a tunnel: the far end of a TCP ->
//! TLS relay (the bench's HAProxy, `mode tcp` with `ssl` on its server
//! line), which does the byte work of atunnel's egress without its HTTP/2.
//! Service port `p` of [`crate::sink`]'s table listens on `p + offset`, so
//! a relay that keeps the original destination's port and adds the offset
//! reaches the service the actor dialled. The client shows no certificate
//! (a relay is not an actor).
//!
//! Each handshake is counted as full or resumed ([`Handshakes`]), so a run
//! can say whether the relay resumes its sessions.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use atunnel_core::BufferPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::sink::{Service, SinkConfig};

/// The sink's service ports (echo, discard, stall, source, HTTP).
pub const SERVICE_PORTS: [u16; 5] = [7, 9, 13, 19, 80];

/// The bench's offset: 7007, 7009, ... clear of every port it serves on
/// and of the ephemeral range.
pub const DEFAULT_PORT_OFFSET: u16 = 7000;

/// How long a client has to finish its handshake: a stalled one does not
/// hold a task for ever.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Handshakes completed so far.
#[derive(Debug, Default)]
pub struct Handshakes {
    full: AtomicU64,
    resumed: AtomicU64,
}

impl Handshakes {
    /// Full handshakes (a certificate sent and verified).
    pub fn full(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }

    /// Resumed handshakes (a session ticket or ID taken).
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }
}

/// The TLS services running, until their cancellation token fires.
pub struct TlsServices {
    pub handshakes: Arc<Handshakes>,
    pub tasks: TaskTracker,
}

/// One listener per service on `ip`, bound in the calling thread's network
/// namespace (run it through an executor to place it elsewhere).
pub fn bind(ip: IpAddr, offset: u16) -> std::io::Result<Vec<(Service, std::net::TcpListener)>> {
    SERVICE_PORTS
        .iter()
        .map(|&p| {
            let service = Service::for_port(p).expect("SERVICE_PORTS are the sink's ports");
            let port = p.checked_add(offset).ok_or_else(|| {
                std::io::Error::other(format!("service port {p} + offset {offset} overflows"))
            })?;
            let listener = std::net::TcpListener::bind(SocketAddr::new(ip, port))?;
            listener.set_nonblocking(true)?;
            Ok((service, listener))
        })
        .collect()
}

/// A server configuration with `cert` and `key` (PEM), no client
/// certificate, rustls' default session cache and tickets (resumption is
/// the relay's to use or not).
pub fn server_config(
    cert: &Path,
    key: &Path,
) -> Result<Arc<rustls::ServerConfig>, atunnel_process::BoxError> {
    use atunnel_identity::pem_files::{load_certs, load_key};
    let tls = rustls::ServerConfig::builder_with_provider(atunnel_tls::provider::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)?;
    Ok(Arc::new(tls))
}

/// Serves each listener's service over TLS until `cancel`.
pub fn spawn(
    listeners: Vec<(Service, std::net::TcpListener)>,
    tls: Arc<rustls::ServerConfig>,
    cfg: SinkConfig,
    cancel: CancellationToken,
) -> std::io::Result<TlsServices> {
    let handshakes = Arc::new(Handshakes::default());
    let tasks = TaskTracker::new();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    // The gateway's relay buffer size; few connections at a time.
    let pool = BufferPool::new(16 * 1024, 1024, 64);
    for (service, listener) in listeners {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let accept = accept_loop(
            service,
            listener,
            acceptor.clone(),
            cfg,
            pool.clone(),
            handshakes.clone(),
            tasks.clone(),
            cancel.clone(),
        );
        tasks.spawn(accept);
    }
    tasks.close();
    Ok(TlsServices { handshakes, tasks })
}

#[allow(clippy::too_many_arguments)]
async fn accept_loop(
    service: Service,
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    cfg: SinkConfig,
    pool: BufferPool,
    handshakes: Arc<Handshakes>,
    tasks: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let tcp = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok((tcp, _)) => tcp,
                Err(_) => {
                    // Out of descriptors: the connection waits in the backlog.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, pool, handshakes) = (acceptor.clone(), pool.clone(), handshakes.clone());
        let cancel = cancel.clone();
        tasks.spawn(async move {
            let Ok(Ok(mut tls)) =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
            else {
                return;
            };
            let counter = match tls.get_ref().1.handshake_kind() {
                Some(rustls::HandshakeKind::Resumed) => &handshakes.resumed,
                _ => &handshakes.full,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = crate::sink::serve(service, &mut tls, &cfg, &pool) => {}
            }
        });
    }
}
