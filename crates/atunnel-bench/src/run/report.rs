//! report.md: what each scenario measures, its figures, and what they mean
//! next to the reference's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use atunnel_bench::load::plots::file_stem;
use atunnel_bench::load::results::{self, Results, ScenarioResult};
use atunnel_bench::markdown::Table;
use atunnel_bench::scenario::{Scenario, cost, socket_memory};

/// How the run was set up, for the report's opening lines.
pub struct RunInfo {
    pub quick: bool,
    pub tunnel_cpus: f64,
    pub tunnel_memory_mib: u64,
    /// `--tunnel-arg` flags of the run.
    pub tunnel_arg: Vec<String>,
    /// The `--compare` setting, if any.
    pub compare: Option<&'static str>,
    /// The scenarios run, when not the ones run without `--scenarios`.
    pub scenarios: Option<Vec<Scenario>>,
}

/// What a scenario measures, and the reference's figure where there is one.
fn about(scenario: Scenario) -> (&'static str, &'static str) {
    match scenario {
        Scenario::EgressIdle => (
            "Idle egress connections held open from every actor's sandbox (opened at 200/s, one byte there and back each, then silent). Per connection: atunnel's live heap (counting allocator, after free memory is released), its whole cgroup's memory (user and kernel, sockets included), tasks, and the CPU it took to open one.",
            "Reference: 26.8 KiB heap, 4 goroutines, ~54 KiB of cgroup memory and ~1 ms of CPU per connection. Targets: <= 2 KiB heap, 1 task, <= 6 KiB cgroup, <= 0.1 ms to open.",
        ),
        Scenario::EgressTcp => (
            "Bulk throughput of one egress connection (actor -> tunnel -> gateway sink), three runs, with atunnel held to its CPU quota.",
            "Reference: ~305-311 MB/s per core. Target: >= 915 MB/s at 1 CPU.",
        ),
        Scenario::EgressHttp => (
            "Small HTTP/1.1 requests over 64 reused egress tunnels, open loop, rising rate; atunnel's CPU per rung.",
            "Reference: 0.83-1.00 core at 8,000 req/s.",
        ),
        Scenario::EgressNew => (
            "New egress connections per second (connect from a sandbox, one byte there and back, close): the CPU a new tunnel costs.",
            "Reference: about 1 ms of CPU per new connection. Target: <= 0.1 ms.",
        ),
        Scenario::IngressHttps => (
            "Requests from the router (HTTP/2 with the router's certificate) through the HTTPS listener to the actors, open loop, rising rate; and how many new connections to actors each 1,000 requests cost after warm-up.",
            "The reference kept two spare connections per actor and opened a new one for many requests under load. Target: < 5 new per 1,000.",
        ),
        Scenario::SocketMemory => (
            "The total memory one stalled connection holds on the proxy that holds it, 100 connections per case, with the run's flags: kernel socket memory (SO_MEMINFO on the proxy's own sockets, duplicated with pidfd_getfd) plus heap (the proxy's /stats after it released free memory), each over the proxy's idle baseline. Cases: an actor that stops reading a download; a destination that stops reading an upload, measured on atunnel and on a forwarding gateway; a router that stops reading an HTTP/1.1 CONNECT tunnel or an HTTPS response that never ends; an actor that stops reading an ingress request body. The notes say what each figure includes, the bulk throughput with the same flags, and whether the 5 ms added round trip case ran.",
            "Reference: 48-201 KiB of kernel memory per stalled connection with lowat, up to 1.4 MiB without. Bound: <= 64 KiB heap plus kernel per stalled connection, in every case.",
        ),
        Scenario::IngressIdle => (
            "Idle router connections into atunnel, per connection, with hibernation off and on: HTTP/1.1 keep-alive after a short answer and after a 60 KB one, HTTP/2 after one request, and a CONNECT tunnel after one exchange. Heap and cgroup bytes once idle (and hibernated), atunnel's CPU while they went idle, the next request on each (the first after waking when hibernated: CPU and latency; with hibernation on, several rounds of the first request after waking against the next one awake, their ratio with a 95 % interval and a verdict against 1.1x), and keep-alive throughput with hibernation off and on.",
            "Reference (seed 003, Bandit): 8.6 KB -> 2.1 KB for a short HTTP/1 answer, 587.7 KB -> 2.1 KB after a 60 KB page, 21.1 KB -> 3.3 KB for HTTP/2; 8-10 us to hibernate; keep-alive throughput within noise. Peers: nginx 15.6 KB, HAProxy 17.3 KB per idle TLS keep-alive connection. Target: <= 4 KiB hibernated.",
        ),
        Scenario::NoisyNeighbour => (
            "One hostile actor beside a victim on the same atunnel: the hostile actor (actor-1) runs unread downloads, uploads to a destination that never reads, a connection flood past its budget, a DNS flood and stalled ingress CONNECT tunnels, one after another; the victim's (actor-0) egress-http p99, egress-tcp MB/s and ingress-https p99 under each are compared with a baseline taken right before it, in several pairs of windows per pattern (the pattern stopped and started again between them), each ratio with a 95 % interval over the pairs; and the time until atunnel's memory, buffers, descriptors and tasks are back to that baseline once the hostile actor stops. atunnel runs with 10 s relay bounds for it (60 s by default) and a resolver that never answers.",
            "Pass: the whole 95 % interval of the victim's p99 ratio within 1.1x of its baseline and of its throughput ratio at least 0.9x (fail: a whole interval outside; inconclusive: an interval straddling its bound, counted apart and neither pass nor fail), no OOM kill, atunnel's memory under the overload guard's soft threshold, and everything back to baseline within 60 s.",
        ),
        Scenario::Chaos => (
            "Faults lose no data silently: many concurrent egress tunnels, each a known pseudo-random stream both ways checked byte for byte at both ends, while the gateway is SIGKILLed and restarted, the worker deactivates an actor over atunnel's control API (and activates it again), atunnel is SIGKILLed and restarted by the worker, or destinations reset mid-stream (and a phase with no fault). Each tunnel is classified from the actor's side: completed, cut with RST, refused (a CONNECT that failed, no byte), or silently truncated (a clean end after fewer or different bytes).",
            "Pass: no tunnel silently truncated under any fault, every tunnel completed with no fault, and with one actor deactivated every other actor's tunnels completed.",
        ),
        Scenario::ActorScale => (
            "Many actors on one atunnel (1,000; 100 with --quick), each brought up through the control API as a worker does (ServeSandbox: two namespaces, a veth and the redirect; PrepareEgress; Activate), one at a time; one idle egress connection from every sandbox; then, once the connections and the pooled gateway connections closed, what an idle actor costs; then every sandbox closed. Time per sandbox (p50/p99, first and last tenth) and in total, atunnel's CPU per sandbox, heap, cgroup and kernel memory and descriptors per idle actor, the pooled gateway connection's and the idle tunnel's heap beside it, and what teardown left behind.",
            "Target: <= 8 KiB of atunnel heap per idle actor once its pooled gateway connection closed, no per-actor cost that grows with the count, and nothing left after teardown.",
        ),
        Scenario::IngressConnect => (
            "CONNECT tunnels from the router through the CONNECT listener to actor:80, one request and answer inside each.",
            "",
        ),
        Scenario::Cost => (
            "What one unit of work costs each contender, in counts that do not move with the machine's noise: user-space instructions (callgrind), system calls (total and the top five by name) and context switches (perf's tracepoints on the contender's processes), heap allocations (atunnel's counting allocator). Each figure is (a window of 2N units - a window of N) / N. Units: an ingress HTTPS request, an ingress CONNECT tunnel with one request, an egress tunnel opened and closed, a MiB up and a MiB down an egress tunnel, an egress HTTP request on a kept tunnel, an idle ingress connection hibernated and woken; nginx and HAProxy in atunnel's place where they can do the unit (ingress HTTPS; HAProxy also egress opens and bytes, as a TCP -> TLS relay in the sandbox, which does none of atunnel's HTTP/2 framing and makes a TLS handshake per tunnel); the path column says how each reached the actors.",
            "Issue 29: the same wall-clock figure moved 1.5x between runs on this machine; these counts should stay within 2 % (instructions) and 5 % (syscalls, context switches) between runs.",
        ),
    }
}

