//! What every atunnel process (the tunnel, the gateway, the bench's roles)
//! does at its entry point: logging, a runtime with as many workers as the
//! cgroup's CPU quota allows, a stop token for Ctrl-C and SIGTERM
//! ([`run_main`]), the flags they all share ([`args`]), the admin
//! listener that serves `/stats` ([`admin`]), and the overload guard
//! ([`overload`]): the process's memory and descriptors against their
//! limits, refusing and shedding work near them.
//!
//! Depends on `atunnel-core`, `atunnel-host` (what the guard and `/stats`
//! read of the host), `atunnel-tls`, `atunnel-connect` (the HTTP/2 flood
//! limits its shared flags set) and hyper only; every binary of the
//! workspace may depend on it, no library below the binaries' own does.

pub mod admin;
pub mod args;
pub mod config_file;
mod entry;
pub mod metrics_text;
pub mod overload;
pub mod process_stats;
pub mod reload;

pub use admin::{AdminArgs, AdminLimits};
pub use args::{
    FlagDuration, H2FloodArgs, OverloadArgs, PoolArgs, PreAuthArgs, RelayArgs, SocketArgs,
    parse_duration,
};
pub use entry::{LogArgs, LogFormat, run_main};
pub use overload::{
    Held, OverloadConfig, OverloadGuard, OverloadState, OverloadStats, Overloaded, Resource, Shed,
    ShedAction,
};

/// Errors at process entry points, where the message is all that is left.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
