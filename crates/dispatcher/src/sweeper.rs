//! The sweeper (DESIGN §2): PostgreSQL is the source of truth, so a delivery whose next attempt
//! is overdue by more than a grace period — its message lost by the broker, or never published
//! because a dispatcher died between commit and publish — is enqueued again. Several dispatchers
//! may sweep at once: rows are claimed with `FOR UPDATE SKIP LOCKED` and pushed ahead.

use std::sync::Arc;
use std::time::Duration;

use tocsin_domain::db::{deliveries, DbError};
use tokio_util::sync::CancellationToken;

use crate::startup::Context;

/// Most deliveries claimed and enqueued per transaction.
const BATCH: i64 = 500;

pub(crate) async fn run(
    ctx: Arc<Context>,
    interval: Duration,
    grace: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match sweep_once(&ctx, grace).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(deliveries = n, "re-enqueued overdue deliveries"),
            Err(error) => tracing::warn!(error = %format!("{error:#}"), "sweep failed; will retry"),
        }
    }
}

/// One pass; returns how many deliveries were re-enqueued. Deliveries are claimed in batches of
/// [`BATCH`] (each claim commits); a batch claimed and then not enqueued is overdue like any
/// other, and a later pass takes it up after its grace.
pub(crate) async fn sweep_once(ctx: &Context, grace: Duration) -> anyhow::Result<usize> {
    let mut total = 0;
    loop {
        let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
        let due = deliveries::claim_overdue(&mut conn, grace, BATCH).await?;
        drop(conn);
        if due.is_empty() {
            return Ok(total);
        }
        let messages: Vec<_> = due
            .iter()
            .map(|(id, auto_attempts)| ctx.attempt_message(*id, auto_attempts + 1))
            .collect();
        ctx.broker.publish_all(&messages).await?;
        ctx.metrics.swept.inc_by(due.len() as u64);
        total += due.len();
        if due.len() < BATCH as usize {
            return Ok(total);
        }
    }
}

/// Prunes old data every `interval` (DESIGN: retention), logging what it removed.
pub(crate) async fn prune(
    ctx: Arc<Context>,
    interval: Duration,
    retention: Duration,
    cancel: CancellationToken,
) {
    if interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let now = time::OffsetDateTime::now_utc();
        let keep = time::Duration::try_from(retention).unwrap_or(time::Duration::days(30));
        let outbox_keep = keep.min(time::Duration::DAY);
        let result = async {
            let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
            tocsin_domain::db::retention::prune(&mut conn, now - keep, now - outbox_keep).await
        }
        .await;
        match result {
            Ok(pruned) => tracing::info!(?pruned, "pruned data past retention"),
            Err(error) => tracing::warn!(%error, "pruning failed; will retry"),
        }
    }
}
