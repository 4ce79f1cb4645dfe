//! What atunnel holds and refuses, from its /stats and its sockets: the
//! hostile actors' share, recovery to the baseline, and the peaks seen.

use super::*;

/// The egress figures of some actors in atunnel's /stats, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct EgressSum {
    pub(super) tunnels: f64,
    pub(super) opening: f64,
    pub(super) buffers: f64,
    pub(super) refused_tunnels_total: f64,
    pub(super) refused_opening_total: f64,
    pub(super) refused_overload_total: f64,
    pub(super) shed_total: f64,
    pub(super) buffer_waits_total: f64,
    pub(super) refusal_pauses_total: f64,
}

/// The egress figures of `actors` in atunnel's /stats, summed (zeros for
/// actors it does not list).
pub(super) fn egress_of(stats: &Stats, actors: &[u64]) -> EgressSum {
    let names: Vec<String> = actors.iter().map(|a| format!("uid-{a}")).collect();
    let mut sum = EgressSum::default();
    for a in stats
        .egress_actors
        .iter()
        .filter(|a| names.contains(&a.actor))
    {
        sum.tunnels += a.tunnels as f64;
        sum.opening += a.opening as f64;
        sum.buffers += a.buffers as f64;
        sum.refused_tunnels_total += a.refused_tunnels_total as f64;
        sum.refused_opening_total += a.refused_opening_total as f64;
        sum.refused_overload_total += a.refused_overload_total as f64;
        sum.shed_total += a.shed_total as f64;
        sum.buffer_waits_total += a.buffer_waits_total as f64;
        sum.refusal_pauses_total += a.refusal_pauses_total as f64;
    }
    sum
}

/// The ingress figures of some actors in atunnel's /stats, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct IngressSum {
    pub(super) in_flight: f64,
    pub(super) refused_in_flight_total: f64,
}

/// The ingress figures of `actors` in atunnel's /stats, summed.
pub(super) fn ingress_of(stats: &Stats, actors: &[u64]) -> IngressSum {
    let names: Vec<String> = actors.iter().map(|a| format!("bench/actor-{a}")).collect();
    let mut sum = IngressSum::default();
    let listed = stats.ingress.iter().flat_map(|i| &i.actors);
    for a in listed.filter(|a| names.contains(&a.actor)) {
        sum.in_flight += a.in_flight as f64;
        sum.refused_in_flight_total += a.refused_in_flight_total as f64;
    }
    sum
}

/// What a pattern made atunnel refuse or end, from two /stats readings:
/// the hostile actors' refusals and the process's.
pub(super) fn refusals(before: &Stats, after: &Stats, hostiles: &[u64]) -> summary::Refused {
    let d = |f: fn(&Stats) -> u64| (f(after) as f64 - f(before) as f64).max(0.0);
    let (eb, ea) = (egress_of(before, hostiles), egress_of(after, hostiles));
    let de = |f: fn(&EgressSum) -> f64| (f(&ea) - f(&eb)).max(0.0);
    let (ib, ia) = (ingress_of(before, hostiles), ingress_of(after, hostiles));
    summary::Refused {
        refused_tunnels: de(|e| e.refused_tunnels_total),
        refused_opening: de(|e| e.refused_opening_total),
        refused_overload: de(|e| e.refused_overload_total),
        shed: de(|e| e.shed_total),
        buffer_waits: de(|e| e.buffer_waits_total),
        refusal_pauses: de(|e| e.refusal_pauses_total),
        stalled_write_ends: d(|s| s.egress.map_or(0, |e| e.stalled_write_ends_total)),
        half_closed_ends: d(|s| s.egress.map_or(0, |e| e.half_closed_ends_total)),
        overload_refused: d(|s| s.overload.as_ref().map_or(0, |o| o.refused_total)),
        overload_shed: d(|s| s.overload.as_ref().map_or(0, |o| o.shed_total)),
        ingress_refused_in_flight: (ia.refused_in_flight_total - ib.refused_in_flight_total)
            .max(0.0),
        ingress_refused_overload: d(|s| s.ingress.as_ref().map_or(0, |i| i.refused_overload_total)),
    }
}

