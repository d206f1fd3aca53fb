//! Data lifecycle. The delivery log (events, deliveries, attempts) is kept in day partitions,
//! and a day older than the retention period is removed whole, but for its unfinished
//! deliveries ([`partitions::expire`]). Published outbox rows are deleted once older than their
//! own retention, and webhook outcome buckets once older than the 24 hours the success rates
//! read, in small batches, each its own short statement that skips locked rows.
//!
//! A delivery log not yet reshaped into day partitions (a database upgraded from a release
//! before them, until `tocsin-admin reshape`) is pruned as before: finished deliveries with
//! their attempts, then events no delivery refers to, row by row.

use diesel::sql_types::{BigInt, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;

use crate::partitions::{self, Expired};
use crate::DbError;

/// Rows deleted per statement.
pub const BATCH: i64 = 1000;

/// What a prune removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Days of the delivery log removed.
    pub days: Expired,
    /// Deliveries deleted row by row (a delivery log not yet in day partitions).
    pub deliveries: usize,
    pub events: usize,
    pub outbox: usize,
    pub outcome_buckets: usize,
}

/// Removes what is older than `cutoff` (published outbox rows older than `outbox_cutoff`), and
/// makes the day partitions ahead.
pub async fn prune(
    conn: &mut AsyncPgConnection,
    cutoff: OffsetDateTime,
    outbox_cutoff: OffsetDateTime,
) -> Result<Pruned, DbError> {
    partitions::create_ahead(conn, OffsetDateTime::now_utc().date()).await?;
    let days = partitions::expire(conn, cutoff).await?;
    let (deliveries, events) = if partitions::partitioned(conn).await? {
        (0, 0)
    } else {
        // Attempts go with their delivery (ON DELETE CASCADE).
        (
            batches(conn, cutoff, include_str!("sql/prune_deliveries.sql")).await?,
            batches(conn, cutoff, include_str!("sql/prune_events.sql")).await?,
        )
    };
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
        days,
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
