//! Kernel socket memory of another process, from the kernel's own
//! per-socket accounting (`SO_MEMINFO`).
//!
//! The measured process's sockets live in many namespaces (one per sandbox),
//! where sock_diag would need a netlink socket in each; instead each socket
//! is duplicated into this process with `pidfd_getfd` (root) and asked
//! directly. Written by hand because no crate wraps pidfd_getfd with
//! SO_MEMINFO; it is three syscalls.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SO_MEMINFO` from asm-generic/socket.h (x86_64 and arm64 use the generic value).
const SO_MEMINFO: libc::c_int = 55;
/// Number of `SK_MEMINFO_*` fields the kernel fills.
const SK_MEMINFO_VARS: usize = 9;

/// Socket memory summed over a process's sockets, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketMemory {
    pub sockets: usize,
    /// Bytes received and not yet read (`SK_MEMINFO_RMEM_ALLOC`).
    pub receive_queued: u64,
    /// Bytes queued to send, including unsent (`SK_MEMINFO_WMEM_QUEUED`).
    pub send_queued: u64,
    /// Memory reserved ahead of use (`SK_MEMINFO_FWD_ALLOC`).
    pub forward_alloc: u64,
}

impl SocketMemory {
    pub fn total(&self) -> u64 {
        self.receive_queued + self.send_queued + self.forward_alloc
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just received and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn pidfd_getfd(pidfd: &OwnedFd, target: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes two descriptors and flags and returns a new
    // descriptor or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just received and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn meminfo(fd: &OwnedFd) -> io::Result<[u32; SK_MEMINFO_VARS]> {
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a writable buffer of `len` bytes that outlives the
    // call, and `len` points to its size, as getsockopt requires.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// Sums `SO_MEMINFO` over every socket `pid` holds.
pub fn of_process(pid: u32) -> io::Result<SocketMemory> {
    let pidfd = pidfd_open(pid)?;
    let mut total = SocketMemory::default();
    for (n, path) in
        atunnel_host::proc_dir::numbered_entries::<libc::c_int>(format!("/proc/{pid}/fd"))?
    {
        let is_socket = std::fs::read_link(path)
            .map(|t| t.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            continue;
        }
        // A socket closed between listing and duplicating is simply gone.
        let Ok(dup) = pidfd_getfd(&pidfd, n) else {
            continue;
        };
        let Ok(info) = meminfo(&dup) else { continue };
        total.sockets += 1;
        total.receive_queued += u64::from(info[0]);
        total.send_queued += u64::from(info[5]);
        total.forward_alloc += u64::from(info[4]);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn queued_bytes_of_our_own_sockets_are_seen() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "pidfd_getfd on a process needs root here"
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (_server, _) = listener.accept().expect("accept");
        let before = of_process(std::process::id()).expect("meminfo");
        client.write_all(&[1u8; 100_000]).expect("write");
        // The server never reads: the bytes sit in its receive queue.
        let after = of_process(std::process::id()).expect("meminfo");
        assert!(after.sockets >= 3);
        assert!(
            after.total() >= before.total() + 100_000,
            "queued bytes not seen: {before:?} -> {after:?}"
        );
    }
}
