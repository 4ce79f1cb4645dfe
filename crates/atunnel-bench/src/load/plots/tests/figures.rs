//! The figures of a run: what each draws from the run's results, every
//! contender's where it compares them.

use super::*;

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
    assert_written(
        &svg,
        &[
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
        ],
    );
    assert_eq!(text(&svg, "1000 connections"), 2, "{svg}");

    // ingress-idle: a group per case, awake and hibernated bars in
    // each of the two panels, and the swatches.
    let svg = plot(&sample(), "ingress-idle.memory-per-connection.svg");
    assert_eq!((rects(&svg, 0), rects(&svg, 1)), (6, 6), "{svg}");
    assert_written(
        &svg,
        &[
            "atunnel",
            "atunnel, hibernated",
            "http1-keepalive-short",
            "http2-one-request",
            "8600",
            "2100",
            "6600",
        ],
    );
    assert_eq!(text(&svg, "150 connections"), 2 * 2, "{svg}");
}

#[test]
fn peers_are_one_more_series_in_the_same_plots() {
    // `--compare peers`: atunnel, nginx and HAProxy each on
    // ingress-https and ingress-idle; a peer has no heap figure and
    // does not hibernate.
    let contender = |label: &str, cores: f64, cgroup: f64, hibernates: bool| {
        let case = |name: &str| {
            let mut c = ingress_idle::Case {
                case: name.into(),
                cgroup_bytes_per_conn: cgroup,
                ..Default::default()
            };
            if hibernates {
                c.heap_bytes_per_conn = Some(cgroup / 2.0);
                c.hibernated_heap_bytes_per_conn = Some(2000.0);
                c.hibernated_cgroup_bytes_per_conn = Some(4000.0);
            }
            c
        };
        let idle = ingress_idle::Summary {
            conns: 150,
            cases: vec![case("http1-keepalive-short"), case("http2-one-request")],
            ..Default::default()
        };
        Variant {
            label: label.into(),
            flags: Vec::new(),
            scenarios: vec![
                rungs_only(
                    Scenario::IngressHttps,
                    vec![
                        rung(1000.0, cores, Verdict::Ok),
                        rung(2000.0, cores * 2.0, Verdict::Ok),
                    ],
                ),
                ScenarioResult::new(&idle, Vec::new(), Vec::new()),
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
    assert_written_times(
        &svg,
        &["atunnel (peers)", "nginx (peers)", "haproxy (peers)"],
        2,
    );
    let svg = plot(&r, "ingress-idle.memory-per-connection.svg");
    // Series: atunnel, atunnel hibernated, nginx, haproxy; two cases.
    // The peers' heap is not measured: "n/a" in the heap panel.
    assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
    assert_eq!(rects(&svg, 1), 2 * 2 + 2, "{svg}");
    assert_eq!(rects(&svg, 2), 2 + 2, "nginx: cgroup bars only: {svg}");
    assert_eq!(rects(&svg, 3), 2 + 2, "haproxy: cgroup bars only: {svg}");
    assert_eq!(text(&svg, "n/a"), 2 * 2, "{svg}");
    assert_written(
        &svg,
        &["15600", "17300", "4000", "atunnel (peers), hibernated"],
    );
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
    let svg = memory_per_connection("egress-idle", &contenders)
        .chart
        .render()
        .expect("drawn");
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
    assert_written(
        &svg,
        &[
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
        ],
    );
    // Without the CPU figure: two panels.
    let mut r = sample();
    let mut summary = ingress_idle_summary();
    for c in &mut summary.cases {
        c.hibernated_idle_cpu_us_per_conn = None;
    }
    let idle = r
        .scenarios
        .iter_mut()
        .find(|s| s.name == "ingress-idle")
        .expect("there");
    *idle = ingress_idle_result(&summary);
    let svg = plot(&r, "ingress-idle.hibernation.svg");
    assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
}

#[test]
fn cpu_per_request_is_a_line_per_contender_against_the_rate() {
    let svg = plot(&sample(), "ingress-https.cpu-per-request.svg");
    // Three rungs: a line and three markers in each of the two panels.
    assert_eq!((lines(&svg, 0), markers(&svg, 0)), (2, 6), "{svg}");
    assert_written(
        &svg,
        &[
            "tunnel CPU per request",
            "CPU us per request",
            "throughput per tunnel core",
            "requests per second per core",
            "offered rate (requests per second)",
            "atunnel",
        ],
    );
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
    assert_written(
        &svg,
        &[
            "run 1",
            "run 3",
            "MB/s",
            "MB/s per tunnel core",
            "naive (copy-mode)",
            "950",
            "1000",
            "700",
        ],
    );
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
    assert_written(
        &svg,
        &[
            "kernel (socket buffers)",
            "heap",
            "total",
            "bound 64 KiB",
            "destination-stops-reading",
            "(gateway)",
            "KiB per stalled connection",
        ],
    );
}

#[test]
fn a_run_without_the_figures_draws_none_of_them() {
    assert!(of_results(&Results::default()).expect("drawn").is_empty());
    let bare = |s: Scenario| ScenarioResult::without_summary(s, Vec::new());
    let r = Results {
        scenarios: [
            Scenario::EgressIdle,
            Scenario::IngressIdle,
            Scenario::EgressTcp,
            Scenario::SocketMemory,
            Scenario::IngressHttps,
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
