//! `atunnel-bench pki`: throwaway certificates shaped like the cluster's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use atunnel_identity::pki::{self, CertificateAuthority, Usage};

/// The name the bench gateway's certificate carries: the fixtures' gateway
/// name, the cluster's egress service.
pub use atunnel_support::pki::GATEWAY_NAME;

/// File names inside a PKI folder.
pub struct PkiFiles {
    pub dir: PathBuf,
}

impl PkiFiles {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    pub fn actor_ca_cert(&self) -> PathBuf {
        self.path("actor-ca.pem")
    }
    pub fn actor_ca_key(&self) -> PathBuf {
        self.path("actor-ca.key")
    }
    pub fn gateway_ca(&self) -> PathBuf {
        self.path("servicedns-ca.pem")
    }
    pub fn gateway_cert(&self) -> PathBuf {
        self.path("gateway.pem")
    }
    pub fn gateway_key(&self) -> PathBuf {
        self.path("gateway.key")
    }
    /// The worker's serving certificate and key in one PEM (ingress).
    pub fn worker_bundle(&self) -> PathBuf {
        self.path("worker-credential-bundle.pem")
    }
    /// The pod-identity CA: verifies the router (and the worker).
    pub fn pod_ca(&self) -> PathBuf {
        self.path("pod-ca.pem")
    }
    pub fn router_cert(&self) -> PathBuf {
        self.path("router.pem")
    }
    pub fn router_key(&self) -> PathBuf {
        self.path("router.key")
    }
    /// The node agent's (atelet's) serving certificate and key.
    pub fn atelet_cert(&self) -> PathBuf {
        self.path("atelet.pem")
    }
    pub fn atelet_key(&self) -> PathBuf {
        self.path("atelet.key")
    }
}

/// The name the bench worker's serving certificate carries.
pub const WORKER_NAME: &str = "worker.bench";

/// Writes a fresh PKI into `dir`: the actor CA (certificate and key, which
/// the tunnel mints actor certificates with), the servicedns CA and the
/// gateway's server certificate, and the pod-identity CA with the worker's
/// serving bundle and the router's client certificate.
pub fn write(dir: &Path) -> Result<PkiFiles, atunnel_process::BoxError> {
    std::fs::create_dir_all(dir)?;
    let files = PkiFiles {
        dir: dir.to_path_buf(),
    };
    let actor_ca = CertificateAuthority::new("actor identity CA")?;
    std::fs::write(files.actor_ca_cert(), actor_ca.cert_pem())?;
    write_private(&files.actor_ca_key(), &actor_ca.key_pem())?;
    let servicedns = CertificateAuthority::new("servicedns CA")?;
    std::fs::write(files.gateway_ca(), servicedns.cert_pem())?;
    issue_to(
        &servicedns,
        pki::GATEWAY_SPIFFE_ID,
        &[GATEWAY_NAME],
        Usage::Server,
        (&files.gateway_cert(), &files.gateway_key()),
    )?;
    let pod_ca = CertificateAuthority::new("pod identity CA")?;
    std::fs::write(files.pod_ca(), pod_ca.cert_pem())?;
    let worker = pod_ca.issue(
        Some(pki::WORKER_SPIFFE_ID),
        &[WORKER_NAME],
        &[],
        Usage::ServerAndClient,
        LIFETIME,
    )?;
    write_private(
        &files.worker_bundle(),
        &format!("{}{}", worker.cert_pem, worker.key_pem),
    )?;
    issue_to(
        &pod_ca,
        pki::ROUTER_SPIFFE_ID,
        &[],
        Usage::Client,
        (&files.router_cert(), &files.router_key()),
    )?;
    issue_to(
        &pod_ca,
        pki::ATELET_SPIFFE_ID,
        &[],
        Usage::Server,
        (&files.atelet_cert(), &files.atelet_key()),
    )?;
    Ok(files)
}

/// How long the bench's certificates last.
const LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// Issues `spiffe_id`'s certificate for `names` from `ca` and writes it and
/// its key (readable by the owner only) to `(cert, key)`.
fn issue_to(
    ca: &CertificateAuthority,
    spiffe_id: &str,
    names: &[&str],
    usage: Usage,
    (cert, key): (&Path, &Path),
) -> Result<(), atunnel_process::BoxError> {
    let issued = ca.issue(Some(spiffe_id), names, &[], usage, LIFETIME)?;
    std::fs::write(cert, &issued.cert_pem)?;
    write_private(key, &issued.key_pem)?;
    Ok(())
}

fn write_private(path: &Path, pem: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(pem.as_bytes())
}
