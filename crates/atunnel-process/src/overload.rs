//! The process's overload guard: its memory against its cgroup's limit and
//! its descriptors against `RLIMIT_NOFILE`, sampled every interval. Past the
//! soft threshold new work is refused, first from the consumers holding more
//! than their fair share of the pressured resource ([`OverloadGuard::admit_held`])
//! and past the `everyone` line from all; past the hard one the caller's
//! [`Shed`] drops the consumer holding the most of it, one per interval
//! (what each holds is the caller's [`Shed::holdings`]). Modelled on Envoy's
//! overload manager (resource monitors, pressure thresholds, actions). The
//! cgroup files are parsed by hand: each reading is two or three small files.
//!
//! A resource that cannot be read (file missing, unparsable) is left out of
//! the decision and its error shown in the figures: a broken reading never
//! makes the guard refuse everything.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use atunnel_host::MemorySource;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Default soft threshold: refuse new work at 85% of a limit.
pub const DEFAULT_SOFT: f64 = 0.85;
/// Default line past which soft refuses everyone, not only the consumers
/// above their fair share: halfway from soft to hard, so that a consumer
/// below its share still gets work for 5% of the limit after the others
/// were stopped, and the last 5% before hard are kept for what is running.
pub const DEFAULT_EVERYONE: f64 = 0.90;
/// Default hard threshold: shed at 95%, leaving 5% of the limit for the
/// shed tunnels to go before the kernel's OOM killer acts.
pub const DEFAULT_HARD: f64 = 0.95;
/// Default sampling interval: 4 samples a second. One sample took 0.1 ms
/// (three cgroup v1 files and a stat of /proc/self/fd, at 20,000
/// descriptors).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);
/// Default `Retry-After` of a refusal.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Shed actions kept for the figures.
pub const RECENT_SHED: usize = 16;

/// Thresholds and sources of the guard.
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadConfig {
    /// Pressure (used / limit) at or past which new work is refused.
    /// Default 0.85.
    pub soft: f64,
    /// Pressure at or past which new work is refused and the largest
    /// consumer shed, one per interval. Default 0.95.
    pub hard: f64,
    /// Pressure at or past which soft refuses every consumer's new work;
    /// below it, only those holding more than their fair share (what all
    /// hold / how many there are) of the pressured resource. Clamped into
    /// `soft..=hard`. Default 0.90.
    pub everyone: f64,
    /// Time between two samples, and between two sheds. Default 250 ms.
    pub interval: Duration,
    /// How long a refused client is told to wait (HTTP `Retry-After`).
    /// Default 5 s.
    pub retry_after: Duration,
    /// Memory cgroup directory to watch, v1 or v2 (told apart by its
    /// files), examined once at start. Default: the process's own, from
    /// /proc/self/cgroup.
    pub memory_cgroup: Option<PathBuf>,
    /// Memory limit in bytes, used instead of the cgroup's (or, without a
    /// cgroup limit, the machine's MemTotal). Default none.
    pub memory_limit: Option<u64>,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        Self {
            soft: DEFAULT_SOFT,
            hard: DEFAULT_HARD,
            everyone: DEFAULT_EVERYONE,
            interval: DEFAULT_INTERVAL,
            retry_after: DEFAULT_RETRY_AFTER,
            memory_cgroup: None,
            memory_limit: None,
        }
    }
}

/// How loaded the process is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum OverloadState {
    Normal,
    /// A resource is at or past the soft threshold: new work is refused.
    Soft,
    /// A resource is at or past the hard threshold: refused, and shedding.
    Hard,
}

/// A resource the guard watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// Bytes charged to the cgroup, less reclaimable page cache.
    Memory,
    /// Open file descriptors of the process.
    Descriptors,
}

impl OverloadState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Soft => "soft",
            Self::Hard => "hard",
        }
    }
}

impl Resource {
    fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Descriptors => "descriptors",
        }
    }
}

