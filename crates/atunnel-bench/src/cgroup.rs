//! One cgroup for one measured process: created with CPU and memory limits,
//! sampled while the process runs, removed afterwards.
//!
//! Both hierarchies are supported:
//!
//! * **v1** (legacy/hybrid): the group is created in the `memory`, `cpu` and
//!   `cpuacct` hierarchies (which may share one mount, e.g. `cpu,cpuacct`).
//! * **v2** (unified): the group is created in the unified hierarchy; it is
//!   used when its root offers both the `cpu` and the `memory` controller.
//!
//! The group is created below the caller's own cgroup in each hierarchy (as
//! read from `/proc/self/cgroup`), so whatever limits the caller lives under
//! still apply. On v2 the "no internal processes" rule can forbid enabling
//! controllers there; then the hierarchy's root is used instead.
//!
//! All file parsing lives in pure functions (`parse_*`, `sample_from_v1`,
//! `sample_from_v2`, `plan_layout`) that are unit-tested with sample texts.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// CFS period used for the CPU quota, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Smallest quota the kernel accepts, in microseconds.
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// "Unlimited" as cgroup v1 prints it (`PAGE_COUNTER_MAX` pages in bytes on
/// 4 KiB pages); written to `memory.kmem.tcp.limit_in_bytes` to switch on
/// TCP memory accounting without limiting it.
const V1_UNLIMITED: &str = "9223372036854771712";

/// How long `remove` keeps retrying while the kernel still holds a directory.
const REMOVE_RETRY_FOR: Duration = Duration::from_secs(3);
const REMOVE_RETRY_STEP: Duration = Duration::from_millis(20);

/// Which cgroup hierarchy a [`Cgroup`] lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Resource limits of a [`Cgroup`].
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// CPU quota in cores, e.g. `1.0` (one core's worth of time per period).
    pub cpus: f64,
    /// Memory limit in bytes; swap is disabled for the group.
    pub memory_bytes: u64,
}

impl Limits {
    fn validate(&self) -> Result<(), CgroupError> {
        if !self.cpus.is_finite() || self.cpus <= 0.0 {
            return Err(CgroupError::InvalidLimits(format!(
                "cpus must be a positive number of cores, got {}",
                self.cpus
            )));
        }
        if self.memory_bytes == 0 {
            return Err(CgroupError::InvalidLimits(
                "memory_bytes must be positive".to_string(),
            ));
        }
        Ok(())
    }
}

/// Everything that can go wrong; each variant names the file (or path) and
/// the operation.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A filesystem operation on a cgroup (or `/proc`) file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A cgroup (or `/proc`) file did not have the expected contents.
    #[error("parse {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },
    /// No hierarchy with both a CPU and a memory controller was found.
    #[error("no usable cgroup hierarchy (from /proc/mounts and /proc/self/cgroup): {0}")]
    Unsupported(String),
    /// The cgroup name is not a relative path of plain components.
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// The limits cannot be expressed.
    #[error("invalid cgroup limits: {0}")]
    InvalidLimits(String),
}

impl CgroupError {
    fn io(op: impl Into<String>, path: &Path, source: io::Error) -> Self {
        CgroupError::Io {
            op: op.into(),
            path: path.to_path_buf(),
            source,
        }
    }

    fn parse(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        CgroupError::Parse {
            path: path.into(),
            detail: detail.into(),
        }
    }

    /// Parse errors from the pure functions name the file only; put it in `dir`.
    fn located(self, dir: impl Fn(&Path) -> PathBuf) -> Self {
        match self {
            CgroupError::Parse { path, detail } if path.is_relative() => CgroupError::Parse {
                path: dir(&path),
                detail,
            },
            other => other,
        }
    }
}

/// One reading of a cgroup's counters. Counters are cumulative; compare two
/// samples for rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CgroupSample {
    /// v1 `cpuacct.usage`; v2 `cpu.stat` `usage_usec` × 1000.
    pub cpu_usage_ns: u64,
    /// v1/v2 `cpu.stat` `nr_throttled`.
    pub cpu_throttled_periods: u64,
    /// v1/v2 `cpu.stat` `nr_periods`.
    pub cpu_periods: u64,
    /// v1 `cpu.stat` `throttled_time`; v2 `cpu.stat` `throttled_usec` × 1000.
    pub cpu_throttled_ns: u64,
    /// v1 `memory.usage_in_bytes`; v2 `memory.current`.
    pub memory_bytes: u64,
    /// v1 `memory.stat` `total_rss` (or `rss`); v2 `memory.stat` `anon`.
    pub memory_anon_bytes: u64,
    /// v1 `memory.stat` `total_cache` (or `cache`); v2 `memory.stat` `file`.
    pub memory_file_bytes: u64,
    /// v1 `memory.kmem.usage_in_bytes` (0 if absent); v2 `memory.stat`
    /// `kernel` (or `kernel_stack + slab + sock + pagetables`).
    pub kernel_bytes: u64,
    /// v1 `memory.kmem.tcp.usage_in_bytes`; v2 `memory.stat` `sock`.
    pub socket_bytes: u64,
    /// v1 `memory.oom_control` `oom_kill`; v2 `memory.events` `oom_kill`.
    pub oom_kills: u64,
    /// v1 `memory.max_usage_in_bytes`; v2 `memory.peak` (0 if absent).
    pub memory_max_usage_bytes: u64,
}

impl CgroupSample {
    /// CPU time used between `earlier` and `self`, in seconds.
    pub fn cpu_seconds_since(&self, earlier: &CgroupSample) -> f64 {
        self.cpu_usage_ns.saturating_sub(earlier.cpu_usage_ns) as f64 / 1e9
    }

    /// Whether the group was throttled by its CPU quota between `earlier`
    /// and `self`.
    pub fn throttled_since(&self, earlier: &CgroupSample) -> bool {
        self.cpu_throttled_periods > earlier.cpu_throttled_periods
            || self.cpu_throttled_ns > earlier.cpu_throttled_ns
    }
}

// ---------------------------------------------------------------------------
// Pure parsing
// ---------------------------------------------------------------------------

/// Parses "flat keyed" files (`key value` per line: `memory.stat`,
/// `cpu.stat`, `memory.events`, `memory.oom_control`). Lines whose value is
/// not an unsigned integer are skipped.
pub fn parse_flat_keyed(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let key = fields.next()?;
            let value = fields.next()?.parse::<u64>().ok()?;
            if fields.next().is_some() {
                return None;
            }
            Some((key.to_string(), value))
        })
        .collect()
}

/// Parses a single-value file such as `cpuacct.usage` or `memory.current`.
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let value = text.trim();
    value
        .parse::<u64>()
        .map_err(|e| format!("expected an unsigned integer, got {value:?}: {e}"))
}

/// Parses a limit file that may read `max` (v2 `memory.max`, `memory.peak`…):
/// `None` means unlimited.
pub fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "max" => Ok(None),
        other => parse_u64(other).map(Some),
    }
}

