//! The figures: what each reads from a run's results and draws.

use super::*;

#[test]
fn a_cost_unit_is_drawn_with_each_contender_side_by_side_and_a_peers_allocations_as_na() {
    let unit = json!({
        "name": "ingress-https",
        "per": "request",
        "n": 200,
        "contenders": [
            {"name": "atunnel", "instructions": 84400.0, "syscalls": 6.1,
             "syscalls_by_name": {"writev": 2.0, "recvfrom": 2.0, "epoll_wait": 2.1},
             "context_switches": 2.0, "allocations": 35.0},
            {"name": "nginx", "instructions": null, "syscalls": 8.0,
             "syscalls_by_name": {"read": 2.0, "writev": 1.0, "epoll_wait": 2.0},
             "context_switches": 2.0, "allocations": null},
        ],
    });
    let svg = cost_unit(&unit).expect("drawn");
    check(&svg);
    // Each panel names both contenders.
    assert_eq!(text(&svg, "atunnel"), 3, "{svg}");
    assert_eq!(text(&svg, "nginx"), 3, "{svg}");
    // The syscalls panel's series: the top names and the rest.
    for name in ["writev", "epoll_wait", "read", "rest"] {
        assert!(text(&svg, name) >= 1, "{name} missing: {svg}");
    }
    // nginx's instructions and allocations were not measured.
    assert!(svg.contains("n/a"), "{svg}");
}

