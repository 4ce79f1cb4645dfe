//! The `atunnel` binary: the tunnel hosting actors, or the egress gateway.

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingAlloc = atunnel_core::alloc::CountingAlloc;

#[derive(Parser)]
#[command(
    version,
    about = "atunnel: the per-worker tunnel for actors' sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Host actors: sandboxes, egress through a gateway, ingress from the router.
    Host(Box<atunnel::host::HostArgs>),
    /// Run the egress gateway.
    Gateway(Box<atunnel::gateway::cli::GatewayArgs>),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("atunnel: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cancel = CancellationToken::new();
    let result = runtime.block_on(async {
        let stop = cancel.clone();
        tokio::spawn(async move {
            wait_for_stop_signal().await;
            stop.cancel();
        });
        match cli.command {
            Command::Host(args) => atunnel::host::run(*args, cancel).await,
            Command::Gateway(args) => atunnel::gateway::cli::run(*args, cancel).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("atunnel: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM (what a supervisor sends) both stop cleanly.
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