/// Parses v2 `cpu.max` (`"$QUOTA $PERIOD"`, quota may be `max`) into
/// `(quota_us, period_us)`; a `None` quota means unlimited.
pub fn parse_cpu_max(text: &str) -> Result<(Option<u64>, u64), String> {
    let mut fields = text.split_whitespace();
    let (Some(quota), Some(period), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!(
            "expected \"$QUOTA $PERIOD\", got {:?}",
            text.trim()
        ));
    };
    let quota = parse_limit(quota)?;
    let period = parse_u64(period)?;
    Ok((quota, period))
}

/// The CFS quota, in microseconds per [`CPU_PERIOD_US`], for `cpus` cores.
pub fn cpu_quota_us(cpus: f64) -> u64 {
    let quota = (cpus * CPU_PERIOD_US as f64).round();
    // `as` saturates for out-of-range floats.
    (quota as u64).max(MIN_CPU_QUOTA_US)
}

/// The v2 `cpu.max` line for `cpus` cores.
pub fn format_cpu_max(cpus: f64) -> String {
    format!("{} {}", cpu_quota_us(cpus), CPU_PERIOD_US)
}

/// The controllers of `wanted` that a `cgroup.subtree_control` (or
/// `cgroup.controllers`) text does not list.
pub fn missing_controllers<'a>(list: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let present: HashSet<&str> = list.split_whitespace().collect();
    wanted
        .iter()
        .copied()
        .filter(|c| !present.contains(c))
        .collect()
}

/// A `key value` file parsed and named, for lookups with good errors.
struct KeyedFile<'a> {
    name: &'a str,
    values: HashMap<String, u64>,
}

impl<'a> KeyedFile<'a> {
    fn new(name: &'a str, text: &str) -> Self {
        KeyedFile {
            name,
            values: parse_flat_keyed(text),
        }
    }

    fn get(&self, key: &str) -> Option<u64> {
        self.values.get(key).copied()
    }

    fn or_zero(&self, key: &str) -> u64 {
        self.get(key).unwrap_or(0)
    }

    /// The first of `keys` present, else an error naming the file.
    fn first_of(&self, keys: &[&str]) -> Result<u64, CgroupError> {
        keys.iter().find_map(|k| self.get(k)).ok_or_else(|| {
            CgroupError::parse(self.name, format!("missing key {}", keys.join(" or ")))
        })
    }
}

fn single(name: &str, text: &str) -> Result<u64, CgroupError> {
    parse_u64(text).map_err(|detail| CgroupError::parse(name, detail))
}

/// The texts of the v1 files a sample is made of (`None`: file absent).
#[derive(Clone, Copy, Debug, Default)]
pub struct V1Files<'a> {
    pub cpuacct_usage: &'a str,
    pub cpu_stat: &'a str,
    pub memory_usage_in_bytes: &'a str,
    pub memory_max_usage_in_bytes: &'a str,
    pub memory_stat: &'a str,
    pub memory_oom_control: &'a str,
    pub memory_kmem_usage_in_bytes: Option<&'a str>,
    pub memory_kmem_tcp_usage_in_bytes: Option<&'a str>,
}

/// Builds a sample from v1 file texts. Parse errors name the bare file.
pub fn sample_from_v1(files: &V1Files<'_>) -> Result<CgroupSample, CgroupError> {
    let cpu_stat = KeyedFile::new("cpu.stat", files.cpu_stat);
    let memory_stat = KeyedFile::new("memory.stat", files.memory_stat);
    let oom_control = KeyedFile::new("memory.oom_control", files.memory_oom_control);
    Ok(CgroupSample {
        cpu_usage_ns: single("cpuacct.usage", files.cpuacct_usage)?,
        cpu_throttled_periods: cpu_stat.or_zero("nr_throttled"),
        cpu_periods: cpu_stat.or_zero("nr_periods"),
        cpu_throttled_ns: cpu_stat.or_zero("throttled_time"),
        memory_bytes: single("memory.usage_in_bytes", files.memory_usage_in_bytes)?,
        memory_anon_bytes: memory_stat.first_of(&["total_rss", "rss"])?,
        memory_file_bytes: memory_stat.first_of(&["total_cache", "cache"])?,
        kernel_bytes: match files.memory_kmem_usage_in_bytes {
            Some(text) => single("memory.kmem.usage_in_bytes", text)?,
            None => 0,
        },
        socket_bytes: match files.memory_kmem_tcp_usage_in_bytes {
            Some(text) => single("memory.kmem.tcp.usage_in_bytes", text)?,
            None => 0,
        },
        oom_kills: oom_control.or_zero("oom_kill"),
        memory_max_usage_bytes: single(
            "memory.max_usage_in_bytes",
            files.memory_max_usage_in_bytes,
        )?,
    })
}

/// The texts of the v2 files a sample is made of (`None`: file absent).
#[derive(Clone, Copy, Debug, Default)]
pub struct V2Files<'a> {
    pub cpu_stat: &'a str,
    pub memory_current: &'a str,
    pub memory_stat: &'a str,
    pub memory_events: &'a str,
    pub memory_peak: Option<&'a str>,
}

/// Builds a sample from v2 file texts. Parse errors name the bare file.
pub fn sample_from_v2(files: &V2Files<'_>) -> Result<CgroupSample, CgroupError> {
    let cpu_stat = KeyedFile::new("cpu.stat", files.cpu_stat);
    let memory_stat = KeyedFile::new("memory.stat", files.memory_stat);
    let events = KeyedFile::new("memory.events", files.memory_events);
    let kernel_bytes = match memory_stat.get("kernel") {
        Some(kernel) => kernel,
        None => ["kernel_stack", "slab", "sock", "pagetables"]
            .iter()
            .map(|k| memory_stat.or_zero(k))
            .sum(),
    };
    let memory_max_usage_bytes = match files.memory_peak {
        Some(text) => parse_limit(text)
            .map_err(|detail| CgroupError::parse("memory.peak", detail))?
            .unwrap_or(0),
        None => 0,
    };
    Ok(CgroupSample {
        cpu_usage_ns: cpu_stat.first_of(&["usage_usec"])?.saturating_mul(1000),
        cpu_throttled_periods: cpu_stat.or_zero("nr_throttled"),
        cpu_periods: cpu_stat.or_zero("nr_periods"),
        cpu_throttled_ns: cpu_stat.or_zero("throttled_usec").saturating_mul(1000),
        memory_bytes: single("memory.current", files.memory_current)?,
        memory_anon_bytes: memory_stat.first_of(&["anon"])?,
        memory_file_bytes: memory_stat.first_of(&["file"])?,
        kernel_bytes,
        socket_bytes: memory_stat.or_zero("sock"),
        oom_kills: events.or_zero("oom_kill"),
        memory_max_usage_bytes,
    })
}

/// One line of `/proc/mounts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub options: Vec<String>,
}

