//! nf_tables netlink messages: [`Ruleset`] objects encoded as the kernel
//! reads them, and the kernel's dumps decoded back into them.
//!
//! Numbers are from the uapi headers linux/netlink.h, linux/netfilter/
//! nfnetlink.h and nf_tables.h. Netlink and attribute headers are in host
//! order; nf_tables' integer attributes are big-endian (the kernel reads
//! them with ntohl); register data is bytes as they are in the packet.
//! Attributes go in the order nft 1.0 sends them, so an encoding can be
//! compared byte for byte with nft's own (see the tests).

use std::io;

use super::ruleset::{
    BaseChain, Chain, ChainType, CmpOp, Expr, Family, Hook, MetaKey, PayloadBase, Rule, Table,
    Verdict,
};

// linux/netlink.h
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLMSG_HDRLEN: usize = 16;
const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

// linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFNETLINK_V0: u8 = 0;
const NFGENMSG_LEN: usize = 4;

// enum nf_tables_msg_types
const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BITWISE_OP: u16 = 6;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const NFTA_REDIR_REG_PROTO_MAX: u16 = 2;
const NFTA_REDIR_FLAGS: u16 = 3;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
/// NFT_BITWISE_MASK_XOR (NFT_BITWISE_BOOL before Linux 6.13).
const NFT_BITWISE_MASK_XOR: u32 = 0;
/// linux/netfilter/nf_nat.h: the redirect sets the port, not only the address.
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;

/// NFT_NAME_MAXLEN less the NUL.
const NAME_MAX: usize = 255;
/// NFT_DATA_VALUE_MAXLEN: data in a cmp, bitwise or immediate.
const DATA_MAX: usize = 64;
/// Far more than a rule here has; it keeps a rule's attributes well under
/// a netlink attribute's 64 KiB (an expression encodes to < 200 bytes).
const EXPRS_MAX: usize = 128;

/// One nf_tables request, before it is given a sequence number.
#[derive(Debug)]
pub(crate) struct Message {
    ty: u16,
    flags: u16,
    family: u8,
    attrs: Vec<u8>,
}

impl Family {
    pub(crate) fn code(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => 2,
            Family::Ip6 => 10,
            Family::Other(n) => n,
        }
    }

    fn from_code(n: u8) -> Self {
        match n {
            1 => Family::Inet,
            2 => Family::Ip,
            10 => Family::Ip6,
            n => Family::Other(n),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Family::Inet => f.write_str("inet"),
            Family::Ip => f.write_str("ip"),
            Family::Ip6 => f.write_str("ip6"),
            Family::Other(n) => write!(f, "family {n}"),
        }
    }
}

fn verdict_code(v: Verdict) -> i32 {
    match v {
        Verdict::Accept => NF_ACCEPT,
        Verdict::Drop => NF_DROP,
        Verdict::Other(n) => n,
    }
}

fn verdict_from(n: i32) -> Verdict {
    match n {
        NF_ACCEPT => Verdict::Accept,
        NF_DROP => Verdict::Drop,
        n => Verdict::Other(n),
    }
}

fn hook_code(h: Hook) -> u32 {
    match h {
        Hook::Prerouting => 0,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
        Hook::Other(n) => n,
    }
}

fn hook_from(n: u32) -> Hook {
    match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        n => Hook::Other(n),
    }
}

fn chain_type_name(t: ChainType) -> &'static str {
    match t {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
        ChainType::Route => "route",
    }
}

fn meta_code(k: MetaKey) -> u32 {
    match k {
        MetaKey::IifName => 6,
        MetaKey::NfProto => 15,
        MetaKey::L4Proto => 16,
        MetaKey::Other(n) => n,
    }
}

fn meta_from(n: u32) -> MetaKey {
    match n {
        6 => MetaKey::IifName,
        15 => MetaKey::NfProto,
        16 => MetaKey::L4Proto,
        n => MetaKey::Other(n),
    }
}

fn base_code(b: PayloadBase) -> u32 {
    match b {
        PayloadBase::Link => 0,
        PayloadBase::Network => 1,
        PayloadBase::Transport => 2,
        PayloadBase::Other(n) => n,
    }
}

fn base_from(n: u32) -> PayloadBase {
    match n {
        0 => PayloadBase::Link,
        1 => PayloadBase::Network,
        2 => PayloadBase::Transport,
        n => PayloadBase::Other(n),
    }
}

