//! The HTTP/1.1 CONNECT, for a gateway that does not speak h2: the request,
//! the answer's head, and a refusal's body read within bounds. Each tunnel
//! has a connection of its own, so nothing here is pooled.

use std::io;
use std::time::Duration;

use atunnel_tls::client::ClientTls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http1;
use crate::limits::MAX_REFUSAL_BODY;

use super::tunnel::GatewayTunnel;
use super::{GatewayClient, OpenError};

impl GatewayClient {
    pub(super) async fn connect_h1(
        &self,
        mut tls: Box<ClientTls>,
        authority: &str,
    ) -> Result<GatewayTunnel, OpenError> {
        let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        let write = async {
            tls.write_all(request.as_bytes()).await?;
            tls.flush().await
        };
        write.await.map_err(|e| self.handshake_error(e))?;
        let head = http1::read_head(&mut tls)
            .await
            .map_err(|e| match e.kind() {
                // TLS failures (alerts, rustls's or the record layer's) are
                // InvalidData too; only our own head parser's complaint is a protocol error.
                io::ErrorKind::InvalidData if !is_tls_error(&e) => OpenError::Protocol {
                    addr: self.cfg.address,
                    reason: e.to_string(),
                },
                _ => self.handshake_error(e),
            })?;
        let head = http1::parse_response(&head).map_err(|e| OpenError::Protocol {
            addr: self.cfg.address,
            reason: e.to_string(),
        })?;
        if (200..300).contains(&head.status) {
            return Ok(GatewayTunnel::H1(tls));
        }
        let limit = head
            .content_length
            .unwrap_or(MAX_REFUSAL_BODY)
            .min(MAX_REFUSAL_BODY);
        let body = read_refusal_body_h1(&mut tls, limit, self.cfg.refusal_body_wait).await;
        Err(OpenError::ConnectRefused {
            authority: authority.to_string(),
            status: head.status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

fn is_tls_error(e: &io::Error) -> bool {
    atunnel_tls::client::is_tls_error(e)
}

/// Up to `limit` bytes of a refusal's body, or what arrived within `wait`.
/// The body is best effort: the status is the answer.
async fn read_refusal_body_h1<R: tokio::io::AsyncRead + Unpin>(
    tls: &mut R,
    limit: usize,
    wait: Duration,
) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut body = vec![0u8; limit];
    let mut filled = 0;
    while filled < limit {
        match tokio::time::timeout_at(deadline, tls.read(&mut body[filled..])).await {
            Ok(Ok(n)) if n > 0 => filled += n,
            _ => break,
        }
    }
    body.truncate(filled);
    body
}

#[cfg(test)]
mod refusal_body_fuzz {
    //! The h1 refusal-body reader against arbitrary bodies in arbitrary
    //! chunks: never more than the limit, and within its wait.

    use proptest::prelude::*;

    use super::*;

    use atunnel_core::test_util::{Chunked, run_bounded};

    const GUARD: Duration = Duration::from_secs(10);
    /// The reader's own wait for a body that stalls: the case ends with it.
    const WAIT_STALLED: Duration = Duration::from_millis(50);
    /// The wait for a body that ends: never reached, so a busy host cannot
    /// cut such a body short.
    const WAIT_ENDED: Duration = Duration::from_secs(5);

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn an_h1_refusal_body_is_read_up_to_its_limit_and_no_further(
            body in prop::collection::vec(any::<u8>(), 0..6000),
            content_length in prop::option::of(any::<usize>()),
            sizes in prop::collection::vec(1usize..2048, 0..6),
            stall in any::<bool>(),
        ) {
            // As `open_h1` sizes it: the claimed length, at most the limit.
            let limit = content_length.unwrap_or(MAX_REFUSAL_BODY).min(MAX_REFUSAL_BODY);
            let mut peer = Chunked::new(body.clone(), sizes);
            if stall {
                peer = peer.stalling();
            }
            let wait = if stall { WAIT_STALLED } else { WAIT_ENDED };
            let got = run_bounded(GUARD, read_refusal_body_h1(&mut peer, limit, wait));
            let want = body.len().min(limit);
            if stall {
                // Returned within the guard, with what had come by the wait.
                prop_assert!(got.len() <= want);
            } else {
                prop_assert_eq!(got.len(), want);
            }
            prop_assert_eq!(&got[..], &body[..got.len()]);
            prop_assert_eq!(peer.consumed(), got.len());
            prop_assert!(peer.largest_offer() <= MAX_REFUSAL_BODY);
        }

    }
}
