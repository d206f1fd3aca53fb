//! Deliveries and their attempts: the delivery log of SPEC §2.3. PostgreSQL is the source of
//! truth for each delivery's state, attempt count and next attempt time (DESIGN §2).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use super::schema::{attempts, deliveries, events, webhooks};
use super::statement::Statement;
use super::webhooks::Webhook;
use super::{Cursor, DbError, Page};
use crate::amqp::messages::Trigger;
use crate::{EventKind, RetrySchedule};

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Waiting for its first attempt.
    Pending,
    /// Failed, with an automatic attempt scheduled at `next_attempt_at`.
    Retrying,
    Succeeded,
    /// Every allowed attempt failed (or the webhook was disabled or deleted).
    Failed,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 4] = [
        DeliveryState::Pending,
        DeliveryState::Retrying,
        DeliveryState::Succeeded,
        DeliveryState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Succeeded => "succeeded",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, DeliveryState::Succeeded | DeliveryState::Failed)
    }
}

impl FromStr for DeliveryState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeliveryState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                format!("state must be one of pending, retrying, succeeded, failed (got {s:?})")
            })
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptError {
    /// No answer within the webhook's timeout.
    Timeout,
    /// The connection was refused or broke.
    Connect,
    /// The host name did not resolve.
    Dns,
    /// The TLS handshake failed.
    Tls,
    /// The target resolves to an address the SSRF rules refuse.
    Blocked,
    /// The target answered with a status other than 2xx.
    HttpStatus,
    /// The target answered with a redirect, which is never followed.
    Redirect,
    Other,
}

impl AttemptError {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptError::Timeout => "timeout",
            AttemptError::Connect => "connect",
            AttemptError::Dns => "dns",
            AttemptError::Tls => "tls",
            AttemptError::Blocked => "blocked",
            AttemptError::HttpStatus => "http_status",
            AttemptError::Redirect => "redirect",
            AttemptError::Other => "other",
        }
    }
}

#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = deliveries)]
struct DeliveryRow {
    id: Uuid,
    webhook_id: Uuid,
    event_id: Uuid,
    event: String,
    incident_id: Uuid,
    state: String,
    attempt_count: i32,
    auto_attempts: i32,
    next_attempt_at: Option<OffsetDateTime>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
}

