//! The memory this process is charged and the limit it is charged against:
//! its memory cgroup's (v1 or v2), else the machine's. Each reading is two
//! or three small files, cheap enough to take every few hundred
//! milliseconds.

use std::path::{Path, PathBuf};

use crate::error::{HostError, read};
use crate::location::{CgroupVersion, own_memory_cgroup};
use crate::parse::{
    V1_UNLIMITED_FLOOR, meminfo_bytes, parse_limit, parse_u64, parse_v1_limit, stat_value,
};

/// One reading: what is used and what it may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryCharge {
    /// Bytes: what the OOM killer counts less the page cache it can
    /// reclaim first, floored at 0.
    pub used: u64,
    /// Bytes: the tighter of the cgroup's (and its ancestors') limit and the
    /// machine's MemTotal; `None` when neither is known.
    pub limit: Option<u64>,
}

/// Where memory is read from, fixed at construction.
#[derive(Debug)]
pub struct MemorySource {
    kind: Kind,
    /// MemTotal in bytes, read at construction.
    mem_total: Option<u64>,
}

#[derive(Debug)]
enum Kind {
    V1(PathBuf),
    /// The group, and it and those of its ancestors that have a
    /// `memory.max`: the tightest one applies.
    V2 {
        dir: PathBuf,
        limits: Vec<PathBuf>,
    },
    /// No memory cgroup: MemTotal − MemAvailable of MemTotal.
    Machine,
    /// The given directory has neither version's files.
    Missing(PathBuf),
}

impl MemorySource {
    /// This process's own memory cgroup, else the machine.
    pub fn own() -> Self {
        let kind = match own_memory_cgroup() {
            Some((CgroupVersion::V1, dir)) => Kind::V1(dir),
            Some((CgroupVersion::V2, dir)) => v2(dir),
            None => Kind::Machine,
        };
        Self::with(kind)
    }

    /// A cgroup directory given by an operator: v2 if it has
    /// `memory.current`, v1 if `memory.usage_in_bytes`.
    pub fn at(dir: &Path) -> Self {
        let kind = if dir.join("memory.current").is_file() {
            v2(dir.to_path_buf())
        } else if dir.join("memory.usage_in_bytes").is_file() {
            Kind::V1(dir.to_path_buf())
        } else {
            Kind::Missing(dir.to_path_buf())
        };
        Self::with(kind)
    }

    fn with(kind: Kind) -> Self {
        let mem_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_bytes(&m, "MemTotal"));
        Self { kind, mem_total }
    }

    /// The cgroup directory read; `None`: the machine's memory.
    pub fn dir(&self) -> Option<&Path> {
        match &self.kind {
            Kind::V1(dir) | Kind::V2 { dir, .. } | Kind::Missing(dir) => Some(dir),
            Kind::Machine => None,
        }
    }

    /// Reads the charge now. Reads only procfs and cgroupfs, which do not
    /// block on I/O.
    pub fn read(&self) -> Result<MemoryCharge, HostError> {
        let (usage, inactive_file, cgroup_limit) = match &self.kind {
            Kind::V1(dir) => {
                let usage = parse_at(dir, "memory.usage_in_bytes", parse_u64)?;
                let limit = parse_at(dir, "memory.limit_in_bytes", parse_v1_limit)?;
                let stat = read(&dir.join("memory.stat"))?;
                let inactive = stat_key(dir, &stat, "total_inactive_file")?;
                // The tightest limit of the group and its ancestors.
                let hierarchical = stat_value(&stat, "hierarchical_memory_limit")
                    .filter(|&l| l < V1_UNLIMITED_FLOOR);
                (usage, inactive, min_some(limit, hierarchical))
            }
            Kind::V2 { dir, limits } => {
                let usage = parse_at(dir, "memory.current", parse_u64)?;
                let stat = read(&dir.join("memory.stat"))?;
                let inactive = stat_key(dir, &stat, "inactive_file")?;
                let mut limit = None;
                for file in limits {
                    let max = parse_limit(&read(file)?)
                        .map_err(|detail| HostError::parse(file.clone(), detail))?;
                    limit = min_some(limit, max);
                }
                (usage, inactive, limit)
            }
            Kind::Machine => {
                let path = Path::new("/proc/meminfo");
                let info = read(path)?;
                let field = |key| {
                    meminfo_bytes(&info, key)
                        .ok_or_else(|| HostError::parse(path, format!("no {key}")))
                };
                let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
                return Ok(MemoryCharge {
                    used: total.saturating_sub(available),
                    limit: Some(total),
                });
            }
            Kind::Missing(dir) => {
                return Err(HostError::Unavailable(format!(
                    "{}: neither memory.current (v2) nor memory.usage_in_bytes (v1)",
                    dir.display()
                )));
            }
        };
        Ok(charge(usage, inactive_file, cgroup_limit, self.mem_total))
    }
}

/// The kernel's memory outside any one process, host-wide, in bytes:
/// slab, per-CPU allocations, kernel stacks and page tables
/// (`/proc/meminfo`), where namespaces, devices and nftables live. Other
/// work on the machine moves it too. `None` if /proc/meminfo is unreadable.
pub fn kernel_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some(
        ["Slab", "Percpu", "KernelStack", "PageTables"]
            .iter()
            .filter_map(|key| meminfo_bytes(&info, key))
            .sum(),
    )
}

fn v2(dir: PathBuf) -> Kind {
    let limits = dir
        .ancestors()
        .take_while(|d| d.join("memory.max").is_file())
        .map(|d| d.join("memory.max"))
        .collect();
    Kind::V2 { dir, limits }
}

/// Used: usage less the inactive page cache, floored at 0. Limit: the
/// tighter of the cgroup's and the machine's.
fn charge(
    usage: u64,
    inactive_file: u64,
    cgroup_limit: Option<u64>,
    mem_total: Option<u64>,
) -> MemoryCharge {
    MemoryCharge {
        used: usage.saturating_sub(inactive_file),
        limit: min_some(cgroup_limit, mem_total),
    }
}

fn min_some(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn parse_at<T>(
    dir: &Path,
    file: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, HostError> {
    let path = dir.join(file);
    parse(&read(&path)?).map_err(|detail| HostError::parse(path, detail))
}

fn stat_key(dir: &Path, stat: &str, key: &str) -> Result<u64, HostError> {
    stat_value(stat, key)
        .ok_or_else(|| HostError::parse(dir.join("memory.stat"), format!("no {key}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_leaves_out_inactive_file_and_the_tightest_limit_applies() {
        assert_eq!(
            charge(1000, 300, Some(2000), Some(4000)),
            MemoryCharge {
                used: 700,
                limit: Some(2000)
            }
        );
        // Floored at 0.
        assert_eq!(charge(100, 300, Some(2000), None).used, 0);
        // No cgroup limit: MemTotal; a cgroup limit above it: MemTotal.
        assert_eq!(charge(1, 0, None, Some(4000)).limit, Some(4000));
        assert_eq!(charge(1, 0, Some(8000), Some(4000)).limit, Some(4000));
        assert_eq!(charge(1, 0, None, None).limit, None);
    }

    #[test]
    fn the_kernels_own_memory_is_read_from_meminfo() {
        // Any running Linux has slab and page tables.
        assert!(kernel_bytes().is_some_and(|b| b > 0));
    }
}