impl fmt::Display for OverloadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why [`OverloadGuard::admit`] refused: the resource past its threshold
/// and how long the client should wait. `everyone`: refused whatever the
/// consumer holds (hard, or past the `everyone` line); otherwise for holding
/// more than its fair share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("overloaded: {resource} past the {state} threshold, retry after {retry_after:?}")]
pub struct Overloaded {
    pub resource: Resource,
    pub state: OverloadState,
    pub retry_after: Duration,
    pub everyone: bool,
}

/// Why a guard was not built. (A reading's error is not one: it leaves
/// that resource out and shows in the figures.)
#[derive(Debug, thiserror::Error)]
pub enum OverloadError {
    #[error("invalid overload config: {0}")]
    Config(String),
}

/// What the caller shed, for the figures and the log.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShedAction {
    /// Who was shed (an actor, a client identity).
    pub who: String,
    /// Bytes it held.
    pub bytes: u64,
    /// Tunnels ended.
    pub tunnels: u64,
    /// Requests and ingress CONNECT tunnels ended.
    pub requests: u64,
}

/// What one consumer holds of each resource the guard watches: open
/// descriptors, and bytes (an estimate: the caller counts what it can see
/// without touching its per-byte path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub descriptors: u64,
    pub bytes: u64,
}

impl Held {
    /// What it holds of `resource`.
    pub fn of(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Memory => self.bytes,
            Resource::Descriptors => self.descriptors,
        }
    }
}

/// Implemented by whoever can end work. Called by [`OverloadGuard::run`] on
/// the runtime once per interval while soft or hard, so neither may block:
/// `holdings` reads counters, `shed` starts the ending (cancels the tunnels)
/// and returns.
pub trait Shed: Send + Sync {
    /// What each consumer (an actor, a client identity) holds now: the fair
    /// shares under soft and the ranking under hard are taken from it.
    fn holdings(&self) -> Vec<(String, Held)>;
    /// Ends `who`'s work (the guard picked it as holding the most of the
    /// pressured resource). `None`: it has nothing left to shed.
    fn shed(&self, who: &str) -> Option<ShedAction>;
}

/// One resource's reading.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResourceReading {
    /// Bytes (memory) or descriptors.
    pub used: u64,
    pub limit: u64,
    /// `used / limit`.
    pub pressure: f64,
}

/// What the guard reports on /stats.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OverloadStats {
    pub state: OverloadState,
    /// The resource that set the state (none when normal).
    pub tripped_by: Option<Resource>,
    /// The cgroup directory memory is read from; none: the machine's.
    pub memory_cgroup: Option<PathBuf>,
    /// None when it could not be read (see `memory_error`).
    pub memory: Option<ResourceReading>,
    pub memory_error: Option<String>,
    pub descriptors: Option<ResourceReading>,
    pub descriptors_error: Option<String>,
    pub soft: f64,
    pub hard: f64,
    /// The line past which soft refuses everyone (clamped into soft..=hard).
    pub everyone: f64,
    /// Whether new work is refused for everyone now (hard, or past
    /// `everyone`), not only for consumers above their fair share.
    pub refusing_everyone: bool,
    /// Each resource's fair share as of the last sample in soft (what all
    /// consumers hold / how many there are); none when not in soft.
    pub fair_share: Option<Held>,
    /// Consumers the last sample counted for the fair share.
    pub consumers: u64,
    pub refused_total: u64,
    /// Of `refused_total`, work refused for holding more than the fair share
    /// (the rest was refused for everyone).
    pub refused_over_share_total: u64,
    pub shed_total: u64,
    /// The last [`RECENT_SHED`] actions, oldest first.
    pub recent_shed: Vec<ShedAction>,
    pub transitions_total: u64,
}

/// Watches the process and answers whether it may take new work. Shared:
/// built once, [`run`](Self::run) by one task, asked by every listener.
pub struct OverloadGuard {
    config: OverloadConfig,
    memory: MemorySource,
    /// State, tripping resource and whether everyone is refused,
    /// [`pack`]ed: what `admit` loads.
    packed: AtomicU8,
    /// The fair shares while soft (descriptors, bytes), and the consumers
    /// they were taken over.
    share_descriptors: AtomicU64,
    share_bytes: AtomicU64,
    consumers: AtomicU64,
    refused: AtomicU64,
    refused_over_share: AtomicU64,
    shed_total: AtomicU64,
    transitions: AtomicU64,
    shedder: Mutex<Option<Arc<dyn Shed>>>,
    last: Mutex<Readings>,
    recent: Mutex<VecDeque<ShedAction>>,
}

