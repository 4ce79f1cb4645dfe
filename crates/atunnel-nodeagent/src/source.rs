//! The [`CertificateSource`] that mints actor certificates through the node
//! agent, and how its answers become `MintError`s.

use std::error::Error as _;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use atunnel_identity::pki::ATELET_SPIFFE_ID;
use atunnel_identity::{ActorRef, CertificateSource, MintError, RefusalCode};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::error::NodeAgentError;
use crate::proto::ateom_support_client::AteomSupportClient;
use crate::proto::{MintActorCertificateRequest, MintActorCertificateResponse};
use crate::transport;

/// How long one mint may take, connection included, unless configured.
pub const DEFAULT_MINT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach and authenticate the node agent.
pub struct NodeAgentConfig {
    /// The agent's Unix socket.
    pub socket: PathBuf,
    /// The worker pod's certificate chain, leaf first, presented to the agent.
    pub client_chain: Vec<CertificateDer<'static>>,
    /// The key of `client_chain`'s leaf.
    pub client_key: PrivateKeyDer<'static>,
    /// Trust anchors for the agent's certificate.
    pub roots: Vec<CertificateDer<'static>>,
    /// The SPIFFE ID the agent's certificate must carry.
    pub agent_id: String,
    /// Limit on one mint, connecting included.
    pub timeout: Duration,
}

impl NodeAgentConfig {
    /// A config for atelet ([`ATELET_SPIFFE_ID`]) with [`DEFAULT_MINT_TIMEOUT`].
    pub fn new(
        socket: impl Into<PathBuf>,
        client_chain: Vec<CertificateDer<'static>>,
        client_key: PrivateKeyDer<'static>,
        roots: Vec<CertificateDer<'static>>,
    ) -> Self {
        Self {
            socket: socket.into(),
            client_chain,
            client_key,
            roots,
            agent_id: ATELET_SPIFFE_ID.to_owned(),
            timeout: DEFAULT_MINT_TIMEOUT,
        }
    }
}

impl fmt::Debug for NodeAgentConfig {
    // The key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeAgentConfig")
            .field("socket", &self.socket)
            .field("client_chain_len", &self.client_chain.len())
            .field("roots_len", &self.roots.len())
            .field("agent_id", &self.agent_id)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Mints actor certificates by asking the node agent over its Unix socket
/// (gRPC `AteomSupport.MintActorCertificate`, mutual TLS).
///
/// The TLS config is built up front so configuration errors surface at
/// start-up; the connection is made on the first mint.
pub struct NodeAgentSource {
    socket: PathBuf,
    agent_id: String,
    timeout: Duration,
    connector: TlsConnector,
    channel: Mutex<ChannelSlot>,
}

/// The channel in use, if any. `generation` tells a failure on an old
/// channel from one on the current channel, so a slow failing call does not
/// throw away a channel that a concurrent call has just rebuilt.
#[derive(Default)]
struct ChannelSlot {
    generation: u64,
    channel: Option<Channel>,
}

impl NodeAgentSource {
    /// Validates `cfg` and builds the TLS client config; does not connect.
    pub fn new(cfg: NodeAgentConfig) -> Result<Self, NodeAgentError> {
        transport::check_socket_path(&cfg.socket)?;
        if cfg.timeout.is_zero() {
            return Err(NodeAgentError::ZeroTimeout { socket: cfg.socket });
        }
        let tls = transport::client_config(
            &cfg.socket,
            cfg.client_chain,
            cfg.client_key,
            &cfg.roots,
            &cfg.agent_id,
        )?;
        Ok(Self {
            socket: cfg.socket,
            agent_id: cfg.agent_id,
            timeout: cfg.timeout,
            connector: TlsConnector::from(tls),
            channel: Mutex::new(ChannelSlot::default()),
        })
    }

