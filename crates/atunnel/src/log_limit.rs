//! Warnings about one actor, rate limited: an actor whose every tunnel
//! fails (a gateway refusing it, a flood of connects) must not flood the
//! log, nor cost the tunnel a log line per failure. Each actor gets
//! [`PER_MINUTE`] warnings a minute; the rest are counted, and the next
//! warning logged says how many were left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Warnings logged per actor per window.
pub const PER_MINUTE: u32 = 10;
const WINDOW: Duration = Duration::from_secs(60);

/// One actor's warning budget.
#[derive(Debug, Default)]
pub(crate) struct LogLimit(Mutex<Window>);

#[derive(Debug, Default)]
struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogLimit {
    /// Whether a warning may be logged now, with how many were left out
    /// since the last one that was.
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.0.lock().expect("log limit lock poisoned");
        if w.started.is_none_or(|t| now.duration_since(t) >= WINDOW) {
            w.started = Some(now);
            w.logged = 0;
        }
        if w.logged >= PER_MINUTE {
            w.suppressed += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_warnings_are_counted_and_reported_in_the_next_window() {
        let limit = LogLimit::default();
        let t0 = Instant::now();
        for _ in 0..PER_MINUTE {
            assert_eq!(limit.admit_at(t0), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(limit.admit_at(t0 + Duration::from_secs(30)), None);
        }
        assert_eq!(
            limit.admit_at(t0 + WINDOW),
            Some(5),
            "the next says how many"
        );
        assert_eq!(limit.admit_at(t0 + WINDOW), Some(0));
    }
}
