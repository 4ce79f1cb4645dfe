//! The `atunnel-gateway` binary.

use clap::Parser;

use atunnel_gateway::cli::{self, Cli};

fn main() -> std::process::ExitCode {
    // The file's flags go before the command line's, which win.
    let Cli { log, args } =
        match atunnel_process::config_file::expand(std::env::args_os().collect(), 1) {
            Ok(argv) => Cli::parse_from(argv),
            Err(e) => {
                eprintln!("atunnel-gateway: {e}");
                return std::process::ExitCode::from(2);
            }
        };
    atunnel_process::run_main("atunnel-gateway", "info", &log, |cancel| async move {
        cli::run_forward(&args, cancel).await
    })
}
