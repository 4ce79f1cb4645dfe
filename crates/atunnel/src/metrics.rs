//! `/metrics`: the `/stats` figures in the Prometheus text format
//! (prometheus-client), for scrapers. Each scrape reads the same snapshot
//! `/stats` serves, so the two never disagree, and nothing is counted
//! twice on the data path. Per-actor series carry an `actor` label (the
//! uid) and exist only while the actor is hosted, so their number is
//! bounded by the hosted actors. Label values are escaped here: the
//! library writes them verbatim.

use atunnel_process::metrics_text::{self, Fmt, Out, Page, n};
use prometheus_client::registry::Unit;
use std::sync::Arc;

use crate::stats::{Stats, StatsSource};

/// `/metrics`: a page over the stats source.
pub(crate) fn page(source: Arc<StatsSource>) -> Page {
    Page::new("atunnel", move || source.collect(false), families)
}

fn families(out: &mut Out, s: &Stats) -> Fmt {
    process(out, s)?;
    egress(out, s)?;
    ingress(out, s)?;
    dns(out, s)?;
    leftovers(out, s)
}

fn process(out: &mut Out, s: &Stats) -> Fmt {
    metrics_text::process(out, &s.process, &s.pool)?;
    if let Some(h) = &s.hibernation {
        out.gauge(
            "ingress_hibernating",
            "Ingress connections hibernated now",
            None,
            n(h.hibernating),
        )?;
        out.counter(
            "ingress_hibernations",
            "Ingress connections put to sleep",
            None,
            h.hibernations,
        )?;
        out.counter(
            "ingress_wakes",
            "Hibernated ingress connections woken",
            None,
            h.wakes,
        )?;
        out.counter(
            "ingress_hibernation_trims",
            "Times the allocator was asked to return memory hibernation freed",
            None,
            h.trims,
        )?;
    }
    if let Some(o) = &s.overload {
        metrics_text::overload(out, o)?;
    }
    metrics_text::admin(out, &s.admin)?;
    let c = &s.control;
    out.counter(
        "control_refused_uid",
        "Control connections closed at accept: peer uid not allowed",
        None,
        c.refused_uid_total,
    )?;
    out.counter(
        "control_preface_timeouts",
        "Control connections closed without their preface (or a place) in time",
        None,
        c.preface_timeouts_total,
    )?;
    out.counter(
        "control_evicted",
        "Control connections waiting for their preface, closed for a newer one",
        None,
        c.evicted_total,
    )?;
    out.counter(
        "control_bad_preface",
        "Control connections closed: not HTTP/2",
        None,
        c.bad_preface_total,
    )
}

