//! The control socket: one connection at a time, requests bounded in size,
//! each answered by the supervisor.

use super::*;

/// Longest request line the control socket reads.
pub(super) const MAX_REQUEST: u64 = 64 * 1024;

/// Binds the control socket (replacing a stale one), readable by root only.
pub(super) fn bind_control(path: &Path) -> Result<UnixListener, atunnel_process::BoxError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()).into());
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("binding the control socket {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub(super) async fn serve_control(
    listener: UnixListener,
    status: watch::Receiver<WorkerStatus>,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    loop {
        let conn = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept");
                    tokio::time::sleep(crate::actors::ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        tokio::spawn(serve_connection(
            conn,
            status.clone(),
            commands.clone(),
            cancel.clone(),
        ));
    }
}

pub(super) async fn serve_connection(
    conn: UnixStream,
    status: watch::Receiver<WorkerStatus>,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut line = String::new();
        // Bounded, so a client cannot make the worker buffer without end;
        // a line that is not UTF-8 ends the connection.
        let n = match (&mut read).take(MAX_REQUEST).read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let too_long = !line.ends_with('\n') && n as u64 >= MAX_REQUEST;
        let reply = if too_long {
            Reply::error(format!("request line longer than {MAX_REQUEST} bytes"))
        } else {
            answer(&line, &status, &commands, &cancel).await
        };
        let Ok(mut out) = serde_json::to_vec(&reply) else {
            return;
        };
        out.push(b'\n');
        if write.write_all(&out).await.is_err() || too_long {
            return;
        }
    }
}

pub(super) async fn answer(
    line: &str,
    status: &watch::Receiver<WorkerStatus>,
    commands: &mpsc::Sender<Command>,
    cancel: &CancellationToken,
) -> Reply {
    let request: Request = match serde_json::from_str(line.trim()) {
        Ok(r) => r,
        Err(e) => return Reply::error(format!("bad request: {e}")),
    };
    match request {
        Request::Status {
            wait_generation: None,
        } => Reply::status(status.borrow().clone()),
        Request::Status {
            wait_generation: Some(generation),
        } => {
            let mut status = status.clone();
            let settled = |s: &WorkerStatus| {
                s.state == TunnelState::Failed
                    || (s.state == TunnelState::Running && s.generation >= generation)
            };
            tokio::select! {
                _ = cancel.cancelled() => Reply::error("the worker is stopping"),
                s = status.wait_for(settled) => match s {
                    Ok(s) => Reply::status(s.clone()),
                    Err(_) => Reply::error("the worker is stopping"),
                },
            }
        }
        request => {
            let (reply, answer) = oneshot::channel();
            let command = Command { request, reply };
            if commands.send(command).await.is_err() {
                return Reply::error("the worker is stopping");
            }
            match answer.await {
                Ok(Ok(status)) => Reply::status(status),
                Ok(Err(e)) => Reply::error(e),
                Err(_) => Reply::error("the worker is stopping"),
            }
        }
    }
}