/// Undoes the octal escapes (`\040` for a space…) of `/proc/mounts`.
fn unescape_mount_field(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Parses `/proc/mounts` (or `/proc/self/mounts`). Malformed lines are skipped.
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let mount_point = fields.next()?;
            let fs_type = fields.next()?;
            let options = fields.next()?;
            Some(MountEntry {
                mount_point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mount_field(
                    mount_point,
                ))),
                fs_type: fs_type.to_string(),
                options: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// One line of `/proc/<pid>/cgroup`: `id:controllers:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcCgroupEntry {
    pub hierarchy_id: u32,
    /// Empty for the unified (v2) hierarchy.
    pub controllers: Vec<String>,
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup`. Malformed lines are skipped.
pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroupEntry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy_id = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some(ProcCgroupEntry {
                hierarchy_id,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// Where one controller lives: its mount and the caller's cgroup in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerPlace {
    pub mount: PathBuf,
    /// The caller's cgroup, relative to the hierarchy root (`/` = root).
    pub own: String,
}

/// The hierarchy to use and where its memory, cpu and cpuacct parts live
/// (on v2 all three are the same place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: CgroupVersion,
    pub memory: ControllerPlace,
    pub cpu: ControllerPlace,
    pub cpuacct: ControllerPlace,
}

/// Chooses the hierarchy from `/proc/mounts`, `/proc/self/cgroup` and the
/// unified root's `cgroup.controllers` (`None` if there is none or it
/// cannot be read): v2 if it offers both `cpu` and `memory`, else v1 if the
/// `memory`, `cpu` and `cpuacct` controllers are all mounted.
pub fn plan_layout(
    mounts: &str,
    self_cgroup: &str,
    v2_root_controllers: Option<&str>,
) -> Result<Layout, CgroupError> {
    let mounts = parse_mounts(mounts);
    let own = parse_proc_cgroup(self_cgroup);

    let v2_mount = mounts.iter().find(|m| m.fs_type == "cgroup2");
    if let (Some(mount), Some(controllers)) = (v2_mount, v2_root_controllers)
        && missing_controllers(controllers, &["cpu", "memory"]).is_empty()
    {
        let own_path = own
            .iter()
            .find(|e| e.hierarchy_id == 0 && e.controllers.is_empty())
            .map_or_else(|| "/".to_string(), |e| e.path.clone());
        let place = ControllerPlace {
            mount: mount.mount_point.clone(),
            own: own_path,
        };
        return Ok(Layout {
            version: CgroupVersion::V2,
            memory: place.clone(),
            cpu: place.clone(),
            cpuacct: place,
        });
    }

    let v1_place = |controller: &str| -> Option<ControllerPlace> {
        let mount = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.options.iter().any(|o| o == controller))?;
        let own_path = own
            .iter()
            .find(|e| e.controllers.iter().any(|c| c == controller))
            .map_or_else(|| "/".to_string(), |e| e.path.clone());
        Some(ControllerPlace {
            mount: mount.mount_point.clone(),
            own: own_path,
        })
    };
    match (v1_place("memory"), v1_place("cpu"), v1_place("cpuacct")) {
        (Some(memory), Some(cpu), Some(cpuacct)) => Ok(Layout {
            version: CgroupVersion::V1,
            memory,
            cpu,
            cpuacct,
        }),
        (memory, cpu, cpuacct) => {
            let missing: Vec<&str> = [
                ("memory", memory.is_none()),
                ("cpu", cpu.is_none()),
                ("cpuacct", cpuacct.is_none()),
            ]
            .iter()
            .filter(|(_, absent)| *absent)
            .map(|(name, _)| *name)
            .collect();
            Err(CgroupError::Unsupported(format!(
                "{}; v1 controllers not mounted: {}",
                match (v2_mount, v2_root_controllers) {
                    (None, _) => "no cgroup2 mount".to_string(),
                    (Some(m), c) => format!(
                        "cgroup2 at {} offers [{}], not both cpu and memory",
                        m.mount_point.display(),
                        c.unwrap_or("").trim()
                    ),
                },
                missing.join(", ")
            )))
        }
    }
}

/// Checks a cgroup name: a relative path of plain, non-empty components.
fn validate_name(name: &str) -> Result<Vec<&str>, CgroupError> {
    let invalid = |reason| CgroupError::InvalidName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.starts_with('/') {
        return Err(invalid("must be relative"));
    }
    if name.contains('\0') {
        return Err(invalid("contains NUL"));
    }
    let components: Vec<&str> = name.split('/').collect();
    if components.iter().any(|c| c.is_empty()) {
        return Err(invalid("has an empty component"));
    }
    if components.iter().any(|c| *c == "." || *c == "..") {
        return Err(invalid("has a '.' or '..' component"));
    }
    Ok(components)
}

// ---------------------------------------------------------------------------
// File access
// ---------------------------------------------------------------------------

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|e| CgroupError::io("read", path, e))
}

/// Reads `path`, `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CgroupError::io("read", path, e)),
    }
}

/// Writes `value` to a cgroup file in one `write` (cgroupfs files take one
/// value per write and are never created).
fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(value.as_bytes())
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|e| CgroupError::io(format!("write {value:?} to"), path, e))
}

fn is_errno(e: &io::Error, errno: i32) -> bool {
    e.raw_os_error() == Some(errno)
}

/// The caller's own cgroup directory in a hierarchy, or the mount if that
/// path is not visible (e.g. a bind-mounted subtree).
fn own_dir(place: &ControllerPlace) -> PathBuf {
    let relative = place.own.trim_start_matches('/');
    if relative.is_empty() {
        return place.mount.clone();
    }
    let dir = place.mount.join(relative);
    if dir.is_dir() {
        dir
    } else {
        place.mount.clone()
    }
}

/// Makes sure `cpu` and `memory` are enabled in `dir`'s `cgroup.subtree_control`.
fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = read_file(&path)?;
    let missing = missing_controllers(&current, &["cpu", "memory"]);
    if missing.is_empty() {
        return Ok(());
    }
    let value = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    write_file(&path, &value)
}

/// Enables `cpu` and `memory` for the children of every directory from the
/// hierarchy root `mount` down to `dir` (inclusive).
fn enable_v2_chain(mount: &Path, dir: &Path) -> Result<(), CgroupError> {
    enable_v2_controllers(mount)?;
    let Ok(relative) = dir.strip_prefix(mount) else {
        return Ok(());
    };
    let mut current = mount.to_path_buf();
    for component in relative.components() {
        current.push(component);
        enable_v2_controllers(&current)?;
    }
    Ok(())
}

/// The pids listed in a `cgroup.procs` text.
fn parse_pids(path: &Path, text: &str) -> Result<Vec<u32>, CgroupError> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse::<u32>()
                .map_err(|e| CgroupError::parse(path, format!("bad pid {l:?}: {e}")))
        })
        .collect()
}

/// Whether `dir` has child cgroups (subdirectories).
fn has_child_cgroups(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        })
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// The cgroup
// ---------------------------------------------------------------------------

/// The group's directory in one mounted hierarchy.
#[derive(Debug)]
struct Hierarchy {
    /// Existing directory the group's name is relative to.
    base: PathBuf,
    /// `base/name`: the group itself.
    leaf: PathBuf,
    /// Where processes still in the group go when it is removed: the
    /// caller's own cgroup in this hierarchy.
    home: PathBuf,
}

