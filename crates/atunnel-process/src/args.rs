//! The flags every atunnel process shares: socket options and the relay's
//! buffer pool (one clap struct each; a field's doc is its `--help`), and
//! the duration syntax of every time flag.

use crate::overload::OverloadConfig;
use atunnel_core::BufferPool;
use atunnel_core::pool::{DEFAULT_BUFFER_SIZE, DEFAULT_MAX_BUFFERS, DEFAULT_MAX_IDLE};
use atunnel_core::relay::RelayBounds;
use atunnel_core::sockopt::{Keepalive, SocketOptions};

/// Socket options for every accepted or dialed TCP socket. The defaults
/// are [`SocketOptions::default`] (network side) and
/// [`SocketOptions::sandbox_default`] (sandbox side).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct SocketArgs {
    /// TCP_NOTSENT_LOWAT in bytes on every socket (-1 leaves the kernel default).
    #[arg(long, default_value_t = SocketArgs::default().tcp_notsent_lowat,
          allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    pub tcp_notsent_lowat: i64,
    /// Fixed SO_SNDBUF in bytes on network-side sockets (0: kernel autotuning, the default).
    #[arg(long, default_value_t = SocketArgs::default().tcp_send_buffer)]
    pub tcp_send_buffer: usize,
    /// Fixed SO_RCVBUF in bytes on network-side sockets (0: kernel autotuning, the default).
    #[arg(long, default_value_t = SocketArgs::default().tcp_receive_buffer)]
    pub tcp_receive_buffer: usize,
    /// Fixed SO_SNDBUF in bytes on sandbox-side sockets (to the actors, over
    /// veth, where small buffers cost no throughput); 0 keeps autotuning.
    #[arg(long, default_value_t = SocketArgs::default().sandbox_send_buffer)]
    pub sandbox_send_buffer: usize,
    /// Fixed SO_RCVBUF in bytes on sandbox-side sockets: bounds what an actor
    /// can queue in the kernel behind a stalled reader; 0 keeps autotuning
    /// (which grows to net.ipv4.tcp_rmem's maximum).
    #[arg(long, default_value_t = SocketArgs::default().sandbox_receive_buffer)]
    pub sandbox_receive_buffer: usize,
    /// Idle time before TCP keepalive's first probe on network-side sockets
    /// (router, gateway, destinations); 0 turns keepalive off.
    #[arg(long, default_value_t = FlagDuration(Keepalive::default().idle))]
    pub tcp_keepalive: FlagDuration,
    /// Time between keepalive probes.
    #[arg(long, default_value_t = FlagDuration(Keepalive::default().interval))]
    pub tcp_keepalive_interval: FlagDuration,
    /// Unanswered keepalive probes after which the connection is dead.
    #[arg(long, default_value_t = Keepalive::default().probes,
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub tcp_keepalive_probes: u32,
    /// TCP_USER_TIMEOUT on network-side sockets: data or a zero window
    /// unacknowledged this long aborts the connection; 0 leaves the
    /// kernel's retransmission limits (about 15 minutes).
    #[arg(long, default_value_t = FlagDuration(atunnel_core::sockopt::DEFAULT_USER_TIMEOUT))]
    pub tcp_user_timeout: FlagDuration,
}

impl Default for SocketArgs {
    fn default() -> Self {
        let (network, sandbox) = (SocketOptions::default(), SocketOptions::sandbox_default());
        Self {
            tcp_notsent_lowat: network.notsent_lowat.map_or(-1, i64::from),
            tcp_send_buffer: network.send_buffer.unwrap_or(0),
            tcp_receive_buffer: network.recv_buffer.unwrap_or(0),
            sandbox_send_buffer: sandbox.send_buffer.unwrap_or(0),
            sandbox_receive_buffer: sandbox.recv_buffer.unwrap_or(0),
            tcp_keepalive: FlagDuration(network.keepalive.map_or(Default::default(), |k| k.idle)),
            tcp_keepalive_interval: FlagDuration(Keepalive::default().interval),
            tcp_keepalive_probes: Keepalive::default().probes,
            tcp_user_timeout: FlagDuration(network.user_timeout.unwrap_or_default()),
        }
    }
}

