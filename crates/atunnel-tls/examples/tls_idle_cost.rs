//! Heap one idle TLS server connection holds after its handshake and one
//! small exchange, awake (rustls through tokio-rustls) and hibernated (its
//! traffic keys alone, atunnel_tls::stream), for docs/memory.md. Both ends
//! live in this process, so the server side is measured as what is freed
//! when only the server ends are dropped.
//! Run: `cargo run --release -p atunnel-tls --example tls_idle_cost`.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use atunnel_identity::pki::{CertificateAuthority, Usage};
use atunnel_tls::stream::{RecordStream, RecordTracking, ServerTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const N: usize = 500;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca = CertificateAuthority::new("tls idle cost CA").expect("CA");
    let hour = Duration::from_secs(3600);
    let server_cert = ca
        .issue(None, &["worker.bench"], &[], Usage::Server, hour)
        .expect("server cert");
    let client_cert = ca
        .issue(
            Some("spiffe://cluster.local/ns/x/sa/router"),
            &[],
            &[],
            Usage::Client,
            hour,
        )
        .expect("client cert");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).expect("root");
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(server_cert.chain.clone(), server_cert.key.clone_key())
        .expect("server config");
    // As atunnel's ingress (crate::ingress::tls).
    server.enable_secret_extraction = true;
    server.key_log = atunnel_tls::secrets::key_log();
    server.ticketer = rustls::crypto::ring::Ticketer::new().expect("ticketer");
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(client_cert.chain.clone(), client_cert.key.clone_key())
        .expect("client config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let name = rustls::pki_types::ServerName::try_from("worker.bench").expect("name");

    let start = live_bytes();
    let mut servers = Vec::with_capacity(N);
    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        let (c, s) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (c, (s, _)) = (c.expect("connect"), s.expect("accept"));
        let s = RecordTracking::new(s);
        let (c, s) = tokio::join!(connector.connect(name.clone(), c), acceptor.accept(s));
        let (mut c, mut s) = (
            c.expect("client tls"),
            ServerTls::new(s.expect("server tls")),
        );
        // One small request and answer, as a keep-alive connection has had.
        c.write_all(&[b'q'; 200]).await.expect("write");
        let mut buf = [0u8; 200];
        s.read_exact(&mut buf).await.expect("read");
        s.write_all(&[b'a'; 200]).await.expect("write");
        s.flush().await.expect("flush");
        c.read_exact(&mut buf).await.expect("read");
        servers.push(s);
        clients.push(c);
    }
    let awake = live_bytes();
    for s in &mut servers {
        assert!(s.hibernate(), "an idle TLS 1.3 connection hibernates");
    }
    let hibernated = live_bytes();
    drop(servers);
    let gone = live_bytes();
    let per = |bytes: usize| (bytes - gone) as f64 / N as f64;
    let stream = std::mem::size_of::<tokio_rustls::server::TlsStream<RecordTracking>>();
    println!(
        "idle TLS server connection, awake: {:.0} B of heap per connection (the boxed TlsStream {stream} B of it; the rest rustls's buffers, keys and the peer's certificates, and tokio's socket registration)",
        per(awake)
    );
    println!(
        "hibernated: {:.0} B per connection (the boxed RecordStream {} B: socket, two traffic secrets with their keys, IVs and sequence numbers, empty buffers)",
        per(hibernated),
        std::mem::size_of::<RecordStream>()
    );
    drop(clients);
    // What outlives every connection: the client's session cache (the
    // server's tickets are stateless).
    println!(
        "kept after all {N} connections closed (the client's session cache, bounded): {} B",
        live_bytes() - start
    );
}
