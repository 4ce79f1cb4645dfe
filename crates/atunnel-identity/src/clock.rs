//! Wall-clock time that tests can move.
//!
//! Certificate validity is wall-clock time, but renewal waits on tokio timers.
//! Anchoring the wall clock to tokio's `Instant` once makes both move together,
//! so a test on a paused runtime advances through an hour of certificate
//! lifetime without sleeping. [`Clock::advance`] moves only the wall clock,
//! for tests that also wait on real sockets (where a paused runtime would fire
//! every pending timeout as soon as it idles).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct Clock {
    base_system: SystemTime,
    base_instant: Instant,
    /// Nanoseconds added by [`Clock::advance`], shared by clones.
    skew_ns: Arc<AtomicU64>,
}

impl Clock {
    /// A clock reading the real time now and following tokio's time after.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A clock that reads `start` now.
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            base_system: start,
            base_instant: Instant::now(),
            skew_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn now(&self) -> SystemTime {
        self.base_system
            + self.base_instant.elapsed()
            + Duration::from_nanos(self.skew_ns.load(Ordering::Relaxed))
    }

    /// Moves this clock and its clones forward by `by` (tests only; timers
    /// are not affected).
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.skew_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
