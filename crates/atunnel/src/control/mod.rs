//! The control API: the worker drives each actor's lifecycle over gRPC on
//! a Unix socket (`proto/atunnel/control/v1/control.proto`, where every
//! call's statuses are specified; docs/control-api.md).
//!
//! - [`service`]: the calls over a [`crate::tunnel::Tunnel`], and the rules
//!   of the lifecycle;
//! - [`listener`]: the socket (its mode, SO_PEERCRED uid check at accept,
//!   a preface timeout, a cap on connections) and serving on it;
//! - [`daemon`]: `atunnel serve`, a tunnel with no actors of its own;
//! - [`client`]: `atunnel ctl`, printing answers as JSON.

pub mod client;
pub mod daemon;
pub mod listener;
pub mod service;

use std::path::PathBuf;
use std::time::Duration;

use atunnel_process::FlagDuration;

/// The generated messages, client and server (package
/// `atunnel.control.v1`).
pub mod proto {
    tonic::include_proto!("atunnel.control.v1");
}

/// Where `atunnel serve` listens and `atunnel ctl` dials by default.
pub const DEFAULT_SOCKET: &str = "/run/atunnel/control.sock";
/// Owner-only: the worker runs as the daemon's uid.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;
/// Connections served at once; as many again may wait for their preface
/// and a place (past that the oldest waiting is closed). A worker needs
/// one (calls multiplex over HTTP/2); the rest is for `ctl` and probes.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
/// How long a new connection has to send its HTTP/2 preface and be given
/// a place among those served. A client sends the preface with its first
/// write, microseconds after connecting; 5 s leaves room for a loaded host.
pub const DEFAULT_PREFACE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a served connection that has sent nothing is PINGed; one
/// that does not answer within as long again is closed. An HTTP/2 client
/// answers in its library, so only a peer that sent a preface and went
/// silent keeps a place no longer than twice this.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Calls in flight on one connection (HTTP/2 streams). With the connection
/// cap this bounds the operations running at once: 16 × 32.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;
/// The largest request accepted: the biggest real one is a few hundred
/// bytes (names of at most 253 bytes).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How long a caller waits for one call. Generous: the slowest call,
/// deactivating, waits up to the drain timeout (10 s) for ingress and up to
/// twice that for egress. The operation itself runs to its end regardless.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long shutdown waits for open control connections to finish their
/// calls before dropping them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The control listener's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlConfig {
    pub socket: PathBuf,
    /// The socket file's mode: 0600 (owner) or 0660 (and `group`); never
    /// any bit for others.
    pub mode: u32,
    /// The socket file's group, for mode 0660; `None` keeps the daemon's.
    pub group: Option<u32>,
    /// Peer uids (SO_PEERCRED) allowed to call; every other is closed at
    /// accept. Empty: the daemon's own effective uid.
    pub allowed_uids: Vec<u32>,
    pub max_connections: usize,
    /// How long a new connection has to send its preface and be given a
    /// place; past it, it is closed.
    pub preface_timeout: Duration,
    /// PING a served connection quiet this long; close it if the PING is
    /// not answered within as long again.
    pub ping_interval: Duration,
    pub call_timeout: Duration,
}

impl ControlConfig {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mode: DEFAULT_SOCKET_MODE,
            group: None,
            allowed_uids: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            preface_timeout: DEFAULT_PREFACE_TIMEOUT,
            ping_interval: DEFAULT_PING_INTERVAL,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// The uids allowed: the configured ones, or the daemon's own.
    pub fn allowed(&self) -> Vec<u32> {
        if self.allowed_uids.is_empty() {
            vec![nix::unistd::geteuid().as_raw()]
        } else {
            self.allowed_uids.clone()
        }
    }
}

/// The control listener's flags (`atunnel serve`).
#[derive(clap::Args, Clone, Debug)]
pub struct ControlArgs {
    /// The control API's Unix socket (replaced if stale).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub control_socket: PathBuf,
    /// The socket's mode, octal: 600 (owner only) or 660 (with
    /// --control-socket-group); bits for others are refused.
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    pub control_socket_mode: u32,
    /// The socket's group (numeric gid), for mode 660.
    #[arg(long)]
    pub control_socket_group: Option<u32>,
    /// Uids allowed to call, comma separated, checked on each connection's
    /// peer credentials (SO_PEERCRED) at accept, where any other is closed;
    /// default: the daemon's own uid.
    #[arg(long, value_delimiter = ',')]
    pub control_allowed_uid: Vec<u32>,
    /// Control connections served at once; as many again may wait for
    /// their preface and a place, past that the oldest waiting is closed.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::TypedValueParser::map(
              clap::value_parser!(u32).range(1..=4096), |n| n as usize))]
    pub control_max_connections: usize,
    /// How long a new control connection has to send its HTTP/2 preface
    /// and be given a place before it is closed ("5s").
    #[arg(long, default_value_t = FlagDuration(DEFAULT_PREFACE_TIMEOUT))]
    pub control_preface_timeout: FlagDuration,
    /// PING a control connection quiet this long, and close it if the PING
    /// is not answered within as long again ("30s").
    #[arg(long, default_value_t = FlagDuration(DEFAULT_PING_INTERVAL))]
    pub control_ping_interval: FlagDuration,
    /// How long a caller waits for one call before DEADLINE_EXCEEDED (the
    /// operation still runs to its end) ("60s").
    #[arg(long, default_value_t = FlagDuration(DEFAULT_CALL_TIMEOUT))]
    pub control_call_timeout: FlagDuration,
}

impl ControlArgs {
    pub fn config(&self) -> ControlConfig {
        ControlConfig {
            socket: self.control_socket.clone(),
            mode: self.control_socket_mode,
            group: self.control_socket_group,
            allowed_uids: self.control_allowed_uid.clone(),
            max_connections: self.control_max_connections,
            preface_timeout: self.control_preface_timeout.0,
            ping_interval: self.control_ping_interval.0,
            call_timeout: self.control_call_timeout.0,
        }
    }
}

/// An octal mode with no bits for others and nothing beyond rwx.
fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("{s:?} is not an octal mode: {e}"))?;
    if mode & !0o770 != 0 {
        return Err(format!(
            "mode {mode:o} gives others access (or sets special bits); use 600 or 660"
        ));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        control: ControlArgs,
    }

    #[test]
    fn the_flags_defaults_are_the_librarys() {
        let cli = Cli::try_parse_from(["atunnel"]).expect("parses");
        assert_eq!(cli.control.config(), ControlConfig::new(DEFAULT_SOCKET));
    }

    #[test]
    fn a_socket_mode_open_to_others_is_refused() {
        for ok in ["600", "660", "0600", "0o660"] {
            assert!(parse_mode(ok).is_ok(), "{ok}");
        }
        for bad in ["666", "604", "1660", "777", "9", ""] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
