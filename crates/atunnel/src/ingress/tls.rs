//! Ingress TLS: the worker's certificate, re-read when its file changes (the
//! kubelet rotates it in place), and mutual TLS that admits only the router.

use atunnel_process::reload::{Stamp, stamp};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use atunnel_identity::pem_files::{load_certs, load_key};

#[derive(Debug, thiserror::Error)]
pub enum IngressTlsError {
    #[error("loading the serving certificate from {path}: {message}")]
    Certificate { path: PathBuf, message: String },
    #[error("ingress client verifier: {0}")]
    Verifier(String),
    #[error("ingress TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Serves the certificate and key in a credential bundle (one PEM holding
/// the chain and the key), reloading it whenever its modification time
/// changes. A bad new file keeps the last good certificate.
#[derive(Debug)]
pub struct ReloadingCert {
    path: PathBuf,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

fn load(path: &Path) -> Result<Arc<CertifiedKey>, IngressTlsError> {
    let err = |message: String| IngressTlsError::Certificate {
        path: path.to_path_buf(),
        message,
    };
    let chain = load_certs(path).map_err(|e| err(e.to_string()))?;
    let key = load_key(path).map_err(|e| err(e.to_string()))?;
    let key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| err(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
}

impl ReloadingCert {
    /// Loads the bundle now, so a bad file fails start.
    pub fn new(path: &Path) -> Result<Self, IngressTlsError> {
        let stamp = stamp(path);
        let key = load(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            current: Mutex::new((stamp, key)),
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let stamp = stamp(&self.path);
        let mut current = self.current.lock().expect("certificate lock poisoned");
        if stamp != current.0 {
            match load(&self.path) {
                Ok(key) => *current = (stamp, key),
                Err(e) => tracing::warn!(error = %e, "keeping the previous serving certificate"),
            }
        }
        Some(current.1.clone())
    }
}

/// A server config for an ingress listener: the reloading certificate,
/// clients verified against `trust` and required to be `allowed_client_id`,
/// ALPN h2 and http/1.1.
pub fn server_config(
    credential_bundle: &Path,
    trust: &[rustls::pki_types::CertificateDer<'static>],
    allowed_client_id: &str,
) -> Result<Arc<rustls::ServerConfig>, IngressTlsError> {
    let verifier = atunnel_identity::verifier::spiffe_client_verifier(trust, allowed_client_id)
        .map_err(|e| IngressTlsError::Verifier(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(atunnel_tls::provider::provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(ReloadingCert::new(credential_bundle)?));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    atunnel_tls::provider::choose_suites_by_our_order(&mut cfg);
    // Hibernation keeps an idle connection's traffic keys instead of its
    // rustls session (atunnel_tls::stream).
    cfg.enable_secret_extraction = true;
    cfg.key_log = atunnel_tls::secrets::key_log();
    // Stateless resumption tickets (encrypted under a rotating key): the
    // default stateful ones keep every session, with the router's
    // certificate chain, in a 256-entry cache, about 550 KB once full.
    // A resumed session is not verified again and its tickets carry the
    // chain on, so atunnel_tls::accept refuses a router whose leaf
    // has expired since.
    cfg.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(cfg))
}
