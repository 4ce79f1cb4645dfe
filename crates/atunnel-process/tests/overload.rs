//! The overload guard (`atunnel_process::overload`) against real parts: a real
//! memory cgroup charged by a child process, the test process's own
//! descriptor limit, and cgroup files written by the test for the run loop
//! and the edge cases.
//!
//! The tests run one at a time (`serial`): one of them lowers the process's
//! `RLIMIT_NOFILE` and counts its descriptors, which every guard here reads.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use atunnel_process::overload::{Held, OverloadStats, RECENT_SHED, ResourceReading};
use atunnel_process::{
    OverloadConfig, OverloadGuard, OverloadState, Overloaded, Resource, Shed, ShedAction,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

/// Runs `test` alone, on a runtime of its own built once its turn comes:
/// a test waiting for its turn holds no descriptors.
fn serial(paused: bool, test: impl Future<Output = ()>) {
    static SERIAL: Mutex<()> = Mutex::new(());
    // A test that failed leaves nothing shared broken.
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(paused)
        .build()
        .expect("runtime");
    runtime.block_on(test);
}

const MIB: u64 = 1 << 20;

fn memory(f: &OverloadStats) -> ResourceReading {
    f.memory
        .unwrap_or_else(|| panic!("memory unread: {:?}", f.memory_error))
}

fn descriptors(f: &OverloadStats) -> ResourceReading {
    f.descriptors
        .unwrap_or_else(|| panic!("descriptors unread: {:?}", f.descriptors_error))
}

/// The guard's next sample finds it `state` (its figures printed if not).
fn samples(guard: &OverloadGuard, state: OverloadState) {
    assert_eq!(guard.sample(), state, "{:?}", guard.stats());
}

// ---------------------------------------------------------------------------
// A real memory cgroup
// ---------------------------------------------------------------------------

/// A memory cgroup of its own (v1 or v2, whichever this host has), charged
/// by child processes that write files; everything is undone on drop, also
/// when the test fails.
struct RealCgroup {
    dir: PathBuf,
    usage_file: &'static str,
    children: Vec<Child>,
    files: Vec<PathBuf>,
    /// Bytes of the files present.
    charged: u64,
}

impl RealCgroup {
    fn create(limit: u64) -> Self {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "creating a memory cgroup needs root");
        let name = format!("atunnel-overload-test-{}", std::process::id());
        let root = Path::new("/sys/fs/cgroup");
        let v1 = root.join("memory");
        let (dir, limit_file, usage_file) = if v1.join("memory.limit_in_bytes").is_file() {
            (
                v1.join(&name),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            let controllers =
                fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            assert!(
                controllers.split_whitespace().any(|c| c == "memory"),
                "no memory controller: neither /sys/fs/cgroup/memory (v1) nor memory in \
                 /sys/fs/cgroup/cgroup.controllers (v2: {controllers:?})"
            );
            let subtree = root.join("cgroup.subtree_control");
            let enabled = fs::read_to_string(&subtree).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "memory") {
                fs::write(&subtree, "+memory").expect("enable memory in cgroup.subtree_control");
            }
            (root.join(&name), "memory.max", "memory.current")
        };
        // Left over from a run that was killed.
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cgroup = Self {
            dir,
            usage_file,
            children: Vec::new(),
            files: Vec::new(),
            charged: 0,
        };
        fs::write(cgroup.dir.join(limit_file), limit.to_string()).expect("write the limit");
        // v2: no swap, so the charge stays where it is measured.
        let _ = fs::write(cgroup.dir.join("memory.swap.max"), "0");
        cgroup
    }

    fn usage(&self) -> u64 {
        let text = fs::read_to_string(self.dir.join(self.usage_file)).expect("read usage");
        text.trim().parse().expect("usage is a number")
    }

    /// A child joins the group, writes `bytes` to `file` (charged to the
    /// group: shmem under /dev/shm, page cache elsewhere) and sleeps.
    /// Returns when the group's usage shows the charge.
    async fn fill(&mut self, file: PathBuf, bytes: u64) {
        self.charged += bytes;
        let target = self.charged - MIB;
        self.files.push(file.clone());
        let child = Command::new("sh")
            .args([
                "-c",
                r#"echo $$ > "$0/cgroup.procs" && head -c "$1" /dev/zero > "$2" && exec sleep 60"#,
            ])
            .arg(&self.dir)
            .arg(bytes.to_string())
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sh");
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let written = fs::metadata(&file).map_or(0, |m| m.len());
            if written == bytes && self.usage() >= target {
                return;
            }
            let child = self.children.last_mut().expect("just pushed");
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("filling {} failed: {status}", file.display());
            }
            assert!(
                Instant::now() < deadline,
                "{} has {written} of {bytes} bytes, usage {} of {target}",
                file.display(),
                self.usage()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Removes `file` of `bytes` (its pages leave the group) and waits for
    /// the usage to drop to the files left, plus what the children hold.
    async fn remove(&mut self, file: &Path, bytes: u64) {
        fs::remove_file(file).unwrap_or_else(|e| panic!("rm {}: {e}", file.display()));
        self.charged -= bytes;
        let below = self.charged + 8 * MIB;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.usage() >= below {
            assert!(
                Instant::now() < deadline,
                "usage {} >= {below}",
                self.usage()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RealCgroup {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for file in &self.files {
            let _ = fs::remove_file(file);
        }
        // The kernel may take a moment to let go of the killed tasks.
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// Sheds one file (the "largest consumer"), once, and tells the test.
struct FileShed {
    file: Mutex<Option<(PathBuf, u64)>>,
    calls: AtomicU64,
    tx: mpsc::UnboundedSender<ShedAction>,
}

impl Shed for FileShed {
    fn holdings(&self) -> Vec<(String, Held)> {
        let file = self.file.lock().expect("lock");
        file.iter()
            .map(|(f, bytes)| {
                let held = Held {
                    descriptors: 0,
                    bytes: *bytes,
                };
                (f.display().to_string(), held)
            })
            .collect()
    }

    fn shed(&self, _who: &str) -> Option<ShedAction> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (file, bytes) = self.file.lock().expect("lock").take()?;
        fs::remove_file(&file).expect("shed the file");
        let action = ShedAction {
            who: file.display().to_string(),
            bytes,
            tunnels: 1,
            requests: 0,
        };
        let _ = self.tx.send(action.clone());
        Some(action)
    }
}

#[test]
fn real_cgroup_memory_refuses_past_soft_sheds_past_hard_and_recovers() {
    serial(false, async {
        let limit = 64 * MIB;
        let mut cgroup = RealCgroup::create(limit);
        let pid = std::process::id();
        let interval = Duration::from_millis(20);
        let retry_after = Duration::from_secs(7);
        let guard = OverloadGuard::new(OverloadConfig {
            soft: 0.5,
            hard: 0.8,
            interval,
            retry_after,
            memory_cgroup: Some(cgroup.dir.clone()),
            memory_limit: None,
            ..OverloadConfig::default()
        })
        .expect("guard");
        let f = guard.stats();
        assert_eq!(f.state, OverloadState::Normal, "{f:?}");
        assert_eq!(f.memory_cgroup.as_deref(), Some(cgroup.dir.as_path()));
        assert_eq!(memory(&f).limit, limit);
        assert!(memory(&f).used < 8 * MIB, "{f:?}");
        assert_eq!(guard.admit(), Ok(()));

        // Page cache the kernel can reclaim is not counted: 48 MiB charged,
        // past the soft threshold, is still normal.
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        assert_ne!(
            fs_type(tmp),
            libc::TMPFS_MAGIC,
            "{} must be on disk for page cache",
            tmp.display()
        );
        let cache = tmp.join(format!("atunnel-overload-test-{pid}-cache"));
        cgroup.fill(cache.clone(), 48 * MIB).await;
        assert!(cgroup.usage() as f64 >= 0.5 * limit as f64);
        samples(&guard, OverloadState::Normal);
        assert!(memory(&guard.stats()).used < 16 * MIB);
        cgroup.remove(&cache, 48 * MIB).await;

        // 40 MiB of shmem (not reclaimable without swap): soft.
        let shm_a = PathBuf::from(format!("/dev/shm/atunnel-overload-test-{pid}-a"));
        cgroup.fill(shm_a.clone(), 40 * MIB).await;
        samples(&guard, OverloadState::Soft);
        assert_eq!(
            guard.admit(),
            Err(Overloaded {
                resource: Resource::Memory,
                state: OverloadState::Soft,
                retry_after,
                everyone: true,
            })
        );
        let f = guard.stats();
        assert_eq!(f.refused_total, 1);
        assert_eq!(f.tripped_by, Some(Resource::Memory));
        assert!(memory(&f).used >= 40 * MIB, "{f:?}");

        // 14 MiB more: hard, and `run` sheds the 14 MiB, which leaves soft.
        let shm_b = PathBuf::from(format!("/dev/shm/atunnel-overload-test-{pid}-b"));
        cgroup.fill(shm_b.clone(), 14 * MIB).await;
        samples(&guard, OverloadState::Hard);
        let (tx, mut shed) = mpsc::unbounded_channel();
        let shedder = Arc::new(FileShed {
            file: Mutex::new(Some((shm_b, 14 * MIB))),
            calls: AtomicU64::new(0),
            tx,
        });
        guard.set_shedder(shedder.clone());
        let cancel = CancellationToken::new();
        let run = tokio::spawn(guard.clone().run(cancel.clone()));
        let action = timeout(Duration::from_secs(10), shed.recv())
            .await
            .expect("run sheds while hard")
            .expect("channel open");
        let deadline = Instant::now() + Duration::from_secs(10);
        while guard.state() != OverloadState::Soft {
            assert!(Instant::now() < deadline, "{:?}", guard.stats());
            tokio::time::sleep(interval).await;
        }
        // A few more intervals in soft: no more sheds.
        tokio::time::sleep(interval * 5).await;
        assert_eq!(shedder.calls.load(Ordering::Relaxed), 1);
        let f = guard.stats();
        assert_eq!(f.shed_total, 1);
        assert_eq!(f.recent_shed, [action]);
        cancel.cancel();
        timeout(Duration::from_secs(5), run)
            .await
            .expect("run ends at cancel")
            .expect("run did not panic");

        // The rest goes: normal, and admitting again.
        // The shedder removed the 14 MiB file.
        cgroup.charged -= 14 * MIB;
        cgroup.remove(&shm_a, 40 * MIB).await;
        samples(&guard, OverloadState::Normal);
        assert_eq!(guard.admit(), Ok(()));
        // normal -> soft -> hard -> soft -> normal
        assert_eq!(guard.stats().transitions_total, 4);
    });
}

fn fs_type(path: &Path) -> libc::c_long {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL in path");
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` writable for the call.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statfs {}", path.display());
    st.f_type as libc::c_long
}

// ---------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------

/// The process's soft `RLIMIT_NOFILE` lowered until drop.
struct LoweredNofile(libc::rlimit);

impl LoweredNofile {
    fn to(soft: u64) -> Self {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `old` is a valid, writable rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        // SAFETY: `new` is a valid rlimit; lowering the soft limit is allowed.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0);
        Self(old)
    }
}

impl Drop for LoweredNofile {
    fn drop(&mut self) {
        // SAFETY: restores the rlimit read before, a valid value.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

#[test]
fn descriptors_past_the_thresholds_refuse_and_recover_when_closed() {
    serial(false, async {
        let limit = 256;
        let _nofile = LoweredNofile::to(limit);
        let guard = OverloadGuard::new(OverloadConfig {
            soft: 0.5,
            hard: 0.9,
            // Memory out of the way: whatever this process's cgroup holds.
            memory_limit: Some(u64::MAX),
            ..OverloadConfig::default()
        })
        .expect("guard");
        let f = guard.stats();
        assert_eq!(f.state, OverloadState::Normal, "{f:?}");
        assert_eq!(descriptors(&f).limit, limit);
        let mut files = Vec::new();
        let mut open_to = |n: u64| {
            let open = descriptors(&guard.stats()).used;
            for _ in open..n {
                files.push(fs::File::open("/dev/null").expect("open /dev/null"));
            }
        };

        open_to(150);
        samples(&guard, OverloadState::Soft);
        assert_eq!(descriptors(&guard.stats()).used, 150);
        // Counted independently (less read_dir's own descriptor).
        let listed = fs::read_dir("/proc/self/fd").expect("list fds").count() as u64 - 1;
        assert_eq!(listed, 150);
        let refused = guard.admit().expect_err("refused in soft");
        assert_eq!(refused.resource, Resource::Descriptors);
        assert_eq!(refused.state, OverloadState::Soft);
        assert_eq!(refused.retry_after, Duration::from_secs(5));

        open_to(240);
        samples(&guard, OverloadState::Hard);
        assert_eq!(
            guard.admit().map_err(|e| (e.resource, e.state)),
            Err((Resource::Descriptors, OverloadState::Hard))
        );

        // Every descriptor taken: the guard cannot open /proc/self/fd to count
        // and still reads hard (all in use), not unknown.
        let exhausted = loop {
            match fs::File::open("/dev/null") {
                Ok(file) => files.push(file),
                Err(e) => break e,
            }
        };
        assert_eq!(exhausted.raw_os_error(), Some(libc::EMFILE), "{exhausted}");
        assert_eq!(guard.sample(), OverloadState::Hard);
        let f = guard.stats();
        assert_eq!(descriptors(&f).used, limit, "{f:?}");
        assert_eq!(f.tripped_by, Some(Resource::Descriptors));

        files.clear();
        samples(&guard, OverloadState::Normal);
        assert_eq!(guard.admit(), Ok(()));
        assert!(descriptors(&guard.stats()).used < 100);
        assert_eq!(guard.stats().refused_total, 2);
    });
}

// ---------------------------------------------------------------------------
// Cgroup files written by the test
// ---------------------------------------------------------------------------

/// A directory that reads like a memory cgroup.
struct FakeCgroup {
    root: tempfile::TempDir,
    dir: PathBuf,
}

impl FakeCgroup {
    fn new(files: &[(&str, &str)]) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("group");
        fs::create_dir(&dir).expect("mkdir");
        let cgroup = Self { root, dir };
        for (file, text) in files {
            cgroup.write(file, text);
        }
        cgroup
    }

    fn v2(current: u64, max: &str, inactive_file: u64) -> Self {
        Self::new(&[
            ("memory.current", &current.to_string()),
            ("memory.max", max),
            (
                "memory.stat",
                &format!("anon {current}\nfile 0\ninactive_file {inactive_file}\n"),
            ),
        ])
    }

    fn write(&self, file: &str, text: &str) {
        fs::write(self.dir.join(file), text).expect("write");
    }

    fn config(&self, soft: f64, hard: f64) -> OverloadConfig {
        OverloadConfig {
            soft,
            hard,
            memory_cgroup: Some(self.dir.clone()),
            ..OverloadConfig::default()
        }
    }
}

/// Records each call's time; sheds "actor-N".
struct Recorder {
    calls: AtomicU64,
    tx: mpsc::UnboundedSender<Instant>,
}

impl Shed for Recorder {
    fn holdings(&self) -> Vec<(String, Held)> {
        let next = self.calls.load(Ordering::Relaxed) + 1;
        let held = Held {
            descriptors: next,
            bytes: next * 1024,
        };
        vec![(format!("actor-{next}"), held)]
    }

    fn shed(&self, _who: &str) -> Option<ShedAction> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.tx.send(Instant::now());
        Some(ShedAction {
            who: format!("actor-{n}"),
            bytes: n * 1024,
            tunnels: n,
            requests: 0,
        })
    }
}

#[test]
fn run_sheds_once_per_interval_while_hard_stops_after_and_ends_at_cancel() {
    serial(true, async {
        let cgroup = FakeCgroup::v2(900, "1000", 0);
        let interval = Duration::from_millis(100);
        let guard = OverloadGuard::new(OverloadConfig {
            interval,
            ..cgroup.config(0.5, 0.8)
        })
        .expect("guard");
        assert_eq!(guard.state(), OverloadState::Hard);
        let cancel = CancellationToken::new();
        let run = tokio::spawn(guard.clone().run(cancel.clone()));

        // Hard before anyone can shed: nothing happens, nothing is counted.
        tokio::time::sleep(interval * 3).await;
        assert_eq!(guard.stats().shed_total, 0);

        // The shedder arrives after the guard and its run loop.
        let (tx, mut calls) = mpsc::unbounded_channel();
        let recorder = Arc::new(Recorder {
            calls: AtomicU64::new(0),
            tx,
        });
        guard.set_shedder(recorder.clone());
        let sheds = RECENT_SHED as u64 + 4;
        let mut at = Vec::new();
        for _ in 0..sheds {
            let when = timeout(interval * 2, calls.recv())
                .await
                .expect("a shed each interval")
                .expect("channel open");
            at.push(when);
        }
        for pair in at.windows(2) {
            assert_eq!(pair[1] - pair[0], interval);
        }
        let f = guard.stats();
        assert_eq!(f.shed_total, sheds);
        assert_eq!(f.recent_shed.len(), RECENT_SHED);
        assert_eq!(f.recent_shed[0].who, format!("actor-{}", sheds - 15));
        assert_eq!(
            f.recent_shed.last(),
            Some(&ShedAction {
                who: format!("actor-{sheds}"),
                bytes: sheds * 1024,
                tunnels: sheds,
                requests: 0,
            })
        );

        // Soft: refusing, no longer shedding.
        cgroup.write("memory.current", "600");
        tokio::time::sleep(interval * 10).await;
        assert_eq!(guard.state(), OverloadState::Soft);
        assert!(calls.try_recv().is_err());
        assert_eq!(recorder.calls.load(Ordering::Relaxed), sheds);
        assert_eq!(guard.stats().shed_total, sheds);

        // Hard again: shedding again.
        cgroup.write("memory.current", "900");
        timeout(interval * 2, calls.recv())
            .await
            .expect("shedding resumes")
            .expect("channel open");

        cancel.cancel();
        timeout(interval, run)
            .await
            .expect("run ends at cancel")
            .expect("run did not panic");
        // normal -> hard (first sample) -> soft -> hard
        assert_eq!(guard.stats().transitions_total, 3);
    });
}

/// Fixed holdings; sheds by name and says whom.
struct Holders {
    held: Mutex<Vec<(String, Held)>>,
    tx: mpsc::UnboundedSender<String>,
}

impl Shed for Holders {
    fn holdings(&self) -> Vec<(String, Held)> {
        self.held.lock().expect("lock").clone()
    }

    fn shed(&self, who: &str) -> Option<ShedAction> {
        let _ = self.tx.send(who.to_string());
        Some(ShedAction {
            who: who.to_string(),
            bytes: 0,
            tunnels: 0,
            requests: 0,
        })
    }
}

#[test]
fn soft_refuses_those_above_their_fair_share_first_and_everyone_past_the_second_line() {
    serial(false, async {
        let cgroup = FakeCgroup::v2(100, "1000", 0);
        let guard = OverloadGuard::new(OverloadConfig {
            everyone: 0.7,
            ..cgroup.config(0.5, 0.8)
        })
        .expect("guard");
        let (tx, mut shed) = mpsc::unbounded_channel();
        let held = |d, b| Held {
            descriptors: d,
            bytes: b,
        };
        // Four actors holding much memory, a fifth little; by descriptors
        // the fifth holds the most.
        let holders = Arc::new(Holders {
            held: Mutex::new(
                (1..=4)
                    .map(|i| (format!("big-{i}"), held(10, 200)))
                    .chain([("small".to_string(), held(50, 10))])
                    .collect(),
            ),
            tx,
        });
        guard.set_shedder(holders.clone());
        let (big, small) = (held(10, 200), held(50, 10));
        assert_eq!(
            guard.admit_held(|| unreachable!("normal asks no one")),
            Ok(())
        );

        // Soft on memory: the share is (4 x 200 + 10) / 5 = 162 bytes.
        cgroup.write("memory.current", "600");
        assert_eq!(guard.sample(), OverloadState::Soft);
        let f = guard.stats();
        assert_eq!((f.fair_share, f.consumers), (Some(held(18, 162)), 5));
        assert!(!f.refusing_everyone);
        let refused = guard.admit_held(|| big).expect_err("above its share");
        assert_eq!(
            (refused.resource, refused.everyone),
            (Resource::Memory, false)
        );
        assert_eq!(guard.admit_held(|| small), Ok(()));
        // Plain admission (no one in particular) is refused in soft.
        assert!(guard.admit().is_err());
        let f = guard.stats();
        assert_eq!((f.refused_total, f.refused_over_share_total), (2, 1));

        // Past the second line: everyone.
        cgroup.write("memory.current", "750");
        assert_eq!(guard.sample(), OverloadState::Soft);
        assert!(guard.stats().refusing_everyone);
        let refused = guard.admit_held(|| small).expect_err("everyone refused");
        assert!(refused.everyone);

        // Hard on memory: the one holding the most memory is shed, not the
        // one holding the most descriptors.
        cgroup.write("memory.current", "900");
        let cancel = CancellationToken::new();
        let run = tokio::spawn(guard.clone().run(cancel.clone()));
        let first = timeout(Duration::from_secs(5), shed.recv())
            .await
            .expect("a shed while hard")
            .expect("channel open");
        assert!(first.starts_with("big-"), "{first}");
        cancel.cancel();
        run.await.expect("run ends");

        // Back under soft: everyone admitted.
        cgroup.write("memory.current", "100");
        assert_eq!(guard.sample(), OverloadState::Normal);
        assert_eq!(guard.admit_held(|| big), Ok(()));
    });
}

#[test]
fn unreadable_memory_is_left_out_instead_of_refusing() {
    serial(false, async {
        // A directory with no cgroup files.
        let empty = FakeCgroup::new(&[]);
        let guard = OverloadGuard::new(empty.config(0.5, 0.8)).expect("guard");
        let f = guard.stats();
        assert_eq!(f.state, OverloadState::Normal);
        assert_eq!(f.memory, None);
        let error = f.memory_error.as_deref().expect("an error");
        assert!(error.contains("neither memory.current"), "{error}");
        assert!(f.descriptors.is_some(), "{f:?}");
        assert_eq!(guard.admit(), Ok(()));

        // At 99%, but memory.stat has no inactive_file: left out.
        let cgroup = FakeCgroup::new(&[
            ("memory.current", "990"),
            ("memory.max", "1000"),
            ("memory.stat", "anon 990\n"),
        ]);
        let guard = OverloadGuard::new(cgroup.config(0.5, 0.8)).expect("guard");
        assert_eq!(guard.state(), OverloadState::Normal);
        let error = guard.stats().memory_error.expect("an error");
        assert!(
            error.contains("memory.stat") && error.contains("inactive_file"),
            "{error}"
        );
        assert_eq!(guard.admit(), Ok(()));

        // Garbled memory.current, then a file removed: still left out.
        cgroup.write("memory.stat", "anon 990\ninactive_file 0\n");
        cgroup.write("memory.current", "lots\n");
        assert_eq!(guard.sample(), OverloadState::Normal);
        let error = guard.stats().memory_error.expect("an error");
        assert!(
            error.contains("memory.current") && error.contains("lots"),
            "{error}"
        );
        cgroup.write("memory.current", "990\n");
        fs::remove_file(cgroup.dir.join("memory.max")).expect("rm");
        assert_eq!(guard.sample(), OverloadState::Normal);
        assert!(guard.stats().memory_error.is_some());

        // Readable again: counted again.
        cgroup.write("memory.max", "1000\n");
        assert_eq!(guard.sample(), OverloadState::Hard);
        assert_eq!(guard.stats().memory_error, None);
    });
}

#[test]
fn memory_is_usage_less_inactive_file_against_the_tightest_limit() {
    serial(false, async {
        let unlimited_v1 = "9223372036854771712\n";
        let cgroup = FakeCgroup::new(&[
            ("memory.usage_in_bytes", "1000\n"),
            ("memory.limit_in_bytes", unlimited_v1),
            (
                "memory.stat",
                &format!(
                    "cache 400\ninactive_file 5\ntotal_inactive_file 300\n\
                 hierarchical_memory_limit {unlimited_v1}"
                ),
            ),
        ]);
        // v1, the operator's limit.
        let guard = OverloadGuard::new(OverloadConfig {
            memory_limit: Some(1000),
            ..cgroup.config(0.5, 0.8)
        })
        .expect("guard");
        assert_eq!(guard.state(), OverloadState::Soft);
        let m = memory(&guard.stats());
        assert_eq!((m.used, m.limit), (700, 1000));
        assert!((m.pressure - 0.7).abs() < 1e-12);

        // v1 without a limit: the machine's MemTotal.
        let guard = OverloadGuard::new(cgroup.config(0.5, 0.8)).expect("guard");
        let meminfo = fs::read_to_string("/proc/meminfo").expect("meminfo");
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .expect("MemTotal");
        assert_eq!(memory(&guard.stats()).limit, kib * 1024);
        assert_eq!(guard.state(), OverloadState::Normal);

        // v1: an ancestor's limit (hierarchical_memory_limit) is tighter.
        cgroup.write("memory.limit_in_bytes", "4000\n");
        cgroup.write(
            "memory.stat",
            "total_inactive_file 2000\nhierarchical_memory_limit 1200\n",
        );
        guard.sample();
        let m = memory(&guard.stats());
        // Inactive page cache beyond the usage: floored at 0.
        assert_eq!((m.used, m.limit), (0, 1200));

        // v2: the parent's memory.max is tighter than the group's "max".
        let v2 = FakeCgroup::v2(1000, "max\n", 100);
        fs::write(v2.root.path().join("memory.max"), "1200\n").expect("write");
        let guard = OverloadGuard::new(v2.config(0.5, 0.8)).expect("guard");
        let m = memory(&guard.stats());
        assert_eq!((m.used, m.limit), (900, 1200));
        assert_eq!(guard.state(), OverloadState::Soft);
    });
}

#[test]
fn thresholds_and_interval_are_validated_and_defaults_documented() {
    let d = OverloadConfig::default();
    assert_eq!((d.soft, d.everyone, d.hard), (0.85, 0.90, 0.95));
    assert_eq!(d.interval, Duration::from_millis(250));
    assert_eq!(d.retry_after, Duration::from_secs(5));
    assert_eq!((d.memory_cgroup, d.memory_limit), (None, None));
    for (soft, hard) in [(0.9, 0.8), (0.0, 0.5), (-1.0, 0.5), (f64::NAN, 0.9)] {
        let config = OverloadConfig {
            soft,
            hard,
            ..OverloadConfig::default()
        };
        let err = OverloadGuard::new(config).expect_err("invalid thresholds");
        assert!(err.to_string().contains("0 < soft <= hard"), "{err}");
    }
    let config = OverloadConfig {
        interval: Duration::ZERO,
        ..OverloadConfig::default()
    };
    assert!(OverloadGuard::new(config).is_err());
    fn serializable<T: serde::Serialize>() {}
    serializable::<OverloadStats>();
}
