//! Sandbox networking for atunnel: named network namespaces, the veth pair
//! between an actor's runtime namespace and its gateway namespace, the
//! nftables redirect, and sockets created inside a namespace without the
//! async runtime's threads ever changing namespace.
//!
//! Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
//!
//! Depends on no other atunnel crate (its tests use `atunnel-core`'s
//! original-destination reader); the tunnel and the bench depend on it.

pub mod link;
pub mod netns;
pub mod nft;
pub mod sandbox;

pub use netns::{NetNs, NetnsError, NsExecutor};
pub use sandbox::{SandboxError, SandboxNetwork};

/// Panics with a clear message unless running as root: root-only tests must
/// fail, not skip, where they cannot run.
pub fn require_root(what: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{what} needs root (network namespaces, veth, nftables); run the tests as root"
    );
}
