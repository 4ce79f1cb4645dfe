//! A fake node agent: the real protocol, socket and mutual TLS, signing with
//! an in-process actor CA, with scripted misbehaviour. For tests and the
//! benchmark; production talks to atelet.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use atunnel_identity::{ActorRef, CertificateAuthority, PkiError};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::error::NodeAgentError;
use crate::proto::ateom_support_server::{AteomSupport, AteomSupportServer};
use crate::proto::{MintActorCertificateRequest, MintActorCertificateResponse};
use crate::transport;

/// ateapi's actor certificate lifetime.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(60 * 60);
/// ateapi backdates `NotBefore` this far, for clock skew.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// How long [`FakeNodeAgentHandle::shutdown`] lets in-flight calls finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What the fake agent does with the next calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Sign the CSR, valid from five minutes ago for `lifetime` from now.
    Sign { lifetime: Duration },
    /// Answer with this status (e.g. `Unavailable`, or `Aborted` for a
    /// deleted actor).
    Fail(Code, String),
    /// Answer `PermissionDenied`, as for an actor not placed on this node.
    Deny,
    /// Sleep this long, then sign with the default lifetime.
    Late(Duration),
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior::Sign {
            lifetime: DEFAULT_LIFETIME,
        }
    }
}

/// The fake agent's TLS identity and whom it admits.
pub struct FakeAgentTls {
    /// The agent's certificate chain, leaf first (atelet's SPIFFE ID, or
    /// another one to test that workers refuse it).
    pub server_chain: Vec<CertificateDer<'static>>,
    /// The key of `server_chain`'s leaf.
    pub server_key: PrivateKeyDer<'static>,
    /// Trust anchors for worker certificates.
    pub client_roots: Vec<CertificateDer<'static>>,
    /// The only SPIFFE ID admitted as a client (the worker's).
    pub allowed_client_id: String,
}

impl fmt::Debug for FakeAgentTls {
    // The key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeAgentTls")
            .field("server_chain_len", &self.server_chain.len())
            .field("client_roots_len", &self.client_roots.len())
            .field("allowed_client_id", &self.allowed_client_id)
            .finish_non_exhaustive()
    }
}

/// State shared by the service and its handle.
#[derive(Debug, Default)]
struct Shared {
    behavior: Mutex<Behavior>,
    calls: AtomicUsize,
    connections: AtomicUsize,
}

/// The fake agent's `AteomSupport` service; run one with [`FakeNodeAgent::spawn`].
pub struct FakeNodeAgent {
    ca: Arc<CertificateAuthority>,
    shared: Arc<Shared>,
}

impl fmt::Debug for FakeNodeAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeNodeAgent")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl FakeNodeAgent {
    /// Binds `socket` (replacing a stale socket file there) and serves until
    /// the handle is shut down or dropped. Signs with `ca`; starts with
    /// [`Behavior::default`].
    pub async fn spawn(
        socket: &Path,
        tls: FakeAgentTls,
        ca: Arc<CertificateAuthority>,
    ) -> Result<FakeNodeAgentHandle, NodeAgentError> {
        transport::check_socket_path(socket)?;
        let config = transport::server_config(
            socket,
            tls.server_chain,
            tls.server_key,
            &tls.client_roots,
            &tls.allowed_client_id,
        )?;
        remove_stale_socket(socket)?;
        let listener = UnixListener::bind(socket).map_err(|source| NodeAgentError::Bind {
            path: socket.to_owned(),
            source,
        })?;
        // Remembered so drop removes this socket file and not a successor's.
        let bound = std::fs::metadata(socket)
            .map(|m| (m.dev(), m.ino()))
            .map_err(|source| NodeAgentError::Bind {
                path: socket.to_owned(),
                source,
            })?;

        let shared = Arc::new(Shared::default());
        let cancel = CancellationToken::new();
        let (incoming, accept_task) = transport::accept_tls(listener, config, cancel.clone());
        let counted = Arc::clone(&shared);
        let incoming = incoming.map(move |conn| {
            counted.connections.fetch_add(1, Ordering::SeqCst);
            conn
        });
        let service = AteomSupportServer::new(FakeNodeAgent {
            ca,
            shared: Arc::clone(&shared),
        });
        let stop = cancel.clone();
        let path = socket.to_owned();
        let server_task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, socket = %path.display(), "fake node agent stopped");
            }
        });
        Ok(FakeNodeAgentHandle {
            socket: socket.to_owned(),
            bound,
            shared,
            cancel,
            accept_task: Some(accept_task),
            server_task: Some(server_task),
        })
    }

    fn sign(
        &self,
        actor: &ActorRef,
        csr_der: &[u8],
        lifetime: Duration,
    ) -> Result<Response<MintActorCertificateResponse>, Status> {
        let now = SystemTime::now();
        let not_after = now.checked_add(lifetime).ok_or_else(|| {
            Status::internal(format!("lifetime {lifetime:?} does not fit the clock"))
        })?;
        let chain = self
            .ca
            .sign_actor_csr(actor, csr_der, now - BACKDATE, not_after)
            .map_err(|e| match e {
                PkiError::CsrParse(_) | PkiError::CsrSignature(_) | PkiError::CsrKey(_) => {
                    Status::invalid_argument(format!("certificate signing request: {e}"))
                }
                other => Status::internal(format!("signing for {actor}: {other}")),
            })?;
        Ok(Response::new(MintActorCertificateResponse {
            certificate_chain: chain.into_iter().map(|c| c.to_vec()).collect(),
        }))
    }
}

