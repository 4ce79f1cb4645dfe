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
    #[command(args_override_self = true)]
    Host(Box<atunnel::host::HostArgs>),
}

fn main() -> std::process::ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The file's flags go first among `host`'s, so the command line's win.
    let at = argv.iter().position(|a| a == "host").map_or(1, |i| i + 1);
    let cli = match atunnel_process::config_file::expand(argv, at) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("atunnel: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    atunnel_process::run_main("atunnel", "info", &cli.log.clone(), |cancel| async move {
        match cli.command {
            Command::Host(args) => atunnel::host::run(*args, cancel).await,
        }
    })
}
