//! Deliveries: the delivery log and the transitions that make no attempt (waiting, stopping,
//! the sweeper's). Claiming attempts and recording their outcomes are in [`crate::attempts`],
//! creating deliveries in [`crate::fan_out`]. PostgreSQL is the source of truth for each
//! delivery's state, attempt counts and next attempt time; every write here is one transition
//! of the state machine in [`tocsin_domain::delivery`], guarded in SQL (compare-and-set on the
//! state, the automatic attempt count and the attempt lease), so that no interleaving of
//! dispatchers, redelivered messages, manual retries and sweeper passes makes an attempt the
//! schedule does not allow or sends a request the attempt log does not show.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Int4, Int8, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::{attempts, deliveries, events};
use crate::statement::Statement;
use crate::{found, Cursor, DbError, Listed, Page};
pub use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger, WaitReason};
use tocsin_domain::EventKind;

type SqlUuid = diesel::sql_types::Uuid;

#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = deliveries)]
pub(crate) struct DeliveryRow {
    pub(crate) id: Uuid,
    pub(crate) webhook_id: Uuid,
    pub(crate) event_id: Uuid,
    pub(crate) event: String,
    pub(crate) incident_id: Uuid,
    pub(crate) state: String,
    pub(crate) wait_reason: Option<String>,
    pub(crate) attempt_count: i32,
    pub(crate) auto_attempts: i32,
    pub(crate) next_attempt_at: Option<OffsetDateTime>,
    pub(crate) attempting_until: Option<OffsetDateTime>,
    pub(crate) created_at: OffsetDateTime,
    pub(crate) updated_at: OffsetDateTime,
    pub(crate) replayed: bool,
}

/// A delivery of one event to one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub event_id: Uuid,
    pub event: EventKind,
    pub incident_id: Uuid,
    pub state: DeliveryState,
    /// Why it is `waiting`; `None` in any other state.
    pub wait_reason: Option<WaitReason>,
    pub attempt_count: i32,
    pub auto_attempts: i32,
    /// When the next automatic attempt is due; `None` while one is under way and when none is
    /// scheduled.
    pub next_attempt_at: Option<OffsetDateTime>,
    /// While an automatic attempt is under way, when its lease ends.
    pub attempting_until: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    /// Made by a replay of past events to its webhook, not by the event's fan-out.
    pub replayed: bool,
}

impl Listed for Delivery {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

impl TryFrom<DeliveryRow> for Delivery {
    type Error = DbError;
    fn try_from(row: DeliveryRow) -> Result<Self, DbError> {
        let corrupt = |what: &str| DbError::Corrupt(format!("delivery {}: bad {what}", row.id));
        let wait_reason = match row.wait_reason.as_deref() {
            None => None,
            Some(text) => Some(WaitReason::parse(text).ok_or_else(|| corrupt("wait reason"))?),
        };
        Ok(Delivery {
            event: row.event.parse().map_err(|_| corrupt("event"))?,
            state: row.state.parse().map_err(|_| corrupt("state"))?,
            wait_reason,
            id: row.id,
            webhook_id: row.webhook_id,
            event_id: row.event_id,
            incident_id: row.incident_id,
            attempt_count: row.attempt_count,
            auto_attempts: row.auto_attempts,
            next_attempt_at: row.next_attempt_at,
            attempting_until: row.attempting_until,
            created_at: row.created_at,
            updated_at: row.updated_at,
            replayed: row.replayed,
        })
    }
}

/// A delivery whose next automatic attempt the caller is to make (or to find no room for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct Due {
    #[diesel(sql_type = SqlUuid)]
    pub delivery_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub webhook_id: Uuid,
    /// Automatic attempts made so far: the claim's expected count.
    #[diesel(sql_type = Int4)]
    pub auto_attempts: i32,
}

