//! Each sandbox's DNS relay, by actor uid: the tunnel adds and removes
//! them with sandboxes; /stats, /metrics and the holdings read them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use atunnel_dns::DnsRelay;

/// Each sandbox's DNS relay, by actor uid.
pub(crate) type DnsRelays = Arc<Mutex<BTreeMap<String, DnsRelay>>>;

/// One sandbox's DNS relay figures.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SandboxDnsStats {
    pub actor: String,
    #[serde(flatten)]
    pub relay: atunnel_dns::DnsRelayStats,
}

pub(crate) fn dns_stats(relays: &DnsRelays) -> Vec<SandboxDnsStats> {
    relays
        .lock()
        .expect("dns relays lock poisoned")
        .iter()
        .map(|(actor, relay)| SandboxDnsStats {
            actor: actor.clone(),
            relay: relay.stats(),
        })
        .collect()
}
