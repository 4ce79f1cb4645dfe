//! Helpers shared by the integration tests that start the bench's roles.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use atunnel_sandbox::link::Netlink;
use atunnel_sandbox::{NetNs, NsExecutor};

/// The PKI `atunnel-bench pki` writes, in `dir`.
pub fn write_pki(dir: &Path) -> PathBuf {
    let pki = dir.join("pki");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_atunnel-bench"))
        .arg("pki")
        .arg("--out")
        .arg(&pki)
        .stdout(Stdio::null())
        .status()
        .expect("pki runs");
    assert!(status.success(), "pki: {status}");
    pki
}

/// A new namespace `name` with its loopback up.
pub async fn namespace_with_loopback(exec: &NsExecutor, name: &str) -> NetNs {
    let ns = exec.create(name).await.expect("namespace");
    Netlink::open(exec, &ns)
        .await
        .expect("netlink")
        .up("lo")
        .await
        .expect("loopback up");
    ns
}
