//! The scenarios: each takes a [`Bench`] and its config and returns a [`Report`].

use std::sync::Arc;
use std::time::Duration;

use crate::procs::{self, ProcessCost, Sampler};
use crate::{Bench, Load, LoadConfig, Measure, Phase, Report};

/// Runs a scenario body, then deletes the bench's webhooks whatever happened.
async fn with_cleanup<F>(bench: &Arc<Bench>, body: F) -> anyhow::Result<Report>
where
    F: std::future::Future<Output = anyhow::Result<Report>>,
{
    let result = body.await;
    let cleaned = bench.cleanup().await;
    let report = result?;
    cleaned?;
    Ok(report)
}

fn delivered(report: &Report) -> usize {
    report.phases.iter().map(|p| p.received).sum()
}

/// `ingest`: alerts to ingest with no webhook of the bench subscribed; accepted/s and
/// response times.
pub async fn ingest(bench: &Arc<Bench>, config: LoadConfig) -> anyhow::Result<Report> {
    let mut report = Report::new("ingest");
    let sampler = Sampler::start();
    let phase = bench.phase("ingest", config, None).await;
    let accepted = phase.alerts_accepted;
    report.phases.push(phase);
    report.finish_processes(sampler.finish(accepted).await);
    report
        .notes
        .push("CPU per unit is per alert accepted".into());
    Ok(report)
}

/// `e2e`: alerts to one webhook; deliveries/s end to end, latency, lost and duplicates.
pub async fn e2e(bench: &Arc<Bench>, config: LoadConfig) -> anyhow::Result<Report> {
    with_cleanup(bench, async {
        let mut report = Report::new("e2e");
        bench.create_webhook("/ok/0", 5, 10_000).await?;
        let sampler = Sampler::start();
        let phase = bench
            .phase("e2e", config, Some(Measure::new("ok", 1)))
            .await;
        report.phases.push(phase);
        report.finish_processes(sampler.finish(delivered(&report)).await);
        Ok(report)
    })
    .await
}

/// Settings of `latency`.
#[derive(Debug, Clone)]
pub struct LatencyConfig {
    /// Alerts per second of each step.
    pub rates: Vec<f64>,
    /// How long each step sends.
    pub duration: Duration,
}

/// `latency`: open loop at fixed rates, one webhook; latency per rate.
pub async fn latency(bench: &Arc<Bench>, config: LatencyConfig) -> anyhow::Result<Report> {
    with_cleanup(bench, async {
        let mut report = Report::new("latency");
        bench.create_webhook("/ok/0", 5, 10_000).await?;
        let sampler = Sampler::start();
        for rate in &config.rates {
            let alerts = (rate * config.duration.as_secs_f64()).round().max(1.0) as usize;
            let phase = bench
                .phase(
                    &format!("{rate}/s"),
                    LoadConfig {
                        alerts,
                        load: Load::Open { rate: *rate },
                    },
                    Some(Measure::new("ok", 1)),
                )
                .await;
            report.phases.push(phase);
        }
        report.finish_processes(sampler.finish(delivered(&report)).await);
        Ok(report)
    })
    .await
}

/// Settings of `fanout`.
#[derive(Debug, Clone, Copy)]
pub struct FanoutConfig {
    pub webhooks: usize,
    /// Alerts sent one after the other (each to every webhook).
    pub alerts: usize,
}

/// `fanout`: one event to many webhooks; time from the send to the last receipt.
pub async fn fanout(bench: &Arc<Bench>, config: FanoutConfig) -> anyhow::Result<Report> {
    with_cleanup(bench, async {
        let mut report = Report::new("fanout");
        bench
            .create_webhooks("/ok", config.webhooks, 5, 10_000)
            .await?;
        let sampler = Sampler::start();
        let phase = bench
            .phase(
                &format!("1 event to {} webhooks", config.webhooks),
                LoadConfig {
                    alerts: config.alerts.max(1),
                    load: Load::Closed { concurrency: 1 },
                },
                Some(Measure::new("ok", config.webhooks)),
            )
            .await;
        if let Some(latency) = &phase.latency_ms {
            report
                .figures
                .insert("time_to_last_receipt_ms".into(), latency.max);
            report
                .figures
                .insert("time_to_first_receipt_ms".into(), first_latency(&phase));
        }
        report.phases.push(phase);
        report.finish_processes(sampler.finish(delivered(&report)).await);
        Ok(report)
    })
    .await
}

fn first_latency(phase: &Phase) -> f64 {
    phase
        .series
        .iter()
        .map(|(_, l)| *l)
        .fold(f64::INFINITY, f64::min)
}