/// The few lines shown on the console after a scenario.
pub fn summary_lines(s: &ScenarioResult) -> Vec<String> {
    let mut lines = vec![format!("summary: {}", s.summary_json())];
    lines.extend(s.notes.iter().map(|n| format!("note: {n}")));
    lines
}

/// The command that runs the same scenarios with the same settings.
fn reproduce(args: &RunInfo, allocator: &str) -> String {
    format!(
        "cargo run --release -p atunnel-bench{} -- run{}{}{}{}",
        match allocator {
            "system" => String::new(),
            other => format!(" --features {other}"),
        },
        if args.quick { " --quick" } else { "" },
        args.compare
            .map(|c| format!(" --compare {c}"))
            .unwrap_or_default(),
        args.scenarios
            .as_ref()
            .map(|s| {
                let names: Vec<&str> = s.iter().map(|s| s.name()).collect();
                format!(" --scenarios {}", names.join(","))
            })
            .unwrap_or_default(),
        args.tunnel_arg
            .iter()
            .map(|a| format!(" --tunnel-arg={a}"))
            .collect::<String>(),
    )
}

pub fn write(
    dir: &Path,
    args: &RunInfo,
    results: &Results,
    plots: &[PathBuf],
    events: &[String],
) -> std::io::Result<()> {
    let mut md = String::new();
    let _ = writeln!(md, "# atunnel-bench run\n");
    let _ = writeln!(
        md,
        "atunnel ran in a cgroup of its own with {} CPU and {} MiB of memory (no swap); the worker (which restarts atunnel when it dies), the gateway sink and the load generator each in a network namespace of their own, the actors in real sandboxes with certificates minted through a fake node agent over mutual TLS on a Unix socket. Load is open loop: each unit is due on a fixed schedule and latency counts from when it was due. Each rung's verdict separates atunnel out of CPU (`tunnel-cpu`) from the generator (`generator`) or the far end (`far-end`) being the bottleneck.\n",
        args.tunnel_cpus, args.tunnel_memory_mib
    );
    let _ = writeln!(
        md,
        "Reproduce: `{}`. Allocator: {}. This machine: {} cores; figures from one noisy shared machine, so compare ratios within a run.\n",
        reproduce(args, crate::allocator::NAME),
        crate::allocator::NAME,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for s in &results.scenarios {
        let (what, reference) = Scenario::from_name(&s.name).map_or(("", ""), about);
        let _ = writeln!(md, "## {}\n\n{what}\n", s.name);
        if !reference.is_empty() {
            let _ = writeln!(md, "{reference}\n");
        }
        if !s.rungs.is_empty() {
            let mut t = Table::new(&[
                "offered/s",
                "achieved/s",
                "errors",
                "verdict",
                "tunnel cores",
                "heap MiB",
                "cgroup MiB",
                "p50 ms",
                "p99 ms",
                "max ms",
            ]);
            for r in &s.rungs {
                t.row([
                    format!("{:.0}", r.offered),
                    format!("{:.1}", r.achieved),
                    r.errors.to_string(),
                    r.verdict.to_string(),
                    format!("{:.2}", r.tunnel_cpu_cores),
                    format!("{:.1}", r.tunnel_heap_bytes as f64 / 1048576.0),
                    format!("{:.1}", r.tunnel_cgroup_bytes as f64 / 1048576.0),
                    format!("{:.2}", r.latency_us.p50 as f64 / 1e3),
                    format!("{:.2}", r.latency_us.p99 as f64 / 1e3),
                    format!("{:.2}", r.latency_us.max as f64 / 1e3),
                ]);
            }
            md.push_str(&t.end());
        }
        if s.name == Scenario::NoisyNeighbour.name() {
            md.push_str(&super::scenarios::noisy_neighbour::report_section(dir, s)?);
        }
        if s.name == Scenario::Chaos.name() {
            md.push_str(&super::scenarios::chaos::report_section(s));
        }
        if let Some(memory) = s.summary::<socket_memory::Summary>() {
            md.push_str(&stall_table(&memory));
        }
        if let Some(cost) = s.summary::<cost::Summary>() {
            md.push_str(&super::scenarios::cost::report_section(&cost));
        }
        let _ = writeln!(md, "Summary: `{}`\n", s.summary_json());
        for n in &s.notes {
            let _ = writeln!(md, "- {n}");
        }
        for name in plot_names(plots).filter(|n| plot_scenario(n) == file_stem(&s.name)) {
            let _ = writeln!(md, "\n![{}]({name})\n", plot_alt(&name));
        }
    }
    for c in &results.comparisons {
        let what = match c.name.as_str() {
            "copy-mode" => {
                "`lean` is atunnel's relay (one task per tunnel, no buffer while idle, pooled buffers while data moves); `naive` reproduces the reference's design before its fix: a task and a 32 KiB buffer per direction for the tunnel's whole life, plus a reader task per HTTP/2 stream. The reference measured 157 KiB and 5.1 goroutines per idle connection before its fix and 29 KiB after (seed 000)."
            }
            "wait-buffer" => {
                "How an egress tunnel waits for its actor's next byte: `0` waits for readiness and holds nothing; `N B` holds an N-byte buffer per tunnel for its whole life and reads into it, borrowing a pooled buffer once data moves (the reference chose 512 B; its sweep found about 2 KiB more per idle connection per extra KiB, flat HTTP CPU, and a TCP spread between runs larger than any difference between sizes)."
            }
            "peers" => {
                "atunnel against nginx and HAProxy in its place: the same cgroup (CPU quota and memory limit), the same listen address, the worker's certificate, the router's load with its certificate, and the same actors' program (64-byte answers); each peer's configuration is written in `peers/` of the run folder (one worker, upstream keep-alive, no access log). HAProxy crosses the same veth into each actor's sandbox as atunnel (sandboxes the worker builds as atunnel does, `namespace` on HAProxy's server lines); nginx cannot enter a namespace and reaches the actors on 127.0.0.1 in the worker's namespace (no veth, no nftables); the peers check the router's CA chain, atunnel also its SPIFFE ID."
            }
            _ => "",
        };
        let measured = if c.name == "peers" {
            "Each contender is started fresh by the worker in the same run: sustainable requests/s and CPU per request at the highest rate every contender kept up with (ingress-https), and cgroup bytes per idle HTTP/1.1 and HTTP/2 router connection (ingress-idle; atunnel's hibernated figure beside them); ratio = atunnel's figure over the contender's."
        } else {
            "Each variant runs on a fresh atunnel in the same run: idle heap and cgroup bytes per idle egress connection and tasks per connection (egress-idle), tunnel cores at 8,000 requests/s (egress-http), and three bulk runs in MB/s (egress-tcp)."
        };
        let _ = writeln!(
            md,
            "## Comparison: {}\n\n{what} {measured}\n\n```\n{}```\n",
            c.name,
            results::comparison_table(c)
        );
    }
    // Plots of scenarios run only under a comparison (their variants are
    // the series): under the comparisons.
    for name in plot_names(plots).filter(|n| {
        !results
            .scenarios
            .iter()
            .any(|s| file_stem(&s.name) == plot_scenario(n))
    }) {
        let _ = writeln!(md, "![{}]({name})\n", plot_alt(&name));
    }
    if !events.is_empty() {
        let _ = writeln!(md, "## Events\n");
        for e in events {
            let _ = writeln!(md, "- {e}");
        }
    }
    results::write_whole(&dir.join("report.md"), md)
}

/// The file names of the plots written beside report.md.
fn plot_names(plots: &[PathBuf]) -> impl Iterator<Item = String> + '_ {
    plots
        .iter()
        .filter_map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
}

