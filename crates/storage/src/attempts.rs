//! Attempts: claiming one (its row in the attempt log is written, with no outcome yet, before
//! its request is sent), the job it hands the dispatcher, and recording its outcome, which moves
//! the delivery as [`tocsin_domain::delivery::Transition`] says. Every write is guarded in SQL
//! (compare-and-set on the state, the automatic attempt count and the attempt's lease), so that
//! no interleaving of dispatchers, redelivered messages, manual retries and sweeper passes makes
//! an attempt the schedule does not allow or sends a request the attempt log does not show.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Int8, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::deliveries::{id_bounds, millis, Delivery, DeliveryRow};
use crate::statement::Statement;
use crate::webhooks::{Webhook, WebhookRow};
use crate::DbError;
pub use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger, WaitReason};

type SqlUuid = diesel::sql_types::Uuid;

/// A request for one attempt of a delivery, to be claimed before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub delivery_id: Uuid,
    pub trigger: Trigger,
    /// For an automatic attempt: the automatic attempts the caller saw made (the attempt
    /// claimed is the next one).
    pub auto_attempts: i32,
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

/// A delivery whose attempt was just claimed, with what making the attempt needs: what
/// `sql/claim.sql` and `sql/fan_out.sql` answer.
#[derive(QueryableByName)]
pub(crate) struct JobRow {
    #[diesel(embed)]
    pub(crate) delivery: DeliveryRow,
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

impl JobRow {
    /// The job of the attempt claimed on `delivery` (the row's delivery, converted).
    pub(crate) fn into_job(self, delivery: Delivery, trigger: Trigger) -> Result<Job, DbError> {
        let webhook: WebhookRow = serde_json::from_str(&self.webhook)
            .map_err(|e| DbError::Corrupt(format!("webhook {}: {e}", delivery.webhook_id)))?;
        Ok(Job {
            number: delivery.attempt_count,
            delivery,
            webhook: webhook.try_into()?,
            trigger,
            body: self.body,
            occurred_at: self.occurred_at,
            test: self.test_webhook_id.is_some(),
        })
    }
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
    // One transaction, so that a claim is never committed without its job: should a row not
    // convert, nothing is claimed, and the batch is run item by item.
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

/// Prepares the claim and outcome statements on `conn` (executed with no delivery: they change
/// nothing); see [`crate::warm`].
pub async fn prepare(conn: &mut AsyncPgConnection, rules: ClaimRules) -> Result<(), DbError> {
    claim_round(conn, &[], rules).await?;
    complete_round(conn, &[]).await?;
    Ok(())
}

async fn claim_round(
    conn: &mut AsyncPgConnection,
    round: &[Claim],
    rules: ClaimRules,
) -> Result<Vec<Option<Job>>, DbError> {
    let ids: Vec<Uuid> = round.iter().map(|c| c.delivery_id).collect();
    let triggers: Vec<&str> = round.iter().map(|c| c.trigger.as_str()).collect();
    let expected: Vec<i32> = round.iter().map(|c| c.auto_attempts).collect();
    let (low, high) = id_bounds(&ids);
    let claimed: Vec<JobRow> = Statement::new(include_str!("sql/claim.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&triggers)
        .bind::<Array<Int4>, _>(&expected)
        .bind::<BigInt, _>(millis(rules.lease_margin))
        .bind::<Int4, _>(i32::from(rules.schedule_attempts))
        .bind::<BigInt, _>(millis(rules.early))
        .bind::<SqlUuid, _>(low)
        .bind::<SqlUuid, _>(high)
        .load(conn)
        .await?;
    let mut jobs = HashMap::with_capacity(claimed.len());
    for row in claimed {
        let delivery: Delivery = row.delivery.clone().try_into()?;
        let Some(claim) = round.iter().find(|c| c.delivery_id == delivery.id) else {
            continue;
        };
        jobs.insert(delivery.id, row.into_job(delivery, claim.trigger)?);
    }
    Ok(round
        .iter()
        .map(|claim| jobs.remove(&claim.delivery_id))
        .collect())
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
    /// The result of an attempt that had no room to be sent within its lease
    /// ([`AttemptError::NotSent`]).
    pub fn not_sent(waited_ms: u32) -> Self {
        AttemptResult {
            error: Some(AttemptError::NotSent),
            error_detail: Some(format!(
                "no request was sent: the dispatcher had no free slot of this webhook or request \
                 permit within {waited_ms} ms of the claim, and a request never goes out past \
                 its attempt's lease"
            )),
            ..AttemptResult::interrupted()
        }
    }

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
    /// For an automatic attempt, the delivery's automatic attempts with it made (its claim's
    /// count): the outcome moves the delivery only while that is still the count.
    pub auto_attempts: Option<i32>,
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
    let auto_attempts: Vec<Option<i32>> = round.iter().map(|c| c.auto_attempts).collect();
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
    let (low, high) = id_bounds(&ids);
    let rows: Vec<CompletedRow> = Statement::new(include_str!("sql/complete.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Int4>, _>(&numbers)
        .bind::<Array<Nullable<Int4>>, _>(&auto_attempts)
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
        .bind::<SqlUuid, _>(low)
        .bind::<SqlUuid, _>(high)
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
