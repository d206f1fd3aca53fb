//! Dispatcher metrics (docs/operations/observe.md lists them all).

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use tocsin_domain::delivery::{DeliveryState, WaitReason};
use tocsin_storage::stages::STAGE_BUCKETS;
use tocsin_web::metrics::LAG_BUCKETS;

#[derive(Clone)]
pub(crate) struct DispatcherMetrics {
    pub attempts: IntCounterVec,
    pub attempt_duration: HistogramVec,
    pub in_flight: IntGauge,
    pub lag: Histogram,
    pub deliveries_created: IntCounter,
    pub deliveries_finished: IntCounterVec,
    pub parked: IntCounterVec,
    pub swept: IntCounter,
    waited: IntCounterVec,
    pub database_errors: IntCounterVec,
    pub replayed: IntCounter,
    pub queue_messages: IntGaugeVec,
    pub unfinished: IntGaugeVec,
    pub waiting: IntGaugeVec,
    auto_disabled: IntCounter,
    /// `tocsin_webhooks_auto_disabled_total`, the counter's name before; exported beside it
    /// for one release.
    auto_disabled_formerly: IntCounter,
    pub webhook_failures: IntGaugeVec,
    pub webhook_success_rate: GaugeVec,
    pub webhook_enabled: IntGaugeVec,
    stages: HistogramVec,
}

/// The dispatcher's stages of an alert's way (`tocsin_dispatcher_stage_seconds{stage}`); the
/// request itself is `tocsin_dispatcher_attempt_duration_seconds`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stage {
    /// From the relay's publish of an event to its arrival here.
    Broker,
    /// The fan-out statement: deliveries created and first attempts claimed, committed.
    FanOut,
    /// Recording an attempt's outcome, committed.
    Outcome,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Broker => "broker",
            Stage::FanOut => "fan_out",
            Stage::Outcome => "outcome",
        }
    }
}

impl DispatcherMetrics {
    /// Counts `stage` as taking `took`.
    pub fn stage(&self, stage: Stage, took: std::time::Duration) {
        self.stages
            .with_label_values(&[stage.as_str()])
            .observe(took.as_secs_f64());
    }

    /// Counts a webhook the sweeper disabled, under the counter's name and its former one.
    pub fn auto_disabled(&self) {
        self.auto_disabled.inc();
        self.auto_disabled_formerly.inc();
    }