    /// The agent's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The current channel, made (lazily: no I/O yet) if there is none.
    ///
    /// One channel is kept rather than one per mint: mints come with every
    /// actor activation and renewal, and reusing the HTTP/2 connection saves
    /// a connect and a TLS handshake each time while letting concurrent
    /// mints share it. After a transport failure or a timeout the channel is
    /// dropped and the next mint dials afresh, because the old connection
    /// may be wedged (agent restarted, peer hung) in a way that tonic's own
    /// reconnect would not notice until each later call timed out too.
    fn channel(&self) -> (u64, Channel) {
        let mut slot = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = &slot.channel {
            return (slot.generation, channel.clone());
        }
        let socket = self.socket.clone();
        let connector = self.connector.clone();
        let dial = tower::service_fn(move |_: tonic::transport::Uri| {
            transport::dial(socket.clone(), connector.clone())
        });
        // The URI only fills :authority and the path prefix; `dial` ignores it.
        let channel = Endpoint::from_static("http://nodeagent").connect_with_connector_lazy(dial);
        slot.generation += 1;
        slot.channel = Some(channel.clone());
        (slot.generation, channel)
    }

    /// Forgets the channel of `generation` if it is still the current one.
    fn discard(&self, generation: u64) {
        let mut slot = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.generation == generation {
            slot.channel = None;
        }
    }

    async fn mint_once(
        &self,
        actor: &ActorRef,
        csr_der: &[u8],
    ) -> Result<Vec<CertificateDer<'static>>, MintError> {
        let (generation, channel) = self.channel();
        let mut client = AteomSupportClient::new(channel);
        let request = MintActorCertificateRequest {
            actor_atespace: actor.atespace.clone(),
            actor_name: actor.name.clone(),
            actor_uid: actor.uid.clone(),
            certificate_signing_request: csr_der.to_vec(),
        };
        // The deadline is enforced here rather than sent as grpc-timeout:
        // tonic would then enforce it too and the two would race to report
        // it. Dropping the call on timeout resets the stream, so the agent
        // stops working on it all the same.
        let answer = match tokio::time::timeout(
            self.timeout,
            client.mint_actor_certificate(request),
        )
        .await
        {
            Ok(answer) => answer,
            Err(_) => {
                self.discard(generation);
                return Err(MintError::Failed(format!(
                    "node agent at {}: minting for {actor}: no answer within the {:?} timeout",
                    self.socket.display(),
                    self.timeout
                )));
            }
        };
        match answer {
            Ok(response) => chain_from_response(&self.socket, response.into_inner()),
            Err(status) => {
                if needs_new_channel(&status) {
                    self.discard(generation);
                }
                Err(status_to_error(&self.socket, actor, &status))
            }
        }
    }
}

impl fmt::Debug for NodeAgentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeAgentSource")
            .field("socket", &self.socket)
            .field("agent_id", &self.agent_id)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl CertificateSource for NodeAgentSource {
    fn mint<'a>(
        &'a self,
        actor: &'a ActorRef,
        csr_der: &'a [u8],
    ) -> atunnel_identity::cert_source::MintFuture<'a> {
        Box::pin(self.mint_once(actor, csr_der))
    }
}

/// Whether the status was made on this side from a transport error rather
/// than sent by the agent. tonic attaches the underlying error as the
/// source of such statuses; statuses read off the wire have none.
fn is_transport_failure(status: &Status) -> bool {
    status.source().is_some()
}

/// Transport failures, and `Unknown`, which tonic also uses when the
/// channel itself is broken ("service was not ready"), call for a new channel.
fn needs_new_channel(status: &Status) -> bool {
    is_transport_failure(status) || status.code() == Code::Unknown
}

