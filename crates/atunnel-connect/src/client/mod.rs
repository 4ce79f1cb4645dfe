//! Opens egress tunnels to the gateway: HTTP/2 CONNECT streams over pooled
//! mutual-TLS connections, or one HTTP/1.1 CONNECT per TLS connection when the
//! gateway does not speak h2.
//!
//! Identity is only the client certificate: the request carries the CONNECT
//! line and, over HTTP/1.1, `Host`; nothing else.
//!
//! An open goes through the submodules in order: `pool` finds a connection
//! with room, `dial` makes one when none has, `h2` or `h1` sends the
//! CONNECT, and `tunnel` is what the relay is handed.

mod config;
mod dial;
mod h1;
mod h2;
mod pool;
mod stats;
mod tunnel;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use atunnel_identity::credential::ActorCredential;

use crate::flood::FloodCount;

use self::dial::{Dialed, tls_config};
use self::h2::H2Failure;
use self::pool::{H2Conn, Pool};

pub use self::config::GatewayClientConfig;
pub use self::pool::StreamSlot;
pub use self::stats::ClientStats;
pub use self::tunnel::GatewayTunnel;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("invalid tunnel destination {0:?}: must be an IP literal and a port 1-65535")]
    InvalidDestination(String),
    #[error("gateway {addr} unreachable: {source}")]
    GatewayUnreachable {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// TLS failed, the gateway sent an alert, or hung up before answering the
    /// CONNECT. Under TLS 1.3 a refused client certificate only shows up here,
    /// after the client's side of the handshake has finished.
    #[error("gateway {addr} handshake failed: {reason}")]
    GatewayHandshake { addr: SocketAddr, reason: String },
    #[error("gateway refused CONNECT {authority} with status {status}: {body:?}")]
    ConnectRefused {
        authority: String,
        status: u16,
        body: String,
    },
    /// The gateway reset the CONNECT stream with REFUSED_STREAM (it did not
    /// process it, usually for being at its stream limit), on the retry too.
    #[error("gateway {addr} refused the stream for CONNECT {authority} (REFUSED_STREAM), twice")]
    StreamRefused { addr: SocketAddr, authority: String },
    #[error("opening a tunnel to {authority} took longer than {after:?}")]
    Timeout { authority: String, after: Duration },
    #[error("gateway {addr} sent a malformed answer: {reason}")]
    Protocol { addr: SocketAddr, reason: String },
}

/// Parses a tunnel destination: an IP literal and a non-zero port, checked
/// before any I/O.
pub fn parse_destination(authority: &str) -> Result<SocketAddr, OpenError> {
    match authority.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Ok(addr),
        _ => Err(OpenError::InvalidDestination(authority.to_string())),
    }
}

/// `dest` as a CONNECT authority, as its `Display` writes it
/// (`192.0.2.1:443`, `[2001:db8::1]:443`), without `fmt` for IPv4: every
/// tunnel opened writes one (egress-open in `docs/design.md`).
fn authority(dest: SocketAddr) -> String {
    let mut out = Vec::with_capacity(24);
    atunnel_core::addr_text::push_socket_addr(&mut out, dest);
    // ASCII digits, dots, colons and brackets only.
    String::from_utf8(out).unwrap_or_else(|_| dest.to_string())
}

/// One actor's tunnel client: its TLS identity and its connection pool.
pub struct GatewayClient {
    cfg: GatewayClientConfig,
    /// Shared with each connection's task, which takes its connection out
    /// when it has been idle for the idle timeout.
    pool: Arc<Pool>,
    /// Serialises dials while the gateway may speak h2, so a burst of opens
    /// shares one new connection instead of racing to make one each.
    dial_lock: tokio::sync::Mutex<()>,
    gateway_is_h1: AtomicBool,
    credential: Arc<ActorCredential>,
    connections: TaskTracker,
}

impl GatewayClient {
    /// A client presenting `credential`'s current certificate, offering
    /// ALPN `h2,http/1.1`, TLS 1.2 or 1.3.
    pub fn new(
        cfg: GatewayClientConfig,
        credential: Arc<ActorCredential>,
    ) -> Result<Self, rustls::Error> {
        // Built here once to fail at preparation, not at the first dial.
        tls_config(&cfg, &credential)?;
        let pool = Arc::new(Pool {
            floods: Arc::new(FloodCount::with_limits(cfg.floods)),
            ..Pool::default()
        });
        Ok(Self {
            cfg,
            pool,
            dial_lock: tokio::sync::Mutex::new(()),
            gateway_is_h1: AtomicBool::new(false),
            credential,
            connections: TaskTracker::new(),
        })
    }

