//! Lockstep: every thread of a process tree on one CPU under `SCHED_FIFO`,
//! for the span of a cost window, so that the chain a unit of work runs
//! through (the load, the contender, the far end) takes its steps in the
//! same order whatever else the machine runs.
//!
//! Why: how many system calls and context switches a relay makes per unit
//! depends on how its reads interleave with its peers' writes. With the
//! chain spread over the machine's cores under the normal scheduler, a
//! read finds one TCP segment or a whole batch depending on who ran when,
//! and a neighbour keeping a core busy changes that (the same build's
//! egress-download made 167 and 322 syscalls per MiB in two quick runs).
//! On one CPU under `SCHED_FIFO` at one priority a woken thread waits until
//! the running one blocks, and no normal-priority process (a neighbour)
//! preempts any of them: each step runs until it has nothing left to do,
//! the same sequence each time. The figures are then those of that regime
//! (the fewest wake-ups the chain can make, each reading everything
//! available), for every contender alike.
//!
//! The kernel's real-time throttling (`kernel.sched_rt_runtime_us`, 95 %
//! of each second by default) is off for the span: a unit that keeps the
//! CPU longer than that (one under callgrind, ~50x slower) was otherwise
//! stopped wherever its budget ran out, and its peers ran ahead meanwhile
//! (egress-download's instructions per MiB spread 4.23M..4.47M over two
//! pairs). The chain keeps only one of the machine's CPUs, and every thread
//! of it blocks once its unit is done (a window ends when the contender ran
//! nothing for a while), so the rest of the machine keeps the others.
//! Where real-time group scheduling is on (cgroup v1's
//! `cpu.rt_runtime_us`), a cgroup's threads may be real-time only with a
//! runtime of their own: each such cgroup holding a thread of the tree gets
//! [`GROUP_RT_RUNTIME_US`] for the span. Everything goes back as it was on
//! release. What the span changes beyond the tree's own threads (the
//! sysctl, the cgroups' runtimes) is written to a journal first
//! ([`JOURNAL`]), so that if the load role is killed inside a window (an
//! interrupted run stops it; SIGKILL), `run` puts it back as it clears up,
//! or the next run or span does ([`recover_if_idle`]); the threads die
//! with their processes. One span runs at a time on the machine (a lock,
//! which the kernel drops with its holder): a second one would take the
//! first's changed values for the ones to put back.
//! Where `SCHED_FIFO` is refused (cgroup v2 with real-time group
//! scheduling), the threads are pinned only, and [`Lockstep::fifo`] says
//! so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use nix::sched::CpuSet;
use nix::unistd::Pid;

/// The real-time runtime per second a cgroup of the tree gets for the span
/// (of the root's 950,000 µs), which lets its threads be real-time at all
/// (with throttling off, it limits nothing).
pub const GROUP_RT_RUNTIME_US: u64 = 400_000;

/// The machine-wide real-time throttling setting.
const RT_RUNTIME_SYSCTL: &str = "/proc/sys/kernel/sched_rt_runtime_us";

/// Where a span's machine-wide changes are journalled (each file and the
/// content it gets back), from before the first until after the last is
/// put back.
pub const JOURNAL: &str = "/run/atunnel-bench-lockstep";

/// The lock a span holds ([`SpanLock`]).
const LOCK: &str = "/run/atunnel-bench-lockstep.lock";

/// The real-time priority of every thread of the tree: one for all, so that
/// none preempts another.
const PRIORITY: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum LockstepError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("no CPU to pin to")]
    NoCpu,
}

/// A thread's scheduling as it was before the span.
#[derive(Clone, Copy)]
struct Saved {
    policy: i32,
    priority: i32,
}

/// A process tree in lockstep until [`Lockstep::release`] (or drop).
pub struct Lockstep {
    /// Dropped once everything is put back.
    lock: Option<SpanLock>,
    root: u32,
    spare: BTreeSet<u32>,
    cpu: usize,
    /// The affinity the tree's threads get back (the caller's own).
    all_cpus: CpuSet,
    saved: BTreeMap<u32, Saved>,
    /// Each file written for the span (the cgroups' `cpu.rt_runtime_us`,
    /// parents first, then the throttling sysctl) and its former content.
    rt_runtime: Vec<(PathBuf, String)>,
    fifo: bool,
    released: bool,
}

