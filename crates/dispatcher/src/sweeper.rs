//! The sweeper (DESIGN §2): PostgreSQL is the source of truth, so a delivery whose next attempt
//! is overdue by more than a grace period — its message lost by the broker, or never published
//! because a dispatcher died between commit and publish — is enqueued again. Several dispatchers
//! may sweep at once: rows are claimed with `FOR UPDATE SKIP LOCKED` and pushed ahead.

use std::sync::Arc;
use std::time::Duration;

use tocsin_domain::db::{deliveries, DbError};
use tokio_util::sync::CancellationToken;

use crate::startup::Context;

/// Most deliveries re-enqueued per pass.
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

/// One pass; returns how many deliveries were re-enqueued.
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
