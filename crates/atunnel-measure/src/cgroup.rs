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
//! What is read (where the hierarchies are, the group's counters, its
//! pids) is read through `atunnel-host`; this module creates, limits and
//! removes.
//!
//! Written by hand: cgroups-rs (MIT OR Apache-2.0, v1 and v2) was checked
//! and not taken. It would bring zbus and a second nix into atunnel-measure for
//! what is here a mkdir, a few one-line writes and an rmdir per group, and it
//! does not do what the bench needs around them: place the group under the
//! caller's own cgroup in each v1 hierarchy, fall back to the v2 root under
//! the "no internal processes" rule, switch on v1's TCP memory accounting,
//! and move a process in between its `fork` and `exec` (see
//! [`Cgroup::pre_exec_hook`]).

use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use atunnel_host::location::Layout;
use atunnel_host::parse::missing_controllers;
use atunnel_host::{CgroupDirs, CgroupSample, CgroupVersion, HostError, detect_layout};

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
    /// A filesystem operation on a cgroup file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading the host (where the hierarchies are, a group's files) failed.
    #[error(transparent)]
    Host(#[from] HostError),
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
}

// ---------------------------------------------------------------------------
// Limits as written
// ---------------------------------------------------------------------------

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

/// Makes sure `cpu` and `memory` are enabled in `dir`'s `cgroup.subtree_control`.
fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = atunnel_host::read(&path)?;
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
            let home = place.own_dir();
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
        let home = place.own_dir();
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
    /// # use atunnel_measure::cgroup::{Cgroup, Limits};
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
        Ok(self.dirs.processes()?)
    }

    /// Reads the group's counters.
    pub fn sample(&self) -> Result<CgroupSample, CgroupError> {
        Ok(self.dirs().sample()?)
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
        let home = place.own_dir();
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
    let pids = match atunnel_host::counters::processes(leaf) {
        Ok(pids) => pids,
        Err(HostError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let target = home.join("cgroup.procs");
    for pid in pids {
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
        match atunnel_host::counters::processes(dir) {
            Ok(procs) if procs.is_empty() => {}
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
    use atunnel_host::parse::parse_cpu_max;

    use super::*;

    #[test]
    fn cpu_max_as_written() {
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
    fn errors_name_file_and_operation() {
        let err = write_file(Path::new("/nonexistent-dir/cpu.max"), "50000 100000")
            .expect_err("no such file");
        let text = err.to_string();
        assert!(
            text.contains("write \"50000 100000\" to /nonexistent-dir/cpu.max"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod fuzz {
    use atunnel_host::parse::parse_cpu_max;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn cpu_max_reads_back_what_format_cpu_max_writes(cpus in any::<f64>()) {
            let (quota, period) = parse_cpu_max(&format_cpu_max(cpus)).expect("our own cpu.max");
            prop_assert_eq!(quota, Some(cpu_quota_us(cpus)));
            prop_assert_eq!(period, CPU_PERIOD_US);
        }
    }
}
