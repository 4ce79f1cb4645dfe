//! The HTTP/2 CONNECT: one stream on a pooled connection, its answer, and
//! a refusal's body read within bounds. It only sends on a connection the
//! pool or a dial handed it.

use std::sync::Arc;
use std::time::Duration;

use atunnel_core::H2Stream;

use crate::limits::MAX_REFUSAL_BODY;

use super::pool::{H2Conn, StreamSlot};
use super::tunnel::GatewayTunnel;
use super::{GatewayClient, OpenError};

pub(super) enum H2Failure {
    /// The connection (not just this stream) failed before an answer.
    Connection(h2::Error),
    /// RST_STREAM(REFUSED_STREAM): not processed, safe to send again.
    Refused,
    Tunnel(OpenError),
}

impl GatewayClient {
    pub(super) async fn connect_h2(
        &self,
        conn: &Arc<H2Conn>,
        slot: StreamSlot,
        authority: &str,
    ) -> Result<GatewayTunnel, H2Failure> {
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(authority)
            .body(())
            .map_err(|e| {
                H2Failure::Tunnel(OpenError::InvalidDestination(format!("{authority}: {e}")))
            })?;
        let mut send_request = conn.send.clone();
        let (response, send) = match send_request.send_request(request, false) {
            Ok(x) => x,
            Err(e) => return Err(H2Failure::Connection(e)),
        };
        let response = match response.await {
            Ok(r) => r,
            Err(e)
                if e.is_reset()
                    && !e.is_go_away()
                    && e.reason() == Some(h2::Reason::REFUSED_STREAM) =>
            {
                return Err(H2Failure::Refused);
            }
            // A reset of this stream alone is the gateway's answer to it.
            Err(e) if e.is_reset() && !e.is_go_away() => {
                return Err(H2Failure::Tunnel(OpenError::Protocol {
                    addr: self.cfg.address,
                    reason: format!("gateway reset the CONNECT stream: {e}"),
                }));
            }
            Err(e) => return Err(H2Failure::Connection(e)),
        };
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let body = read_refusal_body_h2(&mut body, self.cfg.refusal_body_wait).await;
            return Err(H2Failure::Tunnel(OpenError::ConnectRefused {
                authority: authority.to_string(),
                status: status.as_u16(),
                body,
            }));
        }
        Ok(GatewayTunnel::H2 {
            stream: H2Stream::new(send, body),
            _slot: slot,
        })
    }
}

/// Up to [`MAX_REFUSAL_BODY`] bytes of a refusal's body, or what arrived
/// within `wait`.
async fn read_refusal_body_h2(body: &mut h2::RecvStream, wait: Duration) -> String {
    let deadline = tokio::time::Instant::now() + wait;
    let mut out = Vec::new();
    while out.len() < MAX_REFUSAL_BODY {
        match tokio::time::timeout_at(deadline, body.data()).await {
            Ok(Some(Ok(chunk))) => {
                let _ = body.flow_control().release_capacity(chunk.len());
                let take = chunk.len().min(MAX_REFUSAL_BODY - out.len());
                out.extend_from_slice(&chunk[..take]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod refusal_body_fuzz {
    //! The h2 refusal-body reader against arbitrary bodies in arbitrary
    //! frames: never more than the limit, and within its wait.

    use proptest::prelude::*;

    use super::*;

    use atunnel_core::test_util::run_bounded;
    use bytes::Bytes;

    const GUARD: Duration = Duration::from_secs(10);
    /// The reader's own wait for a body that stalls: the case ends with it.
    const WAIT_STALLED: Duration = Duration::from_millis(50);
    /// The wait for a body that ends: never reached, so a busy host cannot
    /// cut such a body short.
    const WAIT_ENDED: Duration = Duration::from_secs(5);

    /// The gateway's side of one refused h2 CONNECT: the body goes in
    /// `chunks`, then the stream ends, or is left open if `stall`.
    async fn h2_refusal(chunks: Vec<Vec<u8>>, stall: bool) -> String {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io)
                .await
                .expect("server handshake");
            let (_request, mut respond) = conn.accept().await.expect("a request").expect("ok");
            let response = http::Response::builder()
                .status(403)
                .body(())
                .expect("response");
            let mut send = respond
                .send_response(response, false)
                .expect("send response");
            for chunk in chunks {
                send.send_data(Bytes::from(chunk), false)
                    .expect("send data");
            }
            if !stall {
                send.send_data(Bytes::new(), true).expect("end stream");
            }
            // Serve the connection until the client is done with it.
            while let Some(Ok(_)) = conn.accept().await {}
            drop(send);
        });
        let (mut send, conn) = h2::client::handshake(client_io)
            .await
            .expect("client handshake");
        let driver = tokio::spawn(conn);
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("192.0.2.1:443")
            .body(())
            .expect("request");
        let (response, _stream) = send.send_request(request, false).expect("send request");
        let response = response.await.expect("response");
        let mut body = response.into_body();
        let wait = if stall { WAIT_STALLED } else { WAIT_ENDED };
        let text = read_refusal_body_h2(&mut body, wait).await;
        drop((body, _stream, send));
        driver.abort();
        server.abort();
        text
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn an_h2_refusal_body_is_kept_up_to_the_limit_whatever_its_frames(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..2500), 0..5),
            stall in any::<bool>(),
        ) {
            let mut chunks = chunks;
            if stall {
                // ASCII, so what came by the wait is a prefix of the text.
                chunks.iter_mut().flatten().for_each(|b| *b = *b % 95 + 32);
            }
            let body: Vec<u8> = chunks.concat();
            let got = run_bounded(GUARD, h2_refusal(chunks, stall));
            let want = String::from_utf8_lossy(&body[..body.len().min(MAX_REFUSAL_BODY)]).into_owned();
            if stall {
                prop_assert!(want.starts_with(&got), "{} bytes not a prefix", got.len());
            } else {
                prop_assert_eq!(got, want);
            }
        }
    }
}