/// The scenario a plot belongs to: its name up to the first `.`
/// (`egress-idle.memory-per-connection.svg`, `egress-idle.svg`).
fn plot_scenario(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// A plot's alt text: "egress-idle memory-per-connection".
fn plot_alt(name: &str) -> String {
    name.trim_end_matches(".svg").replace('.', " ")
}

/// socket-memory's cases as a table: per stalled connection, kernel, heap
/// and their total, and the verdict against the bound.
fn stall_table(summary: &socket_memory::Summary) -> String {
    if summary.cases.is_empty() {
        return String::new();
    }
    let bound = summary.bound_kib.unwrap_or(64.0);
    let kib = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
    let mut t = Table::new(&[
        "case".to_string(),
        "proxy".into(),
        "kernel KiB".into(),
        "heap KiB".into(),
        "total KiB".into(),
        format!("verdict (<= {bound} KiB)"),
    ]);
    for c in &summary.cases {
        let verdict = match c.pass {
            Some(true) => "pass",
            Some(false) => "FAIL",
            None => "-",
        };
        t.row([
            c.case.clone(),
            c.measured.clone(),
            kib(c.kernel_kib),
            kib(c.heap_kib),
            kib(c.total_kib),
            verdict.into(),
        ]);
    }
    t.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(compare: Option<&'static str>, scenarios: Option<&[Scenario]>) -> RunInfo {
        RunInfo {
            quick: true,
            tunnel_cpus: 1.0,
            tunnel_memory_mib: 1024,
            tunnel_arg: vec!["--wait-buffer=512".into()],
            compare,
            scenarios: scenarios.map(<[Scenario]>::to_vec),
        }
    }

    #[test]
    fn the_stall_table_has_a_row_per_case_with_the_total_and_its_verdict() {
        let case =
            |case: &str, measured: &str, kernel: f64, heap: f64, pass: bool| socket_memory::Case {
                case: case.into(),
                measured: measured.into(),
                kernel_kib: Some(kernel),
                heap_kib: Some(heap),
                total_kib: Some(kernel + heap),
                pass: Some(pass),
                ..Default::default()
            };
        let summary = socket_memory::Summary {
            bound_kib: Some(64.0),
            cases: vec![
                case("actor-stops-reading", "atunnel", 20.0, 1.5, true),
                case("destination-stops-reading", "gateway", 300.0, 0.0, false),
            ],
            ..Default::default()
        };
        let table = stall_table(&summary);
        assert!(
            table.contains("| actor-stops-reading | atunnel | 20.0 | 1.5 | 21.5 | pass |"),
            "{table}"
        );
        assert!(
            table.contains("| destination-stops-reading | gateway | 300.0 | 0.0 | 300.0 | FAIL |"),
            "{table}"
        );
        assert_eq!(stall_table(&socket_memory::Summary::default()), "");
    }

    #[test]
    fn each_plot_is_linked_under_its_own_scenario() {
        let dir = tempfile::tempdir().expect("tempdir");
        let scenario = |s: Scenario| ScenarioResult::without_summary(s, Vec::new());
        let results = Results {
            scenarios: vec![
                scenario(Scenario::EgressIdle),
                scenario(Scenario::IngressIdle),
            ],
            comparisons: vec![results::Comparison {
                name: "copy-mode".into(),
                variants: Vec::new(),
            }],
            cost: None,
        };
        let plots: Vec<PathBuf> = [
            "egress-idle.svg",
            "egress-idle.memory-per-connection.svg",
            "ingress-idle.hibernation.svg",
            "egress-tcp.throughput.svg",
        ]
        .iter()
        .map(|f| dir.path().join(f))
        .collect();
        write(dir.path(), &info(None, None), &results, &plots, &[]).expect("written");
        let md = std::fs::read_to_string(dir.path().join("report.md")).expect("report");
        let section = |head: &str| -> &str {
            let start = md.find(head).unwrap_or_else(|| panic!("{head} in {md}"));
            let rest = &md[start + head.len()..];
            &rest[..rest.find("\n## ").unwrap_or(rest.len())]
        };
        let egress = section("## egress-idle\n");
        assert!(egress.contains("![egress-idle](egress-idle.svg)"), "{md}");
        assert!(
            egress.contains(
                "![egress-idle memory-per-connection](egress-idle.memory-per-connection.svg)"
            ),
            "{md}"
        );
        assert!(
            !egress.contains("ingress-idle.") && !egress.contains("egress-tcp."),
            "{md}"
        );
        let ingress = section("## ingress-idle\n");
        assert!(
            ingress.contains("![ingress-idle hibernation](ingress-idle.hibernation.svg)"),
            "{md}"
        );
        assert!(!ingress.contains("(egress-idle"), "{md}");
        // egress-tcp ran only under the comparison: its plot follows it.
        let compared = section("## Comparison: copy-mode");
        assert!(
            compared.contains("![egress-tcp throughput](egress-tcp.throughput.svg)"),
            "{md}"
        );
        assert_eq!(md.matches("](").count(), 4, "each plot once: {md}");
    }

    #[test]
    fn the_reproduce_command_names_the_comparison_and_only_real_scenarios() {
        assert_eq!(
            reproduce(&info(Some("copy-mode"), None), "system"),
            "cargo run --release -p atunnel-bench -- run --quick --compare copy-mode --tunnel-arg=--wait-buffer=512"
        );
        assert_eq!(
            reproduce(
                &info(None, Some(&[Scenario::EgressTcp, Scenario::EgressNew])),
                "jemalloc"
            ),
            "cargo run --release -p atunnel-bench --features jemalloc -- run --quick --scenarios egress-tcp,egress-new --tunnel-arg=--wait-buffer=512"
        );
    }
}