/// Moves pending or retrying deliveries whose webhook has no room for their attempt now to
/// `waiting`, for the reason given, unless they moved on meanwhile: each `Due` holds the
/// automatic attempts the caller saw. Answers whether each moved (one waiting already stays as
/// it is).
pub async fn wait(
    conn: &mut AsyncPgConnection,
    due: &[Due],
    reason: WaitReason,
) -> Result<Vec<bool>, DbError> {
    let ids: Vec<Uuid> = due.iter().map(|d| d.delivery_id).collect();
    let expected: Vec<i32> = due.iter().map(|d| d.auto_attempts).collect();
    let (low, high) = id_bounds(&ids);
    let moved: Vec<Uuid> = Statement::new(include_str!("sql/wait.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Int4>, _>(&expected)
        .bind::<Text, _>(reason.as_str())
        .bind::<SqlUuid, _>(low)
        .bind::<SqlUuid, _>(high)
        .load::<IdRow>(conn)
        .await?
        .into_iter()
        .map(|row| row.id)
        .collect();
    Ok(ids.iter().map(|id| moved.contains(id)).collect())
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// Waiting deliveries to try now (see `sql/take_waiting.sql`): at most `room` of each webhook
/// listed, `default_room` of any other, `limit` in all, oldest first.
pub async fn take_waiting(
    conn: &mut AsyncPgConnection,
    room: &[(Uuid, i64)],
    default_room: i64,
    limit: i64,
) -> Result<Vec<Due>, DbError> {
    let (webhooks, rooms): (Vec<Uuid>, Vec<i64>) = room.iter().copied().unzip();
    Ok(Statement::new(include_str!("sql/take_waiting.sql"))
        .bind::<Array<SqlUuid>, _>(webhooks)
        .bind::<Array<Int8>, _>(rooms)
        .bind::<BigInt, _>(default_room)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?)
}

/// The delivery to make next, in its incident's order, now that delivery `finished` has
/// finished (see `sql/next_in_order.sql`).
pub async fn next_in_order(
    conn: &mut AsyncPgConnection,
    finished: Uuid,
) -> Result<Option<Due>, DbError> {
    let next: Vec<Due> = Statement::new(include_str!("sql/next_in_order.sql"))
        .bind::<SqlUuid, _>(finished)
        .load(conn)
        .await?;
    Ok(next.into_iter().next())
}

/// Fails the deliveries among `ids` that can get no more automatic attempt (their webhook
/// deleted or disabled, or their schedule used up) and have none under way; returns those it
/// failed.
pub async fn stop(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
    schedule_attempts: u8,
) -> Result<Vec<Uuid>, DbError> {
    let (low, high) = id_bounds(ids);
    Ok(Statement::new(include_str!("sql/stop.sql"))
        .bind::<Array<SqlUuid>, _>(ids)
        .bind::<Int4, _>(i32::from(schedule_attempts))
        .bind::<SqlUuid, _>(low)
        .bind::<SqlUuid, _>(high)
        .load::<IdRow>(conn)
        .await?
        .into_iter()
        .map(|row| row.id)
        .collect())
}

/// Pending or retrying deliveries overdue by more than `grace` with no attempt under way
/// (see `sql/claim_overdue.sql`); each is made due now so that it is not taken again before
/// another grace.
pub async fn claim_overdue(
    conn: &mut AsyncPgConnection,
    grace: Duration,
    limit: i64,
) -> Result<Vec<Due>, DbError> {
    Ok(Statement::new(include_str!("sql/claim_overdue.sql"))
        .bind::<BigInt, _>(millis(grace))
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?)
}

/// An attempt whose outcome was never recorded.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Interrupted {
    #[diesel(sql_type = SqlUuid)]
    pub delivery_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub webhook_id: Uuid,
    #[diesel(sql_type = Int4)]
    pub number: i32,
    #[diesel(sql_type = Text)]
    trigger: String,
    #[diesel(sql_type = Int4)]
    pub auto_attempts: i32,
    #[diesel(sql_type = diesel::sql_types::Int2)]
    max_attempts: i16,
}

impl Interrupted {
    pub fn trigger(&self) -> Trigger {
        Trigger::parse(&self.trigger).unwrap_or(Trigger::Manual)
    }

    /// The webhook's `max_attempts`.
    pub fn max_attempts(&self) -> u8 {
        u8::try_from(self.max_attempts).unwrap_or(1)
    }
}

/// Attempts whose dispatcher stopped before recording their outcome (see
/// `sql/interrupted.sql`): automatic ones whose lease ended more than `grace` ago, manual ones
/// started more than `manual_after` ago.
pub async fn interrupted(
    conn: &mut AsyncPgConnection,
    grace: Duration,
    manual_after: Duration,
    limit: i64,
) -> Result<Vec<Interrupted>, DbError> {
    Ok(Statement::new(include_str!("sql/interrupted.sql"))
        .bind::<BigInt, _>(millis(grace))
        .bind::<BigInt, _>(millis(manual_after))
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?)
}

/// The least and the greatest of `ids` (nil for none), bounding a statement's reads by id so
/// that PostgreSQL reads only the day partitions between them: an `= ANY` of an array, or a join
/// on one, prunes no partition.
pub(crate) fn id_bounds(ids: &[Uuid]) -> (Uuid, Uuid) {
    let low = ids.iter().min().copied().unwrap_or_default();
    let high = ids.iter().max().copied().unwrap_or_default();
    (low, high)
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A count of the deliveries holding one value of a column.
#[derive(QueryableByName)]
struct Counted {
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    value: Option<String>,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How many deliveries are in each unfinished state. The states are literals of the text (the
/// predicates of the partial indexes `deliveries_due` and `deliveries_waiting`), so that
/// PostgreSQL reads them by index on an empty log or a large one (`plans.rs`): a generic plan
/// of `state = ANY($1)` could not tell how few rows the states hold, and read every partition
/// whole.
pub async fn count_unfinished(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<(DeliveryState, i64)>, DbError> {
    let rows: Vec<Counted> = Statement::new(
        "SELECT state AS value, count(*) AS n FROM deliveries \
         WHERE state IN ('pending', 'retrying') GROUP BY state \
         UNION ALL SELECT 'waiting', count(*) FROM deliveries WHERE state = 'waiting'",
    )
    .load(conn)
    .await?;
    Ok(DeliveryState::UNFINISHED
        .into_iter()
        .map(|state| (state, counted(&rows, state.as_str())))
        .collect())
}

/// How many deliveries are `waiting`, for each reason (the state a literal, as above).
pub async fn count_waiting(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<(WaitReason, i64)>, DbError> {
    let rows: Vec<Counted> = Statement::new(
        "SELECT wait_reason AS value, count(*) AS n FROM deliveries \
         WHERE state = 'waiting' GROUP BY wait_reason",
    )
    .load(conn)
    .await?;
    Ok(WaitReason::ALL
        .into_iter()
        .map(|reason| (reason, counted(&rows, reason.as_str())))
        .collect())
}

fn counted(rows: &[Counted], value: &str) -> i64 {
    rows.iter()
        .filter(|row| row.value.as_deref() == Some(value))
        .map(|row| row.n)
        .sum()
}

/// One delivery.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Delivery, DbError> {
    let row = deliveries::table.find(id).select(DeliveryRow::as_select());
    found(row.first(conn).await.optional()?)
}

/// Filters of the delivery log.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub webhook_id: Option<Uuid>,
    pub state: Option<DeliveryState>,
    pub event: Option<EventKind>,
    pub incident_id: Option<Uuid>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
}

/// The delivery log, newest first. The cursor is (created_at, id) of the last item, so pages
/// stay stable while new deliveries arrive.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &DeliveryFilter,
    page: &Page,
) -> Result<(Vec<Delivery>, Option<Cursor>), DbError> {
    let mut query = deliveries::table
        .select(DeliveryRow::as_select())
        .order((deliveries::created_at.desc(), deliveries::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(webhook_id) = filter.webhook_id {
        query = query.filter(deliveries::webhook_id.eq(webhook_id));
    }
    if let Some(state) = filter.state {
        query = query.filter(deliveries::state.eq(state.as_str()));
    }
    if let Some(event) = filter.event {
        query = query.filter(deliveries::event.eq(event.as_str()));
    }
    if let Some(incident_id) = filter.incident_id {
        query = query.filter(deliveries::incident_id.eq(incident_id));
    }
    if let Some(since) = filter.since {
        query = query.filter(deliveries::created_at.ge(since));
    }
    if let Some(until) = filter.until {
        query = query.filter(deliveries::created_at.lt(until));
    }
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("deliveries"));
    }
    let rows: Vec<DeliveryRow> = query.load(conn).await?;
    page.finish(rows)
}

/// One logged attempt. An attempt is logged when it is claimed, before its request is sent,
/// and its outcome is filled in once known.
#[derive(Debug, Clone, Queryable)]
pub struct Attempt {
    pub number: i32,
    pub trigger: String,
    pub started_at: OffsetDateTime,
    /// `None` while the attempt is under way.
    pub success: Option<bool>,
    pub status_code: Option<i32>,
    pub duration_ms: Option<i32>,
    pub error: Option<String>,
    pub error_detail: Option<String>,
    pub request_headers: serde_json::Value,
    pub response_body: Option<String>,
    pub response_truncated: bool,
}

/// A delivery with its request body and every attempt, oldest first.
#[derive(Debug, Clone)]
pub struct DeliveryDetail {
    pub delivery: Delivery,
    pub request_body: String,
    pub attempts: Vec<Attempt>,
    /// For a delivery waiting for its incident's order, the earlier delivery it waits for.
    pub waits_for: Option<Uuid>,
}

/// One delivery with its attempts.
pub async fn get_detail(conn: &mut AsyncPgConnection, id: Uuid) -> Result<DeliveryDetail, DbError> {
    // One snapshot for the delivery and its attempts: read apart, an attempt committed between
    // the two reads would show beside the state from before it.
    conn.build_transaction()
        .read_only()
        .repeatable_read()
        .run(async |conn| read_detail(conn, id).await)
        .await
}

async fn read_detail(conn: &mut AsyncPgConnection, id: Uuid) -> Result<DeliveryDetail, DbError> {
    let delivery = get(conn, id).await?;
    let request_body: String = events::table
        .find(delivery.event_id)
        .select(events::body)
        .first(conn)
        .await?;
    let attempts = attempts::table
        .filter(attempts::delivery_id.eq(id))
        .order(attempts::number)
        .select((
            attempts::number,
            attempts::trigger,
            attempts::started_at,
            attempts::success,
            attempts::status_code,
            attempts::duration_ms,
            attempts::error,
            attempts::error_detail,
            attempts::request_headers,
            attempts::response_body,
            attempts::response_truncated,
        ))
        .load(conn)
        .await?;
    #[derive(QueryableByName)]
    struct Earlier {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
    }
    let waits_for = if delivery.wait_reason == Some(WaitReason::Ordering) {
        let earlier: Vec<Earlier> = Statement::new(include_str!("sql/waits_for.sql"))
            .bind::<SqlUuid, _>(id)
            .load(conn)
            .await?;
        earlier.into_iter().next().map(|e| e.id)
    } else {
        None
    };
    Ok(DeliveryDetail {
        delivery,
        request_body,
        attempts,
        waits_for,
    })
}

/// A page of the failed deliveries of a webhook created since a time, oldest first (for bulk
/// recovery, which works through any number of them a page at a time): at most `limit` after
/// `after` (a creation time and id; the first page starts at `(since, nil)`), with the
/// position of the last.
pub async fn failed_page(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    after: Cursor,
    limit: i64,
) -> Result<(Vec<Uuid>, Option<Cursor>), DbError> {
    let rows: Vec<(Uuid, OffsetDateTime)> = deliveries::table
        .filter(deliveries::webhook_id.eq(webhook_id))
        .filter(deliveries::state.eq(DeliveryState::Failed.as_str()))
        .filter(
            diesel::dsl::sql::<diesel::sql_types::Bool>(
                "(deliveries.created_at, deliveries.id) > (",
            )
            .bind::<diesel::sql_types::Timestamptz, _>(after.at)
            .sql(", ")
            .bind::<SqlUuid, _>(after.id)
            .sql(")"),
        )
        .order((deliveries::created_at.asc(), deliveries::id.asc()))
        .limit(limit)
        .select((deliveries::id, deliveries::created_at))
        .load(conn)
        .await?;
    let last = rows.last().map(|&(id, at)| Cursor::new(at, id));
    Ok((rows.into_iter().map(|(id, _)| id).collect(), last))
}

/// Makes up to `limit` of the deliveries of a webhook created since `since` that wait because
/// it was disabled when their events came due now (`pending`, or `retrying` after an earlier
/// attempt), and returns them, for their attempts to be enqueued (bulk recovery once it is
/// enabled again, a page at a time: those made due no longer wait, so the next page is the
/// next ones).
pub async fn recover_disabled(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    since: OffsetDateTime,
    limit: i64,
) -> Result<Vec<Due>, DbError> {
    Ok(Statement::new(include_str!("sql/recover_disabled.sql"))
        .bind::<SqlUuid, _>(webhook_id)
        .bind::<diesel::sql_types::Timestamptz, _>(since)
        .bind::<diesel::sql_types::BigInt, _>(limit)
        .load(conn)
        .await?)
}

/// The newest delivery of each given webhook (for the webhook list): for each, the first entry
/// of `deliveries_by_webhook`, whatever the size of the log.
pub async fn latest_for_webhooks(
    conn: &mut AsyncPgConnection,
    webhook_ids: &[Uuid],
) -> Result<Vec<Delivery>, DbError> {
    let rows: Vec<DeliveryRow> = Statement::new(
        "SELECT d.* FROM unnest($1::uuid[]) AS w(id) CROSS JOIN LATERAL (\
             SELECT * FROM deliveries d WHERE d.webhook_id = w.id \
             ORDER BY d.created_at DESC, d.id DESC LIMIT 1) d",
    )
    .bind::<Array<SqlUuid>, _>(webhook_ids)
    .load(conn)
    .await?;
    rows.into_iter().map(Delivery::try_from).collect()
}