fn cmp_code(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Neq => 1,
        CmpOp::Other(n) => n,
    }
}

fn cmp_from(n: u32) -> CmpOp {
    match n {
        0 => CmpOp::Eq,
        1 => CmpOp::Neq,
        n => CmpOp::Other(n),
    }
}

/// Netlink attributes being written into one buffer.
#[derive(Default)]
struct Attrs(Vec<u8>);

impl Attrs {
    fn bytes(&mut self, ty: u16, data: &[u8]) -> &mut Self {
        let start = self.open(ty);
        self.0.extend_from_slice(data);
        self.close(start);
        self
    }

    fn string(&mut self, ty: u16, s: &str) -> &mut Self {
        let start = self.open(ty);
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self.close(start);
        self
    }

    fn be32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.bytes(ty, &v.to_be_bytes())
    }

    fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Self)) -> &mut Self {
        let start = self.open(ty | NLA_F_NESTED);
        f(self);
        self.close(start);
        self
    }

    /// Writes an attribute header with a length to fill in at `close`.
    fn open(&mut self, ty: u16) -> usize {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&ty.to_ne_bytes());
        start
    }

    /// Sets the length (without padding) of the attribute at `start`, then
    /// pads it to 4 bytes.
    fn close(&mut self, start: usize) {
        let len = u16::try_from(self.0.len() - start)
            .expect("validated names, data and expression counts fit an attribute");
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.0.resize(self.0.len().next_multiple_of(4), 0);
    }
}

fn check_name(what: &str, name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() > NAME_MAX || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("nftables: bad {what} name {name:?}"),
        ));
    }
    Ok(())
}

fn check_data(rule: &str, data: &[u8]) -> io::Result<()> {
    if data.is_empty() || data.len() > DATA_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("nftables: {rule}: {} bytes of data", data.len()),
        ));
    }
    Ok(())
}

impl Message {
    fn new(msg: u16, flags: u16, family: Family, attrs: Attrs) -> Self {
        Self {
            ty: NFNL_SUBSYS_NFTABLES << 8 | msg,
            flags: NLM_F_REQUEST | flags,
            family: family.code(),
            attrs: attrs.0,
        }
    }

    /// Adds (or keeps) a table.
    pub(crate) fn new_table(t: &Table) -> io::Result<Self> {
        check_name("table", &t.name)?;
        let mut a = Attrs::default();
        a.string(NFTA_TABLE_NAME, &t.name).be32(NFTA_TABLE_FLAGS, 0);
        Ok(Self::new(NFT_MSG_NEWTABLE, 0, t.family, a))
    }

    pub(crate) fn del_table(family: Family, name: &str) -> io::Result<Self> {
        check_name("table", name)?;
        let mut a = Attrs::default();
        a.string(NFTA_TABLE_NAME, name);
        Ok(Self::new(NFT_MSG_DELTABLE, 0, family, a))
    }

    pub(crate) fn new_chain(c: &Chain) -> io::Result<Self> {
        check_name("table", &c.table)?;
        check_name("chain", &c.name)?;
        let mut a = Attrs::default();
        a.string(NFTA_CHAIN_TABLE, &c.table)
            .string(NFTA_CHAIN_NAME, &c.name);
        if let Some(base) = &c.base {
            a.string(NFTA_CHAIN_TYPE, chain_type_name(base.kind))
                .be32(NFTA_CHAIN_POLICY, verdict_code(base.policy) as u32)
                .nest(NFTA_CHAIN_HOOK, |h| {
                    h.be32(NFTA_HOOK_HOOKNUM, hook_code(base.hook))
                        .be32(NFTA_HOOK_PRIORITY, base.priority as u32);
                });
        }
        Ok(Self::new(NFT_MSG_NEWCHAIN, NLM_F_CREATE, c.family, a))
    }

