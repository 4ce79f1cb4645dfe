//! `/metrics`: the `/stats` figures in the Prometheus text format
//! (prometheus-client), for scrapers. Each scrape reads the same snapshot
//! `/stats` serves, so the two never disagree, and nothing is counted
//! twice on the data path. Per-actor series carry an `actor` label (the
//! uid) and exist only while the actor is hosted, so their number is
//! bounded by the hosted actors. Label values are escaped here: the
//! library writes them verbatim.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

use crate::stats::{Stats, StatsSource};

/// The registry `/metrics` encodes: one collector over the stats source.
pub(crate) struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub(crate) fn new(source: Arc<StatsSource>) -> Self {
        let mut registry = Registry::with_prefix("atunnel");
        registry.register_collector(Box::new(StatsCollector(source)));
        Self { registry }
    }

    /// The exposition text of one scrape.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a collector's error would be a
        // bug of ours, and a partial page is still better than none.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

struct StatsCollector(Arc<StatsSource>);

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsCollector")
    }
}

/// Writes one metric family after another.
struct Out<'a, 'b>(&'b mut DescriptorEncoder<'a>);

impl Out<'_, '_> {
    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) -> Fmt {
        let c = ConstCounter::new(v);
        let e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), c.metric_type())?;
        c.encode(e)
    }

    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>, v: i64) -> Fmt {
        let g = ConstGauge::new(v);
        let e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), g.metric_type())?;
        g.encode(e)
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        h: &crate::egress::OpenLatency,
    ) -> Fmt {
        let mut e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Histogram)?;
        // The encoder wants each bucket's own count (it accumulates them);
        // ours are cumulative.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = crate::egress::OPEN_LATENCY_BOUNDS_US
            .iter()
            .zip(h.at_most_us)
            .map(|(&le, at_most)| {
                let own = at_most.saturating_sub(below);
                below = at_most;
                (le as f64 / 1e6, own)
            })
            .collect();
        buckets.push((f64::MAX, h.count.saturating_sub(below)));
        e.encode_histogram::<Vec<(String, String)>>(h.sum_us as f64 / 1e6, h.count, &buckets, None)
    }

    /// A counter with one series per `(label value, count)`.
    fn counters<'i>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        series: impl IntoIterator<Item = (&'i str, u64)>,
    ) -> Fmt {
        let mut e =
            self.0
                .encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for (value, v) in series {
            let labels = [(label, Escaped(value))];
            ConstCounter::new(v).encode(e.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A gauge with one series per `(label value, value)`.
    fn gauges<'i>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        series: impl IntoIterator<Item = (&'i str, i64)>,
    ) -> Fmt {
        let mut e =
            self.0
                .encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
        for (value, v) in series {
            let labels = [(label, Escaped(value))];
            ConstGauge::new(v).encode(e.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

type Fmt = Result<(), std::fmt::Error>;

/// A label value as the text format wants it. prometheus-client 0.24
/// writes label values verbatim, and ours come from peers (actor uids):
/// a `"` would end the value early, a newline the line. `ActorRef` keeps
/// uids to `[A-Za-z0-9._-]` today; this holds whatever a label carries.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Fmt {
        use std::fmt::Write;
        let mut rest = self.0;
        while let Some(at) = rest.find(['"', '\\', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

fn n(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Fmt {
        let s = self.0.collect(false);
        let mut out = Out(&mut encoder);
        process(&mut out, &s)?;
        egress(&mut out, &s)?;
        ingress(&mut out, &s)?;
        dns(&mut out, &s)?;
        leftovers(&mut out, &s)?;
        Ok(())
    }
}

fn process(out: &mut Out, s: &Stats) -> Fmt {
    let p = &s.process;
    out.gauge(
        "process_resident_memory",
        "Resident set size",
        Some(Unit::Bytes),
        p.rss_bytes as i64,
    )?;
    out.gauge(
        "process_heap",
        "Live heap (the counting allocator; 0 without it)",
        Some(Unit::Bytes),
        n(p.heap_bytes),
    )?;
    out.gauge(
        "process_open_fds",
        "Open file descriptors",
        None,
        n(p.open_fds),
    )?;
    out.gauge("process_tasks", "Tokio tasks alive", None, n(p.tasks))?;
    out.counter(
        "process_cpu_milliseconds",
        "CPU time used, user and system",
        None,
        ((p.cpu_user_s + p.cpu_system_s) * 1000.0) as u64,
    )?;
    out.gauge(
        "pool_buffers_in_use",
        "Relay buffers lent out",
        None,
        n(s.pool.in_use),
    )?;
    out.gauge(
        "pool_buffers_idle",
        "Relay buffers kept for reuse",
        None,
        n(s.pool.idle),
    )?;
    out.counter(
        "pool_buffers_acquired",
        "Relay buffers lent",
        None,
        s.pool.acquired_total,
    )?;
    out.counter(
        "pool_buffers_allocated",
        "Relay buffers allocated",
        None,
        s.pool.allocated_total,
    )?;
    out.counter(
        "pool_buffer_waits",
        "Waits for a relay buffer at the pool's cap",
        None,
        s.pool.waited_total,
    )?;
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
        let state = match o.state {
            atunnel_process::overload::OverloadState::Normal => 0,
            atunnel_process::overload::OverloadState::Soft => 1,
            atunnel_process::overload::OverloadState::Hard => 2,
        };
        out.gauge(
            "overload_state",
            "Overload guard: 0 normal, 1 soft (refusing), 2 hard (shedding)",
            None,
            state,
        )?;
        out.counter(
            "overload_refused",
            "Work refused by the overload guard",
            None,
            o.refused_total,
        )?;
        out.counter(
            "overload_shed",
            "Actors shed by the overload guard",
            None,
            o.shed_total,
        )?;
        out.counter(
            "overload_refused_over_share",
            "Work refused under soft overload for an actor above its fair share",
            None,
            o.refused_over_share_total,
        )?;
        out.gauge(
            "overload_refusing_everyone",
            "Overload guard refusing every actor's new work (1), not only those above their fair share",
            None,
            i64::from(o.refusing_everyone),
        )?;
    }
    out.counter(
        "admin_connections",
        "Connections accepted by /stats and /metrics",
        None,
        s.admin.listener.accepted_total,
    )?;
    out.counter(
        "admin_probe_connections",
        "Admin connections past its cap, answered for /healthz and /readyz only",
        None,
        s.admin.probe_connections_total,
    )?;
    out.counter(
        "admin_probe_evicted",
        "Probe-reserve connections closed for a newer one",
        None,
        s.admin.probe_evicted_total,
    )?;
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
        out.histogram(
            "egress_open_latency",
            "Time from an actor's connection to its tunnel open",
            Some(Unit::Seconds),
            &e.open_latency,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One gauge family whose series carry the given label values.
    #[derive(Debug)]
    struct Labelled(Vec<&'static str>);

    impl Collector for Labelled {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Fmt {
            Out(&mut encoder).gauges(
                "labelled",
                "A test family",
                "actor",
                self.0.iter().enumerate().map(|(i, v)| (*v, n(i))),
            )
        }
    }

    #[test]
    fn label_values_with_quotes_backslashes_and_newlines_are_escaped() {
        let values = vec!["plain", r#"a"b"#, r"a\b", "a\nb", r#"\"} 1"#];
        let mut registry = Registry::with_prefix("atunnel");
        registry.register_collector(Box::new(Labelled(values.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains(r#"actor="a\"b""#), "{text}");
        assert!(text.contains(r#"actor="a\\b""#), "{text}");
        assert!(text.contains(r#"actor="a\nb""#), "{text}");
        // Read back as the text format specifies (prometheus-parse does not
        // unescape): one line per series, each value as it was.
        let read: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("atunnel_labelled{actor=\""))
            .map(|rest| {
                let mut value = String::new();
                let mut chars = rest.chars();
                loop {
                    match chars.next().expect("the value ends") {
                        '"' => break,
                        '\\' => value.push(match chars.next().expect("an escape") {
                            'n' => '\n',
                            c => c,
                        }),
                        c => value.push(c),
                    }
                }
                let sample = chars.as_str().strip_prefix("} ").expect("then the sample");
                (value, sample.to_owned())
            })
            .collect();
        let want: Vec<(String, String)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| ((*v).to_owned(), i.to_string()))
            .collect();
        assert_eq!(read, want, "{text}");
    }
}
