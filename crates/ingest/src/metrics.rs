//! Ingest metrics: alerts received by format and outcome.

use prometheus::{IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct IngestMetrics {
    alerts: IntCounterVec,
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
        Ok(IngestMetrics { alerts })
    }

    pub fn record(&self, format: &str, outcome: &str) {
        self.alerts.with_label_values(&[format, outcome]).inc();
    }
}
