//! The shapes: what each draws, from plain series.

use super::*;

#[test]
fn category_labels_wrap_to_their_group() {
    assert_eq!(wrap("a\n(atunnel)", 2), ["a", "(atunnel)"]);
    // Six groups leave about 15 characters each.
    assert_eq!(
        wrap("destination-stops-reading\n(gateway)", 6),
        ["destination-", "stops-reading", "(gateway)"]
    );
    assert_eq!(wrap("run 1", 3), ["run 1"]);
    assert_eq!(wrap("x-", 9), ["x-"]);
}

#[test]
fn a_series_with_one_x_value_is_drawn_as_bars_and_with_two_as_a_line() {
    let axes = Axes::new("one point", "connections", "bytes");
    let one = xy(
        axes.clone(),
        vec![Series::new("atunnel", vec![(1000.0, 1500.0)])],
        "conns",
    );
    let Shape::Bars(bars) = &one.shape else {
        panic!("one x value drawn as {:?}", one.shape)
    };
    assert_eq!(bars.categories, ["1000 conns"]);
    let svg = render("one point", &[one]).expect("drawn");
    check(&svg);
    // The bar and the legend's swatch; no line, no marker.
    assert_eq!(
        (rects(&svg, 0), lines(&svg, 0), markers(&svg, 0)),
        (2, 0, 0)
    );
    assert_eq!(text(&svg, "1500"), 1, "the bar's value: {svg}");
    assert_eq!(text(&svg, "1000 conns"), 1, "its category: {svg}");

    let two = xy(
        axes,
        vec![Series::new(
            "atunnel",
            vec![(1000.0, 1500.0), (2000.0, 1400.0)],
        )],
        "conns",
    );
    assert!(matches!(two.shape, Shape::Lines(_)), "{:?}", two.shape);
    let svg = render("two points", &[two]).expect("drawn");
    check(&svg);
    assert_eq!(
        (rects(&svg, 0), lines(&svg, 0), markers(&svg, 0)),
        (1, 1, 2)
    );
}

#[test]
fn a_line_chart_has_a_line_and_a_marker_per_point_for_each_series() {
    let axes = Axes::new("CPU per request", "offered rate (per second)", "CPU us");
    let series = [
        Series::new(
            "atunnel",
            vec![(1000.0, 90.0), (2000.0, 80.0), (4000.0, 85.0)],
        ),
        Series {
            marked: vec![false, true],
            ..Series::new("nginx", vec![(1000.0, 120.0), (2000.0, 110.0)])
        },
    ];
    let svg = line_chart(&axes, &series).expect("drawn");
    check(&svg);
    assert_eq!((lines(&svg, 0), markers(&svg, 0)), (1, 3));
    assert_eq!((lines(&svg, 1), markers(&svg, 1)), (1, 2));
    // The marked point's red ring.
    assert_eq!(
        svg.matches(r##"stroke="#D62728" stroke-width="2""##)
            .count(),
        1
    );
    assert_written_times(
        &svg,
        &[
            "CPU per request",
            "offered rate (per second)",
            "CPU us",
            "atunnel",
            "nginx",
        ],
        1,
    );
}

#[test]
fn a_bar_chart_has_a_bar_per_value_and_marks_what_was_not_measured() {
    let axes = Axes::new("stall", "case", "KiB");
    let bars = Bars {
        categories: vec!["a\n(atunnel)".into(), "b".into()],
        series: vec![
            BarSeries::new("kernel", vec![Some(20.0), Some(300.0)]),
            BarSeries::new("heap", vec![Some(1.5), None]),
            BarSeries::new("total", vec![Some(f64::INFINITY), Some(f64::NAN)]),
        ],
    };
    let svg = bar_chart(&axes, &bars).expect("drawn");
    check(&svg);
    // Bars plus one swatch each.
    assert_eq!((rects(&svg, 0), rects(&svg, 1), rects(&svg, 2)), (3, 2, 1));
    assert!(text(&svg, "300") >= 1, "the bar's value: {svg}");
    assert_eq!(text(&svg, "n/a"), 3, "{svg}");
    assert_written_times(
        &svg,
        &[
            "stall",
            "case",
            "KiB",
            "kernel",
            "heap",
            "total",
            "a",
            "(atunnel)",
            "b",
            "1.5",
        ],
        1,
    );
}

#[test]
fn values_that_are_not_finite_never_reach_the_svg() {
    let axes = Axes::new("odd", "x", "y");
    let series = [Series::new(
        "s",
        vec![
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
            (2.0, 3.0),
            (3.0, f64::NEG_INFINITY),
        ],
    )];
    let svg = render("odd", &[xy(axes.clone(), series.to_vec(), "")]).expect("drawn");
    check(&svg);
    // Only (2, 3) is a point: no marker at a coordinate plotters would
    // make of NaN or infinity (0 or i32::MAX).
    assert_eq!((lines(&svg, 0), markers(&svg, 0)), (1, 1), "{svg}");
    assert!(
        !svg.contains("2147483647") && !svg.contains("-2147483648"),
        "{svg}"
    );
    let empty = line_chart(&axes, &[Series::new("none", vec![(f64::NAN, f64::NAN)])]);
    check(&empty.expect("drawn"));
    let none = bar_chart(&axes, &Bars::default()).expect("drawn");
    check(&none);
}
