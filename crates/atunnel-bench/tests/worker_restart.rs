//! `atunnel-bench worker` on its own (root): it answers on its control
//! socket, brings its actors up through atunnel's control API (as a real
//! worker does) and deactivates and re-activates one on request, replaces
//! an atunnel that was killed (new pid, the death recorded with its exit
//! status and the cgroup's OOM-kill count), refuses bad requests, and on
//! SIGTERM stops everything and removes its cgroup.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use atunnel::control::proto::{self, Phase};
use atunnel_sandbox::NsExecutor;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use common::{namespace_with_loopback, write_pki};

/// One request line, one reply line.
async fn call(socket: &Path, request: &str) -> Result<Value, String> {
    let exchange = async {
        let mut conn = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        conn.write_all(format!("{request}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(conn)
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_str(&line).map_err(|e| format!("reply {line:?}: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| format!("no reply to {request} within 30 s"))?
}

fn pid_of(status: &Value, key: &str) -> Result<i32, String> {
    status["status"][key]
        .as_i64()
        .map(|p| p as i32)
        .ok_or_else(|| format!("no {key} in {status}"))
}

/// Actor 0's phase as atunnel's control API reports it.
async fn atunnel_phase(atunnel: &Path) -> Result<Phase, String> {
    let mut client = atunnel::control::client::connect(atunnel);
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        client.status(proto::StatusRequest {
            uid: "uid-0".into(),
        }),
    )
    .await
    .map_err(|_| "atunnel's control API did not answer".to_string())?
    .map_err(|e| format!("atunnel's Status: {e}"))?;
    let phase = status.into_inner().status.ok_or("no status")?.phase;
    Phase::try_from(phase).map_err(|e| e.to_string())
}

/// Deactivates and re-activates actor 0 through the worker, seeing each
/// take effect in atunnel; an actor the worker does not host is refused.
async fn cycle_actor(socket: &Path, atunnel: &Path) -> Result<(), String> {
    if atunnel_phase(atunnel).await? != Phase::Active {
        return Err("actor 0 not brought up through atunnel's control API".into());
    }
    let off = call(socket, r#"{"op":"deactivate","actor":0}"#).await?;
    if off["ok"] != true || off["status"]["inactive_actors"] != json!([0]) {
        return Err(format!("deactivate: {off}"));
    }
    if atunnel_phase(atunnel).await? != Phase::Sandboxed {
        return Err("atunnel still has actor 0 active after deactivate".into());
    }
    let unknown = call(socket, r#"{"op":"activate","actor":1}"#).await?;
    if unknown["ok"] != false
        || !unknown["error"]
            .as_str()
            .unwrap_or("")
            .contains("no actor 1")
    {
        return Err(format!("an actor the worker does not host: {unknown}"));
    }
    let on = call(socket, r#"{"op":"activate","actor":0}"#).await?;
    if on["ok"] != true || on["status"]["inactive_actors"] != json!([]) {
        return Err(format!("activate: {on}"));
    }
    if atunnel_phase(atunnel).await? != Phase::Active {
        return Err("actor 0 not active again in atunnel".into());
    }
    Ok(())
}

/// The checks; the caller cleans up whatever happens here.
async fn exercise(socket: &Path, pids: &mut Vec<i32>) -> Result<Value, String> {
    let first = call(socket, r#"{"op":"status"}"#).await?;
    if first["ok"] != true || first["status"]["state"] != "running" {
        return Err(format!("not running: {first}"));
    }
    let generation = first["status"]["generation"]
        .as_u64()
        .ok_or("no generation")?;
    let tunnel = pid_of(&first, "tunnel_pid")?;
    pids.extend([tunnel, pid_of(&first, "actors_pid")?]);
    cycle_actor(socket, &socket.with_extension("atunnel.sock")).await?;
    let bad = call(socket, r#"{"op":"reboot"}"#).await?;
    if bad["ok"] != false || !bad["error"].is_string() {
        return Err(format!("bad request not refused: {bad}"));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tunnel),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| format!("kill atunnel: {e}"))?;
    // Answered once the worker has a fresh atunnel running.
    let request = json!({"op": "status", "wait_generation": generation + 1}).to_string();
    let after = call(socket, &request).await?;
    pids.extend([pid_of(&after, "tunnel_pid")?, pid_of(&after, "actors_pid")?]);
    let s = &after["status"];
    if s["state"] != "running" || pid_of(&after, "tunnel_pid")? == tunnel {
        return Err(format!("no fresh atunnel: {after}"));
    }
    if s["deaths"] != 1 {
        return Err(format!("death not counted: {after}"));
    }
    let event = s["events"][0].as_str().unwrap_or_default();
    if !(event.contains("atunnel exited")
        && event.contains("SIGKILL")
        && event.contains("OOM kills so far: 0"))
    {
        return Err(format!("death not recorded as it happened: {event:?}"));
    }
    Ok(after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_replaces_a_killed_atunnel() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the worker needs root (namespaces, cgroups); run the tests as root"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_atunnel-bench");
    let pki = write_pki(dir.path());

    // The worker gets a namespace of its own, as `run` gives it.
    let id = std::process::id() % 100_000;
    let prefix = format!("atbw{id}-");
    let exec = NsExecutor::start().expect("netns executor");
    let ns = namespace_with_loopback(&exec, &format!("{prefix}worker")).await;
    let socket = dir.path().join("worker.sock");
    let cgroup = format!("atunnel-bench-test-{id}/tunnel");
    let args: Vec<String> = vec![
        "worker".into(),
        format!("--control={}", socket.display()),
        format!("--pki={}", pki.display()),
        format!(
            "--node-agent-socket={}",
            dir.path().join("agent.sock").display()
        ),
        "--actors=1".into(),
        format!("--cgroup={cgroup}"),
        format!("--netns-prefix={prefix}s-"),
        // Nothing on the far side is needed to start or to die.
        "--gateway=127.0.0.1:9".into(),
        "--stats=127.0.0.1:0".into(),
        "--ingress-https=127.0.0.1:0".into(),
        "--ingress-connect=127.0.0.1:0".into(),
    ];
    let runtime = tokio::runtime::Handle::current();
    let mut worker = exec
        .run_in(&ns, move || {
            let _enter = runtime.enter();
            tokio::process::Command::new(bin)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        })
        .await
        .expect("executor")
        .expect("worker spawns");
    let mut lines = BufReader::new(worker.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let mut pids = Vec::new();
    let outcome = match ready {
        Ok(Ok(Some(line))) => match serde_json::from_str::<Value>(&line) {
            Ok(v) if v["state"] == "running" => exercise(&socket, &mut pids).await,
            _ => Err(format!("ready line: {line}")),
        },
        other => Err(format!("worker not ready: {other:?}")),
    };
    let cgroup_dir = outcome
        .as_ref()
        .ok()
        .and_then(|s| s["status"]["cgroup"]["memory"].as_str().map(String::from));
    // Seen before the SIGTERM; checked after the clean-up below.
    let cgroup_existed = cgroup_dir
        .as_deref()
        .is_some_and(|dir| Path::new(dir).is_dir());

    // SIGTERM: the worker stops atunnel and the actors, removes its cgroup.
    if let Some(pid) = worker.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait()).await;
    if stopped.is_err() {
        let _ = worker.kill().await;
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let leftovers: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    for name in &leftovers {
        let _ = exec.delete(name).await;
    }

    let after = outcome.expect("worker replaced the killed atunnel");
    let exit = stopped
        .expect("worker stops within 30 s of SIGTERM")
        .expect("worker exit status");
    assert!(exit.success(), "worker exit: {exit}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "child {pid} still running after the worker stopped"
        );
    }
    let dir = cgroup_dir.expect("the worker's status names its cgroup");
    assert!(dir.ends_with(&cgroup), "{dir} is not the cgroup {cgroup}");
    assert!(cgroup_existed, "cgroup {dir} missing while the worker ran");
    assert!(!Path::new(&dir).exists(), "cgroup {dir} left behind");
    assert!(!socket.exists(), "control socket left behind");
    let sandboxes: Vec<&String> = leftovers
        .iter()
        .filter(|n| n.starts_with(&format!("{prefix}s-")))
        .collect();
    assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    assert_eq!(after["status"]["generation"], 2);
}
