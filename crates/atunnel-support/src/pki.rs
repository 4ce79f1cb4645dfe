//! Throwaway PKI shaped like the cluster's: the actor CA, the gateway's
//! CA and certificate, a scriptable certificate source, and mutual-TLS
//! client configs.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atunnel_identity::cert_source::{CertificateSource, MintError, MintFuture};
use atunnel_identity::clock::Clock;
use atunnel_identity::identity::ActorRef;
use atunnel_identity::pki::{ActorCertOptions, CertificateAuthority, IssuedCert, Usage};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

pub const GATEWAY_NAME: &str = "atenet-egress.ate-system.svc";

pub struct Pki {
    pub actor_ca: Arc<CertificateAuthority>,
    pub gateway_ca: CertificateAuthority,
    pub gateway_cert: IssuedCert,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    pub fn new() -> Self {
        let actor_ca = Arc::new(CertificateAuthority::new("actor CA").expect("actor CA"));
        let gateway_ca = CertificateAuthority::new("servicedns CA").expect("gateway CA");
        let gateway_cert = gateway_ca
            .issue(
                Some(atunnel_identity::pki::GATEWAY_SPIFFE_ID),
                &[GATEWAY_NAME],
                &[],
                Usage::Server,
                Duration::from_secs(3600),
            )
            .expect("gateway cert");
        Self {
            actor_ca,
            gateway_ca,
            gateway_cert,
        }
    }

    pub fn gateway_roots(&self) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.gateway_ca.cert_der()).expect("root");
        Arc::new(roots)
    }

    /// A tunnel's configuration trusting this PKI's gateway CA, its actors'
    /// certificates minted by a new [`TestSource`] of its actor CA.
    pub fn tunnel_config(&self) -> atunnel::tunnel::TunnelConfig {
        let source = Arc::new(TestSource::new(self.actor_ca.clone(), Clock::new()));
        atunnel::tunnel::TunnelConfig::new(self.gateway_roots(), source)
    }

    /// Writes the gateway CA's certificate and the actor CA's certificate
    /// and key into `dir`, where atunnel's binary is told to read them.
    pub fn write_ca_files(&self, dir: &Path) -> CaFiles {
        let file = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        CaFiles {
            gateway_ca: file("gateway-ca.pem", self.gateway_ca.cert_pem()),
            actor_ca_cert: file("actor-ca.pem", self.actor_ca.cert_pem()),
            actor_ca_key: file("actor-ca.key", self.actor_ca.key_pem()),
        }
    }
}

/// Where [`Pki::write_ca_files`] put the CA files.
pub struct CaFiles {
    pub gateway_ca: PathBuf,
    pub actor_ca_cert: PathBuf,
    pub actor_ca_key: PathBuf,
}

impl CaFiles {
    /// The flags naming them: `--gateway-ca=…`, `--actor-ca-cert=…`,
    /// `--actor-ca-key=…`.
    pub fn args(&self) -> [String; 3] {
        [
            format!("--gateway-ca={}", self.gateway_ca.display()),
            format!("--actor-ca-cert={}", self.actor_ca_cert.display()),
            format!("--actor-ca-key={}", self.actor_ca_key.display()),
        ]
    }
}

/// A certificate source for tests: signs with a CA using the test's clock,
/// counts mints, and answers from a script of failures first.
pub struct TestSource {
    pub ca: Arc<CertificateAuthority>,
    pub clock: Clock,
    pub lifetime: Duration,
    pub options: ActorCertOptions,
    pub script: Mutex<VecDeque<MintError>>,
    pub mints: AtomicUsize,
}

impl TestSource {
    pub fn new(ca: Arc<CertificateAuthority>, clock: Clock) -> Self {
        Self {
            ca,
            clock,
            lifetime: Duration::from_secs(3600),
            options: ActorCertOptions::default(),
            script: Mutex::new(VecDeque::new()),
            mints: AtomicUsize::new(0),
        }
    }

    pub fn fail_next(&self, e: MintError) {
        self.script.lock().expect("lock").push_back(e);
    }
}

impl CertificateSource for TestSource {
    fn mint<'a>(&'a self, actor: &'a ActorRef, csr_der: &'a [u8]) -> MintFuture<'a> {
        Box::pin(async move {
            self.mints.fetch_add(1, Ordering::SeqCst);
            if let Some(e) = self.script.lock().expect("lock").pop_front() {
                return Err(e);
            }
            let now = self.clock.now();
            self.ca
                .sign_actor_csr_with(
                    actor,
                    csr_der,
                    now - Duration::from_secs(300),
                    now + self.lifetime,
                    &self.options,
                )
                .map_err(|e| MintError::Failed(e.to_string()))
        })
    }
}

/// A rustls client trusting `root`, presenting `chain` and `key`, offering
/// `versions` and `alpn`. Connections made with one config share its
/// session cache, so later ones resume.
pub fn mtls_client_config(
    root: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).expect("root");
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// TLS over a new TCP connection to `addr`, for the server `name`.
pub async fn tls_connect(
    cfg: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(name.to_owned()).expect("name"), tcp)
        .await
}