/// A delivery of one event to one webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub event_id: Uuid,
    pub event: EventKind,
    pub incident_id: Uuid,
    pub state: DeliveryState,
    pub attempt_count: i32,
    #[serde(skip)]
    pub auto_attempts: i32,
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl TryFrom<DeliveryRow> for Delivery {
    type Error = DbError;
    fn try_from(row: DeliveryRow) -> Result<Self, DbError> {
        let corrupt = |what: &str| DbError::Corrupt(format!("delivery {}: bad {what}", row.id));
        Ok(Delivery {
            event: row.event.parse().map_err(|_| corrupt("event"))?,
            state: row.state.parse().map_err(|_| corrupt("state"))?,
            id: row.id,
            webhook_id: row.webhook_id,
            event_id: row.event_id,
            incident_id: row.incident_id,
            attempt_count: row.attempt_count,
            auto_attempts: row.auto_attempts,
            next_attempt_at: row.next_attempt_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// The deliveries of an event to each of `webhook_ids`, in that order, each created pending
/// unless it exists already (the event's own transaction creates those of subscribed webhooks).
pub async fn create_for_event(
    conn: &mut AsyncPgConnection,
    event_id: Uuid,
    kind: EventKind,
    incident_id: Uuid,
    webhook_ids: &[Uuid],
) -> Result<Vec<Uuid>, DbError> {
    let pairs: Vec<(Uuid, Uuid)> = webhook_ids.iter().map(|w| (event_id, *w)).collect();
    let meta = HashMap::from([(event_id, (kind, incident_id))]);
    insert_pending(conn, &pairs, &meta).await?;
    let existing: HashMap<Uuid, Uuid> = deliveries::table
        .filter(deliveries::event_id.eq(event_id))
        .filter(deliveries::webhook_id.eq_any(webhook_ids))
        .select((deliveries::webhook_id, deliveries::id))
        .load::<(Uuid, Uuid)>(conn)
        .await?
        .into_iter()
        .collect();
    Ok(webhook_ids
        .iter()
        .filter_map(|webhook| existing.get(webhook).copied())
        .collect())
}

/// Rows per `INSERT`: PostgreSQL takes at most 65 535 bind parameters per statement.
const INSERT_CHUNK: usize = 5_000;

/// Inserts a pending delivery for each `(event id, webhook id)` pair not delivered yet.
async fn insert_pending(
    conn: &mut AsyncPgConnection,
    pairs: &[(Uuid, Uuid)],
    meta: &HashMap<Uuid, (EventKind, Uuid)>,
) -> Result<(), DbError> {
    let now = OffsetDateTime::now_utc();
    // In key order, so that concurrent batches wait for each other's rows in one order.
    let mut pairs = pairs.to_vec();
    pairs.sort_unstable();
    for chunk in pairs.chunks(INSERT_CHUNK) {
        let rows: Vec<_> = chunk
            .iter()
            .filter_map(|(event_id, webhook_id)| {
                let (kind, incident_id) = meta.get(event_id)?;
                Some((
                    deliveries::id.eq(Uuid::now_v7()),
                    deliveries::webhook_id.eq(*webhook_id),
                    deliveries::event_id.eq(*event_id),
                    deliveries::event.eq(kind.as_str()),
                    deliveries::incident_id.eq(*incident_id),
                    deliveries::state.eq(DeliveryState::Pending.as_str()),
                    deliveries::next_attempt_at.eq(Some(now)),
                    deliveries::created_at.eq(now),
                    deliveries::updated_at.eq(now),
                ))
            })
            .collect();
        diesel::insert_into(deliveries::table)
            .values(&rows)
            .on_conflict((deliveries::event_id, deliveries::webhook_id))
            .do_nothing()
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// An event to fan out: one delivery per enabled webhook subscribed to its kind, or for a test
/// event, to its one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOut {
    pub event_id: Uuid,
    pub kind: EventKind,
    pub incident_id: Uuid,
    pub test_webhook_id: Option<Uuid>,
    /// The broker delivered the event before: the last try may have committed its deliveries
    /// and died before enqueueing them, so every one still waiting for its first attempt is
    /// enqueued again.
    pub redelivered: bool,
}

/// What fanning out one event did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FannedOut {
    /// Deliveries created now.
    pub created: usize,
    /// Deliveries held now instead, their webhooks being marked slow (see [`release_held`]).
    pub held: usize,
    /// Deliveries to enqueue for their first attempt.
    pub to_enqueue: Vec<Waiting>,
}

/// A delivery waiting for its first attempt, and the webhook it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct Waiting {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub delivery_id: Uuid,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub webhook_id: Uuid,
}

/// Fans out several events with one statement (the dispatcher gathers the events it receives
/// concurrently): subscribers are found and their deliveries inserted in one round trip. An
/// event given twice is fanned out once; its second copy gets nothing to enqueue.
///
/// No transaction spans the statement and the follow-up read of a redelivered event: the
/// insert is idempotent, and a redelivered event re-enqueues whatever still waits for its first
/// attempt, so a failure between the two loses nothing.
pub async fn fan_out(
    conn: &mut AsyncPgConnection,
    events: &[FanOut],
) -> Result<Vec<FannedOut>, DbError> {
    use diesel::sql_types::{Array, Nullable, Text, Timestamptz};
    let mut first_copy: HashMap<Uuid, usize> = HashMap::new();
    for (index, event) in events.iter().enumerate() {
        first_copy.entry(event.event_id).or_insert(index);
    }
    let firsts: Vec<&FanOut> = events
        .iter()
        .enumerate()
        .filter(|(index, event)| first_copy.get(&event.event_id) == Some(index))
        .map(|(_, event)| event)
        .collect();
    let ids: Vec<Uuid> = firsts.iter().map(|e| e.event_id).collect();
    let kinds: Vec<&str> = firsts.iter().map(|e| e.kind.as_str()).collect();
    let incidents: Vec<Uuid> = firsts.iter().map(|e| e.incident_id).collect();
    let tests: Vec<Option<Uuid>> = firsts.iter().map(|e| e.test_webhook_id).collect();
    let created: Vec<CreatedDelivery> = Statement::new(FAN_OUT_SQL)
        .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<diesel::sql_types::Uuid>, _>(&incidents)
        .bind::<Array<Nullable<diesel::sql_types::Uuid>>, _>(&tests)
        .bind::<Timestamptz, _>(OffsetDateTime::now_utc())
        .load(conn)
        .await?;
    let mut results = vec![FannedOut::default(); events.len()];
    for row in created {
        if let Some(&index) = first_copy.get(&row.event_id) {
            let Some(delivery_id) = row.id else {
                results[index].held += 1;
                continue;
            };
            results[index].created += 1;
            results[index].to_enqueue.push(Waiting {
                delivery_id,
                webhook_id: row.webhook_id,
            });
        }
    }
    for (index, event) in events.iter().enumerate() {
        if event.redelivered && first_copy.get(&event.event_id) == Some(&index) {
            results[index].to_enqueue = waiting_for_first_attempt(conn, event.event_id).await?;
        }
    }
    Ok(results)
}

#[derive(QueryableByName)]
struct CreatedDelivery {
    /// `None` for a pair held instead.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Uuid>)]
    id: Option<Uuid>,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    event_id: Uuid,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    webhook_id: Uuid,
}

/// A new delivery's id in SQL: a UUIDv7 (a millisecond timestamp, then random bits), like
/// those made in Rust.
macro_rules! uuid_v7_sql {
    () => {
        "encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid"
    };
}
pub(crate) use uuid_v7_sql;

/// The outbox row that asks for a new delivery's first attempt, as `(topic, headers,
/// payload)` columns from `d` (the delivery: `id`, `webhook_id`): the message the dispatcher's
/// own fan-out publishes ([`crate::amqp::messages::DeliveryMessage`], attempt 1, automatic),
/// with the webhook's id in a header so that a dispatcher can defer an attempt to a slow
/// webhook without loading the delivery. A held pair gets none (see [`hold_sql`]).
macro_rules! first_attempt_outbox_sql {
    () => {
        "'delivery',
        jsonb_build_object('tocsin-attempt', 1, 'tocsin-trigger', 'automatic',
            'tocsin-webhook', d.webhook_id::text),
        convert_to(jsonb_build_object('delivery_id', d.id)::text, 'UTF8')"
    };
}
pub(crate) use first_attempt_outbox_sql;

/// Where a fan-out's targets (`t`: `webhook_id`, `event_id`, `slow_until`) go: a webhook that
/// a dispatcher has marked slow (its `slow_until`, set from PostgreSQL's clock, is ahead of
/// `now()`) gets no delivery now but a row in `held_deliveries`, the pair and the time `$now`,
/// with no outbox row and no broker message: the narrowest write that keeps the event for it.
/// Once the mark lapses a dispatcher releases those rows into pending deliveries
/// ([`release_held`]). This is the `held` CTE of a fan-out, reading `targets`.
macro_rules! hold_sql {
    ($now:literal) => {
        concat!(
            "held AS (
    INSERT INTO held_deliveries (webhook_id, event_id, held_at)
    SELECT t.webhook_id, t.event_id, ",
            $now,
            "
    FROM targets t
    WHERE t.slow_until > now()
    ORDER BY t.webhook_id, t.event_id
    ON CONFLICT (webhook_id, event_id) DO NOTHING
    RETURNING webhook_id, event_id
)"
        )
    };
}
pub(crate) use hold_sql;

/// The condition on a fan-out's target `t` for a delivery now: its webhook is not marked slow
/// (see [`hold_sql`]).
macro_rules! not_held_sql {
    () => {
        "NOT coalesce(t.slow_until > now(), false)"
    };
}
pub(crate) use not_held_sql;

/// Fan-out of the events in `$1`..`$4` (ids, kinds, incident ids, test webhook ids) at `$5`,
/// followed by `$rest`, which may read the new deliveries from `created` (`id`, `event_id`,
/// `webhook_id`), the held pairs from `held` (`webhook_id`, `event_id`) and the events,
/// numbered in the order given, from `input` (`arrival`). `$rest` is one or more string
/// literals or macros expanding to one.
///
/// One pending delivery per (event, target): every enabled, undeleted webhook subscribed to the
/// event's kind, or for a test event its one undeleted webhook; held instead while the webhook
/// is marked slow ([`hold_sql`]). Rows are inserted in key order, so that concurrent fan-outs
/// wait for each other's rows in one order.
macro_rules! fan_out_sql {
    ($($rest:expr),+) => {
        concat!(
            "\
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[]) WITH ORDINALITY
        AS v(event_id, kind, incident_id, test_webhook_id, arrival)
), targets AS (
    SELECT v.event_id, v.kind, v.incident_id, w.id AS webhook_id, w.slow_until
    FROM input v JOIN webhooks w
        ON w.deleted_at IS NULL AND w.enabled AND w.events @> ARRAY[v.kind]
    WHERE v.test_webhook_id IS NULL
    UNION ALL
    SELECT v.event_id, v.kind, v.incident_id, w.id, w.slow_until
    FROM input v JOIN webhooks w ON w.id = v.test_webhook_id AND w.deleted_at IS NULL
), created AS (
    INSERT INTO deliveries
        (id, webhook_id, event_id, event, incident_id, state, next_attempt_at, created_at,
         updated_at)
    SELECT ",
            uuid_v7_sql!(),
            ",
        t.webhook_id, t.event_id, t.kind, t.incident_id, 'pending', $5, $5, $5
    FROM targets t
    WHERE ",
            not_held_sql!(),
            "
    ORDER BY t.event_id, t.webhook_id
    ON CONFLICT (event_id, webhook_id) DO NOTHING
    RETURNING id, event_id, webhook_id
), ",
            hold_sql!("$5"),
            "
",
            $($rest),+
        )
    };
}

/// The dispatcher's fan-out of an event message: the deliveries it created, to enqueue.
const FAN_OUT_SQL: &str = fan_out_sql!(
    "SELECT id, event_id, webhook_id FROM created
UNION ALL
SELECT NULL, event_id, webhook_id FROM held"
);

/// Fan-out in the transaction that records the events: the deliveries, and an outbox row for
/// the first attempt of each, events in the order given.
pub(crate) const FAN_OUT_TO_OUTBOX_SQL: &str = fan_out_sql!(
    "INSERT INTO outbox (topic, headers, payload)
SELECT ",
    first_attempt_outbox_sql!(),
    "
FROM created d JOIN input v ON v.event_id = d.event_id
ORDER BY v.arrival, d.webhook_id"
);

/// Everything needed to make an attempt.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    pub delivery: Delivery,
    pub webhook: Webhook,
    /// The exact body to send.
    pub body: String,
    /// When the event happened (for the end-to-end lag).
    pub occurred_at: OffsetDateTime,
    /// Whether this is a test event sent from the settings.
    pub test: bool,
}

