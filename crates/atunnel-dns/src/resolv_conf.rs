//! Finding the worker's resolvers in a `resolv.conf`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use crate::DnsError;

/// Resolvers are always reached on the standard port: `resolv.conf` has no
/// way to say otherwise.
const DNS_PORT: u16 = 53;

/// Reads the `nameserver` lines of a `resolv.conf` (for example
/// `/etc/resolv.conf` of the worker) as upstream addresses on port 53, in
/// file order.
///
/// Lines starting with `#` or `;` are comments, as is anything after `#` or
/// `;` on a line; `search`, `domain`, `options` and other lines are ignored.
/// An IPv6 address may carry a scope (`fe80::1%eth0`): the scope is stripped
/// and the address kept. Turning an interface name into a scope ID is left
/// out on purpose (it would tie parsing to the namespace it runs in); the
/// cost is that a link-local resolver cannot be sent to, so the relay skips
/// it for the next one. A `nameserver` line whose address does not parse is skipped with
/// a warning, as the C library does. A file with no usable `nameserver` line
/// is an error naming the file.
pub fn resolvers_from_resolv_conf(path: &Path) -> Result<Vec<SocketAddr>, DnsError> {
    let text = std::fs::read_to_string(path).map_err(|source| DnsError::ReadResolvConf {
        path: path.to_path_buf(),
        source,
    })?;
    let resolvers = parse(&text, path);
    if resolvers.is_empty() {
        return Err(DnsError::NoNameserver {
            path: path.to_path_buf(),
        });
    }
    Ok(resolvers)
}

fn parse(text: &str, path: &Path) -> Vec<SocketAddr> {
    let mut resolvers = Vec::new();
    for (index, line) in text.lines().enumerate() {
        // Neither `#` nor `;` can occur in an address, so cutting at the
        // first one handles whole-line and trailing comments alike.
        let line = match line.find(['#', ';']) {
            Some(at) => &line[..at],
            None => line,
        };
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(word) = words.next() else {
            tracing::warn!(file = %path.display(), line = index + 1, "nameserver line without an address");
            continue;
        };
        let address = word
            .split_once('%')
            .map_or(word, |(address, _scope)| address);
        match address.parse::<IpAddr>() {
            Ok(ip) => resolvers.push(SocketAddr::new(ip, DNS_PORT)),
            Err(_) => {
                tracing::warn!(file = %path.display(), line = index + 1, address = word, "ignoring unparsable nameserver");
            }
        }
    }
    resolvers
}
