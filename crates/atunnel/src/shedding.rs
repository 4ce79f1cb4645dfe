//! Shedding under overload: the overload guard's view of the actors across
//! egress, ingress and DNS (what each holds), and the cut of the actor it
//! picks on both sides. Here rather than in `holdings`, which egress and
//! ingress use to count, so that neither side imports the other's user.

use std::collections::HashMap;
use std::sync::Weak;

use atunnel_process::overload::Held;

use crate::holdings::{
    DNS_QUERY_HELD_BYTES, DNS_QUERY_HELD_DESCRIPTORS, GATEWAY_CONNECTION_HELD_BYTES, Holdings,
};

/// The overload guard's view of the actors: what each holds (its counted
/// holdings, plus its pooled buffers and gateway connections read from
/// egress and its DNS queries in flight), and shedding through egress and
/// ingress (DNS queries end at their own timeout). Weak: the guard's task must not
/// keep egress alive.
pub(crate) struct ShedActors {
    pub(crate) egress: Weak<crate::egress::Egress>,
    /// Each sandbox's DNS relay, by actor uid: its queries in flight are
    /// the actor's.
    pub(crate) dns_relays: crate::dns_relays::DnsRelays,
    /// Ingress's activations, when the tunnel serves ingress.
    pub(crate) ingress: Option<Weak<crate::ingress::Ingress>>,
    pub(crate) holdings: Weak<Holdings>,
    pub(crate) buffer_size: u64,
}

impl atunnel_process::overload::Shed for ShedActors {
    fn holdings(&self) -> Vec<(String, Held)> {
        let Some(holdings) = self.holdings.upgrade() else {
            return Vec::new();
        };
        let mut sampled: HashMap<String, Held> = HashMap::new();
        if let Some(egress) = self.egress.upgrade() {
            for a in egress.actor_stats() {
                let connections = a.gateway_connections as u64;
                let s = sampled.entry(a.actor).or_default();
                s.descriptors += connections;
                s.bytes += connections * GATEWAY_CONNECTION_HELD_BYTES
                    + a.buffers as u64 * self.buffer_size;
            }
        }
        let relays = self.dns_relays.lock().expect("dns relays lock poisoned");
        for (uid, relay) in relays.iter() {
            let queries = relay.stats().in_flight;
            let s = sampled.entry(uid.clone()).or_default();
            s.descriptors += queries * DNS_QUERY_HELD_DESCRIPTORS;
            s.bytes += queries * DNS_QUERY_HELD_BYTES;
        }
        drop(relays);
        for (uid, s) in &sampled {
            holdings.set_sampled(uid, s.descriptors, s.bytes);
        }
        holdings.snapshot()
    }

    fn shed(&self, who: &str) -> Option<atunnel_process::overload::ShedAction> {
        let held = self
            .holdings
            .upgrade()
            .and_then(|h| h.snapshot().into_iter().find(|(uid, _)| uid == who))
            .map(|(_, h)| h)
            .unwrap_or_default();
        // Both sides of the actor: what it holds is counted across them.
        // The cut is the activation's, one for both sides, so each side's
        // count is taken before either cuts.
        let ingress = self.ingress.as_ref().and_then(Weak::upgrade);
        let requests = ingress.as_ref().and_then(|i| i.in_flight(who));
        let tunnels = self.egress.upgrade().and_then(|e| e.shed(who));
        if requests.is_some()
            && let Some(ingress) = &ingress
        {
            // The only cut if the actor has no egress tunnel; otherwise a
            // second one, which also ends what was admitted in between.
            ingress.shed(who);
        }
        if tunnels.is_none() && requests.is_none() {
            return None;
        }
        Some(atunnel_process::overload::ShedAction {
            who: who.to_string(),
            bytes: held.bytes,
            tunnels: tunnels.unwrap_or(0) as u64,
            requests: requests.unwrap_or(0) as u64,
        })
    }
}
