//! Deliveries and their attempts: the delivery log. PostgreSQL is the source of truth for each
//! delivery's state, attempt counts and next attempt time; every write here is one transition
//! of the state machine in [`tocsin_domain::delivery`], guarded in SQL (compare-and-set on the
//! state, the automatic attempt count and the attempt lease), so that no interleaving of
//! dispatchers, redelivered messages, manual retries and sweeper passes makes an attempt the
//! schedule does not allow or sends a request the attempt log does not show.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Int8, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::{attempts, deliveries, events, webhooks};
use crate::statement::Statement;
use crate::webhooks::{Webhook, WebhookRow};
use crate::{Cursor, DbError, Page};
pub use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger, WaitReason};
use tocsin_domain::EventKind;

type SqlUuid = diesel::sql_types::Uuid;

#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = deliveries)]
struct DeliveryRow {
    id: Uuid,
    webhook_id: Uuid,
    event_id: Uuid,
    event: String,
    incident_id: Uuid,
    state: String,
    wait_reason: Option<String>,
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
    /// Why it is `waiting`; `None` in any other state.
    pub wait_reason: Option<WaitReason>,
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
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// The states a delivery is unfinished in, as stored.
const UNFINISHED: [&str; 3] = [
    DeliveryState::Pending.as_str(),
    DeliveryState::Waiting.as_str(),
    DeliveryState::Retrying.as_str(),
];

/// An event to fan out: one delivery per enabled webhook subscribed to its kind, or for a test
/// event, to its one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOut {
    pub event_id: Uuid,
    pub kind: EventKind,
    pub incident_id: Uuid,
    pub test_webhook_id: Option<Uuid>,
    /// The broker delivered the event before: the last try may have created its deliveries and
    /// stopped before attempting them, so every one still waiting for its first attempt is
    /// returned again.
    pub redelivered: bool,
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

/// What fanning out one event made.
#[derive(Debug, Clone, Default)]
pub struct FannedOut {
    /// First attempts claimed with the deliveries: the caller makes them.
    pub claimed: Vec<Job>,
    /// Deliveries created `pending` (the caller did not ask for claims), or, for a redelivered
    /// event, still waiting for their first attempt: the caller claims and makes them.
    pub pending: Vec<Due>,
    /// Deliveries created `waiting`: their webhooks had no room in the caller.
    pub waiting: usize,
}

/// How a fan-out starts the deliveries it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOutRules {
    /// Whether the first attempt of each delivery not `waiting` is claimed with it.
    pub claim: bool,
    /// How much longer than its webhook's timeout a claimed attempt's lease lasts.
    pub lease_margin: Duration,
}

/// A delivery a fan-out created, with what making its first attempt needs.
#[derive(QueryableByName)]
struct CreatedRow {
    #[diesel(embed)]
    delivery: DeliveryRow,
    /// The webhook's row, as JSON.
    #[diesel(sql_type = Text)]
    webhook: String,
    #[diesel(sql_type = Text)]
    body: String,
    #[diesel(sql_type = Timestamptz)]
    occurred_at: OffsetDateTime,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    test_webhook_id: Option<Uuid>,
}

