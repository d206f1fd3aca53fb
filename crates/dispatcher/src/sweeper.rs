//! The sweeper: PostgreSQL is the source of truth, so the dispatcher looks there for work the
//! broker or a stopped dispatcher lost. Each pass records the attempts whose dispatcher stopped
//! before recording their outcome (an automatic one once its lease has ended) as `interrupted`
//! (their deliveries move as after any failed attempt), then enqueues pending and retrying deliveries whose next attempt is overdue by
//! more than a grace period (a message lost by the broker, a first attempt its dispatcher never
//! made). Several dispatchers may sweep at once: rows are claimed with `FOR UPDATE SKIP LOCKED`
//! and made due now, and every attempt is still claimed before it is sent. Each pass also
//! disables the webhooks that have failed without a success for `TOCSIN_AUTO_DISABLE_AFTER`.

use std::sync::Arc;
use std::time::Duration;

use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger};
use tocsin_storage::attempts::{AttemptResult, Completion};
use tocsin_storage::deliveries::{self, Due};
use tocsin_storage::{partitions, DbError};
use tokio_util::sync::CancellationToken;

use crate::context::{Context, LEASE_MARGIN};

/// Most deliveries claimed and enqueued per statement.
const BATCH: i64 = 500;
/// A manual attempt (which takes no lease) takes at most the longest webhook timeout; one
/// without an outcome that long plus the lease margin after it started was interrupted.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) async fn run(
    ctx: Arc<Context>,
    interval: Duration,
    grace: Duration,
    auto_disable_after: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if !auto_disable_after.is_zero() {
            if let Err(error) = auto_disable(&ctx, auto_disable_after).await {
                tracing::warn!(error = %format!("{error:#}"), "auto-disable failed; will retry");
            }
        }
        match sweep_once(&ctx, grace).await {
            Ok((0, 0)) => {}
            Ok((interrupted, overdue)) => {
                tracing::warn!(
                    interrupted,
                    overdue,
                    "recorded interrupted attempts and re-enqueued overdue deliveries"
                );
            }
            Err(error) => tracing::warn!(error = %format!("{error:#}"), "sweep failed; will retry"),
        }
    }
}

/// Disables the webhooks failing without a success for `after`, each with a warning.
#[tracing::instrument(skip_all)]
async fn auto_disable(ctx: &Context, after: Duration) -> anyhow::Result<()> {
    let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
    for disabled in tocsin_storage::health::auto_disable(&mut conn, after).await? {
        ctx.metrics.auto_disabled();
        tracing::warn!(
            webhook_id = %disabled.webhook_id,
            reason = %disabled.reason,
            "webhook disabled automatically"
        );
    }
    Ok(())
}

/// One pass; returns how many interrupted attempts were recorded and how many overdue
/// deliveries re-enqueued.
#[tracing::instrument(skip_all)]
pub(crate) async fn sweep_once(ctx: &Context, grace: Duration) -> anyhow::Result<(usize, usize)> {
    let interrupted = record_interrupted(ctx).await?;
    let mut overdue = 0;
    loop {
        let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
        let due = deliveries::claim_overdue(&mut conn, grace, BATCH).await?;
        drop(conn);
        if due.is_empty() {
            break;
        }
        let messages: Vec<_> = due
            .iter()
            .map(|due| ctx.attempt_message(due, Duration::ZERO))
            .collect();
        ctx.broker.publish_all(&messages).await?;
        ctx.metrics.swept.inc_by(due.len() as u64);
        overdue += due.len();
        if due.len() < BATCH as usize {
            break;
        }
    }
    Ok((interrupted, overdue))
}

/// Records the attempts of stopped dispatchers as interrupted, each moving its delivery
/// as a failed attempt does: a delivery moved to `retrying` gets its next attempt through the
/// retry queue of its delay, as after any failed attempt.
#[tracing::instrument(skip_all)]
async fn record_interrupted(ctx: &Context) -> anyhow::Result<usize> {
    let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
    let found = deliveries::interrupted(
        &mut conn,
        Duration::ZERO,
        LONGEST_TIMEOUT + LEASE_MARGIN,
        BATCH,
    )
    .await?;
    drop(conn);
    let mut recorded = 0;
    for attempt in found {
        let trigger = attempt.trigger();
        let auto_attempts = (trigger == Trigger::Automatic).then_some(attempt.auto_attempts);
        let transition = Transition::after_attempt(
            trigger,
            attempt.auto_attempts,
            false,
            attempt.max_attempts(),
            &ctx.schedule,
        );
        let completion = Completion {
            delivery_id: attempt.delivery_id,
            number: attempt.number,
            auto_attempts,
            result: AttemptResult::interrupted(),
            transition,
        };
        let Some(completed) = ctx.batched.complete(completion).await? else {
            continue;
        };
        recorded += 1;
        ctx.metrics
            .attempts
            .with_label_values(&[
                "failure",
                AttemptError::Interrupted.as_str(),
                trigger.as_str(),
            ])
            .inc();
        match (transition, completed.moved, completed.state) {
            (Transition::Retry { delay }, true, Some(DeliveryState::Retrying)) => {
                let next = Due {
                    delivery_id: attempt.delivery_id,
                    webhook_id: attempt.webhook_id,
                    auto_attempts: attempt.auto_attempts,
                };
                // Should this fail, the overdue pass sends it once overdue.
                ctx.broker
                    .publish(ctx.attempt_message(&next, delay))
                    .await?;
            }
            (_, true, Some(DeliveryState::Failed)) => ctx
                .metrics
                .deliveries_finished
                .with_label_values(&[DeliveryState::Failed.as_str()])
                .inc(),
            _ => {}
        }
    }
    Ok(recorded)
}

/// How often a dispatcher that does not prune (`TOCSIN_PRUNE_INTERVAL=0s`) still makes the day
/// partitions ahead: with no dispatcher pruning and none restarted for a week, ingest would
/// otherwise meet a day with no partition for its events.
const PARTITIONS_AHEAD_EVERY: Duration = Duration::from_secs(3600);

/// Prunes old data every `interval`, logging what it removed; with pruning off, makes the day
/// partitions ahead every hour instead.
#[tracing::instrument(skip_all)]
pub(crate) async fn prune(
    ctx: Arc<Context>,
    interval: Duration,
    retention: Duration,
    cancel: CancellationToken,
) {
    let every = if interval.is_zero() {
        PARTITIONS_AHEAD_EVERY
    } else {
        interval
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = time::OffsetDateTime::now_utc();
        let mut conn = match ctx.pool.get().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(error = %DbError::from(error), "pruning failed; will retry");
                continue;
            }
        };
        if interval.is_zero() {
            if let Err(error) = partitions::create_ahead(&mut conn, now.date()).await {
                tracing::warn!(%error, "making the partitions ahead failed; will retry");
            }
            continue;
        }
        let keep = time::Duration::try_from(retention).unwrap_or(time::Duration::days(30));
        let outbox_keep = keep.min(time::Duration::DAY);
        match tocsin_storage::retention::prune(&mut conn, now - keep, now - outbox_keep).await {
            Ok(pruned) => tracing::info!(?pruned, "pruned data past retention"),
            Err(error) => tracing::warn!(%error, "pruning failed; will retry"),
        }
    }
}
