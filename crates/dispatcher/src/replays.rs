//! The replay pass: once a second, each dispatcher works through the replays asked for
//! (`POST /api/v1/webhooks/{id}/replay`), a page of events at a time
//! ([`tocsin_storage::replays::advance`]): their deliveries are created, marked `replayed`, and
//! their first attempts enqueued; they then follow the schedule, the webhook's rate limit and
//! its ordering like any other. Several dispatchers share the work (each page locks its
//! replay), and one that stops leaves the rest to the others.

use std::sync::Arc;
use std::time::Duration;

use tocsin_storage::{replays, DbError};
use tokio_util::sync::CancellationToken;

use crate::context::{Context, LEASE_MARGIN};

/// How often the pass looks for replays.
const REPLAY_PASS_EVERY: Duration = Duration::from_secs(1);
/// Events read and given to the webhook per transaction.
const PAGE: i64 = 1000;

pub(crate) async fn run(ctx: Arc<Context>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(REPLAY_PASS_EVERY) => {}
        }
        // Page after page while there is work, each its own transaction, until the stop.
        while !cancel.is_cancelled() {
            match advance_once(&ctx).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), "the replay pass failed; will retry");
                    break;
                }
            }
        }
    }
}

/// One page of one replay; whether there was one.
async fn advance_once(ctx: &Context) -> anyhow::Result<bool> {
    let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
    let Some(advanced) = replays::advance(&mut conn, PAGE, LEASE_MARGIN).await? else {
        return Ok(false);
    };
    ctx.metrics.replayed.inc_by(advanced.created as u64);
    if advanced.finished {
        tracing::info!(replay_id = %advanced.replay_id, "replay finished");
    }
    Ok(true)
}
