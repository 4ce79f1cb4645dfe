//! The control socket: a Unix socket only the worker may use. Two gates:
//! the file's mode (0600, or 0660 for a group) keeps other users from
//! connecting at all, and each connection's peer credentials (SO_PEERCRED,
//! taken by the kernel at connect) must name an allowed uid, or it is
//! closed at accept. The second gate holds where the first cannot
//! (root ignores file modes; a group may hold more users than the worker).
//!
//! A connection is checked at accept: a uid not allowed is closed there,
//! holding nothing. An allowed one then has [`ControlConfig::preface_timeout`]
//! to send the HTTP/2 preface and be given a place under the cap on
//! connections served; until then it waits in a room of as many places,
//! where the OLDEST waiting is closed to make room for a newcomer (a
//! client sends its preface with its first write, so connections that
//! never speak cannot keep the worker out). A served connection quiet for
//! [`ControlConfig::ping_interval`] is PINGed and closed if it does not
//! answer (an HTTP/2 client's library does). A cap on calls per connection
//! and on request size; see the limits in [`super`].

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_tls::{PreAuthGate, PreAuthLimits, PreAuthPermit};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::log_limit::LogLimit;

use super::proto::control_server::ControlServer;
use super::service::ControlService;
use super::{ControlConfig, MAX_REQUEST_BYTES, MAX_STREAMS_PER_CONNECTION, SHUTDOWN_GRACE};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {op}: {source}")]
    Socket {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("control socket {0}: another process is serving on it")]
    InUse(PathBuf),
    #[error("control socket {0}: exists and is not a socket")]
    NotASocket(PathBuf),
    #[error("control socket mode {0:o}: others must have no access (use 600 or 660)")]
    Mode(u32),
    #[error("serving the control API: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// The bound control socket, ready to serve; its file is removed when
/// this is dropped.
pub struct ControlSocket {
    listener: UnixListener,
    file: SocketFile,
}

/// Removes the socket's file when dropped.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl ControlSocket {
    /// Binds the socket at `cfg.socket` with its mode (and group) set
    /// before anyone can reach it: bound under a temporary name in the same
    /// directory, then renamed into place. A stale socket (nobody answers
    /// on it) is replaced; a live one is an error.
    pub async fn bind(cfg: &ControlConfig) -> Result<Self, ControlError> {
        if cfg.mode & !0o770 != 0 {
            return Err(ControlError::Mode(cfg.mode));
        }
        let path = cfg.socket.clone();
        let err = |op| {
            let path = path.clone();
            move |source| ControlError::Socket { path, op, source }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err("create its directory"))?;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(ControlError::NotASocket(path));
                }
                if UnixStream::connect(&path).await.is_ok() {
                    return Err(ControlError::InUse(path));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("inspect")(e)),
        }
        let temp = temp_path(&path);
        let _ = std::fs::remove_file(&temp);
        let listener = UnixListener::bind(&temp).map_err(err("bind"))?;
        let placed = (|| {
            std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(cfg.mode))
                .map_err(err("set its mode"))?;
            if let Some(gid) = cfg.group {
                std::os::unix::fs::chown(&temp, None, Some(gid)).map_err(err("set its group"))?;
            }
            std::fs::rename(&temp, &path).map_err(err("move into place"))
        })();
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        Ok(Self {
            listener,
            file: SocketFile(path),
        })
    }

    pub fn path(&self) -> &Path {
        &self.file.0
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// The HTTP/2 client preface every gRPC connection opens with.
pub use crate::stats::{ControlCounters, ControlStats};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The peer's uid, as the kernel recorded it at connect.
#[derive(Clone, Copy, Debug)]
pub struct PeerUid(pub Option<u32>);

/// One admitted connection, holding its place under the connection cap.
/// Its preface was read at admission; it is handed to the server first.
struct ControlConn {
    stream: UnixStream,
    peer: PeerUid,
    /// Preface bytes already handed to the server.
    replayed: u8,
    _permit: OwnedSemaphorePermit,
}

impl Connected for ControlConn {
    type ConnectInfo = PeerUid;

    fn connect_info(&self) -> PeerUid {
        self.peer
    }
}

impl AsyncRead for ControlConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let done = usize::from(self.replayed);
        if done < PREFACE.len() {
            let n = (PREFACE.len() - done).min(buf.remaining());
            buf.put_slice(&PREFACE[done..done + n]);
            // At most 24.
            self.replayed += n as u8;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ControlConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// How connections are let in: who may, how long they have, where they
/// wait.
struct Admission {
    allowed: Arc<[u32]>,
    preface_timeout: Duration,
    /// Places under the cap on connections served.
    served: Arc<Semaphore>,
    /// Places for connections accepted and not yet served.
    waiting: Arc<PreAuthGate>,
    stats: Arc<ControlCounters>,
    refusals_logged: LogLimit,
}

impl Admission {
    /// A connection just accepted: refused at once if its uid is not
    /// allowed, else the wait for its preface and a place.
    fn admit(
        &self,
        stream: UnixStream,
    ) -> Option<impl Future<Output = Option<ControlConn>> + use<>> {
        count(&self.stats.accepted);
        let uid = stream.peer_cred().ok().map(|c| c.uid());
        if !uid.is_some_and(|uid| self.allowed.contains(&uid)) {
            count(&self.stats.refused_uid);
            if let Some(suppressed) = self.refusals_logged.admit() {
                tracing::warn!(
                    ?uid,
                    suppressed,
                    "control connection refused: peer uid not allowed"
                );
            }
            return None;
        }
        // One source: every peer is local, and the oldest goes whoever it is.
        let place = self.waiting.admit(IpAddr::V4(Ipv4Addr::UNSPECIFIED))?;
        Some(wait_for_preface(
            stream,
            PeerUid(uid),
            place,
            self.served.clone(),
            self.preface_timeout,
            self.stats.clone(),
        ))
    }
}

/// Reads the connection's preface and takes a place under the cap, within
/// `timeout` and unless a newer connection takes its waiting place first;
/// `None` (counted): it is closed.
async fn wait_for_preface(
    mut stream: UnixStream,
    peer: PeerUid,
    place: PreAuthPermit,
    served: Arc<Semaphore>,
    timeout: Duration,
    stats: Arc<ControlCounters>,
) -> Option<ControlConn> {
    let admitted = async {
        let mut preface = [0u8; PREFACE.len()];
        // Closed or failed before its preface: nothing to count.
        stream.read_exact(&mut preface).await.ok()?;
        if preface != *PREFACE {
            count(&stats.bad_preface);
            return None;
        }
        served.acquire_owned().await.ok()
    };
    let permit = match place.run(tokio::time::timeout(timeout, admitted)).await {
        Some(Ok(permit)) => permit?,
        Some(Err(_)) => {
            count(&stats.preface_timeouts);
            return None;
        }
        None => {
            count(&stats.evicted);
            return None;
        }
    };
    Some(ControlConn {
        stream,
        peer,
        replayed: 0,
        _permit: permit,
    })
}

/// Accepts, and yields each connection once it is admitted. An accept
/// error (out of descriptors) is logged and retried after a pause instead
/// of spinning. Connections waiting for admission are futures here, not
/// tasks: a connection costs a task and its HTTP/2 state only once served.
fn incoming(
    listener: UnixListener,
    admission: Admission,
) -> impl futures_util::Stream<Item = Result<ControlConn, io::Error>> {
    let waiting = FuturesUnordered::new();
    futures_util::stream::unfold(
        (listener, admission, waiting),
        |(listener, admission, mut waiting)| async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            if let Some(wait) = admission.admit(stream) {
                                waiting.push(wait);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "accepting a control connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    Some(admitted) = waiting.next(), if !waiting.is_empty() => {
                        if let Some(conn) = admitted {
                            return Some((Ok(conn), (listener, admission, waiting)));
                        }
                    }
                }
            }
        },
    )
}

