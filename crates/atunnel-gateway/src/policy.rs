//! The gateway's destination policy: which `IP:port` an actor's tunnel may
//! reach. Deny rules beside allow rules, each a CIDR with an optional port
//! or port range; a deny rule wins over an allow rule, and a destination no
//! allow rule matches is denied. A default deny list (link-local, cloud
//! metadata, loopback, unspecified, IPv4-compatible IPv6, the gateway's own
//! listeners) applies unless the operator skips its entries by name.
//!
//! Rule syntax: `CIDR`, `CIDR:PORT` or `CIDR:LOW-HIGH`; an IPv6 CIDR with
//! ports is bracketed (`[2001:db8::/32]:443`). A bare address is a /32 or
//! /128. A rule written in IPv4-mapped form (`::ffff:10.0.0.0/104`) is the
//! IPv4 rule it stands for (`10.0.0.0/8`).
//!
//! Addresses that embed an IPv4 address are canonicalised before matching:
//! * IPv4-mapped `::ffff:a.b.c.d` is matched, and dialled, as `a.b.c.d`
//!   (the kernel sends IPv4 for it), so `--allow ::/0` does not admit it;
//! * IPv4-compatible `::a.b.c.d` (deprecated, RFC 4291), NAT64's well-known
//!   prefix `64:ff9b::a.b.c.d` (RFC 6052) and 6to4 `2002:AABB:CCDD::/48`
//!   (RFC 3056) reach, through a translator or relay, the IPv4 address they
//!   embed: they are checked as both addresses, denied if either is denied
//!   and allowed only if both are allowed. IPv4-compatible is also on the
//!   default deny list: no legitimate destination uses it.
//!
//! The policy is consulted once per tunnel open: a scan of two small
//! vectors under a read lock, no allocation unless the tunnel is refused.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ipnet::{IpNet, Ipv4Net};

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy rule {rule:?}: {reason}")]
    Rule { rule: String, reason: &'static str },
    #[error("policy file line {line}: {reason}: {text:?}")]
    Line {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("reading the policy file {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One rule: a network and a port range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    net: IpNet,
    low: u16,
    high: u16,
    /// As the operator wrote it: the rule's label in /stats.
    text: String,
}

impl Rule {
    fn new(net: IpNet, low: u16, high: u16, text: String) -> Self {
        Self {
            net: canonical_net(net.trunc()),
            low,
            high,
            text,
        }
    }

    fn matches(&self, ip: IpAddr, port: u16) -> bool {
        (self.low..=self.high).contains(&port) && self.net.contains(&ip)
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

impl FromStr for Rule {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let bad = |reason| PolicyError::Rule {
            rule: s.to_string(),
            reason,
        };
        let (addr, ports) = if let Some(rest) = s.strip_prefix('[') {
            let (addr, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            match after {
                "" => (addr, None),
                p => (
                    addr,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad("expected ':PORT' after ']'"))?,
                    ),
                ),
            }
        } else if s.matches(':').count() == 1 {
            let (a, p) = s.split_once(':').expect("one ':'");
            (a, Some(p))
        } else {
            // IPv4 without a port, or a bare IPv6 CIDR (its ports need brackets).
            (s, None)
        };
        let net = match addr.parse::<IpNet>() {
            Ok(n) => n,
            Err(_) => IpNet::from(
                addr.parse::<IpAddr>()
                    .map_err(|_| bad("not an IP address or CIDR"))?,
            ),
        };
        let (low, high) = match ports {
            None => (1, u16::MAX),
            Some(p) => {
                let port = |t: &str| match t.parse::<u16>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(bad("a port is 1-65535")),
                };
                match p.split_once('-') {
                    Some((l, h)) => {
                        let (l, h) = (port(l)?, port(h)?);
                        if l > h {
                            return Err(bad("a port range runs low-high"));
                        }
                        (l, h)
                    }
                    None => {
                        let n = port(p)?;
                        (n, n)
                    }
                }
            }
        };
        Ok(Rule::new(net, low, high, s.to_string()))
    }
}

/// A rule in IPv4-mapped form is the IPv4 rule it stands for, since mapped
/// destinations are matched as IPv4.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && v6.prefix_len() >= 96
        && let Some(v4) = v6.network().to_ipv4_mapped()
    {
        return IpNet::V4(Ipv4Net::new(v4, v6.prefix_len() - 96).expect("prefix at most 32"));
    }
    net
}

