//! The readable table and the SVG chart of a [`Report`].

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::{Percentiles, Phase, Report};

fn pct(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!(
            "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
            p.p50, p.p90, p.p99, p.max
        ),
        None => "-".into(),
    }
}

fn phase_table(out: &mut String, phase: &Phase) {
    let row = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "  {k:<26} {v}");
    };
    let _ = writeln!(out, "\n[{}]  load {:?}", phase.name, phase.load);
    row(
        out,
        "alerts sent / accepted",
        format!("{} / {}", phase.alerts_sent, phase.alerts_accepted),
    );
    row(out, "errors", phase.errors.to_string());
    for sample in &phase.error_samples {
        row(out, "  e.g.", sample.chars().take(160).collect());
    }
    row(
        out,
        "alerts accepted/s",
        format!(
            "{:.0}  (sent in {:.2} s)",
            phase.accepted_per_sec, phase.send_seconds
        ),
    );
    row(out, "ingest response ms", pct(&phase.ingest_ms));
    if phase.webhooks > 0 {
        row(
            out,
            "deliveries expected / got",
            format!(
                "{} / {}  ({} webhook(s) per alert)",
                phase.expected_deliveries, phase.received, phase.webhooks
            ),
        );
        row(
            out,
            "deliveries/s end to end",
            format!(
                "{:.0}  (first send to last receipt {:.2} s)",
                phase.deliveries_per_sec, phase.end_to_end_seconds
            ),
        );
        row(out, "latency send→receipt ms", pct(&phase.latency_ms));
        row(out, "duplicates", phase.duplicates.to_string());
        row(out, "lost", phase.lost.to_string());
    }
    if !phase.stages.is_empty() {
        let _ = writeln!(
            out,
            "  {:<28} {:>8} {:>9} {:>9} {:>9}",
            "stage (latency budget)", "count", "mean ms", "p50 ms", "p99 ms"
        );
        for stage in &phase.stages {
            let _ = writeln!(
                out,
                "  {:<28} {:>8} {:>9.3} {:>9.3} {:>9.3}",
                stage.stage, stage.count, stage.mean, stage.p50, stage.p99
            );
        }
    }
}

/// The report as a table for people.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(out, "== tocsin-bench {}", report.scenario);
    if let Some(label) = &report.label {
        let _ = write!(out, " ({label})");
    }
    out.push('\n');
    for phase in &report.phases {
        phase_table(&mut out, phase);
    }
    if !report.figures.is_empty() {
        out.push('\n');
        for (k, v) in &report.figures {
            let _ = writeln!(out, "  {k:<32} {v:.1}");
        }
    }
    if !report.processes.is_empty() {
        let _ = writeln!(
            out,
            "\n  {:<18} {:>7} {:>8} {:>10} {:>9} {:>15}",
            "process", "pid", "cpu s", "cpu ms/u", "VmHWM MB", "RSS MB min-max"
        );
        for p in &report.processes {
            let _ = writeln!(
                out,
                "  {:<18} {:>7} {:>8.2} {:>10} {:>9.1} {:>7.1}-{:<7.1}",
                p.name,
                p.pid,
                p.cpu_seconds,
                p.cpu_ms_per_unit
                    .map(|v| format!("{v:.3}"))
                    .unwrap_or_else(|| "-".into()),
                p.peak_rss_mib,
                p.rss_min_mib,
                p.rss_max_mib,
            );
        }
        let _ = writeln!(
            out,
            "  (u = delivery received; per alert accepted when nothing is delivered)"
        );
    }
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

/// Latency over time: per time bucket of the send, the median and the maximum of each phase.
pub fn svg(report: &Report, path: &Path) -> anyhow::Result<()> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut offset = 0.0;
    for phase in report.phases.iter().filter(|p| !p.series.is_empty()) {
        let span = phase.series.last().map(|s| s.0).unwrap_or(0.0);
        let bucket = (span / 100.0).max(0.01);
        let mut p50 = Vec::new();
        let mut max = Vec::new();
        let mut i = 0;
        while i < phase.series.len() {
            let b = (phase.series[i].0 / bucket).floor();
            let mut values = Vec::new();
            while i < phase.series.len() && (phase.series[i].0 / bucket).floor() == b {
                values.push(phase.series[i].1);
                i += 1;
            }
            if let Some(p) = Percentiles::of(values) {
                let x = offset + b * bucket;
                p50.push((x, p.p50));
                max.push((x, p.max));
            }
        }
        lines.push((format!("{} p50", phase.name), p50));
        lines.push((format!("{} max", phase.name), max));
        offset += span + bucket;
    }
    let x_max = lines
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(0.01);
    let y_max = lines
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "tocsin-bench {}{}: latency send→receipt",
        report.scenario,
        report
            .label
            .as_ref()
            .map(|l| format!(" ({l})"))
            .unwrap_or_default()
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("time of send (s from start; phases one after the other)")
        .y_desc("latency (ms)")
        .draw()?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i);
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 20, y)],
                    Palette99::pick(i).stroke_width(2),
                )
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
