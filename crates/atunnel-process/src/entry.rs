//! What every atunnel process entry point does: logging to stderr, a
//! multi-threaded runtime with as many workers as the cgroup's CPU quota
//! allows, a stop token cancelled by Ctrl-C or SIGTERM (what a supervisor
//! sends), and the error as the exit message.

use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written to stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event, for people; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for
    /// log shippers.
    Json,
}

/// The logging flags every binary takes.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LogArgs {
    /// Log line format on stderr: text or json. RUST_LOG sets the levels.
    #[arg(long, value_enum, default_value_t = LogFormat::default(), global = true)]
    pub log_format: LogFormat,
}

/// Installs the process's logger: `filter` (RUST_LOG's syntax) over
/// `format`, to `writer`, with ANSI colours only if `ansi`.
fn init_logging<W>(format: LogFormat, filter: &str, ansi: bool, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Runs `body` to completion and turns its outcome into an exit code.
/// `default_log` is the tracing filter when RUST_LOG is unset.
pub fn run_main<F, Fut>(name: &str, default_log: &str, log: &LogArgs, body: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), crate::BoxError>>,
{
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| default_log.to_string());
    // A redirected log is read by programs: no escape codes in it.
    let ansi = std::io::stderr().is_terminal();
    init_logging(log.log_format, &filter, ansi, std::io::stderr);
    // As many workers as the CPU quota allows: more only park and wake each
    // other (at a 1-CPU quota, one worker against two, alternating runs of
    // `atunnel-bench run --quick --scenarios egress-new,egress-http`: CPU
    // per new egress connection at 1,000/s 0.188 and 0.186 ms vs 0.229 and
    // 0.222; cores at 8,000 req/s 0.213 and 0.218 vs 0.276 and 0.233).
    // tokio's default is std's `available_parallelism`, which reads the
    // cgroup quota (v1 and v2, rounded down, at least 1) and the CPU
    // affinity; TOKIO_WORKER_THREADS overrides it.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cancel = CancellationToken::new();
    let result = runtime.block_on(async {
        let stop = cancel.clone();
        tokio::spawn(async move {
            wait_for_stop_signal().await;
            stop.cancel();
        });
        body(cancel).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn wait_for_stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What one warning looks like in `format`, written as `run_main`
    /// writes it when stderr is not a terminal. A process has one global
    /// logger, so each format is checked in a child process of its own.
    fn logged(format: &str) -> String {
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", "entry::tests::log_one_warning", "--nocapture"])
            .env("ATUNNEL_TEST_LOG_FORMAT", format)
            .output()
            .expect("run the child");
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        stdout
            .lines()
            .filter(|l| l.contains("a warning about"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Not a test by itself: what `logged` runs in a child.
    #[test]
    fn log_one_warning() {
        let Ok(format) = std::env::var("ATUNNEL_TEST_LOG_FORMAT") else {
            return;
        };
        let format = match format.as_str() {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        let out = Captured::default();
        let writer = out.clone();
        init_logging(format, "info", false, move || writer.clone());
        tracing::warn!(actor = "team-a/alpha", "a warning about {}", "something");
        tracing::debug!("below the filter");
        println!(
            "{}",
            String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf-8")
        );
    }

    #[test]
    fn text_logs_carry_no_escape_codes_off_a_terminal() {
        let line = logged("text");
        assert!(
            line.contains("WARN") && line.contains("actor=\"team-a/alpha\""),
            "{line}"
        );
        assert!(!line.contains('\u{1b}'), "escape codes in {line:?}");
    }

    #[test]
    fn json_logs_are_one_object_per_line_with_the_fields() {
        let line = logged("json");
        let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object");
        assert_eq!(v["level"], "WARN", "{v}");
        assert_eq!(v["actor"], "team-a/alpha", "{v}");
        assert_eq!(v["message"], "a warning about something", "{v}");
        assert!(v["timestamp"].is_string(), "{v}");
    }
}