fn egress(out: &mut Out, s: &Stats) -> Fmt {
    if let Some(e) = &s.egress {
        out.gauge(
            "egress_tunnels_open",
            "Egress tunnels open now",
            None,
            e.tunnels_open as i64,
        )?;
        out.counter(
            "egress_tunnels",
            "Egress connections accepted from actors",
            None,
            e.tunnels_total,
        )?;
        out.counters(
            "egress_tunnels_by_family",
            "Egress connections accepted from actors, by the destination's address family",
            "family",
            [
                ("ipv4", e.tunnels_ipv4_total),
                ("ipv6", e.tunnels_ipv6_total),
            ],
        )?;
        out.counter(
            "egress_rejected",
            "Egress connections closed with no bytes (actor inactive, certificate invalid)",
            None,
            e.rejected_total,
        )?;
        out.counter(
            "egress_open_failed",
            "Egress tunnels whose CONNECT failed or was refused",
            None,
            e.open_failed_total,
        )?;
        out.counter(
            "egress_stalled_write_ends",
            "Egress tunnels reset at the stalled-write bound",
            None,
            e.stalled_write_ends_total,
        )?;
        out.counter(
            "egress_half_closed_ends",
            "Egress tunnels reset at the half-closed bound",
            None,
            e.half_closed_ends_total,
        )?;
        out.counter(
            "egress_bytes_up",
            "Bytes from actors through ended egress tunnels",
            Some(Unit::Bytes),
            e.bytes_up_total,
        )?;
        out.counter(
            "egress_bytes_down",
            "Bytes to actors through ended egress tunnels",
            Some(Unit::Bytes),
            e.bytes_down_total,
        )?;
        let latency = &e.open_latency;
        out.histogram(
            "egress_open_latency",
            "Time from an actor's connection to its tunnel open",
            Some(Unit::Seconds),
            (&crate::egress::OPEN_LATENCY_BOUNDS_US, &latency.at_most_us),
            latency.count,
            latency.sum_us,
        )?;
    }
    let a = &s.egress_actors;
    fn id(x: &crate::egress::ActorEgressStats) -> &str {
        &x.actor
    }
    out.gauges(
        "egress_actor_tunnels",
        "An actor's open egress tunnels",
        "actor",
        a.iter().map(|x| (id(x), n(x.tunnels))),
    )?;
    out.gauges(
        "egress_actor_opening",
        "An actor's egress tunnels being opened",
        "actor",
        a.iter().map(|x| (id(x), n(x.opening))),
    )?;
    out.gauges(
        "egress_actor_buffers",
        "Relay buffers an actor's tunnels hold",
        "actor",
        a.iter().map(|x| (id(x), n(x.buffers))),
    )?;
    out.gauges(
        "egress_actor_gateway_connections",
        "An actor's pooled gateway connections",
        "actor",
        a.iter().map(|x| (id(x), n(x.gateway_connections))),
    )?;
    out.counters(
        "egress_actor_refused",
        "An actor's egress connections refused at its tunnel budget",
        "actor",
        a.iter().map(|x| (id(x), x.refused_tunnels_total)),
    )?;
    out.counters(
        "egress_actor_refused_opening",
        "An actor's egress connections refused at its opening budget",
        "actor",
        a.iter().map(|x| (id(x), x.refused_opening_total)),
    )?;
    out.gauges(
        "actor_held_descriptors",
        "Descriptors an actor holds across egress tunnels and ingress requests",
        "actor",
        a.iter()
            .map(|x| (id(x), i64::try_from(x.held_descriptors).unwrap_or(i64::MAX))),
    )?;
    out.gauges(
        "actor_held_bytes",
        "Bytes an actor holds, estimated from its tunnels and requests",
        "actor",
        a.iter()
            .map(|x| (id(x), i64::try_from(x.held_bytes).unwrap_or(i64::MAX))),
    )?;
    out.counters(
        "actor_refused_descriptors",
        "An actor's new tunnels and requests refused at its descriptor budget",
        "actor",
        a.iter().map(|x| (id(x), x.refused_descriptors_total)),
    )?;
    out.counters(
        "egress_actor_refused_overload",
        "An actor's egress connections refused under overload",
        "actor",
        a.iter().map(|x| (id(x), x.refused_overload_total)),
    )?;
    out.counters(
        "egress_actor_shed",
        "Times an actor's tunnels were shed",
        "actor",
        a.iter().map(|x| (id(x), x.shed_total)),
    )?;
    out.counters(
        "egress_actor_buffer_waits",
        "An actor's waits for a relay buffer at its share",
        "actor",
        a.iter().map(|x| (id(x), x.buffer_waits_total)),
    )?;
    out.counters(
        "egress_actor_refusal_pauses",
        "Times an actor's listener paused at its refusal rate",
        "actor",
        a.iter().map(|x| (id(x), x.refusal_pauses_total)),
    )?;
    out.counters(
        "egress_actor_gateway_idle_closed",
        "An actor's pooled gateway connections closed idle",
        "actor",
        a.iter().map(|x| (id(x), x.gateway_idle_closed_total)),
    )?;
    out.counters(
        "egress_actor_gateway_h2_floods",
        "An actor's gateway connections ended for an HTTP/2 control-frame flood",
        "actor",
        a.iter().map(|x| (id(x), x.gateway_h2_floods_total)),
    )
}