/// Whether recovery waits for memory too: between a pattern's pairs only
/// what the hostile actors held (tunnels, descriptors, tasks, buffers) has
/// to be gone for the next baseline; after the last, memory as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Memory {
    Checked,
    NotChecked,
}

/// What atunnel holds, as recovery compares it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Resources {
    pub(super) heap: f64,
    pub(super) fds: f64,
    pub(super) tasks: f64,
    pub(super) pool_in_use: f64,
    pub(super) hostile_tunnels: f64,
    pub(super) hostile_opening: f64,
    pub(super) cgroup: f64,
    /// atunnel's established connections to the gateway (a diagnostic:
    /// the descriptors they hold are counted in `fds`).
    pub(super) gateway_conns: f64,
    /// atunnel's sockets in the other actors' sandboxes (the victim's
    /// tunnels, pooled ingress connections to them), each with its task:
    /// left out of `fds` and `tasks` when recovery compares them, since
    /// what the victim's own load made atunnel pool is the victim's.
    pub(super) neighbours: f64,
}

impl Resources {
    pub(super) fn read(
        stats: &Stats,
        cgroup_bytes: u64,
        tunnel_pid: Option<u32>,
        census: &Census,
        hostiles: &[u64],
    ) -> Self {
        let h = egress_of(stats, hostiles);
        Self {
            heap: stats.process.heap_bytes as f64,
            fds: stats.process.open_fds as f64,
            tasks: stats.process.tasks as f64,
            pool_in_use: stats.pool.in_use as f64,
            hostile_tunnels: h.tunnels,
            hostile_opening: h.opening,
            cgroup: cgroup_bytes as f64,
            gateway_conns: tunnel_pid.map_or(0.0, gateway_connections),
            neighbours: census.neighbours(hostiles) as f64,
        }
    }

    /// What is not back within the tolerances of `base`, named; heap and
    /// cgroup memory only if `memory` says so.
    pub(super) fn above(&self, base: &Resources, memory: Memory) -> Vec<String> {
        let mut out = Vec::new();
        let mib = |x: f64| x / 1048576.0;
        if memory == Memory::Checked && self.heap > base.heap + HEAP_SLACK {
            out.push(format!("heap +{:.1} MiB", mib(self.heap - base.heap)));
        }
        if memory == Memory::Checked && self.cgroup > base.cgroup + CGROUP_SLACK {
            out.push(format!(
                "cgroup memory +{:.1} MiB",
                mib(self.cgroup - base.cgroup)
            ));
        }
        let own = |x: f64, r: &Resources| x - r.neighbours;
        if own(self.fds, self) > own(base.fds, base) + COUNT_SLACK {
            out.push(format!(
                "descriptors +{} (gateway connections +{})",
                own(self.fds, self) - own(base.fds, base),
                self.gateway_conns - base.gateway_conns
            ));
        }
        if own(self.tasks, self) > own(base.tasks, base) + COUNT_SLACK {
            out.push(format!(
                "tasks +{}",
                own(self.tasks, self) - own(base.tasks, base)
            ));
        }
        if self.pool_in_use > base.pool_in_use {
            out.push(format!(
                "pooled buffers out +{}",
                self.pool_in_use - base.pool_in_use
            ));
        }
        if self.hostile_tunnels > 0.0 || self.hostile_opening > 0.0 {
            out.push(format!(
                "hostile tunnels {} (opening {})",
                self.hostile_tunnels, self.hostile_opening
            ));
        }
        out
    }

    pub(super) fn summary(&self) -> summary::Resources {
        summary::Resources {
            heap_bytes: self.heap,
            cgroup_bytes: self.cgroup,
            open_fds: self.fds,
            tasks: self.tasks,
            pool_in_use: self.pool_in_use,
            gateway_connections: self.gateway_conns,
            neighbour_sockets: self.neighbours,
        }
    }
}

/// How many TCP connections process `pid` has established to the gateway
/// (the sink's :443), from its namespace's /proc/<pid>/net/tcp.
pub(super) fn gateway_connections(pid: u32) -> f64 {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return 0.0;
    };
    // Addresses are hex, the IPv4 address as a little-endian word.
    let gateway = format!("{:08X}:{:04X}", u32::from_le_bytes(SINK_ADDR.octets()), 443);
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&gateway.as_str()) && f.get(3) == Some(&"01")
        })
        .count() as f64
}

