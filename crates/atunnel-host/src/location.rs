//! Which cgroup version this host runs and where a process's cgroups are:
//! `/proc/<pid>/cgroup` (the group in each hierarchy), `/proc/mounts`
//! (where each hierarchy is mounted) and the unified root's
//! `cgroup.controllers`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{HostError, read};
use crate::parse::missing_controllers;

/// Where cgroup hierarchies are mounted on a usual host.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Which cgroup hierarchy a group lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
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
                mount_point: PathBuf::from(OsStr::from_bytes(&unescape_mount_field(mount_point))),
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

/// The memory cgroup in a `/proc/self/cgroup` text: a v1 line listing
/// `memory` wins over the v2 `0::` line (on a hybrid host the unified
/// hierarchy has no memory controller).
pub fn locate_memory_cgroup(proc_self_cgroup: &str) -> Option<(CgroupVersion, &str)> {
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

/// This process's memory cgroup directory (under [`CGROUP_ROOT`]) and its
/// version; `None` without one. A path that is not under the mount (inside
/// a cgroup namespace) falls back to the mount's root.
pub fn own_memory_cgroup() -> Option<(CgroupVersion, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (version, path) = locate_memory_cgroup(&own)?;
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
    [mount.join(relative), mount]
        .into_iter()
        .skip(usize::from(!inside))
        .find(|d| d.join(probe).is_file())
        .map(|dir| (version, dir))
}

/// Where one controller lives: its mount and the caller's cgroup in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerPlace {
    pub mount: PathBuf,
    /// The caller's cgroup, relative to the hierarchy root (`/` = root).
    pub own: String,
}

impl ControllerPlace {
    /// The caller's own cgroup directory, or the mount if that path is not
    /// visible (e.g. a bind-mounted subtree).
    pub fn own_dir(&self) -> PathBuf {
        let relative = self.own.trim_start_matches('/');
        if relative.is_empty() {
            return self.mount.clone();
        }
        let dir = self.mount.join(relative);
        if dir.is_dir() {
            dir
        } else {
            self.mount.clone()
        }
    }
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
) -> Result<Layout, HostError> {
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
            Err(HostError::Unsupported(format!(
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

/// This host's [`Layout`], read now.
pub fn detect_layout() -> Result<Layout, HostError> {
    let mounts = read(Path::new("/proc/mounts"))?;
    let self_cgroup = read(Path::new("/proc/self/cgroup"))?;
    let v2_controllers = parse_mounts(&mounts)
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .and_then(|m| std::fs::read_to_string(m.mount_point.join("cgroup.controllers")).ok());
    plan_layout(&mounts, &self_cgroup, v2_controllers.as_deref())
}

/// Where the v1 hierarchy of `controller` is mounted, if it is.
pub fn v1_mount(controller: &str) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    parse_mounts(&mounts)
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.options.iter().any(|o| o == controller))
        .map(|m| m.mount_point)
}

/// `pid`'s cgroup in the v1 hierarchy of `controller` (`/` for the root).
pub fn v1_cgroup_of(pid: u32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_proc_cgroup(&text)
        .into_iter()
        .find(|e| e.controllers.iter().any(|c| c == controller))
        .map(|e| e.path)
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
}
