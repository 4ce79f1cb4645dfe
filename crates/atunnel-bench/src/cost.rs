//! Counting what a unit of work costs a process, in figures that do not
//! move with the machine's noise: user-space instructions (valgrind's
//! callgrind), system calls by name and context switches (perf's
//! tracepoints), each over a measured window only, never start-up.
//!
//! - [`CallgrindProcess`]: the window of a process started under
//!   `valgrind --tool=callgrind` ([`callgrind_command`]): `callgrind_control
//!   -z` zeroes its counters when the window opens, `-d` dumps them when it
//!   closes; the dump holds the window's instructions (its `totals:` line)
//!   and the per-function profile `callgrind_annotate` reads.
//! - [`PerfWindow`]: `perf stat` attached to every thread of the given
//!   processes (and what they fork), started with its events disabled and
//!   switched on and off over its control FIFOs, each switch acknowledged,
//!   so that the window is exactly the span between the two acks.
//! - [`probe`]: a program whose counts are known (a fixed number of writes
//!   and a loop of a given length per window, more of both before its
//!   first window), which the tests count to check the windows.
//!
//! Valgrind runs a program ~50x slower and one thread at a time, so the
//! two passes are separate: instructions from a callgrind run, syscalls and
//! context switches from perf on the uninstrumented program.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a window switch or a dump may take before it is an error
/// (callgrind_control waits for the instrumented process to notice).
const SWITCH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("{0} is not installed (Debian: apt-get install valgrind linux-perf)")]
    Missing(&'static str),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Tool(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CostError {
    let what = what.into();
    move |source| CostError::Io { what, source }
}

/// Whether `program` runs (found on PATH).
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Fails naming the packages unless valgrind, callgrind_control and perf
/// are installed.
pub fn require_tools() -> Result<(), CostError> {
    for tool in [
        "valgrind",
        "callgrind_control",
        "callgrind_annotate",
        "perf",
    ] {
        if !installed(tool) {
            return Err(CostError::Missing(tool));
        }
    }
    Ok(())
}

/// The command prefix that runs a program under callgrind, uninstrumented
/// (counting nothing, and ~10x faster than instrumented) until a window
/// switches instrumentation on, its dumps named
/// `<out_dir>/callgrind.out.<pid>[.<n>]`.
pub fn callgrind_command(out_dir: &Path) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--instr-atstart=no".into(),
        // Children exec'd by the contender (none today) are not counted.
        "--trace-children=no".into(),
        format!(
            "--callgrind-out-file={}",
            out_dir.join("callgrind.out.%p").display()
        ),
    ]
}

/// A process running under callgrind (as [`callgrind_command`] starts it).
#[derive(Clone, Debug)]
pub struct CallgrindProcess {
    pub pid: u32,
    pub out_dir: PathBuf,
}

impl CallgrindProcess {
    /// Opens the window: switches instrumentation on, then zeroes the
    /// counters (what ran between the two is not counted).
    pub fn open_window(&self) -> Result<(), CostError> {
        self.control(&["-i", "on"])?;
        self.control(&["-z"])
    }

