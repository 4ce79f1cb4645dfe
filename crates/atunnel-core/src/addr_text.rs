//! Addresses written as text on hot paths (a CONNECT authority per egress
//! tunnel, X-Forwarded-For and the actor's URI per ingress request): IPv4
//! by its four numbers with `itoa`, not through `fmt`, whose `Display` for
//! an address took some 1,900 instructions (the cost scenario's profiles,
//! `docs/design.md`). IPv6 goes through `fmt`: rare here, and its
//! compression rules are not worth writing again.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

/// Appends `ip` as its `Display` writes it; an IPv4-mapped IPv6 address as
/// the IPv4 address it maps (what a dual-stack listener reports).
pub fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(digits.format(octet).as_bytes());
            }
        }
        // Writing to a Vec cannot fail.
        v6 => drop(write!(out, "{v6}")),
    }
}

/// Appends `addr` as its `Display` writes it (`192.0.2.1:443`,
/// `[2001:db8::1]:443`), an IPv4-mapped address as written, not mapped.
pub fn push_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => push_ip(out, IpAddr::V4(*v4.ip())),
        v6 => {
            drop(write!(out, "{v6}"));
            return;
        }
    }
    out.push(b':');
    out.extend_from_slice(itoa::Buffer::new().format(addr.port()).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0:1",
            "255.255.255.255:65535",
            "10.20.3.4:80",
            "[2001:db8::1]:443",
            "[::ffff:10.0.0.1]:7",
            "[fe80::1%3]:9",
        ] {
            let addr: SocketAddr = a.parse().expect("addr");
            let mut out = Vec::new();
            push_socket_addr(&mut out, addr);
            assert_eq!(String::from_utf8(out).expect("ascii"), addr.to_string());
            let mut ip = Vec::new();
            push_ip(&mut ip, addr.ip());
            assert_eq!(
                String::from_utf8(ip).expect("ascii"),
                addr.ip().to_canonical().to_string()
            );
        }
    }
}
