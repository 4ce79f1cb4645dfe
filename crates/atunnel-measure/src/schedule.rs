//! The open-loop scheduler: one rung of load at a fixed rate.
//!
//! Unit `i` of a rung is due at `start + i / rate` and is started then
//! whether or not earlier units have finished. A closed-loop generator (N
//! workers each waiting for its reply before sending the next) slows down
//! when the system under test slows down, so a backlog hides as "less load";
//! here the load stays what the schedule says and a backlog shows up where it
//! belongs, as latency:
//!
//! - **latency** counts from when a unit was *due*, not from when it happened
//!   to start, so time spent queued behind a slow generator or a slow tunnel
//!   is part of it (no coordinated omission);
//! - **dispatch lag** (due → the unit's task actually started running) is its
//!   own series: if it grows the generator, not the tunnel, is behind;
//! - the only bound on concurrency is `max_in_flight`; a unit that comes due
//!   while that many are running is **shed** — counted, not started, not
//!   waited for — so the generator's memory stays bounded when the far side
//!   stops answering.
//!
//! Due times are computed from `i` each time (`start + i / rate`, in whole
//! nanoseconds), never by adding an interval to the previous one, so rounding
//! and late wake-ups never accumulate into drift. When the dispatcher wakes
//! late it starts every unit that is already due at once (and the lag shows).
//!
//! The task that awaits [`run_rung`] is the dispatcher; each unit runs in its
//! own `tokio::spawn`ed task. Dropping the future aborts the rung's units.
//!
//! At the end of the rung, units still running are given [`END_GRACE`]
//! (5 s, from the later of the rung's end and the last dispatch) to finish:
//! long enough for any unit of a healthy rung (whose latencies are well under
//! a second), short enough not to stall a ladder of rungs behind one that has
//! hung. Units still running after that are aborted and counted as errors
//! ("timed out at end of rung"). [`run_rung_with_grace`] takes another grace.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

/// How long units still running at the end of a rung may take before they
/// are aborted and counted as errors.
pub const END_GRACE: Duration = Duration::from_secs(5);

/// The largest value the histograms hold: 60 s in microseconds (larger
/// values are recorded as 60 s).
pub const HISTOGRAM_MAX_US: u64 = 60_000_000;

/// The message of the error counted for a unit aborted after the grace.
pub const TIMED_OUT: &str = "timed out at end of rung";

/// A histogram of microseconds: 1 µs .. 60 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, 3).expect("1..60e6 with 3 digits is valid")
}

/// One step of a load ladder.
#[derive(Clone, Debug, PartialEq)]
pub struct Rung {
    /// Units per second.
    pub rate: f64,
    /// How long units keep coming due.
    pub duration: Duration,
    /// Units running at once beyond which a due unit is shed.
    pub max_in_flight: usize,
}

impl Rung {
    /// How many units the rung schedules: those due in `[0, duration)`.
    /// Zero when the rate is not a positive finite number.
    pub fn units(&self) -> u64 {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return 0;
        }
        let x = self.rate * self.duration.as_secs_f64();
        // `rate * duration` that is a whole number up to rounding noise is
        // that number, not one more.
        let r = x.round();
        if (x - r).abs() < 1e-9 {
            r as u64
        } else {
            x.ceil() as u64
        }
    }

    /// When unit `i` is due, from the rung's start: `i / rate`, rounded to
    /// the nanosecond.
    pub fn due_offset(&self, i: u64) -> Duration {
        Duration::from_nanos(((i as f64) * 1e9 / self.rate).round() as u64)
    }
}

