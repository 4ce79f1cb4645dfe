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
    let local = stream.local_addr().map_err(|source| OriginalDstError::Io {
        local: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let sock = SockRef::from(stream);
    let is_v4 = match local.ip() {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    };
    let result = if is_v4 {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    let addr = result.map_err(|source| match source.raw_os_error() {
        // ENOENT: conntrack has no NAT entry. ENOPROTOOPT: the NAT table that
        // answers this option is not loaded, so nothing can have redirected.
        Some(libc::ENOENT) | Some(libc::ENOPROTOOPT) => {
            OriginalDstError::NotRedirected { local, source }
        }
        _ => OriginalDstError::Io { local, source },
    })?;
    let addr = addr.as_socket().ok_or_else(|| OriginalDstError::Io {
        local,
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            "original destination is not an IP address",
        ),
    })?;
    if addr.port() == 0 {
        return Err(OriginalDstError::ZeroPort { local });
    }
    Ok(addr)
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

    #[tokio::test]
    async fn unredirected_ipv4_connection_is_a_clear_error() {
        let s = accepted_via("127.0.0.1:0", "127.0.0.1:0".parse().expect("addr")).await;
        let err = original_dst(&s).expect_err("not redirected");
        match err {
            OriginalDstError::NotRedirected { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("expected NotRedirected, got {other:?}"),
        }
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
        assert!(
            matches!(s.local_addr().expect("local").ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
        );
        let err = original_dst(&s).expect_err("not redirected");
        match err {
            OriginalDstError::NotRedirected { source, .. } => {
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
