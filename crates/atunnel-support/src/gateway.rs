//! Gateways on loopback (with the sink or forwarding), actors' gateway
//! clients, and egress listeners for them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::egress::{ActorEgress, Destination, Egress, EgressConfig};
use atunnel_connect::{GatewayClient, GatewayClientConfig, GatewayTunnel};
use atunnel_core::BufferPool;
use atunnel_core::sockopt::SocketOptions;
use atunnel_gateway::{ConnectSeen, FarEnd, GatewayConfig};
use atunnel_identity::identity::ActorRef;
use rustls::pki_types::ServerName;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pki::*;

/// A destination a sink gateway answers by echoing (port 7); the address
/// itself is only named, never dialled.
pub const SINK_ECHO: &str = "192.0.2.10:7";

pub struct RunningGateway {
    pub addr: SocketAddr,
    pub seen: mpsc::UnboundedReceiver<ConnectSeen>,
    pub cancel: CancellationToken,
    /// The CONNECT listener's pre-authentication figures.
    pub pre_auth: Box<dyn Fn() -> atunnel_tls::PreAuthStats + Send + Sync>,
    /// HTTP/2 connections ended for a control-frame flood.
    pub h2_floods: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts a gateway on loopback. `alpn` of `["http/1.1"]` makes it an
/// HTTP/1.1-only gateway like the Envoy one.
pub async fn gateway(
    pki: &Pki,
    far: impl FarEnd,
    tune: impl FnOnce(&mut GatewayConfig),
) -> RunningGateway {
    let (tx, seen) = mpsc::unbounded_channel();
    let mut cfg = GatewayConfig::new(
        pki.gateway_cert.chain.clone(),
        pki.gateway_cert.key(),
        vec![pki.actor_ca.cert_der()],
    );
    cfg.observer = Some(tx);
    tune(&mut cfg);
    let gw = atunnel_gateway::new(cfg, far, BufferPool::default()).expect("gateway");
    let pre_auth = {
        let gw = gw.clone();
        Box::new(move || gw.pre_auth())
    };
    let h2_floods = {
        let gw = gw.clone();
        Box::new(move || gw.h2_floods())
    };
    let cancel = CancellationToken::new();
    let (addr, _task) =
        atunnel_gateway::spawn(gw, "127.0.0.1:0".parse().expect("addr"), cancel.clone())
            .await
            .expect("gateway bind");
    RunningGateway {
        addr,
        seen,
        cancel,
        pre_auth,
        h2_floods,
    }
}

pub fn h1_only(cfg: &mut GatewayConfig) {
    cfg.alpn = vec![b"http/1.1".to_vec()];
}

/// The production far end, allowed to reach loopback destinations (the
/// default deny list's loopback entry lifted).
pub fn forward_loopback() -> atunnel_gateway::Forward {
    use atunnel_gateway::policy::{DefaultDeny, PolicySpec};
    let spec = PolicySpec {
        skip_default: vec![DefaultDeny::Loopback],
        ..atunnel_gateway::policy::allowing(&["127.0.0.0/8"])
    };
    forward_with(spec)
}

/// The production far end with the policy of `spec`.
pub fn forward_with(spec: atunnel_gateway::policy::PolicySpec) -> atunnel_gateway::Forward {
    atunnel_gateway::Forward {
        policy: Arc::new(atunnel_gateway::policy::PolicyHandle::new(spec, None).expect("policy")),
        socket: SocketOptions::default(),
        bounds: Default::default(),
        dial_timeout: atunnel_connect::limits::DESTINATION_DIAL_TIMEOUT,
    }
}

pub fn client_config(pki: &Pki, gateway: SocketAddr) -> GatewayClientConfig {
    GatewayClientConfig::new(
        gateway,
        ServerName::try_from(GATEWAY_NAME).expect("name"),
        pki.gateway_roots(),
    )
}

pub fn actor(name: &str) -> ActorRef {
    ActorRef::new("team-a", name, format!("uid-{name}")).expect("actor")
}

pub async fn prepare(
    pki: &Pki,
    gateway: SocketAddr,
    actor: ActorRef,
    source: Arc<TestSource>,
) -> ActorEgress {
    let clock = source.clock.clone();
    ActorEgress::prepare(actor, client_config(pki, gateway), source, clock)
        .await
        .expect("prepare egress")
}

/// An egress listener on loopback for `uid`, sending everything to `dest`.
pub async fn listen(
    egress: &Arc<Egress>,
    uid: &str,
    dest: SocketAddr,
    cancel: &CancellationToken,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    egress.serve_listener(uid, listener, Destination::Fixed(dest), cancel.clone());
    addr
}

/// An egress listener for `a` sending to the sink's echo ([`SINK_ECHO`]),
/// and `a` activated through `gateway` with certificates from a new
/// source: the listener's address, and the source (to activate `a` again).
pub async fn listen_activated(
    pki: &Pki,
    egress: &Arc<Egress>,
    a: &ActorRef,
    gateway: SocketAddr,
    cancel: &CancellationToken,
) -> (SocketAddr, Arc<TestSource>) {
    let addr = listen(egress, &a.uid, SINK_ECHO.parse().expect("addr"), cancel).await;
    let source = Arc::new(TestSource::new(
        pki.actor_ca.clone(),
        atunnel_identity::clock::Clock::new(),
    ));
    egress
        .activate(
            &a.uid,
            prepare(pki, gateway, a.clone(), source.clone()).await,
        )
        .expect("activate");
    (addr, source)
}

pub fn egress() -> Arc<Egress> {
    egress_config(EgressConfig::default())
}

pub fn egress_config(cfg: EgressConfig) -> Arc<Egress> {
    Egress::new(
        EgressConfig {
            drain_timeout: Duration::from_secs(5),
            ..cfg
        },
        BufferPool::default(),
    )
}

/// `n` tunnels to `authority`, opened at once.
pub async fn open_at_once(
    client: &Arc<GatewayClient>,
    n: usize,
    authority: &str,
) -> Vec<GatewayTunnel> {
    let opens = (0..n).map(|_| client.open_authority(authority));
    futures_util::future::join_all(opens)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, opened)| opened.unwrap_or_else(|e| panic!("tunnel {i}: {e}")))
        .collect()
}

