//! PEM files: certificate chains, private keys and CA bundles, with errors
//! that name the file.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("reading {path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("{path} holds no {what}")]
    Empty { path: PathBuf, what: &'static str },
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| PemError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(PemError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| PemError::Pem {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, PemError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| PemError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    Ok(roots)
}
