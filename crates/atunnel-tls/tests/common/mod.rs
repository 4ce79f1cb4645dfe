//! What the TLS tests share: a throwaway certificate, the ring provider,
//! configs built on them, accepting into atunnel's server stream, and a
//! blocking rustls client's handshake. Each test binary uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use atunnel_tls::stream::{RecordTracking, ServerTls};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;

/// A self-signed certificate for `name` and its key.
pub struct Pki {
    pub cert: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
    pub name: ServerName<'static>,
}

pub fn pki(name: &str) -> Pki {
    let c = rcgen::generate_simple_self_signed(vec![name.into()]).expect("cert");
    Pki {
        cert: c.cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(c.signing_key.serialize_der().into()),
        name: ServerName::try_from(name.to_string()).expect("name"),
    }
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config with `pki`'s certificate, no client authentication and
/// its secrets extractable (what hibernation needs).
pub fn server_config(
    pki: &Pki,
    provider: Arc<rustls::crypto::CryptoProvider>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ServerConfig {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![pki.cert.clone()], pki.key.clone_key())
        .expect("server cert");
    cfg.enable_secret_extraction = true;
    cfg
}

/// A client config trusting `pki`'s certificate, without a certificate of
/// its own.
pub fn client_config(pki: &Pki) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.cert.clone()).expect("root");
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// The next connection of `listener`, handshaken into atunnel's server
/// stream.
pub async fn accept(listener: &TcpListener, cfg: Arc<rustls::ServerConfig>) -> ServerTls {
    let (tcp, _) = listener.accept().await.expect("accept");
    let tls = tokio_rustls::TlsAcceptor::from(cfg)
        .accept(RecordTracking::new(tcp))
        .await
        .expect("server handshake");
    ServerTls::new(tls)
}

/// A blocking rustls client connected to `addr` with its handshake done.
pub fn blocking_client(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> (std::net::TcpStream, rustls::ClientConnection) {
    let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
    let mut conn = rustls::ClientConnection::new(cfg, name).expect("client");
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).expect("client handshake");
    }
    (tcp, conn)
}