    /// Appends a rule to its chain.
    pub(crate) fn new_rule(r: &Rule) -> io::Result<Self> {
        check_name("table", &r.table)?;
        check_name("chain", &r.chain)?;
        let what = format!("rule in {} {} {}", r.family, r.table, r.chain);
        if r.exprs.len() > EXPRS_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("nftables: {what}: {} expressions", r.exprs.len()),
            ));
        }
        for e in &r.exprs {
            match e {
                Expr::Bitwise { mask, xor } => {
                    check_data(&what, mask)?;
                    if xor.len() != mask.len() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("nftables: {what}: bitwise mask and xor differ in length"),
                        ));
                    }
                }
                Expr::Cmp { data, .. } | Expr::Immediate(data) => check_data(&what, data)?,
                Expr::Other(name) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("nftables: {what}: cannot encode expression {name:?}"),
                    ));
                }
                _ => {}
            }
        }
        let mut a = Attrs::default();
        a.string(NFTA_RULE_TABLE, &r.table)
            .string(NFTA_RULE_CHAIN, &r.chain)
            .nest(NFTA_RULE_EXPRESSIONS, |list| {
                for e in &r.exprs {
                    list.nest(NFTA_LIST_ELEM, |elem| encode_expr(elem, e));
                }
            });
        Ok(Self::new(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            r.family,
            a,
        ))
    }

    /// A dump of every object of one kind (`NFT_MSG_GET*`), all families.
    pub(crate) fn dump(msg: u16) -> Self {
        Self::new(msg, NLM_F_DUMP, Family::Other(0), Attrs::default())
    }

    /// Appends this message with sequence number `seq` and extra `flags`.
    pub(crate) fn encode(&self, seq: u32, flags: u16, out: &mut Vec<u8>) {
        header(
            out,
            self.ty,
            self.flags | flags,
            seq,
            [self.family, NFNETLINK_V0, 0, 0],
            &self.attrs,
        );
    }
}

fn header(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, nfgen: [u8; 4], attrs: &[u8]) {
    let len = u32::try_from(NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len())
        .expect("a batch of validated objects is far below 4 GiB");
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    out.extend_from_slice(&nfgen);
    out.extend_from_slice(attrs);
}

/// One transaction: BATCH_BEGIN with sequence number `seq`, the messages
/// with `seq + 1 ..`, each flagged `flags`, and BATCH_END. The kernel
/// applies all of it or none.
pub(crate) fn batch<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    seq: u32,
    flags: u16,
) -> Vec<u8> {
    // res_id of a batch message names the subsystem, in network order.
    let subsys = NFNL_SUBSYS_NFTABLES.to_be_bytes();
    let nfgen = [0, NFNETLINK_V0, subsys[0], subsys[1]];
    let mut out = Vec::new();
    header(
        &mut out,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq,
        nfgen,
        &[],
    );
    let mut next = seq;
    for m in messages {
        next = next.wrapping_add(1);
        m.encode(next, flags, &mut out);
    }
    header(
        &mut out,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        next.wrapping_add(1),
        nfgen,
        &[],
    );
    out
}

fn expr_name(e: &Expr) -> &str {
    match e {
        Expr::Meta(_) => "meta",
        Expr::Payload { .. } => "payload",
        Expr::Bitwise { .. } => "bitwise",
        Expr::Cmp { .. } => "cmp",
        Expr::Immediate(_) | Expr::Verdict(_) => "immediate",
        Expr::Redirect => "redir",
        Expr::Other(name) => name,
    }
}

