//! The `atunnel-gateway` binary.

use clap::Parser;

use atunnel_gateway::cli::{self, ForwardArgs};

fn main() -> std::process::ExitCode {
    let args = ForwardArgs::parse();
    atunnel_process::run_main("atunnel-gateway", "info", |cancel| async move {
        let far = args.far_end();
        cli::run(&args.gateway, far, cancel).await
    })
}
