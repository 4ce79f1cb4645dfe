//! The router's side of ingress: its TLS client settings, and connections
//! from the load namespace to atunnel's router-facing listeners with them.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::topology::{Topology, WORKER_LOAD_SIDE};

/// The protocol the router offers (ALPN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Alpn {
    H2,
    Http1,
}

/// The router's TLS client settings (its certificate, trusting the pod CA),
/// one per ALPN offer, built once for the run. Session resumption is off:
/// every connection makes a full handshake, as a router's first one does.
pub(super) struct RouterTls {
    h2: Arc<rustls::ClientConfig>,
    http1: Arc<rustls::ClientConfig>,
}

impl RouterTls {
    pub(super) fn new(pki: &crate::pki::PkiFiles) -> Result<Self, atunnel_process::BoxError> {
        let roots = atunnel_identity::pem_files::load_roots(&pki.pod_ca())?;
        let certs = atunnel_identity::pem_files::load_certs(&pki.router_cert())?;
        let key = atunnel_identity::pem_files::load_key(&pki.router_key())?;
        let config = |alpn: &[u8]| -> Result<_, atunnel_process::BoxError> {
            let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key.clone_key())?;
            cfg.alpn_protocols = vec![alpn.to_vec()];
            cfg.resumption = rustls::client::Resumption::disabled();
            Ok(Arc::new(cfg))
        };
        Ok(Self {
            h2: config(b"h2")?,
            http1: config(b"http/1.1")?,
        })
    }

    fn config(&self, alpn: Alpn) -> Arc<rustls::ClientConfig> {
        match alpn {
            Alpn::H2 => self.h2.clone(),
            Alpn::Http1 => self.http1.clone(),
        }
    }

    /// TLS to the tunnel's ingress `port` from the load namespace, as the router
    /// (its certificate), offering `alpn`.
    pub(super) async fn connect(
        &self,
        topo: &Topology,
        port: u16,
        alpn: Alpn,
    ) -> Result<TlsStream<TcpStream>, atunnel_process::BoxError> {
        let tcp = topo
            .connect_in(&topo.load, SocketAddr::from((WORKER_LOAD_SIDE, port)))
            .await?;
        let name = rustls::pki_types::ServerName::try_from(crate::pki::WORKER_NAME)?;
        Ok(tokio_rustls::TlsConnector::from(self.config(alpn))
            .connect(name, tcp)
            .await?)
    }

    /// An HTTP/1.1 CONNECT tunnel over TLS from the router, through the
    /// CONNECT listener, to `actor:port`, once atunnel answered 200; nothing
    /// after the answer's head is read.
    pub(super) async fn connect_tunnel(
        &self,
        topo: &Topology,
        actor: u64,
        port: u16,
    ) -> Result<TlsStream<TcpStream>, atunnel_process::BoxError> {
        let mut tls = self.connect(topo, 8443, Alpn::Http1).await?;
        tls.write_all(
            format!(
                "CONNECT actor:{port} HTTP/1.1\r\nate-target-actor: bench/actor-{actor}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        let head = atunnel_connect::http1::read_head(&mut tls).await?;
        if atunnel_connect::http1::parse_response(&head)?.status != 200 {
            return Err(format!("CONNECT refused: {}", String::from_utf8_lossy(&head)).into());
        }
        Ok(tls)
    }
}
