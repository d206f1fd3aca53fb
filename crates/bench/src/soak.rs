//! `soak`: a steady open-loop stream to one webhook for a long time, with whatever retention
//! the dispatcher runs. Each window (a minute by default) is a phase of its own: its
//! deliveries/s and latency, then the dispatcher's RSS and the size of every table that grows
//! with traffic, read when the window's deliveries have all arrived. The report compares the
//! first ten windows with the last ten.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::procs;
use crate::{Bench, Load, LoadConfig, Measure, Report};

/// Settings of `soak`.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The database the system under test uses (for the tables' sizes).
    pub database_url: String,
    /// Alerts per second.
    pub rate: f64,
    /// How long the stream runs.
    pub duration: Duration,
    /// The length of each window the figures are taken over.
    pub window: Duration,
}

/// The tables that grow with traffic.
const TABLES: [&str; 5] = ["events", "deliveries", "attempts", "incidents", "outbox"];

/// Windows compared at each end of the run.
const ENDS: usize = 10;

/// What one window showed.
struct Window {
    deliveries_per_sec: f64,
    p50: f64,
    p99: f64,
    dispatcher_rss_mib: f64,
    /// Table and index bytes of each of [`TABLES`], in MiB.
    sizes: Vec<f64>,
}

/// Runs `soak`.
pub async fn soak(bench: &Arc<Bench>, config: SoakConfig) -> anyhow::Result<Report> {
    let mut report = Report::new("soak");
    let mut conn = AsyncPgConnection::establish(&config.database_url)
        .await
        .context("connecting to the database to read the tables' sizes")?;
    bench.create_webhook("/ok/soak", 5, 10_000).await?;
    let windows = (config.duration.as_secs_f64() / config.window.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let alerts = (config.rate * config.window.as_secs_f64()).round().max(1.0) as usize;
    let mut seen = Vec::with_capacity(windows);
    report.notes.push(format!(
        "{:>6} {:>12} {:>8} {:>8} {:>10} {}",
        "window",
        "deliveries/s",
        "p50 ms",
        "p99 ms",
        "disp. RSS",
        TABLES.map(|t| format!("{t:>10}")).join(" ")
    ));
    for i in 1..=windows {
        let mut phase = bench
            .phase(
                &format!("window {i}"),
                LoadConfig {
                    alerts,
                    load: Load::Open { rate: config.rate },
                },
                Some(Measure::new("ok", 1)),
            )
            .await;
        // Every latency is in the window's percentiles; the points themselves would make the
        // JSON report hundreds of megabytes.
        phase.series = Vec::new();
        let window = Window {
            deliveries_per_sec: phase.deliveries_per_sec,
            p50: phase.latency_ms.as_ref().map_or(f64::NAN, |p| p.p50),
            p99: phase.latency_ms.as_ref().map_or(f64::NAN, |p| p.p99),
            dispatcher_rss_mib: dispatcher_rss_mib(),
            sizes: sizes(&mut conn).await?,
        };
        let line = format!(
            "{i:>6} {:>12.1} {:>8.1} {:>8.1} {:>10.1} {}",
            window.deliveries_per_sec,
            window.p50,
            window.p99,
            window.dispatcher_rss_mib,
            window
                .sizes
                .iter()
                .map(|s| format!("{s:>10.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        eprintln!("{line}");
        report.notes.push(line);
        let lost = phase.lost;
        report.phases.push(phase);
        seen.push(window);
        if lost > 0 {
            // Deliveries still missing would be counted against the next windows' latency.
            report
                .notes
                .push(format!("stopped after window {i}: {lost} lost"));
            break;
        }
    }
    report.notes.push(
        "sizes: table and index MiB of every partition; disp. RSS: the dispatcher's, MiB".into(),
    );
    compare_ends(&mut report, &seen);
    bench.cleanup().await?;
    Ok(report)
}

/// One figure of a window.
type Figure = fn(&Window) -> f64;

/// The first and the last [`ENDS`] windows' medians, and their ratio.
fn compare_ends(report: &mut Report, seen: &[Window]) {
    let n = ENDS.min(seen.len());
    let (first, last) = (&seen[..n], &seen[seen.len() - n..]);
    let figures: [(&str, Figure); 3] = [
        ("deliveries/s", |w| w.deliveries_per_sec),
        ("p99 ms", |w| w.p99),
        ("dispatcher RSS MiB", |w| w.dispatcher_rss_mib),
    ];
    for (name, of) in figures {
        let a = median(first.iter().map(of).collect());
        let b = median(last.iter().map(of).collect());
        report
            .figures
            .insert(format!("first {n} windows {name}"), a);
        report.figures.insert(format!("last {n} windows {name}"), b);
        report
            .figures
            .insert(format!("last/first {name} %"), b / a * 100.0);
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The RSS of the dispatchers running, summed, in MiB.
fn dispatcher_rss_mib() -> f64 {
    let kb: u64 = procs::snapshot()
        .values()
        .filter(|s| s.name == "tocsin-dispatcher")
        .map(|s| s.rss_kb)
        .sum();
    kb as f64 / 1024.0
}

#[derive(diesel::QueryableByName)]
struct Size {
    #[diesel(sql_type = BigInt)]
    bytes: i64,
}

/// Table and index MiB of each of [`TABLES`], over all its partitions.
async fn sizes(conn: &mut AsyncPgConnection) -> anyhow::Result<Vec<f64>> {
    let mut sizes = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let size: Size = diesel::sql_query(
            // A partitioned table's own size is 0, and a table that is not one has no tree.
            "SELECT (pg_total_relation_size($1::regclass) + coalesce((
                 SELECT sum(pg_total_relation_size(relid))
                 FROM pg_partition_tree($1::regclass) WHERE isleaf), 0))::int8 AS bytes",
        )
        .bind::<Text, _>(table)
        .get_result(conn)
        .await
        .with_context(|| format!("reading the size of {table}"))?;
        sizes.push(size.bytes as f64 / (1024.0 * 1024.0));
    }
    Ok(sizes)
}
