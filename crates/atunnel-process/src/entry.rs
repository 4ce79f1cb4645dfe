//! What every atunnel process entry point does: logging to stderr, a
//! multi-threaded runtime with as many workers as the cgroup's CPU quota, a
//! stop token cancelled by Ctrl-C or SIGTERM (what a supervisor sends), and
//! the error as the exit message.

use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

/// Runs `body` to completion and turns its outcome into an exit code.
/// `default_log` is the tracing filter when RUST_LOG is unset.
pub fn run_main<F, Fut>(name: &str, default_log: &str, body: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), crate::BoxError>>,
{
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_log.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = crate::cpu_quota::worker_threads() {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
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