/// Loads a delivery with its webhook and event body, in one query.
pub async fn load_job(conn: &mut AsyncPgConnection, id: Uuid) -> Result<DeliveryJob, DbError> {
    load_jobs(conn, &[id])
        .await?
        .pop()
        .flatten()
        .ok_or(DbError::NotFound)
}

/// Loads several deliveries as [`load_job`] does, in one query (the dispatcher gathers the
/// deliveries it receives concurrently). Answers per id, `None` for an unknown one.
pub async fn load_jobs(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<Vec<Option<DeliveryJob>>, DbError> {
    let rows: Vec<(
        DeliveryRow,
        super::webhooks::WebhookRow,
        String,
        OffsetDateTime,
        Option<Uuid>,
    )> = deliveries::table
        .inner_join(webhooks::table)
        .inner_join(events::table)
        .filter(deliveries::id.eq_any(ids))
        .select((
            DeliveryRow::as_select(),
            super::webhooks::WebhookRow::as_select(),
            events::body,
            events::occurred_at,
            events::test_webhook_id,
        ))
        .load(conn)
        .await?;
    let mut jobs = HashMap::with_capacity(rows.len());
    for (delivery, webhook, body, occurred_at, test_webhook_id) in rows {
        let job = DeliveryJob {
            delivery: delivery.try_into()?,
            webhook: webhook.try_into()?,
            body,
            occurred_at,
            test: test_webhook_id.is_some(),
        };
        jobs.insert(job.delivery.id, job);
    }
    Ok(ids.iter().map(|id| jobs.get(id).cloned()).collect())
}

/// Deliveries of an event that still wait for their first attempt (to re-enqueue them when
/// the event is redelivered after a crash).
pub async fn waiting_for_first_attempt(
    conn: &mut AsyncPgConnection,
    event_id: Uuid,
) -> Result<Vec<Waiting>, DbError> {
    let rows: Vec<(Uuid, Uuid)> = deliveries::table
        .filter(deliveries::event_id.eq(event_id))
        .filter(deliveries::state.eq(DeliveryState::Pending.as_str()))
        .filter(deliveries::attempt_count.eq(0))
        .select((deliveries::id, deliveries::webhook_id))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(delivery_id, webhook_id)| Waiting {
            delivery_id,
            webhook_id,
        })
        .collect())
}

