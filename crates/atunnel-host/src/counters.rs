//! A cgroup's counters (CPU time and throttling, memory and its parts,
//! socket memory, OOM kills), v1 or v2, for a measurer to compare over a
//! window. The files are read by [`CgroupDirs::sample`]; the texts are
//! turned into a [`CgroupSample`] by pure functions tested on sample files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{HostError, read, read_optional};
use crate::location::CgroupVersion;
use crate::parse::{parse_flat_keyed, parse_limit, parse_pids, parse_u64};

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
    fn first_of(&self, keys: &[&str]) -> Result<u64, HostError> {
        keys.iter().find_map(|k| self.get(k)).ok_or_else(|| {
            HostError::parse(self.name, format!("missing key {}", keys.join(" or ")))
        })
    }
}

fn single(name: &str, text: &str) -> Result<u64, HostError> {
    parse_u64(text).map_err(|detail| HostError::parse(name, detail))
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
pub fn sample_from_v1(files: &V1Files<'_>) -> Result<CgroupSample, HostError> {
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
pub fn sample_from_v2(files: &V2Files<'_>) -> Result<CgroupSample, HostError> {
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
            .map_err(|detail| HostError::parse("memory.peak", detail))?
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
    pub fn processes(&self) -> Result<Vec<u32>, HostError> {
        processes(&self.memory)
    }

    /// Reads the group's counters.
    pub fn sample(&self) -> Result<CgroupSample, HostError> {
        match self.version {
            CgroupVersion::V1 => self.sample_v1(),
            CgroupVersion::V2 => self.sample_v2(),
        }
    }

    fn sample_v1(&self) -> Result<CgroupSample, HostError> {
        let memory = |file: &str| self.memory.join(file);
        let cpuacct_usage = read(&self.cpuacct.join("cpuacct.usage"))?;
        let cpu_stat = read(&self.cpu.join("cpu.stat"))?;
        let memory_usage = read(&memory("memory.usage_in_bytes"))?;
        let memory_max_usage = read(&memory("memory.max_usage_in_bytes"))?;
        let memory_stat = read(&memory("memory.stat"))?;
        let oom_control = read(&memory("memory.oom_control"))?;
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

    fn sample_v2(&self) -> Result<CgroupSample, HostError> {
        let dir = &self.memory;
        let cpu_stat = read(&dir.join("cpu.stat"))?;
        let memory_current = read(&dir.join("memory.current"))?;
        let memory_stat = read(&dir.join("memory.stat"))?;
        let memory_events = read(&dir.join("memory.events"))?;
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

/// The pids in the cgroup at `dir` (its `cgroup.procs`).
pub fn processes(dir: &Path) -> Result<Vec<u32>, HostError> {
    let path = dir.join("cgroup.procs");
    parse_pids(&read(&path)?).map_err(|detail| HostError::parse(path, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_cgroup_procs_is_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("atunnel-host-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("cgroup.procs"), "12\n345\n").expect("write");
        assert_eq!(processes(&dir).expect("pids"), [12, 345]);
        std::fs::write(dir.join("cgroup.procs"), "12\nx\n").expect("write");
        let err = processes(&dir).expect_err("not a pid").to_string();
        std::fs::remove_dir_all(&dir).expect("rm");
        assert!(
            err.contains("cgroup.procs") && err.contains("\"x\""),
            "{err}"
        );
    }
}