    /// Closes the window: dumps the counters since [`Self::open_window`]
    /// (and switches instrumentation off) and moves the dump to `keep`;
    /// its instructions (Ir).
    pub fn close_window(&self, keep: &Path) -> Result<u64, CostError> {
        let before = self.dumps()?;
        self.control(&["-d"])?;
        let deadline = Instant::now() + SWITCH_TIMEOUT;
        let dump = loop {
            let now = self.dumps()?;
            if let Some(new) = now.into_iter().find(|d| !before.contains(d))
                && let Ok(text) = std::fs::read_to_string(&new)
                && text.contains("\ntotals:")
            {
                break new;
            }
            if Instant::now() > deadline {
                return Err(CostError::Tool(format!(
                    "callgrind wrote no dump for pid {} within {SWITCH_TIMEOUT:?}",
                    self.pid
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.control(&["-i", "off"])?;
        std::fs::rename(&dump, keep).map_err(io(format!("moving {}", dump.display())))?;
        let text = std::fs::read_to_string(keep).map_err(io(keep.display().to_string()))?;
        callgrind_totals(&text)
            .ok_or_else(|| CostError::Tool(format!("{}: no totals line", keep.display())))
    }

    /// The numbered dumps written so far.
    fn dumps(&self) -> Result<Vec<PathBuf>, CostError> {
        let prefix = format!("callgrind.out.{}.", self.pid);
        let dir =
            std::fs::read_dir(&self.out_dir).map_err(io(self.out_dir.display().to_string()))?;
        Ok(dir
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .collect())
    }

    fn control(&self, args: &[&str]) -> Result<(), CostError> {
        let out = run_bounded(
            Command::new("callgrind_control")
                .args(args)
                .arg(self.pid.to_string()),
            SWITCH_TIMEOUT,
        )?;
        if !out.status.success() || !String::from_utf8_lossy(&out.stdout).contains("OK") {
            return Err(CostError::Tool(format!(
                "callgrind_control {args:?} {}: {}{}",
                self.pid,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }
}

/// Runs `cmd` to completion, its output read as it comes (a full pipe
/// would stall it), killing it after `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<std::process::Output, CostError> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("{cmd:?}")))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.map_err(io("waiting")),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            Err(CostError::Tool(format!("{cmd:?} took over {timeout:?}")))
        }
    }
}

/// CPU time and time slices so far of every thread of `pids`
/// (`/proc/<pid>/task/*/schedstat`'s first and third fields), summed.
fn cpu_so_far(pids: &[u32]) -> Result<(u64, u64), CostError> {
    let (mut ns, mut slices) = (0u64, 0u64);
    for pid in pids {
        let dir = format!("/proc/{pid}/task");
        let tasks = std::fs::read_dir(&dir).map_err(io(dir.clone()))?;
        for t in tasks.filter_map(|e| e.ok()) {
            // A thread that ended since the listing has nothing more to add.
            let Ok(text) = std::fs::read_to_string(t.path().join("schedstat")) else {
                continue;
            };
            let mut f = text
                .split_whitespace()
                .map(|v| v.parse::<u64>().unwrap_or(0));
            ns += f.next().unwrap_or(0);
            slices += f.nth(1).unwrap_or(0);
        }
    }
    Ok((ns, slices))
}

/// Waits until `pids` are quiescent: no thread of theirs ran for `quiet`
/// (their CPU time and time slices unchanged), so that what the last unit
/// asked of them (closes, a dump) is inside the window and nothing is cut
/// off half done; at most `max`. How long it took.
pub fn settle(pids: &[u32], quiet: Duration, max: Duration) -> Result<Duration, CostError> {
    let start = Instant::now();
    // The kernel adds a running thread's time at least every tick (4 ms
    // at HZ=250): a tenth of `quiet` between reads sees any that ran.
    let step = (quiet / 10).max(Duration::from_millis(2));
    let mut last = cpu_so_far(pids)?;
    let mut since = Instant::now();
    loop {
        std::thread::sleep(step);
        let now = cpu_so_far(pids)?;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return Ok(start.elapsed());
        }
        if start.elapsed() > max {
            return Err(CostError::Tool(format!(
                "processes {pids:?} still ran {max:?} after the last unit"
            )));
        }
    }
}

/// The instructions of a callgrind dump: its `totals:` line (`summary:`
/// in older dumps), the first event (Ir).
pub fn callgrind_totals(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// A callgrind dump's per-function inclusive profile, as
/// `callgrind_annotate --inclusive=yes` prints it (its top `lines`).
pub fn annotate_inclusive(dump: &Path, lines: usize) -> Result<String, CostError> {
    let out = run_bounded(
        Command::new("callgrind_annotate")
            .arg("--inclusive=yes")
            .arg("--threshold=99")
            .arg(dump),
        SWITCH_TIMEOUT,
    )?;
    if !out.status.success() {
        return Err(CostError::Tool(format!(
            "callgrind_annotate {}: {}",
            dump.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .take(lines)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// System calls and context switches over one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyscallCounts {
    /// Every system call entered (`raw_syscalls:sys_enter`).
    pub syscalls: u64,
    /// `sched:sched_switch` events of the counted threads: each time one
    /// was switched out (blocking included).
    pub context_switches: u64,
    /// Those of them where the thread was still runnable (not
    /// `prev_state & 3`, asleep): preempted, most often by the process it
    /// just woke (the peer of a write) or a neighbour's time slice. Whether
    /// a thread blocks or is preempted first moves with the scheduling;
    /// their sum, `context_switches`, moves less.
    pub preemptions: u64,
    /// Calls by name (`syscalls:sys_enter_<name>`), the ones made.
    pub by_name: BTreeMap<String, u64>,
}

/// Parses `perf stat -x,` output: `<count>,<unit>,<event>,...` lines; a
/// `<not counted>` or `<not supported>` event counts 0. `sched:sched_switch`
/// comes twice, as [`PerfWindow`] asks for it: first filtered to the
/// switches into sleep, then all of them (perf prints no filter).
pub fn parse_perf_stat(text: &str) -> SyscallCounts {
    let mut c = SyscallCounts::default();
    let mut switches = Vec::new();
    for line in text.lines() {
        let mut fields = line.split(',');
        let (Some(count), Some(_unit), Some(event)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(n) = count.trim().parse::<u64>() else {
            continue;
        };
        match event {
            "raw_syscalls:sys_enter" => c.syscalls += n,
            "sched:sched_switch" => switches.push(n),
            e => {
                if let Some(name) = e.strip_prefix("syscalls:sys_enter_")
                    && n > 0
                {
                    *c.by_name.entry(name.to_string()).or_default() += n;
                }
            }
        }
    }
    match switches[..] {
        [sleeps, all] => {
            c.context_switches = all;
            c.preemptions = all.saturating_sub(sleeps);
        }
        [all] => c.context_switches = all,
        _ => {}
    }
    let named: u64 = c.by_name.values().sum();
    if c.syscalls > named {
        c.by_name.insert("other".into(), c.syscalls - named);
    }
    c
}

/// The system calls counted by name: those the contenders made in the
/// cost scenario's windows (atunnel, nginx and HAProxy, December 2026: 21
/// names) and `readv`, `mmap` and `munmap`. Each named one is a tracepoint
/// perf sets up and, when the window ends, tears down with an RCU grace
/// period each, one perf after another: ~38 ms each on this machine, so
/// the 60 named before took 2.2 s a window, most of the scenario's time
/// (all ~350 took minutes). Calls not named here are in the total and
/// reported as `other` (the total less the named ones).
pub const NAMED_SYSCALLS: &[&str] = &[
    "read",
    "write",
    "readv",
    "writev",
    "recvfrom",
    "sendto",
    "accept4",
    "connect",
    "socket",
    "shutdown",
    "close",
    "getsockopt",
    "setsockopt",
    "getsockname",
    "epoll_wait",
    "epoll_ctl",
    "futex",
    "mmap",
    "munmap",
    "madvise",
    "openat",
    "fcntl",
    "setns",
    "getpid",
];

/// `perf stat` on processes, its events switched on and off by window.
pub struct PerfWindow {
    child: Child,
    ctl: std::fs::File,
    ack: std::io::BufReader<std::fs::File>,
    out: PathBuf,
    _fifos: tempfile::TempDir,
}

impl PerfWindow {
    /// Attaches `perf stat` to every thread of `pids` (and their future
    /// children), its events disabled; the counts go to `out`.
    pub fn attach(pids: &[u32], out: &Path) -> Result<Self, CostError> {
        if pids.is_empty() {
            return Err(CostError::Tool("perf: no process to count".into()));
        }
        let fifos = tempfile::tempdir().map_err(io("a folder for perf's FIFOs"))?;
        let (ctl_path, ack_path) = (fifos.path().join("ctl"), fifos.path().join("ack"));
        for p in [&ctl_path, &ack_path] {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::S_IRWXU)
                .map_err(|e| io(p.display().to_string())(e.into()))?;
        }
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let mut child = Command::new("perf")
            .args(["stat", "-x,", "--no-big-num", "-D", "-1"])
            .arg(format!(
                "--control=fifo:{},{}",
                ctl_path.display(),
                ack_path.display()
            ))
            .args(["-e", "raw_syscalls:sys_enter"])
            // Switches into sleep (TASK_INTERRUPTIBLE or _UNINTERRUPTIBLE),
            // then all: preemptions are the difference (`parse_perf_stat`).
            .args(["-e", "sched:sched_switch", "--filter", "prev_state & 3"])
            .args(["-e", "sched:sched_switch"])
            .args(
                NAMED_SYSCALLS
                    .iter()
                    .flat_map(|n| ["-e".to_string(), format!("syscalls:sys_enter_{n}")]),
            )
            .arg("-p")
            .arg(pids.join(","))
            .arg("-o")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => CostError::Missing("perf"),
                _ => io("starting perf")(e),
            })?;
        // Opening a FIFO blocks until the other end opens it: perf opens
        // both once its events are set up. A perf that fails first never
        // does, so the opens run on a thread and the wait is bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let (c, a) = (ctl_path.clone(), ack_path.clone());
        std::thread::spawn(move || {
            let r = (|| {
                let ctl = std::fs::OpenOptions::new().write(true).open(&c)?;
                let ack = std::fs::File::open(&a)?;
                Ok::<_, std::io::Error>((ctl, ack))
            })();
            let _ = tx.send(r);
        });
        let deadline = Instant::now() + SWITCH_TIMEOUT;
        let (ctl, ack) = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(r) => break r.map_err(io("perf's control FIFOs"))?,
                Err(_) => {
                    if let Some(status) = child.try_wait().map_err(io("perf"))? {
                        let mut err = String::new();
                        if let Some(mut e) = child.stderr.take() {
                            let _ = e.read_to_string(&mut err);
                        }
                        // Unblock the opener thread.
                        let _ = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(&ctl_path);
                        let _ = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(&ack_path);
                        return Err(CostError::Tool(format!(
                            "perf stat exited ({status}): {err}"
                        )));
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        return Err(CostError::Tool("perf stat did not start".into()));
                    }
                }
            }
        };
        Ok(Self {
            child,
            ctl,
            ack: std::io::BufReader::new(ack),
            out: out.to_path_buf(),
            _fifos: fifos,
        })
    }

    /// perf's own pid (to leave it out of what it counts runs beside).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Switches counting on; returns once perf acknowledged it.
    pub fn enable(&mut self) -> Result<(), CostError> {
        self.command("enable")
    }

    /// Switches counting off; returns once perf acknowledged it.
    pub fn disable(&mut self) -> Result<(), CostError> {
        self.command("disable")
    }

    fn command(&mut self, what: &str) -> Result<(), CostError> {
        self.ctl
            .write_all(format!("{what}\n").as_bytes())
            .map_err(io(format!("perf {what}")))?;
        let mut line = String::new();
        // perf answers every command; a dead perf closes the FIFO (EOF).
        self.ack
            .read_line(&mut line)
            .map_err(io(format!("perf's ack of {what}")))?;
        // perf writes "ack\n" with its C string's NUL after it: the NUL
        // starts the next line read.
        if line.trim_matches(|c: char| c == '\0' || c.is_whitespace()) != "ack" {
            return Err(CostError::Tool(format!(
                "perf did not acknowledge {what}: {line:?}"
            )));
        }
        Ok(())
    }

    /// Stops perf and reads what it counted while enabled.
    pub fn finish(self) -> Result<SyscallCounts, CostError> {
        self.stop().wait()
    }

    /// Asks perf to stop (SIGINT) without waiting for it. Closing its
    /// events takes it seconds (each tracepoint event's removal waits for
    /// an RCU grace period: 2.3 s for this set on a process of nine
    /// threads), after [`Self::disable`] they count nothing more, and the
    /// next window need not wait for that.
    pub fn stop(self) -> StoppingPerf {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        StoppingPerf(self)
    }
}

/// A perf asked to stop: [`StoppingPerf::wait`] reads its counts once it
/// has (a dropped one is killed).
pub struct StoppingPerf(PerfWindow);

impl StoppingPerf {
    pub fn wait(mut self) -> Result<SyscallCounts, CostError> {
        let w = &mut self.0;
        let deadline = Instant::now() + SWITCH_TIMEOUT;
        while w.child.try_wait().map_err(io("perf"))?.is_none() {
            if Instant::now() > deadline {
                let _ = w.child.kill();
                return Err(CostError::Tool("perf stat did not stop on SIGINT".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&w.out).map_err(io(w.out.display().to_string()))?;
        Ok(parse_perf_stat(&text))
    }
}

impl Drop for PerfWindow {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The programs' `cost-probe` role: known counts for the window tests.
pub mod probe {
    use std::io::{BufRead, Write};
    use std::os::fd::AsRawFd;

    /// Writes and loop iterations made before the first window, so that a
    /// window which took in start-up is far off.
    pub const BEFORE_WRITES: u64 = 5000;
    pub const BEFORE_LOOP: u64 = 20_000_000;

    /// `writes` one-byte write(2)s to /dev/null and a loop of `iterations`.
    fn work(null: &std::fs::File, writes: u64, iterations: u64) {
        for _ in 0..writes {
            // SAFETY: write(2) of one byte from a live buffer to an open fd.
            unsafe { libc::write(null.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        }
        let mut x = 0u64;
        for i in 0..iterations {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        std::hint::black_box(x);
    }

    /// Does the work before any window, prints `ready`, then for each line
    /// `<writes> <iterations>` on stdin does that work and prints `done`
    /// (one write(2) more), until stdin closes.
    pub fn run() -> std::io::Result<()> {
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        work(&null, BEFORE_WRITES, BEFORE_LOOP);
        let mut out = std::io::stdout().lock();
        out.write_all(b"ready\n")?;
        out.flush()?;
        let stdin = std::io::stdin();
        let mut line = String::new();
        while {
            line.clear();
            stdin.lock().read_line(&mut line)? > 0
        } {
            let mut nums = line
                .split_whitespace()
                .map(|n| n.parse::<u64>().unwrap_or(0));
            let (writes, iterations) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
            work(&null, writes, iterations);
            out.write_all(b"done\n")?;
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_stat_output_is_read_by_event_and_name() {
        let text = "# started on Fri Dec  4 09:29:12 2026\n\n\
            187,,raw_syscalls:sys_enter,13360006,100.00,,\n\
            7,,sched:sched_switch,13360006,100.00,,\n\
            11,,sched:sched_switch,13360006,100.00,,\n\
            40,,syscalls:sys_enter_mmap,13360006,100.00,,\n\
            0,,syscalls:sys_enter_iopl,13360006,100.00,,\n\
            <not counted>,,syscalls:sys_enter_ioperm,0,100.00,,\n\
            5,,syscalls:sys_enter_write,1,100.00,,\n";
        let c = parse_perf_stat(text);
        assert_eq!(c.syscalls, 187);
        // The first sched_switch is the filtered one (into sleep), the
        // second all of them.
        assert_eq!(c.context_switches, 11);
        assert_eq!(c.preemptions, 4);
        assert_eq!(
            c.by_name,
            BTreeMap::from([
                ("mmap".into(), 40),
                ("write".into(), 5),
                ("other".into(), 142)
            ])
        );
    }

    #[test]
    fn callgrind_totals_are_the_first_event_of_the_totals_line() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\npart: 2\n\nevents: Ir\nsummary: 1863\n\nfl=(1)\n\ntotals: 1863\n";
        assert_eq!(callgrind_totals(dump), Some(1863));
        assert_eq!(callgrind_totals("events: Ir\n"), None);
    }
}