fn encode_expr(a: &mut Attrs, e: &Expr) {
    a.string(NFTA_EXPR_NAME, expr_name(e))
        .nest(NFTA_EXPR_DATA, |d| match e {
            Expr::Meta(key) => {
                d.be32(NFTA_META_KEY, meta_code(*key))
                    .be32(NFTA_META_DREG, NFT_REG_1);
            }
            Expr::Payload { base, offset, len } => {
                d.be32(NFTA_PAYLOAD_DREG, NFT_REG_1)
                    .be32(NFTA_PAYLOAD_BASE, base_code(*base))
                    .be32(NFTA_PAYLOAD_OFFSET, *offset)
                    .be32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Bitwise { mask, xor } => {
                d.be32(NFTA_BITWISE_SREG, NFT_REG_1)
                    .be32(NFTA_BITWISE_DREG, NFT_REG_1)
                    .be32(NFTA_BITWISE_OP, NFT_BITWISE_MASK_XOR)
                    .be32(NFTA_BITWISE_LEN, mask.len() as u32)
                    .nest(NFTA_BITWISE_MASK, |v| {
                        v.bytes(NFTA_DATA_VALUE, mask);
                    })
                    .nest(NFTA_BITWISE_XOR, |v| {
                        v.bytes(NFTA_DATA_VALUE, xor);
                    });
            }
            Expr::Cmp { op, data } => {
                d.be32(NFTA_CMP_SREG, NFT_REG_1)
                    .be32(NFTA_CMP_OP, cmp_code(*op))
                    .nest(NFTA_CMP_DATA, |v| {
                        v.bytes(NFTA_DATA_VALUE, data);
                    });
            }
            Expr::Immediate(data) => {
                d.be32(NFTA_IMMEDIATE_DREG, NFT_REG_1)
                    .nest(NFTA_IMMEDIATE_DATA, |v| {
                        v.bytes(NFTA_DATA_VALUE, data);
                    });
            }
            Expr::Verdict(verdict) => {
                d.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT)
                    .nest(NFTA_IMMEDIATE_DATA, |v| {
                        v.nest(NFTA_DATA_VERDICT, |c| {
                            c.be32(NFTA_VERDICT_CODE, verdict_code(*verdict) as u32);
                        });
                    });
            }
            Expr::Redirect => {
                d.be32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1)
                    .be32(NFTA_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
            }
            // `new_rule` refuses these before encoding starts.
            Expr::Other(_) => {}
        });
}

// ---- decoding the kernel's answers ----

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("nftables: malformed {what} from the kernel"),
    )
}

/// One netlink message from the kernel.
#[derive(Debug)]
pub(crate) struct Reply<'a> {
    pub(crate) ty: u16,
    pub(crate) seq: u32,
    /// Everything after the netlink header.
    pub(crate) payload: &'a [u8],
}

/// Splits a datagram into its netlink messages.
pub(crate) fn replies(mut buf: &[u8]) -> io::Result<Vec<Reply<'_>>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        if buf.len() < NLMSG_HDRLEN {
            return Err(malformed("netlink header"));
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(malformed("netlink message length"));
        }
        out.push(Reply {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            payload: &buf[NLMSG_HDRLEN..len],
        });
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    Ok(out)
}

/// The errno of an NLMSG_ERROR payload (0 for an acknowledgement).
pub(crate) fn ack_errno(payload: &[u8]) -> io::Result<i32> {
    let code = payload
        .first_chunk::<4>()
        .map(|b| i32::from_ne_bytes(*b))
        .ok_or_else(|| malformed("netlink error message"))?;
    Ok(code.saturating_neg())
}

/// An attribute's type (without flags) and value.
type Attr<'a> = (u16, &'a [u8]);

/// The attributes in `buf`.
fn attrs(mut buf: &[u8]) -> io::Result<Vec<Attr<'_>>> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return Err(malformed("attribute length"));
        }
        out.push((ty, &buf[4..len]));
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    Ok(out)
}

fn find<'a>(attrs: &[Attr<'a>], ty: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(t, _)| *t == ty).map(|(_, v)| *v)
}

