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
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

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

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// A v1 limit at or above this is "no limit" (the kernel prints
/// `PAGE_COUNTER_MAX` pages, 9223372036854771712 on 4 KiB pages).
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

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

/// What went wrong; a reading's error leaves that resource out.
#[derive(Debug, thiserror::Error)]
pub enum OverloadError {
    #[error("invalid overload config: {0}")]
    Config(String),
    #[error("read {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("parse {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },
    #[error("{0}")]
    Unavailable(String),
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
pub struct OverloadFigures {
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
    /// MemTotal in bytes, read at start.
    mem_total: Option<u64>,
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
        let mem_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_bytes(&m, "MemTotal"));
        let unread = || Err("not sampled yet".to_string());
        let guard = Arc::new(Self {
            config,
            memory,
            mem_total,
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
        let memory = self
            .memory
            .read(self.mem_total, self.config.memory_limit)
            .map_err(|e| e.to_string());
        let descriptors = read_descriptors().map_err(|e| e.to_string());
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
    pub fn figures(&self) -> OverloadFigures {
        let last = lock(&self.last);
        let (state, tripped_by, everyone) = unpack(self.packed.load(Ordering::Relaxed));
        let soft = state == OverloadState::Soft && !everyone;
        OverloadFigures {
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
            .field("figures", &self.figures())
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

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// Where memory is read from, fixed at construction.
#[derive(Debug)]
enum MemorySource {
    V1(PathBuf),
    /// The group, and it and those of its ancestors that have a
    /// `memory.max`: the tightest one applies.
    V2 {
        dir: PathBuf,
        limits: Vec<PathBuf>,
    },
    /// No memory cgroup: MemTotal − MemAvailable of MemTotal.
    Machine,
    /// The configured directory has neither version's files.
    Missing(PathBuf),
}

impl MemorySource {
    /// An operator's directory: v2 if it has `memory.current`, v1 if
    /// `memory.usage_in_bytes`.
    fn at(dir: &Path) -> Self {
        if dir.join("memory.current").is_file() {
            Self::v2(dir.to_path_buf())
        } else if dir.join("memory.usage_in_bytes").is_file() {
            Self::V1(dir.to_path_buf())
        } else {
            Self::Missing(dir.to_path_buf())
        }
    }

    /// The process's own memory cgroup; a path that is not under the mount
    /// (inside a cgroup namespace) falls back to the mount's root.
    fn own() -> Self {
        let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
            return Self::Machine;
        };
        let Some((version, path)) = locate_memory_cgroup(&own) else {
            return Self::Machine;
        };
        let (mount, probe) = match version {
            CgroupVersion::V1 => (
                Path::new(CGROUP_ROOT).join("memory"),
                "memory.usage_in_bytes",
            ),
            CgroupVersion::V2 => (PathBuf::from(CGROUP_ROOT), "memory.current"),
        };
        let relative = Path::new(path.trim_start_matches('/'));
        let inside = relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        let dir = [mount.join(relative), mount]
            .into_iter()
            .skip(usize::from(!inside))
            .find(|d| d.join(probe).is_file());
        match (dir, version) {
            (Some(dir), CgroupVersion::V1) => Self::V1(dir),
            (Some(dir), CgroupVersion::V2) => Self::v2(dir),
            (None, _) => Self::Machine,
        }
    }

    fn v2(dir: PathBuf) -> Self {
        let limits = dir
            .ancestors()
            .take_while(|d| d.join("memory.max").is_file())
            .map(|d| d.join("memory.max"))
            .collect();
        Self::V2 { dir, limits }
    }

    fn dir(&self) -> Option<&Path> {
        match self {
            Self::V1(dir) | Self::V2 { dir, .. } | Self::Missing(dir) => Some(dir),
            Self::Machine => None,
        }
    }

    fn read(
        &self,
        mem_total: Option<u64>,
        limit_override: Option<u64>,
    ) -> Result<ResourceReading, OverloadError> {
        let (usage, inactive_file, cgroup_limit) = match self {
            Self::V1(dir) => {
                let usage = parse_at(dir, "memory.usage_in_bytes", parse_u64)?;
                let limit = parse_at(dir, "memory.limit_in_bytes", parse_v1_limit)?;
                let stat = read_at(dir, "memory.stat")?;
                let inactive = stat_key(dir, &stat, "total_inactive_file")?;
                // The tightest limit of the group and its ancestors.
                let hierarchical = stat_value(&stat, "hierarchical_memory_limit")
                    .filter(|&l| l < V1_UNLIMITED_FLOOR);
                (usage, inactive, min_some(limit, hierarchical))
            }
            Self::V2 { dir, limits } => {
                let usage = parse_at(dir, "memory.current", parse_u64)?;
                let stat = read_at(dir, "memory.stat")?;
                let inactive = stat_key(dir, &stat, "inactive_file")?;
                let mut limit = None;
                for file in limits {
                    let text = read(file)?;
                    let max = parse_v2_max(&text).map_err(|detail| OverloadError::Parse {
                        path: file.clone(),
                        detail,
                    })?;
                    limit = min_some(limit, max);
                }
                (usage, inactive, limit)
            }
            Self::Machine => {
                let path = Path::new("/proc/meminfo");
                let info = read(path)?;
                let field = |key| {
                    meminfo_bytes(&info, key).ok_or_else(|| OverloadError::Parse {
                        path: path.to_path_buf(),
                        detail: format!("no {key}"),
                    })
                };
                let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
                let used = total.saturating_sub(available);
                return reading(used, limit_override.unwrap_or(total))
                    .map_err(OverloadError::Unavailable);
            }
            Self::Missing(dir) => {
                return Err(OverloadError::Unavailable(format!(
                    "{}: neither memory.current (v2) nor memory.usage_in_bytes (v1)",
                    dir.display()
                )));
            }
        };
        memory_reading(
            usage,
            inactive_file,
            cgroup_limit,
            mem_total,
            limit_override,
        )
        .map_err(OverloadError::Unavailable)
    }
}

/// Used: what the OOM killer counts less the page cache it can reclaim
/// first, floored at 0. Limit: the operator's, else the tighter of the
/// cgroup's and the machine's.
fn memory_reading(
    usage: u64,
    inactive_file: u64,
    cgroup_limit: Option<u64>,
    mem_total: Option<u64>,
    limit_override: Option<u64>,
) -> Result<ResourceReading, String> {
    let limit = limit_override
        .or_else(|| min_some(cgroup_limit, mem_total))
        .ok_or("no memory limit: the cgroup has none and MemTotal is unknown")?;
    reading(usage.saturating_sub(inactive_file), limit)
}

fn min_some(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

/// The memory cgroup in `/proc/self/cgroup`: a v1 line listing `memory`
/// wins over the v2 `0::` line (on a hybrid host the unified hierarchy has
/// no memory controller).
fn locate_memory_cgroup(proc_self_cgroup: &str) -> Option<(CgroupVersion, &str)> {
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some((CgroupVersion::V1, path));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some((CgroupVersion::V2, path));
        }
    }
    v2
}

fn parse_u64(text: &str) -> Result<u64, String> {
    let text = text.trim();
    text.parse()
        .map_err(|e| format!("expected an unsigned integer, got {text:?}: {e}"))
}

/// v2 `memory.max`: bytes, or `max` (`None`).
fn parse_v2_max(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "max" => Ok(None),
        other => parse_u64(other).map(Some),
    }
}

/// v1 `memory.limit_in_bytes`: bytes, or a huge value (`None`).
fn parse_v1_limit(text: &str) -> Result<Option<u64>, String> {
    parse_u64(text).map(|l| (l < V1_UNLIMITED_FLOOR).then_some(l))
}

/// A value of a `key value` file (`memory.stat`).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// A `/proc/meminfo` field (`MemTotal:  24683584 kB`) in bytes.
fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kib * 1024)
    })
}