type Reading = Result<ResourceReading, String>;

struct Readings {
    memory: Reading,
    descriptors: Reading,
}

impl OverloadGuard {
    /// A guard with `config`, sampled once before it is returned.
    pub fn new(config: OverloadConfig) -> Result<Arc<Self>, OverloadError> {
        let OverloadConfig {
            soft,
            hard,
            interval,
            ..
        } = config;
        if !(soft.is_finite()
            && hard.is_finite()
            && config.everyone.is_finite()
            && soft > 0.0
            && soft <= hard)
        {
            return Err(OverloadError::Config(format!(
                "thresholds must satisfy 0 < soft <= hard, got soft {soft}, hard {hard}"
            )));
        }
        if interval.is_zero() {
            return Err(OverloadError::Config("interval must be positive".into()));
        }
        let memory = match &config.memory_cgroup {
            Some(dir) => MemorySource::at(dir),
            None => MemorySource::own(),
        };
        let unread = || Err("not sampled yet".to_string());
        let guard = Arc::new(Self {
            config,
            memory,
            packed: AtomicU8::new(pack(OverloadState::Normal, None, false)),
            share_descriptors: AtomicU64::new(u64::MAX),
            share_bytes: AtomicU64::new(u64::MAX),
            consumers: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refused_over_share: AtomicU64::new(0),
            shed_total: AtomicU64::new(0),
            transitions: AtomicU64::new(0),
            shedder: Mutex::new(None),
            last: Mutex::new(Readings {
                memory: unread(),
                descriptors: unread(),
            }),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_SHED)),
        });
        guard.sample();
        Ok(guard)
    }

    /// Sets (or replaces) who sheds while hard.
    pub fn set_shedder(&self, shedder: Arc<dyn Shed>) {
        *lock(&self.shedder) = Some(shedder);
    }

    /// Whether new work of no one in particular may start: refused while
    /// soft or hard. An atomic load. Refusals are counted.
    pub fn admit(&self) -> Result<(), Overloaded> {
        let (state, resource, _) = unpack(self.packed.load(Ordering::Relaxed));
        match (state, resource) {
            (OverloadState::Normal, _) | (_, None) => Ok(()),
            (state, Some(resource)) => Err(self.refuse(resource, state, true)),
        }
    }

    /// Whether new work of a consumer that holds `held()` may start: while
    /// normal, yes (an atomic load; `held` is not called); while soft below
    /// the `everyone` line, only if it holds no more than its fair share of
    /// the pressured resource; otherwise no. Refusals are counted.
    pub fn admit_held(&self, held: impl FnOnce() -> Held) -> Result<(), Overloaded> {
        let (state, resource, everyone) = unpack(self.packed.load(Ordering::Relaxed));
        let resource = match (state, resource) {
            (OverloadState::Normal, _) | (_, None) => return Ok(()),
            (_, Some(resource)) => resource,
        };
        if state == OverloadState::Hard || everyone {
            return Err(self.refuse(resource, state, true));
        }
        let share = match resource {
            Resource::Memory => &self.share_bytes,
            Resource::Descriptors => &self.share_descriptors,
        };
        if held().of(resource) <= share.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.refused_over_share.fetch_add(1, Ordering::Relaxed);
        Err(self.refuse(resource, state, false))
    }

    fn refuse(&self, resource: Resource, state: OverloadState, everyone: bool) -> Overloaded {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Overloaded {
            resource,
            state,
            retry_after: self.config.retry_after,
            everyone,
        }
    }

    /// The state as of the last sample.
    pub fn state(&self) -> OverloadState {
        unpack(self.packed.load(Ordering::Relaxed)).0
    }

    /// The `everyone` line, clamped into `soft..=hard`.
    fn everyone_line(&self) -> f64 {
        self.config
            .everyone
            .clamp(self.config.soft, self.config.hard)
    }

    /// Sets the fair shares from the shedder's holdings (soft only: the
    /// only state that asks). Without a shedder no one is above a share.
    fn set_fair_shares(&self) {
        let shedder = lock(&self.shedder).clone();
        let holdings = shedder.map(|s| s.holdings()).unwrap_or_default();
        let n = holdings.len() as u64;
        let (d, b) = holdings.iter().fold((0u64, 0u64), |(d, b), (_, h)| {
            (d.saturating_add(h.descriptors), b.saturating_add(h.bytes))
        });
        let (d, b) = match n {
            0 => (u64::MAX, u64::MAX),
            n => (d / n, b / n),
        };
        self.share_descriptors.store(d, Ordering::Relaxed);
        self.share_bytes.store(b, Ordering::Relaxed);
        self.consumers.store(n, Ordering::Relaxed);
    }

    /// Reads every resource now and sets the state from them. Done by
    /// [`run`](Self::run) every interval; callable directly. Reads only
    /// procfs and cgroupfs, which do not block on I/O.
    pub fn sample(&self) -> OverloadState {
        let memory = read_memory(&self.memory, self.config.memory_limit);
        let descriptors = read_descriptors();
        let pressure = |r: &Reading| r.as_ref().ok().map(|r| r.pressure);
        let pressures = [
            (Resource::Memory, pressure(&memory)),
            (Resource::Descriptors, pressure(&descriptors)),
        ];
        let (state, tripped) = decide(self.config.soft, self.config.hard, pressures);
        let everyone = match state {
            OverloadState::Normal => false,
            OverloadState::Hard => true,
            OverloadState::Soft => decide(self.everyone_line(), f64::INFINITY, pressures)
                .1
                .is_some(),
        };
        // The shares are in place before the state that reads them.
        if state == OverloadState::Soft && !everyone {
            self.set_fair_shares();
        }
        let mut last = lock(&self.last);
        note_unreadable(Resource::Memory, &last.memory, &memory);
        note_unreadable(Resource::Descriptors, &last.descriptors, &descriptors);
        let (previous, _, _) = unpack(
            self.packed
                .swap(pack(state, tripped, everyone), Ordering::Relaxed),
        );
        if previous != state {
            self.transitions.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                from = %previous,
                to = %state,
                resource = tripped.map_or("none", Resource::as_str),
                memory_pressure = pressure(&memory),
                descriptor_pressure = pressure(&descriptors),
                "overload state changed"
            );
        }
        *last = Readings {
            memory,
            descriptors,
        };
        state
    }

    /// Samples every interval until `cancel`, and while hard sheds the
    /// consumer holding the most of the pressured resource, one per interval.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.sample() == OverloadState::Hard {
                self.shed();
            }
        }
    }

    fn shed(&self) {
        // Cloned out: the caller's code runs without the guard's lock.
        let Some(shedder) = lock(&self.shedder).clone() else {
            tracing::debug!("overload: hard, but no shedder is set");
            return;
        };
        let resource = unpack(self.packed.load(Ordering::Relaxed))
            .1
            .unwrap_or(Resource::Memory);
        let holdings = shedder.holdings();
        let Some(who) = largest(&holdings, resource) else {
            tracing::debug!("overload: hard, but no one holds anything");
            return;
        };
        let Some(action) = shedder.shed(who) else {
            tracing::debug!("overload: hard, but nothing to shed");
            return;
        };
        tracing::warn!(
            who = %action.who,
            bytes = action.bytes,
            tunnels = action.tunnels,
            requests = action.requests,
            "overload: shed the largest consumer"
        );
        self.shed_total.fetch_add(1, Ordering::Relaxed);
        let mut recent = lock(&self.recent);
        if recent.len() == RECENT_SHED {
            recent.pop_front();
        }
        recent.push_back(action);
    }

    /// The figures for /stats.
    pub fn stats(&self) -> OverloadStats {
        let last = lock(&self.last);
        let (state, tripped_by, everyone) = unpack(self.packed.load(Ordering::Relaxed));
        let soft = state == OverloadState::Soft && !everyone;
        OverloadStats {
            state,
            tripped_by,
            memory_cgroup: self.memory.dir().map(Path::to_path_buf),
            memory: last.memory.as_ref().ok().copied(),
            memory_error: last.memory.as_ref().err().cloned(),
            descriptors: last.descriptors.as_ref().ok().copied(),
            descriptors_error: last.descriptors.as_ref().err().cloned(),
            soft: self.config.soft,
            hard: self.config.hard,
            everyone: self.everyone_line(),
            refusing_everyone: everyone,
            fair_share: soft.then(|| Held {
                descriptors: self.share_descriptors.load(Ordering::Relaxed),
                bytes: self.share_bytes.load(Ordering::Relaxed),
            }),
            consumers: self.consumers.load(Ordering::Relaxed),
            refused_total: self.refused.load(Ordering::Relaxed),
            refused_over_share_total: self.refused_over_share.load(Ordering::Relaxed),
            shed_total: self.shed_total.load(Ordering::Relaxed),
            recent_shed: lock(&self.recent).iter().cloned().collect(),
            transitions_total: self.transitions.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for OverloadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadGuard")
            .field("figures", &self.stats())
            .finish()
    }
}

