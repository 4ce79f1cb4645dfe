//! The cost scenario's windows, checked against a program whose counts are
//! known (`atunnel-bench cost-probe`): it makes 5,000 writes and a loop of
//! 20 million turns before its first window, then per window exactly the
//! writes and turns it is asked for, and one write to say it is done. A
//! window that took in start-up, or missed the work, is far off.
//!
//! Needs valgrind and perf (`apt-get install valgrind linux-perf`). Like the
//! peers' tests, without them these tests say so and pass, unless
//! `ATUNNEL_REQUIRE_COST_TOOLS=1` (`.ci/run` sets it, after installing
//! both): then a missing tool fails the test and names the packages.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use atunnel_bench::cost::{self, CallgrindProcess, PerfWindow};

/// Whether the tools are here; a missing one fails only when required.
fn tools() -> bool {
    match cost::require_tools() {
        Ok(()) => true,
        Err(e) if std::env::var_os("ATUNNEL_REQUIRE_COST_TOOLS").is_some() => {
            panic!("ATUNNEL_REQUIRE_COST_TOOLS is set: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    /// The probe (under `prefix`), once it printed `ready`.
    fn start(prefix: &[String]) -> Self {
        let bin = env!("CARGO_BIN_EXE_atunnel-bench");
        let mut cmd = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .arg("cost-probe")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the probe");
        let stdin = child.stdin.take().expect("stdin");
        let mut probe = Self {
            stdout: BufReader::new(child.stdout.take().expect("stdout")),
            stdin,
            child,
        };
        assert_eq!(probe.line(), "ready");
        probe
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("probe output");
        line.trim().to_string()
    }

    /// One unit of known work, returning once it is done.
    fn work(&mut self, writes: u64, iterations: u64) {
        writeln!(self.stdin, "{writes} {iterations}").expect("probe input");
        self.stdin.flush().expect("probe input");
        assert_eq!(self.line(), "done");
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_perf_window_counts_exactly_the_writes_made_inside_it() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut probe = Probe::start(&[]);
    let mut window = PerfWindow::attach(&[probe.child.id()], &dir.path().join("perf.txt"))
        .expect("perf attaches");
    window.enable().expect("enable");
    probe.work(300, 1000);
    window.disable().expect("disable");
    // Outside the window: not counted.
    probe.work(700, 1000);
    let counts = window.finish().expect("perf counts");
    // 300 asked for and the `done` line; not the 5,000 before the window
    // nor the 700 after it.
    assert_eq!(counts.by_name.get("write"), Some(&301), "{counts:?}");
    // The rest: at most the read that returned the request and the one
    // that waits for the next.
    assert!(
        (301..=305).contains(&counts.syscalls),
        "syscalls {} in {counts:?}",
        counts.syscalls
    );
    // It blocked reading its request at least once.
    assert!(counts.context_switches >= 1, "{counts:?}");
}

#[test]
fn a_callgrind_window_counts_the_loop_inside_it_and_not_start_up() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut probe = Probe::start(&cost::callgrind_command(dir.path()));
    let cg = CallgrindProcess {
        pid: probe.child.id(),
        out_dir: dir.path().to_path_buf(),
    };
    const N: u64 = 1_000_000;
    let mut window = |iterations: u64, name: &str| -> u64 {
        cg.open_window().expect("window opens");
        probe.work(0, iterations);
        cg.close_window(&dir.path().join(name))
            .expect("window closes")
    };
    let one = i128::from(window(N, "one.out"));
    let two = i128::from(window(2 * N, "two.out"));
    // N more turns in the second window.
    let per_n = two - one;
    // Start-up did 20 N turns before the first window: had the window
    // counted it, `one` would be over 20 times `per_n` (and `per_n` < 0).
    assert!(
        per_n >= 2 * i128::from(N),
        "{per_n} instructions for {N} turns (windows: {one}, {two})"
    );
    // What a window costs besides the loop: the request read and the
    // answer written, small beside a million turns.
    let fixed = one - per_n;
    assert!(
        fixed.abs() < per_n / 50,
        "fixed part {fixed} of {one} (N turns: {per_n}): the window took in more than its work"
    );
    let profile = cost::annotate_inclusive(&dir.path().join("one.out"), 40).expect("annotate");
    assert!(profile.contains("Ir"), "{profile}");
}

#[test]
fn settling_waits_for_the_work_asked_for_before_it_returns() {
    if !tools() {
        return;
    }
    let mut probe = Probe::start(&[]);
    // A loop of a few hundred milliseconds, asked for and not waited on.
    writeln!(probe.stdin, "0 400000000").expect("probe input");
    probe.stdin.flush().expect("probe input");
    let took = cost::settle(
        &[probe.child.id()],
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(30),
    )
    .expect("the probe settles");
    // Settled means done: its answer is already there to read.
    let mut fds = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(probe.stdout.get_ref()),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: poll(2) on one live pollfd, without waiting.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
    assert_eq!(
        ready, 1,
        "settled after {took:?} with the loop still running"
    );
    assert_eq!(probe.line(), "done");
    // And a quiet process settles in about the quiet period.
    let took = cost::settle(
        &[probe.child.id()],
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(30),
    )
    .expect("the idle probe settles");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}
