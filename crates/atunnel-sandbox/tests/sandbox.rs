//! Real sandboxes (root): namespaces, veth, the nftables redirect and filter.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use atunnel_core::original_dst::original_dst;
use atunnel_sandbox::link::Netlink;
use atunnel_sandbox::nft::{ChainType, CmpOp, Expr, Hook, MetaKey, PayloadBase};
use atunnel_sandbox::sandbox::{
    ACTOR_ADDR6, ACTOR_IFACE, DEFAULT_EGRESS_PORT, DNS_PORT, GATEWAY_ADDR, GATEWAY_ADDR6,
    GATEWAY_IFACE, PREFIX_LEN, PREFIX_LEN6, SANDBOX_NET, SANDBOX_NET6, SandboxNetwork,
};
use atunnel_sandbox::{NetNs, NsExecutor, netns, nft, require_root};
use futures_util::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags};
use netlink_packet_route::link::{LinkAttribute, LinkFlags};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteHeader};
use rtnetlink::RouteMessageBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn name(tag: &str) -> String {
    format!("atnt-{}-{tag}", std::process::id())
}

/// An executor and a new sandbox named for `tag`, redirecting to `port`,
/// dual-stack if `ipv6`.
async fn new_sandbox(tag: &str, port: u16, ipv6: bool) -> (NsExecutor, SandboxNetwork) {
    let exec = NsExecutor::start().expect("executor");
    let sb = SandboxNetwork::create(&exec, &name(tag), port, ipv6)
        .await
        .expect("sandbox");
    (exec, sb)
}

/// The ruleset a dual-stack sandbox redirecting to `port` must hold.
fn dual_stack_rules(port: u16) -> nft::Ruleset {
    nft::Ruleset::sandbox(
        GATEWAY_IFACE,
        SANDBOX_NET,
        PREFIX_LEN,
        Some((SANDBOX_NET6, PREFIX_LEN6)),
        port,
        DNS_PORT,
    )
    .expect("ruleset")
}

/// A netlink view of one namespace, opened here rather than through the
/// crate's `Netlink`, so the layout is read back by something other than
/// its builder.
struct Observer(rtnetlink::Handle);

struct Link {
    name: String,
    index: u32,
    up: bool,
}

impl Observer {
    async fn open(exec: &NsExecutor, ns: &NetNs) -> Self {
        let runtime = tokio::runtime::Handle::current();
        let (conn, handle, _) = exec
            .run_in(ns, move || {
                let _enter = runtime.enter();
                rtnetlink::new_connection()
            })
            .await
            .expect("executor")
            .expect("netlink socket in the namespace");
        tokio::spawn(conn);
        Self(handle)
    }

