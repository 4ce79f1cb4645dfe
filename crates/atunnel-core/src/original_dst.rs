//! The destination a redirected connection was originally addressed to.
//!
//! nftables `redirect` rewrites the destination to our listener; conntrack
//! keeps the original, which `SO_ORIGINAL_DST` (IPv4) or
//! `IP6T_SO_ORIGINAL_DST` (IPv6) returns. The family is chosen from the local
//! address, so a dual-stack listener receiving IPv4 (a v4-mapped local
//! address) asks the IPv4 table.

use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::SockRef;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum OriginalDstError {
    #[error("connection to {local} was not redirected (no conntrack NAT entry): {source}")]
    NotRedirected {
        local: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("original destination of connection to {local} has port 0")]
    ZeroPort { local: SocketAddr },
    #[error("reading original destination of connection to {local}: {source}")]
    Io {
        local: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Returns the original destination of a redirected connection.
pub fn original_dst(stream: &TcpStream) -> Result<SocketAddr, OriginalDstError> {
    let local = local_addr(stream)?;
    let addr = ask(stream, asks_ipv4_table(local)).map_err(|e| lookup_error(local, e))?;
    nonzero_port(local, addr)
}

/// [`original_dst`] of a connection accepted from `peer` (the address
/// accept returned): a connection's two ends are of one family, v4-mapped
/// included, so the table is chosen from the peer and no getsockname is
/// made for it. The local address is read only to name it in an error.
pub fn original_dst_from(
    stream: &TcpStream,
    peer: SocketAddr,
) -> Result<SocketAddr, OriginalDstError> {
    match ask(stream, asks_ipv4_table(peer)) {
        Ok(addr) if addr.port() != 0 => Ok(addr),
        asked => {
            let local = local_addr(stream)?;
            nonzero_port(local, asked.map_err(|e| lookup_error(local, e))?)
        }
    }
}

fn local_addr(stream: &TcpStream) -> Result<SocketAddr, OriginalDstError> {
    stream.local_addr().map_err(|source| OriginalDstError::Io {
        local: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

/// Asks conntrack's IPv4 or IPv6 table.
fn ask(stream: &TcpStream, ipv4: bool) -> io::Result<SocketAddr> {
    let sock = SockRef::from(stream);
    let addr = if ipv4 {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    }?;
    addr.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "original destination is not an IP address",
        )
    })
}

/// Whether conntrack's IPv4 table (`SO_ORIGINAL_DST`) holds the connection
/// accepted on `local`: an IPv4 address, or a v4-mapped one (an IPv4 peer of
/// a dual-stack listener); otherwise the IPv6 table (`IP6T_SO_ORIGINAL_DST`).
fn asks_ipv4_table(local: SocketAddr) -> bool {
    match local.ip() {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

fn lookup_error(local: SocketAddr, source: io::Error) -> OriginalDstError {
    match source.raw_os_error() {
        // ENOENT: conntrack has no NAT entry. ENOPROTOOPT: the NAT table that
        // answers this option is not loaded, so nothing can have redirected.
        Some(libc::ENOENT) | Some(libc::ENOPROTOOPT) => {
            OriginalDstError::NotRedirected { local, source }
        }
        _ => OriginalDstError::Io { local, source },
    }
}

/// Port 0 cannot be dialed: the answer names no real destination.
fn nonzero_port(local: SocketAddr, original: SocketAddr) -> Result<SocketAddr, OriginalDstError> {
    if original.port() == 0 {
        return Err(OriginalDstError::ZeroPort { local });
    }
    Ok(original)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpSocket};

    async fn accepted_via(listen: &str, dial: SocketAddr) -> TcpStream {
        let listener = TcpListener::bind(listen).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let target = SocketAddr::new(dial.ip(), port);
        let (_c, s) = tokio::join!(TcpStream::connect(target), listener.accept());
        std::mem::forget(_c);
        s.expect("accept").0
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn the_table_asked_follows_the_local_address_family() {
        assert!(asks_ipv4_table(addr("127.0.0.1:8080")));
        // An IPv4 peer of a dual-stack listener: conntrack has it as IPv4.
        assert!(asks_ipv4_table(addr("[::ffff:127.0.0.1]:8080")));
        assert!(!asks_ipv4_table(addr("[::1]:8080")));
        // IPv4-compatible (deprecated, not mapped) is IPv6 to conntrack.
        assert!(!asks_ipv4_table(addr("[::127.0.0.1]:8080")));
    }

    #[test]
    fn an_original_destination_with_port_zero_is_an_error() {
        let local = addr("127.0.0.1:15001");
        let err = nonzero_port(local, addr("192.0.2.10:0")).expect_err("port 0");
        assert!(
            matches!(err, OriginalDstError::ZeroPort { local: l } if l == local),
            "{err:?}"
        );
        assert!(err.to_string().contains("port 0"), "{err}");
        assert_eq!(
            nonzero_port(local, addr("[2001:db8::1]:443")).expect("port 443"),
            addr("[2001:db8::1]:443")
        );
    }

    #[test]
    fn only_a_missing_nat_entry_or_table_means_not_redirected() {
        let local = addr("127.0.0.1:15001");
        for errno in [libc::ENOENT, libc::ENOPROTOOPT] {
            let err = lookup_error(local, io::Error::from_raw_os_error(errno));
            assert!(
                matches!(err, OriginalDstError::NotRedirected { .. }),
                "{errno}: {err:?}"
            );
        }
        let err = lookup_error(local, io::Error::from_raw_os_error(libc::EBADF));
        assert!(matches!(err, OriginalDstError::Io { .. }), "{err:?}");
    }

    /// `s` has no original destination: the kernel says ENOENT.
    fn is_not_redirected(s: &TcpStream) {
        match original_dst(s).expect_err("not redirected") {
            OriginalDstError::NotRedirected { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("expected NotRedirected, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unredirected_ipv4_connection_is_a_clear_error() {
        let s = accepted_via("127.0.0.1:0", "127.0.0.1:0".parse().expect("addr")).await;
        is_not_redirected(&s);
    }

    #[tokio::test]
    async fn unredirected_v4_mapped_connection_asks_the_ipv4_table() {
        // A dual-stack listener sees IPv4 peers with v4-mapped local addresses.
        let sock = TcpSocket::new_v6().expect("v6 socket");
        socket2::SockRef::from(&sock)
            .set_only_v6(false)
            .expect("dual stack");
        sock.bind("[::]:0".parse().expect("addr")).expect("bind");
        let listener = sock.listen(8).expect("listen");
        let port = listener.local_addr().expect("addr").port();
        let (c, s) = tokio::join!(TcpStream::connect(("127.0.0.1", port)), listener.accept());
        let _c = c.expect("connect");
        let (s, _) = s.expect("accept");
        let local = s.local_addr().expect("local");
        assert!(
            matches!(local.ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()),
            "{local}"
        );
        assert!(asks_ipv4_table(local), "{local}");
        // The peer accept gave is v4-mapped too: it picks the same table.
        let peer = s.peer_addr().expect("peer");
        assert!(asks_ipv4_table(peer), "{peer}");
        is_not_redirected(&s);
        match original_dst_from(&s, peer).expect_err("not redirected") {
            OriginalDstError::NotRedirected { local: l, source } => {
                assert_eq!(l, local);
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("expected NotRedirected, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unredirected_ipv6_connection_is_a_clear_error() {
        let s = accepted_via("[::1]:0", "[::1]:0".parse().expect("addr")).await;
        let err = original_dst(&s).expect_err("not redirected");
        assert!(
            matches!(err, OriginalDstError::NotRedirected { .. }),
            "{err:?}"
        );
    }
}
