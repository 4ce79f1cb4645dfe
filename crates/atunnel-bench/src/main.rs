//! atunnel-bench: runs atunnel and the peers it talks to, drives load through
//! it, and reports what it costs. Every role is a subcommand of this one
//! binary; orchestrating commands re-run it for each role.

mod actors;
// The global allocator; the tunnel role's /stats reads live heap from it.
mod allocator;
mod control;
mod demo;
mod pki;
mod role;
mod run;
// The machine layout: namespaces, links and addresses (`run`, `load` and
// `worker` share it).
mod topology;
mod traffic;
mod worker;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "Measures atunnel on one machine")]
struct Cli {
    #[command(flatten)]
    log: atunnel_process::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Everything on one machine: roles in namespaces, atunnel in a cgroup, every scenario, a run folder.
    Run(run::RunArgs),
    /// Fake node agent, atunnel in a cgroup (restarted when it dies), actors; a control socket.
    Worker(worker::WorkerArgs),
    /// Runs the scenarios against a worker and writes the run folder.
    Load(run::load::LoadArgs),
    /// Egress end to end on this machine: integrity, throughput, idle memory.
    Demo(demo::DemoArgs),
    /// atunnel hosting N actors (nothing else runs in this process).
    Tunnel(Box<atunnel::host::HostArgs>),
    /// atunnel as a daemon the worker drives over its control API (`atunnel serve`).
    Serve(Box<atunnel::control::daemon::ServeArgs>),
    /// The egress gateway in bench mode (answers by destination port).
    Sink(atunnel_support::sink_role::SinkArgs),
    /// The production egress gateway (forwarding to allowed destinations).
    Gateway(atunnel_gateway::cli::ForwardArgs),
    /// The actors' programs: an HTTP server in every sandbox (ingress far end).
    Actors(actors::ActorsArgs),
    /// A program whose counts are known, for the cost windows' tests: per
    /// stdin line `<writes> <iterations>`, that many write(2)s and loop turns.
    #[command(hide = true)]
    CostProbe,
    /// Writes throwaway certificates shaped like the cluster's.
    Pki {
        /// Folder to write them into.
        #[arg(long, default_value = "pki")]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Before any runtime: its threads and timers would add counts.
    if let Command::CostProbe = cli.command {
        return match atunnel_bench::cost::probe::run() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cost-probe: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    allocator::install();
    atunnel_process::run_main(
        "atunnel-bench",
        "warn",
        &cli.log.clone(),
        |cancel| async move {
            match cli.command {
                Command::Run(args) => run::run(args, cancel).await,
                Command::Worker(args) => worker::run(args, cancel).await,
                Command::Load(args) => run::load::run(args, cancel).await,
                Command::Demo(args) => demo::run(args).await,
                Command::Actors(args) => actors::run(args, cancel).await,
                Command::Tunnel(args) => atunnel::host::run(*args, cancel).await,
                Command::Serve(args) => atunnel::control::daemon::run(*args, cancel).await,
                Command::Sink(args) => atunnel_support::sink_role::run(args, cancel).await,
                Command::Gateway(args) => atunnel_gateway::cli::run_forward(&args, cancel).await,
                Command::CostProbe => unreachable!("run before the runtime"),
                Command::Pki { out } => {
                    pki::write(&out).map(|f| println!("wrote {}", f.dir.display()))
                }
            }
        },
    )
}