/// One delivery.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Delivery, DbError> {
    deliveries::table
        .find(id)
        .select(DeliveryRow::as_select())
        .first(conn)
        .await
        .optional()?
        .ok_or(DbError::NotFound)?
        .try_into()
}

/// An attempt about to be logged.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub trigger: Trigger,
    pub started_at: OffsetDateTime,
    pub success: bool,
    pub status_code: Option<u16>,
    pub duration_ms: i32,
    pub error: Option<AttemptError>,
    pub error_detail: Option<String>,
    pub request_headers: serde_json::Value,
    pub response_body: Option<String>,
    pub response_truncated: bool,
}

/// The state a delivery moves to after an attempt, and when its next automatic attempt is due.
///
/// A failed automatic attempt with attempts left (the webhook's `max_attempts`, cut to the
/// schedule's length) is `retrying` after the schedule's next delay; after the last it is
/// `failed`. A manual attempt never restarts nor cuts short the automatic schedule.
pub fn next_state(
    delivery: &Delivery,
    trigger: Trigger,
    success: bool,
    max_attempts: u8,
    schedule: &RetrySchedule,
    now: OffsetDateTime,
) -> (DeliveryState, Option<OffsetDateTime>) {
    if success {
        return (DeliveryState::Succeeded, None);
    }
    let allowed = max_attempts.min(schedule.attempts());
    let made = u8::try_from(delivery.auto_attempts).unwrap_or(u8::MAX);
    match trigger {
        Trigger::Automatic if made.saturating_add(1) < allowed => {
            let delay = schedule.delay_before(made + 2).unwrap_or_default();
            let delay = time::Duration::try_from(delay).unwrap_or(time::Duration::ZERO);
            (DeliveryState::Retrying, Some(now + delay))
        }
        Trigger::Automatic => (DeliveryState::Failed, None),
        Trigger::Manual => match delivery.state {
            DeliveryState::Pending | DeliveryState::Retrying => {
                (delivery.state, delivery.next_attempt_at)
            }
            DeliveryState::Succeeded | DeliveryState::Failed => (DeliveryState::Failed, None),
        },
    }
}

/// An attempt to log and the delivery's move after it (see [`record_attempt`]).
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub delivery_id: Uuid,
    /// For an automatic attempt, the automatic attempts the caller saw.
    pub expected_auto_attempts: Option<i32>,
    pub attempt: NewAttempt,
    pub state: DeliveryState,
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// Logs an attempt and moves the delivery, in one transaction. For an automatic attempt,
/// `expected_auto_attempts` is the count the caller saw: if another worker has logged that
/// attempt meanwhile, nothing is written and `Ok(None)` is returned. Returns the updated delivery.
pub async fn record_attempt(
    conn: &mut AsyncPgConnection,
    delivery_id: Uuid,
    expected_auto_attempts: Option<i32>,
    attempt: &NewAttempt,
    state: DeliveryState,
    next_attempt_at: Option<OffsetDateTime>,
) -> Result<Option<Delivery>, DbError> {
    let record = AttemptRecord {
        delivery_id,
        expected_auto_attempts,
        attempt: attempt.clone(),
        state,
        next_attempt_at,
    };
    Ok(record_attempts(conn, std::slice::from_ref(&record))
        .await?
        .pop()
        .flatten())
}

