//! The peers `run --compare peers` measures in atunnel's place: nginx and
//! HAProxy (Debian packages), each as a router-facing HTTPS ingress doing
//! atunnel's job: mutual TLS with the worker's serving certificate, clients
//! checked against the pod CA (the router's), ALPN h2 and http/1.1, routing
//! by `ate-target-actor` to that actor's HTTP/1.1 server over pooled
//! keep-alive connections, `421` with `X-Ate-Assignment-Stale: true` for an
//! actor it does not know. One worker process (nginx) or thread (HAProxy),
//! as atunnel gets one CPU.
//!
//! This module writes their configuration and finds their programs; the
//! worker starts them in atunnel's cgroup (`worker/`).
//!
//! The path to the actors: HAProxy enters the sandboxes as atunnel does
//! (`namespace <sandbox>-at` on each server line, so it dials the actor at
//! 169.254.17.2 across the sandbox's veth and nftables rules, from the side
//! atunnel dials from); nginx cannot enter a namespace and reaches the same
//! actors' program on loopback ([`Peer::reaches_sandboxes`]).
//!
//! HAProxy also does atunnel's egress byte work as a TCP -> TLS relay
//! ([`EgressRelay`]): a `mode tcp` frontend in each sandbox's gateway
//! namespace on the port the sandbox's redirect delivers to, relaying over
//! TLS to the sink's TLS services (`atunnel_support::sink_tls`). It does
//! no HTTP/2 framing, and makes a TLS handshake per connection where
//! atunnel opens a stream on a kept connection.
//!
//! What they do not do as atunnel does: they check that the router's
//! certificate chains to the pod CA, not its SPIFFE ID (neither reads a URI
//! SAN without scripting), and nginx answers a client without a certificate
//! with `400` after the handshake instead of failing it.

mod config;

use config::*;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What runs in atunnel's place (atunnel itself by default).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Contender {
    #[default]
    Atunnel,
    Nginx,
    Haproxy,
}

impl Contender {
    /// Every contender, in the order a comparison runs them.
    pub const ALL: [Contender; 3] = [Contender::Atunnel, Contender::Nginx, Contender::Haproxy];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Atunnel => "atunnel",
            Contender::Nginx => "nginx",
            Contender::Haproxy => "haproxy",
        }
    }

    /// Whether it relays the sandboxes' egress bytes (HAProxy as a TCP ->
    /// TLS relay, [`EgressRelay`]; IPv4 only, as HAProxy reads the original
    /// destination of IPv4 sockets only).
    pub fn relays_egress(self) -> bool {
        matches!(self, Contender::Atunnel | Contender::Haproxy)
    }

    /// Whether it relays IPv6 egress too.
    pub fn relays_egress_ipv6(self) -> bool {
        self == Contender::Atunnel
    }

    /// The peer, unless it is atunnel.
    pub fn peer(self) -> Option<Peer> {
        match self {
            Contender::Atunnel => None,
            Contender::Nginx => Some(Peer::Nginx),
            Contender::Haproxy => Some(Peer::Haproxy),
        }
    }
}

impl std::fmt::Display for Contender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A proxy that can do atunnel's ingress HTTPS job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    Nginx,
    Haproxy,
}

/// Streams one router connection may carry at once: atunnel's own
/// (`PROXY_ROUTER_MAX_CONCURRENT_STREAMS`), so the load sees the same limit.
const MAX_CONCURRENT_STREAMS: u32 = atunnel_connect::limits::PROXY_ROUTER_MAX_CONCURRENT_STREAMS;

/// Idle keep-alive connections kept per actor, and for how long: atunnel's
/// ingress pool defaults (128 per actor, 90 s).
const UPSTREAM_IDLE_PER_ACTOR: usize = 128;
const UPSTREAM_IDLE_SECS: u64 = 90;

/// How long an idle router connection is kept: an hour, so that neither
/// peer closes the idle connections ingress-idle holds (atunnel keeps them
/// until the router closes them).
const CLIENT_IDLE_SECS: u64 = 3600;

/// Connections each peer takes at once (nginx's `worker_connections`,
/// HAProxy's `maxconn`), router and actor sides together: far above the
/// bench's largest idle case (1,000 router connections), and with two
/// descriptors each within a 20,000 descriptor limit (this machine's hard
/// limit; HAProxy refuses to start when it cannot raise its own to fit).
const MAX_CONNS: u32 = 9000;

/// The egress relay's sandbox-side socket buffers (`SO_RCVBUF`,
/// `SO_SNDBUF`): atunnel's on its sandbox-side sockets.
const SANDBOX_BUFFER: usize = atunnel_core::sockopt::DEFAULT_SANDBOX_BUFFER;

