//! New connections to the gateway, made when the pool has no room: TCP,
//! mutual TLS with the actor's certificate, and on h2 the HTTP/2
//! handshake and the task that drives the connection while it is pooled.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use atunnel_identity::credential::ActorCredential;
use atunnel_tls::client::ClientTls;

use crate::flood::{FloodGuard, Role};
use crate::limits::{
    INITIAL_MAX_SEND_STREAMS, MAX_CONCURRENT_RESET_STREAMS, MAX_LOCAL_ERROR_RESET_STREAMS,
    MAX_PENDING_ACCEPT_RESET_STREAMS, POOL_CLOSE_WAIT, TUNNEL_MAX_HEADER_LIST, TUNNEL_MAX_SEND_BUF,
};

use super::config::GatewayClientConfig;
use super::pool::{ConnUse, H2Conn, IdleRetirement, Pooled, StreamSlot};
use super::{GatewayClient, OpenError};

pub(super) enum Dialed {
    /// A connection and the stream slot claimed on it; `true` if it came
    /// from the pool.
    H2(Arc<H2Conn>, StreamSlot, bool),
    H1(Box<ClientTls>),
}

/// The rustls config of one dial. Made per dial rather than kept: it is
/// some 700 B with its verifier, every prepared actor would hold one, and
/// dials are rare (HTTP/2 pools them) and cost a handshake anyway.
pub(super) fn tls_config(
    cfg: &GatewayClientConfig,
    credential: &Arc<ActorCredential>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut tls = rustls::ClientConfig::builder_with_provider(atunnel_tls::provider::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(cfg.roots.clone())
        .with_client_cert_resolver(credential.clone());
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // A pooled connection's expiry must be that of the certificate it
    // actually authenticated with: a resumed session would carry the
    // previous certificate's identity past a renewal. HTTP/2 pools its
    // connections, so full handshakes are rare.
    tls.resumption = rustls::client::Resumption::disabled();
    Ok(tls)
}

impl GatewayClient {
    pub(super) async fn pooled_or_dial(&self) -> Result<Dialed, OpenError> {
        loop {
            let mut settling = match self.pooled() {
                Pooled::Slot(conn, slot) => return Ok(Dialed::H2(conn, slot, true)),
                Pooled::Settling(settling) => settling,
                Pooled::Full if self.gateway_is_h1.load(Ordering::Relaxed) => {
                    return self.dial(None).await;
                }
                Pooled::Full => {
                    let guard = self.dial_lock.lock().await;
                    match self.pooled() {
                        Pooled::Slot(conn, slot) => return Ok(Dialed::H2(conn, slot, true)),
                        Pooled::Settling(settling) => settling,
                        Pooled::Full => return self.dial(Some(guard)).await,
                    }
                }
            };
            // A burst waits the one round trip for a fresh connection's
            // limit rather than dialling a connection each. An error means
            // the connection ended first: look again.
            let _ = settling.wait_for(|settled| *settled).await;
        }
    }

    /// Dials a connection; an h2 one joins the pool with a slot claimed for
    /// the caller. `_serialised` is held until then.
    async fn dial(
        &self,
        _serialised: Option<tokio::sync::MutexGuard<'_, ()>>,
    ) -> Result<Dialed, OpenError> {
        let tls = self.dial_tls().await?;
        if tls.alpn_protocol() != Some(b"h2") {
            self.gateway_is_h1.store(true, Ordering::Relaxed);
            return Ok(Dialed::H1(Box::new(tls)));
        }
        self.gateway_is_h1.store(false, Ordering::Relaxed);
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(self.cfg.stream_window)
            .initial_connection_window_size(self.cfg.connection_window)
            .max_frame_size(self.cfg.max_frame_size)
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .max_header_list_size(TUNNEL_MAX_HEADER_LIST)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
            .max_concurrent_reset_streams(MAX_CONCURRENT_RESET_STREAMS)
            .max_send_buffer_size(TUNNEL_MAX_SEND_BUF)
            // We never accept pushed streams.
            .enable_push(false)
            .handshake::<_, Bytes>(FloodGuard::new(tls, Role::Client, self.pool.floods.clone()))
            .await
            .map_err(|e| self.handshake_error(e))?;
        let use_ = Arc::new(ConnUse::default());
        let (settle, settled) = watch::channel(false);
        let mut ping_pong = connection
            .ping_pong()
            .expect("a new connection's ping handle, taken once");
        let (ping_every, ping_within) = (self.cfg.ping_interval, self.cfg.ping_timeout);
        let idle = IdleRetirement {
            use_: use_.clone(),
            pool: Arc::downgrade(&self.pool),
            after: self.cfg.idle_timeout,
        };
        self.connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = settled_by_ping(&mut ping_pong) => {
                    settle.send_replace(true);
                    tokio::select! {
                        ended = connection.as_mut() => ended,
                        // Its peer is gone (a node vanished, a NAT entry
                        // expired): out of the pool at once, and the socket
                        // closed, ending its tunnels.
                        () = ping_missed(&mut ping_pong, ping_every, ping_within) => {
                            idle.retire_dead();
                            tracing::debug!("gateway HTTP/2 connection missed a ping; retired");
                            Ok(())
                        }
                        // Out of the pool, the connection's last handle is
                        // gone: h2 sends GOAWAY and ends it.
                        () = idle.retire() => {
                            tokio::time::timeout(POOL_CLOSE_WAIT, connection.as_mut())
                                .await
                                .unwrap_or(Ok(()))
                        }
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "gateway HTTP/2 connection ended");
            }
            idle.use_.dead.store(true, Ordering::Release);
        });
        let conn = Arc::new(H2Conn {
            send,
            use_,
            settled,
            cert_not_after: self.credential.expires_at(),
        });
        let slot = conn.claim();
        self.pool
            .conns
            .lock()
            .expect("pool lock poisoned")
            .push(conn.clone());
        Ok(Dialed::H2(conn, slot, false))
    }

    async fn dial_tls(&self) -> Result<ClientTls, OpenError> {
        let addr = self.cfg.address;
        let tcp = self
            .cfg
            .socket
            .connect(addr, self.cfg.open_timeout)
            .await
            .map_err(|source| OpenError::GatewayUnreachable { addr, source })?;
        let tls = tls_config(&self.cfg, &self.credential).map_err(|e| self.handshake_error(e))?;
        atunnel_tls::client::connect(tls, self.cfg.server_name.clone(), tcp)
            .await
            .map_err(|e| self.handshake_error(e))
    }
}

/// Resolves once the gateway's SETTINGS have been applied, or the connection
/// ended. The SETTINGS are the gateway's first frame and h2 applies them
/// before reading another, so the answer to a PING sent now comes after.
async fn settled_by_ping(ping_pong: &mut h2::PingPong) {
    let _ = ping_pong.ping(h2::Ping::opaque()).await;
}

/// Pings every `every` and returns when one is not answered within
/// `within` (or the connection can no longer ping). Never, if `every` is
/// zero.
async fn ping_missed(ping_pong: &mut h2::PingPong, every: Duration, within: Duration) {
    if every.is_zero() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(every).await;
        match tokio::time::timeout(within, ping_pong.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            _ => return,
        }
    }
}
