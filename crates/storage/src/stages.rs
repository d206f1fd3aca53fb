//! The stage histograms: how long each stage of an alert's way from its sender to a receiver
//! takes, one histogram per part of Tocsin (`tocsin_ingest_stage_seconds`,
//! `tocsin_outbox_stage_seconds`, `tocsin_dispatcher_stage_seconds`), by `stage`. Together
//! they explain the time from send to receipt (docs/performance.md, "Latency budget").

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// Buckets in seconds: fine below 10 ms, where a commit, a publish confirm or a request on a
/// local network lies, up to 30 s (the longest webhook timeout).
pub const STAGE_BUCKETS: &[f64] = &[
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Registers a stage histogram (`opts` names it) in `registry`, with the stage buckets and
/// the `stage` label.
pub fn histogram(registry: &Registry, opts: HistogramOpts) -> anyhow::Result<HistogramVec> {
    let stages = HistogramVec::new(opts.buckets(STAGE_BUCKETS.to_vec()), &["stage"])?;
    registry.register(Box::new(stages.clone()))?;
    Ok(stages)
}