/// Logs several attempts as [`record_attempt`] does each (the dispatcher gathers the attempts
/// that finish concurrently): one statement moves the deliveries and inserts the attempt rows,
/// a single round trip that commits on its own.
pub async fn record_attempts(
    conn: &mut AsyncPgConnection,
    records: &[AttemptRecord],
) -> Result<Vec<Option<Delivery>>, DbError> {
    let rounds = rounds(records);
    let mut answers = vec![None; records.len()];
    if let [round] = rounds.as_slice() {
        record_round(conn, records, round, &mut answers).await?;
        return Ok(answers);
    }
    // A delivery given twice (a duplicate message) is logged in rounds, so that its second
    // copy sees what the first did; the rounds share one transaction, so that a batch retried
    // item by item after a failure does not log a manual attempt twice.
    conn.transaction::<_, DbError, _>(async |conn| {
        for round in &rounds {
            record_round(conn, records, round, &mut answers).await?;
        }
        Ok(answers)
    })
    .await
}

/// Splits record indexes into rounds, each holding the first copy of each delivery left.
fn rounds(records: &[AttemptRecord]) -> Vec<Vec<usize>> {
    let mut rounds = Vec::new();
    let mut left: Vec<usize> = (0..records.len()).collect();
    while !left.is_empty() {
        let mut seen = std::collections::HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = left
            .into_iter()
            .partition(|&index| seen.insert(records[index].delivery_id));
        rounds.push(round);
        left = later;
    }
    rounds
}

/// Logs `records[index]` for each of `indexes` (distinct deliveries) with one statement,
/// writing each moved delivery into `answers`.
async fn record_round(
    conn: &mut AsyncPgConnection,
    records: &[AttemptRecord],
    indexes: &[usize],
    answers: &mut [Option<Delivery>],
) -> Result<(), DbError> {
    use diesel::sql_types::{Array, Bool, Int4, Jsonb, Nullable, Text, Timestamptz};
    let round: Vec<&AttemptRecord> = indexes.iter().map(|&index| &records[index]).collect();
    let ids: Vec<Uuid> = round.iter().map(|r| r.delivery_id).collect();
    let expected: Vec<Option<i32>> = round.iter().map(|r| r.expected_auto_attempts).collect();
    let auto_increment: Vec<i32> = round
        .iter()
        .map(|r| i32::from(r.attempt.trigger == Trigger::Automatic))
        .collect();
    let states: Vec<&str> = round.iter().map(|r| r.state.as_str()).collect();
    let next: Vec<Option<OffsetDateTime>> = round.iter().map(|r| r.next_attempt_at).collect();
    let attempts: Vec<&NewAttempt> = round.iter().map(|r| &r.attempt).collect();
    let triggers: Vec<&str> = attempts.iter().map(|a| a.trigger.as_str()).collect();
    let started: Vec<OffsetDateTime> = attempts.iter().map(|a| a.started_at).collect();
    let success: Vec<bool> = attempts.iter().map(|a| a.success).collect();
    let status: Vec<Option<i32>> = attempts
        .iter()
        .map(|a| a.status_code.map(i32::from))
        .collect();
    let duration: Vec<i32> = attempts.iter().map(|a| a.duration_ms).collect();
    let errors: Vec<Option<&str>> = attempts
        .iter()
        .map(|a| a.error.map(AttemptError::as_str))
        .collect();
    let details: Vec<Option<&str>> = attempts.iter().map(|a| a.error_detail.as_deref()).collect();
    let headers: Vec<&serde_json::Value> = attempts.iter().map(|a| &a.request_headers).collect();
    let bodies: Vec<Option<&str>> = attempts
        .iter()
        .map(|a| a.response_body.as_deref())
        .collect();
    let truncated: Vec<bool> = attempts.iter().map(|a| a.response_truncated).collect();
    let updated: Vec<DeliveryRow> = Statement::new(RECORD_ATTEMPTS_SQL)
        .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
        .bind::<Array<Nullable<Int4>>, _>(&expected)
        .bind::<Array<Int4>, _>(&auto_increment)
        .bind::<Array<Text>, _>(&states)
        .bind::<Array<Nullable<Timestamptz>>, _>(&next)
        .bind::<Timestamptz, _>(OffsetDateTime::now_utc())
        .bind::<Array<Text>, _>(&triggers)
        .bind::<Array<Timestamptz>, _>(&started)
        .bind::<Array<Bool>, _>(&success)
        .bind::<Array<Nullable<Int4>>, _>(&status)
        .bind::<Array<Int4>, _>(&duration)
        .bind::<Array<Nullable<Text>>, _>(&errors)
        .bind::<Array<Nullable<Text>>, _>(&details)
        .bind::<Array<Jsonb>, _>(&headers)
        .bind::<Array<Nullable<Text>>, _>(&bodies)
        .bind::<Array<Bool>, _>(&truncated)
        .load(conn)
        .await?;
    let updated: HashMap<Uuid, DeliveryRow> =
        updated.into_iter().map(|row| (row.id, row)).collect();
    for (&index, record) in indexes.iter().zip(&round) {
        if let Some(row) = updated.get(&record.delivery_id) {
            answers[index] = Some(row.clone().try_into()?);
        }
    }
    Ok(())
}