/// Where a peer listens, with which credentials, and where each actor is.
#[derive(Clone, Debug)]
pub struct PeerSetup {
    /// The router-facing listener (atunnel's ingress HTTPS address).
    pub listen: SocketAddr,
    /// The worker's serving certificate and key in one PEM.
    pub cert_bundle: PathBuf,
    /// The CA a client certificate must chain to (the pod CA, the router's).
    pub client_ca: PathBuf,
    /// Each actor's HTTP/1.1 server, in order.
    pub backends: Vec<Backend>,
    /// The egress relay (HAProxy only); none: ingress only.
    pub egress: Option<EgressRelay>,
    /// The folder the configuration is written to (and nginx's pid and
    /// temporary files go).
    pub dir: PathBuf,
}

/// One actor's HTTP/1.1 server, as a peer reaches it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backend {
    /// Its `ate-target-actor` value (`bench/actor-0`).
    pub actor: String,
    pub addr: SocketAddr,
    /// The namespace the peer dials it from: the sandbox's gateway side
    /// (`<runtime>-at`, where atunnel dials from); none, the peer's own.
    #[serde(default)]
    pub netns: Option<String>,
}

/// HAProxy as a TCP -> TLS relay for the actors' egress: it listens in
/// each sandbox's gateway namespace where the redirect delivers the
/// actor's TCP (atunnel's egress port), reads the original destination
/// (SO_ORIGINAL_DST) and relays over TLS to `far_end` at the original port
/// plus `port_offset`.
#[derive(Clone, Debug)]
pub struct EgressRelay {
    /// The port the sandboxes' redirect sends the actors' TCP to.
    pub port: u16,
    /// Each sandbox's gateway-side namespace (`<runtime>-at`).
    pub netns: Vec<String>,
    /// The TLS far end (the sink's address).
    pub far_end: IpAddr,
    /// Added to the original destination's port (`sink_tls`'s offset).
    pub port_offset: u16,
    /// The name the far end's certificate must carry, also sent as SNI.
    pub server_name: String,
    /// The CA the far end's certificate must chain to.
    pub ca: PathBuf,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Nginx => "nginx",
            Peer::Haproxy => "haproxy",
        }
    }

    /// The configuration's file name in the peers folder.
    pub fn config_file(self) -> &'static str {
        match self {
            Peer::Nginx => "nginx.conf",
            Peer::Haproxy => "haproxy.cfg",
        }
    }

    /// Whether the peer can enter a sandbox's namespaces (HAProxy's
    /// `namespace` on bind and server lines); nginx has no such setting.
    pub fn reaches_sandboxes(self) -> bool {
        self == Peer::Haproxy
    }

    /// How the peer reaches the actors' program, for the report.
    pub fn path(self) -> &'static str {
        match self {
            Peer::Haproxy => {
                "across a veth into each actor's sandbox, as atunnel (`namespace <sandbox>-at` on its server lines: through the sandbox's nftables rules)"
            }
            Peer::Nginx => {
                "on loopback in the worker's namespace (nginx cannot enter a namespace: no veth, no nftables)"
            }
        }
    }

    /// The program, from `PATH` or `/usr/sbin` (where Debian puts both,
    /// and which a non-root `PATH` may lack).
    pub fn find(self) -> Option<PathBuf> {
        self.find_in(&search_path())
    }

    /// The program in the first of `dirs` that has it.
    fn find_in(self, dirs: &[PathBuf]) -> Option<PathBuf> {
        dirs.iter()
            .map(|d| d.join(self.name()))
            .find(|p| is_executable(p))
    }

    /// The configuration for `setup`.
    pub fn config(self, setup: &PeerSetup) -> String {
        match self {
            Peer::Nginx => nginx_conf(setup),
            Peer::Haproxy => haproxy_cfg(setup),
        }
    }

    /// Writes the configuration into `setup.dir`; its path.
    pub fn write_config(self, setup: &PeerSetup) -> std::io::Result<PathBuf> {
        let enters = setup.egress.is_some() || setup.backends.iter().any(|b| b.netns.is_some());
        if enters && !self.reaches_sandboxes() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} cannot enter a network namespace", self.name()),
            ));
        }
        std::fs::create_dir_all(&setup.dir)?;
        if self == Peer::Nginx {
            // Its temporary files (unused by GET answers, created at start).
            std::fs::create_dir_all(setup.dir.join("nginx-temp"))?;
        }
        let path = setup.dir.join(self.config_file());
        std::fs::write(&path, self.config(setup))?;
        // Absolute: nginx reads a relative `-c` from its own prefix
        // (/usr/share/nginx), not from where it was started, and the run
        // folder is relative by default (`runs/<timestamp>`).
        std::path::absolute(&path)
    }

    /// The arguments that run `binary` in the foreground with `config`.
    pub fn command(self, binary: &Path, config: &Path) -> Vec<String> {
        let (b, c) = (binary.display().to_string(), config.display().to_string());
        match self {
            // `-e stderr`: startup errors go to stderr before the
            // configuration's error_log is read.
            Peer::Nginx => vec![b, "-e".into(), "stderr".into(), "-c".into(), c],
            // `-db`: foreground, no daemon.
            Peer::Haproxy => vec![b, "-db".into(), "-f".into(), c],
        }
    }
}

