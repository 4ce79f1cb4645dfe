//! The client's pool of HTTP/2 connections to the gateway: which one has
//! room for another tunnel, the stream slot a tunnel holds, and each
//! connection's retirement once idle or dead. Dialling adds to it; it
//! never dials.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use crate::flood::FloodCount;

use super::GatewayClient;

/// A pooled HTTP/2 connection to the gateway.
pub(super) struct H2Conn {
    pub(super) send: h2::client::SendRequest<Bytes>,
    pub(super) use_: Arc<ConnUse>,
    /// Becomes true once the gateway's SETTINGS have been applied, so
    /// `current_max_send_streams` is the gateway's limit and not our guess.
    pub(super) settled: watch::Receiver<bool>,
    /// The client certificate it was authenticated with expires here; no new
    /// streams after that, so expiry is enforced on pooled connections too.
    pub(super) cert_not_after: Option<SystemTime>,
}

impl H2Conn {
    fn has_capacity(&self, now: SystemTime) -> bool {
        // Until the gateway's limit is known a fresh connection takes one
        // stream: more could exceed the limit, and each would be refused
        // (sent before the SETTINGS arrived) or queued inside h2 until some
        // stream ends (sent after), which for a tunnel may be never.
        let limit = if self.is_settled() {
            self.send.current_max_send_streams()
        } else {
            1
        };
        !self.use_.dead.load(Ordering::Acquire)
            && self.cert_not_after.is_none_or(|t| now < t)
            && self.use_.streams.load(Ordering::Acquire) < limit
    }

    fn is_settled(&self) -> bool {
        *self.settled.borrow()
    }

    /// Called under the pool's lock, so it cannot race the idle retirement.
    pub(super) fn claim(&self) -> StreamSlot {
        self.use_.claims.fetch_add(1, Ordering::AcqRel);
        self.use_.streams.fetch_add(1, Ordering::AcqRel);
        StreamSlot(self.use_.clone())
    }
}

/// How a pooled connection is used, shared by its tunnels' slots and its
/// connection task.
#[derive(Default)]
pub(super) struct ConnUse {
    pub(super) streams: AtomicUsize,
    /// Streams ever claimed: the idle timer knows from it whether a tunnel
    /// came and went while it slept.
    claims: AtomicU64,
    pub(super) dead: AtomicBool,
    /// Woken when the last stream ends.
    now_idle: Notify,
}

impl ConnUse {
    async fn until_idle(&self) {
        loop {
            let notified = self.now_idle.notified();
            if self.streams.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Holds one of a pooled connection's stream slots for a tunnel's life.
pub struct StreamSlot(Arc<ConnUse>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.now_idle.notify_one();
        }
    }
}

/// What the pool has for a new stream.
pub(super) enum Pooled {
    Slot(Arc<H2Conn>, StreamSlot),
    /// No room now, but this fresh connection's limit is about to be known.
    Settling(watch::Receiver<bool>),
    Full,
}

/// The pooled connections and what became of those that left.
#[derive(Default)]
pub(super) struct Pool {
    pub(super) conns: Mutex<Vec<Arc<H2Conn>>>,
    pub(super) idle_closed: AtomicU64,
    pub(super) dead_retired: AtomicU64,
    pub(super) floods: Arc<FloodCount>,
}

impl GatewayClient {
    /// Claims a stream slot on a pooled connection with room. Claiming
    /// under the pool's lock keeps concurrent opens from all taking the last
    /// slot.
    pub(super) fn pooled(&self) -> Pooled {
        let now = self.credential.clock().now();
        let mut pool = self.pool.conns.lock().expect("pool lock poisoned");
        // Drop dead connections and those whose certificate expired once
        // their last stream is gone.
        pool.retain(|c| {
            !c.use_.dead.load(Ordering::Acquire)
                && (c.cert_not_after.is_none_or(|t| now < t)
                    || c.use_.streams.load(Ordering::Acquire) > 0)
        });
        if let Some(conn) = pool.iter().find(|c| c.has_capacity(now)) {
            return Pooled::Slot(conn.clone(), conn.claim());
        }
        match pool.iter().find(|c| !c.is_settled()) {
            Some(conn) => Pooled::Settling(conn.settled.clone()),
            None => Pooled::Full,
        }
    }

    /// Marks `conn` dead and takes it out of the pool: no new tunnel goes
    /// on it; those it carries go on as long as it does.
    pub(super) fn retire_dead(&self, conn: &Arc<H2Conn>) {
        if !conn.use_.dead.swap(true, Ordering::AcqRel) {
            self.pool.dead_retired.fetch_add(1, Ordering::Relaxed);
        }
        self.forget(conn);
    }

    pub(super) fn forget(&self, conn: &Arc<H2Conn>) {
        self.pool
            .conns
            .lock()
            .expect("pool lock poisoned")
            .retain(|c| !Arc::ptr_eq(&c.use_, &conn.use_));
    }
}

/// Takes a pooled connection out of the pool once no tunnel has used it for
/// `after`, so an actor that went quiet stops holding a gateway connection
/// (its TLS session and h2 state) on both ends.
pub(super) struct IdleRetirement {
    pub(super) use_: Arc<ConnUse>,
    pub(super) pool: Weak<Pool>,
    pub(super) after: Duration,
}

impl IdleRetirement {
    /// Out of the pool now, whatever it carries, counted as dead unless it
    /// already was out.
    pub(super) fn retire_dead(&self) {
        let first = !self.use_.dead.swap(true, Ordering::AcqRel);
        if let Some(pool) = self.pool.upgrade() {
            self.take_out(&mut pool.conns.lock().expect("pool lock poisoned"));
            if first {
                pool.dead_retired.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn take_out(&self, pool: &mut Vec<Arc<H2Conn>>) {
        pool.retain(|c| !Arc::ptr_eq(&c.use_, &self.use_));
    }

    pub(super) async fn retire(&self) {
        loop {
            self.use_.until_idle().await;
            let claims = self.use_.claims.load(Ordering::Acquire);
            tokio::time::sleep(self.after).await;
            let Some(pool) = self.pool.upgrade() else {
                return;
            };
            // Claims are made under this lock: once the connection is marked
            // dead here, no tunnel can take a slot on it.
            let mut conns = pool.conns.lock().expect("pool lock poisoned");
            if self.use_.streams.load(Ordering::Acquire) == 0
                && self.use_.claims.load(Ordering::Acquire) == claims
            {
                self.use_.dead.store(true, Ordering::Release);
                self.take_out(&mut conns);
                pool.idle_closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}