/// The address a destination is dialled at, and the IPv4 address it embeds
/// (checked too), per the module's rules.
pub fn canonical(ip: IpAddr) -> (IpAddr, Option<Ipv4Addr>) {
    let IpAddr::V6(v6) = ip else {
        return (ip, None);
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return (IpAddr::V4(v4), None);
    }
    let s = v6.segments();
    let o = v6.octets();
    let last = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    // IPv4-compatible (::a.b.c.d, not :: or ::1) and NAT64's well-known
    // prefix embed the IPv4 address in their last 32 bits.
    let compatible = s[..6] == [0u16; 6] && !v6.is_unspecified() && !v6.is_loopback();
    let nat64 = s[..6] == [0x64u16, 0xff9b, 0, 0, 0, 0];
    let embedded = if compatible || nat64 {
        Some(last)
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])) // 6to4
    } else {
        None
    };
    (ip, embedded)
}

/// The default deny list's entries, each skippable by name
/// (`--skip-default-deny loopback`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DefaultDeny {
    /// 169.254.0.0/16 and fe80::/10.
    LinkLocal,
    /// Cloud metadata services: 169.254.169.254, fd00:ec2::254 (AWS),
    /// 100.100.100.200 (Alibaba).
    Metadata,
    /// 127.0.0.0/8 and ::1.
    Loopback,
    /// 0.0.0.0/8 and :: (Linux connects 0.0.0.0 to the host itself).
    Unspecified,
    /// ::/96, deprecated IPv4-compatible IPv6.
    Ipv4Compatible,
    /// The gateway's own listeners (address and port).
    OwnListeners,
}

impl DefaultDeny {
    pub const ALL: [DefaultDeny; 6] = [
        DefaultDeny::LinkLocal,
        DefaultDeny::Metadata,
        DefaultDeny::Loopback,
        DefaultDeny::Unspecified,
        DefaultDeny::Ipv4Compatible,
        DefaultDeny::OwnListeners,
    ];

    fn name(self) -> &'static str {
        match self {
            DefaultDeny::LinkLocal => "link-local",
            DefaultDeny::Metadata => "metadata",
            DefaultDeny::Loopback => "loopback",
            DefaultDeny::Unspecified => "unspecified",
            DefaultDeny::Ipv4Compatible => "ipv4-compatible",
            DefaultDeny::OwnListeners => "own-listeners",
        }
    }

    fn rules(self, own: &[SocketAddr]) -> Vec<Rule> {
        let nets: &[&str] = match self {
            DefaultDeny::LinkLocal => &["169.254.0.0/16", "[fe80::/10]"],
            DefaultDeny::Metadata => &["169.254.169.254", "[fd00:ec2::254]", "100.100.100.200"],
            DefaultDeny::Loopback => &["127.0.0.0/8", "[::1]"],
            DefaultDeny::Unspecified => &["0.0.0.0/8", "[::]"],
            DefaultDeny::Ipv4Compatible => &["[::/96]"],
            DefaultDeny::OwnListeners => &[],
        };
        let mut rules: Vec<Rule> = nets
            .iter()
            .map(|n| n.parse::<Rule>().expect("default rules parse"))
            .collect();
        if self == DefaultDeny::OwnListeners {
            // An unspecified listener address is every local address; its
            // loopback side is on the loopback entry.
            rules.extend(own.iter().filter(|a| !a.ip().is_unspecified()).map(|a| {
                Rule::new(
                    IpNet::from(a.ip()),
                    a.port(),
                    a.port(),
                    SocketAddr::new(canonical(a.ip()).0, a.port()).to_string(),
                )
            }));
        }
        for r in &mut rules {
            r.text = format!("default {} {}", self.name(), r.text);
        }
        rules
    }
}