#[tonic::async_trait]
impl AteomSupport for FakeNodeAgent {
    async fn mint_actor_certificate(
        &self,
        request: Request<MintActorCertificateRequest>,
    ) -> Result<Response<MintActorCertificateResponse>, Status> {
        self.shared.calls.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        let actor = ActorRef::new(
            request.actor_atespace,
            request.actor_name,
            request.actor_uid,
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let csr = request.certificate_signing_request;
        let behavior = self
            .shared
            .behavior
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match behavior {
            Behavior::Sign { lifetime } => self.sign(&actor, &csr, lifetime),
            Behavior::Fail(code, message) => Err(Status::new(code, message)),
            Behavior::Deny => Err(Status::permission_denied(format!(
                "actor {actor} is not placed on this node"
            ))),
            Behavior::Late(delay) => {
                tokio::time::sleep(delay).await;
                self.sign(&actor, &csr, DEFAULT_LIFETIME)
            }
        }
    }
}

/// Refuses to replace anything but a socket: the path may be a mistake.
fn remove_stale_socket(socket: &Path) -> Result<(), NodeAgentError> {
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(|source| NodeAgentError::StaleSocket {
                path: socket.to_owned(),
                source,
            })
        }
        Ok(_) => Err(NodeAgentError::NotASocket {
            path: socket.to_owned(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NodeAgentError::StaleSocket {
            path: socket.to_owned(),
            source,
        }),
    }
}

/// A running fake agent. Dropping it stops the agent and removes the socket
/// file; [`shutdown`](Self::shutdown) does the same but lets in-flight
/// calls finish first.
pub struct FakeNodeAgentHandle {
    socket: PathBuf,
    bound: (u64, u64),
    shared: Arc<Shared>,
    cancel: CancellationToken,
    accept_task: Option<JoinHandle<()>>,
    server_task: Option<JoinHandle<()>>,
}

impl fmt::Debug for FakeNodeAgentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeNodeAgentHandle")
            .field("socket", &self.socket)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl FakeNodeAgentHandle {
    /// What the agent does with calls from now on.
    pub fn set_behavior(&self, behavior: Behavior) {
        *self
            .shared
            .behavior
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = behavior;
    }

    /// Mint calls received so far (whatever their outcome).
    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    /// Connections that passed the mutual-TLS handshake so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// The socket the agent listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting, asks open connections to close once their calls
    /// are done (bounded by a short grace), and removes the socket file.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(accept) = self.accept_task.take() {
            // The accept loop ends at once on cancel; an error is a panic
            // already reported by tokio.
            let _ = accept.await;
        }
        if let Some(server) = self.server_task.take() {
            let abort = server.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, server).await.is_err() {
                abort.abort();
            }
        }
        // Drop removes the socket file.
    }
}

impl Drop for FakeNodeAgentHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
        for task in [self.accept_task.take(), self.server_task.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
        let ours =
            std::fs::symlink_metadata(&self.socket).is_ok_and(|m| (m.dev(), m.ino()) == self.bound);
        if ours && let Err(error) = std::fs::remove_file(&self.socket) {
            tracing::warn!(%error, socket = %self.socket.display(), "removing the fake node agent's socket");
        }
    }
}
