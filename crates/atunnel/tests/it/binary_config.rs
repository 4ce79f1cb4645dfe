//! The `atunnel` binary takes its flags from a TOML file (`--config`), the
//! command line winning, and writes JSON log lines with `--log-format json`
//! (no escape codes in a redirected log). No root: loopback network.

use atunnel_support::prelude::*;
use std::process::Stdio;

use atunnel::host::HostReady;
use tokio::io::AsyncReadExt;

/// Starts `atunnel host` with `config` as its file and `extra` flags, and
/// returns what it printed when ready, and the child.
async fn start(
    pki: &Pki,
    dir: &std::path::Path,
    config: &str,
    extra: &[&str],
) -> (HostReady, tokio::process::Child) {
    let ca = pki.write_ca_files(dir);
    let file = format!(
        "gateway-ca = \"{}\"\nactor-ca-cert = \"{}\"\nactor-ca-key = \"{}\"\n{config}",
        ca.gateway_ca.display(),
        ca.actor_ca_cert.display(),
        ca.actor_ca_key.display(),
    );
    let path = dir.join("atunnel.toml");
    std::fs::write(&path, file).expect("write the config");
    let (child, ready) = spawn_ready(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
            .args(["host", "--config"])
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", "debug")
            .stderr(Stdio::piped()),
    )
    .await;
    (ready, child)
}

/// The first actor's egress listener.
fn first_listener(ready: &HostReady) -> std::net::SocketAddr {
    *ready.actors[0]
        .listeners
        .values()
        .next()
        .expect("a listener")
}

/// A tunnel at `listener` with no gateway to reach: read until it is
/// closed, once its open failed.
async fn failed_tunnel(listener: std::net::SocketAddr) {
    let mut conn = tokio::net::TcpStream::connect(listener)
        .await
        .expect("connect");
    let mut buf = [0u8; 16];
    let _ = conn.read(&mut buf).await;
}

/// Kills `child` and returns all it wrote to stderr.
async fn killed_stderr(child: &mut tokio::process::Child) -> String {
    child.start_kill().expect("kill");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("read stderr");
    stderr
}

const LOOPBACK: &str = "network = \"loopback\"\ngateway = \"127.0.0.1:1\"\n\
    destinations = [\"192.0.2.10:7\"]\nresolv-conf = \"\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_come_from_the_config_file_and_the_command_line_wins() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    let config = format!("{LOOPBACK}actors = 3\n");
    let (ready, _child) = start(&pki, dir.path(), &config, &[]).await;
    assert_eq!(ready.actors.len(), 3, "actors from the file");
    let (ready, _child) = start(&pki, dir.path(), &config, &["--actors=1"]).await;
    assert_eq!(ready.actors.len(), 1, "the flag wins");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_in_the_config_file_is_refused_by_its_name() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join("bad.toml"),
        "gateway-idle-timeot = \"5s\"\n",
    )
    .expect("write");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_atunnel"))
        .args(["host", "--config"])
        .arg(dir.path().join("bad.toml"))
        .output()
        .await
        .expect("runs");
    let _ = pki;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--gateway-idle-timeot"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_and_text_logs_have_no_escapes() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    for (format, json) in [("json", true), ("text", false)] {
        let config = format!("{LOOPBACK}actors = 1\nlog-format = \"{format}\"\n");
        let (ready, mut child) = start(&pki, dir.path(), &config, &[]).await;
        // A tunnel whose gateway is not there: its failure is logged.
        failed_tunnel(first_listener(&ready)).await;
        let stderr = killed_stderr(&mut child).await;
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(!lines.is_empty(), "{format}: nothing logged at debug");
        for line in lines {
            assert!(
                !line.contains('\u{1b}'),
                "{format}: escape codes in {line:?}"
            );
            if json {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(v["level"].is_string() && v["timestamp"].is_string(), "{v}");
            }
        }
    }
}

/// An actor whose every tunnel fails (no gateway) gets at most
/// `log_limit::PER_MINUTE` (10) warnings a minute, however many fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_about_one_actor_are_rate_limited() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("dir");
    let config = format!("{LOOPBACK}actors = 1\n");
    let (ready, mut child) = start(&pki, dir.path(), &config, &[]).await;
    let listener = first_listener(&ready);
    for _ in 0..25 {
        failed_tunnel(listener).await;
    }
    let stderr = killed_stderr(&mut child).await;
    let warned = stderr
        .lines()
        .filter(|l| l.contains("failed to open egress tunnel"))
        .count();
    assert_eq!(warned, 10, "{stderr}");
}