    /// Opens a tunnel to `dest`, bounded by the open timeout. If that
    /// expires while a pooled connection has not answered the CONNECT, the
    /// connection is retired as black-holed and the open tried once more on
    /// a fresh one, within another open timeout.
    pub async fn open(&self, dest: SocketAddr) -> Result<GatewayTunnel, OpenError> {
        let authority = authority(dest);
        if dest.port() == 0 {
            return Err(OpenError::InvalidDestination(authority));
        }
        let after = self.cfg.open_timeout;
        let pooled_unanswered = AtomicBool::new(false);
        let first = self.open_unbounded(&authority, &pooled_unanswered);
        match tokio::time::timeout(after, first).await {
            Ok(result) => return result,
            Err(_) if pooled_unanswered.load(Ordering::Acquire) => {}
            Err(_) => return Err(OpenError::Timeout { authority, after }),
        }
        let again = self.open_unbounded(&authority, &pooled_unanswered);
        match tokio::time::timeout(after, again).await {
            Ok(result) => result,
            Err(_) => Err(OpenError::Timeout { authority, after }),
        }
    }

    /// Opens a tunnel to an authority given as text (validated first).
    pub async fn open_authority(&self, authority: &str) -> Result<GatewayTunnel, OpenError> {
        self.open(parse_destination(authority)?).await
    }

    async fn open_unbounded(
        &self,
        authority: &str,
        pooled_unanswered: &AtomicBool,
    ) -> Result<GatewayTunnel, OpenError> {
        let mut retried = false;
        loop {
            let (conn, slot, pooled) = match self.pooled_or_dial().await? {
                Dialed::H1(tls) => return self.connect_h1(tls, authority).await,
                Dialed::H2(conn, slot, pooled) => (conn, slot, pooled),
            };
            // Cancelled while waiting for its answer (the open timeout): the
            // connection may be black-holed, so no new tunnel is sent on it.
            let unanswered = RetireIfUnanswered {
                conn: &conn,
                client: self,
                armed: true,
                pooled: pooled.then_some(pooled_unanswered),
            };
            let answered = self.connect_h2(&conn, slot, authority).await;
            unanswered.disarm();
            match answered {
                Err(H2Failure::Connection(e)) => {
                    conn.use_.dead.store(true, Ordering::Release);
                    self.forget(&conn);
                    // A pooled connection may have died quietly: one retry
                    // on a fresh one. A fresh one failing is the gateway
                    // refusing us.
                    if pooled && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(self.handshake_error(e));
                }
                // The gateway did not process the stream (RFC 9113 §8.7) and
                // the connection is fine: retry once wherever the pool finds
                // room, this connection included.
                Err(H2Failure::Refused) if !retried => retried = true,
                Err(H2Failure::Refused) => {
                    return Err(OpenError::StreamRefused {
                        addr: self.cfg.address,
                        authority: authority.to_string(),
                    });
                }
                Err(H2Failure::Tunnel(e)) => return Err(e),
                Ok(tunnel) => return Ok(tunnel),
            }
        }
    }

    fn handshake_error(&self, reason: impl std::fmt::Display) -> OpenError {
        OpenError::GatewayHandshake {
            addr: self.cfg.address,
            reason: reason.to_string(),
        }
    }

    /// Closes pooled connections and waits for their tasks.
    pub async fn close(&self) {
        self.pool.conns.lock().expect("pool lock poisoned").clear();
        self.connections.close();
        self.connections.wait().await;
    }
}

/// Retires a pooled connection whose CONNECT answer was still awaited when
/// the open was cancelled (by the open timeout, or the tunnel's end).
struct RetireIfUnanswered<'a> {
    conn: &'a Arc<H2Conn>,
    client: &'a GatewayClient,
    armed: bool,
    /// Set when it fires on a connection that came from the pool.
    pooled: Option<&'a AtomicBool>,
}

impl RetireIfUnanswered<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RetireIfUnanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.retire_dead(self.conn);
            if let Some(flag) = self.pooled {
                flag.store(true, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod authority_fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn an_authority_is_written_as_display_writes_it(
            ip in any::<[u8; 4]>(),
            ip6 in any::<[u16; 8]>(),
            port in any::<u16>(),
        ) {
            let v4 = SocketAddr::from((ip, port));
            prop_assert_eq!(authority(v4), v4.to_string());
            let v6 = SocketAddr::from((ip6, port));
            prop_assert_eq!(authority(v6), v6.to_string());
        }
    }

    #[test]
    fn the_extremes_are_written_in_full() {
        for addr in [
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.0.0.1:9",
            "1.20.255.3:10000",
        ] {
            let addr: SocketAddr = addr.parse().expect("address");
            assert_eq!(authority(addr), addr.to_string());
        }
    }
}