/// Fans out several events with one statement (the dispatcher gathers the events it receives
/// concurrently; see `sql/fan_out.sql`): `room` lists the webhooks the caller has room for only
/// so many more attempts to, and the deliveries beyond it start `waiting`; the others start
/// with their first attempt claimed when `rules` say so. An event given twice is fanned out
/// once.
pub async fn fan_out(
    conn: &mut AsyncPgConnection,
    events: &[FanOut],
    room: &[(Uuid, i64)],
    rules: FanOutRules,
) -> Result<Vec<FannedOut>, DbError> {
    let (limited, rooms): (Vec<Uuid>, Vec<i64>) = room.iter().copied().unzip();
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
    let created: Vec<CreatedRow> = Statement::new(include_str!("sql/fan_out.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<SqlUuid>, _>(&incidents)
        .bind::<Array<Nullable<SqlUuid>>, _>(&tests)
        .bind::<Array<SqlUuid>, _>(&limited)
        .bind::<Bool, _>(rules.claim)
        .bind::<BigInt, _>(millis(rules.lease_margin))
        .bind::<Array<Int8>, _>(&rooms)
        .load(conn)
        .await?;
    let mut results = vec![FannedOut::default(); events.len()];
    for row in created {
        let Some(&index) = first_copy.get(&row.delivery.event_id) else {
            continue;
        };
        let delivery: Delivery = row.delivery.try_into()?;
        if delivery.state == DeliveryState::Waiting {
            results[index].waiting += 1;
        } else if delivery.attempt_count == 1 {
            let webhook: WebhookRow = serde_json::from_str(&row.webhook)
                .map_err(|e| DbError::Corrupt(format!("webhook {}: {e}", delivery.webhook_id)))?;
            results[index].claimed.push(Job {
                delivery,
                webhook: webhook.try_into()?,
                number: 1,
                trigger: Trigger::Automatic,
                body: row.body,
                occurred_at: row.occurred_at,
                test: row.test_webhook_id.is_some(),
            });
        } else {
            results[index].pending.push(Due {
                delivery_id: delivery.id,
                webhook_id: delivery.webhook_id,
                auto_attempts: 0,
            });
        }
    }
    let redelivered: Vec<Uuid> = firsts
        .iter()
        .filter(|e| e.redelivered)
        .map(|e| e.event_id)
        .collect();
    if !redelivered.is_empty() {
        let again: Vec<(Uuid, Uuid, Uuid)> = deliveries::table
            .filter(deliveries::event_id.eq_any(&redelivered))
            .filter(deliveries::state.eq(DeliveryState::Pending.as_str()))
            .filter(deliveries::auto_attempts.eq(0))
            .filter(deliveries::attempting_until.is_null())
            .select((deliveries::event_id, deliveries::id, deliveries::webhook_id))
            .load(conn)
            .await?;
        for (event_id, delivery_id, webhook_id) in again {
            let Some(&index) = first_copy.get(&event_id) else {
                continue;
            };
            let pending = &mut results[index].pending;
            if !pending.iter().any(|due| due.delivery_id == delivery_id) {
                pending.push(Due {
                    delivery_id,
                    webhook_id,
                    auto_attempts: 0,
                });
            }
        }
    }
    Ok(results)
}

/// A request for one attempt of a delivery, to be claimed before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub delivery_id: Uuid,
    pub trigger: Trigger,
    /// For an automatic attempt: the automatic attempts the caller saw made (the attempt
    /// claimed is the next one).
    pub expected_auto_attempts: i32,
}

/// Limits every claim applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRules {
    /// The schedule's length: no webhook gets more automatic attempts.
    pub schedule_attempts: u8,
    /// How much longer than the webhook's timeout an automatic attempt's lease lasts.
    pub lease_margin: Duration,
    /// How early an automatic attempt may be claimed before it is due.
    pub early: Duration,
}

/// A claimed attempt: everything needed to make it.
#[derive(Debug, Clone)]
pub struct Job {
    pub delivery: Delivery,
    pub webhook: Webhook,
    /// The number of the attempt claimed (its row in the attempt log).
    pub number: i32,
    pub trigger: Trigger,
    /// The exact body to send.
    pub body: String,
    /// When the event happened (for the end-to-end lag).
    pub occurred_at: OffsetDateTime,
    /// Whether this is a test event sent from the settings.
    pub test: bool,
}

#[derive(QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Int4)]
    number: i32,
}

