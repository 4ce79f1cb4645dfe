//! Sandboxes an earlier atunnel left: a process killed (OOM, crash,
//! SIGKILL) leaves its namespaces under `/run/netns`, with their veth pairs
//! and nftables tables, and the actors in them. The supervisor starts a new
//! process, and the worker serves the same actors again soon after.
//!
//! At start the process takes the prefix's lock (so two live processes
//! never remove each other's sandboxes; the kernel releases a dead one's)
//! and lists the names under its prefix. ServeSandbox claims an actor's
//! pair and adopts it ([`atunnel_sandbox::SandboxNetwork::adopt_or_create`]);
//! what no ServeSandbox claims within the grace period, and what is still
//! unclaimed at shutdown, is removed.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use atunnel_sandbox::NsExecutor;
use atunnel_sandbox::sandbox::gateway_ns_name;

/// How long a leftover sandbox waits for ServeSandbox before it is
/// removed: a worker re-serves its actors within seconds of a restart; a
/// few minutes covers a worker that restarts too.
pub const DEFAULT_LEFTOVER_GRACE: Duration = Duration::from_secs(300);

/// Where the prefixes' lock files live: beside the control socket, on a
/// path the node shares (the manifest's hostPath), so processes in two
/// containers see one lock.
pub const LOCK_DIR: &str = "/run/atunnel";

#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    #[error(
        "netns prefix {0:?}: with sandboxes, the prefix must be 1 to 200 bytes with no '/' (every name under it is this process's to remove)"
    )]
    BadPrefix(String),
    #[error("netns prefix lock {path}: {op}: {source}")]
    Lock {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another live atunnel holds the lock of netns prefix {prefix:?} ({path}); give this one another --netns-prefix"
    )]
    Locked { prefix: String, path: PathBuf },
    #[error("listing /run/netns: {0}")]
    List(#[source] std::io::Error),
}

/// Counts for /stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeftoverStats {
    /// Namespaces found at start that no ServeSandbox has claimed yet.
    pub pending: u64,
    /// Sandboxes ServeSandbox adopted (at least one namespace of the pair
    /// was left by an earlier process).
    pub adopted_total: u64,
    /// Leftover namespaces removed unclaimed (after the grace period, or
    /// at shutdown).
    pub removed_total: u64,
}

/// The prefix's lock and the leftovers found under it.
pub(crate) struct Leftovers {
    /// Held (flock) for the process's life; closed by the kernel when it dies.
    _lock: File,
    /// Names found at start and not yet claimed or removed. An async lock:
    /// a removal pass holds it while it deletes, so a claim that comes
    /// meanwhile waits and then builds afresh.
    pending: tokio::sync::Mutex<BTreeSet<String>>,
    pending_count: AtomicU64,
    adopted: AtomicU64,
    removed: AtomicU64,
}

impl Leftovers {
    /// Takes the prefix's lock and lists what an earlier process left.
    pub(crate) fn claim(prefix: &str) -> Result<Self, LeftoverError> {
        if prefix.is_empty() || prefix.len() > 200 || prefix.contains(['/', '\0']) {
            return Err(LeftoverError::BadPrefix(prefix.to_string()));
        }
        let path = Path::new(LOCK_DIR).join(format!("netns-{prefix}.lock"));
        let err = |op| {
            let path = path.clone();
            move |source| LeftoverError::Lock { path, op, source }
        };
        std::fs::create_dir_all(LOCK_DIR).map_err(err("create its folder"))?;
        // Never removed: unlinking a lock file lets two processes lock two
        // different files of one name.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err("open"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LeftoverError::Locked {
                    prefix: prefix.to_string(),
                    path,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(err("lock")(e)),
        }
        let names = atunnel_sandbox::netns::list_prefixed(prefix).map_err(LeftoverError::List)?;
        if !names.is_empty() {
            tracing::info!(
                count = names.len(),
                names = ?names,
                "namespaces an earlier process left; ServeSandbox adopts its actors', the rest go"
            );
        }
        Ok(Self {
            _lock: lock,
            pending_count: AtomicU64::new(names.len() as u64),
            pending: tokio::sync::Mutex::new(names.into_iter().collect()),
            adopted: AtomicU64::new(0),
            removed: AtomicU64::new(0),
        })
    }

    /// Takes `runtime` and its gateway namespace off the list, so no
    /// removal pass touches them: ServeSandbox is about to adopt them.
    pub(crate) async fn take(&self, runtime: &str) {
        let mut pending = self.pending.lock().await;
        for name in [runtime.to_string(), gateway_ns_name(runtime)] {
            if pending.remove(&name) {
                self.pending_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn adopted(&self) {
        self.adopted.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes every leftover still unclaimed.
    pub(crate) async fn remove_unclaimed(&self, exec: &NsExecutor, why: &'static str) {
        let mut pending = self.pending.lock().await;
        for name in std::mem::take(&mut *pending) {
            self.pending_count.fetch_sub(1, Ordering::Relaxed);
            match exec.delete(&name).await {
                Ok(()) => {
                    self.removed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        netns = name,
                        why,
                        "removed a namespace an earlier process left"
                    );
                }
                Err(e) => tracing::warn!(netns = name, error = %e, "removing a leftover namespace"),
            }
        }
    }

    /// After `grace` (or never, if `cancel` comes first), removes what no
    /// ServeSandbox claimed.
    pub(crate) async fn reap_after(
        self: std::sync::Arc<Self>,
        exec: NsExecutor,
        grace: Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = tokio::time::sleep(grace) => {
                self.remove_unclaimed(&exec, "unclaimed past the grace period").await;
            }
        }
    }

    pub(crate) fn stats(&self) -> LeftoverStats {
        LeftoverStats {
            pending: self.pending_count.load(Ordering::Relaxed),
            adopted_total: self.adopted.load(Ordering::Relaxed),
            removed_total: self.removed.load(Ordering::Relaxed),
        }
    }
}
