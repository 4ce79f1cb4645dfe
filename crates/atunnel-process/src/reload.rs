//! When to re-read a file a process was started with: on SIGHUP, and when
//! the file changes (its mtime, size or inode, checked every poll interval:
//! a swap by rename, as a ConfigMap update does, counts).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// What identifies a file's version; `None` if it cannot be read.
pub type Stamp = Option<(SystemTime, u64, u64)>;

pub fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Calls `reload` with why, on every SIGHUP and every change of `path`
/// seen every `poll` (zero: SIGHUP only), until `cancel`.
pub async fn on_sighup_or_change(
    path: &Path,
    poll: Duration,
    cancel: CancellationToken,
    mut reload: impl FnMut(&'static str),
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "no SIGHUP handler: reloading only when the file changes");
            None
        }
    };
    let mut seen = stamp(path);
    let mut tick = (!poll.is_zero()).then(|| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let why = tokio::select! {
            _ = cancel.cancelled() => return,
            got = async { match &mut hup { Some(h) => h.recv().await, None => std::future::pending().await } } => match got {
                Some(()) => "SIGHUP",
                None => return,
            },
            _ = async { match &mut tick { Some(t) => t.tick().await, None => std::future::pending().await } } => {
                if stamp(path) == seen {
                    continue;
                }
                "the file changed"
            }
        };
        seen = stamp(path);
        reload(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test]
    async fn a_change_of_the_file_triggers_a_reload_and_an_unchanged_file_does_not() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        std::fs::write(&path, "one").expect("write");
        let (tx, rx) = mpsc::channel();
        let cancel = CancellationToken::new();
        let task = {
            let (path, cancel) = (path.clone(), cancel.clone());
            tokio::spawn(async move {
                on_sighup_or_change(&path, Duration::from_millis(20), cancel, |why| {
                    let _ = tx.send(why);
                })
                .await
            })
        };
        // Several polls of an unchanged file: nothing.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err());
        std::fs::write(&path, "two, longer").expect("write");
        let why = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)))
            .await
            .expect("join");
        assert_eq!(why, Ok("the file changed"));
        cancel.cancel();
        task.await.expect("stops when cancelled");
    }
}