    async fn links(&self) -> Vec<Link> {
        let links: Vec<_> = self
            .0
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .expect("dump links");
        links
            .into_iter()
            .map(|l| Link {
                name: l
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        LinkAttribute::IfName(n) => Some(n.clone()),
                        _ => None,
                    })
                    .unwrap_or_default(),
                index: l.header.index,
                up: l.header.flags.contains(LinkFlags::Up),
            })
            .collect()
    }

    async fn link(&self, name: &str) -> Link {
        self.links()
            .await
            .into_iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no link {name}"))
    }

    /// Addresses on link `index`: address, prefix length, flags.
    async fn addresses(&self, index: u32) -> Vec<(IpAddr, u8, AddressHeaderFlags)> {
        let addrs: Vec<_> = self
            .0
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .expect("dump addresses");
        addrs
            .into_iter()
            .filter_map(|a| {
                let ip = a.attributes.iter().find_map(|at| match at {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })?;
                Some((ip, a.header.prefix_len, a.header.flags))
            })
            .collect()
    }

    /// The main table's IPv4 default routes: gateway and output link (a
    /// gateway of the other family fails the callers' comparisons).
    async fn ipv4_default_routes(&self) -> Vec<(Option<IpAddr>, Option<u32>)> {
        self.default_routes(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .await
    }

    /// The main table's IPv6 default routes: gateway and output link.
    async fn ipv6_default_routes(&self) -> Vec<(Option<IpAddr>, Option<u32>)> {
        self.default_routes(RouteMessageBuilder::<Ipv6Addr>::new().build())
            .await
    }

    async fn default_routes(
        &self,
        query: netlink_packet_route::route::RouteMessage,
    ) -> Vec<(Option<IpAddr>, Option<u32>)> {
        let routes: Vec<_> = self
            .0
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .expect("dump routes");
        routes
            .into_iter()
            .filter(|r| {
                r.header.table == RouteHeader::RT_TABLE_MAIN
                    && r.header.destination_prefix_length == 0
            })
            .map(|r| {
                let via = r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Gateway(RouteAddress::Inet(via)) => Some(IpAddr::V4(*via)),
                    RouteAttribute::Gateway(RouteAddress::Inet6(via)) => Some(IpAddr::V6(*via)),
                    _ => None,
                });
                let oif = r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                });
                (via, oif)
            })
            .collect()
    }

    /// Waits (bounded) until `iface` has a link-local IPv6 address past
    /// duplicate address detection (until then the kernel neither sends
    /// from it nor accepts packets to it, so probing earlier proves nothing).
    async fn usable_link_local(&self, iface: &str) -> (Ipv6Addr, u32) {
        let index = self.link(iface).await.index;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = self
                .addresses(index)
                .await
                .into_iter()
                .find_map(|a| match a {
                    (IpAddr::V6(ip), _, flags)
                        if ip.is_unicast_link_local()
                            && !flags.intersects(
                                AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed,
                            ) =>
                    {
                        Some(ip)
                    }
                    _ => None,
                });
            if let Some(ip) = ready {
                return (ip, index);
            }
            assert!(
                Instant::now() < deadline,
                "{iface} has no usable link-local IPv6 address"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_namespace_holds_its_end_of_the_veth_addressed_and_routed() {
    require_root("sandbox layout test");
    let (exec, sb) = new_sandbox("layout", DEFAULT_EGRESS_PORT, true).await;
    let gw = Observer::open(&exec, &sb.gateway).await;
    let rt = Observer::open(&exec, &sb.runtime).await;
    for (view, iface, addr) in [
        (&gw, "atside", Ipv4Addr::new(169, 254, 17, 1)),
        (&rt, "eth0", Ipv4Addr::new(169, 254, 17, 2)),
    ] {
        let links = view.links().await;
        let names: BTreeSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            BTreeSet::from(["lo", iface]),
            "links of {iface}'s side"
        );
        for link in &links {
            assert!(link.up, "{} is down on {iface}'s side", link.name);
        }
        let index = view.link(iface).await.index;
        let v4: Vec<_> = view
            .addresses(index)
            .await
            .into_iter()
            .filter(|(ip, _, _)| ip.is_ipv4())
            .map(|(ip, prefix, _)| (ip, prefix))
            .collect();
        assert_eq!(v4, vec![(IpAddr::V4(addr), 30)], "addresses of {iface}");
    }
    let eth0 = rt.link("eth0").await.index;
    assert_eq!(
        rt.ipv4_default_routes().await,
        vec![(Some(IpAddr::V4(Ipv4Addr::new(169, 254, 17, 1))), Some(eth0))],
        "the actor's default route goes via the gateway side"
    );
    assert!(
        gw.ipv4_default_routes().await.is_empty(),
        "the gateway namespace has no way out but atunnel's sockets"
    );
    assert_ipv6_side(&gw, &rt).await;
    assert!(gw.ipv6_default_routes().await.is_empty(), "nor over IPv6");
    sb.destroy(&exec).await.expect("destroy");
}

/// Each end holds its address of the sandbox's IPv6 /126, usable at once
/// (added without DAD, never tentative), and the actor's IPv6 default route
/// goes via the gateway side.
async fn assert_ipv6_side(gw: &Observer, rt: &Observer) {
    for (view, iface, addr) in [
        (gw, GATEWAY_IFACE, GATEWAY_ADDR6),
        (rt, ACTOR_IFACE, ACTOR_ADDR6),
    ] {
        let index = view.link(iface).await.index;
        let ula: Vec<_> = view
            .addresses(index)
            .await
            .into_iter()
            .filter(|(ip, _, _)| matches!(ip, IpAddr::V6(v6) if !v6.is_unicast_link_local()))
            .collect();
        assert_eq!(ula.len(), 1, "one IPv6 address on {iface}: {ula:?}");
        let (ip, prefix, flags) = ula[0];
        assert_eq!((ip, prefix), (IpAddr::V6(addr), PREFIX_LEN6), "{iface}");
        assert!(
            flags.contains(AddressHeaderFlags::Nodad)
                && !flags.intersects(AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed),
            "{iface}'s {addr} is usable at once: {flags:?}"
        );
    }
    let eth0 = rt.link(ACTOR_IFACE).await.index;
    assert_eq!(
        rt.ipv6_default_routes().await,
        vec![(Some(IpAddr::V6(GATEWAY_ADDR6)), Some(eth0))],
        "the actor's IPv6 default route goes via the gateway side"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dstnat_rule_per_family_redirects_outside_tcp_to_the_egress_port() {
    require_root("ruleset test");
    assert_eq!(DEFAULT_EGRESS_PORT, 15001);
    // Not the default, so the rule is seen to follow the sandbox's port.
    let port = 15123;
    let (exec, sb) = new_sandbox("rules", port, true).await;
    let listed = exec
        .run_in(&sb.gateway, nft::list)
        .await
        .expect("executor")
        .expect("dump the gateway namespace's nftables objects over netlink");
    assert_eq!(
        listed.tables,
        vec![nft::Table {
            family: nft::Family::Inet,
            name: "atunnel".into()
        }],
        "one inet table, so IPv6 is filtered too"
    );
    let prerouting: Vec<_> = listed
        .chains
        .iter()
        .filter(|c| c.base.as_ref().is_some_and(|b| b.hook == Hook::Prerouting))
        .collect();
    assert_eq!(prerouting.len(), 1, "one prerouting chain: {listed:#?}");
    let base = prerouting[0].base.as_ref().expect("a base chain");
    assert_eq!(
        (base.kind, base.priority),
        (ChainType::Nat, -100),
        "a nat chain at dstnat priority"
    );
    let in_prerouting: Vec<_> = listed
        .rules
        .iter()
        .filter(|r| r.chain == prerouting[0].name)
        .collect();
    assert_eq!(
        in_prerouting.len(),
        2,
        "exactly one redirect rule per family: {listed:#?}"
    );
    let eq = |data: &[u8]| Expr::Cmp {
        op: CmpOp::Eq,
        data: data.to_vec(),
    };
    assert_eq!(
        in_prerouting[0].exprs,
        vec![
            // ip daddr & 255.255.255.252 != 169.254.17.0 (IPv4 only)
            Expr::Meta(MetaKey::NfProto),
            eq(&[2]),
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 16,
                len: 4
            },
            Expr::Bitwise {
                mask: vec![255, 255, 255, 252],
                xor: vec![0; 4]
            },
            Expr::Cmp {
                op: CmpOp::Neq,
                data: vec![169, 254, 17, 0]
            },
            // meta l4proto tcp
            Expr::Meta(MetaKey::L4Proto),
            eq(&[6]),
            // redirect to :port
            Expr::Immediate(port.to_be_bytes().to_vec()),
            Expr::Redirect,
        ],
        "TCP outside the sandbox /30 goes to the egress port"
    );
    let mut mask6 = vec![0xff; 16];
    mask6[15] = 0xfc;
    assert_eq!(
        in_prerouting[1].exprs,
        vec![
            // ip6 daddr & ffff:...:fffc != fd00:a7:17:: (IPv6 only)
            Expr::Meta(MetaKey::NfProto),
            eq(&[10]),
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 24,
                len: 16
            },
            Expr::Bitwise {
                mask: mask6,
                xor: vec![0; 16]
            },
            Expr::Cmp {
                op: CmpOp::Neq,
                data: SANDBOX_NET6.octets().to_vec()
            },
            Expr::Meta(MetaKey::L4Proto),
            eq(&[6]),
            Expr::Immediate(port.to_be_bytes().to_vec()),
            Expr::Redirect,
        ],
        "TCP outside the sandbox IPv6 /126 goes to the egress port"
    );
    let nat_rules = listed
        .rules
        .iter()
        .filter(|r| {
            r.exprs.iter().any(|e| {
                matches!(e, Expr::Redirect)
                    || matches!(e, Expr::Other(name) if ["nat", "redir", "masq"].contains(&name.as_str()))
            })
        })
        .count();
    assert_eq!(nat_rules, 2, "no other rule rewrites destinations");
    assert_eq!(
        listed,
        dual_stack_rules(port),
        "the kernel holds exactly the sandbox's ruleset"
    );
    sb.destroy(&exec).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirected_connections_keep_their_original_destination() {
    require_root("redirect test");
    let (exec, sb) = new_sandbox("redir", DEFAULT_EGRESS_PORT, true).await;
    let listener = sb.listen_egress(&exec).await.expect("egress listener");
    for dest in [
        "192.0.2.10:443",
        "198.51.100.7:8080",
        "203.0.113.99:9999",
        "[2001:db8::10]:443",
        "[2001:db8:ffff::7]:7",
        "[64:ff9b::c000:20a]:9999",
    ] {
        let dest: SocketAddr = dest.parse().expect("addr");
        // Bounded: a dial the redirect misses is refused, and the accept
        // beside it would wait forever.
        let (client, accepted) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(sb.connect_from_runtime(&exec, dest), listener.accept())
        })
        .await
        .unwrap_or_else(|_| panic!("a dial to {dest} is not redirected to the egress listener"));
        let mut client = client.expect("actor dials any address");
        let (mut server, peer) = accepted.expect("redirected to the egress listener");
        // One dual-stack listener: IPv4 peers arrive v4-mapped.
        let actor = match dest {
            SocketAddr::V4(_) => IpAddr::from([169, 254, 17, 2]),
            SocketAddr::V6(_) => IpAddr::V6(ACTOR_ADDR6),
        };
        assert_eq!(peer.ip().to_canonical(), actor, "{dest}");
        assert_eq!(
            original_dst(&server).expect("original destination"),
            dest,
            "the original destination of a dial to {dest}"
        );
        client.write_all(b"hello").await.expect("write");
        let mut got = [0u8; 5];
        server.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");
        server.write_all(b"world").await.expect("write back");
        client.read_exact(&mut got).await.expect("read back");
        assert_eq!(&got, b"world");
    }
    sb.destroy(&exec).await.expect("destroy");
}

