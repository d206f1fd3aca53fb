//! Held deliveries (DESIGN §2, isolation). While this dispatcher finds a webhook slow (at its
//! in-flight limit, its oldest request old), it keeps the webhook's mark in PostgreSQL fresh,
//! and the writers hold the webhook's new deliveries there: each is a narrow row of
//! `held_deliveries` (no delivery row yet, no outbox row, no broker message), so a hanging
//! target costs the healthy ones as little as it can. Once no dispatcher renews the mark and it
//! lapses, the held deliveries are released into pending deliveries and their first attempts
//! enqueued.
//!
//! Releases are paced per webhook, as TCP's slow start paces a connection: a webhook's first
//! release is as many deliveries as it may have in flight (`TOCSIN_WEBHOOK_CONCURRENCY`); while
//! its backlog lasts, each pass doubles that if the webhook answered quickly meanwhile and
//! starts again from the first size if it did not. A webhook that still hangs so gets one
//! round of attempts, is marked again, and keeps the rest held, instead of having its whole
//! backlog published at once only to be deferred; one that recovered drains it within seconds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tocsin_domain::db::deliveries::{self, ReleaseQuota};
use tocsin_domain::db::DbError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::startup::Context;

/// How often marks are renewed and lapsed ones' deliveries released.
const RELEASE_EVERY: Duration = Duration::from_secs(1);
/// Most deliveries released of one webhook in one pass.
const MAX_QUOTA: i64 = 4_096;
/// Most deliveries released in one pass.
const MAX_RELEASE: i64 = 8_192;

pub(crate) async fn run(ctx: Arc<Context>, cancel: CancellationToken) {
    let mut pacing = Pacing::new(ctx.slots.limit());
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
        match release_once(&ctx, &mut pacing).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deliveries = n, "released held deliveries"),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "releasing held deliveries failed; will retry");
            }
        }
    }
}

/// One pass; returns how many held deliveries were released and enqueued.
pub(crate) async fn release_once(ctx: &Context, pacing: &mut Pacing) -> anyhow::Result<usize> {
    let quota = pacing.quota(|webhook| ctx.slots.answers_slowly(webhook));
    let mut conn = ctx.pool.get().await.map_err(DbError::from)?;
    let released = deliveries::release_held(&mut conn, MAX_RELEASE, &quota).await?;
    drop(conn);
    let cut = released.len() as i64 >= MAX_RELEASE;
    pacing.released(
        &quota,
        released.iter().map(|waiting| waiting.webhook_id),
        cut,
    );
    if released.is_empty() {
        return Ok(0);
    }
    // Published after the commit; if this fails they are overdue first attempts, which the
    // sweeper enqueues after its grace.
    ctx.enqueue_first_attempts(&released).await?;
    ctx.metrics.released.inc_by(released.len() as u64);
    Ok(released.len())
}

/// Per-webhook release sizes of the webhooks whose held backlog is being released.
#[derive(Debug)]
pub(crate) struct Pacing {
    first: i64,
    /// The last release's size of each webhook that had more held than that.
    draining: HashMap<Uuid, i64>,
}

impl Pacing {
    /// Pacing whose first release of a webhook is `first` deliveries.
    pub fn new(first: usize) -> Self {
        Pacing {
            first: i64::try_from(first)
                .unwrap_or(MAX_QUOTA)
                .clamp(1, MAX_QUOTA),
            draining: HashMap::new(),
        }
    }

    /// This pass's quotas: the first size for a webhook not draining, or one that
    /// `answers_slowly`; twice the last size for the others. Nothing changes until the pass is
    /// recorded with [`Pacing::released`], so a pass that fails is not counted.
    fn quota(&self, answers_slowly: impl Fn(Uuid) -> bool) -> ReleaseQuota {
        let webhooks = self
            .draining
            .iter()
            .map(|(webhook, size)| {
                let next = if answers_slowly(*webhook) {
                    self.first
                } else {
                    (size * 2).min(MAX_QUOTA)
                };
                (*webhook, next)
            })
            .collect();
        ReleaseQuota {
            default: self.first,
            webhooks,
        }
    }

    /// Records a pass that released `released` (one webhook id per delivery) under `quota`: a
    /// webhook that used its whole quota may have more held, and keeps draining; when the pass
    /// was `cut` short by the limit of a pass, so does every webhook it released any of.
    fn released(&mut self, quota: &ReleaseQuota, released: impl Iterator<Item = Uuid>, cut: bool) {
        let mut counts: HashMap<Uuid, i64> = HashMap::new();
        for webhook in released {
            *counts.entry(webhook).or_default() += 1;
        }
        let size_of = |webhook: &Uuid| {
            quota
                .webhooks
                .iter()
                .find(|(w, _)| w == webhook)
                .map_or(quota.default, |(_, n)| *n)
        };
        self.draining = counts
            .into_iter()
            .filter(|(webhook, count)| cut || *count >= size_of(webhook))
            .map(|(webhook, _)| (webhook, size_of(&webhook)))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(pacing: &mut Pacing, quota: &ReleaseQuota, of: &[(Uuid, i64)]) {
        let ids = of
            .iter()
            .flat_map(|(webhook, n)| std::iter::repeat_n(*webhook, *n as usize));
        pacing.released(quota, ids, false);
    }

    #[test]
    fn a_backlog_is_released_doubling_while_its_webhook_answers_quickly() {
        let mut pacing = Pacing::new(64);
        let (quick, hanging, small) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let quota = pacing.quota(|_| false);
        assert_eq!(quota, ReleaseQuota::each(64), "nothing draining yet");
        released(
            &mut pacing,
            &quota,
            &[(quick, 64), (hanging, 64), (small, 3)],
        );

        // The hanging webhook's released attempts hang: it starts again from the first size.
        let quota = pacing.quota(|webhook| webhook == hanging);
        let mut sizes = quota.webhooks.clone();
        sizes.sort();
        let mut expected = vec![(quick, 128), (hanging, 64)];
        expected.sort();
        assert_eq!(sizes, expected, "the small backlog was drained");
        assert_eq!(quota.default, 64);

        released(&mut pacing, &quota, &[(quick, 128), (hanging, 64)]);
        let quota = pacing.quota(|_| false);
        assert!(quota.webhooks.contains(&(quick, 256)));
        assert!(quota.webhooks.contains(&(hanging, 128)));
        released(&mut pacing, &quota, &[(quick, 256)]);

        // Up to the largest size, and a webhook that released less than its quota is done.
        let mut size = 0;
        for _ in 0..5 {
            let quota = pacing.quota(|_| false);
            size = quota.webhooks.iter().find(|(w, _)| *w == quick).unwrap().1;
            released(&mut pacing, &quota, &[(quick, size)]);
        }
        assert_eq!(size, MAX_QUOTA);
        let quota = pacing.quota(|_| false);
        released(&mut pacing, &quota, &[(quick, 5)]);
        assert_eq!(pacing.quota(|_| false), ReleaseQuota::each(64));

        // A pass cut short by its own limit keeps every webhook it released any of.
        let quota = pacing.quota(|_| false);
        pacing.released(&quota, std::iter::repeat_n(small, 10), true);
        assert_eq!(pacing.quota(|_| false).webhooks, [(small, 128)]);
    }
}
