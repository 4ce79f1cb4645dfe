//! How many connections a TLS listener holds before they have
//! authenticated. A flood of slow or half-open handshakes costs a
//! descriptor, a task and handshake state each for up to the handshake
//! timeout, so their number is capped per source address and in total.
//! Past a source's cap its new connections are closed at once, so a flood
//! from a few addresses cannot take the places a router from another
//! needs. Past the total cap (a flood from many addresses) the OLDEST
//! handshake is ended to make room, not the newcomer: a router's handshake
//! takes a round trip and well under a millisecond, so a flood would have
//! to open a whole cap's worth of connections within that time to push it
//! out, while refusing newcomers would let a slow flood that reached the
//! cap once lock every router out for a handshake timeout.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Default of [`PreAuthLimits::total`]: handshakes in progress at once on
/// one listener. A full TLS 1.3 handshake takes a round trip and well
/// under a millisecond of CPU, so a router needs few at a time; 1,024 of
/// them hold some 40 MiB at worst.
pub const DEFAULT_MAX_HANDSHAKING: usize = 1024;

/// Default of [`PreAuthLimits::per_source`]: handshakes in progress at
/// once from one source address.
pub const DEFAULT_MAX_HANDSHAKING_PER_SOURCE: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreAuthLimits {
    pub total: usize,
    pub per_source: usize,
}

impl Default for PreAuthLimits {
    fn default() -> Self {
        Self {
            total: DEFAULT_MAX_HANDSHAKING,
            per_source: DEFAULT_MAX_HANDSHAKING_PER_SOURCE,
        }
    }
}

/// One listener's (or several sharing it) connections not yet
/// authenticated.
#[derive(Debug, Default)]
pub struct PreAuthGate {
    limits: PreAuthLimits,
    held: Mutex<Held>,
    refused: AtomicU64,
    evicted: AtomicU64,
}

/// The handshakes in progress: by admission order (the first is the
/// oldest), and how many each source has.
#[derive(Debug, Default)]
struct Held {
    next: u64,
    by_age: BTreeMap<u64, (IpAddr, Arc<Notify>)>,
    by_source: HashMap<IpAddr, usize>,
}

impl Held {
    /// Forgets handshake `id`, if it is still held.
    fn remove(&mut self, id: u64) -> Option<Arc<Notify>> {
        let (source, evict) = self.by_age.remove(&id)?;
        // Addresses with nothing in progress are forgotten: the map holds
        // at most `total` entries.
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
        Some(evict)
    }
}

/// What [`PreAuthGate`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreAuthStats {
    pub handshaking: usize,
    /// New connections closed at once: their source was at its cap.
    pub refused_total: u64,
    /// Handshakes ended to make room for a newer one at the total cap.
    pub evicted_total: u64,
}

impl PreAuthGate {
    pub fn new(limits: PreAuthLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            ..Self::default()
        })
    }

    /// A place for a connection from `source` until it has authenticated
    /// (the permit is dropped), or `None` (counted): close it at once. At
    /// the total cap the oldest handshake is ended instead.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<PreAuthPermit> {
        let source = source.to_canonical();
        let mut held = self.held.lock().expect("pre-auth lock poisoned");
        if held.by_source.get(&source).copied().unwrap_or(0) >= self.limits.per_source {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if held.by_age.len() >= self.limits.total {
            let oldest = *held.by_age.keys().next()?;
            if let Some(evict) = held.remove(oldest) {
                // Stored if its task is not waiting yet: it ends at its
                // next poll either way.
                evict.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = held.next;
        held.next += 1;
        let evict = Arc::new(Notify::new());
        held.by_age.insert(id, (source, evict.clone()));
        *held.by_source.entry(source).or_insert(0) += 1;
        Some(PreAuthPermit {
            gate: self.clone(),
            id,
            evict,
        })
    }

    pub fn stats(&self) -> PreAuthStats {
        PreAuthStats {
            handshaking: self
                .held
                .lock()
                .expect("pre-auth lock poisoned")
                .by_age
                .len(),
            refused_total: self.refused.load(Ordering::Relaxed),
            evicted_total: self.evicted.load(Ordering::Relaxed),
        }
    }
}

/// A connection's place in its listener's pre-authentication cap.
#[derive(Debug)]
pub struct PreAuthPermit {
    gate: Arc<PreAuthGate>,
    id: u64,
    evict: Arc<Notify>,
}

impl PreAuthPermit {
    /// Runs `handshake` holding the place, or `None` if it was ended first
    /// to make room for a newer one; the place is given back either way.
    pub async fn run<F: Future>(self, handshake: F) -> Option<F::Output> {
        tokio::select! {
            out = handshake => Some(out),
            () = self.evict.notified() => None,
        }
    }
}

impl Drop for PreAuthPermit {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().expect("pre-auth lock poisoned");
        held.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn a_source_at_its_cap_is_refused_and_another_is_not() {
        let gate = PreAuthGate::new(PreAuthLimits {
            total: 3,
            per_source: 2,
        });
        let held = [
            gate.admit(ip("10.0.0.1")).unwrap(),
            gate.admit(ip("10.0.0.1")).unwrap(),
        ];
        assert!(
            gate.admit(ip("10.0.0.1")).is_none(),
            "a third from one source"
        );
        let other = gate.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(
            gate.stats(),
            PreAuthStats {
                handshaking: 3,
                refused_total: 1,
                evicted_total: 0,
            }
        );
        drop(held);
        drop(other);
        assert_eq!(gate.stats().handshaking, 0);
        let held = gate.held.lock().unwrap();
        assert!(
            held.by_source.is_empty() && held.by_age.is_empty(),
            "forgotten"
        );
        drop(held);
        assert!(gate.admit(ip("10.0.0.1")).is_some());
    }

    #[tokio::test]
    async fn at_the_total_cap_the_oldest_handshake_ends_and_the_newcomer_runs() {
        let gate = PreAuthGate::new(PreAuthLimits {
            total: 2,
            per_source: 2,
        });
        let oldest = gate.admit(ip("10.0.0.1")).unwrap();
        let second = gate.admit(ip("10.0.0.2")).unwrap();
        let newcomer = gate.admit(ip("10.0.0.3")).expect("admitted at the cap");
        assert_eq!(
            gate.stats(),
            PreAuthStats {
                handshaking: 2,
                refused_total: 0,
                evicted_total: 1,
            }
        );
        // The oldest's handshake ends at once, though it would never finish.
        assert_eq!(oldest.run(std::future::pending::<()>()).await, None);
        assert_eq!(gate.stats().handshaking, 2, "its place was already given");
        assert_eq!(newcomer.run(async { 7 }).await, Some(7));
        assert_eq!(second.run(async { 8 }).await, Some(8));
        assert_eq!(gate.stats().handshaking, 0);
        assert!(gate.held.lock().unwrap().by_source.is_empty());
    }
}