/// One cgroup with CPU and memory limits; removed on drop.
#[derive(Debug)]
pub struct Cgroup {
    name: String,
    /// One entry per distinct mount (v1: up to three; v2: one).
    hierarchies: Vec<Hierarchy>,
    /// The hierarchy and the group's memory, cpu and cpuacct directories.
    dirs: CgroupDirs,
    removed: AtomicBool,
}

impl Cgroup {
    /// Detects the hierarchy from `/proc/mounts`, creates `name` (e.g.
    /// `"atunnel-bench-<pid>/tunnel"`; intermediate directories are created
    /// as needed, the last component must not exist yet) and sets `limits`.
    ///
    /// * v1: `cpu.cfs_period_us`/`cpu.cfs_quota_us`; `memory.limit_in_bytes`,
    ///   `memory.memsw.limit_in_bytes` (if present, same value),
    ///   `memory.swappiness=0`, and an unlimited
    ///   `memory.kmem.tcp.limit_in_bytes` to turn TCP memory accounting on
    ///   (it only covers sockets created afterwards).
    /// * v2: `+cpu +memory` in the `cgroup.subtree_control` of the ancestors;
    ///   `cpu.max`, `memory.max`, `memory.swap.max=0` (if present).
    pub fn create(name: &str, limits: &Limits) -> Result<Self, CgroupError> {
        limits.validate()?;
        let components = validate_name(name)?;
        let layout = detect_layout()?;
        let cgroup = match layout.version {
            CgroupVersion::V1 => Self::create_v1(name, &components, &layout)?,
            CgroupVersion::V2 => Self::create_v2(name, &components, &layout)?,
        };
        // From here on, `cgroup` is removed on drop if a limit cannot be set.
        match cgroup.version() {
            CgroupVersion::V1 => cgroup.apply_v1_limits(limits)?,
            CgroupVersion::V2 => cgroup.apply_v2_limits(limits)?,
        }
        tracing::debug!(
            name,
            version = ?cgroup.version(),
            paths = ?cgroup.paths(),
            cpus = limits.cpus,
            memory_bytes = limits.memory_bytes,
            "cgroup created"
        );
        Ok(cgroup)
    }

    fn create_v1(name: &str, components: &[&str], layout: &Layout) -> Result<Self, CgroupError> {
        let mut cgroup = Cgroup {
            name: name.to_string(),
            hierarchies: Vec::new(),
            dirs: CgroupDirs {
                version: CgroupVersion::V1,
                memory: PathBuf::new(),
                cpu: PathBuf::new(),
                cpuacct: PathBuf::new(),
            },
            removed: AtomicBool::new(false),
        };
        // On error, dropping `cgroup` removes what was created so far.
        let mut leaves = Vec::new();
        for place in [&layout.memory, &layout.cpu, &layout.cpuacct] {
            // cpu and cpuacct may share one mount.
            if let Some(h) = cgroup
                .hierarchies
                .iter()
                .find(|h| h.leaf.starts_with(&place.mount))
            {
                leaves.push(h.leaf.clone());
                continue;
            }
            let home = own_dir(place);
            let leaf = create_leaf(&home, components, |_| Ok(()))?;
            leaves.push(leaf.clone());
            cgroup.hierarchies.push(Hierarchy {
                base: home.clone(),
                leaf,
                home,
            });
        }
        if let Ok([memory, cpu, cpuacct]) = <[PathBuf; 3]>::try_from(leaves) {
            cgroup.dirs.memory = memory;
            cgroup.dirs.cpu = cpu;
            cgroup.dirs.cpuacct = cpuacct;
        }
        Ok(cgroup)
    }

    fn create_v2(name: &str, components: &[&str], layout: &Layout) -> Result<Self, CgroupError> {
        let place = &layout.memory;
        let home = own_dir(place);
        // Controllers can only be enabled in cgroups without processes (the
        // root excepted); the caller's own cgroup usually has some.
        let base = match enable_v2_chain(&place.mount, &home) {
            Ok(()) => home.clone(),
            Err(e) => {
                tracing::debug!(error = %e, "using the cgroup2 root instead of the own cgroup");
                enable_v2_chain(&place.mount, &place.mount)?;
                place.mount.clone()
            }
        };
        let leaf = create_leaf(&base, components, enable_v2_controllers)?;
        Ok(Cgroup {
            name: name.to_string(),
            hierarchies: vec![Hierarchy {
                base,
                leaf: leaf.clone(),
                home,
            }],
            dirs: CgroupDirs {
                version: CgroupVersion::V2,
                memory: leaf.clone(),
                cpu: leaf.clone(),
                cpuacct: leaf,
            },
            removed: AtomicBool::new(false),
        })
    }

    fn apply_v1_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        write_file(
            &self.dirs.cpu.join("cpu.cfs_period_us"),
            &CPU_PERIOD_US.to_string(),
        )?;
        write_file(
            &self.dirs.cpu.join("cpu.cfs_quota_us"),
            &cpu_quota_us(limits.cpus).to_string(),
        )?;
        let memory = limits.memory_bytes.to_string();
        // memory.limit_in_bytes must not exceed memsw: set it first.
        write_file(&self.dirs.memory.join("memory.limit_in_bytes"), &memory)?;
        let memsw = self.dirs.memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write_file(&memsw, &memory)?;
        }
        let swappiness = self.dirs.memory.join("memory.swappiness");
        if swappiness.exists() {
            write_file(&swappiness, "0")?;
        }
        let tcp = self.dirs.memory.join("memory.kmem.tcp.limit_in_bytes");
        if tcp.exists() {
            write_file(&tcp, V1_UNLIMITED)?;
        }
        Ok(())
    }

    fn apply_v2_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        let dir = &self.dirs.memory;
        write_file(&dir.join("cpu.max"), &format_cpu_max(limits.cpus))?;
        write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        Ok(())
    }

    /// The hierarchy the group lives in.
    pub fn version(&self) -> CgroupVersion {
        self.dirs.version
    }

    /// The name the group was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's directories, one per mounted hierarchy (v1: memory, cpu,
    /// cpuacct when mounted separately; v2: one).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.hierarchies.iter().map(|h| h.leaf.clone()).collect()
    }

    /// Moves a process (all its threads) into the group by writing its pid
    /// to `cgroup.procs` in every hierarchy.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for h in &self.hierarchies {
            write_file(&h.leaf.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// A hook for `pre_exec` (std or tokio `Command`) that moves the child
    /// into the group before it execs, so that it is accounted from its
    /// first instruction (and, on v1, its sockets get TCP accounting).
    ///
    /// ```no_run
    /// # use atunnel_bench::cgroup::{Cgroup, Limits};
    /// # use std::os::unix::process::CommandExt;
    /// # let cgroup = Cgroup::create("x/y", &Limits { cpus: 1.0, memory_bytes: 1 << 30 }).unwrap();
    /// let mut command = std::process::Command::new("true");
    /// // SAFETY: the hook only calls open(2), write(2) and close(2).
    /// unsafe { command.pre_exec(cgroup.pre_exec_hook()) };
    /// ```
    ///
    /// The hook does not allocate: it only calls `open`, `write` and `close`,
    /// which are async-signal-safe.
    pub fn pre_exec_hook(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let files: Vec<CString> = self
            .hierarchies
            .iter()
            .filter_map(|h| CString::new(h.leaf.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect();
        move || {
            for file in &files {
                // SAFETY: `file` is a valid NUL-terminated path; open(2),
                // write(2) and close(2) are async-signal-safe and the buffer
                // outlives the call.
                unsafe {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // "0" means the writing process itself.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(error);
                    }
                }
            }
            Ok(())
        }
    }

    /// The pids in the group (`cgroup.procs` of the memory hierarchy).
    pub fn processes(&self) -> Result<Vec<u32>, CgroupError> {
        self.dirs.processes()
    }

    /// Reads the group's counters.
    pub fn sample(&self) -> Result<CgroupSample, CgroupError> {
        self.dirs().sample()
    }

    /// Where the group's counters are, for another process to sample.
    pub fn dirs(&self) -> &CgroupDirs {
        &self.dirs
    }

    /// Kills nothing: moves any processes still in the group to the caller's
    /// own cgroup (the group's ancestor, unless v2 had to fall back to the
    /// root), then removes the group's directories, and the intermediate
    /// directories of its name that nothing else uses, retrying briefly while
    /// the kernel still holds them. Idempotent.
    pub fn remove(&self) -> Result<(), CgroupError> {
        if self.removed.load(Ordering::Acquire) {
            return Ok(());
        }
        remove_hierarchies(&self.hierarchies)?;
        self.removed.store(true, Ordering::Release);
        Ok(())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(name = %self.name, error = %e, "could not remove cgroup");
        }
    }
}

