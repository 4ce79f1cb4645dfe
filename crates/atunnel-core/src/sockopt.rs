//! Socket options every accepted or dialed TCP socket gets.
//!
//! `TCP_NOTSENT_LOWAT` keeps data behind a slow reader upstream, under the
//! relay's flow control, instead of in the kernel send queue. It is set on
//! each accepted socket itself: a listener's value is not reliably inherited
//! (MPTCP, for one, drops it). Fixed buffer sizes are off by default because
//! they disable autotuning and cut throughput at a few ms of round trip.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::{TcpSocket, TcpStream};

/// Default `TCP_NOTSENT_LOWAT`: 16 KiB of unsent data per socket.
pub const DEFAULT_NOTSENT_LOWAT: u32 = 16 * 1024;

/// Options applied to one kind of TCP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// `TCP_NOTSENT_LOWAT` in bytes; `None` leaves the kernel default.
    pub notsent_lowat: Option<u32>,
    /// Fixed `SO_SNDBUF` in bytes; `None` keeps autotuning.
    pub send_buffer: Option<usize>,
    /// Fixed `SO_RCVBUF` in bytes; `None` keeps autotuning.
    pub recv_buffer: Option<usize>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        Self {
            notsent_lowat: Some(DEFAULT_NOTSENT_LOWAT),
            send_buffer: None,
            recv_buffer: None,
        }
    }
}

/// Default fixed `SO_SNDBUF` and `SO_RCVBUF` of sandbox-side sockets (to
/// the actors, over veth: microseconds of round trip, so small buffers cost
/// no throughput). 64 KiB measured: egress-tcp 600-636 MB/s vs 472-630 with
/// autotuning, an actor that stops reading pins 160 KiB of kernel memory
/// instead of 641 KiB (lowat off), and a router that stops reading 166 KiB
/// per connection instead of 1.4 MiB.
pub const DEFAULT_SANDBOX_BUFFER: usize = 64 * 1024;

impl SocketOptions {
    /// The default for sandbox-side sockets: the lowat, and fixed
    /// [`DEFAULT_SANDBOX_BUFFER`] buffers.
    pub fn sandbox_default() -> Self {
        Self {
            send_buffer: Some(DEFAULT_SANDBOX_BUFFER),
            recv_buffer: Some(DEFAULT_SANDBOX_BUFFER),
            ..Self::default()
        }
    }

    /// From the command-line convention: a negative lowat leaves the kernel
    /// default, zero buffer sizes mean "not set".
    pub fn from_flags(notsent_lowat: i64, send_buffer: usize, recv_buffer: usize) -> Self {
        Self {
            notsent_lowat: u32::try_from(notsent_lowat).ok(),
            send_buffer: (send_buffer > 0).then_some(send_buffer),
            recv_buffer: (recv_buffer > 0).then_some(recv_buffer),
        }
    }

    /// Applies the options to an accepted or connected socket. Nagle is
    /// turned off: the relay writes whole chunks and latency matters more.
    pub fn apply(&self, stream: &TcpStream) -> io::Result<()> {
        let sock = SockRef::from(stream);
        sock.set_tcp_nodelay(true)?;
        if let Some(lowat) = self.notsent_lowat {
            sock.set_tcp_notsent_lowat(lowat)?;
        }
        if let Some(n) = self.send_buffer {
            sock.set_send_buffer_size(n)?;
        }
        if let Some(n) = self.recv_buffer {
            sock.set_recv_buffer_size(n)?;
        }
        Ok(())
    }

    /// Dials `addr` within `timeout`. Buffer sizes are set before connecting
    /// so the window scale in the SYN matches them.
    pub async fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(n) = self.send_buffer {
            socket.set_send_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        if let Some(n) = self.recv_buffer {
            socket.set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        let stream = tokio::time::timeout(timeout, socket.connect(addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {addr} took longer than {timeout:?}"),
                )
            })??;
        self.apply(&stream)?;
        Ok(stream)
    }
}

/// The options as the kernel reports them, for tests and /stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBack {
    pub notsent_lowat: u32,
    pub send_buffer: usize,
    pub recv_buffer: usize,
    pub nodelay: bool,
}

pub fn read_back(stream: &TcpStream) -> io::Result<ReadBack> {
    let sock = SockRef::from(stream);
    Ok(ReadBack {
        notsent_lowat: sock.tcp_notsent_lowat()?,
        send_buffer: sock.send_buffer_size()?,
        recv_buffer: sock.recv_buffer_size()?,
        nodelay: sock.tcp_nodelay()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn accepted_and_dialed_sockets_carry_the_options() {
        let opts = SocketOptions::from_flags(4096, 64 * 1024, 96 * 1024);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (dialed, accepted) = tokio::join!(
            opts.connect(addr, Duration::from_secs(5)),
            listener.accept()
        );
        let dialed = dialed.expect("dial");
        let (accepted, _) = accepted.expect("accept");
        opts.apply(&accepted).expect("apply");
        for s in [&dialed, &accepted] {
            let rb = read_back(s).expect("getsockopt");
            assert_eq!(rb.notsent_lowat, 4096);
            assert!(rb.nodelay);
            // Linux doubles the requested size for bookkeeping overhead.
            assert_eq!(rb.send_buffer, 2 * 64 * 1024);
            assert_eq!(rb.recv_buffer, 2 * 96 * 1024);
        }
    }

    #[tokio::test]
    async fn negative_lowat_leaves_the_kernel_default() {
        let opts = SocketOptions::from_flags(-1, 0, 0);
        assert_eq!(opts.notsent_lowat, None);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dialed = opts
            .connect(addr, Duration::from_secs(5))
            .await
            .expect("dial");
        // 0 on the socket means "not set: use net.ipv4.tcp_notsent_lowat".
        assert_eq!(read_back(&dialed).expect("getsockopt").notsent_lowat, 0);
    }
}
