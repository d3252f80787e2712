//! Rows, their medians over rounds, the tables, the JSON lines and the plot.

use std::{fmt::Write as _, time::Duration};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::workloads::Section;

/// One measured row. Times in milliseconds, CPU in microseconds per operation.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Row {
    pub(crate) engine: String,
    pub(crate) workload: String,
    pub(crate) variant: String,
    pub(crate) ops: usize,
    pub(crate) per_sec: f64,
    /// `per_sec` over the floor's in the same workload.
    pub(crate) ratio_to_floor: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) wait_max_ms: Option<f64>,
    pub(crate) handoff_p50_ms: Option<f64>,
    pub(crate) handoff_p99_ms: Option<f64>,
    /// The share of hand-offs that went to another client.
    pub(crate) other_share: Option<f64>,
    /// W3/W4: the counter counted every critical section.
    pub(crate) exact: Option<bool>,
    /// Requests the engine served per acquisition (commands, RPCs, statements).
    pub(crate) requests_per_acquire: Option<f64>,
    /// W4: requests the lock clients sent per acquisition (scripts, subscriptions).
    pub(crate) client_requests_per_acquire: Option<f64>,
    /// W1: heap allocations (and reallocations) of this program per cycle.
    pub(crate) allocations_per_op: Option<f64>,
    pub(crate) server_cpu_us: Option<f64>,
    pub(crate) client_cpu_us: Option<f64>,
    /// Each server's share of `server_cpu_us`, when there are several.
    pub(crate) server_cpu_per_server_us: Vec<f64>,
}

/// The median and 99th percentile of some durations (hdrhistogram, microsecond resolution).
pub(crate) struct Stat {
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
}

impl Stat {
    pub(crate) fn of(durations: &[Duration]) -> Self {
        // 1µs to an hour, three significant digits.
        let mut histogram =
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        for d in durations {
            histogram.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
        }
        #[allow(clippy::cast_precision_loss)]
        let ms = |us: u64| us as f64 / 1000.0;
        if histogram.is_empty() {
            return Self {
                p50_ms: None,
                p99_ms: None,
                max_ms: None,
            };
        }
        Self {
            p50_ms: Some(ms(histogram.value_at_quantile(0.5))),
            p99_ms: Some(ms(histogram.value_at_quantile(0.99))),
            max_ms: Some(ms(histogram.max())),
        }
    }
}

/// The row of a contended workload (W3, W4) from its critical sections: their rate over
/// `elapsed`, the waits, and the hand-offs from one client (or process) to another. Returns the
/// row and the sorted waits.
#[allow(clippy::cast_precision_loss)]
pub(crate) fn contended_row(
    workload: &str,
    variant: &str,
    mut sections: Vec<Section>,
    elapsed: Duration,
    exact: bool,
) -> (Row, Vec<Duration>) {
    sections.sort_by_key(|s| s.acquired);
    let mut waits: Vec<Duration> = sections.iter().map(|s| s.acquired - s.asked).collect();
    waits.sort();
    let handoffs: Vec<Duration> = sections
        .windows(2)
        .filter(|pair| pair[1].client != pair[0].client)
        .map(|pair| pair[1].acquired.saturating_duration_since(pair[0].released))
        .collect();
    let (wait, handoff) = (Stat::of(&waits), Stat::of(&handoffs));
    let n = sections.len();
    let row = Row {
        workload: workload.to_owned(),
        variant: variant.to_owned(),
        ops: n,
        per_sec: n as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: wait.p50_ms,
        p99_ms: wait.p99_ms,
        wait_max_ms: wait.max_ms,
        handoff_p50_ms: handoff.p50_ms,
        handoff_p99_ms: handoff.p99_ms,
        other_share: Some(handoffs.len() as f64 / (n.max(2) - 1) as f64),
        exact: Some(exact),
        ..Row::default()
    };
    (row, waits)
}

/// One variant's rounds: each round's row, and its waits (W3, for the plot).
pub(crate) type Rounds = Vec<(Row, Vec<Duration>)>;

/// The round with the median rate; "exact" only if every round was.
pub(crate) fn median(mut rounds: Rounds) -> (Row, Vec<Duration>) {
    let exact = rounds.iter().all(|(r, _)| r.exact != Some(false));
    rounds.sort_by(|a, b| a.0.per_sec.total_cmp(&b.0.per_sec));
    let (mut row, waits) = rounds.swap_remove(rounds.len() / 2);
    if row.exact.is_some() {
        row.exact = Some(exact);
    }
    (row, waits)
}