/// A group's directories, enough to read its counters: what the process
/// that created it hands to one that only measures it (the bench's worker
/// creates atunnel's group, its load generator samples it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupDirs {
    pub version: CgroupVersion,
    pub memory: PathBuf,
    pub cpu: PathBuf,
    pub cpuacct: PathBuf,
}

impl CgroupDirs {
    /// The pids in the group (`cgroup.procs` of the memory hierarchy).
    pub fn processes(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.memory.join("cgroup.procs");
        parse_pids(&path, &read_file(&path)?)
    }

    /// Reads the group's counters.
    pub fn sample(&self) -> Result<CgroupSample, CgroupError> {
        match self.version {
            CgroupVersion::V1 => self.sample_v1(),
            CgroupVersion::V2 => self.sample_v2(),
        }
    }

    fn sample_v1(&self) -> Result<CgroupSample, CgroupError> {
        let memory = |file: &str| self.memory.join(file);
        let cpuacct_usage = read_file(&self.cpuacct.join("cpuacct.usage"))?;
        let cpu_stat = read_file(&self.cpu.join("cpu.stat"))?;
        let memory_usage = read_file(&memory("memory.usage_in_bytes"))?;
        let memory_max_usage = read_file(&memory("memory.max_usage_in_bytes"))?;
        let memory_stat = read_file(&memory("memory.stat"))?;
        let oom_control = read_file(&memory("memory.oom_control"))?;
        let kmem = read_optional(&memory("memory.kmem.usage_in_bytes"))?;
        let kmem_tcp = read_optional(&memory("memory.kmem.tcp.usage_in_bytes"))?;
        sample_from_v1(&V1Files {
            cpuacct_usage: &cpuacct_usage,
            cpu_stat: &cpu_stat,
            memory_usage_in_bytes: &memory_usage,
            memory_max_usage_in_bytes: &memory_max_usage,
            memory_stat: &memory_stat,
            memory_oom_control: &oom_control,
            memory_kmem_usage_in_bytes: kmem.as_deref(),
            memory_kmem_tcp_usage_in_bytes: kmem_tcp.as_deref(),
        })
        .map_err(|e| {
            e.located(|file| {
                let name = file.to_string_lossy();
                if name.starts_with("cpuacct.") {
                    self.cpuacct.join(file)
                } else if name.starts_with("cpu.") {
                    self.cpu.join(file)
                } else {
                    self.memory.join(file)
                }
            })
        })
    }

    fn sample_v2(&self) -> Result<CgroupSample, CgroupError> {
        let dir = &self.memory;
        let cpu_stat = read_file(&dir.join("cpu.stat"))?;
        let memory_current = read_file(&dir.join("memory.current"))?;
        let memory_stat = read_file(&dir.join("memory.stat"))?;
        let memory_events = read_file(&dir.join("memory.events"))?;
        let memory_peak = read_optional(&dir.join("memory.peak"))?;
        sample_from_v2(&V2Files {
            cpu_stat: &cpu_stat,
            memory_current: &memory_current,
            memory_stat: &memory_stat,
            memory_events: &memory_events,
            memory_peak: memory_peak.as_deref(),
        })
        .map_err(|e| e.located(|file| dir.join(file)))
    }
}

/// Removes a group that `create` made under `name` and whose owner is gone
/// (killed before it could remove it): in every hierarchy, the group below
/// the caller's own cgroup or below the root, as `create` may have placed
/// it. Processes still in it are moved out, not killed. Returns whether
/// anything was found.
pub fn remove_leftover(name: &str) -> Result<bool, CgroupError> {
    let components = validate_name(name)?;
    let layout = detect_layout()?;
    let relative: PathBuf = components.iter().collect();
    let mut found: Vec<Hierarchy> = Vec::new();
    for place in [&layout.memory, &layout.cpu, &layout.cpuacct] {
        let home = own_dir(place);
        for base in [home.clone(), place.mount.clone()] {
            let leaf = base.join(&relative);
            if leaf.is_dir() && !found.iter().any(|h| h.leaf == leaf) {
                found.push(Hierarchy {
                    base,
                    leaf,
                    home: home.clone(),
                });
            }
        }
    }
    remove_hierarchies(&found)?;
    Ok(!found.is_empty())
}

fn detect_layout() -> Result<Layout, CgroupError> {
    let mounts = read_file(Path::new("/proc/mounts"))?;
    let self_cgroup = read_file(Path::new("/proc/self/cgroup"))?;
    let v2_controllers = parse_mounts(&mounts)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .and_then(|m| fs::read_to_string(m.mount_point.join("cgroup.controllers")).ok());
    plan_layout(&mounts, &self_cgroup, v2_controllers.as_deref())
}

/// Creates `base/components…`: intermediate directories as needed (each
/// passed to `prepare_parent` once it exists), the last one fresh. Retries a
/// few times if a concurrent `remove` deletes an intermediate directory.
fn create_leaf(
    base: &Path,
    components: &[&str],
    prepare_parent: impl Fn(&Path) -> Result<(), CgroupError>,
) -> Result<PathBuf, CgroupError> {
    let Some((last, parents)) = components.split_last() else {
        return Err(CgroupError::InvalidName {
            name: String::new(),
            reason: "empty",
        });
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = (|| {
            prepare_parent(base)?;
            let mut dir = base.to_path_buf();
            for component in parents {
                dir.push(component);
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(CgroupError::io("create cgroup directory", &dir, e)),
                }
                prepare_parent(&dir)?;
            }
            dir.push(last);
            fs::create_dir(&dir)
                .map_err(|e| CgroupError::io("create cgroup directory", &dir, e))?;
            Ok(dir)
        })();
        match result {
            Err(CgroupError::Io { ref source, .. })
                if attempt < 5 && source.kind() == io::ErrorKind::NotFound =>
            {
                continue;
            }
            Err(e) => {
                // Leave nothing behind that only this attempt created (an
                // existing leaf keeps its parents in place).
                remove_unused_parents(base, &base.join(components.join("/")));
                return Err(e);
            }
            Ok(leaf) => return Ok(leaf),
        }
    }
}

