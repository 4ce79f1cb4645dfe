//! Where actor certificates come from, and the checks atunnel applies to
//! every certificate it is handed before serving it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::PublicKeyData;
use rustls_pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::identity::ActorRef;
use crate::pki::CertificateAuthority;

/// How the signer refused a mint; mirrors the gRPC codes atelet/ateapi return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    Aborted,
    FailedPrecondition,
    PermissionDenied,
    Other,
}

/// Why no certificate was obtained for an actor.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("certificate minting refused ({code:?}): {message}")]
    Refused { code: RefusalCode, message: String },
    #[error("certificate minting failed: {0}")]
    Failed(String),
    #[error("minted certificate rejected: {0}")]
    BadCertificate(String),
}

impl MintError {
    /// Whether retrying is pointless: the signer has said this actor will not
    /// get a certificate (deleted, reassigned, or not authorised), so renewal
    /// must stop and new egress be blocked.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            MintError::Refused {
                code: RefusalCode::Aborted
                    | RefusalCode::FailedPrecondition
                    | RefusalCode::PermissionDenied,
                ..
            }
        )
    }
}

/// The future a [`CertificateSource`] returns: the chain, leaf first.
pub type MintFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<CertificateDer<'static>>, MintError>> + Send + 'a>>;

/// Something that mints a certificate for an actor from a CSR (atelet in a
/// cluster, a local CA in tests and benches).
pub trait CertificateSource: Send + Sync + 'static {
    /// Mint a certificate for this actor from this CSR.
    fn mint<'a>(&'a self, actor: &'a ActorRef, csr_der: &'a [u8]) -> MintFuture<'a>;
}

/// A [`CertificateSource`] that signs with an in-process CA, with ateapi's
/// validity (five minutes backdated, one hour by default).
#[derive(Clone, Debug)]
pub struct LocalCaSource {
    ca: Arc<CertificateAuthority>,
    lifetime: Duration,
}

/// ateapi's `actorCertificateLifetime`.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(60 * 60);
/// ateapi's backdating of `NotBefore`, for clock skew.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

impl LocalCaSource {
    /// Signs with `ca`, one-hour certificates.
    pub fn new(ca: Arc<CertificateAuthority>) -> Self {
        Self {
            ca,
            lifetime: DEFAULT_LIFETIME,
        }
    }

    /// Issue certificates valid for `lifetime` from now (tests use seconds to
    /// exercise renewal and expiry).
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }
}

impl CertificateSource for LocalCaSource {
    fn mint<'a>(&'a self, actor: &'a ActorRef, csr_der: &'a [u8]) -> MintFuture<'a> {
        Box::pin(async move {
            let now = SystemTime::now();
            let not_after = now.checked_add(self.lifetime).ok_or_else(|| {
                MintError::Failed(format!(
                    "lifetime {:?} for {actor} does not fit the clock",
                    self.lifetime
                ))
            })?;
            self.ca
                .sign_actor_csr(actor, csr_der, now - BACKDATE, not_after)
                .map_err(|e| MintError::Failed(format!("signing a certificate for {actor}: {e}")))
        })
    }
}

/// Checks a freshly minted chain before atunnel serves it: the leaf must be
/// for `key`, valid at `now`, and usable for client auth. Returns the leaf's
/// `not_after`, which drives renewal.
pub fn check_minted(
    chain: &[CertificateDer<'_>],
    key: &rcgen::KeyPair,
    now: SystemTime,
) -> Result<SystemTime, MintError> {
    let bad = MintError::BadCertificate;
    let leaf = chain
        .first()
        .ok_or_else(|| bad("the chain is empty".into()))?;
    let (_, cert) = X509Certificate::from_der(leaf)
        .map_err(|e| bad(format!("the leaf could not be parsed: {e}")))?;

    if cert.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(bad(
            "the leaf's public key is not the key the CSR was made with".into(),
        ));
    }

    let validity = cert.validity();
    let not_before = unix_to_system_time(validity.not_before.timestamp());
    let not_after = unix_to_system_time(validity.not_after.timestamp());
    if now < not_before {
        return Err(bad(format!(
            "the leaf is not valid yet (not_before {}, now {})",
            validity.not_before,
            describe(now)
        )));
    }
    if now >= not_after {
        return Err(bad(format!(
            "the leaf has expired (not_after {}, now {})",
            validity.not_after,
            describe(now)
        )));
    }

    let eku = cert
        .extended_key_usage()
        .map_err(|e| bad(format!("the leaf's extendedKeyUsage is malformed: {e}")))?;
    if !eku.is_some_and(|eku| eku.value.client_auth) {
        return Err(bad(
            "the leaf lacks the ClientAuth extended key usage".into()
        ));
    }
    Ok(not_after)
}

