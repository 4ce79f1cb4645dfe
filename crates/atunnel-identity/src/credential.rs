//! An actor's egress credential: its key, its current certificate, and the
//! renewal schedule.
//!
//! A fresh P-256 key is made per activation and reused for every renewal; it
//! never leaves the process. The certificate is served to the gateway as the
//! TLS client certificate only while it is valid: expiry (or a terminal
//! renewal refusal) blocks new tunnels, while tunnels already open drain.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::cert_source::{CertificateSource, MintError, check_minted};
use crate::clock::Clock;
use crate::identity::ActorRef;
use crate::pki;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("creating a key for actor {actor}: {message}")]
    Key { actor: String, message: String },
    #[error("minting a certificate for actor {actor}: {source}")]
    Mint {
        actor: String,
        #[source]
        source: MintError,
    },
}

struct Current {
    leaf: CertificateDer<'static>,
    issuers: Arc<[CertificateDer<'static>]>,
    not_after: SystemTime,
}

/// The issuing certificates of the chains in use, so that credentials
/// whose chains have the same ones share a copy: a worker's actors are
/// issued by the same CA, and the certificates above the leaf are 0.5-2 KB
/// that each actor would otherwise hold. Weak, so a chain no credential
/// uses is freed; a scan of at most [`MAX_SHARED_ISSUERS`] live entries.
static SHARED_ISSUERS: Mutex<Vec<Weak<[CertificateDer<'static>]>>> = Mutex::new(Vec::new());

/// Distinct issuer chains shared at once; a source that answers each mint
/// with chains of its own past that gets unshared copies, not a longer scan.
const MAX_SHARED_ISSUERS: usize = 64;

/// `issuers` as a copy shared with the credentials that already hold the
/// same certificates.
fn shared_issuers(issuers: &[CertificateDer<'static>]) -> Arc<[CertificateDer<'static>]> {
    let mut shared = SHARED_ISSUERS.lock().expect("issuers lock poisoned");
    shared.retain(|w| w.strong_count() > 0);
    if let Some(found) = shared
        .iter()
        .filter_map(Weak::upgrade)
        .find(|s| **s == *issuers)
    {
        return found;
    }
    let new: Arc<[CertificateDer<'static>]> = issuers.into();
    if shared.len() < MAX_SHARED_ISSUERS {
        shared.push(Arc::downgrade(&new));
    }
    new
}

/// The certificate an actor's egress tunnels present.
pub struct ActorCredential {
    actor: ActorRef,
    /// The private key as PKCS#8 DER, from which a renewal rebuilds the
    /// key pair it signs its CSR with: kept as bytes rather than as a
    /// second parsed key pair beside `signing_key`, since a worker holds one
    /// per actor and renewals are rare.
    key_der: PrivatePkcs8KeyDer<'static>,
    signing_key: Arc<dyn rustls::sign::SigningKey>,
    current: RwLock<Option<Current>>,
    clock: Clock,
}

impl std::fmt::Debug for ActorCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorCredential")
            .field("actor", &self.actor)
            .field("expires_at", &self.expires_at())
            .finish()
    }
}

impl ActorCredential {
    /// Makes a new key and mints its first certificate. Fails closed: no
    /// credential exists without a valid certificate.
    pub async fn mint(
        actor: ActorRef,
        source: &dyn CertificateSource,
        clock: Clock,
    ) -> Result<Self, CredentialError> {
        let key_err = |message: String| CredentialError::Key {
            actor: actor.to_string(),
            message,
        };
        let key = pki::new_actor_key().map_err(|e| key_err(e.to_string()))?;
        let key_der = PrivatePkcs8KeyDer::from(key.serialize_der());
        drop(key);
        let signing_key =
            rustls::crypto::ring::sign::any_ecdsa_type(&PrivateKeyDer::Pkcs8(key_der.clone_key()))
                .map_err(|e| key_err(e.to_string()))?;
        let credential = Self {
            actor,
            key_der,
            signing_key,
            current: RwLock::new(None),
            clock,
        };
        credential.renew(source).await?;
        Ok(credential)
    }

    pub fn actor(&self) -> &ActorRef {
        &self.actor
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Mints a new certificate for the same key and installs it after
    /// checking it (key matches, valid now, ClientAuth).
    pub async fn renew(&self, source: &dyn CertificateSource) -> Result<(), CredentialError> {
        let mint_err = |source: MintError| CredentialError::Mint {
            actor: self.actor.to_string(),
            source,
        };
        let failed = |e: String| mint_err(MintError::Failed(e));
        let key = rcgen::KeyPair::try_from(&self.key_der).map_err(|e| failed(e.to_string()))?;
        let csr = pki::actor_csr(&key).map_err(|e| failed(e.to_string()))?;
        let chain = source.mint(&self.actor, &csr).await.map_err(mint_err)?;
        let not_after = check_minted(&chain, &key, self.clock.now()).map_err(mint_err)?;
        let mut chain = chain.into_iter();
        let leaf = chain
            .next()
            .ok_or_else(|| failed("the chain is empty".into()))?;
        let issuers = shared_issuers(chain.as_slice());
        *self.current.write().expect("credential lock poisoned") = Some(Current {
            leaf,
            issuers,
            not_after,
        });
        Ok(())
    }

    /// Blocks new tunnels for good (a terminal renewal refusal).
    pub fn revoke(&self) {
        *self.current.write().expect("credential lock poisoned") = None;
    }

    /// When the current certificate expires; `None` once revoked.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.current
            .read()
            .expect("credential lock poisoned")
            .as_ref()
            .map(|c| c.not_after)
    }

    /// Lifetime left, zero once expired or revoked.
    pub fn remaining(&self) -> Duration {
        self.expires_at()
            .and_then(|t| t.duration_since(self.clock.now()).ok())
            .unwrap_or(Duration::ZERO)
    }

    /// Whether a new tunnel may open now.
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }
}

impl ResolvesClientCert for ActorCredential {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let now = self.clock.now();
        let current = self.current.read().expect("credential lock poisoned");
        // Assembled per handshake (rare: connections are pooled) rather
        // than kept, so the issuers stay one shared copy.
        current.as_ref().filter(|c| now < c.not_after).map(|c| {
            let chain = std::iter::once(c.leaf.clone())
                .chain(c.issuers.iter().cloned())
                .collect();
            Arc::new(CertifiedKey::new(chain, self.signing_key.clone()))
        })
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// When to renew after a success: once 90% of the remaining lifetime has passed.
pub fn renewal_delay(remaining: Duration) -> Duration {
    remaining - remaining / 10
}

/// When to retry after a failed renewal: min(30 s, max(1 s, remaining/10),
/// remaining); once expired, 25-35 s (jittered so a worker's actors do not
/// retry in step).
pub fn retry_delay(remaining: Duration) -> Duration {
    if remaining.is_zero() {
        return Duration::from_secs(25) + Duration::from_millis(rand::random_range(0..10_000));
    }
    Duration::from_secs(30)
        .min(Duration::from_secs(1).max(remaining / 10))
        .min(remaining)
}

/// Renews `credential` from `source` until `cancel` fires or renewal is
/// refused for good.
pub async fn renew_until_cancelled(
    credential: Arc<ActorCredential>,
    source: Arc<dyn CertificateSource>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut delay = renewal_delay(credential.remaining());
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = credential.renew(source.as_ref()) => r,
        };
        delay = match result {
            Ok(()) => renewal_delay(credential.remaining()),
            Err(CredentialError::Mint { source: e, .. }) if e.is_terminal() => {
                tracing::error!(actor = %credential.actor(), error = %e,
                    "actor certificate renewal was denied; blocking new egress");
                credential.revoke();
                return;
            }
            Err(e) => {
                let remaining = credential.remaining();
                if remaining.is_zero() {
                    tracing::warn!(actor = %credential.actor(), error = %e,
                        "actor certificate expired; blocking new egress until renewal succeeds");
                } else {
                    tracing::warn!(actor = %credential.actor(), error = %e, "actor certificate renewal failed");
                }
                retry_delay(remaining)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert_source::LocalCaSource;
    use crate::pki::CertificateAuthority;

    fn issuers_of(credential: &ActorCredential) -> Arc<[CertificateDer<'static>]> {
        let current = credential.current.read().expect("lock");
        current.as_ref().expect("a certificate").issuers.clone()
    }

    #[test]
    fn credentials_of_one_ca_share_its_certificate_and_present_the_whole_chain() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let ca = Arc::new(CertificateAuthority::new("actor ca").expect("ca"));
        let source = LocalCaSource::new(ca.clone());
        let mint = |name: &str| {
            let actor = ActorRef::new("team-a", name, format!("uid-{name}")).expect("actor");
            runtime
                .block_on(ActorCredential::mint(actor, &source, Clock::new()))
                .expect("mint")
        };
        let (a, b) = (mint("one"), mint("two"));
        assert!(Arc::ptr_eq(&issuers_of(&a), &issuers_of(&b)));
        for credential in [&a, &b] {
            let key = credential.resolve(&[], &[]).expect("a valid certificate");
            assert_eq!(key.cert.len(), 2, "the leaf and its issuer");
            assert_eq!(key.cert[1], ca.cert_der());
            let leaf = &credential.current.read().expect("lock");
            assert_eq!(key.cert[0], leaf.as_ref().expect("a certificate").leaf);
        }
        // Another CA's chain is its own, and a renewal keeps sharing.
        let other = Arc::new(CertificateAuthority::new("other ca").expect("ca"));
        let c = runtime
            .block_on(ActorCredential::mint(
                ActorRef::new("team-a", "three", "uid-three").expect("actor"),
                &LocalCaSource::new(other),
                Clock::new(),
            ))
            .expect("mint");
        assert!(!Arc::ptr_eq(&issuers_of(&a), &issuers_of(&c)));
        runtime.block_on(a.renew(&source)).expect("renew");
        assert!(Arc::ptr_eq(&issuers_of(&a), &issuers_of(&b)));
    }

    #[test]
    fn renewal_happens_at_ninety_percent_of_what_remains() {
        assert_eq!(
            renewal_delay(Duration::from_secs(3600)),
            Duration::from_secs(3240)
        );
    }

    #[test]
    fn retry_delay_follows_the_reference_formula() {
        let s = Duration::from_secs;
        assert_eq!(retry_delay(s(3600)), s(30));
        assert_eq!(retry_delay(s(100)), s(10));
        assert_eq!(retry_delay(s(5)), s(1));
        assert_eq!(
            retry_delay(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        for _ in 0..100 {
            let d = retry_delay(Duration::ZERO);
            assert!(d >= s(25) && d < s(35), "{d:?}");
        }
    }
}