/// An address outside the sandbox that the gateway namespace answers for in
/// this test, so nothing but the filter stands between a probe and a socket.
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const PROBE_PORT: u16 = 9;
/// How long no forbidden probe may show up after the DNS probe, sent after
/// all of them, has arrived.
const QUIET: Duration = Duration::from_millis(300);
const ICMP_ID: u16 = 0x4174;

/// The actor's sockets, made in its runtime namespace.
struct ActorProbes {
    /// A raw ICMP socket behind tokio's UDP type: sendto and recv are the
    /// same calls on a raw socket, and this needs no `unsafe` registration.
    icmp: tokio::net::UdpSocket,
    udp4: tokio::net::UdpSocket,
    udp6: tokio::net::UdpSocket,
    gateway_v6: SocketAddrV6,
    all_nodes: SocketAddrV6,
}

impl ActorProbes {
    async fn open(exec: &NsExecutor, sb: &SandboxNetwork, gateway_v6: Ipv6Addr, eth0: u32) -> Self {
        let (icmp, udp4, udp6) = exec
            .run_in(&sb.runtime, || {
                // A raw socket, not a ping socket: ping sockets need the
                // namespace's ping_group_range widened.
                let icmp = socket2::Socket::new(
                    socket2::Domain::IPV4,
                    socket2::Type::RAW,
                    Some(socket2::Protocol::ICMPV4),
                )?;
                icmp.set_nonblocking(true)?;
                let udp4 = std::net::UdpSocket::bind("0.0.0.0:0")?;
                udp4.set_nonblocking(true)?;
                let udp6 = std::net::UdpSocket::bind("[::]:0")?;
                udp6.set_nonblocking(true)?;
                Ok::<_, std::io::Error>((icmp, udp4, udp6))
            })
            .await
            .expect("executor")
            .expect("sockets in the runtime namespace");
        Self {
            icmp: tokio::net::UdpSocket::from_std(icmp.into()).expect("register raw socket"),
            udp4: tokio::net::UdpSocket::from_std(udp4).expect("register"),
            udp6: tokio::net::UdpSocket::from_std(udp6).expect("register"),
            gateway_v6: SocketAddrV6::new(gateway_v6, PROBE_PORT, 0, eth0),
            all_nodes: SocketAddrV6::new(
                "ff02::1".parse().expect("all-nodes"),
                PROBE_PORT,
                0,
                eth0,
            ),
        }
    }