impl SocketArgs {
    /// Options for network-side sockets (router, gateway, destinations).
    pub fn options(&self) -> SocketOptions {
        SocketOptions {
            keepalive: (!self.tcp_keepalive.0.is_zero()).then_some(Keepalive {
                idle: self.tcp_keepalive.0,
                interval: self.tcp_keepalive_interval.0,
                probes: self.tcp_keepalive_probes,
            }),
            user_timeout: (!self.tcp_user_timeout.0.is_zero()).then_some(self.tcp_user_timeout.0),
            ..SocketOptions::from_flags(
                self.tcp_notsent_lowat,
                self.tcp_send_buffer,
                self.tcp_receive_buffer,
            )
        }
    }

    /// Options for sandbox-side sockets (to and from the actors).
    pub fn sandbox_options(&self) -> SocketOptions {
        let mut o = SocketOptions {
            keepalive: None,
            user_timeout: None,
            ..self.options()
        };
        if self.sandbox_send_buffer > 0 {
            o.send_buffer = Some(self.sandbox_send_buffer);
        }
        if self.sandbox_receive_buffer > 0 {
            o.recv_buffer = Some(self.sandbox_receive_buffer);
        }
        o
    }
}

/// Connections a TLS listener holds before they have authenticated.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct PreAuthArgs {
    /// Connections in their TLS handshake at once, per listener; past it
    /// new ones are closed at once.
    #[arg(long, default_value_t = atunnel_tls::PreAuthLimits::default().total)]
    pub max_handshaking: usize,
    /// Connections in their TLS handshake at once from one source address,
    /// per listener, so a flood from some addresses cannot take the places
    /// a router from another needs.
    #[arg(long, default_value_t = atunnel_tls::PreAuthLimits::default().per_source)]
    pub max_handshaking_per_source: usize,
}

impl PreAuthArgs {
    pub fn limits(&self) -> atunnel_tls::PreAuthLimits {
        atunnel_tls::PreAuthLimits {
            total: self.max_handshaking,
            per_source: self.max_handshaking_per_source,
        }
    }
}

/// Each HTTP/2 connection's control-frame budget (SETTINGS, PING,
/// WINDOW_UPDATE, PRIORITY, RST_STREAM, empty DATA, HEADERS on a stream
/// already seen), on every HTTP/2 server and client of the process: past
/// it the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed.
#[derive(clap::Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2FloodArgs {
    /// Control frames a connection may send before they must be paid for
    /// by useful ones (a request, a non-empty DATA frame: 10 each).
    #[arg(long, default_value_t = atunnel_connect::flood::FloodLimits::default().budget,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub h2_control_frame_budget: u32,
    /// Control frames a second an emptied budget earns back with time
    /// alone.
    #[arg(long, default_value_t = atunnel_connect::flood::FloodLimits::default().per_second)]
    pub h2_control_frames_per_second: u32,
}

impl H2FloodArgs {
    pub fn limits(&self) -> atunnel_connect::flood::FloodLimits {
        atunnel_connect::flood::FloodLimits {
            budget: self.h2_control_frame_budget,
            per_second: self.h2_control_frames_per_second,
        }
    }
}

/// The relay's buffer pool.
#[derive(clap::Args, Clone, Debug)]
pub struct PoolArgs {
    /// Size of each relay buffer in bytes.
    #[arg(long, default_value_t = DEFAULT_BUFFER_SIZE)]
    pub buffer_size: usize,
    /// Most relay buffers borrowed at once; borrowers past it wait.
    #[arg(long, default_value_t = DEFAULT_MAX_BUFFERS)]
    pub max_buffers: usize,
    /// Free relay buffers kept for reuse; the rest are freed.
    #[arg(long, default_value_t = DEFAULT_MAX_IDLE)]
    pub max_idle_buffers: usize,
}

