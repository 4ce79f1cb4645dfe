//! A gateway a test scripts, for what the real one never does (hang up
//! mid-CONNECT, refuse streams, reset after its end, freeze, flood): TLS
//! with the gateway's certificate on loopback (no client authentication),
//! each accepted connection counted and handed to the test's script, as
//! the TLS stream or, for HTTP/2, as h2's server connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::server::TlsStream;

use crate::pki::Pki;

/// h2's server connection over the gateway's TLS.
pub type H2Conn = h2::server::Connection<TlsStream<TcpStream>, Bytes>;

/// A scripted gateway, serving until dropped.
pub struct ScriptedGateway {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for ScriptedGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves TLS offering `alpn` and hands the `n`th connection (from 1) to
/// `script`, each in its own task; a failed handshake is dropped.
pub async fn scripted_tls_gateway<F, Fut>(pki: &Pki, alpn: &[&str], script: F) -> ScriptedGateway
where
    F: Fn(usize, TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(pki.gateway_cert.chain.clone(), pki.gateway_cert.key())
    .expect("server config");
    tls.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let (count, script) = (accepted.clone(), Arc::new(script));
    let task = tokio::spawn(async move {
        // Aborted with the gateway, and its connections with it.
        let mut connections = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let (acceptor, script) = (acceptor.clone(), script.clone());
            connections.spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    script(n, tls).await;
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    ScriptedGateway {
        addr,
        accepted,
        task,
    }
}

/// Serves HTTP/2 (ALPN `h2`) set up by `builder` and hands the `n`th
/// connection, once its handshake is done, to `script`.
pub async fn scripted_h2_gateway<F, Fut>(
    pki: &Pki,
    builder: h2::server::Builder,
    script: F,
) -> ScriptedGateway
where
    F: Fn(usize, H2Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let script = Arc::new(script);
    scripted_tls_gateway(pki, &["h2"], move |n, tls| {
        let (script, builder) = (script.clone(), builder.clone());
        async move {
            if let Ok(conn) = builder.handshake(tls).await {
                script(n, conn).await;
            }
        }
    })
    .await
}