/// Sets every row's ratio to its workload's floor (the first row of the workload).
pub(crate) fn ratios(rows: &mut [Row]) {
    let mut floors: Vec<(String, f64)> = Vec::new();
    for row in rows.iter() {
        if !floors.iter().any(|(w, _)| *w == row.workload) {
            floors.push((row.workload.clone(), row.per_sec));
        }
    }
    for row in rows {
        let floor = floors
            .iter()
            .find(|(w, _)| *w == row.workload)
            .map_or(1.0, |(_, f)| *f);
        row.ratio_to_floor = Some(row.per_sec / floor);
    }
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The full table of one engine (Markdown).
pub(crate) fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| workload | variant | ops | per s | × floor | p50 ms | p99 ms | wait max ms | hand-off p50 ms | hand-off p99 ms | to another client | exact | requests/acq | client requests/acq | server CPU µs/op | client CPU µs/op | client allocs/op |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let mut server_cpu = cell(r.server_cpu_us, 1);
        if !r.server_cpu_per_server_us.is_empty() {
            let shares: Vec<String> = r
                .server_cpu_per_server_us
                .iter()
                .map(|us| format!("{us:.1}"))
                .collect();
            let _ = write!(server_cpu, " ({})", shares.join(" + "));
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.workload,
            r.variant,
            r.ops,
            r.per_sec,
            cell(r.ratio_to_floor, 2),
            cell(r.p50_ms, 2),
            cell(r.p99_ms, 2),
            cell(r.wait_max_ms, 2),
            cell(r.handoff_p50_ms, 2),
            cell(r.handoff_p99_ms, 2),
            r.other_share
                .map_or("–".to_owned(), |s| format!("{:.0}%", s * 100.0)),
            r.exact.map_or("–".to_owned(), |e| if e {
                "yes".to_owned()
            } else {
                "**NO**".to_owned()
            }),
            cell(r.requests_per_acquire, 2),
            cell(r.client_requests_per_acquire, 2),
            server_cpu,
            cell(r.client_cpu_us, 1),
            cell(r.allocations_per_op, 1),
        );
    }
    out
}

/// The summary of several engines (`--engine all`): per engine, dlock's ratio to the floor in
/// W1, W2 and W3, the W3 hand-off p99 beside the floor's, and the requests per acquisition.
pub(crate) fn summary(rows: &[Row]) -> String {
    let mut out = String::from(
        "| engine | W1 dlock ÷ floor | W2 dlock ÷ floor | W3 dlock ÷ floor | W3 hand-off p99 ms (floor) | requests/acq W1 / W3 (floor) | others ÷ floor (W1, W2, W3) |\n|---|---:|---:|---:|---|---|---|\n",
    );
    let mut engines: Vec<&str> = Vec::new();
    for r in rows {
        if !engines.contains(&r.engine.as_str()) {
            engines.push(&r.engine);
        }
    }
    for engine in engines {
        let of = |workload: &str, variant: &str| {
            rows.iter().find(|r| {
                r.engine == engine
                    && r.workload.starts_with(workload)
                    && r.variant.starts_with(variant)
            })
        };
        let ratio = |w: &str, v: &str| cell(of(w, v).and_then(|r| r.ratio_to_floor), 2);
        let floor_name = |w: &str| {
            rows.iter()
                .find(|r| r.engine == engine && r.workload.starts_with(w))
                .map(|r| r.variant.clone())
                .unwrap_or_default()
        };
        let floor3 = floor_name("W3");
        let handoff = format!(
            "{} ({})",
            cell(of("W3", "dlock default").and_then(|r| r.handoff_p99_ms), 2),
            cell(of("W3", &floor3).and_then(|r| r.handoff_p99_ms), 2)
        );
        let requests = format!(
            "{} / {} ({} / {})",
            cell(
                of("W1", "dlock API").and_then(|r| r.requests_per_acquire),
                2
            ),
            cell(
                of("W3", "dlock default").and_then(|r| r.requests_per_acquire),
                2
            ),
            cell(
                of("W1", &floor_name("W1")).and_then(|r| r.requests_per_acquire),
                2
            ),
            cell(of("W3", &floor3).and_then(|r| r.requests_per_acquire), 2),
        );
        let others: Vec<String> = rows
            .iter()
            .filter(|r| {
                r.engine == engine
                    && r.workload.starts_with("W1")
                    && !r.variant.starts_with("dlock")
                    && r.variant != floor_name("W1")
            })
            .map(|r| {
                format!(
                    "{}: {}, {}, {}",
                    r.variant,
                    cell(r.ratio_to_floor, 2),
                    ratio("W2", &r.variant),
                    ratio("W3", &r.variant)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {engine} | {} | {} | {} | {handoff} | {requests} | {} |",
            ratio("W1", "dlock API"),
            ratio("W2", "dlock API"),
            ratio("W3", "dlock default"),
            if others.is_empty() {
                "–".to_owned()
            } else {
                others.join("; ")
            }
        );
    }
    out
}

/// An SVG of the distribution (CDF) of W3 wait times per variant, on a log time axis.
pub(crate) fn plot(path: &str, series: &[(String, Vec<Duration>)]) -> Result<(), String> {
    use plotters::prelude::*;
    let max_ms = series
        .iter()
        .filter_map(|(_, w)| w.last())
        .map(|d| d.as_secs_f64() * 1000.0)
        .fold(1.0_f64, f64::max);
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("plot {path}: {e}");
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "W3: share of acquisitions that waited at most t",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d((0.01_f64..max_ms).log_scale(), 0.0_f64..1.0)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("wait (ms)")
        .y_desc("share")
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, waits)) in series.iter().enumerate() {
        if waits.is_empty() {
            continue;
        }
        let color = Palette99::pick(i).to_rgba();
        #[allow(clippy::cast_precision_loss)]
        let points = waits.iter().enumerate().map(|(k, d)| {
            (
                (d.as_secs_f64() * 1000.0).max(0.01),
                (k + 1) as f64 / waits.len() as f64,
            )
        });
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
