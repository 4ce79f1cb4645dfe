//! The scenarios, and running one. Load is open loop (`atunnel_measure::schedule`):
//! units are due on a fixed schedule whatever earlier ones take, latency
//! counts from the due time. Egress traffic starts inside the sandboxes
//! (sockets made in each actor's runtime namespace, as its program's would
//! be); ingress comes from the load namespace as the router, with the
//! router's certificate.
//!
//! - [`egress`]: egress-idle, egress-tcp, egress-http, egress-new.
//! - [`ingress`]: ingress-https, ingress-connect.
//! - [`socket_memory`]: the socket-memory scenario.
//! - [`ingress_idle`]: the ingress-idle scenario.
//! - [`noisy_neighbour`]: the noisy-neighbour scenario (and its report
//!   section).
//! - [`chaos`]: the chaos scenario (and its report section).
//! - [`actor_scale`]: the actor-scale scenario.
//! - [`cost`]: the cost scenario (counts per unit of work, with peers).
//!
//! What they share is below them: the [`Bench`] they drive, the
//! measurement around a rung (`run::rung`), dialing from the sandboxes
//! (`run::dial`) and the router's TLS (`run::router`).

mod actor_scale;
pub(super) mod chaos;
pub(super) mod cost;
mod egress;
mod ingress;
mod ingress_idle;
pub(super) mod noisy_neighbour;
mod socket_memory;

use atunnel_bench::load::results::ScenarioResult;
use atunnel_bench::scenario::Scenario;

use super::bench::Bench;

/// Runs `scenario`. One that restarts atunnel with other flags gets it back
/// with the ones it started with afterwards, even when it failed.
pub async fn run(
    bench: &mut Bench,
    scenario: Scenario,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    bench.check_tunnel().await?;
    let flags = bench.tunnel_args().to_vec();
    let result = run_scenario(bench, scenario).await;
    if bench.tunnel_args() == flags {
        return result;
    }
    let restored = bench.restart_tunnel(flags).await;
    let result = result?;
    restored?;
    Ok(result)
}

async fn run_scenario(
    bench: &mut Bench,
    scenario: Scenario,
) -> Result<ScenarioResult, atunnel_process::BoxError> {
    match scenario {
        Scenario::EgressIdle => egress::egress_idle(bench).await,
        Scenario::EgressTcp => egress::egress_tcp(bench).await,
        Scenario::EgressHttp => egress::egress_http(bench).await,
        Scenario::EgressNew => egress::egress_new(bench).await,
        Scenario::IngressHttps => ingress::ingress_https(bench).await,
        Scenario::IngressConnect => ingress::ingress_connect(bench).await,
        Scenario::SocketMemory => socket_memory::socket_memory(bench).await,
        Scenario::IngressIdle => ingress_idle::ingress_idle(bench).await,
        Scenario::NoisyNeighbour => noisy_neighbour::noisy_neighbour(bench).await,
        Scenario::Chaos => chaos::chaos(bench).await,
        Scenario::ActorScale => actor_scale::actor_scale(bench).await,
        Scenario::Cost => cost::cost(bench).await,
    }
}