/// atunnel's socket descriptors by where the kernel lists them: in the
/// worker namespace's TCP/UDP/Unix tables, in each actor's sandbox gateway
/// namespace's TCP/UDP tables, or in none (a TCP socket closed or reset
/// whose descriptor is still held: the kernel unlists it).
#[derive(Clone, Debug, Default)]
pub(super) struct Census {
    pub(super) sockets: usize,
    pub(super) worker: usize,
    /// Per actor, in the order of `Actors::sandboxes`.
    pub(super) sandboxes: Vec<usize>,
    pub(super) unlisted: usize,
}

impl Census {
    pub(super) async fn take(bench: &Bench, actors: &Actors) -> Self {
        use std::collections::HashMap;
        let Some(pid) = bench.tunnel_pid() else {
            return Self::default();
        };
        // Where each listed socket inode is: `None` the worker namespace,
        // `Some(i)` actor i's sandbox. Column 10 of /proc/net/{tcp,udp} is
        // the inode, column 7 of /proc/net/unix.
        fn place(tables: &[String], at: Option<usize>, out: &mut HashMap<String, Option<usize>>) {
            for t in tables {
                for line in t.lines().skip(1) {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let inode = if f.len() >= 10 && f[0].ends_with(':') {
                        f[9]
                    } else {
                        f.get(6).copied().unwrap_or("")
                    };
                    out.insert(inode.to_string(), at);
                }
            }
        }
        let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
        let mut listed = HashMap::new();
        place(
            &["tcp", "tcp6", "udp", "udp6", "unix"].map(|t| read(format!("/proc/{pid}/net/{t}"))),
            None,
            &mut listed,
        );
        for (i, runtime) in actors.sandboxes.iter().enumerate() {
            let name = atunnel_sandbox::sandbox::gateway_ns_name(runtime.name());
            let Ok(ns) = atunnel_sandbox::NetNs::open(&name) else {
                continue;
            };
            let tables = bench
                .topo
                .exec
                .run_in(&ns, || {
                    ["tcp", "tcp6", "udp", "udp6"].map(|t| {
                        std::fs::read_to_string(format!("/proc/thread-self/net/{t}"))
                            .unwrap_or_default()
                    })
                })
                .await;
            if let Ok(tables) = tables {
                place(&tables, Some(i), &mut listed);
            }
        }
        let mut census = Self {
            sandboxes: vec![0; actors.sandboxes.len()],
            ..Self::default()
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return census;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            else {
                continue;
            };
            census.sockets += 1;
            match listed.get(inode) {
                Some(None) => census.worker += 1,
                Some(Some(i)) => census.sandboxes[*i] += 1,
                None => census.unlisted += 1,
            }
        }
        census
    }

    /// Sockets in the sandboxes of actors other than the hostile ones: the
    /// victim's tunnels and atunnel's pooled ingress connections to those
    /// actors.
    pub(super) fn neighbours(&self, hostiles: &[u64]) -> usize {
        self.sandboxes
            .iter()
            .enumerate()
            .filter(|(i, _)| !hostiles.contains(&(*i as u64)))
            .map(|(_, n)| n)
            .sum()
    }

    pub(super) fn summary(&self) -> summary::Sockets {
        summary::Sockets {
            sockets: self.sockets,
            worker_namespace: self.worker,
            sandboxes: self
                .sandboxes
                .iter()
                .enumerate()
                .map(|(i, n)| (format!("actor-{i}"), *n))
                .collect(),
            unlisted: self.unlisted,
        }
    }
}

/// The highest readings while a pattern ran: the cgroup's memory, and
/// from /stats the overload guard's state and atunnel's descriptors.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Peaks {
    pub(super) memory: u64,
    /// The worst state the overload guard was seen in.
    pub(super) overload: OverloadState,
    pub(super) open_fds: f64,
}

impl Peaks {
    pub(super) fn new(memory: u64) -> Self {
        Self {
            memory,
            overload: OverloadState::Normal,
            open_fds: 0.0,
        }
    }

    /// The highest of `self` and `other`.
    pub(super) fn merged(mut self, other: Peaks) -> Self {
        self.memory = self.memory.max(other.memory);
        self.overload = self.overload.max(other.overload);
        self.open_fds = self.open_fds.max(other.open_fds);
        self
    }