/// Moves a batch of deliveries after their attempts and logs each attempt, numbered by the
/// delivery's new attempt count. Rows are locked in id order, as everywhere deliveries are
/// locked in bulk, so that concurrent batches cannot deadlock. An automatic attempt only moves
/// a delivery whose automatic attempts are still those the caller saw (another worker may have
/// logged that attempt meanwhile); its attempt row is then not written either.
const RECORD_ATTEMPTS_SQL: &str = "\
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::timestamptz[],
            $7::text[], $8::timestamptz[], $9::bool[], $10::int4[], $11::int4[], $12::text[],
            $13::text[], $14::jsonb[], $15::text[], $16::bool[])
        AS v(id, expected, auto_increment, state, next_attempt_at,
            trigger, started_at, success, status_code, duration_ms, error,
            error_detail, request_headers, response_body, response_truncated)
), locked AS (
    SELECT d.id FROM deliveries d JOIN input v ON v.id = d.id ORDER BY d.id FOR UPDATE OF d
), moved AS (
    UPDATE deliveries AS d SET
        attempt_count = d.attempt_count + 1,
        auto_attempts = d.auto_attempts + v.auto_increment,
        state = v.state,
        next_attempt_at = v.next_attempt_at,
        updated_at = $6
    FROM input v, locked l
    WHERE d.id = v.id AND l.id = d.id AND (v.expected IS NULL OR d.auto_attempts = v.expected)
    RETURNING d.id, d.webhook_id, d.event_id, d.event, d.incident_id, d.state, d.attempt_count,
        d.auto_attempts, d.next_attempt_at, d.created_at, d.updated_at
), logged AS (
    INSERT INTO attempts (delivery_id, number, trigger, started_at, success, status_code,
        duration_ms, error, error_detail, request_headers, response_body, response_truncated)
    SELECT m.id, m.attempt_count, v.trigger, v.started_at, v.success, v.status_code,
        v.duration_ms, v.error, v.error_detail, v.request_headers, v.response_body,
        v.response_truncated
    FROM moved m JOIN input v ON v.id = m.id
)
SELECT * FROM moved";

/// Marks a delivery failed without an attempt (its webhook is gone or disabled).
pub async fn mark_failed(conn: &mut AsyncPgConnection, id: Uuid) -> Result<(), DbError> {
    mark_failed_all(conn, &[id]).await.map(|_| ())
}

/// [`mark_failed`] for several deliveries in one statement (the dispatcher gathers those it
/// stops concurrently: a deleted webhook's deferred deliveries all come back at once). Answers
/// one `()` per id; a delivery finished already is left as it is.
pub async fn mark_failed_all(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<Vec<()>, DbError> {
    diesel::update(
        deliveries::table
            .filter(deliveries::id.eq_any(ids))
            .filter(deliveries::state.eq_any(["pending", "retrying"])),
    )
    .set((
        deliveries::state.eq(DeliveryState::Failed.as_str()),
        deliveries::next_attempt_at.eq(None::<OffsetDateTime>),
        deliveries::updated_at.eq(OffsetDateTime::now_utc()),
    ))
    .execute(conn)
    .await?;
    Ok(vec![(); ids.len()])
}

/// Unfinished deliveries whose next attempt is overdue by more than `grace`: the sweeper
/// re-enqueues them. Their `next_attempt_at` is pushed `grace` ahead so they are not taken twice.
/// Returns `(delivery id, automatic attempts made)`.
///
/// A delivery waiting for its first automatic attempt has that attempt's message in the outbox,
/// written with it. While the outbox holds rows older than `grace` that are not published yet
/// (RabbitMQ was down, the relays are catching up), such deliveries are left to the relays:
/// sent by both, they would reach the delivery queue twice. Held deliveries are not rows of
/// `deliveries` yet: [`release_held`] makes them so.
pub async fn claim_overdue(
    conn: &mut AsyncPgConnection,
    grace: std::time::Duration,
    limit: i64,
) -> Result<Vec<(Uuid, i32)>, DbError> {
    use super::schema::outbox;
    use diesel::IntoSql;
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let grace = time::Duration::try_from(grace).unwrap_or(time::Duration::MINUTE);
        let relays_behind: bool = diesel::select(diesel::dsl::exists(
            outbox::table
                .filter(outbox::published_at.is_null())
                .filter(outbox::created_at.lt(now - grace)),
        ))
        .get_result(conn)
        .await?;
        let due: Vec<(Uuid, i32)> = deliveries::table
            .filter(deliveries::state.eq_any(["pending", "retrying"]))
            .filter(deliveries::next_attempt_at.lt(now - grace))
            .filter(
                deliveries::state
                    .ne("pending")
                    .or(deliveries::auto_attempts.gt(0))
                    .or((!relays_behind).into_sql::<diesel::sql_types::Bool>()),
            )
            .order(deliveries::next_attempt_at)
            .limit(limit)
            .select((deliveries::id, deliveries::auto_attempts))
            .for_update()
            .skip_locked()
            .load(conn)
            .await?;
        let ids: Vec<Uuid> = due.iter().map(|(id, _)| *id).collect();
        diesel::update(deliveries::table.filter(deliveries::id.eq_any(&ids)))
            .set(deliveries::next_attempt_at.eq(now + grace))
            .execute(conn)
            .await?;
        Ok(due)
    })
    .await
}

