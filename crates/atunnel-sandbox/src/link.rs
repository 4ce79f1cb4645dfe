//! Links, addresses and routes through rtnetlink, one connection per
//! namespace (a netlink socket speaks for the namespace it was created in).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo};
use netlink_packet_route::route::RouteMessage;
use nix::errno::Errno;
use rtnetlink::{
    AddressAddRequest, Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
};

use crate::netns::{NetNs, NetnsError, NsExecutor};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink in {ns}: {op}: {message}")]
    Netlink {
        ns: String,
        op: String,
        message: String,
    },
}

/// A netlink connection speaking for one namespace.
pub struct Netlink {
    ns: String,
    handle: Handle,
}

impl Netlink {
    /// Opens a netlink socket inside `ns` (on the executor thread) and drives
    /// it on the runtime.
    pub async fn open(exec: &NsExecutor, ns: &NetNs) -> Result<Self, LinkError> {
        let runtime = tokio::runtime::Handle::current();
        let name = ns.name().to_string();
        let (conn, handle, _) = exec
            .run_in(ns, move || {
                // The socket registers with the reactor as it is made.
                let _enter = runtime.enter();
                rtnetlink::new_connection()
            })
            .await?
            .map_err(|e| LinkError::Netlink {
                ns: name.clone(),
                op: "open socket".into(),
                message: e.to_string(),
            })?;
        tokio::spawn(conn);
        Ok(Self { ns: name, handle })
    }