/// Claims attempts (the dispatcher gathers those of concurrent workers): each admitted claim
/// logs an attempt with no outcome yet, before its request is sent, and answers the [`Job`];
/// `None` for a claim its guard refused (see `sql/claim.sql`): a duplicate or late message, a
/// finished delivery, an exhausted schedule, a disabled or deleted webhook. A delivery given
/// more than once is claimed in rounds, in one transaction.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    claims: &[Claim],
    rules: ClaimRules,
) -> Result<Vec<Option<Job>>, DbError> {
    let rounds = rounds(claims.iter().map(|c| c.delivery_id));
    if rounds.len() <= 1 {
        return claim_round(conn, claims, rules).await;
    }
    conn.transaction::<_, DbError, _>(async |conn| {
        let mut answers = vec![None; claims.len()];
        for round in &rounds {
            let items: Vec<Claim> = round.iter().map(|&i| claims[i]).collect();
            for (&i, answer) in round.iter().zip(claim_round(conn, &items, rules).await?) {
                answers[i] = answer;
            }
        }
        Ok(answers)
    })
    .await
}

async fn claim_round(
    conn: &mut AsyncPgConnection,
    round: &[Claim],
    rules: ClaimRules,
) -> Result<Vec<Option<Job>>, DbError> {
    let ids: Vec<Uuid> = round.iter().map(|c| c.delivery_id).collect();
    let triggers: Vec<&str> = round.iter().map(|c| c.trigger.as_str()).collect();
    let expected: Vec<i32> = round.iter().map(|c| c.expected_auto_attempts).collect();
    let claimed: Vec<ClaimedRow> = Statement::new(include_str!("sql/claim.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&triggers)
        .bind::<Array<Int4>, _>(&expected)
        .bind::<BigInt, _>(millis(rules.lease_margin))
        .bind::<Int4, _>(i32::from(rules.schedule_attempts))
        .bind::<BigInt, _>(millis(rules.early))
        .load(conn)
        .await?;
    let claimed: Vec<(Uuid, i32, Trigger)> = round
        .iter()
        .filter_map(|claim| {
            let row = claimed.iter().find(|row| row.id == claim.delivery_id)?;
            Some((row.id, row.number, claim.trigger))
        })
        .collect();
    let mut jobs = load_jobs(conn, &claimed).await?;
    Ok(round
        .iter()
        .map(|claim| jobs.remove(&claim.delivery_id))
        .collect())
}

/// Loads what making each claimed attempt (delivery id, attempt number, trigger) needs, in one
/// query.
async fn load_jobs(
    conn: &mut AsyncPgConnection,
    claimed: &[(Uuid, i32, Trigger)],
) -> Result<HashMap<Uuid, Job>, DbError> {
    if claimed.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<Uuid> = claimed.iter().map(|(id, _, _)| *id).collect();
    let rows: Vec<(
        DeliveryRow,
        WebhookRow,
        String,
        OffsetDateTime,
        Option<Uuid>,
    )> = deliveries::table
        .inner_join(webhooks::table)
        .inner_join(events::table)
        .filter(deliveries::id.eq_any(&ids))
        .select((
            DeliveryRow::as_select(),
            WebhookRow::as_select(),
            events::body,
            events::occurred_at,
            events::test_webhook_id,
        ))
        .load(conn)
        .await?;
    let mut jobs = HashMap::with_capacity(rows.len());
    for (delivery, webhook, body, occurred_at, test_webhook_id) in rows {
        let delivery: Delivery = delivery.try_into()?;
        let Some(&(_, number, trigger)) = claimed.iter().find(|(id, _, _)| *id == delivery.id)
        else {
            continue;
        };
        jobs.insert(
            delivery.id,
            Job {
                delivery,
                webhook: webhook.try_into()?,
                number,
                trigger,
                body,
                occurred_at,
                test: test_webhook_id.is_some(),
            },
        );
    }
    Ok(jobs)
}

/// What an attempt's request brought back, or why it has none.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptResult {
    pub success: bool,
    pub status_code: Option<u16>,
    pub duration_ms: i32,
    pub error: Option<AttemptError>,
    pub error_detail: Option<String>,
    pub request_headers: serde_json::Value,
    pub response_body: Option<String>,
    pub response_truncated: bool,
}

impl AttemptResult {
    /// The result of an attempt whose dispatcher stopped before recording it.
    pub fn interrupted() -> Self {
        AttemptResult {
            success: false,
            status_code: None,
            duration_ms: 0,
            error: Some(AttemptError::Interrupted),
            error_detail: Some(
                "the dispatcher making this attempt stopped before it recorded the answer".into(),
            ),
            request_headers: serde_json::Value::Object(Default::default()),
            response_body: None,
            response_truncated: false,
        }
    }
}

/// A claimed attempt's outcome and the transition it makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub delivery_id: Uuid,
    /// The attempt's number in the attempt log.
    pub number: i32,
    /// For an automatic attempt, its automatic number.
    pub auto_number: Option<i32>,
    pub result: AttemptResult,
    pub transition: Transition,
}

