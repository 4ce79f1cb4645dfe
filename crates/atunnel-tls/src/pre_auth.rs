//! How many connections a TLS listener holds before they have
//! authenticated. A flood of slow or half-open handshakes costs a
//! descriptor, a task and handshake state each for up to the handshake
//! timeout; past a cap, new ones are closed at once. The cap is per source
//! address as well as in total, so a flood from some addresses cannot take
//! the places a router from another needs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    by_source: Mutex<(usize, HashMap<IpAddr, usize>)>,
    refused: AtomicU64,
}

/// What [`PreAuthGate`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PreAuthFigures {
    pub handshaking: usize,
    pub refused_total: u64,
}

impl PreAuthGate {
    pub fn new(limits: PreAuthLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            ..Self::default()
        })
    }

    /// A place for a connection from `source` until it has authenticated
    /// (the permit is dropped), or `None` (counted): close it at once.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<PreAuthPermit> {
        let source = source.to_canonical();
        let mut held = self.by_source.lock().expect("pre-auth lock poisoned");
        let (total, by_source) = &mut *held;
        let from = by_source.get(&source).copied().unwrap_or(0);
        if *total >= self.limits.total || from >= self.limits.per_source {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *total += 1;
        by_source.insert(source, from + 1);
        Some(PreAuthPermit {
            gate: self.clone(),
            source,
        })
    }

    pub fn figures(&self) -> PreAuthFigures {
        PreAuthFigures {
            handshaking: self.by_source.lock().expect("pre-auth lock poisoned").0,
            refused_total: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// A connection's place in its listener's pre-authentication cap.
#[derive(Debug)]
pub struct PreAuthPermit {
    gate: Arc<PreAuthGate>,
    source: IpAddr,
}

impl Drop for PreAuthPermit {
    fn drop(&mut self) {
        let mut held = self.gate.by_source.lock().expect("pre-auth lock poisoned");
        let (total, by_source) = &mut *held;
        *total -= 1;
        // Addresses with nothing in progress are forgotten: the map holds
        // at most `total` entries.
        if let Some(n) = by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_at_its_cap_is_refused_and_another_is_not() {
        let gate = PreAuthGate::new(PreAuthLimits {
            total: 3,
            per_source: 2,
        });
        let (a, b, c) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let held = [gate.admit(a).unwrap(), gate.admit(a).unwrap()];
        assert!(gate.admit(a).is_none(), "a third from one source");
        let other = gate.admit(b).unwrap();
        assert!(gate.admit(c).is_none(), "past the total");
        assert_eq!(
            gate.figures(),
            PreAuthFigures {
                handshaking: 3,
                refused_total: 2
            }
        );
        drop(held);
        drop(other);
        assert_eq!(gate.figures().handshaking, 0);
        assert!(
            gate.by_source.lock().unwrap().1.is_empty(),
            "sources forgotten"
        );
        assert!(gate.admit(a).is_some());
    }
}