    /// The count of deliveries this dispatcher made `waiting` for `reason`.
    pub fn waited(&self, reason: WaitReason) -> prometheus::IntCounter {
        self.waited.with_label_values(&[reason.as_str()])
    }

    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let attempts = IntCounterVec::new(
            Opts::new(
                "tocsin_dispatcher_attempts_total",
                "Delivery attempts made, by outcome (success, failure), error kind (none when it succeeded) and trigger.",
            ),
            &["outcome", "error", "trigger"],
        )?;
        let attempt_duration = HistogramVec::new(
            HistogramOpts::new(
                "tocsin_dispatcher_attempt_duration_seconds",
                "Time from the start of an attempt to the target's answer (or failure), by outcome.",
            )
            .buckets(STAGE_BUCKETS.to_vec()),
            &["outcome"],
        )?;
        let in_flight = IntGauge::new(
            "tocsin_dispatcher_in_flight",
            "Attempts under way in this dispatcher.",
        )?;
        let lag = Histogram::with_opts(
            HistogramOpts::new(
                "tocsin_dispatcher_event_lag_seconds",
                "Time from an event to the start of the first attempt of each of its deliveries.",
            )
            .buckets(LAG_BUCKETS.to_vec()),
        )?;
        let deliveries_created = IntCounter::new(
            "tocsin_dispatcher_deliveries_created_total",
            "Deliveries created by this dispatcher's fan-out of incident events.",
        )?;
        let deliveries_finished = IntCounterVec::new(
            Opts::new(
                "tocsin_dispatcher_deliveries_finished_total",
                "Deliveries that reached a final state through an attempt, by state (succeeded, failed).",
            ),
            &["state"],
        )?;
        let parked = IntCounterVec::new(
            Opts::new(
                "tocsin_dispatcher_parked_total",
                "Messages moved to the parking queue, by queue (fanout, deliveries).",
            ),
            &["queue"],
        )?;
        let swept = IntCounter::new(
            "tocsin_dispatcher_swept_total",
            "Overdue deliveries re-enqueued by the sweeper.",
        )?;
        let database_errors = IntCounterVec::new(
            Opts::new(
                "tocsin_dispatcher_database_errors_total",
                "Database errors met by the dispatcher's handlers, by class: transient (an outage, tried again with backoff) or permanent (the item's own error: that item fails alone).",
            ),
            &["class"],
        )?;
        let replayed = IntCounter::new(
            "tocsin_dispatcher_replayed_total",
            "Deliveries created by this pod's replay pass (past events given to a webhook).",
        )?;
        let waited = IntCounterVec::new(
            Opts::new(
                "tocsin_dispatcher_waited_total",
                "Deliveries this dispatcher made waiting, by wait reason: at fan-out (webhook_busy, webhook_disabled, ordering) or when their attempt fell due (webhook_busy).",
            ),
            &["reason"],
        )?;
        let queue_messages = IntGaugeVec::new(
            Opts::new(
                "tocsin_queue_messages",
                "Messages waiting in each RabbitMQ queue of the topology (fan-out, deliveries, each retry delay, parking).",
            ),
            &["queue"],
        )?;
        let unfinished = IntGaugeVec::new(
            Opts::new(
                "tocsin_deliveries_unfinished",
                "Deliveries not yet finished, by state (pending, waiting, retrying), counted in PostgreSQL.",
            ),
            &["state"],
        )?;
        let waiting = IntGaugeVec::new(
            Opts::new(
                "tocsin_deliveries_waiting",
                "Deliveries waiting, by reason (webhook_busy, webhook_disabled, rate_limited, ordering), counted in PostgreSQL.",
            ),
            &["reason"],
        )?;
        let auto_disabled = IntCounter::new(
            "tocsin_dispatcher_auto_disabled_total",
            "Webhooks this dispatcher's sweeper disabled because they failed without a success for TOCSIN_AUTO_DISABLE_AFTER.",
        )?;
        let auto_disabled_formerly = IntCounter::new(
            "tocsin_webhooks_auto_disabled_total",
            "The former name of tocsin_dispatcher_auto_disabled_total, exported beside it for one release.",
        )?;
        let webhook_failures = IntGaugeVec::new(
            Opts::new(
                "tocsin_webhook_consecutive_failures",
                "Failed attempts since the webhook's last successful one (its health), by webhook id.",
            ),
            &["webhook_id"],
        )?;
        let webhook_success_rate = GaugeVec::new(
            Opts::new(
                "tocsin_webhook_success_rate",
                "Successful attempts over all attempts of the webhook in the window (1h, 24h), by webhook id; absent without attempts.",
            ),
            &["webhook_id", "window"],
        )?;
        let webhook_enabled = IntGaugeVec::new(
            Opts::new(
                "tocsin_webhook_enabled",
                "1 while the webhook is enabled, 0 while it is disabled (by an operator or auto-disable), by webhook id.",
            ),
            &["webhook_id"],
        )?;
        registry.register(Box::new(auto_disabled.clone()))?;
        registry.register(Box::new(auto_disabled_formerly.clone()))?;
        registry.register(Box::new(webhook_failures.clone()))?;
        registry.register(Box::new(webhook_success_rate.clone()))?;
        registry.register(Box::new(webhook_enabled.clone()))?;
        registry.register(Box::new(queue_messages.clone()))?;
        registry.register(Box::new(unfinished.clone()))?;
        registry.register(Box::new(waiting.clone()))?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(database_errors.clone()))?;
        registry.register(Box::new(replayed.clone()))?;
        registry.register(Box::new(attempt_duration.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(lag.clone()))?;
        registry.register(Box::new(deliveries_created.clone()))?;
        registry.register(Box::new(deliveries_finished.clone()))?;
        registry.register(Box::new(parked.clone()))?;
        registry.register(Box::new(swept.clone()))?;
        registry.register(Box::new(waited.clone()))?;
        // Export these series at 0 from the start, so that dashboards and `increase()` in the
        // alert rules see the first occurrence (a series that appears at 1 shows no increase).
        for state in [DeliveryState::Succeeded, DeliveryState::Failed] {
            deliveries_finished.with_label_values(&[state.as_str()]);
        }
        for queue in ["fanout", "deliveries"] {
            parked.with_label_values(&[queue]);
        }
        for reason in [
            WaitReason::WebhookBusy,
            WaitReason::WebhookDisabled,
            WaitReason::Ordering,
        ] {
            waited.with_label_values(&[reason.as_str()]);
        }
        let stages = tocsin_storage::stages::histogram(
            registry,
            prometheus::HistogramOpts::new(
                "tocsin_dispatcher_stage_seconds",
                "Time of the dispatcher's stages of an alert's way, by stage: broker (from the relay's publish of an event to its arrival here), fan_out (the fan-out statement, waits for a batch included), outcome (recording an attempt's outcome). The request is tocsin_dispatcher_attempt_duration_seconds.",
            ),
        )?;
        Ok(DispatcherMetrics {
            stages,
            attempts,
            attempt_duration,
            in_flight,
            lag,
            deliveries_created,
            deliveries_finished,
            parked,
            swept,
            waited,
            database_errors,
            replayed,
            queue_messages,
            unfinished,
            waiting,
            auto_disabled,
            auto_disabled_formerly,
            webhook_failures,
            webhook_success_rate,
            webhook_enabled,
        })
    }
}
