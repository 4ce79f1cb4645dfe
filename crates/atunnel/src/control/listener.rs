//! The control socket: a Unix socket only the worker may use. Two gates:
//! the file's mode (0600, or 0660 for a group) keeps other users from
//! connecting at all, and each connection's peer credentials (SO_PEERCRED,
//! taken by the kernel at connect) must name an allowed uid, or every call
//! on it is PERMISSION_DENIED. The second gate holds where the first cannot
//! (root ignores file modes; a group may hold more users than the worker).
//!
//! One accept loop with a cap on connections (the next waits in the
//! backlog), a cap on calls per connection and on request size; see the
//! limits in [`super`].

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;
use tonic::{Request, Status};

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

/// The peer's uid, as the kernel recorded it at connect.
#[derive(Clone, Copy, Debug)]
pub struct PeerUid(pub Option<u32>);

/// One accepted connection, holding its place under the connection cap.
struct ControlConn {
    stream: UnixStream,
    peer: PeerUid,
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

/// Accepts while under the cap. An accept error (out of descriptors) is
/// logged and retried after a pause instead of spinning.
fn incoming(
    listener: UnixListener,
    cap: Arc<Semaphore>,
) -> impl futures_util::Stream<Item = Result<ControlConn, io::Error>> {
    futures_util::stream::unfold((listener, cap), |(listener, cap)| async move {
        let permit = cap.clone().acquire_owned().await.ok()?;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let peer = PeerUid(stream.peer_cred().ok().map(|c| c.uid()));
                    let conn = ControlConn {
                        stream,
                        peer,
                        _permit: permit,
                    };
                    return Some((Ok(conn), (listener, cap)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a control connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Serves `service` on `socket` until `cancel`, then lets open calls finish
/// (up to [`SHUTDOWN_GRACE`]) and waits for every operation started.
pub async fn serve(
    socket: ControlSocket,
    service: ControlService,
    cfg: &ControlConfig,
    cancel: CancellationToken,
) -> Result<(), ControlError> {
    let allowed: Arc<[u32]> = cfg.allowed().into();
    let check = move |request: Request<()>| check_peer(&allowed, request);
    let server = ControlServer::new(service.clone()).max_decoding_message_size(MAX_REQUEST_BYTES);
    let svc = tonic::service::interceptor::InterceptedService::new(server, check);
    let cap = Arc::new(Semaphore::new(cfg.max_connections));
    let ControlSocket { listener, file } = socket;
    let stop = cancel.clone();
    let serving = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming(listener, cap), stop.cancelled_owned());
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

fn check_peer(allowed: &[u32], request: Request<()>) -> Result<Request<()>, Status> {
    let peer = request.extensions().get::<PeerUid>().and_then(|p| p.0);
    match peer {
        Some(uid) if allowed.contains(&uid) => Ok(request),
        Some(uid) => {
            tracing::warn!(uid, "control call refused: peer uid not allowed");
            Err(Status::permission_denied(format!(
                "uid {uid} may not use atunnel's control API"
            )))
        }
        None => Err(Status::permission_denied(
            "the peer's credentials could not be read",
        )),
    }
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
