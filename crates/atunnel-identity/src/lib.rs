//! Actor and workload identities for atunnel: SPIFFE IDs and the
//! actor-identity extension ([`identity`]), a throwaway PKI shaped like the
//! cluster's ([`pki`]), where actor certificates come from ([`cert_source`]),
//! an actor's egress credential and its renewal ([`credential`], on the
//! wall clock of [`clock`]), PEM files ([`pem_files`]), and rustls verifiers that
//! check identities after the chain ([`verifier`]).
//!
//! Depends on no other atunnel crate; the TLS, CONNECT, gateway and tunnel
//! crates depend on it.

pub mod cert_source;
pub mod clock;
pub mod credential;
pub mod identity;
pub mod pem_files;
pub mod pki;
pub mod verifier;

pub use cert_source::{CertificateSource, LocalCaSource, MintError, RefusalCode, check_minted};
pub use identity::{ActorIdentity, ActorRef, IdentityError, verify_actor_leaf};
pub use pki::{CertificateAuthority, IssuedCert, PkiError, Usage};
pub use verifier::{
    VerifierError, actor_client_verifier, spiffe_client_verifier, spiffe_server_verifier,
};