/// Moves the processes of `leaf` to `home` (ignoring ones that exited).
fn evacuate(leaf: &Path, home: &Path) -> Result<(), CgroupError> {
    let procs = leaf.join("cgroup.procs");
    let Some(text) = read_optional(&procs)? else {
        return Ok(());
    };
    let target = home.join("cgroup.procs");
    for pid in parse_pids(&procs, &text)? {
        match write_raw(&target, &pid.to_string()) {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ESRCH) => {}
            Err(e) => return Err(CgroupError::io(format!("move pid {pid} to"), &target, e)),
        }
    }
    Ok(())
}

/// Removes the group from every hierarchy, going on past failures; the
/// first error, if any.
fn remove_hierarchies(hierarchies: &[Hierarchy]) -> Result<(), CgroupError> {
    let mut first_error = None;
    for h in hierarchies {
        if let Err(e) = remove_hierarchy(h) {
            tracing::debug!(error = %e, "cgroup removal failed");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn remove_hierarchy(h: &Hierarchy) -> Result<(), CgroupError> {
    let deadline = Instant::now() + REMOVE_RETRY_FOR;
    loop {
        if !h.leaf.exists() {
            break;
        }
        evacuate(&h.leaf, &h.home)?;
        match fs::remove_dir(&h.leaf) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            // Busy: processes still exiting (or just moved in), or a child
            // cgroup still going offline.
            Err(e) if is_errno(&e, libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(REMOVE_RETRY_STEP);
            }
            Err(e) => return Err(CgroupError::io("remove cgroup directory", &h.leaf, e)),
        }
    }
    remove_unused_parents(&h.base, &h.leaf);
    Ok(())
}

/// Removes the directories between `base` (exclusive) and `leaf`
/// (exclusive), bottom-up, while nothing else uses them.
fn remove_unused_parents(base: &Path, leaf: &Path) {
    let mut dir = leaf.parent();
    while let Some(current) = dir {
        if current == base || !current.starts_with(base) {
            break;
        }
        if !remove_unused_dir(current) {
            break;
        }
        dir = current.parent();
    }
}

/// Removes an intermediate cgroup directory unless something still uses it
/// (another group below it, or processes). Returns whether it is gone.
fn remove_unused_dir(dir: &Path) -> bool {
    let deadline = Instant::now() + REMOVE_RETRY_FOR;
    loop {
        if !dir.exists() {
            return true;
        }
        if has_child_cgroups(dir) {
            return false;
        }
        match fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(procs) if procs.trim().is_empty() => {}
            _ => return false,
        }
        match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            // A just-removed child can keep the parent busy briefly.
            Err(e) if is_errno(&e, libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(REMOVE_RETRY_STEP);
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "left cgroup directory in place");
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($path:literal) => {
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/cgroup/",
                $path
            ))
        };
    }

    fn v1_files() -> V1Files<'static> {
        V1Files {
            cpuacct_usage: fixture!("v1/cpuacct.usage"),
            cpu_stat: fixture!("v1/cpu.stat"),
            memory_usage_in_bytes: fixture!("v1/memory.usage_in_bytes"),
            memory_max_usage_in_bytes: fixture!("v1/memory.max_usage_in_bytes"),
            memory_stat: fixture!("v1/memory.stat"),
            memory_oom_control: fixture!("v1/memory.oom_control"),
            memory_kmem_usage_in_bytes: Some(fixture!("v1/memory.kmem.usage_in_bytes")),
            memory_kmem_tcp_usage_in_bytes: Some(fixture!("v1/memory.kmem.tcp.usage_in_bytes")),
        }
    }

    fn v2_files() -> V2Files<'static> {
        V2Files {
            cpu_stat: fixture!("v2/cpu.stat"),
            memory_current: fixture!("v2/memory.current"),
            memory_stat: fixture!("v2/memory.stat"),
            memory_events: fixture!("v2/memory.events"),
            memory_peak: Some(fixture!("v2/memory.peak")),
        }
    }

    #[test]
    fn flat_keyed_v1_memory_stat() {
        let stat = parse_flat_keyed(fixture!("v1/memory.stat"));
        assert_eq!(stat["rss"], 28_602_368);
        assert_eq!(stat["total_rss"], 28_602_368);
        assert_eq!(stat["cache"], 2_494_464);
        assert_eq!(stat["total_cache"], 2_494_464);
        assert_eq!(stat["hierarchical_memory_limit"], 67_108_864);
        assert_eq!(stat["total_swap"], 0);
    }

    #[test]
    fn flat_keyed_v2_memory_stat() {
        let stat = parse_flat_keyed(fixture!("v2/memory.stat"));
        assert_eq!(stat["anon"], 28_602_368);
        assert_eq!(stat["file"], 2_494_464);
        assert_eq!(stat["kernel"], 1_556_480);
        assert_eq!(stat["sock"], 3_850_240);
        assert_eq!(stat["slab"], 1_260_768);
        assert_eq!(stat["pgdemote_proactive"], 0);
    }

    #[test]
    fn flat_keyed_skips_junk() {
        let parsed = parse_flat_keyed("a 1\n\nb x\nc 2 3\n d  4 \ne -1\n");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed["a"], 1);
        assert_eq!(parsed["d"], 4);
    }

    #[test]
    fn cpu_stat_both_versions() {
        let v1 = parse_flat_keyed(fixture!("v1/cpu.stat"));
        assert_eq!(v1["nr_periods"], 20);
        assert_eq!(v1["nr_throttled"], 20);
        assert_eq!(v1["throttled_time"], 940_903_069);
        let v2 = parse_flat_keyed(fixture!("v2/cpu.stat"));
        assert_eq!(v2["usage_usec"], 1_052_311);
        assert_eq!(v2["nr_periods"], 21);
        assert_eq!(v2["nr_throttled"], 20);
        assert_eq!(v2["throttled_usec"], 947_512);
        // "core_sched.force_idle_usec" has a dot in the key.
        assert_eq!(v2["core_sched.force_idle_usec"], 0);
    }

    #[test]
    fn memory_events_and_oom_control() {
        let events = parse_flat_keyed(fixture!("v2/memory.events"));
        assert_eq!(events["oom_kill"], 1);
        assert_eq!(events["max"], 1187);
        let oom = parse_flat_keyed(fixture!("v1/memory.oom_control"));
        assert_eq!(oom["oom_kill"], 0);
        assert_eq!(oom["under_oom"], 0);
        let oom = parse_flat_keyed(fixture!("v1/memory.oom_control.after_oom"));
        assert_eq!(oom["oom_kill"], 1);
    }

    #[test]
    fn single_values_and_limits() {
        assert_eq!(parse_u64("1050014166\n"), Ok(1_050_014_166));
        assert!(parse_u64("").is_err());
        assert!(parse_u64("max\n").is_err());
        assert!(parse_u64("-1").is_err());
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("33554432\n"), Ok(Some(33_554_432)));
    }

    #[test]
    fn cpu_max() {
        assert_eq!(
            parse_cpu_max(fixture!("v2/cpu.max.unlimited")),
            Ok((None, 100_000))
        );
        assert_eq!(
            parse_cpu_max(fixture!("v2/cpu.max.one")),
            Ok((Some(100_000), 100_000))
        );
        assert_eq!(
            parse_cpu_max(fixture!("v2/cpu.max.half")),
            Ok((Some(50_000), 100_000))
        );
        assert!(parse_cpu_max("100000").is_err());
        assert!(parse_cpu_max("1 2 3").is_err());
        assert!(parse_cpu_max("max max").is_err());
        assert_eq!(format_cpu_max(0.5), "50000 100000");
        assert_eq!(format_cpu_max(1.0), "100000 100000");
        assert_eq!(format_cpu_max(2.25), "225000 100000");
        // The kernel refuses quotas below 1 ms.
        assert_eq!(cpu_quota_us(0.001), 1_000);
        assert_eq!(
            parse_cpu_max(&format_cpu_max(1.5)),
            Ok((Some(150_000), 100_000))
        );
    }

    #[test]
    fn v1_sample() {
        let sample = sample_from_v1(&v1_files()).expect("v1 sample");
        assert_eq!(
            sample,
            CgroupSample {
                cpu_usage_ns: 1_050_014_166,
                cpu_throttled_periods: 20,
                cpu_periods: 20,
                cpu_throttled_ns: 940_903_069,
                memory_bytes: 31_592_448,
                memory_anon_bytes: 28_602_368,
                memory_file_bytes: 2_494_464,
                kernel_bytes: 172_032,
                socket_bytes: 3_850_240,
                oom_kills: 0,
                memory_max_usage_bytes: 31_592_448,
            }
        );
    }

    #[test]
    fn v1_sample_fallbacks() {
        // Without hierarchical totals, rss and cache are used; without kmem
        // files, kernel and socket bytes are 0.
        let files = V1Files {
            memory_stat: "cache 4096\nrss 8192\n",
            memory_oom_control: fixture!("v1/memory.oom_control.after_oom"),
            memory_kmem_usage_in_bytes: None,
            memory_kmem_tcp_usage_in_bytes: None,
            ..v1_files()
        };
        let sample = sample_from_v1(&files).expect("v1 sample");
        assert_eq!(sample.memory_anon_bytes, 8192);
        assert_eq!(sample.memory_file_bytes, 4096);
        assert_eq!(sample.kernel_bytes, 0);
        assert_eq!(sample.socket_bytes, 0);
        assert_eq!(sample.oom_kills, 1);
    }

    #[test]
    fn v1_sample_errors_name_the_file() {
        let files = V1Files {
            cpuacct_usage: "garbage",
            ..v1_files()
        };
        let err = sample_from_v1(&files).expect_err("bad cpuacct.usage");
        assert!(
            matches!(&err, CgroupError::Parse { path, .. } if path == Path::new("cpuacct.usage")),
            "{err}"
        );
        let files = V1Files {
            memory_stat: "swap 0\n",
            ..v1_files()
        };
        let err = sample_from_v1(&files).expect_err("no rss");
        assert!(err.to_string().contains("memory.stat"), "{err}");
        assert!(err.to_string().contains("total_rss or rss"), "{err}");
        let located = err.located(|f| Path::new("/sys/fs/cgroup/memory/x").join(f));
        assert!(
            located
                .to_string()
                .contains("/sys/fs/cgroup/memory/x/memory.stat"),
            "{located}"
        );
    }

    #[test]
    fn v2_sample() {
        let sample = sample_from_v2(&v2_files()).expect("v2 sample");
        assert_eq!(
            sample,
            CgroupSample {
                cpu_usage_ns: 1_052_311_000,
                cpu_throttled_periods: 20,
                cpu_periods: 21,
                cpu_throttled_ns: 947_512_000,
                memory_bytes: 33_554_432,
                memory_anon_bytes: 28_602_368,
                memory_file_bytes: 2_494_464,
                kernel_bytes: 1_556_480,
                socket_bytes: 3_850_240,
                oom_kills: 1,
                memory_max_usage_bytes: 33_554_432,
            }
        );
    }

    #[test]
    fn v2_sample_fallbacks() {
        let files = V2Files {
            memory_stat: fixture!("v2/memory.stat.no_kernel_key"),
            memory_peak: None,
            // cpu.stat without the cpu controller enabled: no throttling keys.
            cpu_stat: "usage_usec 7\nuser_usec 5\nsystem_usec 2\n",
            ..v2_files()
        };
        let sample = sample_from_v2(&files).expect("v2 sample");
        // kernel_stack + slab + sock + pagetables
        assert_eq!(
            sample.kernel_bytes,
            32_768 + 1_260_768 + 3_850_240 + 253_952
        );
        assert_eq!(sample.memory_max_usage_bytes, 0);
        assert_eq!(sample.cpu_usage_ns, 7_000);
        assert_eq!(sample.cpu_periods, 0);
        assert_eq!(sample.cpu_throttled_periods, 0);
        assert_eq!(sample.cpu_throttled_ns, 0);
    }

    #[test]
    fn v2_sample_errors_name_the_file() {
        let files = V2Files {
            memory_current: "max",
            ..v2_files()
        };
        let err = sample_from_v2(&files).expect_err("bad memory.current");
        assert!(err.to_string().contains("memory.current"), "{err}");
        let files = V2Files {
            cpu_stat: "nr_periods 1\n",
            ..v2_files()
        };
        let err = sample_from_v2(&files).expect_err("no usage_usec");
        assert!(err.to_string().contains("cpu.stat"), "{err}");
    }

    #[test]
    fn cpu_seconds_and_throttling_deltas() {
        let earlier = CgroupSample {
            cpu_usage_ns: 1_000_000_000,
            cpu_throttled_periods: 3,
            cpu_periods: 10,
            cpu_throttled_ns: 5_000,
            ..CgroupSample::default()
        };
        let later = CgroupSample {
            cpu_usage_ns: 1_500_000_000,
            cpu_periods: 20,
            ..earlier
        };
        assert!((later.cpu_seconds_since(&earlier) - 0.5).abs() < 1e-12);
        assert!(!later.throttled_since(&earlier));
        let throttled = CgroupSample {
            cpu_throttled_periods: 4,
            ..later
        };
        assert!(throttled.throttled_since(&earlier));
        let throttled_time_only = CgroupSample {
            cpu_throttled_ns: 6_000,
            ..later
        };
        assert!(throttled_time_only.throttled_since(&earlier));
        // Going backwards (a different group) never yields negative time.
        assert_eq!(earlier.cpu_seconds_since(&later), 0.0);
        assert!(!earlier.throttled_since(&throttled));
        assert_eq!(later.cpu_seconds_since(&later), 0.0);
    }

    #[test]
    fn mounts_and_proc_cgroup() {
        let mounts = parse_mounts(fixture!("hybrid.mounts"));
        let memory = mounts
            .iter()
            .find(|m| m.options.iter().any(|o| o == "memory"))
            .expect("memory mount");
        assert_eq!(memory.mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(memory.fs_type, "cgroup");
        let escaped = parse_mounts("none /mnt/a\\040b cgroup2 rw 0 0\n");
        assert_eq!(escaped[0].mount_point, Path::new("/mnt/a b"));

        let own = parse_proc_cgroup(fixture!("legacy.self_cgroup"));
        assert_eq!(own.len(), 7);
        assert_eq!(own[4].controllers, ["cpu", "cpuacct"]);
        assert_eq!(own[4].path, "/user.slice");
        assert_eq!(own[6].hierarchy_id, 0);
        assert!(own[6].controllers.is_empty());
        // A path may contain ':'.
        let odd = parse_proc_cgroup("0::/a:b\n");
        assert_eq!(odd[0].path, "/a:b");
    }

    #[test]
    fn layout_hybrid_with_separate_cpu_and_cpuacct() {
        // This machine: v1 memory/cpu/cpuacct, cgroup2 with hugetlb only.
        let layout = plan_layout(
            fixture!("hybrid.mounts"),
            fixture!("hybrid.self_cgroup"),
            Some(fixture!("hybrid.unified_controllers")),
        )
        .expect("layout");
        assert_eq!(layout.version, CgroupVersion::V1);
        assert_eq!(layout.memory.mount, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(layout.memory.own, "/jobs/0123456789abcdef");
        assert_eq!(layout.cpu.mount, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(layout.cpu.own, "/");
        assert_eq!(layout.cpuacct.mount, Path::new("/sys/fs/cgroup/cpuacct"));
    }

    #[test]
    fn layout_legacy_with_joint_cpu_cpuacct() {
        let layout = plan_layout(
            fixture!("legacy.mounts"),
            fixture!("legacy.self_cgroup"),
            Some(fixture!("legacy.unified_controllers")),
        )
        .expect("layout");
        assert_eq!(layout.version, CgroupVersion::V1);
        assert_eq!(layout.cpu.mount, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(layout.cpu, layout.cpuacct);
        assert_eq!(layout.cpu.own, "/user.slice");
        assert_eq!(
            layout.memory.own,
            "/user.slice/user-1000.slice/session-2.scope"
        );
    }

    #[test]
    fn layout_unified() {
        let layout = plan_layout(
            fixture!("v2.mounts"),
            fixture!("v2.self_cgroup"),
            Some(fixture!("v2.controllers")),
        )
        .expect("layout");
        assert_eq!(layout.version, CgroupVersion::V2);
        assert_eq!(layout.memory.mount, Path::new("/sys/fs/cgroup"));
        assert_eq!(
            layout.memory.own,
            "/user.slice/user-1000.slice/session-3.scope"
        );
        assert_eq!(layout.memory, layout.cpu);
    }

    #[test]
    fn layout_unsupported() {
        // cgroup2 without cpu/memory and no v1 controllers.
        let err = plan_layout(fixture!("v2.mounts"), "0::/\n", Some("pids io\n"))
            .expect_err("no controllers");
        assert!(matches!(err, CgroupError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("memory, cpu, cpuacct"), "{err}");
        let err = plan_layout("proc /proc proc rw 0 0\n", "", None).expect_err("nothing");
        assert!(err.to_string().contains("no cgroup2 mount"), "{err}");
    }

    #[test]
    fn subtree_control() {
        assert_eq!(
            missing_controllers("cpuset io\n", &["cpu", "memory"]),
            ["cpu", "memory"]
        );
        assert!(missing_controllers("cpu io memory pids\n", &["cpu", "memory"]).is_empty());
        assert_eq!(
            missing_controllers("cpuset memory", &["cpu", "memory"]),
            ["cpu"]
        );
        assert_eq!(missing_controllers("", &["memory"]), ["memory"]);
    }

    #[test]
    fn names_and_limits_are_validated() {
        assert_eq!(validate_name("a/b").expect("valid"), ["a", "b"]);
        for bad in ["", "/a", "a//b", "a/", "a/../b", ".", "a\0b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        for (cpus, memory_bytes) in [
            (0.0, 1),
            (-1.0, 1),
            (f64::NAN, 1),
            (f64::INFINITY, 1),
            (1.0, 0),
        ] {
            assert!(
                Limits { cpus, memory_bytes }.validate().is_err(),
                "{cpus} {memory_bytes}"
            );
        }
        assert!(
            Limits {
                cpus: 0.5,
                memory_bytes: 1 << 20
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn pids() {
        let path = Path::new("cgroup.procs");
        assert_eq!(parse_pids(path, "12\n345\n").expect("pids"), [12, 345]);
        assert_eq!(parse_pids(path, "").expect("pids"), Vec::<u32>::new());
        assert!(parse_pids(path, "x\n").is_err());
    }

    #[test]
    fn errors_name_file_and_operation() {
        let err = write_file(Path::new("/nonexistent-dir/cpu.max"), "50000 100000")
            .expect_err("no such file");
        let text = err.to_string();
        assert!(
            text.contains("write \"50000 100000\" to /nonexistent-dir/cpu.max"),
            "{text}"
        );
        let err = read_file(Path::new("/nonexistent-dir/memory.stat")).expect_err("no such file");
        assert!(
            err.to_string()
                .starts_with("read /nonexistent-dir/memory.stat: "),
            "{err}"
        );
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// `cgroup.procs`: one pid a line; anything else is refused naming
        /// the file and the line.
        #[test]
        fn cgroup_procs_read_back_every_pid_or_refuse_the_bad_line(
            pids in prop::collection::vec(any::<u32>(), 0..10),
            bad in prop::option::of((any::<prop::sample::Index>(), "[ -~]{1,12}")),
        ) {
            let mut lines: Vec<String> = pids.iter().map(|p| format!(" {p}\t")).collect();
            if let Some((at, junk)) = &bad {
                lines.insert(at.index(lines.len() + 1), junk.clone());
            }
            let text = lines.join("\n");
            let path = Path::new("/sys/fs/cgroup/x/cgroup.procs");
            match parse_pids(path, &text) {
                Ok(got) => {
                    let want: Vec<u32> = text.lines().filter_map(|l| {
                        let l = l.trim();
                        (!l.is_empty()).then(|| l.parse().expect("only pids parse"))
                    }).collect();
                    prop_assert_eq!(got, want);
                }
                Err(e) => {
                    let (_, junk) = bad.expect("only a junk line is refused");
                    prop_assert!(junk.trim().parse::<u32>().is_err());
                    let (text, quoted) = (e.to_string(), format!("{:?}", junk.trim()));
                    prop_assert!(text.contains("cgroup.procs") && text.contains(&quoted), "{}", text);
                }
            }
        }
    }
}