/// Nothing panics while holding the guard's locks, so a poisoned one still
/// holds consistent data.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Logs when a resource becomes unreadable (or its error changes), not at
/// every sample.
fn note_unreadable(resource: Resource, before: &Reading, now: &Reading) {
    if let Err(e) = now
        && before.as_ref().err() != Some(e)
    {
        tracing::warn!(%resource, error = %e, "overload: resource unreadable, left out");
    }
}

/// The consumer holding the most of `resource` (the other breaks ties);
/// none if no one holds anything.
fn largest(holdings: &[(String, Held)], resource: Resource) -> Option<&str> {
    let other = match resource {
        Resource::Memory => Resource::Descriptors,
        Resource::Descriptors => Resource::Memory,
    };
    holdings
        .iter()
        .filter(|(_, h)| *h != Held::default())
        .max_by_key(|(_, h)| (h.of(resource), h.of(other)))
        .map(|(who, _)| who.as_str())
}

fn pack(state: OverloadState, resource: Option<Resource>, everyone: bool) -> u8 {
    let resource = match resource {
        None => 0,
        Some(Resource::Memory) => 1,
        Some(Resource::Descriptors) => 2,
    };
    state as u8 | resource << 2 | u8::from(everyone) << 4
}

fn unpack(packed: u8) -> (OverloadState, Option<Resource>, bool) {
    let state = match packed & 3 {
        0 => OverloadState::Normal,
        1 => OverloadState::Soft,
        _ => OverloadState::Hard,
    };
    let resource = match (packed >> 2) & 3 {
        0 => None,
        1 => Some(Resource::Memory),
        _ => Some(Resource::Descriptors),
    };
    (state, resource, packed & 1 << 4 != 0)
}