#[test]
fn a_cost_units_syscalls_are_one_stacked_bar_per_contender_summing_to_its_total() {
    // Top five over both: recvfrom 6, epoll_wait 4, getpid 3, sendto 3,
    // writev 2; atunnel's futex, close and other are its rest.
    let unit = json!({
        "name": "egress-open",
        "per": "tunnel",
        "n": 64,
        "contenders": [
            {"name": "atunnel", "instructions": 90000.0, "syscalls": 10.0,
             "syscalls_by_name": {"writev": 2.0, "recvfrom": 2.0, "epoll_wait": 2.0,
                 "sendto": 1.0, "futex": 1.0, "close": 0.5, "other": 1.5},
             "context_switches": 5.0, "allocations": 19.0},
            {"name": "haproxy", "instructions": null, "syscalls": 12.0,
             "syscalls_by_name": {"recvfrom": 4.0, "sendto": 2.0, "epoll_wait": 2.0,
                 "getpid": 3.0, "other": 1.0},
             "context_switches": 4.0, "allocations": null},
        ],
    });
    let svg = cost_unit(&unit).expect("drawn");
    check(&svg);
    // The stacked panel's bars are the only ones drawn as columns of
    // several rects of one x and width: (recvfrom, epoll_wait, getpid, sendto,
    // writev, rest) are series 0-5.
    let drawn = bars_drawn(&svg, 6);
    let mut columns: Vec<(f64, f64)> = drawn.iter().map(|r| (r.1, r.3)).collect();
    columns.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    columns.dedup();
    let columns: Vec<Vec<Drawn>> = columns
        .into_iter()
        .map(|(x, w)| {
            drawn
                .iter()
                .copied()
                .filter(|r| (r.1, r.3) == (x, w))
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() >= 2)
        .collect();
    assert_eq!(columns.len(), 2, "a stacked bar per contender: {drawn:?}");
    let mut heights = Vec::new();
    for column in &columns {
        // Each segment starts where the one before it ends (y grows
        // downwards), from the axis up.
        for pair in column.windows(2) {
            let (below, above) = (pair[0], pair[1]);
            assert!(
                (above.2 + above.4 - below.2).abs() <= 1.0,
                "segments apart: {column:?}"
            );
        }
        heights.push(column.iter().map(|r| r.4).sum::<f64>());
    }
    // atunnel: 2 + 2 + 1 + 2 + a rest of 3 = 10; haproxy: 4 + 2 + 3 + 2
    // + a rest of 1 = 12: the segments sum to each one's total.
    let ratio = heights[0] / heights[1];
    assert!((ratio - 10.0 / 12.0).abs() < 0.02, "{heights:?}");
    let rest = columns[0]
        .iter()
        .find(|r| r.0 == 5)
        .expect("atunnel's rest");
    assert!(
        (rest.4 / heights[0] - 0.3).abs() < 0.02,
        "{rest:?} of {heights:?}"
    );
    assert!(
        !columns[0].iter().any(|r| r.0 == 2),
        "atunnel makes no getpid"
    );
    // The other panels kept.
    assert!(svg.contains("user-space instructions"), "{svg}");
    assert!(
        svg.contains("context switches and heap allocations"),
        "{svg}"
    );
}

#[test]
fn idle_memory_per_connection_has_a_bar_per_contender_and_variant() {
    let svg = plot(&sample(), "egress-idle.memory-per-connection.svg");
    // Heap and cgroup panels, atunnel then the two copy modes: one bar
    // and one swatch per panel each, at the one connection count.
    for i in 0..3 {
        assert_eq!(
            (rects(&svg, i), lines(&svg, i)),
            (4, 0),
            "series {i}: {svg}"
        );
    }
    assert_eq!(rects(&svg, 3), 0, "{svg}");
    for t in [
        "heap per idle connection",
        "cgroup memory per idle connection (user and kernel)",
        "heap bytes per connection",
        "cgroup bytes per connection",
        "idle connections held",
        "atunnel",
        "lean (copy-mode)",
        "naive (copy-mode)",
        "69561",
        "140000",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
    assert_eq!(text(&svg, "1000 connections"), 2, "{svg}");

    // ingress-idle: a group per case, awake and hibernated bars in
    // each of the two panels, and the swatches.
    let svg = plot(&sample(), "ingress-idle.memory-per-connection.svg");
    assert_eq!((rects(&svg, 0), rects(&svg, 1)), (6, 6), "{svg}");
    for t in [
        "atunnel",
        "atunnel, hibernated",
        "http1-keepalive-short",
        "http2-one-request",
        "8600",
        "2100",
        "6600",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
    assert_eq!(text(&svg, "150 connections"), 2 * 2, "{svg}");
}

#[test]
fn peers_are_one_more_series_in_the_same_plots() {
    // `--compare peers`: atunnel, nginx and HAProxy each on
    // ingress-https and ingress-idle; a peer has no heap figure and
    // does not hibernate.
    let contender = |label: &str, cores: f64, cgroup: f64, hibernates: bool| {
        let case = |name: &str| {
            let mut c = json!({"case": name, "cgroup_bytes_per_conn": cgroup,
                               "heap_bytes_per_conn": null});
            if hibernates {
                c["heap_bytes_per_conn"] = json!(cgroup / 2.0);
                c["hibernated_heap_bytes_per_conn"] = json!(2000.0);
                c["hibernated_cgroup_bytes_per_conn"] = json!(4000.0);
            }
            c
        };
        Variant {
            label: label.into(),
            flags: Vec::new(),
            scenarios: vec![
                ScenarioResult {
                    name: "ingress-https".into(),
                    rungs: vec![
                        rung(1000.0, cores, Verdict::Ok),
                        rung(2000.0, cores * 2.0, Verdict::Ok),
                    ],
                    ..ScenarioResult::default()
                },
                ScenarioResult {
                    name: "ingress-idle".into(),
                    summary: json!({"conns": 150, "cases": [
                        case("http1-keepalive-short"), case("http2-one-request")]}),
                    ..ScenarioResult::default()
                },
            ],
        }
    };
    let r = Results {
        scenarios: Vec::new(),
        comparisons: vec![Comparison {
            name: "peers".into(),
            variants: vec![
                contender("atunnel", 0.1, 16000.0, true),
                contender("nginx", 0.08, 15600.0, false),
                contender("haproxy", 0.09, 17300.0, false),
            ],
        }],
        cost: None,
    };
    let files: Vec<String> = of_results(&r)
        .expect("drawn")
        .into_iter()
        .map(|p| p.file)
        .collect();
    assert_eq!(
        files,
        [
            "ingress-idle.memory-per-connection.svg",
            "ingress-idle.hibernation.svg",
            "ingress-https.cpu-per-request.svg",
        ]
    );
    let svg = plot(&r, "ingress-https.cpu-per-request.svg");
    // A line per contender in each of the two panels, two markers each.
    for i in 0..3 {
        assert_eq!(
            (lines(&svg, i), markers(&svg, i)),
            (2, 4),
            "series {i}: {svg}"
        );
    }
    for t in ["atunnel (peers)", "nginx (peers)", "haproxy (peers)"] {
        assert_eq!(text(&svg, t), 2, "{t}: {svg}");
    }
    let svg = plot(&r, "ingress-idle.memory-per-connection.svg");
    // Series: atunnel, atunnel hibernated, nginx, haproxy; two cases.
    // The peers' heap is not measured: "n/a" in the heap panel.
    assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
    assert_eq!(rects(&svg, 1), 2 * 2 + 2, "{svg}");
    assert_eq!(rects(&svg, 2), 2 + 2, "nginx: cgroup bars only: {svg}");
    assert_eq!(rects(&svg, 3), 2 + 2, "haproxy: cgroup bars only: {svg}");
    assert_eq!(text(&svg, "n/a"), 2 * 2, "{svg}");
    for t in ["15600", "17300", "4000", "atunnel (peers), hibernated"] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
}

#[test]
fn a_contender_measured_at_several_counts_is_one_more_line() {
    let at = |label: &str, conns: f64, heap: f64| PerConnection {
        label: label.into(),
        case: String::new(),
        conns,
        heap_bytes: Some(heap),
        cgroup_bytes: Some(heap * 3.0),
    };
    let contenders = [
        at("atunnel", 1000.0, 1500.0),
        at("atunnel", 10000.0, 1450.0),
        at("nginx", 1000.0, 15600.0),
        at("nginx", 10000.0, 15000.0),
        at("nginx", 20000.0, 15100.0),
    ];
    let svg = memory_per_connection("egress-idle", &contenders).expect("drawn");
    check(&svg);
    // Two panels, a line each; markers per point; the swatches.
    assert_eq!(
        (lines(&svg, 0), markers(&svg, 0), rects(&svg, 0)),
        (2, 4, 2)
    );
    assert_eq!(
        (lines(&svg, 1), markers(&svg, 1), rects(&svg, 1)),
        (2, 6, 2)
    );
    assert_eq!(text(&svg, "nginx"), 2);
}

#[test]
fn hibernation_has_awake_and_hibernated_bars_per_case_and_the_cpu() {
    let svg = plot(&sample(), "ingress-idle.hibernation.svg");
    // Heap, cgroup, CPU: two cases each, and a swatch per panel.
    assert_eq!(
        (rects(&svg, 0), rects(&svg, 1)),
        (3 * 2 + 3, 3 * 2 + 3),
        "{svg}"
    );
    for t in [
        "awake (hibernation off)",
        "hibernated",
        "hibernation on",
        "atunnel CPU per connection while going idle",
        "CPU us per connection",
        "http1-keepalive-short",
        "http2-one-request",
        "8600",
        "2100",
        "21100",
        "3300",
        "9",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
    // Without the CPU figure: two panels.
    let mut r = sample();
    let idle = r
        .scenarios
        .iter_mut()
        .find(|s| s.name == "ingress-idle")
        .expect("there");
    for c in idle.summary["cases"].as_array_mut().expect("cases") {
        c["hibernated_idle_cpu_us_per_conn"] = Value::Null;
    }
    let svg = plot(&r, "ingress-idle.hibernation.svg");
    assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
}

#[test]
fn cpu_per_request_is_a_line_per_contender_against_the_rate() {
    let svg = plot(&sample(), "ingress-https.cpu-per-request.svg");
    // Three rungs: a line and three markers in each of the two panels.
    assert_eq!((lines(&svg, 0), markers(&svg, 0)), (2, 6), "{svg}");
    for t in [
        "tunnel CPU per request",
        "CPU us per request",
        "throughput per tunnel core",
        "requests per second per core",
        "offered rate (requests per second)",
        "atunnel",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
    // 0.1 cores at 1,000/s is 100 us a request: the y axis reaches it.
    assert!(text(&svg, "100") >= 1, "{svg}");
    assert!(
        !of_results(&sample())
            .expect("drawn")
            .iter()
            .any(|p| p.file == "egress-http.cpu-per-request.svg")
    );
}

#[test]
fn tcp_throughput_has_a_bar_per_run_and_contender() {
    let svg = plot(&sample(), "egress-tcp.throughput.svg");
    // atunnel, lean, naive: three runs in two panels, a swatch each.
    for i in 0..3 {
        assert_eq!(rects(&svg, i), 2 * 3 + 2, "series {i}: {svg}");
    }
    for t in [
        "run 1",
        "run 3",
        "MB/s",
        "MB/s per tunnel core",
        "naive (copy-mode)",
        "950",
        "1000",
        "700",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
}

#[test]
fn stall_memory_has_kernel_heap_and_total_per_case_with_the_bound() {
    let svg = plot(&sample(), "socket-memory.stall-memory.svg");
    // Three cases; the third has no kernel or total figure.
    assert_eq!(
        (rects(&svg, 0), rects(&svg, 1), rects(&svg, 2)),
        (3, 4, 3),
        "{svg}"
    );
    assert_eq!(text(&svg, "n/a"), 2, "{svg}");
    for t in [
        "kernel (socket buffers)",
        "heap",
        "total",
        "bound 64 KiB",
        "destination-stops-reading",
        "(gateway)",
        "KiB per stalled connection",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
}

#[test]
fn a_run_without_the_figures_draws_none_of_them() {
    assert!(of_results(&Results::default()).expect("drawn").is_empty());
    let bare = |name: &str| ScenarioResult {
        name: name.into(),
        ..ScenarioResult::default()
    };
    let r = Results {
        scenarios: [
            "egress-idle",
            "ingress-idle",
            "egress-tcp",
            "socket-memory",
            "ingress-https",
        ]
        .into_iter()
        .map(bare)
        .collect(),
        comparisons: Vec::new(),
        cost: None,
    };
    let plots = of_results(&r).expect("drawn");
    assert!(
        plots.is_empty(),
        "{:?}",
        plots.iter().map(|p| &p.file).collect::<Vec<_>>()
    );
}

#[test]
fn every_plot_of_a_run_is_named_for_its_scenario() {
    let files: Vec<String> = of_results(&sample())
        .expect("drawn")
        .into_iter()
        .map(|p| p.file)
        .collect();
    assert_eq!(
        files,
        [
            "egress-idle.svg",
            "ingress-https.svg",
            "ingress-idle.svg",
            "egress-idle.memory-per-connection.svg",
            "ingress-idle.memory-per-connection.svg",
            "ingress-idle.hibernation.svg",
            "ingress-https.cpu-per-request.svg",
            "egress-tcp.throughput.svg",
            "socket-memory.stall-memory.svg",
        ]
    );
    // A ladder at one rate (ingress-idle: keep-alive with hibernation
    // off and on) is bars, one per rung.
    let svg = plot(&sample(), "ingress-idle.svg");
    assert_eq!((rects(&svg, 0), lines(&svg, 0)), (3 * 2 + 3, 0), "{svg}");
    assert_eq!(text(&svg, "rung 2 at 1000/s"), 3, "{svg}");
}

#[test]
fn noisy_neighbour_draws_the_victim_beside_its_baseline_per_pattern() {
    use crate::scenario::noisy_neighbour::{Pattern, Victim};
    let row = |pattern: &str, recovered: Option<f64>| Pattern {
        pattern: pattern.into(),
        victim: Victim {
            baseline_http_p50_us: 400.0,
            victim_http_p50_us: 450.0,
            baseline_http_p99_us: 900.0,
            victim_http_p99_us: 1800.0,
            baseline_https_p99_us: 1500.0,
            victim_https_p99_us: 1400.0,
            baseline_tcp_mb_s: 600.0,
            victim_tcp_mb_s: 570.0,
            ..Victim::default()
        },
        victim_p99_ratio: Some(2.0),
        victim_https_p99_ratio: Some(0.93),
        victim_tcp_ratio: Some(0.95),
        baseline_memory_bytes: 60 << 20,
        peak_memory_bytes: 120 << 20,
        soft_threshold_bytes: (870u64 << 20) as f64,
        recovered_s: recovered,
        ..Pattern::default()
    };
    let rows = [row("unread-downloads", Some(0.4)), row("dns-flood", None)];
    let bounds = VictimBounds {
        p99_ratio_max: 1.1,
        tcp_ratio_min: 0.9,
    };
    let svg = noisy_neighbour(&rows, bounds).expect("drawn");
    check(&svg);
    // Series 0 is in all six panels (http p50 baseline, https p99
    // baseline, tcp baseline, the http ratio, baseline memory, the
    // recovery, which only the first pattern has); series 3 (http p99
    // under) only in the first.
    assert_eq!(rects(&svg, 0), 2 * 5 + 1 + 6, "{svg}");
    assert_eq!(rects(&svg, 3), 2 + 1, "{svg}");
    assert_eq!(text(&svg, "n/a"), 1, "never recovered: {svg}");
    for t in [
        "0.45",
        "1.8",
        "p99 bound 1.1",
        "tcp bound 0.9",
        "soft threshold 870 MiB",
        "dns-flood",
    ] {
        assert!(text(&svg, t) >= 1, "{t}: {svg}");
    }
}
