//! `/metrics` for every process's admin listener: one metric family after
//! another in the OpenMetrics text format (prometheus-client), from the
//! figures of one `/stats` snapshot, and the families the tunnel and the
//! gateway share (the process, the buffer pool, the overload guard, the
//! admin listener), so each is named and described once.

use crate::overload::{OverloadState, OverloadStats};
use atunnel_core::PoolStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::admin::AdminStats;
use crate::process_stats::ProcessStats;

pub type Fmt = Result<(), std::fmt::Error>;

/// A process's `/metrics` page: every metric under `prefix`, written by
/// `families` from one snapshot that `read` takes at each scrape (the
/// snapshot `/stats` serves, so the two never disagree).
pub struct Page {
    registry: Registry,
}

impl Page {
    pub fn new<S: 'static>(
        prefix: &str,
        read: impl Fn() -> S + Send + Sync + 'static,
        families: fn(&mut Out, &S) -> Fmt,
    ) -> Self {
        let mut registry = Registry::with_prefix(prefix);
        registry.register_collector(Box::new(SnapshotCollector {
            read: Box::new(read),
            families,
        }));
        Self { registry }
    }

    /// The text of one scrape.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a collector's error would be a
        // bug of ours, and a partial page is still better than none.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Reads a snapshot and writes its families, once per scrape.
struct SnapshotCollector<S> {
    read: Box<dyn Fn() -> S + Send + Sync>,
    families: fn(&mut Out, &S) -> Fmt,
}

impl<S> std::fmt::Debug for SnapshotCollector<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotCollector")
    }
}

impl<S: 'static> Collector for SnapshotCollector<S> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Fmt {
        let snapshot = (self.read)();
        (self.families)(&mut Out(&mut encoder), &snapshot)
    }
}

/// Writes one metric family after another.
pub struct Out<'a, 'b>(pub &'b mut DescriptorEncoder<'a>);

impl Out<'_, '_> {
    pub fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) -> Fmt {
        let c = ConstCounter::new(v);
        let e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), c.metric_type())?;
        c.encode(e)
    }

    pub fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>, v: i64) -> Fmt {
        let g = ConstGauge::new(v);
        let e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), g.metric_type())?;
        g.encode(e)
    }

    /// A histogram from cumulative bucket counts (`at_most[i]` observations
    /// at most `bounds_us[i]` microseconds), in seconds.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        (bounds_us, at_most): (&[u64], &[u64]),
        count: u64,
        sum_us: u64,
    ) -> Fmt {
        let mut e = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Histogram)?;
        // The encoder wants each bucket's own count (it accumulates them);
        // ours are cumulative.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = bounds_us
            .iter()
            .zip(at_most)
            .map(|(&le, &at_most)| {
                let own = at_most.saturating_sub(below);
                below = at_most;
                (le as f64 / 1e6, own)
            })
            .collect();
        buckets.push((f64::MAX, count.saturating_sub(below)));
        e.encode_histogram::<Vec<(String, String)>>(sum_us as f64 / 1e6, count, &buckets, None)
    }

    /// A counter with one series per `(label value, count)`.
    pub fn counters<'i>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        series: impl IntoIterator<Item = (&'i str, u64)>,
    ) -> Fmt {
        let series = series.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
        self.labelled(name, help, MetricType::Counter, label, series)
    }

    /// A gauge with one series per `(label value, value)`.
    pub fn gauges<'i>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        series: impl IntoIterator<Item = (&'i str, i64)>,
    ) -> Fmt {
        let series = series.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
        self.labelled(name, help, MetricType::Gauge, label, series)
    }

    /// One family of `kind`, a series per `(label value, metric)`.
    fn labelled<'i, M: EncodeMetric>(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        label: &'static str,
        series: impl Iterator<Item = (&'i str, M)>,
    ) -> Fmt {
        let mut e = self.0.encode_descriptor(name, help, None, kind)?;
        for (value, metric) in series {
            let labels = [(label, Escaped(value))];
            metric.encode(e.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// A label value as the text format wants it. prometheus-client 0.24
/// writes label values verbatim, and ours come from peers (actor uids,
/// policy rules): a `"` would end the value early, a newline the line.
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

/// A count as a gauge's value.
pub fn n(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What the process costs, and its relay buffer pool.
pub fn process(out: &mut Out, p: &ProcessStats, pool: &PoolStats) -> Fmt {
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
        n(pool.in_use),
    )?;
    out.gauge(
        "pool_buffers_idle",
        "Relay buffers kept for reuse",
        None,
        n(pool.idle),
    )?;
    out.counter(
        "pool_buffers_acquired",
        "Relay buffers lent",
        None,
        pool.acquired_total,
    )?;
    out.counter(
        "pool_buffers_allocated",
        "Relay buffers allocated",
        None,
        pool.allocated_total,
    )?;
    out.counter(
        "pool_buffer_waits",
        "Waits for a relay buffer at the pool's cap",
        None,
        pool.waited_total,
    )
}

/// The overload guard's state and actions.
pub fn overload(out: &mut Out, o: &OverloadStats) -> Fmt {
    let state = match o.state {
        OverloadState::Normal => 0,
        OverloadState::Soft => 1,
        OverloadState::Hard => 2,
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
        "Consumers (actors, client identities) shed by the overload guard",
        None,
        o.shed_total,
    )?;
    out.counter(
        "overload_refused_over_share",
        "Work refused under soft overload for a consumer above its fair share",
        None,
        o.refused_over_share_total,
    )?;
    out.gauge(
        "overload_refusing_everyone",
        "Overload guard refusing everyone's new work (1), not only those above their fair share",
        None,
        i64::from(o.refusing_everyone),
    )
}

/// The admin listener's own connections.
pub fn admin(out: &mut Out, a: &AdminStats) -> Fmt {
    out.counter(
        "admin_connections",
        "Connections accepted by /stats and /metrics",
        None,
        a.listener.accepted_total,
    )?;
    out.counter(
        "admin_probe_connections",
        "Admin connections past its cap, answered for /healthz and /readyz only",
        None,
        a.probe_connections_total,
    )?;
    out.counter(
        "admin_probe_evicted",
        "Probe-reserve connections closed for a newer one",
        None,
        a.probe_evicted_total,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One gauge family whose series carry the given label values.
    fn labelled(out: &mut Out, values: &Vec<&'static str>) -> Fmt {
        out.gauges(
            "labelled",
            "A test family",
            "actor",
            values.iter().enumerate().map(|(i, v)| (*v, n(i))),
        )
    }

    #[test]
    fn label_values_with_quotes_backslashes_and_newlines_are_escaped() {
        let values = vec!["plain", r#"a"b"#, r"a\b", "a\nb", r#"\"} 1"#];
        let page = {
            let values = values.clone();
            Page::new("atunnel", move || values.clone(), labelled)
        };
        let text = page.render();
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