/// Releases up to `limit` held deliveries whose webhook is no longer marked slow, at most its
/// quota of each webhook's, oldest event first (event ids are UUIDv7s): each held pair becomes
/// a pending delivery, due now, created at the time it was held (so the delivery log shows it
/// in its place), and is returned for the caller to enqueue. The per-webhook quota paces a backlog held for a webhook that may
/// still hang: the caller starts it small and lets it grow while the webhook answers (the
/// dispatcher's `held` module). A pair that has its delivery already (its event was fanned out
/// again while the webhook was not marked) is only dropped. Candidates are found webhook by
/// webhook (the key of `held_deliveries`), so a large backlog held for a webhook still marked
/// costs nothing here. The pairs taken are locked with `FOR UPDATE SKIP LOCKED` and deleted,
/// so several dispatchers releasing at once take different pairs and never wait for each other,
/// and each pair becomes one delivery.
/// Released deliveries whose messages are then lost are pending first attempts like any other,
/// and the sweeper enqueues them.
pub async fn release_held(
    conn: &mut AsyncPgConnection,
    limit: i64,
    quota: &ReleaseQuota,
) -> Result<Vec<Waiting>, DbError> {
    let (webhooks, quotas): (Vec<Uuid>, Vec<i64>) = quota.webhooks.iter().copied().unzip();
    Ok(Statement::new(RELEASE_HELD_SQL)
        .bind::<diesel::sql_types::BigInt, _>(limit)
        .bind::<diesel::sql_types::BigInt, _>(quota.default)
        .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(webhooks)
        .bind::<diesel::sql_types::Array<diesel::sql_types::BigInt>, _>(quotas)
        .load(conn)
        .await?)
}

/// How many held deliveries of each webhook one [`release_held`] may release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseQuota {
    /// For a webhook not in `webhooks`.
    pub default: i64,
    pub webhooks: Vec<(Uuid, i64)>,
}

impl ReleaseQuota {
    /// The same quota for every webhook.
    pub fn each(n: i64) -> Self {
        ReleaseQuota {
            default: n,
            webhooks: Vec::new(),
        }
    }
}

/// The insert into `deliveries` of the pairs in `taken` (`webhook_id`, `event_id`, `held_at`:
/// rows just deleted from `held_deliveries`), each in state `$state` with `$next_attempt_at`,
/// updated at `$now` and created at the time it was held. A pair whose delivery exists already
/// is dropped. Shared by the release and by stopping a webhook's deliveries.
macro_rules! deliveries_from_held_sql {
    ($state:literal, $next_attempt_at:literal, $now:literal) => {
        concat!(
            "INSERT INTO deliveries
    (id, webhook_id, event_id, event, incident_id, state, next_attempt_at, created_at,
     updated_at)
SELECT ",
            uuid_v7_sql!(),
            ",
    t.webhook_id, t.event_id, e.kind, e.incident_id, '",
            $state,
            "', ",
            $next_attempt_at,
            ", t.held_at, ",
            $now,
            "
FROM taken t JOIN events e ON e.id = t.event_id
ORDER BY t.event_id, t.webhook_id
ON CONFLICT (event_id, webhook_id) DO NOTHING"
        )
    };
}
pub(crate) use deliveries_from_held_sql;

const RELEASE_HELD_SQL: &str = concat!(
    "\
WITH candidates AS (
    SELECT held.webhook_id, held.event_id, held.held_at
    FROM webhooks w CROSS JOIN LATERAL (
        SELECT h.webhook_id, h.event_id, h.held_at FROM held_deliveries h
        WHERE h.webhook_id = w.id
        ORDER BY h.event_id
        LIMIT least($1, coalesce(
            (SELECT q.n FROM unnest($3::uuid[], $4::bigint[]) AS q(webhook_id, n)
             WHERE q.webhook_id = w.id LIMIT 1),
            $2))
        FOR UPDATE OF h SKIP LOCKED
    ) held
    WHERE NOT coalesce(w.slow_until > now(), false)
    ORDER BY held.event_id
    LIMIT $1
), taken AS (
    DELETE FROM held_deliveries h USING candidates c
    WHERE h.webhook_id = c.webhook_id AND h.event_id = c.event_id
    RETURNING h.webhook_id, h.event_id, h.held_at
), released AS (
",
    deliveries_from_held_sql!("pending", "now()", "now()"),
    "
    RETURNING id, webhook_id
)
SELECT id AS delivery_id, webhook_id FROM released"
);

/// How many deliveries are held (see [`release_held`]), of every webhook.
pub async fn count_held(conn: &mut AsyncPgConnection) -> Result<i64, DbError> {
    use super::schema::held_deliveries;
    Ok(held_deliveries::table.count().get_result(conn).await?)
}

