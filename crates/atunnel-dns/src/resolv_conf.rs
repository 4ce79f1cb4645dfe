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

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// One line of a generated file, and the resolver it must yield.
    #[derive(Clone, Debug)]
    enum Line {
        Nameserver(IpAddr, String, String, String),
        Other(String),
    }

    fn blank() -> impl Strategy<Value = String> {
        "[ \t]{0,3}"
    }

    fn line() -> impl Strategy<Value = Line> {
        prop_oneof![
            (
                any::<IpAddr>(),
                prop::option::of("[a-z0-9]{1,8}"),
                blank(),
                prop_oneof![
                    Just(String::new()),
                    "[ \t]+[#;][ -~]{0,10}",
                    "[#;][ -~]{0,10}"
                ],
            )
                .prop_map(|(ip, scope, lead, comment)| {
                    let scope = match (ip, scope) {
                        (IpAddr::V6(_), Some(scope)) => format!("%{scope}"),
                        _ => String::new(),
                    };
                    Line::Nameserver(ip, lead, scope, comment)
                }),
            prop_oneof![
                "[#;][ -~]{0,30}",
                "(search|domain|options) [ -~]{0,30}",
                "[ -~]{0,30}",
                "nameserver[ \t]*",
                "nameserver [^0-9a-fA-F:. \t#;\n\r]{1,10}",
            ]
            .prop_map(Line::Other),
        ]
    }

    fn render(lines: &[Line]) -> (String, Vec<SocketAddr>) {
        let mut text = String::new();
        let mut want = Vec::new();
        for l in lines {
            match l {
                Line::Nameserver(ip, lead, scope, comment) => {
                    text.push_str(&format!("{lead}nameserver {ip}{scope}{comment}\n"));
                    want.push(SocketAddr::new(*ip, 53));
                }
                Line::Other(other) => {
                    // A generated "other" line must not itself be a
                    // nameserver line with an address.
                    let words: Vec<&str> = other
                        .split(['#', ';'])
                        .next()
                        .unwrap_or("")
                        .split_whitespace()
                        .collect();
                    if words.first() == Some(&"nameserver")
                        && words.get(1).is_some_and(|w| {
                            w.split('%')
                                .next()
                                .is_some_and(|a| a.parse::<IpAddr>().is_ok())
                        })
                    {
                        continue;
                    }
                    text.push_str(other);
                    text.push('\n');
                }
            }
        }
        (text, want)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_text_never_panics_and_yields_only_port_53(text in "\\PC{0,200}") {
            for resolver in parse(&text, Path::new("fuzz.conf")) {
                prop_assert_eq!(resolver.port(), 53);
                prop_assert!(text.contains("nameserver"));
            }
        }

        #[test]
        fn every_nameserver_line_is_found_in_order_and_nothing_else(
            lines in prop::collection::vec(line(), 0..12),
        ) {
            let (text, want) = render(&lines);
            prop_assert_eq!(parse(&text, Path::new("fuzz.conf")), want);
            // CRLF files read the same.
            prop_assert_eq!(
                parse(&text.replace('\n', "\r\n"), Path::new("fuzz.conf")),
                parse(&text, Path::new("fuzz.conf"))
            );
        }
    }
}
