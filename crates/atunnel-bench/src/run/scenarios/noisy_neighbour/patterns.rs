//! The hostile patterns, the run's sizes, and how each pattern is planned
//! within the descriptor limit.

use super::*;

/// How big a run is: the quick one is short.
pub(super) struct Sizes {
    /// Pairs of windows per pattern (a baseline, then one under the
    /// pattern), for each figure's confidence interval.
    pub(super) pairs: usize,
    /// Each victim rung (egress HTTP, then ingress HTTPS) of a window.
    pub(super) window: Duration,
    pub(super) tcp_bytes: u64,
    pub(super) tcp_runs: usize,
    /// Unread downloads and stalled uploads held.
    pub(super) stalled: usize,
    /// Stalled ingress CONNECT tunnels held.
    pub(super) ingress: usize,
    /// Connection-flood workers, each opening one connection after another.
    pub(super) flood_workers: usize,
    /// Stalled response bodies held on the victim's router connections.
    pub(super) stalled_bodies: usize,
}

impl Sizes {
    pub(super) fn of(quick: bool) -> Self {
        if quick {
            Sizes {
                pairs: 4,
                window: Duration::from_millis(1000),
                tcp_bytes: 64 << 20,
                tcp_runs: 1,
                stalled: 1000,
                ingress: 200,
                flood_workers: 16,
                stalled_bodies: 800,
            }
        } else {
            Sizes {
                pairs: 6,
                window: Duration::from_secs(5),
                tcp_bytes: 256 << 20,
                tcp_runs: 1,
                stalled: 3000,
                ingress: 1000,
                flood_workers: 32,
                stalled_bodies: 1000,
            }
        }
    }
}

/// What the hostile actor does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pattern {
    UnreadDownloads,
    StalledUploads,
    ConnectionFlood,
    DnsFlood,
    StalledIngressConnect,
    StalledResponseBodies,
    ActorsAtBudget,
}

pub(super) const PATTERNS: [Pattern; 7] = [
    Pattern::UnreadDownloads,
    Pattern::StalledUploads,
    Pattern::ConnectionFlood,
    Pattern::DnsFlood,
    Pattern::StalledIngressConnect,
    Pattern::StalledResponseBodies,
    Pattern::ActorsAtBudget,
];

impl Pattern {
    pub(super) fn name(self) -> &'static str {
        match self {
            Pattern::UnreadDownloads => "unread-downloads",
            Pattern::StalledUploads => "stalled-uploads",
            Pattern::ConnectionFlood => "connection-flood",
            Pattern::DnsFlood => "dns-flood",
            Pattern::StalledIngressConnect => "stalled-ingress-connect",
            Pattern::StalledResponseBodies => "stalled-response-bodies",
            Pattern::ActorsAtBudget => "actors-at-budget",
        }
    }

    /// The hostile actors of the pattern, of the `actors` the worker hosts.
    pub(super) fn hostiles(self, actors: u64) -> Vec<u64> {
        match self {
            Pattern::ActorsAtBudget => (HOSTILE..actors.min(HOSTILE + AT_BUDGET_ACTORS)).collect(),
            _ => vec![HOSTILE],
        }
    }

    /// How many connections or requests the pattern holds when established:
    /// `None` for those that hold no fixed number.
    pub(super) fn target(self, s: &Sizes, plan: &Plan) -> Option<usize> {
        match self {
            Pattern::UnreadDownloads | Pattern::StalledUploads => Some(s.stalled),
            Pattern::StalledIngressConnect => Some(s.ingress),
            // No more than the victim's connections have streams for.
            Pattern::StalledResponseBodies => {
                Some(s.stalled_bodies.min(ROUTER_CONNS * ACTOR_ROUTER_STREAMS))
            }
            Pattern::ActorsAtBudget => {
                Some(plan.hostiles.len() * (plan.egress_each + INGRESS_BUDGET))
            }
            Pattern::ConnectionFlood | Pattern::DnsFlood => None,
        }
    }

    pub(super) fn what(self, s: &Sizes, hostiles: &[u64]) -> String {
        match self {
            Pattern::UnreadDownloads => format!(
                "unread-downloads: {} egress connections to the sink's source port (19, sends without end), never read; each one a bound resets is opened again",
                s.stalled
            ),
            Pattern::StalledUploads => format!(
                "stalled-uploads: {} egress connections to the sink's stall port (13, accepts and never reads, so the tunnel's HTTP/2 window is never returned), each written to until blocked; each one a bound resets is opened again; stopping closes them normally (FIN behind unsent bytes, which atunnel cannot see until its stalled-write bound)",
                s.stalled
            ),
            Pattern::ConnectionFlood => format!(
                "connection-flood: {} workers each opening egress connections to the sink's echo port one after another as fast as they go (one byte there and back to tell held from reset), holding every one atunnel admits, past the actor's tunnel budget",
                s.flood_workers
            ),
            Pattern::DnsFlood => format!(
                "dns-flood: UDP queries from the hostile actor's sandbox to its DNS relay (169.254.17.1:53) at {DNS_RATE:.0}/s; the resolver never answers, so each admitted query holds the relay's work for its 5 s timeout"
            ),
            Pattern::StalledIngressConnect => format!(
                "stalled-ingress-connect: {} HTTP/1.1 CONNECT tunnels over TLS from the router to the hostile actor's flood port ({FLOOD_PORT}, sends without end), never read after the answer's head; each one a bound resets is opened again",
                s.ingress
            ),
            Pattern::StalledResponseBodies => format!(
                "stalled-response-bodies: {} HTTPS GETs from the router to the hostile actor's /stall (a 200 head, then not a byte of body, nor an end), spread over the victim's own {ROUTER_CONNS} router HTTP/2 connections, as a router shares its connections among actors (atunnel allows {ROUTER_STREAMS} streams on each, {ACTOR_ROUTER_STREAMS} of them to one actor, so the hostile holds at most {}); each one that ends is opened again",
                s.stalled_bodies,
                ROUTER_CONNS * ACTOR_ROUTER_STREAMS
            ),
            Pattern::ActorsAtBudget => format!(
                "actors-at-budget: actors {} each try to hold {EGRESS_BUDGET} idle egress tunnels to the sink's echo port (one byte there and back, then nothing) and {INGRESS_BUDGET} HTTPS requests to their /stall over {} router connections of their own, today's default budgets; an open atunnel refuses is tried again {} s later; the generator holds at most what its descriptor limit leaves ({FD_RESERVE} kept back; fd_limited says when that cut the tunnels); verdict: whether the victim was refused (new tunnels, requests) and whether the overload guard left normal",
                hostiles
                    .iter()
                    .map(|a| format!("actor-{a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                INGRESS_BUDGET.div_ceil(ACTOR_ROUTER_STREAMS),
                AT_BUDGET_RETRY.as_secs()
            ),
        }
    }
}

/// What a pattern is run with: its hostile actors, and the egress tunnels
/// each tries to hold (fewer than its budget when the generator's
/// descriptors would not do).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Plan {
    pub(super) hostiles: Vec<u64>,
    pub(super) egress_each: usize,
    pub(super) fd_limited: bool,
}

