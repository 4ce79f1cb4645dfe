//! The sandbox's nftables ruleset, through nft's JSON interface.
//!
//! The ruleset is built as JSON (not text) and applied with `nft -j -f -`,
//! started from the executor thread while it is inside the gateway namespace,
//! so the child runs there too (a child inherits its parent thread's
//! namespace).

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Table holding every rule for one sandbox.
pub const TABLE: &str = "atunnel";

/// The table's family. `inet` (IPv4 and IPv6 in one table), not `ip`: the
/// veth carries IPv6 link-local addresses, which an `ip` table never sees.
/// The redirect's `ip daddr` match limits it to IPv4, so it stays one rule,
/// and the input chain accepts IPv4 only, so all IPv6 from the actor
/// (neighbour discovery included) is dropped.
pub const FAMILY: &str = "inet";

/// The ruleset for one gateway namespace:
/// * nat/prerouting (dstnat priority): the one redirect rule: IPv4 TCP whose
///   destination is outside the sandbox /30 goes to `egress_port`;
/// * filter/input: from the actor, IPv4 TCP (which after the redirect is
///   ours) and DNS over UDP are accepted, everything else (ICMP, other UDP,
///   every IPv6 packet) dropped;
/// * filter/forward: nothing is forwarded.
pub fn ruleset(iface: &str, net: &str, mask: &str, egress_port: u16, dns_port: u16) -> Value {
    let table = json!({"family": FAMILY, "name": TABLE});
    let chain = |name: &str, kind: &str, hook: &str, prio: i32, policy: &str| {
        json!({"add": {"chain": {"family": FAMILY, "table": TABLE, "name": name,
            "type": kind, "hook": hook, "prio": prio, "policy": policy}}})
    };
    let rule = |chain: &str, expr: Value| json!({"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr}}});
    let from_actor =
        json!({"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": iface}});
    let ipv4 =
        json!({"match": {"op": "==", "left": {"meta": {"key": "nfproto"}}, "right": "ipv4"}});
    json!({"nftables": [
        {"add": {"table": table}},
        chain("prerouting", "nat", "prerouting", -100, "accept"),
        rule("prerouting", json!([
            {"match": {"op": "!=",
                "left": {"&": [{"payload": {"protocol": "ip", "field": "daddr"}}, mask]},
                "right": net}},
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
            {"redirect": {"port": egress_port}}
        ])),
        chain("input", "filter", "input", 0, "accept"),
        rule("input", json!([from_actor, ipv4, {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"accept": null}])),
        rule("input", json!([from_actor, ipv4, {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": dns_port}}, {"accept": null}])),
        rule("input", json!([from_actor, {"drop": null}])),
        chain("forward", "filter", "forward", 0, "drop"),
    ]})
}

/// Applies `ruleset` with `nft -j -f -` in the calling thread's namespace.
pub fn apply(ruleset: &Value) -> std::io::Result<()> {
    let mut child = Command::new("nft")
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("running nft: {e} (is nftables installed?)"),
            )
        })?;
    child
        .stdin
        .take()
        .expect("stdin was piped")
        .write_all(ruleset.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "nft rejected the ruleset ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The calling thread's namespace's whole ruleset, as `nft -j list ruleset`
/// prints it (for diagnostics and tests).
pub fn list() -> std::io::Result<Value> {
    let out = Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "nft list ruleset ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(std::io::Error::other)
}
