//! Socket options every accepted or dialed TCP socket gets.
//!
//! `TCP_NOTSENT_LOWAT` keeps data behind a slow reader upstream, under the
//! relay's flow control, instead of in the kernel send queue. Fixed buffer
//! sizes are off by default because they disable autotuning and cut
//! throughput at a few ms of round trip.
//!
//! A listener's options are not reliably inherited by what it accepts
//! (MPTCP, for one, drops them), so an accepted socket gets its own unless
//! [`ListenerOptions`] has seen its listener pass them on: then the four
//! setsockopt calls of each accepted connection are not made at all.
//!
//! Network-side sockets also find a peer that vanished without a FIN (a
//! node gone, a NAT or conntrack entry expired): TCP keepalive probes an
//! idle connection, and `TCP_USER_TIMEOUT` aborts one whose data (or zero
//! window) goes unacknowledged. Sandbox-side sockets need neither: their
//! peer is a local process, whose end the kernel reports.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Default `TCP_NOTSENT_LOWAT`: 16 KiB of unsent data per socket.
pub const DEFAULT_NOTSENT_LOWAT: u32 = 16 * 1024;

/// TCP keepalive on network-side sockets: the first probe after 15 s idle
/// (the reference tunnel's keepalive), then every 5 s, and after 3 unanswered
/// probes the connection is dead, so an idle connection to a vanished peer
/// ends about 30 s after its last traffic. A probe is an empty segment every
/// 15 s of idleness, nothing in userspace: hibernated connections stay so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub probes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(15),
            interval: Duration::from_secs(5),
            probes: 3,
        }
    }
}

/// `TCP_USER_TIMEOUT` on network-side sockets: data (or a zero window, which
/// Linux bounds the same way) unacknowledged this long aborts the
/// connection. 60 s, the relay's stalled-write bound, so the kernel gives up
/// on a peer no sooner than the relay would on a reader that stopped.
pub const DEFAULT_USER_TIMEOUT: Duration = Duration::from_secs(60);

/// Options applied to one kind of TCP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// `TCP_NOTSENT_LOWAT` in bytes; `None` leaves the kernel default.
    pub notsent_lowat: Option<u32>,
    /// Fixed `SO_SNDBUF` in bytes; `None` keeps autotuning.
    pub send_buffer: Option<usize>,
    /// Fixed `SO_RCVBUF` in bytes; `None` keeps autotuning.
    pub recv_buffer: Option<usize>,
    /// TCP keepalive; `None` leaves it off.
    pub keepalive: Option<Keepalive>,
    /// `TCP_USER_TIMEOUT`; `None` leaves the kernel's retransmission limits.
    pub user_timeout: Option<Duration>,
}