fn unix_to_system_time(secs: i64) -> SystemTime {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

fn describe(t: SystemTime) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => format!("unix {}", d.as_secs()),
        Err(e) => format!("unix -{}", e.duration().as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{ActorIdentity, verify_actor_leaf};
    use crate::pki::{Usage, actor_csr, new_actor_key};

    fn actor() -> ActorRef {
        ActorRef::new("team-a", "agent-1", "uid-1").expect("valid actor")
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn local_source_mints_a_verifiable_actor_chain() {
        let ca = Arc::new(CertificateAuthority::new("actor ca").expect("ca"));
        let source = LocalCaSource::new(ca.clone());
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let actor = actor();

        let chain = block_on(source.mint(&actor, &csr)).expect("minted");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca.cert_der());
        assert_eq!(
            verify_actor_leaf(&chain[0]).expect("actor leaf"),
            ActorIdentity::for_atunnel(&actor)
        );

        let now = SystemTime::now();
        let not_after = check_minted(&chain, &key, now).expect("accepted");
        let remaining = not_after.duration_since(now).expect("in the future");
        assert!(
            remaining > Duration::from_secs(3590) && remaining <= Duration::from_secs(3600),
            "default lifetime is one hour, got {remaining:?}"
        );
    }

    #[test]
    fn local_source_honours_lifetime() {
        let ca = Arc::new(CertificateAuthority::new("actor ca").expect("ca"));
        let source = LocalCaSource::new(ca).with_lifetime(Duration::from_secs(30));
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let chain = block_on(source.mint(&actor(), &csr)).expect("minted");
        let now = SystemTime::now();
        let not_after = check_minted(&chain, &key, now).expect("accepted");
        assert!(not_after <= now + Duration::from_secs(30));
        assert!(check_minted(&chain, &key, now + Duration::from_secs(31)).is_err());
    }

    #[test]
    fn local_source_refuses_a_forged_csr() {
        let ca = Arc::new(CertificateAuthority::new("actor ca").expect("ca"));
        let source = LocalCaSource::new(ca);
        let key = new_actor_key().expect("key");
        let mut csr = actor_csr(&key).expect("csr");
        // Flip a bit in the signature (the CSR's last byte).
        let last = csr.len() - 1;
        csr[last] ^= 0x01;
        assert!(matches!(
            block_on(source.mint(&actor(), &csr)),
            Err(MintError::Failed(_))
        ));
    }

    #[test]
    fn check_minted_accepts_only_the_matching_key_within_validity() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let not_before = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let not_after = not_before + Duration::from_secs(3600);
        let chain = ca
            .sign_actor_csr(&actor(), &csr, not_before, not_after)
            .expect("signed");

        let inside = not_before + Duration::from_secs(10);
        assert_eq!(check_minted(&chain, &key, inside).expect("ok"), not_after);
        assert_eq!(
            check_minted(&chain, &key, not_before).expect("ok"),
            not_after
        );

        let other = new_actor_key().expect("other key");
        let wrong_key = check_minted(&chain, &other, inside).expect_err("other key");
        assert!(wrong_key.to_string().contains("public key"), "{wrong_key}");

        let early = check_minted(&chain, &key, not_before - Duration::from_secs(1))
            .expect_err("before not_before");
        assert!(early.to_string().contains("not valid yet"), "{early}");

        let late = check_minted(&chain, &key, not_after).expect_err("at not_after");
        assert!(late.to_string().contains("expired"), "{late}");
    }

    #[test]
    fn check_minted_refuses_a_leaf_without_client_auth() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        let server = ca
            .issue(
                None,
                &["gw.test"],
                &[],
                Usage::Server,
                Duration::from_secs(600),
            )
            .expect("server cert");
        // The leaf's key, loaded back as an rcgen key, so only the EKU differs.
        let key = rcgen::KeyPair::from_pem(&server.key_pem).expect("key");
        let err = check_minted(&server.chain, &key, SystemTime::now()).expect_err("no ClientAuth");
        assert!(err.to_string().contains("ClientAuth"), "{err}");
    }

    #[test]
    fn check_minted_refuses_an_empty_chain() {
        let key = new_actor_key().expect("key");
        assert!(matches!(
            check_minted(&[], &key, SystemTime::now()),
            Err(MintError::BadCertificate(_))
        ));
    }

    #[test]
    fn only_aborted_failed_precondition_and_permission_denied_are_terminal() {
        let refused = |code| MintError::Refused {
            code,
            message: "no".into(),
        };
        let table = [
            (refused(RefusalCode::Aborted), true),
            (refused(RefusalCode::FailedPrecondition), true),
            (refused(RefusalCode::PermissionDenied), true),
            (refused(RefusalCode::Other), false),
            (MintError::Failed("unavailable".into()), false),
            (MintError::BadCertificate("expired".into()), false),
        ];
        for (err, terminal) in table {
            assert_eq!(err.is_terminal(), terminal, "{err}");
        }
    }
}