/// What a policy is built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySpec {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// Default deny entries not applied.
    pub skip_default: Vec<DefaultDeny>,
    /// The gateway's own listeners, denied unless `OwnListeners` is skipped.
    pub own_listeners: Vec<SocketAddr>,
}

impl PolicySpec {
    /// `text`'s rules added: one per line, `allow RULE` or `deny RULE`;
    /// blank lines and `#` comments are skipped.
    pub fn with_file_rules(mut self, text: &str) -> Result<Self, PolicyError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |reason: String| PolicyError::Line {
                line: i + 1,
                text: line.to_string(),
                reason,
            };
            let (kind, rule) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| err("expected 'allow RULE' or 'deny RULE'".into()))?;
            let rule = rule
                .trim()
                .parse::<Rule>()
                .map_err(|e| err(e.to_string()))?;
            match kind {
                "allow" => self.allow.push(rule),
                "deny" => self.deny.push(rule),
                _ => return Err(err("expected 'allow RULE' or 'deny RULE'".into())),
            }
        }
        Ok(self)
    }
}

/// A rule with its refusal counter.
#[derive(Debug)]
struct Entry {
    rule: Rule,
    refused: Arc<AtomicU64>,
}

/// A built policy: immutable; a reload builds a new one.
#[derive(Debug)]
pub struct Policy {
    deny: Vec<Entry>,
    allow: Vec<Entry>,
    unmatched: Arc<AtomicU64>,
}

/// Label of refusals no allow rule matched.
pub const NO_ALLOW_RULE: &str = "no allow rule";

impl Policy {
    /// Builds `spec`; refusal counters of rules `previous` also had (by
    /// text) carry on.
    pub fn build(spec: &PolicySpec, previous: Option<&Policy>) -> Self {
        let counter = |rule: &Rule| {
            previous
                .and_then(|p| {
                    p.deny
                        .iter()
                        .chain(&p.allow)
                        .find(|e| e.rule.text == rule.text)
                })
                .map(|e| e.refused.clone())
                .unwrap_or_default()
        };
        let defaults = DefaultDeny::ALL
            .into_iter()
            .filter(|d| !spec.skip_default.contains(d))
            .flat_map(|d| d.rules(&spec.own_listeners));
        let entry = |rule: Rule| Entry {
            refused: counter(&rule),
            rule,
        };
        let mut deny: Vec<Entry> = defaults.map(entry).collect();
        deny.extend(spec.deny.iter().cloned().map(|mut r| {
            r.text = format!("deny {}", r.text);
            entry(r)
        }));
        let allow = spec
            .allow
            .iter()
            .cloned()
            .map(|mut r| {
                r.text = format!("allow {}", r.text);
                entry(r)
            })
            .collect();
        Self {
            deny,
            allow,
            unmatched: previous.map(|p| p.unmatched.clone()).unwrap_or_default(),
        }
    }

    /// The address to dial for `dest`, or the label of the rule that
    /// refused it (counted).
    pub fn check(&self, dest: SocketAddr) -> Result<SocketAddr, String> {
        let port = dest.port();
        let (ip, embedded) = canonical(dest.ip());
        let forms = [Some(ip), embedded.map(IpAddr::V4)];
        for form in forms.into_iter().flatten() {
            if let Some(e) = self.deny.iter().find(|e| e.rule.matches(form, port)) {
                e.refused.fetch_add(1, Ordering::Relaxed);
                return Err(e.rule.text.clone());
            }
        }
        for form in forms.into_iter().flatten() {
            if !self.allow.iter().any(|e| e.rule.matches(form, port)) {
                self.unmatched.fetch_add(1, Ordering::Relaxed);
                return Err(NO_ALLOW_RULE.into());
            }
        }
        Ok(SocketAddr::new(ip, port))
    }

    /// Refusals so far by rule label (every rule, refused or not).
    pub fn refusals(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = self
            .deny
            .iter()
            .chain(&self.allow)
            .map(|e| (e.rule.text.clone(), e.refused.load(Ordering::Relaxed)))
            .collect();
        out.insert(NO_ALLOW_RULE.into(), self.unmatched.load(Ordering::Relaxed));
        out
    }
}

