//! Ingest metrics: alerts received by format and outcome, and the time of ingest's stages of
//! an alert's way.

use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct IngestMetrics {
    alerts: IntCounterVec,
    stages: HistogramVec,
}

/// Ingest's stages of an alert's way (`tocsin_ingest_stage_seconds{stage}`).
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// Looking up the token presented.
    Authenticate,
    /// Applying the alert's signals and committing its events to the outbox.
    Transaction,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Authenticate => "authenticate",
            Stage::Transaction => "transaction",
        }
    }
}

impl IngestMetrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let alerts = IntCounterVec::new(
            Opts::new(
                "tocsin_ingest_alerts_total",
                "Alert requests received, by format (unknown before parsing) and outcome.",
            ),
            &["format", "outcome"],
        )?;
        registry.register(Box::new(alerts.clone()))?;
        let stages = tocsin_storage::stages::histogram(
            registry,
            prometheus::HistogramOpts::new(
                "tocsin_ingest_stage_seconds",
                "Time of ingest's stages of an alert's way, by stage: authenticate (the token lookup), transaction (applying the alert and committing its events, waits for a batch included).",
            ),
        )?;
        Ok(IngestMetrics { alerts, stages })
    }

    pub fn record(&self, format: &str, outcome: &str) {
        self.alerts.with_label_values(&[format, outcome]).inc();
    }

    /// Counts `stage` as taking from `since` until now.
    pub fn stage(&self, stage: Stage, since: Instant) {
        self.stages
            .with_label_values(&[stage.as_str()])
            .observe(since.elapsed().as_secs_f64());
    }
}