/// The state from each resource's pressure (`None`: unknown, left out), and
/// the resource that set it: the worst level, the highest pressure within.
fn decide(
    soft: f64,
    hard: f64,
    pressures: [(Resource, Option<f64>); 2],
) -> (OverloadState, Option<Resource>) {
    let level = |p: f64| {
        if p >= hard {
            OverloadState::Hard
        } else if p >= soft {
            OverloadState::Soft
        } else {
            OverloadState::Normal
        }
    };
    let worst = pressures
        .iter()
        .filter_map(|&(r, p)| p.map(|p| (level(p), p, r)))
        .max_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    match worst {
        Some((state, _, resource)) if state != OverloadState::Normal => (state, Some(resource)),
        _ => (OverloadState::Normal, None),
    }
}

fn reading(used: u64, limit: u64) -> Result<ResourceReading, String> {
    if limit == 0 {
        return Err(format!("limit is 0 (used {used})"));
    }
    Ok(ResourceReading {
        used,
        limit,
        pressure: used as f64 / limit as f64,
    })
}

/// Memory's reading: the operator's limit, else the host's.
fn read_memory(source: &MemorySource, limit_override: Option<u64>) -> Reading {
    let charge = source.read().map_err(|e| e.to_string())?;
    memory_reading(charge.used, charge.limit, limit_override)
}