/// Maps a failed call to a `MintError`. Only the agent's own refusals are
/// terminal: a transport error that tonic happens to map to, say,
/// `PermissionDenied` (an h2 INADEQUATE_SECURITY reset) is a failure to
/// reach the agent, not its verdict on the actor.
fn status_to_error(socket: &Path, actor: &ActorRef, status: &Status) -> MintError {
    let code = status.code();
    if is_transport_failure(status) {
        return MintError::Failed(format!(
            "node agent at {}: minting for {actor}: transport failure ({code:?}): {}",
            socket.display(),
            describe(status)
        ));
    }
    let refusal = match code {
        Code::Aborted => Some(RefusalCode::Aborted),
        Code::FailedPrecondition => Some(RefusalCode::FailedPrecondition),
        Code::PermissionDenied => Some(RefusalCode::PermissionDenied),
        _ => None,
    };
    match refusal {
        Some(code) => MintError::Refused {
            code,
            message: format!(
                "node agent at {} refused {actor}: {}",
                socket.display(),
                status.message()
            ),
        },
        None => MintError::Failed(format!(
            "node agent at {}: minting for {actor}: {code:?}: {}",
            socket.display(),
            status.message()
        )),
    }
}

/// The status message and its source chain, skipping links whose text the
/// previous one already contains (wrappers often repeat their source).
fn describe(status: &Status) -> String {
    let mut text = status.message().to_owned();
    let mut next = status.source();
    while let Some(error) = next {
        let line = error.to_string();
        if !line.is_empty() && !text.contains(&line) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&line);
        }
        next = error.source();
    }
    text
}

