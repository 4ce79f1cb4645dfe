//! What the TLS tests share: a throwaway certificate, the ring provider,
//! configs built on them, accepting into atunnel's server stream, a
//! connected pair of it and a tokio-rustls client and traffic both ways
//! between them, and a blocking rustls client's handshake. Each test
//! binary uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use atunnel_tls::stream::{RecordTracking, ServerTls};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The client side of a [`connected`] pair.
pub type Client = tokio_rustls::client::TlsStream<TcpStream>;

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

/// atunnel's server stream (`server_cfg`) and a tokio-rustls client
/// (`client_cfg`, expecting the server to be `name`) connected over
/// loopback, both handshakes done.
pub async fn connected(
    server_cfg: Arc<rustls::ServerConfig>,
    client_cfg: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> (ServerTls, Client) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let client = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        tokio_rustls::TlsConnector::from(client_cfg)
            .connect(name, tcp)
            .await
            .expect("client handshake")
    };
    tokio::join!(accept(&listener, server_cfg), client)
}

/// `to_server` from the client (one write) and `to_client` from the server
/// (`server_chunk` bytes, a record, a write), both ways at once; what the
/// server and the client read.
pub async fn exchange(
    server: &mut ServerTls,
    client: &mut Client,
    to_server: &[u8],
    to_client: &[u8],
    server_chunk: usize,
) -> (Vec<u8>, Vec<u8>) {
    let (mut sr, mut sw) = tokio::io::split(server);
    let (mut cr, mut cw) = tokio::io::split(client);
    let client_writes = async {
        cw.write_all(to_server).await.expect("client write");
        cw.flush().await.expect("client flush");
    };
    let server_writes = async {
        for part in to_client.chunks(server_chunk) {
            sw.write_all(part).await.expect("server write");
            sw.flush().await.expect("server flush");
        }
    };
    let server_reads = async {
        let mut got = vec![0u8; to_server.len()];
        sr.read_exact(&mut got).await.expect("server read");
        got
    };
    let client_reads = async {
        let mut got = vec![0u8; to_client.len()];
        cr.read_exact(&mut got).await.expect("client read");
        got
    };
    let ((), (), server_got, client_got) =
        tokio::join!(client_writes, server_writes, server_reads, client_reads);
    (server_got, client_got)
}

/// How one side's reads ended, and what it read.
pub type Ending = (std::io::Result<usize>, Vec<u8>);

/// A half-close from the client: it closes its side, the server reads to
/// the end, answers `bye` and closes too, and the client reads to the end.
/// How the server's and the client's reads ended.
pub async fn half_close(server: &mut ServerTls, client: &mut Client) -> (Ending, Ending) {
    client.shutdown().await.expect("client close_notify");
    let mut rest = Vec::new();
    let server_end = server.read_to_end(&mut rest).await;
    server
        .write_all(b"bye")
        .await
        .expect("answer after half-close");
    server.shutdown().await.expect("server close_notify");
    let mut tail = Vec::new();
    let client_end = client.read_to_end(&mut tail).await;
    ((server_end, rest), (client_end, tail))
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
