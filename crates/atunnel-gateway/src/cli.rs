//! The gateway as a process: its flags, and serving until stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use atunnel_identity::pem_files::{load_certs, load_key};
use atunnel_process::{BoxError, PoolArgs, SocketArgs};
use tokio_util::sync::CancellationToken;

use crate::policy::{DefaultDeny, PolicyError, PolicyHandle, PolicySpec, Rule};
use crate::stats::StatsSource;
use crate::{FarEnd, Forward, GatewayConfig};

/// The flags of every gateway process, whatever its far end.
#[derive(clap::Args, Clone, Debug)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:443")]
    pub listen: SocketAddr,
    /// Server certificate chain (PEM).
    #[arg(long)]
    pub cert: PathBuf,
    /// Server private key (PEM).
    #[arg(long)]
    pub key: PathBuf,
    /// CA certificates that sign actor certificates (PEM).
    #[arg(long)]
    pub actor_ca: PathBuf,
    /// ALPN protocols offered, comma separated ("http/1.1" alone acts like the Envoy gateway).
    #[arg(long, value_delimiter = ',', default_values_t = crate::DEFAULT_ALPN.map(String::from))]
    pub alpn: Vec<String>,
    /// HTTP/2 streams one connection may carry at once.
    #[arg(long, default_value_t = atunnel_connect::limits::MAX_CONCURRENT_STREAMS)]
    pub max_concurrent_streams: u32,
    /// HTTP/2 receive window per tunnel, in bytes: the most a tunnel whose
    /// destination stopped reading makes the gateway hold; a tunnel's
    /// upload rate is at most this per round trip to atunnel.
    #[arg(long, default_value_t = atunnel_connect::limits::TUNNEL_STREAM_WINDOW,
          value_parser = clap::value_parser!(u32).range(4096..=(1 << 31) - 1))]
    pub stream_window: u32,
    /// HTTP/2 receive window per connection, in bytes: the most one actor's
    /// tunnels on one connection (each connection is one actor's) hold
    /// unread together.
    #[arg(long, default_value_t = atunnel_connect::limits::TUNNEL_CONNECTION_WINDOW,
          value_parser = clap::value_parser!(u32).range(65535..=(1 << 31) - 1))]
    pub connection_window: u32,
    /// Largest HTTP/2 frame a client may send, in bytes: a tunnel's bytes
    /// per write, and what one connection's read buffer may grow to.
    #[arg(long, default_value_t = atunnel_connect::limits::GATEWAY_MAX_FRAME_SIZE,
          value_parser = clap::value_parser!(u32).range(16384..=(1 << 24) - 1))]
    pub max_frame_size: u32,
    /// Address of the admin listener, atunnel's: /stats (JSON: the
    /// process, the buffer pool, the CONNECT listener, budgets, policy),
    /// /metrics, /healthz, /readyz; off unless given.
    #[arg(long)]
    pub stats: Option<SocketAddr>,
    #[command(flatten)]
    pub admin: atunnel_process::AdminArgs,
    #[command(flatten)]
    pub relay: atunnel_process::RelayArgs,
    /// Concurrent tunnels per client identity (actor); past it its new
    /// CONNECTs are refused with 429.
    #[arg(long, default_value_t = crate::budget::DEFAULT_IDENTITY_MAX_TUNNELS)]
    pub identity_max_tunnels: usize,
    /// Pooled relay buffers one identity's tunnels may hold at once.
    #[arg(long, default_value_t = crate::budget::DEFAULT_IDENTITY_MAX_BUFFERS)]
    pub identity_max_buffers: usize,
    /// How long a client has to finish TLS ("10s").
    #[arg(long, default_value_t = atunnel_process::FlagDuration(atunnel_connect::limits::HANDSHAKE_TIMEOUT))]
    pub tls_handshake_timeout: atunnel_process::FlagDuration,
    #[command(flatten)]
    pub pre_auth: atunnel_process::PreAuthArgs,
    #[command(flatten)]
    pub h2_floods: atunnel_process::H2FloodArgs,
    #[command(flatten)]
    pub overload: atunnel_process::OverloadArgs,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// The `atunnel-gateway` binary's command line: its logging, then the
/// gateway's flags. Here, not in main.rs, so that the flags table in
/// docs/operating.md is checked against exactly what `--help` prints.
#[derive(clap::Parser)]
#[command(
    name = "atunnel-gateway",
    version,
    about = "atunnel-gateway: the egress gateway",
    args_override_self = true
)]
pub struct Cli {
    #[command(flatten)]
    pub log: atunnel_process::LogArgs,
    #[command(flatten)]
    pub args: ForwardArgs,
}

