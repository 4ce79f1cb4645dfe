//! Bench roles as child processes: this binary re-run with a subcommand,
//! optionally inside a network namespace, ready when it prints its first line.

use std::process::Stdio;
use std::time::Duration;

use atunnel_sandbox::{NetNs, NsExecutor};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub struct Role {
    pub child: Child,
    /// The line the role printed when ready.
    pub first_line: String,
}

fn command(args: &[String]) -> Result<Command, atunnel::BoxError> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    Ok(cmd)
}

async fn ready(name: String, mut child: Child) -> Result<Role, atunnel::BoxError> {
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
pub async fn start(args: &[String]) -> Result<Role, atunnel::BoxError> {
    let child = command(args)?.spawn()?;
    ready(args[0].clone(), child).await
}

/// Runs in the child between fork and exec (a cgroup move, say).
pub type PreExec = Box<dyn FnMut() -> std::io::Result<()> + Send + Sync + 'static>;

/// Starts `args[0]` inside `ns`: forked from the namespace thread while it is
/// there, so the child lives in `ns` from its first instruction. `pre_exec`
/// runs in the child before it execs.
pub async fn start_in(
    exec: &NsExecutor,
    ns: &NetNs,
    args: &[String],
    pre_exec: Option<PreExec>,
) -> Result<Role, atunnel::BoxError> {
    let mut cmd = command(args)?;
    if let Some(hook) = pre_exec {
        // SAFETY: the hooks passed here only make async-signal-safe syscalls
        // (open, write, close), as pre_exec requires after fork.
        unsafe { cmd.pre_exec(hook) };
    }
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

    /// Whether the process has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then up to 10 s to exit cleanly, then SIGKILL.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
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
    // Fields after the command name, which may contain spaces.
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
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (ticks(11) + ticks(12)) / hz
}