    pub(super) fn note(&mut self, memory: u64, stats: Option<&Stats>) {
        self.memory = self.memory.max(memory);
        if let Some(stats) = stats {
            if let Some(o) = &stats.overload {
                self.overload = self.overload.max(o.state);
            }
            self.open_fds = self.open_fds.max(stats.process.open_fds as f64);
        }
    }
}

/// Runs `work` while sampling the cgroup's memory every 100 ms and
/// atunnel's /stats every 500 ms: its output and the highest readings.
pub(super) async fn with_peaks<T>(bench: &Bench, work: impl Future<Output = T>) -> (T, Peaks) {
    let peaks = std::sync::Mutex::new(Peaks::new(bench.cgroup_sample().memory_bytes));
    let out = {
        let watch = async {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for n in 0u64.. {
                tick.tick().await;
                let memory = bench.cgroup_sample().memory_bytes;
                let stats = if n % 5 == 0 {
                    bench.stats(false).await.ok()
                } else {
                    None
                };
                peaks
                    .lock()
                    .expect("peaks lock")
                    .note(memory, stats.as_ref());
            }
        };
        tokio::pin!(work, watch);
        loop {
            tokio::select! {
                out = &mut work => break out,
                () = &mut watch => {}
            }
        }
    };
    let mut peaks = peaks.into_inner().expect("peaks lock");
    peaks.note(bench.cgroup_sample().memory_bytes, None);
    (out, peaks)
}