/// `PATH`, then `/usr/sbin`.
fn search_path() -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .collect()
}

/// Both peers' programs, or what to install.
pub fn require_installed() -> Result<Vec<(Peer, PathBuf)>, String> {
    require_installed_in(&search_path())
}

fn require_installed_in(dirs: &[PathBuf]) -> Result<Vec<(Peer, PathBuf)>, String> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for peer in [Peer::Nginx, Peer::Haproxy] {
        match peer.find_in(dirs) {
            Some(p) => found.push((peer, p)),
            None => missing.push(peer.name()),
        }
    }
    if missing.is_empty() {
        Ok(found)
    } else {
        Err(format!(
            "--compare peers runs nginx and HAProxy in atunnel's place; not installed: {} \
             (Debian: apt-get install nginx haproxy)",
            missing.join(", ")
        ))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(actors: usize) -> PeerSetup {
        PeerSetup {
            listen: "198.18.1.1:443".parse().expect("address"),
            cert_bundle: "/run/x/pki/worker-credential-bundle.pem".into(),
            client_ca: "/run/x/pki/pod-ca.pem".into(),
            backends: (0..actors)
                .map(|i| Backend {
                    actor: format!("bench/actor-{i}"),
                    addr: SocketAddr::from(([127, 0, 0, 1], 18000 + i as u16)),
                    netns: None,
                })
                .collect(),
            egress: None,
            dir: "/run/x/peers".into(),
        }
    }

    /// As the worker sets HAProxy up: each actor in its sandbox, reached
    /// from the sandbox's gateway side, and the egress relay.
    fn sandboxed(actors: usize) -> PeerSetup {
        let at = |i| format!("atb1-s-uid-{i}-at");
        PeerSetup {
            backends: (0..actors)
                .map(|i| Backend {
                    actor: format!("bench/actor-{i}"),
                    addr: "169.254.17.2:80".parse().expect("address"),
                    netns: Some(at(i)),
                })
                .collect(),
            egress: Some(EgressRelay {
                port: 15001,
                netns: (0..actors).map(at).collect(),
                far_end: "198.18.0.2".parse().expect("address"),
                port_offset: 7000,
                server_name: "gateway.bench".into(),
                ca: "/run/x/pki/gateway-ca.pem".into(),
            }),
            ..setup(actors)
        }
    }

    /// The lines of `config` that mention `needle`, trimmed.
    fn lines_with<'a>(config: &'a str, needle: &str) -> Vec<&'a str> {
        config
            .lines()
            .map(str::trim)
            .filter(|l| l.contains(needle))
            .collect()
    }

    #[test]
    fn nginx_routes_every_actor_to_its_own_keepalive_upstream() {
        let c = Peer::Nginx.config(&setup(16));
        for i in 0..16 {
            assert_eq!(
                lines_with(&c, &format!("\"bench/actor-{i}\" ")),
                [format!("\"bench/actor-{i}\" actor_{i};")],
                "{c}"
            );
            let upstream = c
                .split(&format!("upstream actor_{i} {{"))
                .nth(1)
                .and_then(|rest| rest.split('}').next())
                .unwrap_or_else(|| panic!("no upstream actor_{i} in\n{c}"));
            assert!(
                upstream.contains(&format!("server 127.0.0.1:{};", 18000 + i))
                    && upstream.contains("keepalive 128;"),
                "{upstream}"
            );
        }
        assert_eq!(lines_with(&c, "upstream actor_").len(), 16);
        // Unknown actors are refused as atunnel refuses them.
        assert!(
            c.contains("default \"\";") && c.contains("return 421;"),
            "{c}"
        );
        assert!(c.contains("X-Ate-Assignment-Stale true always"), "{c}");
        // Upstream keep-alive needs HTTP/1.1 without "Connection: close".
        assert!(
            c.contains("proxy_http_version 1.1;")
                && c.contains("proxy_set_header Connection \"\";")
        );
    }

    #[test]
    fn nginx_requires_a_client_certificate_and_runs_one_worker() {
        let c = Peer::Nginx.config(&setup(2));
        assert_eq!(lines_with(&c, "worker_processes"), ["worker_processes 1;"]);
        assert_eq!(lines_with(&c, "daemon"), ["daemon off;"]);
        assert_eq!(
            lines_with(&c, "ssl_verify_client"),
            ["ssl_verify_client on;"]
        );
        assert_eq!(
            lines_with(&c, "ssl_client_certificate"),
            ["ssl_client_certificate /run/x/pki/pod-ca.pem;"]
        );
        assert_eq!(
            lines_with(&c, "listen "),
            ["listen 198.18.1.1:443 ssl http2 backlog=4096;"]
        );
        assert_eq!(lines_with(&c, "access_log"), ["access_log off;"]);
        assert!(c.contains("pid /run/x/peers/nginx.pid;"), "{c}");
        // Braces balance (nginx refuses the file otherwise).
        assert_eq!(c.matches('{').count(), c.matches('}').count(), "{c}");
    }

    #[test]
    fn haproxy_routes_every_actor_to_its_own_backend() {
        let c = Peer::Haproxy.config(&setup(16));
        for i in 0..16 {
            assert_eq!(
                lines_with(&c, &format!("acl actor_{i} ")),
                [format!(
                    "acl actor_{i} req.hdr(ate-target-actor) -m str bench/actor-{i}"
                )]
            );
            assert_eq!(
                lines_with(&c, &format!("use_backend actor_{i} ")),
                [format!("use_backend actor_{i} if actor_{i}")]
            );
            assert_eq!(
                lines_with(&c, &format!("server actor_{i} ")),
                [format!(
                    "server actor_{i} 127.0.0.1:{} pool-max-conn 128 pool-purge-delay 90s",
                    18000 + i
                )]
            );
        }
        assert_eq!(lines_with(&c, "backend actor_").len(), 16 * 2);
        // Unknown actors are refused as atunnel refuses them.
        assert_eq!(lines_with(&c, "default_backend"), ["default_backend stale"]);
        assert!(
            c.contains("http-request return status 421 hdr X-Ate-Assignment-Stale true"),
            "{c}"
        );
        assert_eq!(lines_with(&c, "http-reuse"), ["http-reuse always"]);
    }

    #[test]
    fn haproxy_reaches_each_actor_from_its_sandboxs_gateway_side() {
        let c = Peer::Haproxy.config(&sandboxed(16));
        for i in 0..16 {
            assert_eq!(
                lines_with(&c, &format!("server actor_{i} ")),
                [format!(
                    "server actor_{i} 169.254.17.2:80 namespace atb1-s-uid-{i}-at \
                     pool-max-conn 128 pool-purge-delay 90s"
                )]
            );
            // Routing by ate-target-actor is unchanged.
            assert_eq!(
                lines_with(&c, &format!("use_backend actor_{i} ")),
                [format!("use_backend actor_{i} if actor_{i}")]
            );
        }
        // Without sandboxes, no namespace anywhere.
        assert!(!Peer::Haproxy.config(&setup(16)).contains("namespace"));
    }

    #[test]
    fn haproxy_relays_each_sandboxs_egress_over_tls_to_the_far_end() {
        let c = Peer::Haproxy.config(&sandboxed(3));
        let egress = c
            .split("defaults egress")
            .nth(1)
            .unwrap_or_else(|| panic!("no egress defaults in\n{c}"));
        assert_eq!(lines_with(egress, "mode "), ["mode tcp"]);
        for i in 0..3 {
            let frontend = egress
                .split(&format!("frontend egress_actor_{i}\n"))
                .nth(1)
                .unwrap_or_else(|| panic!("no frontend egress_actor_{i} in\n{c}"));
            let lines: Vec<&str> = frontend.lines().take(2).map(str::trim).collect();
            assert_eq!(
                lines,
                [
                    format!("bind 0.0.0.0:15001 namespace atb1-s-uid-{i}-at"),
                    "default_backend egress_far_end".into()
                ]
            );
        }
        assert_eq!(lines_with(egress, "frontend egress_actor_").len(), 3);
        assert_eq!(
            lines_with(egress, "server far_end "),
            ["server far_end 198.18.0.2:+7000 ssl verify required \
                 ca-file /run/x/pki/gateway-ca.pem sni str(gateway.bench) verifyhost gateway.bench"]
        );
        // The ingress side stays HTTP: its frontend and backends come
        // before the egress defaults.
        let ingress = c.split("defaults egress").next().unwrap_or_default();
        assert!(ingress.contains("frontend ingress"), "{c}");
        assert_eq!(lines_with(ingress, "backend actor_").len(), 3 * 2);
    }

    #[test]
    fn haproxy_fixes_its_client_buffers_as_atunnels_sandbox_side_only_when_it_relays() {
        let relay = Peer::Haproxy.config(&sandboxed(2));
        let global = relay.split("defaults").next().unwrap_or_default();
        assert_eq!(
            lines_with(global, "tune.")[2..],
            ["tune.rcvbuf.client 65536", "tune.sndbuf.client 65536"],
            "{relay}"
        );
        // Ingress alone: the configuration `--compare peers` has always
        // written, every socket autotuned.
        let ingress = Peer::Haproxy.config(&setup(2));
        assert_eq!(
            lines_with(&ingress, "buf."),
            Vec::<&str>::new(),
            "{ingress}"
        );
    }

    #[test]
    fn nginx_refuses_a_setup_that_enters_a_sandbox() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = PeerSetup {
            dir: dir.path().join("peers"),
            ..sandboxed(1)
        };
        let e = Peer::Nginx
            .write_config(&s)
            .expect_err("nginx has no namespaces");
        assert!(e.to_string().contains("nginx cannot enter"), "{e}");
        assert!(Peer::Haproxy.write_config(&s).is_ok());
        assert!(Peer::Haproxy.reaches_sandboxes() && !Peer::Nginx.reaches_sandboxes());
    }

    #[test]
    fn haproxy_requires_a_client_certificate_and_runs_one_thread() {
        let c = Peer::Haproxy.config(&setup(2));
        assert_eq!(lines_with(&c, "nbthread"), ["nbthread 1"]);
        assert_eq!(
            lines_with(&c, "bind "),
            [
                "bind 198.18.1.1:443 ssl crt /run/x/pki/worker-credential-bundle.pem \
              ca-file /run/x/pki/pod-ca.pem verify required alpn h2,http/1.1 no-tls-tickets"
            ]
        );
        assert_eq!(
            lines_with(&c, "log"),
            [
                "# No log line per request (atunnel writes none either).",
                "no log"
            ]
        );
    }

    #[test]
    fn the_commands_run_the_written_file_in_the_foreground() {
        let (bin, cfg) = (Path::new("/usr/sbin/x"), Path::new("/r/peers/c"));
        assert_eq!(
            Peer::Nginx.command(bin, cfg),
            ["/usr/sbin/x", "-e", "stderr", "-c", "/r/peers/c"]
        );
        assert_eq!(
            Peer::Haproxy.command(bin, cfg),
            ["/usr/sbin/x", "-db", "-f", "/r/peers/c"]
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let s = PeerSetup {
            dir: dir.path().join("peers"),
            ..setup(1)
        };
        for peer in [Peer::Nginx, Peer::Haproxy] {
            let path = peer.write_config(&s).expect("written");
            assert_eq!(path, s.dir.join(peer.config_file()));
            assert_eq!(
                std::fs::read_to_string(&path).expect("read"),
                peer.config(&s)
            );
        }
    }

    #[test]
    fn a_missing_peer_is_named_with_the_packages_to_install() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let dirs = [dir.path().to_path_buf()];
        let error = require_installed_in(&dirs).expect_err("neither is there");
        assert!(error.contains("not installed: nginx, haproxy"), "{error}");
        assert!(error.contains("apt-get install nginx haproxy"), "{error}");
        // A file that is not executable is not the program.
        let nginx = dir.path().join("nginx");
        std::fs::write(&nginx, "#!/bin/sh\n").expect("write");
        let error = require_installed_in(&dirs).expect_err("nginx is not executable");
        assert!(error.contains("not installed: nginx, haproxy"), "{error}");
        std::fs::set_permissions(&nginx, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let error = require_installed_in(&dirs).expect_err("haproxy is not there");
        assert!(error.contains("not installed: haproxy ("), "{error}");
        let haproxy = dir.path().join("haproxy");
        std::fs::write(&haproxy, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&haproxy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(
            require_installed_in(&dirs).expect("both there"),
            [(Peer::Nginx, nginx), (Peer::Haproxy, haproxy)]
        );
    }

    #[test]
    fn contenders_are_named_in_requests_and_atunnel_is_the_default() {
        assert_eq!(Contender::default(), Contender::Atunnel);
        for c in Contender::ALL {
            let json = serde_json::to_string(&c).expect("serialises");
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<Contender>(&json).expect("parses"), c);
        }
        assert_eq!(Contender::Atunnel.peer(), None);
        assert_eq!(Contender::Haproxy.peer(), Some(Peer::Haproxy));
    }
}