/// Where a completion left its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// Whether the transition was made (it is not when, say, a manual attempt succeeded the
    /// delivery meanwhile).
    pub moved: bool,
    pub state: Option<DeliveryState>,
    pub next_attempt_at: Option<OffsetDateTime>,
}

#[derive(QueryableByName)]
struct CompletedRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    state: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    next_attempt_at: Option<OffsetDateTime>,
    #[diesel(sql_type = Bool)]
    moved: bool,
}

/// Records attempts' outcomes and moves their deliveries (see `sql/complete.sql`); `None` for
/// an attempt whose outcome was recorded already. A delivery given more than once is
/// completed in rounds, in one transaction.
pub async fn complete(
    conn: &mut AsyncPgConnection,
    completions: &[Completion],
) -> Result<Vec<Option<Completed>>, DbError> {
    let rounds = rounds(completions.iter().map(|c| c.delivery_id));
    if rounds.len() <= 1 {
        return complete_round(conn, completions).await;
    }
    conn.transaction::<_, DbError, _>(async |conn| {
        let mut answers = vec![None; completions.len()];
        for round in &rounds {
            let items: Vec<Completion> = round.iter().map(|&i| completions[i].clone()).collect();
            for (&i, answer) in round.iter().zip(complete_round(conn, &items).await?) {
                answers[i] = answer;
            }
        }
        Ok(answers)
    })
    .await
}