/// What one rung did.
#[derive(Clone, Debug)]
pub struct RungOutcome {
    /// Units per second the schedule offered (the rung's rate).
    pub offered: f64,
    /// Successful completions per second: `completed` over the span from the
    /// first unit's finish to the last's plus one interval (`1 / rate`), or
    /// over the rung's duration if that is longer. When the far side keeps up
    /// that is the offered rate (the constant latency cancels out); when it
    /// falls behind the span stretches and this is the rate it managed.
    pub achieved: f64,
    /// Units spawned.
    pub started: u64,
    /// Units whose work returned `Ok`.
    pub completed: u64,
    /// Units whose work returned `Err`, panicked, or timed out at the end.
    pub errors: u64,
    /// Units that came due while `max_in_flight` were running: not started.
    pub shed: u64,
    /// Microseconds from each completed unit's due time to its finish.
    pub latency: Histogram<u64>,
    /// Microseconds from each started unit's due time to its task running.
    pub dispatch_lag: Histogram<u64>,
    /// From the rung's start until the last unit finished or was given up on.
    pub elapsed: Duration,
    /// The first error message seen, for the report's notes.
    pub first_error: Option<String>,
}

impl RungOutcome {
    /// The 99th percentile of dispatch lag, in microseconds.
    pub fn dispatch_lag_p99_us(&self) -> u64 {
        self.dispatch_lag.value_at_quantile(0.99)
    }
}

/// Runs `work(i)` open-loop for one rung; `work` returns `Ok(())` or
/// `Err(String)`. Units still running at the end get [`END_GRACE`].
pub async fn run_rung<F, Fut>(rung: &Rung, work: F) -> RungOutcome
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    run_rung_with_grace(rung, END_GRACE, work).await
}

/// [`run_rung`] with another end-of-rung grace.
pub async fn run_rung_with_grace<F, Fut>(rung: &Rung, grace: Duration, work: F) -> RungOutcome
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let work = Arc::new(work);
    let units = rung.units();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let lag = Arc::new(Mutex::new(new_histogram()));
    let mut set: JoinSet<Finished> = JoinSet::new();
    let mut tally = Tally::new();
    let mut started = 0u64;
    let mut shed = 0u64;

    let start = Instant::now();
    let mut behind_in_a_row = 0u32;
    for i in 0..units {
        let due = start + rung.due_offset(i);
        if due > Instant::now() {
            behind_in_a_row = 0;
            tokio::time::sleep_until(due).await;
        } else {
            // Catching up: start what is due at once, but let the units'
            // tasks run now and then (matters on a current-thread runtime).
            behind_in_a_row += 1;
            if behind_in_a_row.is_multiple_of(32) {
                tokio::task::yield_now().await;
            }
        }
        while let Some(r) = set.try_join_next() {
            tally.record(r);
        }
        // Only this task increments, so the check cannot race another admit.
        if in_flight.load(Ordering::Acquire) >= rung.max_in_flight {
            shed += 1;
            continue;
        }
        in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(in_flight.clone());
        let work = work.clone();
        let lag = lag.clone();
        set.spawn(async move {
            let _guard = guard;
            let running = Instant::now();
            record_us(&mut lag.lock().unwrap(), running - due);
            let result = work(i).await;
            Finished {
                due,
                finished: Instant::now(),
                result,
            }
        });
        started += 1;
    }

    let deadline = Instant::now().max(start + rung.duration) + grace;
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, set.join_next()).await {
        tally.record(r);
    }
    set.abort_all();
    while let Some(r) = set.join_next().await {
        match r {
            Err(e) if e.is_cancelled() => tally.error(TIMED_OUT.to_string()),
            // Finished between the deadline and the abort.
            other => tally.record(other),
        }
    }
    let elapsed = start.elapsed();

    let achieved = {
        let interval = if units > 0 { 1.0 / rung.rate } else { 0.0 };
        let span = match (tally.first_finish, tally.last_finish) {
            (Some(a), Some(b)) => (b - a).as_secs_f64() + interval,
            _ => 0.0,
        };
        let window = span.max(rung.duration.as_secs_f64());
        if window > 0.0 {
            tally.completed as f64 / window
        } else {
            0.0
        }
    };
    let dispatch_lag = lag.lock().unwrap().clone();
    RungOutcome {
        offered: if units > 0 { rung.rate } else { 0.0 },
        achieved,
        started,
        completed: tally.completed,
        errors: tally.errors,
        shed,
        latency: tally.latency,
        dispatch_lag,
        elapsed,
        first_error: tally.first_error,
    }
}