/// An egress's tunnel counters, compared as one value.
#[derive(Debug, PartialEq, Eq)]
pub struct TunnelCounts {
    /// Closed at admission with no bytes (inactive or certificate invalid).
    pub rejected: u64,
    /// Admitted as tunnels.
    pub admitted: u64,
    /// Admitted, then closed because the CONNECT failed.
    pub failed: u64,
}

pub fn tunnel_counts(egress: &Egress) -> TunnelCounts {
    let s = egress.stats();
    TunnelCounts {
        rejected: s.rejected_total,
        admitted: s.tunnels_total,
        failed: s.open_failed_total,
    }
}

/// Sends `data` through `tunnel` to a far end that echoes, half-closes, and
/// returns what came back before the echo's end.
pub async fn echoed(tunnel: &mut GatewayTunnel, data: &[u8]) -> Vec<u8> {
    use atunnel_core::Chunk;
    use atunnel_core::endpoint::{Endpoint, close_write, read_chunk, write_chunk};
    write_chunk(tunnel, Chunk::Shared(bytes::Bytes::copy_from_slice(data)))
        .await
        .expect("write");
    close_write(tunnel).await.expect("half-close");
    let pool = BufferPool::default();
    let mut back = Vec::new();
    while let Some(chunk) = read_chunk(tunnel, &pool).await.expect("read") {
        back.extend_from_slice(chunk.remaining());
        tunnel.consumed(chunk.len());
    }
    back
}

/// What a hand-made h2 gateway does with a CONNECT stream it echoes: its
/// bytes back, then its end.
pub async fn echo_h2(mut recv: h2::RecvStream, mut send: h2::SendStream<bytes::Bytes>) {
    while let Some(Ok(chunk)) = recv.data().await {
        let _ = recv.flow_control().release_capacity(chunk.len());
        if send.send_data(chunk, false).is_err() {
            return;
        }
    }
    let _ = send.send_data(bytes::Bytes::new(), true);
}
