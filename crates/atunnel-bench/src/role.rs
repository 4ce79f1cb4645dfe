//! Bench roles as child processes: this binary re-run with a subcommand,
//! optionally inside a network namespace, ready when it prints its first line.

use std::process::Stdio;
use std::time::Duration;

use atunnel_sandbox::{NetNs, NsExecutor};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `--name=value`, one flag of a role's command line.
pub fn arg(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

pub struct Role {
    pub child: Child,
    /// The line the role printed when ready.
    pub first_line: String,
}

fn command(
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Command, atunnel_process::BoxError> {
    wrapped_command(&[], args, pre_exec)
}

/// This binary with `args`, run by the `wrapper` command when there is one
/// (`valgrind --tool=callgrind ...`: the cost scenario's instruction pass).
fn wrapped_command(
    wrapper: &[String],
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Command, atunnel_process::BoxError> {
    let exe = std::env::current_exe()?;
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(hook) = pre_exec {
        // SAFETY: the hooks passed here only make async-signal-safe syscalls
        // (open, write, close, setpgid), as pre_exec requires after fork.
        unsafe { cmd.pre_exec(hook) };
    }
    Ok(cmd)
}

async fn ready(name: String, mut child: Child) -> Result<Role, atunnel_process::BoxError> {
    let stdout = child.stdout.take().ok_or("role has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first_line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .map_err(|_| format!("{name} did not start within 60 s"))??
        .ok_or_else(|| format!("{name} exited before it was ready"))?;
    // Keep draining stdout so the role never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Role { child, first_line })
}

/// Starts `args[0]` in this process's namespace.
pub async fn start(args: &[String]) -> Result<Role, atunnel_process::BoxError> {
    start_with(args, None).await
}

/// Runs in the child between fork and exec (a cgroup move, say).
pub type PreExec = Box<dyn FnMut() -> std::io::Result<()> + Send + Sync + 'static>;

/// Starts `args[0]` in this process's namespace; `pre_exec` runs in the
/// child before it execs.
pub async fn start_with(
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Role, atunnel_process::BoxError> {
    let child = command(args, pre_exec)?.spawn()?;
    ready(args[0].clone(), child).await
}

/// Starts `args[0]` under `wrapper` (none: as [`start_with`]).
pub async fn start_wrapped(
    wrapper: &[String],
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Role, atunnel_process::BoxError> {
    let child = wrapped_command(wrapper, args, pre_exec)?.spawn()?;
    ready(args[0].clone(), child).await
}

/// A pre-exec hook that puts the child in a process group of its own, so a
/// Ctrl-C at the terminal reaches only its parent, which stops it in order
/// (a supervisor must not mistake the signal for a crash and restart it).
pub fn own_process_group() -> PreExec {
    Box::new(|| {
        // SAFETY: setpgid(2) is async-signal-safe and takes no memory.
        if unsafe { libc::setpgid(0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })
}

/// Runs `first`, then `second`, in the child.
pub fn both(mut first: PreExec, mut second: PreExec) -> PreExec {
    Box::new(move || {
        first()?;
        second()
    })
}

/// Starts `args[0]` inside `ns`: forked from the namespace thread while it is
/// there, so the child lives in `ns` from its first instruction. `pre_exec`
/// runs in the child before it execs.
pub async fn start_in(
    exec: &NsExecutor,
    ns: &NetNs,
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Role, atunnel_process::BoxError> {
    let mut cmd = command(args, pre_exec)?;
    let runtime = tokio::runtime::Handle::current();
    let child = exec
        .run_in(ns, move || {
            let _enter = runtime.enter();
            cmd.spawn()
        })
        .await??;
    ready(args[0].clone(), child).await
}

impl Role {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then up to 10 s to exit cleanly, then SIGKILL.
    pub async fn stop(self) {
        self.stop_within(Duration::from_secs(10)).await;
    }

    /// SIGTERM, then up to `grace` to exit cleanly, then SIGKILL; how it
    /// exited, when it did.
    pub async fn stop_within(mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                None
            }
        }
    }
}

/// Kills (SIGKILL) every process left in a network namespace named
/// `prefix*`: what remains of the roles after they were asked to stop, such
/// as the children of a worker that was itself killed. Namespaces are
/// compared as `ip netns identify` does, by the device and inode of
/// `/run/netns/<name>` and `/proc/<pid>/ns/net`. Returns how many.
pub fn kill_processes_in_namespaces(prefix: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(atunnel_sandbox::netns::NETNS_DIR) else {
        return 0;
    };
    let ours: std::collections::HashSet<(u64, u64)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            if !e.file_name().to_string_lossy().starts_with(prefix) {
                return None;
            }
            let m = std::fs::metadata(e.path()).ok()?;
            Some((m.dev(), m.ino()))
        })
        .collect();
    if ours.is_empty() {
        return 0;
    }
    let Ok(procs) = atunnel_host::numbered_entries::<u32>("/proc") else {
        return 0;
    };
    let me = std::process::id();
    let mut killed = 0;
    for (pid, path) in procs {
        if pid == me {
            continue;
        }
        let Ok(m) = std::fs::metadata(path.join("ns/net")) else {
            continue;
        };
        if ours.contains(&(m.dev(), m.ino()))
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Removes namespaces under `prefix` that a killed role left behind.
pub async fn sweep_namespaces(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(atunnel_sandbox::netns::NETNS_DIR) else {
        return;
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    if names.is_empty() {
        return;
    }
    let Ok(exec) = NsExecutor::start() else {
        return;
    };
    for name in names {
        if let Err(e) = exec.delete(&name).await {
            eprintln!("atunnel-bench: removing namespace {name}: {e}");
        }
    }
}

/// CPU seconds (user + system) a process has used, from /proc.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    cpu_ticks(&stat) / hz
}

/// utime + stime of a `/proc/<pid>/stat` line, in clock ticks; 0 for what
/// is not such a line.
fn cpu_ticks(stat: &str) -> f64 {
    // Fields after the command name, which may contain spaces and ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    ticks(11) + ticks(12)
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// A `/proc/<pid>/stat` line (proc(5)) for a command named `comm`.
    fn stat_line(pid: u32, comm: &str, utime: u64, stime: u64) -> String {
        format!(
            "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 1234 0 0 0 {utime} {stime} 0 0 20 0 4 0 \
             5678 123456789 2345 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// A process may name itself anything (spaces, parentheses,
        /// digits): the times are still the 14th and 15th fields.
        #[test]
        fn cpu_ticks_are_found_whatever_the_command_name(
            pid in any::<u32>(),
            comm in "[ -~]{0,15}",
            utime in 0u64..1 << 40,
            stime in 0u64..1 << 40,
        ) {
            let got = cpu_ticks(&stat_line(pid, &comm, utime, stime));
            prop_assert_eq!(got, (utime + stime) as f64);
        }

        #[test]
        fn any_text_gives_a_number_and_no_panic(text in "\\PC{0,200}") {
            let _ = cpu_ticks(&text);
        }
    }

    #[test]
    fn a_line_without_a_command_name_is_zero() {
        assert_eq!(cpu_ticks(""), 0.0);
        assert_eq!(cpu_ticks("1 sh S 1 1 1 0 -1 0 0 0 0 0 7 8"), 0.0);
    }
}
