//! results.txt: each scenario's rungs and summary as text.

use super::*;

/// results.txt: one aligned table per scenario (rate, achieved, errors, verdict, tunnel cores, heap MiB, cgroup MiB, p50/p99/max ms) plus its summary lines — what a person reads first.
pub fn write_results_txt(dir: &Path, r: &Results) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_whole(&dir.join("results.txt"), render_txt(r))
}

/// The text of `results.txt`.
pub fn render_txt(r: &Results) -> String {
    let mut out = String::new();
    for (n, s) in r.scenarios.iter().enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "== {} ==", s.name);
        if !s.rungs.is_empty() {
            out.push_str(&rung_table(&s.rungs));
            for rung in s.rungs.iter().filter(|r| !r.notes.is_empty()) {
                let _ = writeln!(out, "  at {}/s: {}", fmt_rate(rung.offered), rung.notes);
            }
            let ladder: Vec<_> = s
                .rungs
                .iter()
                .map(|r| (r.offered, r.achieved, r.verdict))
                .collect();
            match sustainable_rate(&ladder) {
                Some(rate) => {
                    let _ = writeln!(out, "sustainable: {}/s", fmt_rate(rate));
                }
                None => out.push_str("sustainable: none of the rungs\n"),
            }
        }
        summary_lines(&mut out, &s.summary);
        for note in &s.notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
    for c in &r.comparisons {
        if !out.is_empty() {
            out.push('\n');
        }
        let what = if compares_ingress(c) {
            "ingress, side by side"
        } else {
            "egress, per idle connection"
        };
        let _ = writeln!(out, "== compare {} ({what}) ==", c.name);
        out.push_str(&comparison_table(c));
    }
    out
}

pub(super) fn rung_table(rungs: &[RungResult]) -> String {
    pub(super) const HEAD: [&str; 10] = [
        "rate/s",
        "achieved/s",
        "errors",
        "verdict",
        "tunnel cores",
        "heap MiB",
        "cgroup MiB",
        "p50 ms",
        "p99 ms",
        "max ms",
    ];
    pub(super) const VERDICT_COL: usize = 3;
    let rows: Vec<[String; 10]> = rungs
        .iter()
        .map(|r| {
            [
                fmt_rate(r.offered),
                fmt_rate(r.achieved),
                r.errors.to_string(),
                r.verdict.to_string(),
                format!("{:.2}", r.tunnel_cpu_cores),
                format!("{:.1}", r.tunnel_heap_bytes as f64 / MIB),
                format!("{:.1}", r.tunnel_cgroup_bytes as f64 / MIB),
                fmt_ms(r.latency_us.p50),
                fmt_ms(r.latency_us.p99),
                fmt_ms(r.latency_us.max),
            ]
        })
        .collect();
    let mut width = HEAD.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (c, (cell, w)) in cells.iter().zip(width).enumerate() {
            if c > 0 {
                l.push_str("  ");
            }
            if c == VERDICT_COL {
                let _ = write!(l, "{cell:<w$}");
            } else {
                let _ = write!(l, "{cell:>w$}");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&HEAD);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// The summary object as `key: value` lines (arrays of objects one element
/// a line, as `k=v` pairs).
pub(super) fn summary_lines(out: &mut String, summary: &Value) {
    match summary {
        Value::Null => {}
        Value::Object(m) if m.is_empty() => {}
        Value::Object(m) => {
            out.push_str("summary:\n");
            for (k, v) in m {
                match v {
                    Value::Array(items) if items.iter().any(Value::is_object) => {
                        let _ = writeln!(out, "  {k}:");
                        for item in items {
                            let _ = writeln!(out, "    - {}", fmt_value(item));
                        }
                    }
                    _ => {
                        let _ = writeln!(out, "  {k}: {}", fmt_value(v));
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "summary: {}", fmt_value(other));
        }
    }
}

pub(super) fn fmt_value(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (None, Some(i), _) => i.to_string(),
            (None, None, Some(f)) => trim_float(f, 3),
            _ => n.to_string(),
        },
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(fmt_value).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}={}", fmt_value(v)))
                .collect();
            parts.join(" ")
        }
    }
}

pub(super) fn trim_float(f: f64, decimals: usize) -> String {
    if !f.is_finite() {
        return f.to_string();
    }
    let s = format!("{f:.decimals$}");
    if s.contains('.') {
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".to_string()
        } else {
            s.to_string()
        }
    } else {
        s
    }
}

pub(super) fn fmt_rate(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub(super) fn fmt_ms(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}