async fn complete_round(
    conn: &mut AsyncPgConnection,
    round: &[Completion],
) -> Result<Vec<Option<Completed>>, DbError> {
    let ids: Vec<Uuid> = round.iter().map(|c| c.delivery_id).collect();
    let numbers: Vec<i32> = round.iter().map(|c| c.number).collect();
    let auto_numbers: Vec<Option<i32>> = round.iter().map(|c| c.auto_number).collect();
    let to_states: Vec<Option<&str>> = round
        .iter()
        .map(|c| c.transition.state().map(DeliveryState::as_str))
        .collect();
    let delays: Vec<i64> = round
        .iter()
        .map(|c| match c.transition {
            Transition::Retry { delay } => millis(delay),
            _ => 0,
        })
        .collect();
    let results: Vec<&AttemptResult> = round.iter().map(|c| &c.result).collect();
    let success: Vec<bool> = results.iter().map(|r| r.success).collect();
    let status: Vec<Option<i32>> = results
        .iter()
        .map(|r| r.status_code.map(i32::from))
        .collect();
    let duration: Vec<i32> = results.iter().map(|r| r.duration_ms).collect();
    let errors: Vec<Option<&str>> = results
        .iter()
        .map(|r| r.error.map(AttemptError::as_str))
        .collect();
    let details: Vec<Option<&str>> = results.iter().map(|r| r.error_detail.as_deref()).collect();
    let headers: Vec<&serde_json::Value> = results.iter().map(|r| &r.request_headers).collect();
    let bodies: Vec<Option<&str>> = results.iter().map(|r| r.response_body.as_deref()).collect();
    let truncated: Vec<bool> = results.iter().map(|r| r.response_truncated).collect();
    let rows: Vec<CompletedRow> = Statement::new(include_str!("sql/complete.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Int4>, _>(&numbers)
        .bind::<Array<Nullable<Int4>>, _>(&auto_numbers)
        .bind::<Array<Nullable<Text>>, _>(&to_states)
        .bind::<Array<Int8>, _>(&delays)
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
    let mut by_id: HashMap<Uuid, Completed> = HashMap::with_capacity(rows.len());
    for row in rows {
        let state = match row.state {
            None => None,
            Some(text) => Some(text.parse().map_err(|_| {
                DbError::Corrupt(format!("delivery {}: bad state {text:?}", row.id))
            })?),
        };
        by_id.insert(
            row.id,
            Completed {
                moved: row.moved,
                state,
                next_attempt_at: row.next_attempt_at,
            },
        );
    }
    Ok(ids.iter().map(|id| by_id.remove(id)).collect())
}

/// Item indexes split into rounds of distinct deliveries, each holding the first copy of each
/// delivery left: a delivery given twice in one batch (a manual retry beside an automatic
/// attempt, a duplicate message) is written by a later statement that sees the first one's
/// effect. More than one round share a transaction, so that a batch retried item by item after
/// a failure does nothing twice.
fn rounds(ids: impl Iterator<Item = Uuid>) -> Vec<Vec<usize>> {
    let ids: Vec<Uuid> = ids.collect();
    let mut rounds = Vec::new();
    let mut left: Vec<usize> = (0..ids.len()).collect();
    while !left.is_empty() {
        let mut seen = HashSet::new();
        let (this, later): (Vec<usize>, Vec<usize>) =
            left.into_iter().partition(|&i| seen.insert(ids[i]));
        rounds.push(this);
        left = later;
    }
    rounds
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
    let moved: Vec<Uuid> = Statement::new(
        "UPDATE deliveries d SET state = 'waiting', wait_reason = $3, updated_at = now()
FROM unnest($1::uuid[], $2::int4[]) AS v(id, expected)
WHERE d.id = v.id AND d.state IN ('pending', 'retrying')
    AND d.auto_attempts = v.expected AND d.attempting_until IS NULL
RETURNING d.id",
    )
    .bind::<Array<SqlUuid>, _>(&ids)
    .bind::<Array<Int4>, _>(&expected)
    .bind::<Text, _>(reason.as_str())
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

/// Fails the deliveries among `ids` that can get no more automatic attempt (their webhook
/// deleted or disabled, or their schedule used up) and have none under way; returns those it
/// failed.
pub async fn stop(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
    schedule_attempts: u8,
) -> Result<Vec<Uuid>, DbError> {
    Ok(Statement::new(include_str!("sql/stop.sql"))
        .bind::<Array<SqlUuid>, _>(ids)
        .bind::<Int4, _>(i32::from(schedule_attempts))
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
pub struct Unrecorded {
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

impl Unrecorded {
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
pub async fn unrecorded(
    conn: &mut AsyncPgConnection,
    grace: Duration,
    manual_after: Duration,
    limit: i64,
) -> Result<Vec<Unrecorded>, DbError> {
    Ok(Statement::new(include_str!("sql/interrupted.sql"))
        .bind::<BigInt, _>(millis(grace))
        .bind::<BigInt, _>(millis(manual_after))
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How many deliveries are in each unfinished state.
pub async fn count_unfinished(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<(DeliveryState, i64)>, DbError> {
    let rows: Vec<(String, i64)> = deliveries::table
        .filter(deliveries::state.eq_any(UNFINISHED))
        .group_by(deliveries::state)
        .select((deliveries::state, diesel::dsl::count_star()))
        .load(conn)
        .await?;
    let mut counts: Vec<(DeliveryState, i64)> = DeliveryState::UNFINISHED
        .into_iter()
        .map(|state| (state, 0))
        .collect();
    for (state, n) in rows {
        if let Some(slot) = counts.iter_mut().find(|(s, _)| s.as_str() == state) {
            slot.1 = n;
        }
    }
    Ok(counts)
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

/// One logged attempt. An attempt is logged when it is claimed, before its request is sent,
/// and its outcome is filled in once known.
#[derive(Debug, Clone, Serialize, Queryable)]
pub struct Attempt {
    pub number: i32,
    pub trigger: String,
    #[serde(with = "time::serde::rfc3339")]
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