    /// ICMP echo to the gateway side and outside; UDP (not DNS) to both;
    /// UDP over IPv6 to the gateway side's link-local and to all nodes.
    async fn send_forbidden(&self) {
        for (seq, to) in [GATEWAY_ADDR, OUTSIDE].into_iter().enumerate() {
            let to = SocketAddr::from((to, 0));
            self.icmp
                .send_to(&echo_request(ICMP_ID, seq as u16), to)
                .await
                .expect("send echo request");
        }
        for (payload, to) in [
            (&b"v4 gateway"[..], GATEWAY_ADDR),
            (&b"v4 outside"[..], OUTSIDE),
        ] {
            self.udp4
                .send_to(payload, (to, PROBE_PORT))
                .await
                .expect("send UDP");
        }
        self.udp6
            .send_to(b"v6 unicast", self.gateway_v6)
            .await
            .expect("send UDP over IPv6");
        self.udp6
            .send_to(b"v6 all-nodes", self.all_nodes)
            .await
            .expect("send UDP over IPv6 multicast");
    }

    /// The source of the next echo reply to our requests.
    async fn echo_reply(&self) -> Ipv4Addr {
        let mut buf = [0u8; 1500];
        loop {
            let n = self.icmp.recv(&mut buf).await.expect("read raw socket");
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            let icmp = &buf[ihl.min(n)..n];
            if icmp.len() >= 8 && icmp[0] == 0 && icmp[4..6] == ICMP_ID.to_be_bytes() {
                return Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
            }
        }
    }
}