impl Plan {
    /// `pattern`'s plan with `actors` hosted and `fd_room` descriptors the
    /// generator can still open.
    pub(super) fn of(pattern: Pattern, actors: u64, fd_room: usize) -> Self {
        let hostiles = pattern.hostiles(actors);
        let (egress_each, fd_limited) = match pattern {
            Pattern::ActorsAtBudget => {
                let room = fd_room.saturating_sub(FD_RESERVE) / hostiles.len().max(1);
                (EGRESS_BUDGET.min(room), room < EGRESS_BUDGET)
            }
            _ => (0, false),
        };
        Self {
            hostiles,
            egress_each,
            fd_limited,
        }
    }
}

/// Descriptors this process can still open: its soft `RLIMIT_NOFILE` less
/// those open now.
pub(super) fn fd_room() -> usize {
    let limit = atunnel_host::nofile_soft_limit().unwrap_or(1024);
    let open = atunnel_host::open_descriptors().unwrap_or(0);
    usize::try_from(limit.saturating_sub(open)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_at_budget_takes_four_hostile_actors_beside_the_victim_if_hosted() {
        assert_eq!(Pattern::ActorsAtBudget.hostiles(16), vec![1, 2, 3, 4]);
        assert_eq!(Pattern::ActorsAtBudget.hostiles(5), vec![1, 2, 3, 4]);
        assert_eq!(Pattern::ActorsAtBudget.hostiles(3), vec![1, 2]);
        assert_eq!(Pattern::StalledResponseBodies.hostiles(16), vec![HOSTILE]);
    }

    #[test]
    fn the_generators_descriptor_limit_cuts_the_tunnels_each_hostile_actor_tries() {
        let room = Plan::of(Pattern::ActorsAtBudget, 5, 19_900);
        assert_eq!((room.egress_each, room.fd_limited), (EGRESS_BUDGET, false));
        // 4 actors in 9,000 - 1,000 kept back: 2,000 each.
        let tight = Plan::of(Pattern::ActorsAtBudget, 5, 9_000);
        assert_eq!((tight.egress_each, tight.fd_limited), (2000, true));
        let none = Plan::of(Pattern::ActorsAtBudget, 5, 500);
        assert_eq!((none.egress_each, none.fd_limited), (0, true));
        let other = Plan::of(Pattern::StalledResponseBodies, 5, 500);
        assert_eq!((other.egress_each, other.fd_limited), (0, false));
    }

    #[test]
    fn stalled_response_bodies_target_no_more_than_the_victims_connections_have_streams_for() {
        let plan = Plan::of(Pattern::StalledResponseBodies, 5, 20_000);
        let mut sizes = Sizes::of(false);
        sizes.stalled_bodies = 1000;
        assert_eq!(
            Pattern::StalledResponseBodies.target(&sizes, &plan),
            Some(ROUTER_CONNS * ACTOR_ROUTER_STREAMS)
        );
        sizes.stalled_bodies = 100;
        assert_eq!(
            Pattern::StalledResponseBodies.target(&sizes, &plan),
            Some(100)
        );
        let budget = Plan::of(Pattern::ActorsAtBudget, 5, 20_000);
        assert_eq!(
            Pattern::ActorsAtBudget.target(&sizes, &budget),
            Some(4 * (EGRESS_BUDGET + INGRESS_BUDGET))
        );
        assert_eq!(Pattern::DnsFlood.target(&sizes, &plan), None);
    }
}