fn string(attrs: &[Attr<'_>], ty: u16, what: &str) -> io::Result<String> {
    let v = find(attrs, ty).ok_or_else(|| malformed(what))?;
    let v = v.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8(v.to_vec()).map_err(|_| malformed(what))
}

fn be32(attrs: &[Attr<'_>], ty: u16) -> Option<u32> {
    find(attrs, ty)?
        .first_chunk::<4>()
        .map(|b| u32::from_be_bytes(*b))
}

/// The family (from nfgenmsg) and the attributes of an nf_tables message.
fn object(payload: &[u8]) -> io::Result<(Family, Vec<Attr<'_>>)> {
    if payload.len() < NFGENMSG_LEN {
        return Err(malformed("nf_tables message"));
    }
    Ok((
        Family::from_code(payload[0]),
        attrs(&payload[NFGENMSG_LEN..])?,
    ))
}

pub(crate) fn decode_table(payload: &[u8]) -> io::Result<Table> {
    let (family, a) = object(payload)?;
    Ok(Table {
        family,
        name: string(&a, NFTA_TABLE_NAME, "table name")?,
    })
}

pub(crate) fn decode_chain(payload: &[u8]) -> io::Result<Chain> {
    let (family, a) = object(payload)?;
    let base = match find(&a, NFTA_CHAIN_HOOK) {
        None => None,
        Some(hook) => {
            let h = attrs(hook)?;
            let kind = match string(&a, NFTA_CHAIN_TYPE, "chain type")?.as_str() {
                "filter" => ChainType::Filter,
                "nat" => ChainType::Nat,
                "route" => ChainType::Route,
                _ => return Err(malformed("chain type")),
            };
            Some(BaseChain {
                kind,
                hook: hook_from(be32(&h, NFTA_HOOK_HOOKNUM).ok_or_else(|| malformed("hook"))?),
                priority: be32(&h, NFTA_HOOK_PRIORITY).ok_or_else(|| malformed("priority"))? as i32,
                policy: verdict_from(
                    be32(&a, NFTA_CHAIN_POLICY).ok_or_else(|| malformed("policy"))? as i32,
                ),
            })
        }
    };
    Ok(Chain {
        family,
        table: string(&a, NFTA_CHAIN_TABLE, "chain's table")?,
        name: string(&a, NFTA_CHAIN_NAME, "chain name")?,
        base,
    })
}

pub(crate) fn decode_rule(payload: &[u8]) -> io::Result<Rule> {
    let (family, a) = object(payload)?;
    let mut exprs = Vec::new();
    if let Some(list) = find(&a, NFTA_RULE_EXPRESSIONS) {
        for (ty, elem) in attrs(list)? {
            if ty == NFTA_LIST_ELEM {
                exprs.push(decode_expr(elem)?);
            }
        }
    }
    Ok(Rule {
        family,
        table: string(&a, NFTA_RULE_TABLE, "rule's table")?,
        chain: string(&a, NFTA_RULE_CHAIN, "rule's chain")?,
        exprs,
    })
}

/// The NFTA_DATA_VALUE inside a data attribute.
fn value(a: &[Attr<'_>], ty: u16) -> io::Result<Option<Vec<u8>>> {
    match find(a, ty) {
        None => Ok(None),
        Some(data) => Ok(find(&attrs(data)?, NFTA_DATA_VALUE).map(<[u8]>::to_vec)),
    }
}

/// Decodes what this module builds; anything else (other expressions,
/// other registers or operations) becomes [`Expr::Other`] naming it.
fn decode_expr(elem: &[u8]) -> io::Result<Expr> {
    let e = attrs(elem)?;
    let name = string(&e, NFTA_EXPR_NAME, "expression name")?;
    let d = match find(&e, NFTA_EXPR_DATA) {
        Some(data) => attrs(data)?,
        None => Vec::new(),
    };
    let reg1 = |ty| be32(&d, ty) == Some(NFT_REG_1);
    let decoded = match name.as_str() {
        "meta" if reg1(NFTA_META_DREG) => be32(&d, NFTA_META_KEY).map(|k| Expr::Meta(meta_from(k))),
        "payload" if reg1(NFTA_PAYLOAD_DREG) => {
            match (
                be32(&d, NFTA_PAYLOAD_BASE),
                be32(&d, NFTA_PAYLOAD_OFFSET),
                be32(&d, NFTA_PAYLOAD_LEN),
            ) {
                (Some(base), Some(offset), Some(len)) => Some(Expr::Payload {
                    base: base_from(base),
                    offset,
                    len,
                }),
                _ => None,
            }
        }
        "bitwise"
            if reg1(NFTA_BITWISE_SREG)
                && reg1(NFTA_BITWISE_DREG)
                && be32(&d, NFTA_BITWISE_OP).unwrap_or(NFT_BITWISE_MASK_XOR)
                    == NFT_BITWISE_MASK_XOR =>
        {
            match (value(&d, NFTA_BITWISE_MASK)?, value(&d, NFTA_BITWISE_XOR)?) {
                (Some(mask), Some(xor)) => Some(Expr::Bitwise { mask, xor }),
                _ => None,
            }
        }
        "cmp" if reg1(NFTA_CMP_SREG) => match (be32(&d, NFTA_CMP_OP), value(&d, NFTA_CMP_DATA)?) {
            (Some(op), Some(data)) => Some(Expr::Cmp {
                op: cmp_from(op),
                data,
            }),
            _ => None,
        },
        "immediate" if reg1(NFTA_IMMEDIATE_DREG) => {
            value(&d, NFTA_IMMEDIATE_DATA)?.map(Expr::Immediate)
        }
        "immediate" if be32(&d, NFTA_IMMEDIATE_DREG) == Some(NFT_REG_VERDICT) => {
            match find(&d, NFTA_IMMEDIATE_DATA) {
                Some(data) => match find(&attrs(data)?, NFTA_DATA_VERDICT) {
                    Some(v) => be32(&attrs(v)?, NFTA_VERDICT_CODE)
                        .map(|c| Expr::Verdict(verdict_from(c as i32))),
                    None => None,
                },
                None => None,
            }
        }
        "redir"
            if reg1(NFTA_REDIR_REG_PROTO_MIN)
                && be32(&d, NFTA_REDIR_REG_PROTO_MAX).is_none_or(|r| r == NFT_REG_1)
                && be32(&d, NFTA_REDIR_FLAGS) == Some(NF_NAT_RANGE_PROTO_SPECIFIED) =>
        {
            Some(Expr::Redirect)
        }
        _ => None,
    };
    Ok(decoded.unwrap_or(Expr::Other(name)))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::ruleset::Ruleset;
    use super::*;

    /// What nft 1.0.6 itself sent (captured with `strace -e trace=sendmsg
    /// -e write=3 nft -f`, in a fresh namespace) for the sandbox ruleset,
    /// written in nft's syntax:
    ///
    /// ```text
    /// add table inet atunnel
    /// add chain inet atunnel prerouting { type nat hook prerouting priority -100; policy accept; }
    /// add rule inet atunnel prerouting ip daddr & 255.255.255.252 != 169.254.17.0 meta l4proto tcp redirect to :15001
    /// add chain inet atunnel input { type filter hook input priority 0; policy accept; }
    /// add rule inet atunnel input meta iifname "atside" meta nfproto ipv4 meta l4proto tcp accept
    /// add rule inet atunnel input meta iifname "atside" meta nfproto ipv4 udp dport 53 accept
    /// add rule inet atunnel input meta iifname "atside" drop
    /// add chain inet atunnel forward { type filter hook forward priority 0; policy drop; }
    /// ```
    ///
    /// nft orders chains and rules as the file does, and asks for no ACKs.
    const NFT_SANDBOX_BATCH: &str = include_str!("nft_sandbox_batch.hex");

    fn unhex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(|l| l.bytes().filter(u8::is_ascii_hexdigit))
            .collect();
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("hex"), 16).expect("hex"))
            .collect()
    }

    /// The sandbox's messages in nft's order (its chain, then its rules).
    fn sandbox_in_nft_order() -> Vec<Message> {
        let rs = Ruleset::sandbox(
            "atside",
            Ipv4Addr::new(169, 254, 17, 0),
            30,
            None,
            15001,
            53,
        )
        .expect("ruleset");
        let chain = |name: &str| {
            Message::new_chain(rs.chains.iter().find(|c| c.name == name).expect("chain"))
                .expect("chain encodes")
        };
        let rules = |name: &str| {
            rs.rules
                .iter()
                .filter(|r| r.chain == name)
                .map(|r| Message::new_rule(r).expect("rule encodes"))
                .collect::<Vec<_>>()
        };
        let mut out = vec![Message::new_table(&rs.tables[0]).expect("table encodes")];
        out.push(chain("prerouting"));
        out.extend(rules("prerouting"));
        out.push(chain("input"));
        out.extend(rules("input"));
        out.push(chain("forward"));
        out
    }

    #[test]
    fn the_sandbox_batch_is_byte_for_byte_what_nft_sends() {
        let ours = batch(&sandbox_in_nft_order(), 0, 0);
        let theirs = unhex(NFT_SANDBOX_BATCH);
        assert_eq!(theirs.len(), 1776, "the fixture is nft's whole batch");
        // Compare message by message, so a failure names the object.
        let ours_msgs = replies(&ours).expect("ours splits");
        let theirs_msgs = replies(&theirs).expect("theirs splits");
        assert_eq!(ours_msgs.len(), theirs_msgs.len(), "message count");
        for (i, (a, b)) in ours_msgs.iter().zip(&theirs_msgs).enumerate() {
            assert_eq!(
                (a.ty, a.seq, a.payload),
                (b.ty, b.seq, b.payload),
                "message {i}"
            );
        }
        assert_eq!(ours, theirs);
    }

    #[test]
    fn every_message_of_a_batch_asks_for_an_ack_but_begin_and_end() {
        let flags = |buf: &[u8]| -> Vec<u16> {
            let mut out = Vec::new();
            let mut off = 0;
            while off < buf.len() {
                let len = u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4")) as usize;
                out.push(u16::from_ne_bytes([buf[off + 6], buf[off + 7]]));
                off += len.next_multiple_of(4);
            }
            out
        };
        let nft = flags(&unhex(NFT_SANDBOX_BATCH));
        let ours = flags(&batch(&sandbox_in_nft_order(), 0, NLM_F_ACK));
        let last = nft.len() - 1;
        let expected: Vec<u16> = nft
            .iter()
            .enumerate()
            .map(|(i, f)| {
                if i == 0 || i == last {
                    *f
                } else {
                    f | NLM_F_ACK
                }
            })
            .collect();
        assert_eq!(ours, expected);
    }

    #[test]
    fn a_dump_of_our_own_encoding_decodes_to_the_same_objects() {
        let rs = Ruleset::drop_tcp_port("blackhole", 4321);
        let mut buf = Vec::new();
        for (i, r) in rs.rules.iter().enumerate() {
            Message::new_rule(r)
                .expect("encodes")
                .encode(i as u32, 0, &mut buf);
        }
        let decoded: Vec<Rule> = replies(&buf)
            .expect("splits")
            .iter()
            .map(|m| decode_rule(m.payload).expect("decodes"))
            .collect();
        assert_eq!(decoded, rs.rules);
        let chain = &rs.chains[0];
        let mut buf = Vec::new();
        Message::new_chain(chain)
            .expect("encodes")
            .encode(1, 0, &mut buf);
        let m = &replies(&buf).expect("splits")[0];
        assert_eq!(&decode_chain(m.payload).expect("decodes"), chain);
    }

    #[test]
    fn expressions_it_does_not_build_decode_as_other_by_name() {
        let mut a = Attrs::default();
        a.string(NFTA_EXPR_NAME, "counter")
            .nest(NFTA_EXPR_DATA, |d| {
                d.bytes(1, &[0; 8]);
            });
        assert_eq!(
            decode_expr(&a.0).expect("decodes"),
            Expr::Other("counter".into())
        );
        // A meta load into another register is not ours either.
        let mut a = Attrs::default();
        a.string(NFTA_EXPR_NAME, "meta").nest(NFTA_EXPR_DATA, |d| {
            d.be32(NFTA_META_KEY, 16).be32(NFTA_META_DREG, 2);
        });
        assert_eq!(
            decode_expr(&a.0).expect("decodes"),
            Expr::Other("meta".into())
        );
    }

    #[test]
    fn truncated_answers_are_errors_not_panics() {
        let mut buf = Vec::new();
        Message::new_rule(&Ruleset::drop_tcp_port("t", 1).rules[0])
            .expect("encodes")
            .encode(1, 0, &mut buf);
        for cut in 0..buf.len() {
            let part = &buf[..cut];
            if let Ok(msgs) = replies(part) {
                for m in msgs {
                    let _ = decode_rule(m.payload);
                }
            }
            let mut nested = buf.clone();
            // A length that overruns its message.
            if cut + 2 <= nested.len() {
                nested[cut] = 0xff;
                nested[cut + 1] = 0xff;
                if let Ok(msgs) = replies(&nested) {
                    for m in msgs {
                        let _ = decode_rule(m.payload);
                    }
                }
            }
        }
    }

    #[test]
    fn names_and_data_the_kernel_would_refuse_are_refused_first() {
        let mut rs = Ruleset::drop_tcp_port("t", 1);
        rs.rules[0].exprs.push(Expr::Immediate(vec![0; 65]));
        assert_eq!(
            Message::new_rule(&rs.rules[0])
                .expect_err("65 bytes")
                .kind(),
            io::ErrorKind::InvalidInput
        );
        let long = "x".repeat(256);
        assert!(Message::del_table(Family::Inet, &long).is_err());
        assert!(Message::del_table(Family::Inet, "a\0b").is_err());
        assert!(
            Ruleset::sandbox("sixteen-bytes-xx", Ipv4Addr::UNSPECIFIED, 30, None, 1, 2).is_err()
        );
    }
}