fn echo_request(id: u16, seq: u16) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[0] = 8; // echo request, code 0
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    p[8..].copy_from_slice(b"atunnel!");
    let mut sum: u32 = p
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[2..4].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv4_only_sandbox_lets_only_ipv4_tcp_and_dns_leave_the_actor() {
    require_root("filter test");
    let (exec, sb) = new_sandbox("filter", DEFAULT_EGRESS_PORT, false).await;
    Netlink::open(&exec, &sb.gateway)
        .await
        .expect("netlink")
        .add_address("lo", OUTSIDE, 32)
        .await
        .expect("outside address in the gateway namespace");
    let (gateway_v6, _) = Observer::open(&exec, &sb.gateway)
        .await
        .usable_link_local(GATEWAY_IFACE)
        .await;
    let (_, eth0) = Observer::open(&exec, &sb.runtime)
        .await
        .usable_link_local(ACTOR_IFACE)
        .await;

    // Gateway side: DNS, a dual-stack UDP socket every probe would reach,
    // and a dual-stack TCP listener for the IPv6 dial.
    let dns = sb
        .bind_udp(&exec, SocketAddr::from((GATEWAY_ADDR, 53)))
        .await
        .expect("dns socket");
    let any_udp = sb
        .bind_udp(&exec, SocketAddr::from((Ipv6Addr::UNSPECIFIED, PROBE_PORT)))
        .await
        .expect("probe socket");
    let any_tcp = sb
        .listen_tcp(&exec, SocketAddr::from((Ipv6Addr::UNSPECIFIED, 8080)))
        .await
        .expect("probe listener");
    let actor = ActorProbes::open(&exec, &sb, gateway_v6, eth0).await;
    let tcp6_dest = SocketAddr::V6(SocketAddrV6::new(gateway_v6, 8080, 0, eth0));

    // Every forbidden probe first, the DNS probe last: once DNS is in, a
    // probe let through would be in too, or follow within the quiet period.
    let mut buf = [0u8; 64];
    {
        let dial = sb.connect_from_runtime(&exec, tcp6_dest);
        tokio::pin!(dial);
        actor.send_forbidden().await;
        actor
            .udp4
            .send_to(b"dns query", (GATEWAY_ADDR, 53))
            .await
            .expect("send DNS");
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), dns.recv_from(&mut buf))
            .await
            .expect("DNS arrives")
            .expect("recv");
        assert_eq!(&buf[..n], b"dns query");
        let leaked = tokio::time::timeout(QUIET, async {
            tokio::select! {
                from = actor.echo_reply() => format!("ICMP echo answered by {from}"),
                got = any_udp.recv_from(&mut buf) => {
                    let (n, _) = got.expect("recv");
                    format!("UDP {:?} delivered", String::from_utf8_lossy(&buf[..n]))
                }
                _ = any_tcp.accept() => "TCP over IPv6 accepted".to_string(),
                Ok(_) = &mut dial => "TCP over IPv6 connected".to_string(),
            }
        })
        .await;
        assert!(leaked.is_err(), "the filter let through: {leaked:?}");
    }

    // The same probes with the ruleset gone do arrive: the filter stopped
    // them, not a probe that could never work.
    exec.run_in(&sb.gateway, || nft::delete_table(nft::FAMILY, nft::TABLE))
        .await
        .expect("executor")
        .expect("delete the table");
    actor.send_forbidden().await;
    let unfiltered = async {
        let mut answered = BTreeSet::new();
        while answered.len() < 2 {
            answered.insert(actor.echo_reply().await);
        }
        assert_eq!(answered, BTreeSet::from([GATEWAY_ADDR, OUTSIDE]));
        let mut delivered = BTreeSet::new();
        while delivered.len() < 4 {
            let (n, _) = any_udp.recv_from(&mut buf).await.expect("recv");
            delivered.insert(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(
            delivered,
            BTreeSet::from(
                ["v4 gateway", "v4 outside", "v6 unicast", "v6 all-nodes"].map(String::from)
            )
        );
        let (_client, accepted) = tokio::join!(
            async {
                sb.connect_from_runtime(&exec, tcp6_dest)
                    .await
                    .expect("IPv6 dial")
            },
            any_tcp.accept()
        );
        accepted.expect("IPv6 accept");
    };
    tokio::time::timeout(Duration::from_secs(10), unfiltered)
        .await
        .expect("unfiltered probes arrive");
    sb.destroy(&exec).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_sandbox_lets_dns_but_not_other_udp_in_over_ipv6() {
    require_root("IPv6 filter test");
    let (exec, sb) = new_sandbox("filter6", DEFAULT_EGRESS_PORT, true).await;
    let dns = sb
        .bind_udp(&exec, SocketAddr::from((GATEWAY_ADDR6, DNS_PORT)))
        .await
        .expect("dns socket");
    let probe = sb
        .bind_udp(&exec, SocketAddr::from((GATEWAY_ADDR6, PROBE_PORT)))
        .await
        .expect("probe socket");
    let udp6 = exec
        .run_in(&sb.runtime, || {
            let s = std::net::UdpSocket::bind("[::]:0")?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(s)
        })
        .await
        .expect("executor")
        .expect("socket");
    let udp6 = tokio::net::UdpSocket::from_std(udp6).expect("register");
    let to_probe = SocketAddr::from((GATEWAY_ADDR6, PROBE_PORT));
    // The probe first, DNS last: once DNS is in (which needs neighbour
    // discovery to pass the filter), a probe let through would be in too.
    udp6.send_to(b"v6 probe", to_probe).await.expect("send");
    udp6.send_to(b"dns query", (GATEWAY_ADDR6, DNS_PORT))
        .await
        .expect("send DNS");
    let mut buf = [0u8; 64];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), dns.recv_from(&mut buf))
        .await
        .expect("DNS over IPv6 arrives")
        .expect("recv");
    assert_eq!(&buf[..n], b"dns query");
    assert_eq!(from.ip(), IpAddr::V6(ACTOR_ADDR6));
    let leaked = tokio::time::timeout(QUIET, probe.recv_from(&mut buf)).await;
    assert!(
        leaked.is_err(),
        "the filter let UDP to port {PROBE_PORT} in: {leaked:?}"
    );
    // With the ruleset gone the probe arrives: the filter stopped it.
    exec.run_in(&sb.gateway, || nft::delete_table(nft::FAMILY, nft::TABLE))
        .await
        .expect("executor")
        .expect("delete the table");
    udp6.send_to(b"v6 probe", to_probe).await.expect("send");
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), probe.recv_from(&mut buf))
        .await
        .expect("the unfiltered probe arrives")
        .expect("recv");
    assert_eq!(&buf[..n], b"v6 probe");
    sb.destroy(&exec).await.expect("destroy");
}

