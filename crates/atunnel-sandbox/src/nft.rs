//! The sandbox's nftables ruleset, programmed over netlink: no `nft`
//! binary, no libnftnl.
//!
//! A [`Ruleset`] is a typed list of tables, chains and rules. [`apply`]
//! sends it as one nf_tables batch on a NETLINK_NETFILTER socket made in
//! the calling thread's namespace (run it through
//! [`crate::NsExecutor::run_in`] to program a sandbox), so the kernel adds
//! all of it or none; every message is acknowledged and a refusal comes
//! back as an `io::Error` naming the object and the errno. [`list`] dumps
//! a namespace's objects back into a `Ruleset`.
//!
//! The messages are encoded here (nft/wire.rs), from the kernel's uapi
//! headers, because no crate we can take covers them: `rustables` is GPL,
//! `nftnl` binds the C libnftnl (a system library a fresh machine lacks),
//! and `netlink-packet-netfilter` (MIT; 0.4's nftables module) has no
//! `redir` expression, which the sandbox's one NAT rule needs. What the
//! sandbox needs is a few fixed messages; a test compares them byte for
//! byte with what nft itself sends.

mod ruleset;
mod socket;
mod wire;

use std::io;

pub use ruleset::{
    BaseChain, Chain, ChainType, CmpOp, Expr, FAMILY, Family, Hook, MetaKey, PayloadBase, Rule,
    Ruleset, TABLE, Table, Verdict,
};

use socket::NfSocket;
use wire::Message;

/// Adds every object of `ruleset` in the calling thread's namespace, in one
/// transaction. Tables and chains that already exist are kept (and their
/// policy updated); rules are appended.
pub fn apply(ruleset: &Ruleset) -> io::Result<()> {
    NfSocket::open()?.transact(&ops_of(ruleset)?)
}

/// The messages adding every object of `ruleset`, each with what it adds.
fn ops_of(ruleset: &Ruleset) -> io::Result<Vec<(String, Message)>> {
    let mut ops = Vec::new();
    for t in &ruleset.tables {
        ops.push((
            format!("add table {} {}", t.family, t.name),
            Message::new_table(t)?,
        ));
    }
    for c in &ruleset.chains {
        ops.push((
            format!("add chain {} {} {}", c.family, c.table, c.name),
            Message::new_chain(c)?,
        ));
    }
    for (i, r) in ruleset.rules.iter().enumerate() {
        ops.push((
            format!(
                "add rule {i} of the ruleset to chain {} {} {}",
                r.family, r.table, r.chain
            ),
            Message::new_rule(r)?,
        ));
    }
    Ok(ops)
}

/// Replaces `ruleset`'s tables with it in one transaction: each table is
/// added (a no-op if it exists), deleted with whatever it holds, and added
/// again with its chains and rules, so the namespace never shows a mix of
/// an old table and the new one, and a table an earlier process left is
/// neither an error nor kept.
pub fn replace(ruleset: &Ruleset) -> io::Result<()> {
    let mut ops = Vec::new();
    for t in &ruleset.tables {
        ops.push((
            format!("add table {} {}", t.family, t.name),
            Message::new_table(t)?,
        ));
        ops.push((
            format!("delete table {} {}", t.family, t.name),
            Message::del_table(t.family, &t.name)?,
        ));
    }
    ops.extend(ops_of(ruleset)?);
    NfSocket::open()?.transact(&ops)
}

/// Deletes table `name` of `family`, with its chains and rules, in the
/// calling thread's namespace. A missing table is an error (`NotFound`).
pub fn delete_table(family: Family, name: &str) -> io::Result<()> {
    let op = (
        format!("delete table {family} {name}"),
        Message::del_table(family, name)?,
    );
    NfSocket::open()?.transact(&[op])
}

/// Every table, chain and rule of the calling thread's namespace, as the
/// kernel holds them (for tests and diagnostics). Three dumps, not one
/// snapshot: a change made meanwhile may show in part.
pub fn list() -> io::Result<Ruleset> {
    let mut socket = NfSocket::open()?;
    Ok(Ruleset {
        tables: decode(
            socket.dump(wire::NFT_MSG_GETTABLE, "tables")?,
            wire::decode_table,
        )?,
        chains: decode(
            socket.dump(wire::NFT_MSG_GETCHAIN, "chains")?,
            wire::decode_chain,
        )?,
        rules: decode(
            socket.dump(wire::NFT_MSG_GETRULE, "rules")?,
            wire::decode_rule,
        )?,
    })
}

fn decode<T>(payloads: Vec<Vec<u8>>, f: fn(&[u8]) -> io::Result<T>) -> io::Result<Vec<T>> {
    payloads.iter().map(|p| f(p)).collect()
}