/// Capacity at a fixed concurrency: `concurrency` workers each run
/// `work(i)` back to back until `duration` has passed, so that many units
/// are always in flight (as a router keeps its streams busy). Closed-loop
/// on purpose, unlike [`run_rung`]: it measures how many units the far side
/// completes and what each costs at saturation, not latency under a
/// schedule (its latency histogram counts from each unit's own start). A
/// unit still running [`END_GRACE`] after the end is abandoned and counted
/// as an error. `offered` is the achieved rate: nothing was scheduled.
pub async fn run_saturated<F, Fut>(concurrency: usize, duration: Duration, work: F) -> RungOutcome
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let work = Arc::new(work);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let end = start + duration;
    let mut set = JoinSet::new();
    for _ in 0..concurrency {
        let (work, next) = (work.clone(), next.clone());
        set.spawn(async move {
            let mut tally = Tally::new();
            let mut started = 0u64;
            while Instant::now() < end {
                let i = next.fetch_add(1, Ordering::Relaxed);
                started += 1;
                let due = Instant::now();
                // A task of its own, as in run_rung: a unit that panics is
                // one error, not the end of the worker and its tally.
                let mut unit = tokio::spawn(work(i));
                let result = match tokio::time::timeout_at(end + END_GRACE, &mut unit).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        unit.abort();
                        Ok(Err(TIMED_OUT.to_string()))
                    }
                };
                tally.record(result.map(|result| Finished {
                    due,
                    finished: Instant::now(),
                    result,
                }));
            }
            (tally, started)
        });
    }
    let mut tally = Tally::new();
    let mut started = 0;
    while let Some(r) = set.join_next().await {
        match r {
            Ok((worker, n)) => {
                tally.merge(worker);
                started += n;
            }
            Err(_) => tally.error("saturating worker failed".to_string()),
        }
    }
    let elapsed = start.elapsed();
    let span = tally
        .last_finish
        .map_or(elapsed, |last| last - start)
        .as_secs_f64();
    let achieved = if span > 0.0 {
        tally.completed as f64 / span
    } else {
        0.0
    };
    RungOutcome {
        offered: achieved,
        achieved,
        started,
        completed: tally.completed,
        errors: tally.errors,
        shed: 0,
        latency: tally.latency,
        dispatch_lag: new_histogram(),
        elapsed,
        first_error: tally.first_error,
    }
}

/// Decrements the in-flight count when a unit's task ends, however it ends
/// (returns, panics or is aborted).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Finished {
    due: Instant,
    finished: Instant,
    result: Result<(), String>,
}

