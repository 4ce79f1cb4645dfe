//! The one accept loop every atunnel listener runs: egress listeners in the
//! sandboxes, ingress HTTPS and CONNECT, the gateway, /stats.
//!
//! It backs off when accept fails (out of descriptors, say: the peer waits in
//! the backlog instead of the loop spinning a core), can cap the connections
//! it has open (a permit per connection, taken before accepting, so a capped
//! listener leaves the next peer in the backlog), can pace accepts after
//! refusals ([`RefusalPace`]), tracks every connection
//! task it spawns, and at cancellation stops accepting, closes the listening
//! socket and waits for those tasks. A connection task is expected to end
//! soon after the same cancellation (each protocol decides how: at once, or
//! gracefully).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Pause after a failed accept.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The counters of the listeners of one server, shared by them all; read into [`ListenerStats`].
#[derive(Debug, Default)]
pub struct ListenerCounters {
    accepted: AtomicU64,
    accept_errors: AtomicU64,
    /// Size of one connection's task future (the task's one heap
    /// allocation holds it for the connection's life), as last spawned.
    future_bytes: AtomicUsize,
}

/// What [`ListenerCounters`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerStats {
    pub accepted_total: u64,
    pub accept_errors_total: u64,
    pub connection_future_bytes: usize,
}

impl ListenerCounters {
    pub fn stats(&self) -> ListenerStats {
        ListenerStats {
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

/// Bounds the refusals one peer can make a listener spend CPU on: a token
/// bucket each refused connection spends one token from, refilled at
/// `per_second` up to one second's worth. While it is empty the listener
/// accepts nothing, so connections past the rate wait in the kernel's
/// backlog (and past that their SYNs are dropped) instead of each costing
/// an accept and a reset. Accepts that are admitted spend nothing.
#[derive(Debug)]
pub struct RefusalPace {
    per_second: f64,
    bucket: Mutex<Bucket>,
    paused: AtomicU64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RefusalPace {
    /// `per_second` refusals a second, and as many at once after a quiet
    /// second; 0 does not pace.
    pub fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second);
        Self {
            per_second,
            bucket: Mutex::new(Bucket {
                tokens: per_second,
                at: Instant::now(),
            }),
            paused: AtomicU64::new(0),
        }
    }

    /// A connection was refused.
    pub fn refused(&self) {
        if self.per_second > 0.0 {
            self.refill().tokens -= 1.0;
        }
    }

    /// How long to wait before the next accept, if the bucket is empty.
    fn wait(&self) -> Option<Duration> {
        if self.per_second == 0.0 {
            return None;
        }
        let bucket = self.refill();
        (bucket.tokens < 0.0).then(|| Duration::from_secs_f64(-bucket.tokens / self.per_second))
    }

    fn refill(&self) -> std::sync::MutexGuard<'_, Bucket> {
        let mut bucket = self.bucket.lock().expect("pace lock poisoned");
        let now = Instant::now();
        let earned = now.duration_since(bucket.at).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + earned).min(self.per_second);
        bucket.at = now;
        bucket
    }

    /// Times the listener stopped accepting to keep to the rate.
    pub fn paused_total(&self) -> u64 {
        self.paused.load(Ordering::Relaxed)
    }
}

/// A bound listener, ready to serve.
pub struct Listener {
    /// Closed (taken) when serving stops, before its tasks are waited for.
    tcp: Option<TcpListener>,
    /// Names the listener in logs.
    name: &'static str,
    cap: Option<Arc<Semaphore>>,
    pace: Option<Arc<RefusalPace>>,
}

impl Listener {
    pub fn new(tcp: TcpListener, name: &'static str) -> Self {
        Self {
            tcp: Some(tcp),
            name,
            cap: None,
            pace: None,
        }
    }

    /// Accepts no faster than `pace` allows once its owner's refusals have
    /// spent it.
    pub fn with_refusal_pace(mut self, pace: Arc<RefusalPace>) -> Self {
        self.pace = Some(pace);
        self
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
    ///
    /// This future is held, idle, by every listener for its life (three per
    /// sandbox), so what it waits on while idle is kept small: the accept
    /// is polled (its waker lives in the socket's registration, where
    /// `accept()`'s future would carry 184 B of its own), and the waits
    /// that are rare (pacing, the cap, backoff, the end) are boxed.
    ///
    /// Not an `async fn`: one keeps a second copy of its arguments in its
    /// future for as long as it runs (rust-lang/rust#62958); the block
    /// below uses them where they were captured. The listener is borrowed,
    /// not moved in, for the same reason: a caller that owns it in its own
    /// future would otherwise hold it twice.
    // The lint's `async fn` is exactly what this avoids.
    #[allow(clippy::manual_async_fn)]
    pub fn serve<'a, F, Fut>(
        &'a mut self,
        cancel: &'a CancellationToken,
        stats: &'a ListenerCounters,
        mut accept: F,
    ) -> impl Future<Output = ()> + 'a
    where
        F: FnMut(TcpStream, SocketAddr) -> Option<Fut> + 'a,
        Fut: Future<Output = ()> + Send + 'static,
    {
        async move {
            let Some(tcp) = &self.tcp else {
                return;
            };
            let tasks = TaskTracker::new();
            let mut back_off = false;
            loop {
                // Here rather than where the error is seen, so that the
                // failed accept's result is not held across the wait.
                if std::mem::take(&mut back_off) {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)) => {}
                    }
                }
                if let Some(pace) = &self.pace
                    && let Some(wait) = pace.wait()
                {
                    pace.paused.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break,
                        _ = Box::pin(tokio::time::sleep(wait)) => {}
                    }
                }
                let permit = match &self.cap {
                    Some(cap) => match cap.clone().try_acquire_owned() {
                        Ok(p) => Some(p),
                        // Closed: the owner refuses everything from now on.
                        Err(TryAcquireError::Closed) => break,
                        Err(TryAcquireError::NoPermits) => tokio::select! {
                            biased;
                            _ = cancel.cancelled() => break,
                            permit = Box::pin(cap.clone().acquire_owned()) => match permit {
                                Ok(p) => Some(p),
                                Err(_) => break,
                            },
                        },
                    },
                    None => None,
                };
                let accepted = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    a = std::future::poll_fn(|cx| tcp.poll_accept(cx)) => a,
                };
                let (tcp, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(listener = self.name, error = %e, "accept failed; backing off");
                        back_off = true;
                        continue;
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
            self.tcp = None;
            tasks.close();
            Box::pin(tasks.wait()).await;
        }
    }
}