/// How many deliveries are in each unfinished state (`pending`, `retrying`).
pub async fn count_unfinished(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<(DeliveryState, i64)>, DbError> {
    let rows: Vec<(String, i64)> = deliveries::table
        .filter(deliveries::state.eq_any(["pending", "retrying"]))
        .group_by(deliveries::state)
        .select((deliveries::state, diesel::dsl::count_star()))
        .load(conn)
        .await?;
    let mut counts = vec![(DeliveryState::Pending, 0), (DeliveryState::Retrying, 0)];
    for (state, n) in rows {
        if let Some(slot) = counts.iter_mut().find(|(s, _)| s.as_str() == state) {
            slot.1 = n;
        }
    }
    Ok(counts)
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
        query = query.filter(
            deliveries::created_at
                .lt(cursor.at)
                .or(deliveries::created_at
                    .eq(cursor.at)
                    .and(deliveries::id.lt(cursor.id))),
        );
    }
    let rows: Vec<DeliveryRow> = query.load(conn).await?;
    let items = rows
        .into_iter()
        .map(Delivery::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(page.split(items, |d| Cursor {
        at: d.created_at,
        id: d.id,
    }))
}

/// One logged attempt (DESIGN §4 field names).
#[derive(Debug, Clone, Serialize, Queryable)]
pub struct Attempt {
    pub number: i32,
    pub trigger: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    pub success: bool,
    pub status_code: Option<i32>,
    pub duration_ms: i32,
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
    Ok(DeliveryDetail {
        delivery,
        request_body,
        attempts,
    })
}

/// Failed deliveries of a webhook created since `since` (for bulk recovery).
pub async fn failed_since(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    since: OffsetDateTime,
) -> Result<Vec<Uuid>, DbError> {
    Ok(deliveries::table
        .filter(deliveries::webhook_id.eq(webhook_id))
        .filter(deliveries::state.eq(DeliveryState::Failed.as_str()))
        .filter(deliveries::created_at.ge(since))
        .select(deliveries::id)
        .load(conn)
        .await?)
}

/// The newest delivery of each given webhook (for the webhook list).
pub async fn latest_for_webhooks(
    conn: &mut AsyncPgConnection,
    webhook_ids: &[Uuid],
) -> Result<Vec<Delivery>, DbError> {
    let rows: Vec<DeliveryRow> = deliveries::table
        .filter(deliveries::webhook_id.eq_any(webhook_ids))
        .distinct_on(deliveries::webhook_id)
        .order((deliveries::webhook_id, deliveries::created_at.desc()))
        .select(DeliveryRow::as_select())
        .load(conn)
        .await?;
    rows.into_iter().map(Delivery::try_from).collect()
}

/// Whether a webhook exists but was deleted (for a 409 on retry).
pub async fn webhook_deleted(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
) -> Result<bool, DbError> {
    let deleted: Option<Option<OffsetDateTime>> = webhooks::table
        .find(webhook_id)
        .select(webhooks::deleted_at)
        .first(conn)
        .await
        .optional()?;
    Ok(matches!(deleted, Some(Some(_))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-11-22 00:00 UTC);

    /// A delivery in `state` with `made` automatic attempts behind it.
    fn delivery(state: DeliveryState, made: i32, next: Option<OffsetDateTime>) -> Delivery {
        Delivery {
            id: Uuid::nil(),
            webhook_id: Uuid::nil(),
            event_id: Uuid::nil(),
            event: EventKind::IncidentOpened,
            incident_id: Uuid::nil(),
            state,
            attempt_count: made,
            auto_attempts: made,
            next_attempt_at: next,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn after(
        state: DeliveryState,
        made: i32,
        trigger: Trigger,
        success: bool,
        max: u8,
    ) -> (DeliveryState, Option<OffsetDateTime>) {
        next_state(
            &delivery(state, made, None),
            trigger,
            success,
            max,
            &RetrySchedule::default(),
            NOW,
        )
    }

    #[test]
    fn failed_automatic_attempts_follow_the_schedule_then_fail() {
        use time::Duration as D;
        let expected = [D::minutes(1), D::minutes(5), D::minutes(30), D::hours(2)];
        for (made, delay) in (0..4).zip(expected) {
            assert_eq!(
                after(DeliveryState::Pending, made, Trigger::Automatic, false, 5),
                (DeliveryState::Retrying, Some(NOW + delay)),
                "after attempt {}",
                made + 1
            );
        }
        assert_eq!(
            after(DeliveryState::Retrying, 4, Trigger::Automatic, false, 5),
            (DeliveryState::Failed, None)
        );
    }

    #[test]
    fn max_attempts_cuts_the_schedule_short() {
        assert_eq!(
            after(DeliveryState::Retrying, 1, Trigger::Automatic, false, 2),
            (DeliveryState::Failed, None)
        );
        assert_eq!(
            after(DeliveryState::Pending, 0, Trigger::Automatic, false, 1),
            (DeliveryState::Failed, None)
        );
    }

    #[test]
    fn success_always_succeeds() {
        for trigger in [Trigger::Automatic, Trigger::Manual] {
            assert_eq!(
                after(DeliveryState::Failed, 5, trigger, true, 5),
                (DeliveryState::Succeeded, None)
            );
        }
    }

    #[test]
    fn manual_attempts_do_not_touch_the_schedule() {
        let next = Some(NOW + time::Duration::minutes(3));
        let keep = next_state(
            &delivery(DeliveryState::Retrying, 2, next),
            Trigger::Manual,
            false,
            5,
            &RetrySchedule::default(),
            NOW,
        );
        assert_eq!(keep, (DeliveryState::Retrying, next));
        assert_eq!(
            after(DeliveryState::Failed, 5, Trigger::Manual, false, 5),
            (DeliveryState::Failed, None)
        );
        assert_eq!(
            after(DeliveryState::Succeeded, 1, Trigger::Manual, false, 5),
            (DeliveryState::Failed, None)
        );
    }
}