impl Lockstep {
    /// Puts every thread of `root` and its descendants, but the calling
    /// thread and the processes in `spare` (and theirs), on the last CPU
    /// the caller may use, under `SCHED_FIFO`. The calling thread stays as
    /// it is, so that what it starts (perf, callgrind_control) is not part
    /// of the chain.
    pub fn engage(root: u32, spare: &[u32]) -> Result<Self, LockstepError> {
        let all_cpus =
            nix::sched::sched_getaffinity(Pid::from_raw(0)).map_err(|e| LockstepError::Io {
                what: "sched_getaffinity".into(),
                source: e.into(),
            })?;
        let cpu = (0..CpuSet::count())
            .rev()
            .find(|&c| all_cpus.is_set(c).unwrap_or(false))
            .ok_or(LockstepError::NoCpu)?;
        let lock = SpanLock::take(true)
            .map_err(|source| LockstepError::Io {
                what: LOCK.into(),
                source,
            })?
            .expect("a waiting lock is taken or fails");
        let mut ls = Lockstep {
            lock: Some(lock),
            root,
            spare: spare.iter().copied().collect(),
            cpu,
            all_cpus,
            saved: BTreeMap::new(),
            rt_runtime: Vec::new(),
            fifo: true,
            released: false,
        };
        // A span killed before it was put back: first put that back.
        for line in recover(Path::new(JOURNAL)) {
            eprintln!("atunnel-bench: {line}");
        }
        ls.raise_group_runtime()?;
        ls.set_file(Path::new(RT_RUNTIME_SYSCTL), "-1")?;
        let mut one = CpuSet::new();
        one.set(cpu).map_err(|e| LockstepError::Io {
            what: format!("CPU {cpu}"),
            source: e.into(),
        })?;
        let me = nix::unistd::gettid().as_raw() as u32;
        for tid in ls.threads() {
            if tid == me {
                continue;
            }
            let Some(saved) = scheduling_of(tid) else {
                continue;
            };
            ls.saved.insert(tid, saved);
            // A thread that ended since the listing has nothing to pin.
            let _ = nix::sched::sched_setaffinity(Pid::from_raw(tid as i32), &one);
            if ls.fifo && set_scheduling(tid, libc::SCHED_FIFO, PRIORITY) == Err(libc::EPERM) {
                ls.fifo = false;
            }
        }
        Ok(ls)
    }

    /// The CPU the tree runs on.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Whether the threads run under `SCHED_FIFO` (else pinned only).
    pub fn fifo(&self) -> bool {
        self.fifo
    }

    /// Puts every thread back as it was (a thread started during the span
    /// gets the normal policy) and the cgroups' runtimes back.
    pub fn release(mut self) {
        self.restore();
    }

    fn restore(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        // Twice: a thread started by one being restored is seen the second
        // time.
        for _ in 0..2 {
            for tid in self.threads() {
                let s = self.saved.get(&tid).copied().unwrap_or(Saved {
                    policy: libc::SCHED_OTHER,
                    priority: 0,
                });
                let _ = set_scheduling(tid, s.policy, s.priority);
                let _ = nix::sched::sched_setaffinity(Pid::from_raw(tid as i32), &self.all_cpus);
            }
        }
        let changed = std::mem::take(&mut self.rt_runtime);
        for line in put_back(changed) {
            eprintln!("atunnel-bench: {line}");
        }
        if let Err(e) = std::fs::remove_file(JOURNAL)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("atunnel-bench: removing {JOURNAL}: {e}");
        }
        self.lock = None;
    }

    /// Every thread of the tree but the spared processes' and theirs.
    fn threads(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for pid in tree(self.root, &self.spare) {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            out.extend(
                tasks
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()),
            );
        }
        out
    }

    /// Gives each v1 `cpu` cgroup holding a process of the tree (and its
    /// ancestors, parents first) a real-time runtime, if it has none.
    fn raise_group_runtime(&mut self) -> Result<(), LockstepError> {
        let Some(mount) = atunnel_host::location::v1_mount("cpu") else {
            return Ok(());
        };
        let mut groups = BTreeSet::new();
        for pid in tree(self.root, &self.spare) {
            if let Some(g) = atunnel_host::location::v1_cgroup_of(pid, "cpu") {
                groups.insert(g);
            }
        }
        // Parents first: a child's runtime may not exceed its parent's.
        let mut chain: Vec<PathBuf> = Vec::new();
        for g in groups {
            let mut p = PathBuf::new();
            for part in Path::new(&g).components().skip(1) {
                p.push(part);
                if !chain.contains(&p) {
                    chain.push(p.clone());
                }
            }
        }
        for rel in chain {
            let file = mount.join(&rel).join("cpu.rt_runtime_us");
            let Ok(old) = std::fs::read_to_string(&file) else {
                continue;
            };
            if old.trim().parse::<i64>().unwrap_or(0) >= GROUP_RT_RUNTIME_US as i64 {
                continue;
            }
            self.set_file(&file, &GROUP_RT_RUNTIME_US.to_string())?;
        }
        Ok(())
    }

    /// Writes `value` to `file`, its former content kept to put back (and
    /// journalled before the write).
    fn set_file(&mut self, file: &Path, value: &str) -> Result<(), LockstepError> {
        let old = std::fs::read_to_string(file).map_err(|source| LockstepError::Io {
            what: format!("reading {}", file.display()),
            source,
        })?;
        let mut journal = self.rt_runtime.clone();
        journal.push((file.to_path_buf(), old.clone()));
        write_journal(Path::new(JOURNAL), &journal).map_err(|source| LockstepError::Io {
            what: format!("writing {JOURNAL}"),
            source,
        })?;
        std::fs::write(file, value).map_err(|source| LockstepError::Io {
            what: format!("writing {value} to {}", file.display()),
            source,
        })?;
        self.rt_runtime.push((file.to_path_buf(), old));
        Ok(())
    }
}

