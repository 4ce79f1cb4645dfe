//! Actor and workload identities for atunnel: SPIFFE IDs and the
//! actor-identity extension ([`identity`]), a throwaway PKI shaped like the
//! cluster's ([`pki`]), where actor certificates come from ([`cert_source`]),
//! and rustls verifiers that check identities after the chain ([`verifier`]).

pub mod cert_source;
pub mod identity;
pub mod pki;
pub mod verifier;

pub use cert_source::{CertificateSource, LocalCaSource, MintError, RefusalCode, check_minted};
pub use identity::{ActorIdentity, ActorRef, IdentityError, verify_actor_leaf};
pub use pki::{CertificateAuthority, IssuedCert, PkiError, Usage};
pub use verifier::{
    VerifierError, actor_client_verifier, spiffe_client_verifier, spiffe_server_verifier,
};