    fn err(&self, op: &str) -> impl FnOnce(rtnetlink::Error) -> LinkError + '_ {
        let op = op.to_string();
        move |e| LinkError::Netlink {
            ns: self.ns.clone(),
            op,
            message: e.to_string(),
        }
    }

    /// The kernel's answer to a lookup of link `name`.
    async fn lookup(&self, name: &str) -> Result<Option<LinkMessage>, rtnetlink::Error> {
        self.handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_next()
            .await
    }

    /// Link `name`'s message, if it exists.
    async fn get(&self, name: &str) -> Result<Option<LinkMessage>, LinkError> {
        match self.lookup(name).await {
            Ok(link) => Ok(link),
            // The kernel answers a lookup by a missing name with ENODEV.
            Err(e) if is_errno(&e, Errno::ENODEV) => Ok(None),
            Err(e) => Err(self.err(&format!("find link {name}"))(e)),
        }
    }

    /// Veth `name`'s index and its peer's (the peer's index is in the
    /// peer's namespace); `None` if there is no such link, it is not a
    /// veth, or its peer is in this namespace.
    pub async fn veth(&self, name: &str) -> Result<Option<(u32, u32)>, LinkError> {
        let Some(link) = self.get(name).await? else {
            return Ok(None);
        };
        let mut is_veth = false;
        let mut peer = None;
        let mut peer_elsewhere = false;
        for attr in &link.attributes {
            match attr {
                LinkAttribute::LinkInfo(info) => {
                    is_veth = info
                        .iter()
                        .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth)));
                }
                LinkAttribute::Link(index) => peer = Some(*index),
                LinkAttribute::LinkNetNsId(_) => peer_elsewhere = true,
                _ => {}
            }
        }
        Ok(peer
            .filter(|_| is_veth && peer_elsewhere)
            .map(|peer| (link.header.index, peer)))
    }

    /// Deletes link `name` (a veth takes its peer with it). Missing is fine.
    pub async fn delete(&self, name: &str) -> Result<(), LinkError> {
        let Some(link) = self.get(name).await? else {
            return Ok(());
        };
        self.handle
            .link()
            .del(link.header.index)
            .execute()
            .await
            .map_err(self.err(&format!("delete link {name}")))
    }

    pub async fn index(&self, name: &str) -> Result<u32, LinkError> {
        let link = self
            .lookup(name)
            .await
            .map_err(self.err(&format!("find link {name}")))?;
        link.map(|l| l.header.index)
            .ok_or_else(|| LinkError::Netlink {
                ns: self.ns.clone(),
                op: format!("find link {name}"),
                message: "no such link".into(),
            })
    }

    /// Creates a veth pair: `name` here, `peer_name` directly inside `peer_ns`
    /// (moving it afterwards costs several times the whole setup under RTNL).
    pub async fn add_veth(
        &self,
        name: &str,
        peer_name: &str,
        peer_ns: &NetNs,
    ) -> Result<(), LinkError> {
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer_name.to_string())
            .setns_by_fd(peer_ns.as_raw_fd())
            .build();
        let msg = LinkVeth::new(name, peer_name)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(self.err(&format!("add veth {name}/{peer_name}")))
    }

    pub async fn up(&self, name: &str) -> Result<(), LinkError> {
        let index = self.index(name).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(self.err(&format!("set {name} up")))
    }

    /// A request to add `addr/prefix` to `name`. It replaces: setting up a
    /// sandbox an earlier process left is the same call, and finds the
    /// address there.
    async fn add_address_request(
        &self,
        name: &str,
        addr: IpAddr,
        prefix: u8,
    ) -> Result<AddressAddRequest, LinkError> {
        let index = self.index(name).await?;
        Ok(self.handle.address().add(index, addr, prefix).replace())
    }

    pub async fn add_address(
        &self,
        name: &str,
        addr: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), LinkError> {
        self.add_address_request(name, IpAddr::V4(addr), prefix)
            .await?
            .execute()
            .await
            .map_err(self.err(&format!("add {addr}/{prefix} to {name}")))
    }

    /// Adds `route`, a default route via `via`, replacing one already there
    /// (as [`Netlink::add_address`] does).
    async fn replace_default_route(
        &self,
        route: RouteMessage,
        via: IpAddr,
    ) -> Result<(), LinkError> {
        self.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(self.err(&format!("default route via {via}")))
    }

    pub async fn add_default_route(&self, via: Ipv4Addr) -> Result<(), LinkError> {
        let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(via).build();
        self.replace_default_route(route, IpAddr::V4(via)).await
    }

    /// Adds `addr/prefix` to `name` usable at once: no duplicate address
    /// detection (IFA_F_NODAD), so it is never tentative. Replaces an equal
    /// address, as [`Netlink::add_address`] does.
    pub async fn add_address_nodad(
        &self,
        name: &str,
        addr: Ipv6Addr,
        prefix: u8,
    ) -> Result<(), LinkError> {
        let mut req = self
            .add_address_request(name, IpAddr::V6(addr), prefix)
            .await?;
        let msg = req.message_mut();
        msg.header.flags |= AddressHeaderFlags::Nodad;
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        req.execute()
            .await
            .map_err(self.err(&format!("add {addr}/{prefix} to {name} (nodad)")))
    }

    /// Removes `addr/prefix` from `name`; a missing address is fine.
    pub async fn remove_address(
        &self,
        name: &str,
        addr: Ipv6Addr,
        prefix: u8,
    ) -> Result<(), LinkError> {
        let Some(link) = self.get(name).await? else {
            return Ok(());
        };
        let msg = rtnetlink::AddressMessageBuilder::<Ipv6Addr>::new()
            .index(link.header.index)
            .address(addr, prefix)
            .build();
        match self.handle.address().del(msg).execute().await {
            Err(e) if is_errno(&e, Errno::EADDRNOTAVAIL) => Ok(()),
            result => result.map_err(self.err(&format!("remove {addr}/{prefix} from {name}"))),
        }
    }

    pub async fn add_default_route6(&self, via: Ipv6Addr) -> Result<(), LinkError> {
        let route = RouteMessageBuilder::<Ipv6Addr>::new().gateway(via).build();
        self.replace_default_route(route, IpAddr::V6(via)).await
    }

    /// Removes the IPv6 default route; none is fine.
    pub async fn remove_default_route6(&self) -> Result<(), LinkError> {
        let route = RouteMessageBuilder::<Ipv6Addr>::new().build();
        match self.handle.route().del(route).execute().await {
            Err(e) if is_errno(&e, Errno::ESRCH) => Ok(()),
            result => result.map_err(self.err("remove the IPv6 default route")),
        }
    }
}

/// Whether the kernel refused a request with `errno`.
fn is_errno(e: &rtnetlink::Error, errno: Errno) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.code.map(|c| c.get()) == Some(-(errno as i32)))
}