/// Waits until `pattern` is established: for those that hold connections,
/// 95 % of them held (and 1 s more for their queues to fill), or, for the
/// actors at their budgets, as many as atunnel admits (no more held for
/// [`PLATEAU`]); for the flood, atunnel refusing the hostile actor; for
/// DNS, 1 s of it. Returns how long it took and whether it was reached.
/// The others stop waiting too once what they hold has not grown for
/// [`PLATEAU`], unreached: what atunnel lets them hold is then held
/// (unread downloads stop at the gateway connection's window, far short
/// of their target), and waiting the whole [`ESTABLISH_LIMIT`] for more,
/// once per two pairs, would make the scenario twice as long.
pub(super) async fn establish(
    bench: &Bench,
    pattern: Pattern,
    target: Option<usize>,
    tally: &Tally,
    before: &Stats,
    hostiles: &[u64],
) -> (f64, bool) {
    let t0 = Instant::now();
    let (mut most, mut grew) = (0, t0);
    let plateau = |most: u64, grew: Instant| most > 0 && grew.elapsed() >= PLATEAU;
    let reached = loop {
        let holding = tally.holding.load(Ordering::Relaxed);
        if holding > most {
            (most, grew) = (holding, Instant::now());
        }
        let reached = match (pattern, target) {
            (Pattern::ActorsAtBudget, Some(n)) => {
                holding >= (n as f64 * 0.95) as u64 || plateau(most, grew)
            }
            (_, Some(n)) => holding >= (n as f64 * 0.95) as u64,
            (Pattern::ConnectionFlood, None) => match bench.stats(false).await {
                Ok(now) => {
                    let (b, n) = (egress_of(before, hostiles), egress_of(&now, hostiles));
                    n.refused_tunnels_total + n.refused_opening_total + n.refused_overload_total
                        > b.refused_tunnels_total
                            + b.refused_opening_total
                            + b.refused_overload_total
                }
                Err(_) => false,
            },
            (_, None) => t0.elapsed() >= Duration::from_secs(1),
        };
        if reached {
            break true;
        }
        let holds = target.is_some() || pattern == Pattern::ConnectionFlood;
        if (holds && plateau(most, grew)) || t0.elapsed() >= ESTABLISH_LIMIT {
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    if target.is_some() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (secs, reached)
}

/// Polls atunnel until what it holds is back within the tolerances of
/// `base` (its memory too if `memory` says so): seconds it took, or `None` after [`RECOVERY_LIMIT`] with what
/// was still above.
pub(super) async fn recover(
    bench: &Bench,
    actors: &Actors,
    base: &Resources,
    hostiles: &[u64],
    memory: Memory,
) -> (Option<f64>, Vec<String>, Resources) {
    let t0 = Instant::now();
    let mut above = vec!["no /stats answer".to_string()];
    let mut last = Resources::default();
    while t0.elapsed() < RECOVERY_LIMIT {
        if let Ok(stats) = bench.stats(true).await {
            let census = Census::take(bench, actors).await;
            last = Resources::read(
                &stats,
                bench.cgroup_sample().memory_bytes,
                bench.tunnel_pid(),
                &census,
                hostiles,
            );
            above = last.above(base, memory);
            if above.is_empty() {
                return (Some(t0.elapsed().as_secs_f64()), above, last);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    (None, above, last)
}

/// The memory pressure at which the overload guard refuses new work, in
/// bytes: its soft threshold of the limit it watches, or 0.85 of the
/// cgroup's limit if /stats does not say.
pub(super) fn soft_threshold(stats: &Stats, cgroup_limit: u64) -> f64 {
    let overload = stats.overload.as_ref();
    let soft = overload.map_or(0.85, |o| o.soft);
    let limit = overload
        .and_then(|o| o.memory)
        .map_or(cgroup_limit as f64, |m| m.limit as f64);
    soft * limit
}

#[cfg(test)]
mod tests {
    use super::*;
    use atunnel::egress::ActorEgressStats;
    use atunnel::ingress::{ActorIngressStats, RouteStats};
    use atunnel_process::overload::{OverloadState, OverloadStats};

    #[test]
    fn the_hostile_actors_figures_are_summed_and_the_victims_left_out() {
        let egress = |actor: &str, tunnels, refused_overload_total| ActorEgressStats {
            actor: actor.into(),
            tunnels,
            refused_overload_total,
            ..ActorEgressStats::default()
        };
        let ingress = |actor: &str, in_flight| ActorIngressStats {
            actor: actor.into(),
            in_flight,
            ..ActorIngressStats::default()
        };
        let stats = Stats {
            egress_actors: vec![
                egress("uid-0", 7, 3),
                egress("uid-1", 100, 1),
                egress("uid-2", 50, 0),
            ],
            ingress: Some(RouteStats {
                actors: vec![ingress("bench/actor-1", 10), ingress("bench/actor-3", 5)],
                ..RouteStats::default()
            }),
            ..Stats::default()
        };
        let h = egress_of(&stats, &[1, 2, 3]);
        assert_eq!(h.tunnels, 150.0);
        assert_eq!(h.refused_overload_total, 1.0);
        assert_eq!(egress_of(&stats, &[VICTIM]).tunnels, 7.0);
        assert_eq!(ingress_of(&stats, &[1, 2, 3]).in_flight, 15.0);
        assert_eq!(egress_of(&stats, &[9]).tunnels, 0.0);
        assert_eq!(ingress_of(&Stats::default(), &[1]).in_flight, 0.0);
    }

    /// A snapshot in overload `state` with `fds` open (the guard's other
    /// figures as a fresh guard has them).
    fn overloaded(state: OverloadState, fds: usize) -> Stats {
        let figures = OverloadStats {
            state,
            tripped_by: None,
            memory_cgroup: None,
            memory: None,
            memory_error: None,
            descriptors: None,
            descriptors_error: None,
            soft: 0.85,
            hard: 0.95,
            everyone: 0.9,
            refusing_everyone: false,
            fair_share: None,
            consumers: 0,
            refused_total: 0,
            refused_over_share_total: 0,
            shed_total: 0,
            recent_shed: Vec::new(),
            transitions_total: 0,
        };
        let mut stats = Stats {
            overload: Some(figures),
            ..Stats::default()
        };
        stats.process.open_fds = fds;
        stats
    }

    #[test]
    fn the_worst_overload_state_seen_is_kept() {
        let mut peaks = Peaks::new(10);
        let at = overloaded;
        peaks.note(20, Some(&at(OverloadState::Soft, 17_100)));
        peaks.note(15, Some(&at(OverloadState::Normal, 900)));
        peaks.note(5, None);
        assert_eq!(
            peaks,
            Peaks {
                memory: 20,
                overload: OverloadState::Soft,
                open_fds: 17_100.0
            }
        );
        peaks.note(5, Some(&at(OverloadState::Hard, 0)));
        assert_eq!(peaks.overload, OverloadState::Hard);
    }
}
