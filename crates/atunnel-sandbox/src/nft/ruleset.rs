//! The typed description of nftables objects: what [`super::apply`] adds
//! and what [`super::list`] reads back, so a test compares the two directly.
//!
//! Expressions are the kernel's own (nft's `meta l4proto tcp` is two:
//! [`Expr::Meta`] then [`Expr::Cmp`]), each working on register 1: every
//! match here is a load followed by a compare, which needs no other register.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Table holding every rule for one sandbox.
pub const TABLE: &str = "atunnel";

/// The sandbox table's family. `inet` (IPv4 and IPv6 in one table), not
/// `ip`: the veth carries IPv6 link-local addresses, which an `ip` table
/// never sees, and a dual-stack sandbox's IPv6 rules sit in the same chains
/// as the IPv4 ones. An IPv4-only sandbox has one redirect rule, and its
/// input chain accepts IPv4 only, so all IPv6 from the actor (neighbour
/// discovery included) is dropped.
pub const FAMILY: Family = Family::Inet;

/// Longest interface name the kernel takes (IFNAMSIZ less its NUL).
const IFNAME_MAX: usize = 15;
/// `meta iifname` loads IFNAMSIZ bytes, so an exact match compares all 16.
const IFNAMSIZ: usize = 16;
/// Values of `meta nfproto` and `meta l4proto` (linux/netfilter.h, in.h).
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6 neighbour solicitation and advertisement (RFC 4861): without
/// them neither end can find the other's link address.
const ND_NEIGHBOR_SOLICIT: u8 = 135;
const ND_NEIGHBOR_ADVERT: u8 = 136;
/// Offsets in the IPv4 and IPv6 headers and the TCP/UDP/ICMPv6 header.
const IPV4_DADDR: u32 = 16;
const IPV6_DADDR: u32 = 24;
const ICMP_TYPE: u32 = 0;
const L4_SPORT: u32 = 0;
const L4_DPORT: u32 = 2;

/// A set of nftables objects, in the order they are added (tables, then
/// chains, then rules) or were listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: Vec<Table>,
    pub chains: Vec<Chain>,
    pub rules: Vec<Rule>,
}

/// Address families of nftables tables (NFPROTO_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Inet,
    Ip,
    Ip6,
    Other(u8),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub family: Family,
    pub table: String,
    pub name: String,
    /// Where packets enter the chain; `None` for a chain only jumped to.
    pub base: Option<BaseChain>,
}

/// A chain attached to a netfilter hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    /// Lower runs first: dstnat is -100, filter 0.
    pub priority: i32,
    /// The verdict for packets no rule decided.
    pub policy: Verdict,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

/// Netfilter hooks of the ip/ip6/inet families (NF_INET_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
    Other(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub family: Family,
    pub table: String,
    pub chain: String,
    pub exprs: Vec<Expr>,
}

/// One nf_tables expression on register 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// Loads a packet's meta key.
    Meta(MetaKey),
    /// Loads `len` bytes at `offset` from a header.
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
    },
    /// `reg = (reg & mask) ^ xor`, over `mask.len()` bytes.
    Bitwise { mask: Vec<u8>, xor: Vec<u8> },
    /// Ends the rule unless the register's first `data.len()` bytes compare
    /// as `op` to `data`.
    Cmp { op: CmpOp, data: Vec<u8> },
    /// Loads `data`.
    Immediate(Vec<u8>),
    /// Decides the packet's fate.
    Verdict(Verdict),
    /// Redirects to this host, to the port in register 1 (network order).
    Redirect,
    /// An expression this module does not build, by name (listings only).
    Other(String),
}

