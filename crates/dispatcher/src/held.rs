//! Held deliveries (DESIGN §2, isolation). While this dispatcher finds a webhook slow (at its
//! in-flight limit, its oldest request old), it keeps the webhook's mark in PostgreSQL fresh,
//! and the writers hold the webhook's new deliveries there: each is a row, with no outbox row
//! and no broker message, so a hanging target costs the healthy ones as little as it can. Once
//! no dispatcher renews the mark and it lapses, the held deliveries are released and their
//! first attempts enqueued.

use std::sync::Arc;
use std::time::Duration;

use tocsin_domain::db::deliveries::{self, Waiting};
use tokio_util::sync::CancellationToken;

use crate::startup::Context;
use crate::sweeper::{claim_and_enqueue, BATCH};

/// How often marks are renewed and lapsed ones' deliveries released.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

pub(crate) async fn run(ctx: Arc<Context>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(RELEASE_EVERY) => {}
        }
        // A webhook whose requests all hang gets no new attempt that would find it slow: its
        // mark is renewed here for as long as they hang.
        for webhook in ctx.slots.slow_webhooks() {
            ctx.note_slow(webhook);
        }
        match release_once(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deliveries = n, "released held deliveries"),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "releasing held deliveries failed; will retry");
            }
        }
    }
}

/// One pass; returns how many held deliveries were released and enqueued.
pub(crate) async fn release_once(ctx: &Context) -> anyhow::Result<usize> {
    let released = claim_and_enqueue(
        ctx,
        |conn| Box::pin(deliveries::release_held(conn, BATCH)),
        |ctx, waiting: &[Waiting]| {
            Box::pin(async move { Ok(ctx.enqueue_first_attempts(waiting).await?) })
        },
    )
    .await?;
    ctx.metrics.released.inc_by(released as u64);
    Ok(released)
}
