//! The one accept loop every atunnel listener runs: egress listeners in the
//! sandboxes, ingress HTTPS and CONNECT, the gateway, /stats.
//!
//! It backs off when accept fails (out of descriptors, say: the peer waits in
//! the backlog instead of the loop spinning a core), can cap the connections
//! it has open (a permit per connection, taken before accepting, so a capped
//! listener leaves the next peer in the backlog), tracks every connection
//! task it spawns, and at cancellation stops accepting, closes the listening
//! socket and waits for those tasks. A connection task is expected to end
//! soon after the same cancellation (each protocol decides how: at once, or
//! gracefully).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Pause after a failed accept.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Figures of the listeners of one server, shared by them all.
#[derive(Debug, Default)]
pub struct ListenerStats {
    accepted: AtomicU64,
    accept_errors: AtomicU64,
    /// Size of one connection's task future (the task's one heap
    /// allocation holds it for the connection's life), as last spawned.
    future_bytes: AtomicUsize,
}

/// What [`ListenerStats`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ListenerFigures {
    pub accepted_total: u64,
    pub accept_errors_total: u64,
    pub connection_future_bytes: usize,
}

impl ListenerStats {
    pub fn figures(&self) -> ListenerFigures {
        ListenerFigures {
            accepted_total: self.accepted.load(Ordering::Relaxed),
            accept_errors_total: self.accept_errors.load(Ordering::Relaxed),
            connection_future_bytes: self.future_bytes.load(Ordering::Relaxed),
        }
    }

    /// Size of one connection's task future.
    pub fn connection_future_bytes(&self) -> usize {
        self.future_bytes.load(Ordering::Relaxed)
    }

    fn note_future<F>(&self, task: &F) {
        self.future_bytes
            .store(std::mem::size_of_val(task), Ordering::Relaxed);
    }
}

/// A bound listener, ready to serve.
pub struct Listener {
    tcp: TcpListener,
    /// Names the listener in logs.
    name: &'static str,
    cap: Option<Arc<Semaphore>>,
}

impl Listener {
    pub fn new(tcp: TcpListener, name: &'static str) -> Self {
        Self {
            tcp,
            name,
            cap: None,
        }
    }

    /// At most as many connections open at once as `cap` has permits
    /// (shared with other listeners holding the same semaphore).
    pub fn with_cap(mut self, cap: Arc<Semaphore>) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Accepts until `cancel`. `accept` decides on each connection: the task
    /// to run it, or `None` to drop it (closed at once). Returns once every
    /// task it spawned has ended.
    pub async fn serve<F, Fut>(
        self,
        cancel: &CancellationToken,
        stats: &ListenerStats,
        mut accept: F,
    ) where
        F: FnMut(TcpStream, SocketAddr) -> Option<Fut>,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let tasks = TaskTracker::new();
        loop {
            let permit = match &self.cap {
                Some(cap) => tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    permit = cap.clone().acquire_owned() => match permit {
                        Ok(p) => Some(p),
                        // Closed: the owner refuses everything from now on.
                        Err(_) => break,
                    },
                },
                None => None,
            };
            let accepted = tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                a = self.tcp.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(listener = self.name, error = %e, "accept failed; backing off");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    }
                }
            };
            stats.accepted.fetch_add(1, Ordering::Relaxed);
            let Some(connection) = accept(tcp, peer) else {
                continue;
            };
            // The task is the connection's future alone unless it holds a
            // permit: every byte of it is kept for the connection's life.
            match permit {
                None => {
                    stats.note_future(&connection);
                    tasks.spawn(connection);
                }
                Some(permit) => {
                    let task = async move {
                        let _permit = permit;
                        connection.await
                    };
                    stats.note_future(&task);
                    tasks.spawn(task);
                }
            }
        }
        drop(self.tcp);
        tasks.close();
        tasks.wait().await;
    }
}