impl PoolArgs {
    pub fn pool(&self) -> BufferPool {
        BufferPool::new(
            self.buffer_size.max(1),
            self.max_buffers.max(1),
            self.max_idle_buffers,
        )
    }
}

/// Bounds on tunnels that can never finish (the relay's [`RelayBounds`]).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct RelayArgs {
    /// How long a tunnel may have bytes to write toward a peer that takes
    /// none (it stopped reading, or grants no HTTP/2 window) before it is
    /// reset ("60s"). Also ends a tunnel whose sender has closed while its
    /// last bytes wait.
    #[arg(long, default_value_t = FlagDuration(RelayBounds::default().write_stall))]
    pub stalled_write_timeout: FlagDuration,
    /// How long a half-closed tunnel (one side sent FIN) may move nothing
    /// before it is reset ("60s").
    #[arg(long, default_value_t = FlagDuration(RelayBounds::default().half_closed_idle))]
    pub half_closed_timeout: FlagDuration,
}

impl RelayArgs {
    pub fn bounds(&self) -> RelayBounds {
        RelayBounds {
            write_stall: self.stalled_write_timeout.0,
            half_closed_idle: self.half_closed_timeout.0,
        }
    }
}

/// The overload guard (see [`OverloadConfig`]): memory against the
/// process's cgroup limit and descriptors against RLIMIT_NOFILE.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct OverloadArgs {
    /// Pressure (used / limit, of memory or descriptors) past which new
    /// work is refused (egress tunnels reset, ingress and CONNECT 503).
    #[arg(long, default_value_t = OverloadConfig::default().soft)]
    pub overload_soft: f64,
    /// Pressure past which the largest consumer is shed, one per interval.
    #[arg(long, default_value_t = OverloadConfig::default().hard)]
    pub overload_hard: f64,
    /// Pressure past which new work is refused for every actor; between
    /// --overload-soft and it, only for the actors holding more than their
    /// fair share (all actors' holding / their number) of the pressured
    /// resource. Clamped between soft and hard.
    #[arg(long, default_value_t = OverloadConfig::default().everyone)]
    pub overload_everyone: f64,
    /// Memory limit in bytes the pressure is taken against (0: the
    /// process's cgroup limit, or the machine's memory without one).
    #[arg(long, default_value_t = 0)]
    pub overload_memory_limit: u64,
    /// Run no overload guard.
    #[arg(long)]
    pub no_overload_guard: bool,
}

impl OverloadArgs {
    /// The guard's configuration; `None` with `--no-overload-guard`.
    pub fn config(&self) -> Option<OverloadConfig> {
        (!self.no_overload_guard).then(|| OverloadConfig {
            soft: self.overload_soft,
            hard: self.overload_hard,
            everyone: self.overload_everyone,
            memory_limit: (self.overload_memory_limit > 0).then_some(self.overload_memory_limit),
            ..OverloadConfig::default()
        })
    }
}

/// A duration flag: "15s", "100ms", "2m", or "0" (plain numbers are seconds).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    use std::time::Duration;
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with ms, s or m"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: unknown unit {unit:?} (ms, s or m)")),
    }
}

/// A duration flag's value: parsed by [`parse_duration`], shown the same
/// way, so a config struct's default `Duration` can be clap's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlagDuration(pub std::time::Duration);

impl std::fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl std::str::FromStr for FlagDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(Self)
    }
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn a_duration_flag_shows_what_it_parses() {
        use super::FlagDuration;
        for d in [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_secs(15),
            Duration::from_millis(1500),
        ] {
            let shown = FlagDuration(d).to_string();
            assert_eq!(
                shown.parse::<FlagDuration>(),
                Ok(FlagDuration(d)),
                "{shown}"
            );
        }
        assert_eq!(FlagDuration(Duration::from_secs(15)).to_string(), "15s");
    }

    #[test]
    fn durations_parse_with_units_and_reject_garbage() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("").is_err());
    }
}

