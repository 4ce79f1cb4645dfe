//! Most of atunnel's integration tests, in one test binary: each file here
//! is a module, and its tests are named `<module>::<test>` (run one file's
//! with `cargo test -p atunnel --test it <module>::`). One binary links the
//! dependency tree once instead of once per file.
//!
//! libtest runs these tests on parallel threads of one process, as it did
//! inside each file's own binary before: nothing here may count or change
//! what is the whole process's. The tests that do have binaries of their
//! own, at `tests/*.rs`: the counting allocators (`actor_budgets`,
//! `actor_heap`, `hibernation`, `ingress_memory`), the descriptor limit and
//! table (`fd_limit`, `sandbox_churn`, `socket_options`, `wait_bounds`);
//! `tests/timing` holds two that assert timing bounds (`dead_peers`,
//! `ingress_isolation`). See docs/testing.md.
//!
//! What these modules share, and why it is safe: one process id, so each
//! names its network namespaces with a prefix of its own (`atnt-<pid>-<test>-`
//! in `sandbox_egress` and `ingress_grpc`, `atnc-` in `control_api`,
//! `atnd-` in `daemon_sandboxes`); the SIGHUP `gateway_policy` sends to
//! this process, which only its own gateway's reloader listens for (the
//! ingress reload on SIGHUP runs only in the `atunnel` binary).

mod actor_activation;
mod binary_config;
mod common;
mod control_api;
mod daemon;
mod daemon_sandboxes;
mod deploy_manifest;
mod egress_activation;
mod egress_budget;
mod egress_cuts;
mod egress_tunnel;
mod gateway_budget;
mod gateway_client_errors;
mod gateway_policy;
mod gateway_pool;
mod h2_abuse;
mod ingress_body_idle;
mod ingress_budget;
mod ingress_connect;
mod ingress_connect_bounds;
mod ingress_grpc;
mod ingress_https;
mod ingress_interop;
mod ingress_pool;
mod ingress_process;
mod ingress_router_bytes;
mod late_dial;
mod node_agent_egress;
mod sandbox_egress;
mod shutdown;
mod tls_resumption;
mod workspace;
