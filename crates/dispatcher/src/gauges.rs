//! The gauges read from outside the process: the depth of each queue (from RabbitMQ), the
//! unfinished deliveries by state and each webhook's health (from PostgreSQL), refreshed on a
//! timer.

use std::sync::Arc;
use std::time::Duration;

use tocsin_storage::health::WebhookHealth;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// Sets each webhook's health gauges; webhooks deleted since the last refresh leave them.
fn set_health(ctx: &Context, webhooks: &[(uuid::Uuid, bool, WebhookHealth)]) {
    let metrics = &ctx.metrics;
    metrics.webhook_failures.reset();
    metrics.webhook_success_rate.reset();
    metrics.webhook_enabled.reset();
    for (id, enabled, health) in webhooks {
        let id = id.to_string();
        metrics
            .webhook_failures
            .with_label_values(&[&id])
            .set(i64::from(health.consecutive_failures));
        metrics
            .webhook_enabled
            .with_label_values(&[&id])
            .set(i64::from(*enabled));
        for (window, rate) in [
            ("1h", health.success_rate_1h),
            ("24h", health.success_rate_24h),
        ] {
            if let Some(rate) = rate {
                metrics
                    .webhook_success_rate
                    .with_label_values(&[&id, window])
                    .set(rate);
            }
        }
    }
}

/// Refreshes the queue-depth and backlog gauges every `interval` until cancelled.
pub(crate) async fn refresh_gauges(
    ctx: Arc<Context>,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        if let Ok(depths) = ctx.broker.queue_depths().await {
            let prefix = format!("{}.", ctx.broker.topology().prefix());
            for (queue, depth) in depths {
                let short = queue.strip_prefix(&prefix).unwrap_or(&queue).to_owned();
                ctx.metrics
                    .queue_messages
                    .with_label_values(&[&short])
                    .set(i64::from(depth));
            }
        }
        if let Ok(mut conn) = ctx.pool.get().await {
            if let Ok(counts) = tocsin_storage::deliveries::count_unfinished(&mut conn).await {
                for (state, n) in counts {
                    ctx.metrics
                        .unfinished
                        .with_label_values(&[state.as_str()])
                        .set(n);
                }
            }
            if let Ok(counts) = tocsin_storage::deliveries::count_waiting(&mut conn).await {
                for (reason, n) in counts {
                    ctx.metrics
                        .waiting
                        .with_label_values(&[reason.as_str()])
                        .set(n);
                }
            }
            if let Ok(webhooks) = tocsin_storage::health::all(&mut conn).await {
                set_health(&ctx, &webhooks);
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