impl Drop for Lockstep {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Puts each file back to its content, last written first: throttling
/// back on first, then children before parents (a parent's runtime may
/// not drop below theirs). Returns what failed, to be said.
fn put_back(changed: Vec<(PathBuf, String)>) -> Vec<String> {
    let mut failed = Vec::new();
    for (file, old) in changed.into_iter().rev() {
        if let Err(e) = std::fs::write(&file, &old) {
            failed.push(format!(
                "putting {} back to {}: {e}",
                file.display(),
                old.trim()
            ));
        }
    }
    failed
}

/// One line per file: its path, a tab, and the content to put back (a
/// number: the sysctl and `cpu.rt_runtime_us` hold one).
fn write_journal(journal: &Path, changed: &[(PathBuf, String)]) -> std::io::Result<()> {
    let mut text = String::new();
    for (file, old) in changed {
        text.push_str(&format!("{}\t{}\n", file.display(), old.trim()));
    }
    std::fs::write(journal, text)
}

/// Puts back what a span that never ended (its process killed) left
/// changed, unless a span is running now (in this or another process).
/// Returns what it did, to be said; nothing if there was no such span.
pub fn recover_if_idle() -> Vec<String> {
    match SpanLock::take(false) {
        Ok(Some(_held)) => recover(Path::new(JOURNAL)),
        Ok(None) => Vec::new(),
        Err(e) => vec![format!("{LOCK}: {e}")],
    }
}

/// Held for a span, from before its first change until after its last is
/// put back: one span at a time on the machine (a test beside a bench
/// run), as a second one would take the first's changed values for the
/// ones to put back. The kernel drops it with its process, however that
/// ends, so a journal found with the lock free is a killed span's.
struct SpanLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl SpanLock {
    /// Waits for the lock if `wait`, else `None` when another holds it.
    fn take(wait: bool) -> std::io::Result<Option<Self>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)?;
        let arg = if wait {
            nix::fcntl::FlockArg::LockExclusive
        } else {
            nix::fcntl::FlockArg::LockExclusiveNonblock
        };
        match nix::fcntl::Flock::lock(file, arg) {
            Ok(lock) => Ok(Some(Self(lock))),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(e.into()),
        }
    }
}

/// Puts back what `journal` says a killed span left changed, and removes
/// it. The caller holds the [`SpanLock`].
fn recover(journal: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(journal) else {
        return Vec::new();
    };
    let changed: Vec<(PathBuf, String)> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(file, old)| (PathBuf::from(file), old.to_string()))
        .collect();
    let mut said: Vec<String> = changed
        .iter()
        .map(|(file, old)| {
            format!(
                "a cost window's lockstep was killed before it ended; putting {} back to {old}",
                file.display()
            )
        })
        .collect();
    said.extend(put_back(changed));
    if let Err(e) = std::fs::remove_file(journal) {
        said.push(format!("removing {}: {e}", journal.display()));
    }
    said
}