/// `meta` keys (NFT_META_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKey {
    IifName,
    NfProto,
    L4Proto,
    Other(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadBase {
    Link,
    Network,
    Transport,
    Other(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Neq,
    Other(u32),
}

/// Verdicts (NF_ACCEPT, NF_DROP; the rest, such as jumps, as their code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Other(i32),
}

impl Ruleset {
    /// The ruleset for one gateway namespace (`iface` is its end of the
    /// veth, `net/prefix_len` the sandbox's network, `net6` its IPv6 network
    /// if it is dual-stack):
    /// * nat/prerouting (dstnat priority): the redirect rules: TCP whose
    ///   destination is outside the sandbox network goes to `egress_port`
    ///   (one rule per family);
    /// * filter/input: from the actor, TCP (which after the redirect is
    ///   ours) and DNS over UDP are accepted, over IPv6 (if dual-stack) also
    ///   neighbour solicitations and advertisements; everything else (ICMP,
    ///   other UDP, every IPv6 packet if IPv4 only) dropped;
    /// * filter/forward: nothing is forwarded.
    ///
    /// Without `net6` the messages are byte for byte what nft sends for the
    /// IPv4 ruleset (see wire.rs' tests).
    pub fn sandbox(
        iface: &str,
        net: Ipv4Addr,
        prefix_len: u8,
        net6: Option<(Ipv6Addr, u8)>,
        egress_port: u16,
        dns_port: u16,
    ) -> io::Result<Self> {
        if iface.is_empty() || iface.len() > IFNAME_MAX || iface.contains('\0') {
            return Err(invalid(format!("interface name {iface:?}")));
        }
        if prefix_len > 32 {
            return Err(invalid(format!("prefix length {prefix_len}")));
        }
        let mask = u32::MAX
            .checked_shl(32 - u32::from(prefix_len))
            .unwrap_or(0);
        let net = u32::from(net) & mask;
        let from_actor = || {
            let mut name = iface.as_bytes().to_vec();
            name.resize(IFNAMSIZ, 0);
            [Expr::Meta(MetaKey::IifName), eq(name)]
        };
        let family = |nfproto| [Expr::Meta(MetaKey::NfProto), eq(vec![nfproto])];
        let l4 = |proto| [Expr::Meta(MetaKey::L4Proto), eq(vec![proto])];
        // One family's rules: the same shape for IPv4 and IPv6, but for the
        // destination's offset and width in the network header.
        // Redirects TCP to any address outside the sandbox's link.
        let redirect = |nfproto, daddr_offset, mask: Vec<u8>, net: Vec<u8>| {
            [
                family(nfproto).as_slice(),
                &[
                    Expr::Payload {
                        base: PayloadBase::Network,
                        offset: daddr_offset,
                        len: mask.len() as u32,
                    },
                    Expr::Bitwise {
                        xor: vec![0; mask.len()],
                        mask,
                    },
                    Expr::Cmp {
                        op: CmpOp::Neq,
                        data: net,
                    },
                ],
                &l4(IPPROTO_TCP),
                &[
                    Expr::Immediate(egress_port.to_be_bytes().to_vec()),
                    Expr::Redirect,
                ],
            ]
            .concat()
        };
        // Accepts from the actor: L4 `proto`, and if given, a transport
        // header field at `offset` equal to `value`.
        let accept_in = |nfproto, proto, field: Option<(u32, u32, Vec<u8>)>| {
            let mut exprs = [from_actor().as_slice(), &family(nfproto), &l4(proto)].concat();
            if let Some((offset, len, value)) = field {
                exprs.push(Expr::Payload {
                    base: PayloadBase::Transport,
                    offset,
                    len,
                });
                exprs.push(eq(value));
            }
            exprs.push(Expr::Verdict(Verdict::Accept));
            exprs
        };
        let dns = || Some((L4_DPORT, 2, dns_port.to_be_bytes().to_vec()));
        let rest_dropped = [from_actor().as_slice(), &[Expr::Verdict(Verdict::Drop)]].concat();
        let v4 = NFPROTO_IPV4;
        let mut prerouting = vec![rule(
            TABLE,
            "prerouting",
            redirect(
                v4,
                IPV4_DADDR,
                mask.to_be_bytes().to_vec(),
                net.to_be_bytes().to_vec(),
            ),
        )];
        let mut input = vec![
            rule(TABLE, "input", accept_in(v4, IPPROTO_TCP, None)),
            rule(TABLE, "input", accept_in(v4, IPPROTO_UDP, dns())),
        ];
        if let Some((net6, prefix_len6)) = net6 {
            if prefix_len6 > 128 {
                return Err(invalid(format!("IPv6 prefix length {prefix_len6}")));
            }
            let mask6 = u128::MAX
                .checked_shl(128 - u32::from(prefix_len6))
                .unwrap_or(0);
            let net6 = u128::from(net6) & mask6;
            let v6 = NFPROTO_IPV6;
            prerouting.push(rule(
                TABLE,
                "prerouting",
                redirect(
                    v6,
                    IPV6_DADDR,
                    mask6.to_be_bytes().to_vec(),
                    net6.to_be_bytes().to_vec(),
                ),
            ));
            input.push(rule(TABLE, "input", accept_in(v6, IPPROTO_TCP, None)));
            input.push(rule(TABLE, "input", accept_in(v6, IPPROTO_UDP, dns())));
            // Neighbour discovery: without it the actor cannot resolve the
            // gateway's IPv6 address, and nothing IPv6 arrives.
            for icmp_type in [ND_NEIGHBOR_SOLICIT, ND_NEIGHBOR_ADVERT] {
                let nd = Some((ICMP_TYPE, 1, vec![icmp_type]));
                input.push(rule(TABLE, "input", accept_in(v6, IPPROTO_ICMPV6, nd)));
            }
        }
        input.push(rule(TABLE, "input", rest_dropped));
        Ok(Self {
            tables: vec![table(TABLE)],
            chains: vec![
                base_chain(TABLE, "prerouting", ChainType::Nat, Hook::Prerouting, -100),
                base_chain(TABLE, "input", ChainType::Filter, Hook::Input, 0),
                Chain {
                    base: Some(BaseChain {
                        kind: ChainType::Filter,
                        hook: Hook::Forward,
                        priority: 0,
                        policy: Verdict::Drop,
                    }),
                    ..base_chain(TABLE, "forward", ChainType::Filter, Hook::Forward, 0)
                },
            ],
            rules: [prerouting, input].concat(),
        })
    }

    /// An inet table `table` that black-holes the TCP connection whose peer
    /// port is `port`: packets from it (input, `tcp sport`) and to it
    /// (output, `tcp dport`) are dropped, before the filter priority.
    pub fn drop_tcp_port(table_name: &str, port: u16) -> Self {
        let tcp_port = |offset| {
            vec![
                Expr::Meta(MetaKey::L4Proto),
                eq(vec![IPPROTO_TCP]),
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset,
                    len: 2,
                },
                eq(port.to_be_bytes().to_vec()),
                Expr::Verdict(Verdict::Drop),
            ]
        };
        Self {
            tables: vec![table(table_name)],
            chains: vec![
                base_chain(table_name, "input", ChainType::Filter, Hook::Input, -10),
                base_chain(table_name, "output", ChainType::Filter, Hook::Output, -10),
            ],
            rules: vec![
                rule(table_name, "input", tcp_port(L4_SPORT)),
                rule(table_name, "output", tcp_port(L4_DPORT)),
            ],
        }
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("nftables: bad {what}"))
}

fn eq(data: Vec<u8>) -> Expr {
    Expr::Cmp {
        op: CmpOp::Eq,
        data,
    }
}

fn table(name: &str) -> Table {
    Table {
        family: FAMILY,
        name: name.into(),
    }
}

/// A base chain of `kind` whose policy accepts.
fn base_chain(table: &str, name: &str, kind: ChainType, hook: Hook, priority: i32) -> Chain {
    Chain {
        family: FAMILY,
        table: table.into(),
        name: name.into(),
        base: Some(BaseChain {
            kind,
            hook,
            priority,
            policy: Verdict::Accept,
        }),
    }
}

fn rule(table: &str, chain: &str, exprs: Vec<Expr>) -> Rule {
    Rule {
        family: FAMILY,
        table: table.into(),
        chain: chain.into(),
        exprs,
    }
}