/// `sb` has no IPv6 side: no address but link-local, no IPv6 default route,
/// the IPv4-only ruleset, and an IPv6 dial from the actor fails at once
/// with ENETUNREACH (no route), not after a timeout.
async fn assert_ipv4_only(exec: &NsExecutor, sb: &SandboxNetwork) {
    for (ns, iface) in [(&sb.gateway, GATEWAY_IFACE), (&sb.runtime, ACTOR_IFACE)] {
        let view = Observer::open(exec, ns).await;
        let index = view.link(iface).await.index;
        let v6: Vec<_> = view
            .addresses(index)
            .await
            .into_iter()
            .filter(|(ip, _, _)| matches!(ip, IpAddr::V6(v6) if !v6.is_unicast_link_local()))
            .collect();
        assert!(v6.is_empty(), "{iface} has IPv6 addresses: {v6:?}");
        assert!(
            view.ipv6_default_routes().await.is_empty(),
            "{iface}'s side has an IPv6 default route"
        );
    }
    let listed = exec
        .run_in(&sb.gateway, nft::list)
        .await
        .expect("executor")
        .expect("dump");
    assert_eq!(
        listed,
        nft::Ruleset::sandbox(
            GATEWAY_IFACE,
            SANDBOX_NET,
            PREFIX_LEN,
            None,
            sb.egress_port(),
            DNS_PORT
        )
        .expect("ruleset"),
        "the IPv4-only ruleset"
    );
    let dest: SocketAddr = "[2001:db8::10]:7".parse().expect("addr");
    let err = tokio::time::timeout(Duration::from_secs(5), sb.connect_from_runtime(exec, dest))
        .await
        .expect("an IPv6 dial fails at once")
        .expect_err("an IPv6 dial from an IPv4-only sandbox");
    let errno = match &err {
        atunnel_sandbox::SandboxError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    };
    assert_eq!(errno, Some(libc::ENETUNREACH), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv4_only_sandbox_has_no_ipv6_side_made_or_adopted() {
    require_root("IPv4-only sandbox test");
    let exec = NsExecutor::start().expect("executor");
    let fresh = SandboxNetwork::create(&exec, &name("v4only"), DEFAULT_EGRESS_PORT, false)
        .await
        .expect("IPv4-only sandbox");
    assert!(!fresh.ipv6());
    assert_ipv4_only(&exec, &fresh).await;
    fresh.destroy(&exec).await.expect("destroy");

    // A dual-stack sandbox an earlier process left, adopted IPv4 only.
    let n = name("v4adopt");
    let _left = SandboxNetwork::create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("dual-stack sandbox");
    let (sb, adopted) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, false)
        .await
        .expect("adopt IPv4 only");
    assert!(adopted);
    assert_ipv4_only(&exec, &sb).await;
    sb.destroy(&exec).await.expect("destroy");
}

#[tokio::test]
async fn destroying_twice_is_harmless() {
    require_root("sandbox destroy test");
    let (exec, sb) = new_sandbox("twice", DEFAULT_EGRESS_PORT, true).await;
    sb.clone().destroy(&exec).await.expect("first destroy");
    assert!(!netns::exists(sb.name()));
    sb.destroy(&exec).await.expect("second destroy is a no-op");
}

#[tokio::test]
async fn a_refused_ruleset_names_the_object_and_errno_and_leaves_nothing() {
    require_root("nftables refusal test");
    let exec = NsExecutor::start().expect("executor");
    let ns_name = name("refused");
    let ns = exec.create(&ns_name).await.expect("namespace");
    // A valid table and chain, then a nat chain on the forward hook, which
    // the kernel refuses (nat chains hook pre/postrouting, input, output).
    let mut rules = nft::Ruleset::drop_tcp_port("refused", 4321);
    let mut nat_forward = rules.chains[0].clone();
    nat_forward.name = "natfwd".into();
    nat_forward.base = Some(nft::BaseChain {
        kind: ChainType::Nat,
        hook: Hook::Forward,
        priority: 0,
        policy: nft::Verdict::Accept,
    });
    rules.chains.push(nat_forward);
    let err = exec
        .run_in(&ns, move || nft::apply(&rules))
        .await
        .expect("executor")
        .expect_err("the kernel refuses a nat chain on forward");
    let message = err.to_string();
    assert!(
        message.contains("add chain inet refused natfwd") && message.contains("EOPNOTSUPP"),
        "the error names the object and the errno: {message}"
    );
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    let listed = exec
        .run_in(&ns, nft::list)
        .await
        .expect("executor")
        .expect("dump");
    assert_eq!(
        listed,
        nft::Ruleset::default(),
        "one batch: the valid table, chains and rules before the refused chain are not kept"
    );
    let missing = exec
        .run_in(&ns, || nft::delete_table(nft::FAMILY, "refused"))
        .await
        .expect("executor")
        .expect_err("no such table");
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
    exec.delete(&ns_name).await.expect("delete namespace");
}

/// The namespace a name in /run/netns is bound to (its nsfs inode).
fn ns_inode(name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(std::path::Path::new(netns::NETNS_DIR).join(name))
        .expect("the namespace's mount point")
        .ino()
}

/// `sb` is set up exactly once, as a new sandbox is: each side's links
/// (up), one IPv4 and one IPv6 address each, the actor's default routes, the gateway
/// namespace's ruleset and nothing more, and a redirected connection
/// arrives at the egress listener.
async fn assert_set_up_once(exec: &NsExecutor, sb: &SandboxNetwork) {
    let gw = Observer::open(exec, &sb.gateway).await;
    let rt = Observer::open(exec, &sb.runtime).await;
    for (view, iface, addr) in [
        (&gw, GATEWAY_IFACE, GATEWAY_ADDR),
        (&rt, ACTOR_IFACE, Ipv4Addr::new(169, 254, 17, 2)),
    ] {
        let links = view.links().await;
        let names: BTreeSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            BTreeSet::from(["lo", iface]),
            "links of {iface}'s side"
        );
        assert!(
            links.iter().all(|l| l.up),
            "every link of {iface}'s side is up"
        );
        let index = view.link(iface).await.index;
        let v4: Vec<_> = view
            .addresses(index)
            .await
            .into_iter()
            .filter(|(ip, _, _)| ip.is_ipv4())
            .map(|(ip, prefix, _)| (ip, prefix))
            .collect();
        assert_eq!(
            v4,
            vec![(IpAddr::V4(addr), PREFIX_LEN)],
            "addresses of {iface}"
        );
    }
    let eth0 = rt.link(ACTOR_IFACE).await.index;
    assert_eq!(
        rt.ipv4_default_routes().await,
        vec![(Some(IpAddr::V4(GATEWAY_ADDR)), Some(eth0))]
    );
    assert_ipv6_side(&gw, &rt).await;
    let listed = exec
        .run_in(&sb.gateway, nft::list)
        .await
        .expect("executor")
        .expect("dump");
    assert_eq!(
        listed,
        dual_stack_rules(sb.egress_port()),
        "the kernel holds the sandbox's ruleset once, not a second copy beside the first"
    );
    let listener = sb.listen_egress(exec).await.expect("egress listener");
    for dest in ["192.0.2.10:443", "[2001:db8::10]:443"] {
        let dest: SocketAddr = dest.parse().expect("addr");
        let (client, accepted) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(sb.connect_from_runtime(exec, dest), listener.accept())
        })
        .await
        .expect("the redirect delivers the actor's connection");
        let (mut client, mut accepted) = (client.expect("dial"), accepted.expect("accept").0);
        assert_eq!(
            original_dst(&accepted).expect("SO_ORIGINAL_DST"),
            dest,
            "the original destination of a dial to {dest}"
        );
        client.write_all(b"up").await.expect("write");
        let mut got = [0u8; 2];
        accepted.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surviving_sandbox_is_adopted_with_its_runtime_namespace_and_programs_in_it() {
    require_root("sandbox adoption test");
    let exec = NsExecutor::start().expect("executor");
    let n = name("adopt");
    // An earlier process's sandbox, and the actor's program listening in it.
    let before = SandboxNetwork::create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("sandbox");
    let program = exec
        .run_in(&before.runtime, || {
            atunnel_sandbox::sandbox::listen_tcp("0.0.0.0:8080".parse().expect("addr"))
        })
        .await
        .expect("executor")
        .expect("the actor's listener");
    let program = tokio::net::TcpListener::from_std(program).expect("register");
    let inode = ns_inode(&n);
    drop(before); // the process died: its handles are gone, the names stay

    let (sb, adopted) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("adopted");
    assert!(adopted, "both namespaces were there");
    assert_eq!(ns_inode(&n), inode, "the runtime namespace is the same one");
    assert_set_up_once(&exec, &sb).await;
    // The program's listener, made before the adoption, is reached as
    // ingress reaches an actor.
    let (dial, accepted) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            sb.connect_from_gateway(&exec, atunnel_sandbox::sandbox::actor_addr(8080)),
            program.accept()
        )
    })
    .await
    .expect("ingress reaches the program");
    dial.expect("dial the actor");
    accepted.expect("the program accepts");
    // Adopting again changes nothing.
    let (sb, adopted) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("adopted twice");
    assert!(adopted);
    assert_set_up_once(&exec, &sb).await;
    sb.destroy(&exec).await.expect("destroy");
    assert!(!netns::exists(&n) && !netns::exists(&format!("{n}-at")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_built_leftover_is_completed_around_its_runtime_namespace() {
    require_root("half-built sandbox test");
    let exec = NsExecutor::start().expect("executor");
    // The gateway namespace is missing and its name is an empty file (a
    // process that died before mounting it).
    let n = name("halfgw");
    exec.create(&n).await.expect("runtime only");
    std::fs::write(
        std::path::Path::new(netns::NETNS_DIR).join(format!("{n}-at")),
        b"",
    )
    .expect("a stale mount point");
    let inode = ns_inode(&n);
    let (sb, adopted) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("completed");
    assert!(adopted);
    assert_eq!(ns_inode(&n), inode, "the runtime namespace is kept");
    assert_set_up_once(&exec, &sb).await;
    sb.destroy(&exec).await.expect("destroy");

    // Both namespaces, no veth.
    let n = name("noveth");
    exec.create(&n).await.expect("runtime");
    exec.create(&format!("{n}-at")).await.expect("gateway");
    let (sb, _) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("completed");
    assert_set_up_once(&exec, &sb).await;
    sb.destroy(&exec).await.expect("destroy");

    // A veth whose other end is in a third namespace, not the runtime one.
    let n = name("wrongveth");
    let elsewhere = name("elsewhere");
    let runtime = exec.create(&n).await.expect("runtime");
    let gateway = exec.create(&format!("{n}-at")).await.expect("gateway");
    let other = exec.create(&elsewhere).await.expect("third");
    Netlink::open(&exec, &gateway)
        .await
        .expect("netlink")
        .add_veth(GATEWAY_IFACE, ACTOR_IFACE, &other)
        .await
        .expect("a misplaced pair");
    drop((runtime, gateway));
    let (sb, _) = SandboxNetwork::adopt_or_create(&exec, &n, DEFAULT_EGRESS_PORT, true)
        .await
        .expect("rebuilt");
    assert_set_up_once(&exec, &sb).await;
    let third = Observer::open(&exec, &other).await;
    assert!(
        third.links().await.iter().all(|l| l.name != ACTOR_IFACE),
        "the misplaced pair is gone"
    );
    sb.destroy(&exec).await.expect("destroy");
    exec.delete(&elsewhere).await.expect("delete");
}

#[tokio::test]
async fn a_leftover_name_is_listed_under_its_prefix_only() {
    require_root("netns listing test");
    let exec = NsExecutor::start().expect("executor");
    let prefix = name("list-");
    for n in ["a", "a-at", "b"] {
        exec.create(&format!("{prefix}{n}"))
            .await
            .expect("namespace");
    }
    exec.create(&name("listother")).await.expect("namespace");
    let listed = netns::list_prefixed(&prefix).expect("list");
    assert_eq!(
        listed,
        ["a", "a-at", "b"].map(|n| format!("{prefix}{n}")).to_vec()
    );
    for n in listed {
        exec.delete(&n).await.expect("delete");
    }
    exec.delete(&name("listother")).await.expect("delete");
}
