//! The `atunnel-gateway` binary.

use clap::Parser;

use atunnel_gateway::cli::{self, ForwardArgs};

#[derive(Parser)]
#[command(version, about = "atunnel-gateway: the egress gateway")]
struct Cli {
    #[command(flatten)]
    log: atunnel_process::LogArgs,
    #[command(flatten)]
    args: ForwardArgs,
}

fn main() -> std::process::ExitCode {
    let Cli { log, args } = Cli::parse();
    atunnel_process::run_main("atunnel-gateway", "info", &log, |cancel| async move {
        let far = args.far_end();
        cli::run(&args.gateway, far, cancel).await
    })
}
