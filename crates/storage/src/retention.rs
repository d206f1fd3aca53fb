//! Data lifecycle: finished deliveries (with their attempts), events no delivery refers to any
//! more and published outbox rows are
//! deleted once older than the retention period; webhook outcome buckets once older than the
//! 24 hours the success rates read. Deletes run in small batches, each its own
//! short statement that skips locked rows, so the hot tables are never locked for long. The
//! statements are `sql/prune_*.sql`.

use diesel::sql_types::{BigInt, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;

use crate::DbError;

/// Rows deleted per statement.
pub const BATCH: i64 = 1000;

/// How many rows a prune removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub deliveries: usize,
    pub events: usize,
    pub outbox: usize,
    pub outcome_buckets: usize,
}

/// Deletes what is older than `cutoff` (published outbox rows older than `outbox_cutoff`),
/// batch by batch, until nothing is left.
pub async fn prune(
    conn: &mut AsyncPgConnection,
    cutoff: OffsetDateTime,
    outbox_cutoff: OffsetDateTime,
) -> Result<Pruned, DbError> {
    // Attempts go with their delivery (ON DELETE CASCADE).
    let deliveries = batches(conn, cutoff, include_str!("sql/prune_deliveries.sql")).await?;
    let events = batches(conn, cutoff, include_str!("sql/prune_events.sql")).await?;
    let outbox = batches(conn, outbox_cutoff, include_str!("sql/prune_outbox.sql")).await?;
    // Buckets an hour older than the longest success-rate window.
    let buckets_cutoff =
        OffsetDateTime::now_utc() - crate::health::RATE_WINDOWS[1] - time::Duration::HOUR;
    let outcome_buckets = batches(
        conn,
        buckets_cutoff,
        include_str!("sql/prune_outcome_buckets.sql"),
    )
    .await?;
    Ok(Pruned {
        deliveries,
        events,
        outbox,
        outcome_buckets,
    })
}

async fn batches(
    conn: &mut AsyncPgConnection,
    cutoff: OffsetDateTime,
    statement: &str,
) -> Result<usize, DbError> {
    let mut total = 0;
    loop {
        let deleted = diesel::sql_query(statement)
            .bind::<Timestamptz, _>(cutoff)
            .bind::<BigInt, _>(BATCH)
            .execute(conn)
            .await?;
        total += deleted;
        if deleted < BATCH as usize {
            return Ok(total);
        }
    }
}
