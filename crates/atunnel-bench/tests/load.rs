//! The load generator on the real clock, end to end: a short rung, its
//! verdict, and the report files made from it.

use std::time::Duration;

use atunnel_bench::load::{
    Results, Rung, RungEvidence, RungResult, ScenarioResult, Verdict, run_rung, sustainable_rate,
    verdict, write_plots, write_results_json, write_results_txt,
};
use atunnel_bench::scenario::ingress_connect;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_rung_on_the_real_clock_keeps_its_rate_and_reports() {
    let rung = Rung {
        rate: 500.0,
        duration: Duration::from_millis(400),
        max_in_flight: 1000,
    };
    let out = run_rung(&rung, |_| async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    })
    .await;
    assert_eq!(out.started, 200);
    assert_eq!(out.completed, 200);
    assert_eq!((out.errors, out.shed), (0, 0));
    // Lax bounds: this machine may be busy with other builds.
    assert!(
        (out.achieved - 500.0).abs() < 100.0,
        "achieved {}",
        out.achieved
    );
    assert!(out.latency.min() >= 2_000, "latency counts the work's 2 ms");
    assert!(out.elapsed < Duration::from_secs(3), "{:?}", out.elapsed);

    let evidence = RungEvidence {
        dispatch_lag_p99_us: 0, // the real lag depends on the machine's load
        ..RungEvidence::of(&out)
    };
    let v = verdict(&evidence);
    assert_eq!(v, Verdict::Ok);

    let results = Results {
        comparisons: Vec::new(),
        scenarios: vec![ScenarioResult::new(
            &ingress_connect::Summary {
                sustainable_rps: sustainable_rate(&[(out.offered, out.offered, v)]),
            },
            vec![RungResult::of(&out, v)],
            vec![],
        )],
        cost: None,
    };
    let dir = tempfile::tempdir().unwrap();
    write_results_json(dir.path(), &results).unwrap();
    write_results_txt(dir.path(), &results).unwrap();
    let plots = write_plots(dir.path(), &results).unwrap();
    assert_eq!(plots.len(), 1);
    let txt = std::fs::read_to_string(dir.path().join("results.txt")).unwrap();
    assert!(txt.contains("== ingress-connect ==") && txt.contains("sustainable_rps: 500"));
    let back: Results =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    assert_eq!(back, results);
}