/// `root` and its descendants (from each process's parent in
/// `/proc/<pid>/stat`), without `spare` and their descendants.
fn tree(root: u32, spare: &BTreeSet<u32>) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(pids) = atunnel_host::proc_dir::numbered_entries::<u32>("/proc") {
        for (pid, _) in pids {
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        if spare.contains(&p) {
            continue;
        }
        out.push(p);
        todo.extend(children.get(&p).into_iter().flatten());
    }
    out
}

/// The parent of `pid`: the field after the command name (which may hold
/// spaces and parentheses, so read from the last `)`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A thread's policy and priority, or `None` if it is gone.
fn scheduling_of(tid: u32) -> Option<Saved> {
    // SAFETY: sched_getscheduler and sched_getparam only read the thread's
    // scheduling into `param`, a plain struct owned here.
    unsafe {
        let policy = libc::sched_getscheduler(tid as libc::pid_t);
        if policy < 0 {
            return None;
        }
        let mut param = libc::sched_param { sched_priority: 0 };
        if libc::sched_getparam(tid as libc::pid_t, &mut param) != 0 {
            return None;
        }
        Some(Saved {
            policy,
            priority: param.sched_priority,
        })
    }
}

/// Sets a thread's policy and priority; the errno on failure.
fn set_scheduling(tid: u32, policy: i32, priority: i32) -> Result<(), i32> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler reads `param`, a plain struct that lives
    // across the call; nix has no wrapper for it.
    let r = unsafe { libc::sched_setscheduler(tid as libc::pid_t, policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn cpus_allowed(tid: u32) -> String {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn policy(tid: u32) -> i32 {
        scheduling_of(tid).unwrap().policy
    }

    /// A tree of processes (a shell and two sleeps below it, one of them
    /// spared) goes into lockstep and back. Needs root (as CI runs), for
    /// `SCHED_FIFO`; without it this fails.
    #[test]
    fn a_process_tree_runs_on_one_cpu_under_fifo_and_goes_back() {
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let root = shell.id();
        // Both sleeps started (the shell's children, found by parent).
        let sleeps = loop {
            let t = tree(root, &BTreeSet::new());
            if t.len() == 3 {
                break t[1..].to_vec();
            }
            std::thread::yield_now();
        };
        let spared = sleeps[0];
        let before = cpus_allowed(root);
        let ls = Lockstep::engage(root, &[spared]).unwrap();
        assert!(ls.fifo(), "SCHED_FIFO refused (not root?)");
        let one = ls.cpu().to_string();
        for pid in [root, sleeps[1]] {
            assert_eq!(policy(pid), libc::SCHED_FIFO, "pid {pid}");
            assert_eq!(cpus_allowed(pid), one, "pid {pid}");
        }
        assert_eq!(policy(spared), libc::SCHED_OTHER);
        assert_eq!(cpus_allowed(spared), before);
        ls.release();
        for pid in [root, sleeps[1]] {
            assert_eq!(policy(pid), libc::SCHED_OTHER, "pid {pid}");
            assert_eq!(cpus_allowed(pid), before, "pid {pid}");
        }
        let _ = shell.kill();
        for pid in &sleeps {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), nix::sys::signal::SIGKILL);
        }
        let _ = shell.wait();
    }

    /// What a killed span left changed is put back from its journal, the
    /// last change first, and the journal goes.
    #[test]
    fn a_killed_spans_journal_puts_its_files_back() {
        let dir = tempfile::tempdir().unwrap();
        let (parent, child) = (dir.path().join("parent"), dir.path().join("child"));
        std::fs::write(&parent, "400000\n").unwrap();
        std::fs::write(&child, "400000\n").unwrap();
        let journal = dir.path().join("journal");
        write_journal(
            &journal,
            &[
                (parent.clone(), "0\n".to_string()),
                (child.clone(), "0\n".to_string()),
            ],
        )
        .unwrap();
        let said = recover(&journal);
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(std::fs::read_to_string(&parent).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(&child).unwrap(), "0");
        assert!(!journal.exists());
        // No journal: nothing to do, nothing said.
        assert!(recover(&journal).is_empty());
    }

    #[test]
    fn the_parent_is_read_past_a_command_name_with_parentheses() {
        let me = std::process::id();
        assert_eq!(parent_of(me), Some(nix::unistd::getppid().as_raw() as u32));
    }
}
