//! The gauges read from outside the process: the depth of each queue (from RabbitMQ) and the
//! unfinished deliveries by state (from PostgreSQL), refreshed on a timer.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;

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
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