fn ingress(out: &mut Out, s: &Stats) -> Fmt {
    if let Some(i) = &s.ingress {
        out.gauge(
            "ingress_active_actors",
            "Actors ingress routes to",
            None,
            n(i.active_actors),
        )?;
        out.counter(
            "ingress_upstream_connections",
            "Connections opened to actors",
            None,
            i.new_upstream_connections,
        )?;
        out.counter(
            "ingress_refused_overload",
            "Ingress requests refused under overload (503)",
            None,
            i.refused_overload_total,
        )?;
        let f = &i.h2_floods;
        out.counters(
            "ingress_h2_floods",
            "HTTP/2 connections ended for a control-frame flood",
            "endpoint",
            [
                ("https", f.https_total),
                ("connect", f.connect_total),
                ("actors", f.actors_total),
            ],
        )?;
        let a = &i.actors;
        out.gauges(
            "ingress_actor_in_flight",
            "An actor's ingress requests in flight",
            "actor",
            a.iter().map(|x| (x.actor.as_str(), n(x.in_flight))),
        )?;
        out.counters(
            "ingress_actor_refused_in_flight",
            "An actor's ingress requests refused at its in-flight budget",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.refused_in_flight_total)),
        )?;
        out.counters(
            "ingress_actor_response_timeouts",
            "An actor's ingress requests answered 504",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.response_timeouts_total)),
        )?;
        out.counters(
            "ingress_actor_response_body_idle_ends",
            "An actor's ingress requests ended: its response body stopped moving",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.response_body_idle_ends_total)),
        )?;
        out.counters(
            "ingress_actor_request_body_idle_ends",
            "An actor's ingress requests ended: their request body stopped moving",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.request_body_idle_ends_total)),
        )?;
        out.gauges(
            "ingress_actor_ports",
            "Ports an actor's ingress requests went to, each with a pool",
            "actor",
            a.iter().map(|x| (x.actor.as_str(), n(x.ports))),
        )?;
        out.counters(
            "ingress_actor_refused_ports",
            "An actor's ingress requests refused for a port past its cap",
            "actor",
            a.iter().map(|x| (x.actor.as_str(), x.refused_ports_total)),
        )?;
        out.counters(
            "ingress_actor_connect_stalled_write_ends",
            "An actor's ingress CONNECT tunnels reset at the stalled-write timeout",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.connect_stalled_write_ends_total)),
        )?;
        out.counters(
            "ingress_actor_connect_half_closed_ends",
            "An actor's ingress CONNECT tunnels reset at the half-closed timeout",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.connect_half_closed_ends_total)),
        )?;
        out.gauges(
            "ingress_actor_connect_buffers",
            "Relay buffers an actor's ingress CONNECT tunnels hold",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), n(x.connect_buffers_in_use))),
        )?;
        out.gauges(
            "ingress_actor_router_bytes",
            "Bytes an actor's request bodies in flight may make the router's connections hold",
            "actor",
            a.iter().map(|x| {
                let b = i64::try_from(x.router_bytes).unwrap_or(i64::MAX);
                (x.actor.as_str(), b)
            }),
        )?;
        out.counters(
            "ingress_actor_refused_router_bytes",
            "An actor's ingress requests refused past its router bytes",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.refused_router_bytes_total)),
        )?;
        out.counters(
            "ingress_actor_refused_router_streams",
            "An actor's ingress requests refused past its streams on one router connection",
            "actor",
            a.iter()
                .map(|x| (x.actor.as_str(), x.refused_router_streams_total)),
        )?;
    }
    if let Some(p) = &s.pre_auth {
        let l = [("https", &p.https), ("connect", &p.connect)];
        out.gauges(
            "ingress_handshaking",
            "Ingress connections in their TLS handshake",
            "listener",
            l.iter().map(|(k, f)| (*k, n(f.handshaking))),
        )?;
        out.counters(
            "ingress_handshakes_refused",
            "Ingress connections closed at once, their source at its cap",
            "listener",
            l.iter().map(|(k, f)| (*k, f.refused_total)),
        )?;
        out.counters(
            "ingress_handshakes_evicted",
            "Ingress handshakes ended for a newer one at the total cap",
            "listener",
            l.iter().map(|(k, f)| (*k, f.evicted_total)),
        )?;
    }
    Ok(())
}

fn dns(out: &mut Out, s: &Stats) -> Fmt {
    let d = &s.dns_relays;
    fn id(x: &crate::dns_relays::SandboxDnsStats) -> &str {
        &x.actor
    }
    out.counters(
        "dns_udp_queries",
        "DNS queries over UDP to an actor's relay",
        "actor",
        d.iter().map(|x| (id(x), x.relay.udp_queries)),
    )?;
    out.counters(
        "dns_tcp_queries",
        "DNS queries over TCP to an actor's relay",
        "actor",
        d.iter().map(|x| (id(x), x.relay.tcp_queries)),
    )?;
    out.counters(
        "dns_answered",
        "DNS answers an actor's relay delivered",
        "actor",
        d.iter().map(|x| (id(x), x.relay.answered)),
    )?;
    out.counters(
        "dns_timed_out",
        "DNS queries no upstream answered",
        "actor",
        d.iter().map(|x| (id(x), x.relay.timed_out)),
    )?;
    out.counters(
        "dns_dropped",
        "DNS queries and TCP connections an actor's relay dropped",
        "actor",
        d.iter().map(|x| (id(x), x.relay.dropped)),
    )
}

fn leftovers(out: &mut Out, s: &Stats) -> Fmt {
    let Some(l) = &s.leftovers else {
        return Ok(());
    };
    out.counter(
        "leftovers_adopted",
        "Sandboxes ServeSandbox adopted from an earlier process",
        None,
        l.adopted_total,
    )?;
    out.counter(
        "leftovers_removed",
        "Namespaces an earlier process left, removed unclaimed",
        None,
        l.removed_total,
    )?;
    out.gauge(
        "leftovers_pending",
        "Namespaces an earlier process left, not yet claimed or removed",
        None,
        l.pending as i64,
    )
}