/// The chain, leaf first. Only emptiness is checked here: the caller checks
/// the leaf against its key and the clock (`check_minted`).
fn chain_from_response(
    socket: &Path,
    response: MintActorCertificateResponse,
) -> Result<Vec<CertificateDer<'static>>, MintError> {
    if response.certificate_chain.is_empty() {
        return Err(MintError::BadCertificate(format!(
            "node agent at {} returned an empty certificate chain",
            socket.display()
        )));
    }
    Ok(response
        .certificate_chain
        .into_iter()
        .map(CertificateDer::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Arc;

    use super::*;

    fn actor() -> ActorRef {
        ActorRef::new("team-a", "agent-1", "uid-1").expect("valid actor")
    }

    const SOCKET: &str = "/run/atelet/ateom.sock";

    #[test]
    fn agent_statuses_map_to_refusals_or_failures() {
        let table = [
            (Code::Aborted, Some(RefusalCode::Aborted)),
            (
                Code::FailedPrecondition,
                Some(RefusalCode::FailedPrecondition),
            ),
            (Code::PermissionDenied, Some(RefusalCode::PermissionDenied)),
            (Code::Unavailable, None),
            (Code::DeadlineExceeded, None),
            (Code::Internal, None),
            (Code::InvalidArgument, None),
            (Code::Unknown, None),
        ];
        for (code, refusal) in table {
            let err = status_to_error(Path::new(SOCKET), &actor(), &Status::new(code, "why"));
            match (refusal, &err) {
                (Some(want), MintError::Refused { code: got, message }) => {
                    assert_eq!(*got, want);
                    assert!(message.contains("why"), "{message}");
                    assert!(err.is_terminal(), "{err}");
                }
                (None, MintError::Failed(message)) => {
                    assert!(message.contains(SOCKET), "{message}");
                    assert!(message.contains(&format!("{code:?}")), "{message}");
                    assert!(!err.is_terminal(), "{err}");
                }
                _ => panic!("{code:?} mapped to {err:?}"),
            }
        }
    }

    #[test]
    fn a_transport_made_refusal_code_is_not_terminal() {
        // What tonic builds from an h2 INADEQUATE_SECURITY reset.
        let mut status = Status::permission_denied("h2 protocol error");
        status.set_source(Arc::new(io::Error::other("connection reset")));
        let err = status_to_error(Path::new(SOCKET), &actor(), &status);
        assert!(matches!(err, MintError::Failed(_)), "{err:?}");
        assert!(!err.is_terminal());
        assert!(err.to_string().contains("connection reset"), "{err}");
        assert!(needs_new_channel(&status));
        assert!(!needs_new_channel(&Status::unavailable("draining")));
    }

    #[test]
    fn an_empty_chain_is_a_bad_certificate() {
        let err = chain_from_response(
            Path::new(SOCKET),
            MintActorCertificateResponse {
                certificate_chain: vec![],
            },
        )
        .expect_err("empty chain");
        assert!(matches!(err, MintError::BadCertificate(_)), "{err:?}");
        assert!(err.to_string().contains(SOCKET), "{err}");

        let chain = chain_from_response(
            Path::new(SOCKET),
            MintActorCertificateResponse {
                certificate_chain: vec![vec![1], vec![2]],
            },
        )
        .expect("two certificates");
        assert_eq!(
            chain,
            vec![CertificateDer::from(vec![1]), CertificateDer::from(vec![2])]
        );
    }
}

#[cfg(test)]
mod fuzz {
    //! The agent's answers, as bytes off the wire and as statuses.

    use std::io;
    use std::sync::Arc;

    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    const SOCKET: &str = "/run/atelet/ateom.sock";

    fn actor() -> ActorRef {
        ActorRef::new("team-a", "agent-1", "uid-1").expect("valid actor")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any response body: decoding never holds more certificate bytes
        /// than arrived, and the chain is refused only when empty.
        #[test]
        fn any_response_bytes_decode_to_at_most_their_own_size(
            bytes in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                // Near-valid: field 1 (length-delimited) entries, lengths
                // claimed beyond what follows.
                prop::collection::vec((0u8..=0x7f, prop::collection::vec(any::<u8>(), 0..20)), 0..6)
                    .prop_map(|entries| {
                        entries.into_iter().flat_map(|(len, body)| {
                            [vec![0x0a, len], body].concat()
                        }).collect()
                    }),
            ],
        ) {
            let Ok(response) = MintActorCertificateResponse::decode(&bytes[..]) else {
                return Ok(());
            };
            let held: usize = response.certificate_chain.iter().map(Vec::len).sum();
            prop_assert!(held <= bytes.len());
            let entries = response.certificate_chain.len();
            // Encoding is canonical for this message: decode(encode(x)) == x.
            let again = MintActorCertificateResponse::decode(&response.encode_to_vec()[..])
                .expect("re-encoded response decodes");
            prop_assert_eq!(&again, &response);
            match chain_from_response(Path::new(SOCKET), response) {
                Ok(chain) => {
                    prop_assert!(entries > 0);
                    prop_assert_eq!(chain.len(), entries);
                }
                Err(e) => {
                    prop_assert_eq!(entries, 0);
                    prop_assert!(matches!(e, MintError::BadCertificate(_)));
                }
            }
        }

        /// Any status the agent (or the transport) can produce: only the
        /// agent's own Aborted, FailedPrecondition and PermissionDenied are
        /// terminal, and every error names the socket.
        #[test]
        fn any_status_maps_to_a_refusal_only_for_the_three_terminal_codes(
            code in prop_oneof![0i32..=16, any::<i32>()],
            message in "\\PC{0,40}",
            source in prop::option::of("\\PC{0,20}"),
        ) {
            let mut status = Status::new(Code::from(code), message.clone());
            if let Some(source) = &source {
                status.set_source(Arc::new(io::Error::other(source.clone())));
            }
            let error = status_to_error(Path::new(SOCKET), &actor(), &status);
            let terminal_code = matches!(
                status.code(),
                Code::Aborted | Code::FailedPrecondition | Code::PermissionDenied
            );
            prop_assert_eq!(error.is_terminal(), terminal_code && source.is_none());
            let text = error.to_string();
            prop_assert!(text.contains(SOCKET), "{}", text);
            prop_assert!(text.contains(&message), "{}", text);
            prop_assert!(describe(&status).contains(&message));
            prop_assert_eq!(needs_new_channel(&status), source.is_some() || status.code() == Code::Unknown);
        }
    }
}
