//! A NETLINK_NETFILTER socket speaking nf_tables: a batch sent and every
//! message's acknowledgement read, or a dump read to its end. The socket
//! speaks for the namespace it was created in, so it is made, used and
//! closed within one call on the calling thread.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::wire::{self, Message, NLM_F_ACK, NLMSG_DONE, NLMSG_ERROR};

/// How long the kernel may take to answer. It answers a batch within the
/// send call (nfnetlink processes it synchronously), so this only bounds a
/// kernel that never answers, rather than pacing anything.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Larger than any datagram the kernel sends: dumps are built in skbs of
/// at most 32 KiB, acknowledgements echo one request (< 1 KiB here).
const RECV_BUF: usize = 64 * 1024;

pub(crate) struct NfSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NfSocket {
    pub(crate) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)
            .map_err(|e| context(e, "open a NETLINK_NETFILTER socket"))?;
        socket
            .bind_auto()
            .map_err(|e| context(e, "bind the netlink socket"))?;
        socket2::SockRef::from(&socket).set_read_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Self {
            socket,
            seq: 1,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Sends `ops` (each named for errors) as one batch, every message
    /// with NLM_F_ACK, and waits for every acknowledgement. Any error fails
    /// the whole batch (the kernel then applies none of it); the error
    /// names the first object the kernel refused.
    pub(crate) fn transact(&mut self, ops: &[(String, Message)]) -> io::Result<()> {
        let begin = self.seq;
        let batch = wire::batch(ops.iter().map(|(_, m)| m), begin, NLM_F_ACK);
        // Sequence numbers of the messages, to the object each one adds.
        let mut pending: BTreeMap<u32, &str> = ops
            .iter()
            .enumerate()
            .map(|(i, (what, _))| (begin.wrapping_add(1 + i as u32), what.as_str()))
            .collect();
        self.seq = begin.wrapping_add(ops.len() as u32 + 2);
        let sent = self
            .socket
            .send(&batch, 0)
            .map_err(|e| context(e, "send the nftables batch"))?;
        if sent != batch.len() {
            return Err(io::Error::other(format!(
                "nftables: sent {sent} of the batch's {} bytes",
                batch.len()
            )));
        }
        let mut refused: Option<(String, i32)> = None;
        while !pending.is_empty() {
            let n = self.recv()?;
            for reply in wire::replies(&self.buf[..n])? {
                if reply.ty != NLMSG_ERROR {
                    continue;
                }
                let errno = wire::ack_errno(reply.payload)?;
                let what = match pending.remove(&reply.seq) {
                    Some(what) => what.to_string(),
                    // An error on BATCH_BEGIN: the kernel refused the batch
                    // as a whole or failed to commit it; acks of the other
                    // messages may or may not follow, so stop waiting.
                    None if reply.seq == begin && errno != 0 => {
                        pending.clear();
                        "commit the batch".to_string()
                    }
                    None => continue,
                };
                if errno != 0 && refused.is_none() {
                    refused = Some((what, errno));
                }
            }
        }
        match refused {
            None => Ok(()),
            Some((what, errno)) => Err(kernel_error(&what, errno)),
        }
    }

    /// Every object of the `NFT_MSG_GET*` kind `msg`, as payloads of the
    /// kernel's messages, in the kernel's order.
    pub(crate) fn dump(&mut self, msg: u16, what: &str) -> io::Result<Vec<Vec<u8>>> {
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        let mut request = Vec::new();
        Message::dump(msg).encode(seq, 0, &mut request);
        self.socket
            .send(&request, 0)
            .map_err(|e| context(e, &format!("request a dump of {what}")))?;
        let mut out = Vec::new();
        loop {
            let n = self.recv()?;
            for reply in wire::replies(&self.buf[..n])? {
                if reply.seq != seq {
                    continue;
                }
                match reply.ty {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let errno = wire::ack_errno(reply.payload)?;
                        return Err(kernel_error(&format!("dump {what}"), errno));
                    }
                    _ => out.push(reply.payload.to_vec()),
                }
            }
        }
    }

    /// One datagram into `buf`; its length.
    fn recv(&mut self) -> io::Result<usize> {
        let mut slice = &mut self.buf[..];
        let n = self.socket.recv(&mut slice, libc::MSG_TRUNC).map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("nftables: no answer from the kernel in {ANSWER_TIMEOUT:?}"),
                )
            } else {
                context(e, "receive from the netlink socket")
            }
        })?;
        if n > self.buf.len() {
            return Err(io::Error::other(format!(
                "nftables: a {n}-byte answer overflowed the {RECV_BUF}-byte buffer"
            )));
        }
        Ok(n)
    }
}

fn context(e: io::Error, op: &str) -> io::Error {
    io::Error::new(e.kind(), format!("nftables: {op}: {e}"))
}

/// The kernel's refusal of `what`, with the errno's name and meaning
/// (e.g. "add chain inet atunnel input: ENOENT: No such file or directory").
fn kernel_error(what: &str, errno: i32) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(
        os.kind(),
        format!(
            "nftables: the kernel refused to {what}: {}",
            nix::errno::Errno::from_raw(errno)
        ),
    )
}
