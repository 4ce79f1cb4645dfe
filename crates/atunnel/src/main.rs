//! The `atunnel` binary: the tunnel hosting actors. The egress gateway is
//! its own binary, `atunnel-gateway`.

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingAlloc =
    atunnel_core::alloc::CountingWith(std::alloc::System);

#[derive(Parser)]
#[command(
    version,
    about = "atunnel: the per-worker tunnel for actors' sandboxes"
)]
struct Cli {
    #[command(flatten)]
    log: atunnel_process::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Host actors: sandboxes, egress through a gateway, ingress from the router.
    Host(Box<atunnel::host::HostArgs>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    atunnel_process::run_main("atunnel", "info", &cli.log.clone(), |cancel| async move {
        match cli.command {
            Command::Host(args) => atunnel::host::run(*args, cancel).await,
        }
    })
}