/// `atunnel-gateway`: the gateway forwarding to allowed destinations.
#[derive(clap::Parser, Clone, Debug)]
#[command(
    version,
    about = "atunnel-gateway: the egress gateway for actors' CONNECT tunnels"
)]
pub struct ForwardArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Destinations allowed: CIDR[:PORT|:LOW-HIGH], IPv6 with ports in
    /// brackets ([2001:db8::/32]:443); repeatable, comma separated
    /// (default: none; no allow rule matching is a 403). docs/operating.md.
    #[arg(long, value_delimiter = ',')]
    pub allow: Vec<Rule>,
    /// Destinations denied, as --allow; a deny rule wins over any allow.
    #[arg(long, value_delimiter = ',')]
    pub deny: Vec<Rule>,
    /// Default deny entries to lift (default: none): link-local, metadata,
    /// loopback, unspecified, ipv4-compatible, own-listeners.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub skip_default_deny: Vec<DefaultDeny>,
    /// A file of more rules, one a line (`allow RULE`, `deny RULE`, `#`
    /// comments), re-read on SIGHUP and when it changes; one that fails to
    /// parse is logged and the policy in force kept.
    #[arg(long)]
    pub policy_file: Option<PathBuf>,
    /// How often the policy file is checked for a change ("10s"; 0: only
    /// on SIGHUP).
    #[arg(long, default_value_t = atunnel_process::FlagDuration(DEFAULT_POLICY_FILE_POLL))]
    pub policy_file_poll_interval: atunnel_process::FlagDuration,
    /// How long dialing a destination may take; past it the CONNECT gets
    /// 502 ("5s").
    #[arg(long, default_value_t = atunnel_process::FlagDuration(atunnel_connect::limits::DESTINATION_DIAL_TIMEOUT))]
    pub dial_timeout: atunnel_process::FlagDuration,
    /// A TOML file setting any of these flags by long name
    /// (`max-concurrent-streams = 1000`); flags on the command line win.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

/// Default of `--policy-file-poll-interval`: as the tunnel's trust bundle.
pub const DEFAULT_POLICY_FILE_POLL: std::time::Duration = std::time::Duration::from_secs(10);

impl ForwardArgs {
    /// The destination policy of these flags; the policy file, if any, is
    /// read now.
    pub fn policy(&self) -> Result<PolicyHandle, PolicyError> {
        let spec = PolicySpec {
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            skip_default: self.skip_default_deny.clone(),
            own_listeners: [Some(self.gateway.listen), self.gateway.stats]
                .into_iter()
                .flatten()
                .collect(),
        };
        PolicyHandle::new(spec, self.policy_file.clone())
    }

    pub fn far_end(&self) -> Result<Forward, PolicyError> {
        Ok(Forward {
            policy: Arc::new(self.policy()?),
            socket: self.gateway.socket.options(),
            bounds: self.gateway.relay.bounds(),
            dial_timeout: self.dial_timeout.0,
        })
    }
}

/// Serves the forwarding gateway of `args` until `cancel`, its policy
/// reloaded on SIGHUP and when its file changes.
pub async fn run_forward(args: &ForwardArgs, cancel: CancellationToken) -> Result<(), BoxError> {
    let far = args.far_end()?;
    let policy = far.policy.clone();
    // The reloader stops with the gateway, also when serving fails.
    let stop_reload = cancel.child_token();
    let reload = async {
        if let Some(path) = policy.file() {
            let poll = args.policy_file_poll_interval.0;
            atunnel_process::reload::on_sighup_or_change(path, poll, stop_reload.clone(), |why| {
                match policy.reload() {
                    Ok(()) => tracing::info!(why, "reloaded the destination policy"),
                    Err(e) => {
                        tracing::warn!(why, error = %e, "keeping the destination policy in force")
                    }
                }
            })
            .await
        }
    };
    let serving = async {
        let served = serve(&args.gateway, far, Some(policy.clone()), cancel.clone()).await;
        stop_reload.cancel();
        served
    };
    let (served, ()) = tokio::join!(serving, reload);
    served
}

/// Serves a gateway with `far` as its far end (and `/stats` when
/// `--stats` names an address) until `cancel`. Prints `listening <addr>`
/// once both are bound.
pub async fn run<F: FarEnd>(
    args: &GatewayArgs,
    far: F,
    cancel: CancellationToken,
) -> Result<(), BoxError> {
    serve(args, far, None, cancel).await
}

