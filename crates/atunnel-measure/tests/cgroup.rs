//! Real cgroups on this machine (v1 or v2). These tests must run as root:
//! they fail, not skip, otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use atunnel_host::{CgroupDirs, CgroupVersion};
use atunnel_measure::cgroup::{Cgroup, CgroupError, Limits};

const MIB: u64 = 1 << 20;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the cgroup tests create cgroups and must run as root"
    );
}

fn name(test: &str, leaf: &str) -> String {
    format!("atunnel-bench-test-{test}-{}/{leaf}", std::process::id())
}

/// Every directory of the group and its (test-private) parent is gone.
fn assert_gone(paths: &[PathBuf]) {
    for path in paths {
        assert!(!path.exists(), "{} still exists", path.display());
        let parent = path.parent().expect("cgroup has a parent");
        assert!(!parent.exists(), "{} still exists", parent.display());
    }
}

fn read_trimmed(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The directory of `cgroup` that holds `file`.
fn file_of(cgroup: &Cgroup, file: &str) -> PathBuf {
    cgroup
        .paths()
        .into_iter()
        .map(|p| p.join(file))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no {file} in {:?}", cgroup.paths()))
}

fn kill_and_reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The cgroup (v1 memory or v2 unified) a process is in, from /proc.
fn memory_cgroup_of(pid: u32) -> String {
    let text = read_trimmed(Path::new(&format!("/proc/{pid}/cgroup")));
    text.lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .or_else(|| text.lines().find(|l| l.starts_with("0::")))
        .and_then(|l| l.splitn(3, ':').nth(2))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn create_limits_and_sample() {
    require_root();
    let name = format!("atunnel-bench-test-{}/t1", std::process::id());
    let cgroup = Cgroup::create(
        &name,
        &Limits {
            cpus: 0.5,
            memory_bytes: 64 * MIB,
        },
    )
    .expect("create cgroup");
    let paths = cgroup.paths();
    assert!(!paths.is_empty());
    for path in &paths {
        assert!(path.is_dir(), "{} missing", path.display());
        assert!(path.ends_with(&name), "{}", path.display());
    }

    // The limits are in place.
    match cgroup.version() {
        CgroupVersion::V1 => {
            assert_eq!(read_trimmed(&file_of(&cgroup, "cpu.cfs_quota_us")), "50000");
            assert_eq!(
                read_trimmed(&file_of(&cgroup, "cpu.cfs_period_us")),
                "100000"
            );
            let limit = (64 * MIB).to_string();
            assert_eq!(
                read_trimmed(&file_of(&cgroup, "memory.limit_in_bytes")),
                limit
            );
            let memsw = cgroup.paths()[0].join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                assert_eq!(read_trimmed(&memsw), limit);
            }
            assert_eq!(read_trimmed(&file_of(&cgroup, "memory.swappiness")), "0");
        }
        CgroupVersion::V2 => {
            assert_eq!(read_trimmed(&file_of(&cgroup, "cpu.max")), "50000 100000");
            assert_eq!(
                read_trimmed(&file_of(&cgroup, "memory.max")),
                (64 * MIB).to_string()
            );
        }
    }

    let child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn busy loop");
    let pid = child.id();
    let added = cgroup.add_process(pid);
    if let Err(e) = added {
        kill_and_reap(child);
        panic!("add_process: {e}");
    }
    assert!(
        cgroup.processes().expect("processes").contains(&pid),
        "{pid} not in the group"
    );

    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let before = cgroup.sample().expect("sample");
    std::thread::sleep(Duration::from_millis(1500));
    let after = cgroup.sample().expect("sample");
    let elapsed = start.elapsed().as_secs_f64();
    kill_and_reap(child);

    let rate = after.cpu_seconds_since(&before) / elapsed;
    eprintln!(
        "{:?}: {rate:.3} CPU s/s; {before:?} -> {after:?}",
        cgroup.version()
    );
    assert!(
        (0.3..=0.7).contains(&rate),
        "CPU rate {rate:.3} outside 0.3..=0.7 under a 0.5 CPU quota"
    );
    assert!(after.cpu_throttled_periods > 0, "{after:?}");
    assert!(after.throttled_since(&before), "{before:?} -> {after:?}");
    assert!(
        after.cpu_periods >= after.cpu_throttled_periods,
        "{after:?}"
    );
    assert!(after.cpu_throttled_ns > 0, "{after:?}");

    cgroup.remove().expect("remove");
    assert_gone(&paths);
    cgroup.remove().expect("remove is idempotent");
}

/// The child of `oom_kill_is_counted`, this test binary run again: once a
/// line arrives on stdin (it is in the group by then), touches 256 MiB.
#[test]
fn memory_hog_child() {
    if std::env::var("ATUNNEL_MEMORY_HOG_CHILD").is_err() {
        return;
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("the go line");
    let hog = vec![1u8; 256 << 20];
    // Kept alive past the writes, so they cannot be optimised away.
    std::hint::black_box(&hog);
}

#[test]
fn oom_kill_is_counted() {
    require_root();
    let cgroup = Cgroup::create(
        &name("oom", "t2"),
        &Limits {
            cpus: 1.0,
            memory_bytes: 32 * MIB,
        },
    )
    .expect("create cgroup");
    let paths = cgroup.paths();

    // The child waits on stdin until it has been moved into the group.
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "memory_hog_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ATUNNEL_MEMORY_HOG_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the child");
    if let Err(e) = cgroup.add_process(child.id()) {
        kill_and_reap(child);
        panic!("add_process: {e}");
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("release child");
    let status = child.wait().expect("wait");
    let sample = cgroup.sample().expect("sample");
    eprintln!("{status:?}; {sample:?}");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(sample.oom_kills >= 1, "{sample:?}");
    // Killed at the limit, so the peak reached it: 33,554,432 B (32 MiB) on
    // this machine (v1). v1 always has memory.max_usage_in_bytes; v2 has
    // memory.peak from Linux 5.19 (the sample reads 0 without it).
    let peak_known = cgroup.version() == CgroupVersion::V1
        || cgroup
            .paths()
            .iter()
            .any(|p| p.join("memory.peak").exists());
    if peak_known {
        assert!(
            (16 * MIB..=32 * MIB).contains(&sample.memory_max_usage_bytes),
            "peak {} B under a 32 MiB limit: {sample:?}",
            sample.memory_max_usage_bytes
        );
    }

    cgroup.remove().expect("remove");
    assert_gone(&paths);
}

/// The child of `socket_memory_is_counted`, this test binary run again:
/// connects to the port in `ATUNNEL_SOCKET_CHILD`, sends until the socket
/// would block (at most 8 MiB), prints how much, and holds the socket until
/// stdin closes. A Rust child rather than a script: nothing to install.
#[test]
fn socket_child() {
    let Ok(port) = std::env::var("ATUNNEL_SOCKET_CHILD") else {
        return;
    };
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().expect("a port")))
        .expect("connect");
    s.set_nonblocking(true).expect("nonblocking");
    let chunk = [b'x'; 65536];
    let mut sent = 0usize;
    while sent < 8 << 20 {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    println!("sent={sent}");
    std::io::stdout().flush().expect("flush");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

#[test]
fn socket_memory_is_counted() {
    require_root();
    let cgroup = Cgroup::create(
        &name("sock", "t3"),
        &Limits {
            cpus: 1.0,
            memory_bytes: 256 * MIB,
        },
    )
    .expect("create cgroup");
    let paths = cgroup.paths();

    // A listener that accepts but never reads.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    let acceptor = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));

    // Moved into the group before exec, so its socket is accounted (v1
    // accounts only sockets created after kmem.tcp accounting was enabled).
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args(["--exact", "socket_child", "--nocapture", "--test-threads=1"])
        .env("ATUNNEL_SOCKET_CHILD", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: the hook only calls open(2), write(2) and close(2).
    unsafe { command.pre_exec(cgroup.pre_exec_hook()) };
    let mut child = command.spawn().expect("spawn the child");
    let stdin = child.stdin.take().expect("stdin");
    let mut line = String::new();
    // The harness prints lines of its own around the child's.
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let read = loop {
        line.clear();
        match out.read_line(&mut line) {
            Ok(0) => break Err(std::io::Error::other("the child printed no sent=")),
            Ok(_) if line.contains("sent=") => break Ok(()),
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    let sample = cgroup.sample();
    let in_group = cgroup.processes().map(|p| p.contains(&child.id()));
    drop(stdin);
    let status = child.wait().expect("wait");
    let server_side = acceptor.join().expect("acceptor thread");

    read.expect("read child output");
    let sent: u64 = line
        .rsplit("sent=")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .expect("child prints bytes sent");
    let sample = sample.expect("sample");
    eprintln!("sent {sent}; {sample:?}");
    assert!(status.success(), "{status:?}");
    assert!(in_group.expect("processes"), "child not in the group");
    assert!(sent > 0);
    assert!(server_side.is_ok(), "{server_side:?}");
    assert!(sample.socket_bytes > 0, "{sample:?}");

    cgroup.remove().expect("remove");
    assert_gone(&paths);
}

#[test]
fn shared_parent_and_remove_kills_nothing() {
    require_root();
    let limits = Limits {
        cpus: 1.0,
        memory_bytes: 64 * MIB,
    };
    let a = Cgroup::create(&name("shared", "a"), &limits).expect("create a");
    let b = Cgroup::create(&name("shared", "b"), &limits).expect("create b");

    // An existing group is not taken over, nor removed by the failed attempt.
    let duplicate = Cgroup::create(&name("shared", "a"), &limits);
    assert!(
        matches!(duplicate, Err(CgroupError::Io { .. })),
        "{duplicate:?}"
    );
    drop(duplicate);
    for path in a.paths() {
        assert!(
            path.is_dir(),
            "{} removed by a failed create",
            path.display()
        );
    }

    let a_paths = a.paths();
    a.remove().expect("remove a");
    for path in &a_paths {
        assert!(!path.exists(), "{} still exists", path.display());
        assert!(
            path.parent().expect("parent").is_dir(),
            "shared parent removed early"
        );
    }

    // Processes left in the group survive its removal, moved out.
    let sleeper = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = sleeper.id();
    if let Err(e) = b.add_process(pid) {
        kill_and_reap(sleeper);
        panic!("add_process: {e}");
    }
    assert!(memory_cgroup_of(pid).ends_with(&name("shared", "b")));
    let b_paths = b.paths();
    let removed = b.remove();
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    let cgroup_after = memory_cgroup_of(pid);
    kill_and_reap(sleeper);
    removed.expect("remove b");
    assert!(alive, "remove killed the process");
    assert!(
        !cgroup_after.contains("atunnel-bench-test-shared"),
        "still in {cgroup_after}"
    );
    assert_gone(&b_paths);
    b.remove().expect("remove is idempotent");
}

#[test]
fn drop_removes_and_bad_input_is_refused() {
    require_root();
    let cgroup = Cgroup::create(
        &name("drop", "t5"),
        &Limits {
            cpus: 2.0,
            memory_bytes: 16 * MIB,
        },
    )
    .expect("create cgroup");
    let paths = cgroup.paths();
    drop(cgroup);
    assert_gone(&paths);

    let limits = Limits {
        cpus: 1.0,
        memory_bytes: MIB,
    };
    assert!(matches!(
        Cgroup::create("../escape", &limits),
        Err(CgroupError::InvalidName { .. })
    ));
    assert!(matches!(
        Cgroup::create(
            &name("drop", "t6"),
            &Limits {
                cpus: 0.0,
                memory_bytes: MIB
            }
        ),
        Err(CgroupError::InvalidLimits(_))
    ));
}

#[test]
fn another_process_samples_by_dirs_and_removes_a_leftover() {
    require_root();
    let name = name("leftover", "tunnel");
    let cgroup = Cgroup::create(
        &name,
        &Limits {
            cpus: 1.0,
            memory_bytes: 64 * MIB,
        },
    )
    .expect("create");
    // What the worker hands to the load generator names the group's own
    // directories...
    let dirs = cgroup.dirs();
    assert_eq!(dirs.version, cgroup.version());
    let mut named = vec![dirs.memory.clone(), dirs.cpu.clone(), dirs.cpuacct.clone()];
    named.sort();
    named.dedup();
    let mut own_paths = cgroup.paths();
    own_paths.sort();
    assert_eq!(named, own_paths);
    // ...survives the trip over the control socket as JSON...
    let json = serde_json::to_string(dirs).expect("serialise dirs");
    let received: CgroupDirs = serde_json::from_str(&json).expect("parse dirs");
    assert_eq!(&received, dirs);
    // ...and reads the same counters there.
    let by_dirs = received.sample().expect("sample by dirs");
    let own = cgroup.sample().expect("sample");
    assert_eq!(by_dirs.oom_kills, own.oom_kills);
    assert!(by_dirs.cpu_usage_ns <= own.cpu_usage_ns);
    let paths = cgroup.paths();
    // The owner is killed before it can remove the group.
    std::mem::forget(cgroup);
    assert!(paths.iter().all(|p| p.exists()));
    assert!(atunnel_measure::cgroup::remove_leftover(&name).expect("remove leftover"));
    assert_gone(&paths);
    assert!(!atunnel_measure::cgroup::remove_leftover(&name).expect("nothing left"));
    assert!(atunnel_measure::cgroup::remove_leftover("../etc").is_err());
}
