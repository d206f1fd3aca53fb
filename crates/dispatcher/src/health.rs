//! Webhook health, tallied in this dispatcher as it records attempt outcomes and written once a
//! second, one statement for every webhook: recording an attempt never waits on a webhook's
//! health row, which every dispatcher's attempts to that webhook would share. Health lags the
//! delivery log by up to a second, and a dispatcher killed loses at most its last second of
//! counts; the log itself loses nothing. Interrupted attempts (the dispatcher's doing, not the
//! target's) are not tallied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;
use tocsin_storage::attempts::AttemptResult;
use tocsin_storage::health::{self, Tally};
use tocsin_storage::{DbError, DbPool};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// How often the tallies are written.
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// Outcomes tallied since the last write, by webhook.
#[derive(Default)]
pub(crate) struct HealthTally(Mutex<HashMap<Uuid, Tally>>);

impl HealthTally {
    /// Tallies the outcome of an attempt to `webhook_id` recorded just now.
    pub(crate) fn add(&self, webhook_id: Uuid, result: &AttemptResult) {
        let error = result.error.map(|kind| match &result.error_detail {
            Some(detail) => format!("{}: {}", kind.as_str(), truncated(detail, 500)),
            None => kind.as_str().to_owned(),
        });
        let mut tallies = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tallies.entry(webhook_id).or_default().add(
            result.success,
            error,
            OffsetDateTime::now_utc(),
        );
    }

    fn take(&self) -> Vec<(Uuid, Tally)> {
        let mut tallies = self.0.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *tallies).into_iter().collect()
    }

    /// Puts tallies that could not be written back, to be written with the next ones.
    fn restore(&self, unwritten: Vec<(Uuid, Tally)>) {
        let mut tallies = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (webhook_id, older) in unwritten {
            let newer = tallies.remove(&webhook_id);
            tallies.insert(webhook_id, older.followed_by(newer));
        }
    }
}

/// At most `max` characters of `text`.
fn truncated(text: &str, max: usize) -> &str {
    text.char_indices()
        .nth(max)
        .map_or(text, |(at, _)| &text[..at])
}

/// Writes the tallies every [`WRITE_EVERY`]; once cancelled, once more after the consumers
/// and the attempts under way (`attempts`) have drained, within `drain`.
pub(crate) async fn run(
    tally: Arc<HealthTally>,
    pool: DbPool,
    attempts: TaskTracker,
    drain: Duration,
    cancel: CancellationToken,
) {
    let mut every = tokio::time::interval(WRITE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = every.tick() => false,
        };
        if stopping {
            let _ = tokio::time::timeout(drain, attempts.wait()).await;
        }
        match write(&tally, &pool).await {
            Ok(()) if stopping => return,
            Ok(()) => {}
            Err(error) if stopping => {
                tracing::warn!(error = %format!("{error:#}"), "writing webhook health failed at the stop; the counts since the last write are lost (the delivery log keeps every attempt)");
                return;
            }
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "writing webhook health failed; will retry");
            }
        }
    }
}

async fn write(tally: &HealthTally, pool: &DbPool) -> anyhow::Result<()> {
    let tallies = tally.take();
    if tallies.is_empty() {
        return Ok(());
    }
    let written = async {
        let mut conn = pool.get().await.map_err(DbError::from)?;
        health::record(&mut conn, &tallies).await
    }
    .await;
    if let Err(error) = written {
        tally.restore(tallies);
        return Err(error.into());
    }
    Ok(())
}
