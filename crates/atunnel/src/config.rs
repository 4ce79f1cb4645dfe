//! Command-line configuration shared by the `atunnel` binary and the bench's
//! roles: one clap struct per component, each field's doc is its `--help`.

use std::path::{Path, PathBuf};

use atunnel_core::BufferPool;
use atunnel_core::pool::{DEFAULT_BUFFER_SIZE, DEFAULT_MAX_BUFFERS, DEFAULT_MAX_IDLE};
use atunnel_core::sockopt::SocketOptions;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Socket options for every accepted or dialed TCP socket.
#[derive(clap::Args, Clone, Debug)]
pub struct SocketArgs {
    /// TCP_NOTSENT_LOWAT in bytes on every socket (-1 leaves the kernel default).
    #[arg(long, default_value_t = 16384, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX)))]
    pub tcp_notsent_lowat: i64,
    /// Fixed SO_SNDBUF in bytes (0: kernel autotuning, the default).
    #[arg(long, default_value_t = 0)]
    pub tcp_send_buffer: usize,
    /// Fixed SO_RCVBUF in bytes (0: kernel autotuning, the default).
    #[arg(long, default_value_t = 0)]
    pub tcp_receive_buffer: usize,
    /// Fixed SO_SNDBUF in bytes on sandbox-side sockets (to the actors, over
    /// veth: microseconds of round trip, so small buffers cost no
    /// throughput); 0 keeps autotuning. 64 KiB measured: egress-tcp
    /// 600-636 MB/s vs 472-630 with autotuning, and an actor that stops
    /// reading pins 160 KiB of kernel memory instead of 641 KiB (lowat off).
    #[arg(long, default_value_t = 65536)]
    pub sandbox_send_buffer: usize,
    /// Fixed SO_RCVBUF in bytes on sandbox-side sockets: bounds what an actor
    /// can queue in the kernel behind a stalled reader (a router that stops
    /// reading: 166 KiB per connection instead of 1.4 MiB with lowat);
    /// 0 keeps autotuning (which grows to net.ipv4.tcp_rmem's maximum).
    #[arg(long, default_value_t = 65536)]
    pub sandbox_receive_buffer: usize,
}

impl SocketArgs {
    /// Options for network-side sockets (router, gateway, destinations).
    pub fn options(&self) -> SocketOptions {
        SocketOptions::from_flags(
            self.tcp_notsent_lowat,
            self.tcp_send_buffer,
            self.tcp_receive_buffer,
        )
    }

    /// Options for sandbox-side sockets (to and from the actors).
    pub fn sandbox_options(&self) -> SocketOptions {
        let mut o = self.options();
        if self.sandbox_send_buffer > 0 {
            o.send_buffer = Some(self.sandbox_send_buffer);
        }
        if self.sandbox_receive_buffer > 0 {
            o.recv_buffer = Some(self.sandbox_receive_buffer);
        }
        o
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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("{path} holds no {what}")]
    Empty { path: PathBuf, what: &'static str },
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ConfigError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ConfigError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| ConfigError::Pem {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| ConfigError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    Ok(roots)
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

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

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
    use atunnel_core::sockopt::SocketOptions;
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
        };
        assert_eq!(args.options(), expected);
        assert_eq!(args.options(), SocketOptions::default());
        // Sandbox-side sockets keep the lowat and get their own 64 KiB buffers.
        assert_eq!(
            args.sandbox_options(),
            SocketOptions {
                send_buffer: Some(65536),
                recv_buffer: Some(65536),
                ..expected
            }
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