/// Figures for /stats.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PolicyStats {
    /// CONNECTs refused (403), by the rule that refused them.
    pub refused_by_rule: BTreeMap<String, u64>,
    pub reloads_total: u64,
    /// Reloads whose file failed to read or parse (the previous policy kept).
    pub reload_failures_total: u64,
}

/// The policy in force, swapped whole on reload.
#[derive(Debug)]
pub struct PolicyHandle {
    spec: PolicySpec,
    file: Option<std::path::PathBuf>,
    current: RwLock<Arc<Policy>>,
    reloads: AtomicU64,
    failures: AtomicU64,
}

impl PolicyHandle {
    /// A policy of `spec` plus the rules of `file`, if any (read now: a
    /// file that fails to read or parse is an error at start).
    pub fn new(spec: PolicySpec, file: Option<std::path::PathBuf>) -> Result<Self, PolicyError> {
        let full = Self::read(&spec, file.as_deref())?;
        Ok(Self {
            current: RwLock::new(Arc::new(Policy::build(&full, None))),
            spec,
            file,
            reloads: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    fn read(spec: &PolicySpec, file: Option<&std::path::Path>) -> Result<PolicySpec, PolicyError> {
        match file {
            None => Ok(spec.clone()),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                spec.clone().with_file_rules(&text)
            }
        }
    }

    /// Re-reads the policy file; on an error the policy in force stays.
    pub fn reload(&self) -> Result<(), PolicyError> {
        let full = match Self::read(&self.spec, self.file.as_deref()) {
            Ok(f) => f,
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let mut current = self.current.write().expect("policy lock poisoned");
        let next = Policy::build(&full, Some(&**current));
        *current = Arc::new(next);
        self.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn file(&self) -> Option<&std::path::Path> {
        self.file.as_deref()
    }

    /// [`Policy::check`] against the policy in force.
    pub fn check(&self, dest: SocketAddr) -> Result<SocketAddr, String> {
        self.current
            .read()
            .expect("policy lock poisoned")
            .check(dest)
    }

    pub fn stats(&self) -> PolicyStats {
        PolicyStats {
            refused_by_rule: self
                .current
                .read()
                .expect("policy lock poisoned")
                .refusals(),
            reloads_total: self.reloads.load(Ordering::Relaxed),
            reload_failures_total: self.failures.load(Ordering::Relaxed),
        }
    }
}

/// A policy allowing `allow` with every default deny entry applied.
pub fn allowing(allow: &[&str]) -> PolicySpec {
    PolicySpec {
        allow: allow
            .iter()
            .map(|r| r.parse().expect("a valid rule"))
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str], skip: &[DefaultDeny]) -> Policy {
        let mut spec = allowing(allow);
        spec.deny = deny.iter().map(|r| r.parse().expect("rule")).collect();
        spec.skip_default = skip.to_vec();
        spec.own_listeners = vec!["10.9.9.9:443".parse().expect("addr")];
        Policy::build(&spec, None)
    }

    fn verdict(p: &Policy, dest: &str) -> Result<SocketAddr, String> {
        p.check(dest.parse().expect("dest"))
    }

    #[test]
    fn rules_parse_cidrs_addresses_ports_and_ranges_in_both_families() {
        for (text, net, low, high) in [
            ("10.0.0.0/8", "10.0.0.0/8", 1, 65535),
            ("10.1.2.3", "10.1.2.3/32", 1, 65535),
            ("10.0.0.0/8:443", "10.0.0.0/8", 443, 443),
            ("10.0.0.0/8:8000-8999", "10.0.0.0/8", 8000, 8999),
            ("2001:db8::/32", "2001:db8::/32", 1, 65535),
            ("[2001:db8::/32]:443", "2001:db8::/32", 443, 443),
            ("[2001:db8::1]:1-1024", "2001:db8::1/128", 1, 1024),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8", 1, 65535),
            ("10.1.2.3/8", "10.0.0.0/8", 1, 65535),
        ] {
            let r: Rule = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (r.net, r.low, r.high),
                (net.parse().expect("net"), low, high),
                "{text}"
            );
        }
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/8:0",
            "10.0.0.0/8:70000",
            "10.0.0.0/8:9-8",
            "[2001:db8::/32",
            "[2001:db8::/32]443",
            "host.example:443",
            "",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn deny_wins_over_allow_and_no_matching_allow_rule_denies() {
        let p = policy(&["0.0.0.0/0", "::/0"], &["10.0.0.0/8"], &[]);
        assert_eq!(
            verdict(&p, "8.8.8.8:443"),
            Ok("8.8.8.8:443".parse().unwrap())
        );
        assert_eq!(verdict(&p, "10.1.1.1:443"), Err("deny 10.0.0.0/8".into()));
        let p = policy(&["192.0.2.0/24"], &[], &[]);
        assert_eq!(verdict(&p, "198.51.100.1:80"), Err(NO_ALLOW_RULE.into()));
        assert!(verdict(&p, "192.0.2.9:80").is_ok());
        assert_eq!(p.refusals()[NO_ALLOW_RULE], 1);
    }

    #[test]
    fn ports_and_port_ranges_apply_to_allow_and_deny_rules() {
        let p = policy(
            &[
                "192.0.2.0/24:443",
                "192.0.2.0/24:8000-8010",
                "[2001:db8::/32]:443",
            ],
            &["192.0.2.7:8005"],
            &[],
        );
        assert!(verdict(&p, "192.0.2.1:443").is_ok());
        assert!(verdict(&p, "192.0.2.1:80").is_err());
        assert!(verdict(&p, "192.0.2.1:8000").is_ok());
        assert!(verdict(&p, "192.0.2.1:8010").is_ok());
        assert!(verdict(&p, "192.0.2.1:8011").is_err());
        assert!(verdict(&p, "192.0.2.7:8004").is_ok());
        assert_eq!(
            verdict(&p, "192.0.2.7:8005"),
            Err("deny 192.0.2.7:8005".into())
        );
        assert!(verdict(&p, "[2001:db8::5]:443").is_ok());
        assert!(verdict(&p, "[2001:db8::5]:80").is_err());
    }

    #[test]
    fn the_default_deny_list_holds_even_under_allow_everything_until_skipped() {
        let all = &["0.0.0.0/0", "::/0"];
        let p = policy(all, &[], &[]);
        for (dest, entry) in [
            ("169.254.1.1:80", "default link-local 169.254.0.0/16"),
            ("[fe80::1]:80", "default link-local [fe80::/10]"),
            ("169.254.169.254:80", "default link-local 169.254.0.0/16"),
            ("[fd00:ec2::254]:80", "default metadata [fd00:ec2::254]"),
            ("100.100.100.200:80", "default metadata 100.100.100.200"),
            ("127.0.0.1:80", "default loopback 127.0.0.0/8"),
            ("[::1]:80", "default loopback [::1]"),
            ("0.0.0.0:80", "default unspecified 0.0.0.0/8"),
            ("[::]:80", "default unspecified [::]"),
            ("[::10.0.0.1]:80", "default ipv4-compatible [::/96]"),
            ("10.9.9.9:443", "default own-listeners 10.9.9.9:443"),
        ] {
            assert_eq!(verdict(&p, dest), Err(entry.to_string()), "{dest}");
        }
        assert!(
            verdict(&p, "10.9.9.9:444").is_ok(),
            "only the listener's port"
        );
        let skipped = policy(all, &[], &DefaultDeny::ALL);
        for dest in [
            "169.254.169.254:80",
            "127.0.0.1:80",
            "[::1]:80",
            "10.9.9.9:443",
        ] {
            assert!(verdict(&skipped, dest).is_ok(), "{dest}");
        }
        let p = policy(all, &[], &[DefaultDeny::Loopback]);
        assert!(verdict(&p, "127.0.0.1:80").is_ok());
        assert!(
            verdict(&p, "169.254.169.254:80").is_err(),
            "only loopback skipped"
        );
    }

    #[test]
    fn ipv4_mapped_destinations_are_matched_and_dialled_as_ipv4() {
        // The case: an IPv6 allow-all must not admit IPv4.
        let p = policy(&["::/0"], &[], &[]);
        assert_eq!(
            verdict(&p, "[::ffff:10.0.0.1]:80"),
            Err(NO_ALLOW_RULE.into())
        );
        let p = policy(&["0.0.0.0/0", "::/0"], &["10.0.0.0/8"], &[]);
        assert_eq!(
            verdict(&p, "[::ffff:10.0.0.1]:80"),
            Err("deny 10.0.0.0/8".into())
        );
        assert_eq!(
            verdict(&p, "[::ffff:8.8.8.8]:53"),
            Ok("8.8.8.8:53".parse().unwrap()),
            "dialled as IPv4"
        );
        assert!(
            verdict(&p, "[::ffff:127.0.0.1]:80").is_err(),
            "mapped loopback"
        );
        assert!(
            verdict(&p, "[::ffff:169.254.169.254]:80").is_err(),
            "mapped metadata"
        );
    }

    #[test]
    fn nat64_6to4_and_ipv4_compatible_forms_are_checked_as_their_ipv4_address_too() {
        let p = policy(
            &["0.0.0.0/0", "::/0"],
            &["10.0.0.0/8"],
            &[DefaultDeny::Ipv4Compatible],
        );
        for dest in [
            "[64:ff9b::10.0.0.1]:80",
            "[2002:0a00:0001::1]:80",
            "[::10.0.0.1]:80",
            "[64:ff9b::169.254.169.254]:80",
            "[64:ff9b::127.0.0.1]:80",
        ] {
            assert!(verdict(&p, dest).is_err(), "{dest}");
        }
        assert_eq!(
            verdict(&p, "[64:ff9b::8.8.8.8]:80"),
            Ok("[64:ff9b::8.8.8.8]:80".parse().unwrap()),
            "dialled as given"
        );
        // Both forms must be allowed.
        let v6_only = policy(&["::/0"], &[], &[]);
        assert_eq!(
            verdict(&v6_only, "[64:ff9b::8.8.8.8]:80"),
            Err(NO_ALLOW_RULE.into())
        );
        assert!(verdict(&v6_only, "[2001:db8::1]:80").is_ok());
        // IPv4-compatible is denied by default.
        let p = policy(&["0.0.0.0/0", "::/0"], &[], &[]);
        assert!(verdict(&p, "[::8.8.8.8]:80").is_err());
    }

    #[test]
    fn a_policy_file_adds_rules_and_one_that_fails_to_parse_keeps_the_previous_policy() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("policy");
        std::fs::write(
            &path,
            "# egress\nallow 0.0.0.0/0\n\ndeny 10.0.0.0/8:443 # internal\n",
        )
        .expect("write");
        let h = PolicyHandle::new(PolicySpec::default(), Some(path.clone())).expect("policy");
        assert!(h.check("8.8.8.8:443".parse().unwrap()).is_ok());
        assert_eq!(
            h.check("10.0.0.1:443".parse().unwrap()),
            Err("deny 10.0.0.0/8:443".into())
        );
        std::fs::write(&path, "allow 0.0.0.0/0\ndeny 8.8.8.8\n").expect("write");
        h.reload().expect("reload");
        assert!(h.check("8.8.8.8:443".parse().unwrap()).is_err());
        assert!(h.check("10.0.0.1:443".parse().unwrap()).is_ok());
        std::fs::write(&path, "allow 0.0.0.0/0\npermit 10.0.0.0/8\n").expect("write");
        assert!(h.reload().is_err());
        assert!(
            h.check("8.8.8.8:443".parse().unwrap()).is_err(),
            "previous kept"
        );
        let s = h.stats();
        assert_eq!((s.reloads_total, s.reload_failures_total), (1, 1));
        assert_eq!(s.refused_by_rule["deny 8.8.8.8"], 2);
    }

    #[test]
    fn refusal_counters_of_rules_kept_across_a_reload_carry_on() {
        let spec = allowing(&["0.0.0.0/0"]);
        let p = Policy::build(&spec, None);
        assert!(p.check("127.0.0.1:1".parse().unwrap()).is_err());
        let q = Policy::build(&spec, Some(&p));
        assert!(q.check("127.0.0.2:1".parse().unwrap()).is_err());
        assert_eq!(q.refusals()["default loopback 127.0.0.0/8"], 2);
    }
}
