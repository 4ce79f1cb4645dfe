//! atunnel-bench: runs atunnel and the peers it talks to, drives load through
//! it, and reports what it costs. Every role is a subcommand of this one
//! binary; orchestrating commands re-run it for each role.

mod actors;
mod demo;
mod pki;
mod role;
mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

// The tunnel role's /stats reads live heap from this allocator.
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingAlloc = atunnel_core::alloc::CountingAlloc;

#[derive(Parser)]
#[command(version, about = "Measures atunnel on one machine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Everything on one machine: roles in namespaces, atunnel in a cgroup, every scenario, a run folder.
    Run(run::RunArgs),
    /// Egress end to end on this machine: integrity, throughput, idle memory.
    Demo(demo::DemoArgs),
    /// atunnel hosting N actors (nothing else runs in this process).
    Tunnel(Box<atunnel::host::HostArgs>),
    /// The egress gateway in bench mode (answers by destination port).
    Sink(atunnel::gateway::cli::GatewayArgs),
    /// The actors' programs: an HTTP server in every sandbox (ingress far end).
    Actors(actors::ActorsArgs),
    /// Writes throwaway certificates shaped like the cluster's.
    Pki {
        /// Folder to write them into.
        #[arg(long, default_value = "pki")]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
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
            eprintln!("atunnel-bench: starting the runtime: {e}");
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
            Command::Run(args) => run::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Actors(args) => actors::run(args, cancel).await,
            Command::Tunnel(args) => atunnel::host::run(*args, cancel).await,
            Command::Sink(args) => atunnel::gateway::cli::run(args, cancel).await,
            Command::Pki { out } => pki::write(&out).map(|f| println!("wrote {}", f.dir.display())),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("atunnel-bench: {e}");
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