async fn serve<F: FarEnd>(
    args: &GatewayArgs,
    far: F,
    policy: Option<Arc<PolicyHandle>>,
    cancel: CancellationToken,
) -> Result<(), BoxError> {
    let mut cfg = GatewayConfig::new(
        load_certs(&args.cert)?,
        load_key(&args.key)?,
        load_certs(&args.actor_ca)?,
    );
    cfg.alpn = args.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg.max_concurrent_streams = args.max_concurrent_streams;
    cfg.stream_window = args.stream_window;
    cfg.connection_window = args.connection_window;
    cfg.max_frame_size = args.max_frame_size;
    cfg.handshake_timeout = args.tls_handshake_timeout.0;
    cfg.pre_auth = args.pre_auth.limits();
    cfg.h2_floods = args.h2_floods.limits();
    cfg.budget = crate::budget::IdentityBudget {
        max_tunnels: args.identity_max_tunnels,
        max_buffers: args.identity_max_buffers,
    };
    let overload = match args.overload.config() {
        Some(c) => Some(atunnel_process::overload::OverloadGuard::new(c)?),
        None => None,
    };
    cfg.overload = overload.clone();
    cfg.socket = args.socket.options();
    let pool = args.pool.pool();
    let gateway = crate::new(cfg, far, pool.clone())?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let stats = match args.stats {
        Some(addr) => {
            let tcp = tokio::net::TcpListener::bind(addr).await?;
            let g = gateway.clone();
            let source = StatsSource {
                pool,
                listener: Box::new(move || g.listener_stats()),
                pre_auth: {
                    let g = gateway.clone();
                    Box::new(move || g.pre_auth())
                },
                h2_floods: {
                    let g = gateway.clone();
                    Box::new(move || g.h2_floods())
                },
                budgets: {
                    let g = gateway.clone();
                    Box::new(move || g.handler().budget_stats())
                },
                overload: overload.clone(),
                policy,
                admin: Default::default(),
            };
            Some((tcp, Arc::new(source)))
        }
        None => None,
    };
    println!("listening {}", listener.local_addr()?);
    let stats = async {
        if let Some((tcp, source)) = stats {
            atunnel_process::admin::serve_app(
                tcp,
                args.admin.limits(),
                crate::stats::GatewayAdmin::new(source),
                cancel.clone(),
            )
            .await;
        }
    };
    let guard = async {
        if let Some(guard) = overload {
            guard.run(cancel.clone()).await;
        }
    };
    tokio::join!(gateway.serve(listener, cancel.clone()), stats, guard);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ForwardArgs;

    #[test]
    fn the_flags_defaults_are_the_librarys() {
        let argv = ["atunnel-gateway", "--cert=c", "--key=k", "--actor-ca=a"];
        let args = ForwardArgs::try_parse_from(argv).expect("flags parse");
        assert_eq!(args.gateway.alpn, crate::DEFAULT_ALPN.map(String::from));
        assert_eq!(
            args.gateway.max_concurrent_streams,
            atunnel_connect::limits::MAX_CONCURRENT_STREAMS
        );
        assert_eq!(args.gateway.socket.options(), Default::default());
        let library = crate::GatewayConfig::new(
            Vec::new(),
            rustls::pki_types::PrivateKeyDer::Pkcs8(Vec::new().into()),
            Vec::new(),
        );
        assert_eq!(args.gateway.stream_window, library.stream_window);
        assert_eq!(args.gateway.connection_window, library.connection_window);
        assert_eq!(args.gateway.max_frame_size, library.max_frame_size);
        assert_eq!(
            args.gateway.tls_handshake_timeout.0,
            library.handshake_timeout
        );
        assert_eq!(args.gateway.pre_auth.limits(), library.pre_auth);
        assert_eq!(args.gateway.h2_floods.limits(), library.h2_floods);
        assert_eq!(
            args.dial_timeout.0,
            atunnel_connect::limits::DESTINATION_DIAL_TIMEOUT
        );
        assert!(args.allow.is_empty(), "forwarding is default deny");
        assert!(args.deny.is_empty() && args.skip_default_deny.is_empty());
        assert_eq!(
            args.policy_file_poll_interval.0,
            super::DEFAULT_POLICY_FILE_POLL
        );
        let policy = args.policy().expect("policy");
        assert!(
            policy.check("8.8.8.8:443".parse().expect("addr")).is_err(),
            "no allow rule, no egress"
        );
        let rules = [
            "atunnel-gateway",
            "--cert=c",
            "--key=k",
            "--actor-ca=a",
            "--allow=0.0.0.0/0,[::/0]:443",
            "--deny=10.0.0.0/8:1-1024",
            "--skip-default-deny=loopback",
        ];
        let policy = ForwardArgs::try_parse_from(rules)
            .expect("flags parse")
            .policy()
            .expect("policy");
        let check = |d: &str| policy.check(d.parse().expect("addr"));
        assert!(check("10.0.0.1:2000").is_ok());
        assert!(check("10.0.0.1:443").is_err());
        assert!(check("127.0.0.1:80").is_ok(), "loopback skipped");
        assert!(check("169.254.169.254:80").is_err());
        assert!(check("0.0.0.0:443").is_err(), "unspecified");
        assert!(check("[2001:db8::1]:80").is_err());
        assert_eq!(args.gateway.stats, None, "/stats is off unless asked for");
        let alpn = [
            "atunnel-gateway",
            "--cert=c",
            "--key=k",
            "--actor-ca=a",
            "--alpn=http/1.1",
        ];
        let args = ForwardArgs::try_parse_from(alpn).expect("flags parse");
        assert_eq!(args.gateway.alpn, ["http/1.1"]);
    }
}
