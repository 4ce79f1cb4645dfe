//! Ingress CONNECT: the router opens a tunnel to a port of an actor's
//! program; atunnel dials 169.254.17.2:<port> inside the sandbox and relays,
//! with half-close, holding no buffer while the tunnel is idle.

use std::io;
use std::sync::Arc;

use atunnel_core::endpoint::Endpoint;
use atunnel_core::relay::relay_within;
use tokio::net::TcpStream;

use super::https::ASSIGNMENT_STALE;
use super::routes::{ActorRoute, Routes};
use atunnel_connect::{Answer, ConnectHandler, ConnectRequest};

pub struct IngressConnect {
    pub routes: Arc<Routes>,
}

/// An accepted tunnel: the actor's socket, under its activation.
pub struct ActorTunnel {
    actor: TcpStream,
    activation: Arc<ActorRoute>,
    _token: super::routes::InFlight,
}

const STALE: &[(&str, &str)] = &[(ASSIGNMENT_STALE, "true")];

/// The port of a CONNECT authority (`host:port`; the host is ignored: the
/// actor is always 169.254.17.2 inside its sandbox).
pub fn authority_port(authority: &str) -> Option<u16> {
    let authority: http::uri::Authority = authority.parse().ok()?;
    authority.port_u16().filter(|p| *p != 0)
}

impl ConnectHandler for IngressConnect {
    /// The verifier admitted only the router; nothing more to know.
    type Peer = ();
    type Target = ActorTunnel;

    fn peer(&self, _tls: &rustls::ServerConnection) -> io::Result<()> {
        Ok(())
    }

    async fn open(&self, _: &(), req: ConnectRequest<'_>) -> Answer<ActorTunnel> {
        if req.method != "CONNECT" {
            return Answer::refuse(405, "Method Not Allowed", "method not allowed\n");
        }
        let Some(activation) = self.routes.target(req.headers) else {
            return Answer::Refuse {
                status: 421,
                reason: "Misdirected Request",
                body: "misdirected request\n".into(),
                headers: STALE,
                retry_after: None,
            };
        };
        if let Some(refused) = self.routes.overloaded(&activation) {
            return Answer::unavailable("overloaded\n", refused.retry_after);
        }
        let Some(token) = activation.admit() else {
            return Answer::unavailable("actor busy\n", super::https::ACTOR_BUSY_RETRY);
        };
        let Some(port) = authority_port(req.authority) else {
            return Answer::refuse(
                400,
                "Bad Request",
                format!("CONNECT authority {:?} has no valid port\n", req.authority),
            );
        };
        match activation.dial(port).await {
            Ok(actor) => Answer::Open(ActorTunnel {
                actor,
                activation,
                _token: token,
            }),
            Err(e) => {
                tracing::debug!(actor_uid = %activation.uid, port, error = %e, "atunnel CONNECT upstream failed");
                Answer::refuse(502, "Bad Gateway", "bad gateway\n")
            }
        }
    }

    async fn run<E: Endpoint + Send>(&self, target: ActorTunnel, tunnel: &mut E) {
        let ActorTunnel {
            mut actor,
            activation,
            _token,
        } = target;
        let work = activation.work_token();
        // Deactivation drops the relay, which resets both peers, as it does
        // on an error, at a bound, or when shutdown drops this future. The
        // buffers are the actor's share, the bounds egress's.
        let relay = relay_within(
            tunnel,
            &mut actor,
            activation.pool(),
            activation.relay_bounds(),
        );
        tokio::select! {
            biased;
            _ = work.cancelled() => {}
            r = relay => if let Err(e) = r {
                activation.relay_ended(&e);
                tracing::debug!(actor_uid = %activation.uid, error = %e, "ingress tunnel ended with an error");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_authorities_with_a_valid_port_are_accepted() {
        assert_eq!(authority_port("actor:8080"), Some(8080));
        assert_eq!(authority_port("169.254.17.2:80"), Some(80));
        assert_eq!(authority_port("[::1]:443"), Some(443));
        assert_eq!(authority_port("actor"), None);
        assert_eq!(authority_port("actor:0"), None);
        assert_eq!(authority_port("actor:99999"), None);
        assert_eq!(authority_port("actor:http"), None);
        assert_eq!(authority_port(""), None);
    }
}