struct Tally {
    latency: Histogram<u64>,
    completed: u64,
    errors: u64,
    first_finish: Option<Instant>,
    last_finish: Option<Instant>,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            latency: new_histogram(),
            completed: 0,
            errors: 0,
            first_finish: None,
            last_finish: None,
            first_error: None,
        }
    }

    fn record(&mut self, r: Result<Finished, JoinError>) {
        match r {
            Ok(f) => {
                self.first_finish =
                    Some(self.first_finish.map_or(f.finished, |t| t.min(f.finished)));
                self.last_finish = Some(self.last_finish.map_or(f.finished, |t| t.max(f.finished)));
                match f.result {
                    Ok(()) => {
                        self.completed += 1;
                        record_us(&mut self.latency, f.finished - f.due);
                    }
                    Err(e) => self.error(e),
                }
            }
            Err(e) if e.is_panic() => self.error("unit panicked".to_string()),
            Err(_) => self.error(TIMED_OUT.to_string()),
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }

    fn merge(&mut self, other: Tally) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        self.completed += other.completed;
        self.errors += other.errors;
        self.first_finish = [self.first_finish, other.first_finish]
            .into_iter()
            .flatten()
            .min();
        self.last_finish = [self.last_finish, other.last_finish]
            .into_iter()
            .flatten()
            .max();
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

fn record_us(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_keeps_its_concurrency_in_flight_and_counts_every_unit() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (r, m) = (running.clone(), most.clone());
        // Each unit takes 10 ms and the fifth of every ten fails: 8 workers
        // for 1 s complete 8 * 100 units, 80 of them failed.
        let out = run_saturated(8, Duration::from_secs(1), move |i| {
            let (r, m) = (r.clone(), m.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(ms(10)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                if i % 10 == 4 {
                    Err("fifth".into())
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(most.load(Ordering::SeqCst), 8, "never more, and all busy");
        assert_eq!(out.started, 800);
        assert_eq!(out.completed + out.errors, 800);
        assert_eq!(out.errors, 80);
        assert_eq!(out.first_error.as_deref(), Some("fifth"));
        assert!((out.achieved - 720.0).abs() < 1.0, "{}", out.achieved);
        assert_eq!(out.offered, out.achieved);
        let p50 = out.latency.value_at_quantile(0.5);
        assert!(
            out.latency.equivalent(p50, 10_000),
            "{p50} us: latency counts from each unit's own start"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_saturating_unit_that_panics_is_one_error_and_its_worker_goes_on() {
        let out = run_saturated(1, Duration::from_secs(1), |i| async move {
            tokio::time::sleep(ms(100)).await;
            assert_ne!(i, 3, "the fourth unit panics");
            Ok(())
        })
        .await;
        assert_eq!(out.errors, 1);
        assert_eq!(out.first_error.as_deref(), Some("unit panicked"));
        assert_eq!(out.completed, 9, "the worker went on after it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_saturating_unit_that_never_ends_is_abandoned_after_the_grace() {
        let out = run_saturated(2, Duration::from_secs(1), |i| async move {
            if i == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(ms(100)).await;
            Ok(())
        })
        .await;
        assert_eq!(out.errors, 1);
        assert_eq!(out.first_error.as_deref(), Some(TIMED_OUT));
        assert_eq!(out.completed, 10, "the other worker went on");
    }

    #[tokio::test(start_paused = true)]
    async fn due_times_never_drift() {
        let t0 = Instant::now();
        let starts = Arc::new(Mutex::new(vec![None; 1000]));
        let s = starts.clone();
        let rung = Rung {
            rate: 100.0,
            duration: Duration::from_secs(10),
            max_in_flight: 100,
        };
        let out = run_rung(&rung, move |i| {
            s.lock().unwrap()[i as usize] = Some(Instant::now());
            async { Ok(()) }
        })
        .await;
        assert_eq!(out.started, 1000);
        assert_eq!(out.completed, 1000);
        assert_eq!((out.errors, out.shed), (0, 0));
        let starts = starts.lock().unwrap();
        for (i, s) in starts.iter().enumerate() {
            let at = s.expect("every unit started") - t0;
            let want = ms(10 * i as u64);
            let off = at.abs_diff(want);
            assert!(off < ms(1), "unit {i} started at {at:?}, due at {want:?}");
        }
        assert!(
            out.dispatch_lag.max() < 1000,
            "lag max {} µs",
            out.dispatch_lag.max()
        );
        assert!(out.dispatch_lag_p99_us() < 1000);
        assert_eq!(out.offered, 100.0);
        assert!(
            (out.achieved - 100.0).abs() < 1.0,
            "achieved {}",
            out.achieved
        );
    }

    #[tokio::test(start_paused = true)]
    async fn latency_counts_from_due_time_not_start() {
        // A server that handles one unit at a time, 50 ms each (20/s), fed
        // 40/s for 2 s: the queue grows, so latency grows while the
        // generator stays on time.
        let server = Arc::new(tokio::sync::Mutex::new(()));
        let rung = Rung {
            rate: 40.0,
            duration: Duration::from_secs(2),
            max_in_flight: 1000,
        };
        let out = run_rung(&rung, move |_| {
            let server = server.clone();
            async move {
                let _busy = server.lock().await;
                tokio::time::sleep(ms(50)).await;
                Ok(())
            }
        })
        .await;
        assert_eq!(out.completed, 80);
        assert_eq!((out.errors, out.shed), (0, 0));
        // Unit i finishes at 50 ms * (i + 1) and was due at 25 ms * i.
        let min = out.latency.min();
        let max = out.latency.max();
        assert!((49_000..52_000).contains(&min), "min {min} µs");
        assert!((2_000_000..2_060_000).contains(&max), "max {max} µs");
        let p50 = out.latency.value_at_quantile(0.5);
        assert!((900_000..1_150_000).contains(&p50), "p50 {p50} µs");
        assert!(
            out.dispatch_lag.max() < 1000,
            "lag {} µs",
            out.dispatch_lag.max()
        );
        assert!(
            (out.achieved - 20.0).abs() < 0.5,
            "achieved {}",
            out.achieved
        );
        assert!(out.elapsed >= Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_cap_sheds_and_counts() {
        let rung = Rung {
            rate: 100.0,
            duration: Duration::from_secs(1),
            max_in_flight: 10,
        };
        let out = run_rung(&rung, |_| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await;
        assert_eq!(out.started, 10);
        assert_eq!(out.shed, 90);
        assert_eq!(out.completed, 0);
        assert_eq!(
            out.errors, 10,
            "units still running after the grace are errors"
        );
        assert_eq!(out.first_error.as_deref(), Some(TIMED_OUT));
        assert_eq!(out.achieved, 0.0);
        // 1 s of schedule, then the 5 s grace from the rung's end.
        assert!(out.elapsed >= Duration::from_secs(6) && out.elapsed < Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn stragglers_within_grace_complete() {
        let rung = Rung {
            rate: 10.0,
            duration: Duration::from_secs(1),
            max_in_flight: 100,
        };
        let out = run_rung_with_grace(&rung, Duration::from_secs(3), |_| async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        })
        .await;
        assert_eq!((out.started, out.completed, out.errors), (10, 10, 0));
        assert!((2_000_000..2_010_000).contains(&out.latency.max()));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_counted() {
        let rung = Rung {
            rate: 100.0,
            duration: Duration::from_secs(1),
            max_in_flight: 100,
        };
        let out = run_rung(&rung, |i| async move {
            if i % 10 == 0 {
                Err(format!("unit {i} refused"))
            } else {
                Ok(())
            }
        })
        .await;
        assert_eq!(out.started, 100);
        assert_eq!(out.completed, 90);
        assert_eq!(out.errors, 10);
        assert_eq!(out.first_error.as_deref(), Some("unit 0 refused"));
        assert_eq!(out.latency.len(), 90, "latency is of successful units");
        assert_eq!(out.dispatch_lag.len(), 100, "lag is of every started unit");
    }

    #[test]
    fn units_are_those_due_within_the_duration() {
        let r = |rate: f64, secs: f64| Rung {
            rate,
            duration: Duration::from_secs_f64(secs),
            max_in_flight: 1,
        };
        assert_eq!(r(100.0, 10.0).units(), 1000);
        assert_eq!(r(0.3, 10.0).units(), 3);
        assert_eq!(r(0.5, 3.0).units(), 2);
        assert_eq!(r(0.0, 3.0).units(), 0);
        assert_eq!(r(f64::NAN, 3.0).units(), 0);
        assert_eq!(r(3.0, 1.0).due_offset(2), Duration::from_nanos(666_666_667));
    }
}
