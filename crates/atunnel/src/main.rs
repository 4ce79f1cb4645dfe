//! The `atunnel` binary: the tunnel hosting actors. The egress gateway is
//! its own binary, `atunnel-gateway`.

use clap::{Parser, Subcommand};

// jemalloc by default (docs/memory.md, "The allocator"), counted for /stats.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingJemalloc = atunnel_core::alloc::COUNTING_JEMALLOC;

#[cfg(not(feature = "jemalloc"))]
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
    /// Serve the control API: the worker brings each actor over it.
    #[command(args_override_self = true)]
    Serve(Box<atunnel::control::daemon::ServeArgs>),
    /// Call the control API of a running `atunnel serve`; prints JSON.
    Ctl(atunnel::control::client::CtlArgs),
}

fn main() -> std::process::ExitCode {
    // Hibernation and /stats ask the allocator to hand free memory back.
    #[cfg(feature = "jemalloc")]
    atunnel_core::alloc::release_with_jemalloc();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The file's flags go first among `host`'s (or `serve`'s), so the
    // command line's win.
    let at = argv
        .iter()
        .position(|a| a == "host" || a == "serve")
        .map_or(1, |i| i + 1);
    let cli = match atunnel_process::config_file::expand(argv, at) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("atunnel: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Command::Ctl(args) = cli.command {
        // A short-lived client: no logging, no signal handling, one thread.
        return match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(atunnel::control::client::run(args)),
            Err(e) => {
                eprintln!("atunnel ctl: starting the runtime: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    atunnel_process::run_main("atunnel", "info", &cli.log.clone(), |cancel| async move {
        match cli.command {
            Command::Host(args) => atunnel::host::run(*args, cancel).await,
            Command::Serve(args) => atunnel::control::daemon::run(*args, cancel).await,
            Command::Ctl(_) => unreachable!("handled above"),
        }
    })
}