/// Serves `service` on `socket` until `cancel`, then lets open calls finish
/// (up to [`SHUTDOWN_GRACE`]) and waits for every operation started.
pub async fn serve(
    socket: ControlSocket,
    service: ControlService,
    cfg: &ControlConfig,
    cancel: CancellationToken,
) -> Result<(), ControlError> {
    let admission = Admission {
        allowed: cfg.allowed().into(),
        preface_timeout: cfg.preface_timeout,
        served: Arc::new(Semaphore::new(cfg.max_connections)),
        // One source for all (see `admit`): no per-source cap, so at the
        // total the oldest goes, whoever it is.
        waiting: PreAuthGate::new(PreAuthLimits {
            total: cfg.max_connections,
            per_source: usize::MAX,
        }),
        stats: service.tunnel().control_counters().clone(),
        refusals_logged: LogLimit::default(),
    };
    let server = ControlServer::new(service.clone()).max_decoding_message_size(MAX_REQUEST_BYTES);
    let ControlSocket { listener, file } = socket;
    let stop = cancel.clone();
    let serving = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        // Bounds a peer that sent its preface and nothing since: it holds
        // a place until its PING goes unanswered.
        .http2_keepalive_interval(Some(cfg.ping_interval))
        .http2_keepalive_timeout(Some(cfg.ping_interval))
        .add_service(server)
        .serve_with_incoming_shutdown(incoming(listener, admission), stop.cancelled_owned());
    tokio::pin!(serving);
    let result = tokio::select! {
        r = &mut serving => r.map_err(ControlError::Serve),
        () = async { cancel.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::info!(after = ?SHUTDOWN_GRACE, "control connections still open at shutdown; dropping them");
            Ok(())
        }
    };
    drop(file);
    service.wait().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let cfg = ControlConfig::new(dir.path().join("c.sock"));
        // A socket file nobody listens on, as a killed daemon leaves it.
        drop(std::os::unix::net::UnixListener::bind(&cfg.socket).expect("bind"));
        assert!(cfg.socket.exists());
        let live = ControlSocket::bind(&cfg).await.expect("stale replaced");
        let mode = std::fs::metadata(&cfg.socket)
            .expect("socket")
            .permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
        match ControlSocket::bind(&cfg).await {
            Err(ControlError::InUse(_)) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a live socket was replaced"),
        }
        drop(live);
        assert!(!cfg.socket.exists(), "dropping removes the file");
        std::fs::write(&cfg.socket, b"not a socket").expect("write");
        assert!(matches!(
            ControlSocket::bind(&cfg).await,
            Err(ControlError::NotASocket(_))
        ));
        let open = ControlConfig {
            mode: 0o666,
            ..ControlConfig::new(dir.path().join("d.sock"))
        };
        assert!(matches!(
            ControlSocket::bind(&open).await,
            Err(ControlError::Mode(0o666))
        ));
    }
}