#[cfg(test)]
mod socket_flag_tests {
    use super::SocketArgs;
    use atunnel_core::sockopt::{Keepalive, SocketOptions};
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        socket: SocketArgs,
    }

    fn parse(flags: &[&str]) -> SocketArgs {
        let argv = std::iter::once("atunnel").chain(flags.iter().copied());
        Cli::try_parse_from(argv).expect("flags parse").socket
    }

    #[test]
    fn by_default_lowat_is_16_kib_and_network_buffers_autotune() {
        let args = parse(&[]);
        let expected = SocketOptions {
            notsent_lowat: Some(16384),
            send_buffer: None,
            recv_buffer: None,
            keepalive: Some(Keepalive {
                idle: std::time::Duration::from_secs(15),
                interval: std::time::Duration::from_secs(5),
                probes: 3,
            }),
            user_timeout: Some(std::time::Duration::from_secs(60)),
        };
        assert_eq!(args.options(), expected);
        assert_eq!(args.options(), SocketOptions::default());
        assert_eq!(args, SocketArgs::default());
        assert_eq!(args.sandbox_options(), SocketOptions::sandbox_default());
        // Sandbox-side sockets keep the lowat and get their own 64 KiB
        // buffers, and no keepalive or user timeout.
        assert_eq!(
            args.sandbox_options(),
            SocketOptions {
                send_buffer: Some(65536),
                recv_buffer: Some(65536),
                keepalive: None,
                user_timeout: None,
                ..expected
            }
        );
        let off = parse(&["--tcp-keepalive=0", "--tcp-user-timeout=0"]).options();
        assert_eq!((off.keepalive, off.user_timeout), (None, None));
        let tuned = parse(&[
            "--tcp-keepalive=30s",
            "--tcp-keepalive-interval=10s",
            "--tcp-keepalive-probes=2",
            "--tcp-user-timeout=20s",
        ])
        .options();
        assert_eq!(
            (tuned.keepalive, tuned.user_timeout),
            (
                Some(Keepalive {
                    idle: std::time::Duration::from_secs(30),
                    interval: std::time::Duration::from_secs(10),
                    probes: 2,
                }),
                Some(std::time::Duration::from_secs(20))
            )
        );
    }

    #[test]
    fn negative_lowat_leaves_the_kernel_default_on_both_sides() {
        for flags in [
            &["--tcp-notsent-lowat", "-1"][..],
            &["--tcp-notsent-lowat=-1"][..],
        ] {
            let args = parse(flags);
            assert_eq!(args.options().notsent_lowat, None, "{flags:?}");
            assert_eq!(args.sandbox_options().notsent_lowat, None, "{flags:?}");
        }
    }

    #[test]
    fn a_lowat_the_kernel_cannot_take_is_refused() {
        for bad in ["-2", "4294967296", "16k"] {
            let argv = ["atunnel", "--tcp-notsent-lowat", bad];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad} accepted");
        }
        assert_eq!(
            parse(&["--tcp-notsent-lowat", "4294967295"])
                .options()
                .notsent_lowat,
            Some(u32::MAX)
        );
    }

    #[test]
    fn explicit_values_come_through() {
        let args = parse(&[
            "--tcp-notsent-lowat",
            "4096",
            "--tcp-send-buffer",
            "65536",
            "--tcp-receive-buffer",
            "98304",
        ]);
        assert_eq!(
            args.options(),
            SocketOptions {
                notsent_lowat: Some(4096),
                send_buffer: Some(65536),
                recv_buffer: Some(98304),
                ..SocketOptions::default()
            }
        );
        // The sandbox side has its own buffer flags; the lowat is shared.
        assert_eq!(args.sandbox_options().notsent_lowat, Some(4096));
        let args = parse(&[
            "--sandbox-send-buffer",
            "0",
            "--sandbox-receive-buffer",
            "0",
            "--tcp-send-buffer",
            "65536",
        ]);
        assert_eq!(args.sandbox_options().send_buffer, Some(65536));
        assert_eq!(args.sandbox_options().recv_buffer, None);
    }
}
