//! The waiting pass: once a second, each dispatcher takes the `waiting` deliveries it has room
//! for (its free slots of each webhook, oldest first) and starts their attempts. Any dispatcher
//! with room takes them, so a busy webhook's backlog drains as fast as the webhook answers,
//! across every dispatcher, and waiting deliveries of a dispatcher that stopped are taken by the
//! others. A delivery taken that then finds no slot stays `waiting`.

use std::sync::Arc;
use std::time::Duration;

use tocsin_storage::deliveries;
use tocsin_storage::DbError;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// How often waiting deliveries are taken.
pub(crate) const WAITING_PASS_EVERY: Duration = Duration::from_secs(1);

pub(crate) async fn run(ctx: Arc<Context>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(WAITING_PASS_EVERY) => {}
        }
        match take_once(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deliveries = n, "took waiting deliveries"),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "taking waiting deliveries failed; will retry");
            }
        }
    }
}

/// One pass; returns how many waiting deliveries were started.
#[tracing::instrument(skip_all)]
pub(crate) async fn take_once(ctx: &Arc<Context>) -> anyhow::Result<usize> {
    let free = ctx.requests.available_permits() as i64;
    if free == 0 {
        return Ok(0);
    }
    let room = ctx.slots.room();
    let limit = ctx.slots.limit() as i64;
    let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
    let taken = deliveries::take_waiting(&mut conn, &room, limit, free).await?;
    drop(conn);
    for due in &taken {
        // Nobody waits for the claim: the delivery stays `waiting` until it is made.
        drop(crate::attempt::spawn(ctx, *due));
    }
    Ok(taken.len())
}