fn read(path: &Path) -> Result<String, OverloadError> {
    std::fs::read_to_string(path).map_err(|e| OverloadError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn read_at(dir: &Path, file: &str) -> Result<String, OverloadError> {
    read(&dir.join(file))
}

fn parse_at<T>(
    dir: &Path,
    file: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, OverloadError> {
    parse(&read_at(dir, file)?).map_err(|detail| OverloadError::Parse {
        path: dir.join(file),
        detail,
    })
}

fn stat_key(dir: &Path, stat: &str, key: &str) -> Result<u64, OverloadError> {
    stat_value(stat, key).ok_or_else(|| OverloadError::Parse {
        path: dir.join("memory.stat"),
        detail: format!("no {key}"),
    })
}

// ---------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------

fn read_descriptors() -> Result<ResourceReading, OverloadError> {
    let limit = nofile_soft_limit()
        .map_err(|e| OverloadError::Unavailable(format!("getrlimit(RLIMIT_NOFILE): {e}")))?;
    let open = match open_descriptors() {
        Ok(open) => open,
        // No descriptor left to count them with: every one is in use.
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => limit,
        Err(e) => {
            return Err(OverloadError::Read {
                path: "/proc/self/fd".into(),
                reason: e.to_string(),
            });
        }
    };
    reading(open, limit).map_err(OverloadError::Unavailable)
}

fn nofile_soft_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit.rlim_cur)
}

/// Open descriptors: the size of /proc/self/fd where the kernel reports
/// the count there (Linux >= 6.2, from the descriptor bitmap: 4 µs at
/// 20,000 descriptors, and no descriptor taken to ask), else its entries.
/// /stats counts them this way too: it runs on the data path's threads.
pub fn open_descriptors() -> io::Result<u64> {
    match std::fs::metadata("/proc/self/fd") {
        // Never 0 when reported: the runtime itself holds descriptors.
        Ok(meta) if meta.len() > 0 => Ok(meta.len()),
        _ => count_descriptors(),
    }
}

/// Entries of /proc/self/fd, counted with readdir: no allocation per
/// descriptor (std's `read_dir` makes a `CString` per entry), but procfs
/// makes a dentry for each (19 ms at 20,000 descriptors).
fn count_descriptors() -> io::Result<u64> {
    // SAFETY: the path is a NUL-terminated literal.
    let dir = unsafe { libc::opendir(c"/proc/self/fd".as_ptr()) };
    if dir.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut entries: u64 = 0;
    loop {
        // SAFETY: `dir` is an open stream used by this call alone, not yet
        // closed.
        let entry = unsafe { libc::readdir(dir) };
        if entry.is_null() {
            break;
        }
        // SAFETY: a non-null entry is valid, its name NUL-terminated, until
        // the next readdir or closedir on `dir`; the name is not kept.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            entries += 1;
        }
    }
    // SAFETY: `dir` came from opendir and is closed once, here.
    unsafe { libc::closedir(dir) };
    // One of the entries is the stream's own descriptor.
    Ok(entries.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine: cgroup v1 with a unified mount that has no controllers.
    const HYBRID: &str = "9=systemd:/\n\
        4:memory:/process_api/6b7062ffa89dce1610903bed2c768719\n\
        2:cpuacct:/\n1:cpu:/\n0::/\n";
    const UNIFIED: &str = "0::/kubepods.slice/pod1/cri-containerd-2a.scope\n";
    const LEGACY_JOINT: &str = "11:memory,hugetlb:/user.slice\n4:cpu,cpuacct:/\n";

    #[test]
    fn memory_cgroup_is_located_v1_first() {
        assert_eq!(
            locate_memory_cgroup(HYBRID),
            Some((
                CgroupVersion::V1,
                "/process_api/6b7062ffa89dce1610903bed2c768719"
            ))
        );
        assert_eq!(
            locate_memory_cgroup(UNIFIED),
            Some((
                CgroupVersion::V2,
                "/kubepods.slice/pod1/cri-containerd-2a.scope"
            ))
        );
        assert_eq!(
            locate_memory_cgroup(LEGACY_JOINT),
            Some((CgroupVersion::V1, "/user.slice"))
        );
        // A path may hold ':'.
        assert_eq!(
            locate_memory_cgroup("0::/a:b\n"),
            Some((CgroupVersion::V2, "/a:b"))
        );
        assert_eq!(locate_memory_cgroup("3:cpu:/\n"), None);
        assert_eq!(locate_memory_cgroup(""), None);
    }

    #[test]
    fn limits_read_unlimited_as_none() {
        assert_eq!(parse_v2_max("max\n"), Ok(None));
        assert_eq!(parse_v2_max("67108864\n"), Ok(Some(67_108_864)));
        assert!(parse_v2_max("").is_err());
        assert_eq!(parse_v1_limit("9223372036854771712\n"), Ok(None));
        // 64 KiB pages print a different "unlimited".
        assert_eq!(parse_v1_limit("9223372036854710272\n"), Ok(None));
        assert_eq!(parse_v1_limit("67108864\n"), Ok(Some(67_108_864)));
        assert!(parse_v1_limit("-1").is_err());
        assert!(parse_u64("12 kB").is_err());
    }

    #[test]
    fn stat_and_meminfo_values() {
        let v1 = "cache 50331648\nrss 0\ninactive_file 139264\n\
            hierarchical_memory_limit 67108864\ntotal_inactive_file 50290688\n";
        assert_eq!(stat_value(v1, "total_inactive_file"), Some(50_290_688));
        // A key is matched whole, not as a prefix or suffix.
        assert_eq!(stat_value(v1, "inactive_file"), Some(139_264));
        assert_eq!(
            stat_value(v1, "hierarchical_memory_limit"),
            Some(67_108_864)
        );
        assert_eq!(stat_value(v1, "file"), None);
        let v2 = "anon 28602368\nfile 2494464\nactive_file 4096\ninactive_file 2490368\n";
        assert_eq!(stat_value(v2, "inactive_file"), Some(2_490_368));
        assert_eq!(stat_value("inactive_file x\n", "inactive_file"), None);
        let meminfo = "MemTotal:       24683584 kB\nMemFree:        17223980 kB\n\
            MemAvailable:   24061572 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(24_683_584 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable"),
            Some(24_061_572 * 1024)
        );
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
        assert_eq!(meminfo_bytes("MemTotal: lots\n", "MemTotal"), None);
    }

    #[test]
    fn used_memory_leaves_out_inactive_file_and_the_tightest_limit_applies() {
        let r = memory_reading(1000, 300, Some(2000), Some(4000), None).expect("reading");
        assert_eq!((r.used, r.limit), (700, 2000));
        assert!((r.pressure - 0.35).abs() < 1e-12);
        // Floored at 0.
        assert_eq!(
            memory_reading(100, 300, Some(2000), None, None)
                .expect("reading")
                .used,
            0
        );
        // No cgroup limit: MemTotal; a cgroup limit above it: MemTotal.
        assert_eq!(
            memory_reading(1, 0, None, Some(4000), None)
                .expect("reading")
                .limit,
            4000
        );
        assert_eq!(
            memory_reading(1, 0, Some(8000), Some(4000), None)
                .expect("reading")
                .limit,
            4000
        );
        // The operator's limit wins.
        assert_eq!(
            memory_reading(1, 0, Some(2000), Some(4000), Some(9000))
                .expect("reading")
                .limit,
            9000
        );
        assert!(memory_reading(1, 0, None, None, None).is_err());
        assert!(memory_reading(1, 0, None, None, Some(0)).is_err());
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
    fn counted_entries_agree_with_the_reported_size() {
        // Other tests open and close descriptors meanwhile: agreeing once
        // in a few tries is agreeing.
        let agree = (0..20).any(|_| {
            let reported = open_descriptors().expect("reported");
            let counted = count_descriptors().expect("counted");
            reported == counted
        });
        assert!(agree);
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