/// Settings of `slow-target`.
#[derive(Debug, Clone, Copy)]
pub struct SlowTargetConfig {
    pub load: LoadConfig,
    /// The slow webhook's `timeout_ms` (1000 to 30000): how long each of its attempts holds a
    /// dispatcher slot.
    pub slow_timeout_ms: u32,
}

/// `slow-target`: the healthy webhook alone, then beside one whose receiver hangs until the
/// timeout; the healthy webhook's throughput and latency in both.
pub async fn slow_target(bench: &Arc<Bench>, config: SlowTargetConfig) -> anyhow::Result<Report> {
    with_cleanup(bench, async {
        let mut report = Report::new("slow-target");
        bench.create_webhook("/ok/0", 5, 10_000).await?;
        // Unmeasured: the first alerts after a start pay for cold caches and connections, which
        // would flatter the second phase against the first.
        let warm_up = LoadConfig {
            alerts: (config.load.alerts / 4).min(1_000),
            ..config.load
        };
        let healthy = Measure::new("ok", 1);
        bench.phase("warm-up", warm_up, Some(healthy)).await;
        let sampler = Sampler::start();
        let alone = bench
            .phase("healthy alone", config.load, Some(healthy))
            .await;
        bench
            .create_webhook("/hang/0", 1, config.slow_timeout_ms)
            .await?;
        let beside = bench
            .phase("healthy beside a hanging one", config.load, Some(healthy))
            .await;
        if alone.deliveries_per_sec > 0.0 {
            report.figures.insert(
                "healthy_throughput_kept_pct".into(),
                100.0 * beside.deliveries_per_sec / alone.deliveries_per_sec,
            );
        }
        report.figures.insert(
            "hanging_attempts_seen".into(),
            bench.receiver.unique("hang") as f64,
        );
        report.phases.push(alone);
        report.phases.push(beside);
        report.finish_processes(sampler.finish(delivered(&report)).await);
        Ok(report)
    })
    .await
}

/// `scale`: `e2e` labelled with the number of dispatchers the operator started; it measures
/// whatever dispatchers run.
pub async fn scale(
    bench: &Arc<Bench>,
    config: LoadConfig,
    dispatcher_count: Option<usize>,
) -> anyhow::Result<Report> {
    let mut report = e2e(bench, config).await?;
    report.scenario = "scale".into();
    let found = procs::count("tocsin-dispatcher");
    report.label = Some(match dispatcher_count {
        Some(n) => format!("{n} dispatcher(s)"),
        None => format!("{found} dispatcher(s) found"),
    });
    report
        .figures
        .insert("dispatchers_found".into(), found as f64);
    Ok(report)
}

/// Settings of `backlog`.
#[derive(Debug, Clone, Copy)]
pub struct BacklogConfig {
    pub load: LoadConfig,
    /// How long to keep sampling after every first attempt arrived.
    pub hold: Duration,
}

/// `backlog`: deliveries to a failing receiver path, so that they sit in the retry queue;
/// dispatcher RSS sampled every second.
pub async fn backlog(bench: &Arc<Bench>, config: BacklogConfig) -> anyhow::Result<Report> {
    with_cleanup(bench, async {
        let mut report = Report::new("backlog");
        bench.create_webhook("/fail/0", 5, 10_000).await?;
        let sampler = Sampler::start();
        let phase = bench
            .phase(
                "first attempts to a failing target",
                config.load,
                Some(Measure::new("fail", 1)),
            )
            .await;
        // Hold the backlog while the sampler keeps reading RSS.
        let _ = tokio::time::timeout(config.hold, std::future::pending::<()>()).await;
        report.figures.insert(
            "retry_attempts_seen".into(),
            bench.receiver.seen().retries as f64,
        );
        report.phases.push(phase);
        let processes = sampler.finish(delivered(&report)).await;
        let dispatchers: Vec<&ProcessCost> = processes
            .iter()
            .filter(|p| p.name == "tocsin-dispatcher")
            .collect();
        if let Some(min) = dispatchers
            .iter()
            .map(|p| p.rss_min_mib)
            .min_by(f64::total_cmp)
        {
            report.figures.insert("dispatcher_rss_min_mib".into(), min);
        }
        if let Some(max) = dispatchers
            .iter()
            .map(|p| p.rss_max_mib)
            .max_by(f64::total_cmp)
        {
            report.figures.insert("dispatcher_rss_max_mib".into(), max);
        }
        report.finish_processes(processes);
        Ok(report)
    })
    .await
}