fn memory_reading(
    used: u64,
    host_limit: Option<u64>,
    limit_override: Option<u64>,
) -> Result<ResourceReading, String> {
    let limit = limit_override
        .or(host_limit)
        .ok_or("no memory limit: the cgroup has none and MemTotal is unknown")?;
    reading(used, limit)
}

fn read_descriptors() -> Reading {
    let limit =
        atunnel_host::nofile_soft_limit().map_err(|e| format!("getrlimit(RLIMIT_NOFILE): {e}"))?;
    let open = match atunnel_host::open_descriptors() {
        Ok(open) => open,
        // No descriptor left to count them with: every one is in use.
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => limit,
        Err(e) => return Err(format!("read /proc/self/fd: {e}")),
    };
    reading(open, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_limit_wins_and_none_or_zero_is_unreadable() {
        // What the host reads (usage less inactive_file, the tightest
        // limit) is atunnel-host's test; the guard takes it as it is.
        let r = memory_reading(700, Some(2000), None).expect("reading");
        assert_eq!((r.used, r.limit), (700, 2000));
        assert!((r.pressure - 0.35).abs() < 1e-12);
        // The operator's limit wins.
        assert_eq!(
            memory_reading(1, Some(4000), Some(9000))
                .expect("reading")
                .limit,
            9000
        );
        assert!(memory_reading(1, None, None).is_err());
        assert!(memory_reading(1, None, Some(0)).is_err());
    }

    #[test]
    fn the_worst_resource_sets_the_state_and_unknown_ones_are_left_out() {
        use OverloadState::*;
        use Resource::*;
        let d = |m, f| decide(0.5, 0.8, [(Memory, m), (Descriptors, f)]);
        assert_eq!(d(Some(0.1), Some(0.49)), (Normal, None));
        assert_eq!(d(Some(0.5), Some(0.1)), (Soft, Some(Memory)));
        assert_eq!(d(Some(0.6), Some(0.8)), (Hard, Some(Descriptors)));
        assert_eq!(d(Some(0.9), Some(0.8)), (Hard, Some(Memory)));
        assert_eq!(d(Some(0.6), Some(0.7)), (Soft, Some(Descriptors)));
        assert_eq!(d(None, Some(0.7)), (Soft, Some(Descriptors)));
        assert_eq!(d(None, None), (Normal, None));
    }

    #[test]
    fn the_largest_is_ranked_by_the_pressured_resource_then_the_other() {
        let h = |who: &str, descriptors, bytes| (who.to_string(), Held { descriptors, bytes });
        // Most tunnels (descriptors) is not most memory.
        let all = [h("tunnels", 4000, 8 << 20), h("bodies", 100, 64 << 20)];
        assert_eq!(largest(&all, Resource::Memory), Some("bodies"));
        assert_eq!(largest(&all, Resource::Descriptors), Some("tunnels"));
        let tie = [h("a", 10, 1), h("b", 10, 2)];
        assert_eq!(largest(&tie, Resource::Descriptors), Some("b"));
        // Holding nothing is never shed.
        assert_eq!(largest(&[h("idle", 0, 0)], Resource::Memory), None);
        assert_eq!(largest(&[], Resource::Memory), None);
    }

    #[test]
    fn packed_state_round_trips() {
        for state in [
            OverloadState::Normal,
            OverloadState::Soft,
            OverloadState::Hard,
        ] {
            for resource in [None, Some(Resource::Memory), Some(Resource::Descriptors)] {
                for everyone in [false, true] {
                    assert_eq!(
                        unpack(pack(state, resource, everyone)),
                        (state, resource, everyone)
                    );
                }
            }
        }
    }
}