impl Default for SocketOptions {
    /// Network-side sockets: the lowat, autotuned buffers, keepalive and
    /// the user timeout.
    fn default() -> Self {
        Self {
            notsent_lowat: Some(DEFAULT_NOTSENT_LOWAT),
            send_buffer: None,
            recv_buffer: None,
            keepalive: Some(Keepalive::default()),
            user_timeout: Some(DEFAULT_USER_TIMEOUT),
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
    /// [`DEFAULT_SANDBOX_BUFFER`] buffers; no keepalive or user timeout.
    pub fn sandbox_default() -> Self {
        Self {
            send_buffer: Some(DEFAULT_SANDBOX_BUFFER),
            recv_buffer: Some(DEFAULT_SANDBOX_BUFFER),
            keepalive: None,
            user_timeout: None,
            ..Self::default()
        }
    }

    /// From the command-line convention: a negative lowat leaves the kernel
    /// default, zero buffer sizes mean "not set"; no keepalive or user
    /// timeout (the caller sets those).
    pub fn from_flags(notsent_lowat: i64, send_buffer: usize, recv_buffer: usize) -> Self {
        Self {
            notsent_lowat: u32::try_from(notsent_lowat).ok(),
            send_buffer: (send_buffer > 0).then_some(send_buffer),
            recv_buffer: (recv_buffer > 0).then_some(recv_buffer),
            keepalive: None,
            user_timeout: None,
        }
    }

    /// Applies the options to an accepted or connected socket. Nagle is
    /// turned off: the relay writes whole chunks and latency matters more.
    pub fn apply(&self, stream: &TcpStream) -> io::Result<()> {
        self.set(SockRef::from(stream))
    }

    fn set(&self, sock: SockRef<'_>) -> io::Result<()> {
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
        if let Some(k) = self.keepalive {
            let probes = TcpKeepalive::new()
                .with_time(k.idle)
                .with_interval(k.interval)
                .with_retries(k.probes);
            sock.set_tcp_keepalive(&probes)?;
        }
        if let Some(t) = self.user_timeout {
            sock.set_tcp_user_timeout(Some(t))?;
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

/// How many accepted sockets [`ListenerOptions`] compares with their
/// listener before it stops looking and sets the options on each: one
/// accepted before the listener had its options may differ, every one of a
/// kernel that does not pass them on does.
const INHERIT_CHECKS: u8 = 4;

/// Socket options for what one listener accepts, set on the listener so
/// that each accepted socket inherits them (Linux copies a TCP listener's
/// `TCP_NODELAY`, `TCP_NOTSENT_LOWAT`, buffer sizes and keepalive into the
/// sockets it accepts) instead of taking four setsockopt calls of its own.
/// Whether the kernel does is checked, not assumed: accepted sockets are
/// compared with the listener (getsockopt) until one matches, and until then
/// each gets the options set on it as before.
#[derive(Debug)]
pub struct ListenerOptions {
    options: SocketOptions,
    /// What the listener reports, to compare accepted sockets with; `None`
    /// if it could not be set or read (then every socket gets its own).
    listener: Option<ReadBack>,
    inherits: Inherits,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inherits {
    /// Not known yet; this many checks are left.
    Checking(u8),
    Yes,
    No,
}

impl ListenerOptions {
    /// Sets `options` on `listener` (before it accepts a socket of ours).
    pub fn new(options: SocketOptions, listener: &TcpListener) -> Self {
        let set = options
            .set(SockRef::from(listener))
            .and_then(|()| read_back_sock(SockRef::from(listener)));
        let (listener, inherits) = match set {
            Ok(back) => (Some(back), Inherits::Checking(INHERIT_CHECKS)),
            Err(e) => {
                tracing::debug!(error = %e, "socket options on the listener");
                (None, Inherits::No)
            }
        };
        Self {
            options,
            listener,
            inherits,
        }
    }

    /// The options an accepted socket still needs set on it: `None` once
    /// its listener is known to have passed them on.
    pub fn for_accepted(&mut self, accepted: &TcpStream) -> Option<SocketOptions> {
        match self.inherits {
            Inherits::Yes => None,
            Inherits::No => Some(self.options),
            Inherits::Checking(left) => {
                let inherited = read_back(accepted).ok();
                if inherited.is_some() && inherited == self.listener {
                    self.inherits = Inherits::Yes;
                    return None;
                }
                self.inherits = match left {
                    0 | 1 => Inherits::No,
                    n => Inherits::Checking(n - 1),
                };
                Some(self.options)
            }
        }
    }
}

/// The options as the kernel reports them, for tests and /stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBack {
    pub notsent_lowat: u32,
    pub send_buffer: usize,
    pub recv_buffer: usize,
    pub nodelay: bool,
    /// `None` when keepalive is off.
    pub keepalive: Option<Keepalive>,
    /// `None` when not set.
    pub user_timeout: Option<Duration>,
}

pub fn read_back(stream: &TcpStream) -> io::Result<ReadBack> {
    read_back_sock(SockRef::from(stream))
}

fn read_back_sock(sock: SockRef<'_>) -> io::Result<ReadBack> {
    Ok(ReadBack {
        notsent_lowat: sock.tcp_notsent_lowat()?,
        send_buffer: sock.send_buffer_size()?,
        recv_buffer: sock.recv_buffer_size()?,
        nodelay: sock.tcp_nodelay()?,
        keepalive: match sock.keepalive()? {
            false => None,
            true => Some(Keepalive {
                idle: sock.tcp_keepalive_time()?,
                interval: sock.tcp_keepalive_interval()?,
                probes: sock.tcp_keepalive_retries()?,
            }),
        },
        user_timeout: sock.tcp_user_timeout()?,
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
            assert_eq!((rb.keepalive, rb.user_timeout), (None, None));
        }
    }

    #[tokio::test]
    async fn network_sockets_get_keepalive_and_the_user_timeout_and_sandbox_ones_do_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let network = SocketOptions::default();
        let (dialed, accepted) = tokio::join!(
            network.connect(addr, Duration::from_secs(5)),
            listener.accept()
        );
        let (dialed, (accepted, _)) = (dialed.expect("dial"), accepted.expect("accept"));
        network.apply(&accepted).expect("apply");
        for s in [&dialed, &accepted] {
            let rb = read_back(s).expect("getsockopt");
            assert_eq!(rb.keepalive, Some(Keepalive::default()));
            assert_eq!(rb.user_timeout, Some(DEFAULT_USER_TIMEOUT));
        }
        let sandbox = SocketOptions::sandbox_default();
        let dialed = sandbox
            .connect(addr, Duration::from_secs(5))
            .await
            .expect("dial");
        let rb = read_back(&dialed).expect("getsockopt");
        assert_eq!((rb.keepalive, rb.user_timeout), (None, None));
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

    /// Dials `addr` and accepts the connection on `listener`.
    async fn accept_one(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let addr = listener.local_addr().expect("addr");
        let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (dialed.expect("dial"), accepted.expect("accept").0)
    }

    /// What a socket given `opts` reports (Linux doubles buffer sizes).
    fn assert_has(s: &TcpStream, opts: SocketOptions) {
        let rb = read_back(s).expect("getsockopt");
        assert_eq!(Some(rb.notsent_lowat), opts.notsent_lowat);
        assert!(rb.nodelay);
        assert_eq!(Some(rb.send_buffer), opts.send_buffer.map(|n| 2 * n));
        assert_eq!(Some(rb.recv_buffer), opts.recv_buffer.map(|n| 2 * n));
    }

    #[tokio::test]
    async fn sockets_a_listener_accepts_inherit_its_options_and_need_no_setsockopt() {
        let opts = SocketOptions::from_flags(4096, 64 * 1024, 96 * 1024);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut options = ListenerOptions::new(opts, &listener);
        for _ in 0..3 {
            let (_dialed, accepted) = accept_one(&listener).await;
            assert_eq!(options.for_accepted(&accepted), None);
            assert_has(&accepted, opts);
        }
    }

    #[tokio::test]
    async fn sockets_accepted_before_the_listener_had_its_options_get_them_set() {
        let opts = SocketOptions::from_flags(4096, 64 * 1024, 96 * 1024);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Established (in the accept queue) before the listener has them.
        let mut early = Vec::new();
        for _ in 0..INHERIT_CHECKS + 1 {
            early.push(TcpStream::connect(addr).await.expect("dial"));
        }
        let mut options = ListenerOptions::new(opts, &listener);
        for _ in 0..INHERIT_CHECKS + 1 {
            let (accepted, _) = listener.accept().await.expect("accept");
            let set = options.for_accepted(&accepted).expect("options to set");
            set.apply(&accepted).expect("apply");
            assert_has(&accepted, opts);
        }
        // Checked as many as it checks and none matched: it stops looking
        // and sets them on every socket, inherited or not.
        let (_dialed, accepted) = accept_one(&listener).await;
        assert_eq!(options.for_accepted(&accepted), Some(opts));
    }

    #[tokio::test]
    async fn one_socket_accepted_early_does_not_stop_the_next_from_inheriting() {
        let opts = SocketOptions::sandbox_default();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _early = TcpStream::connect(addr).await.expect("dial");
        let mut options = ListenerOptions::new(opts, &listener);
        let (accepted, _) = listener.accept().await.expect("accept");
        assert_eq!(options.for_accepted(&accepted), Some(opts));
        let (_dialed, accepted) = accept_one(&listener).await;
        assert_eq!(options.for_accepted(&accepted), None);
        assert_has(&accepted, opts);
    }
}
