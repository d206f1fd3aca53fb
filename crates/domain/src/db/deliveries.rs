//! Deliveries and their attempts: the delivery log of SPEC §2.3. PostgreSQL is the source of
//! truth for each delivery's state, attempt count and next attempt time (DESIGN §2).

use std::fmt;
use std::str::FromStr;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use super::schema::{attempts, deliveries, events, webhooks};
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

#[derive(Debug, Clone, Queryable, Selectable)]
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

/// Creates one pending delivery per webhook for an event; returns the ids of those created now
/// (a redelivered event creates none twice).
pub async fn create_for_event(
    conn: &mut AsyncPgConnection,
    event_id: Uuid,
    kind: EventKind,
    incident_id: Uuid,
    webhook_ids: &[Uuid],
) -> Result<Vec<Uuid>, DbError> {
    if webhook_ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = OffsetDateTime::now_utc();
    let rows: Vec<_> = webhook_ids
        .iter()
        .map(|webhook_id| {
            (
                deliveries::id.eq(Uuid::now_v7()),
                deliveries::webhook_id.eq(*webhook_id),
                deliveries::event_id.eq(event_id),
                deliveries::event.eq(kind.as_str()),
                deliveries::incident_id.eq(incident_id),
                deliveries::state.eq(DeliveryState::Pending.as_str()),
                deliveries::next_attempt_at.eq(Some(now)),
                deliveries::created_at.eq(now),
                deliveries::updated_at.eq(now),
            )
        })
        .collect();
    Ok(diesel::insert_into(deliveries::table)
        .values(&rows)
        .on_conflict((deliveries::event_id, deliveries::webhook_id))
        .do_nothing()
        .returning(deliveries::id)
        .get_results(conn)
        .await?)
}

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
    let row: Option<(
        DeliveryRow,
        super::webhooks::WebhookRow,
        String,
        OffsetDateTime,
        Option<Uuid>,
    )> = deliveries::table
        .inner_join(webhooks::table)
        .inner_join(events::table)
        .filter(deliveries::id.eq(id))
        .select((
            DeliveryRow::as_select(),
            super::webhooks::WebhookRow::as_select(),
            events::body,
            events::occurred_at,
            events::test_webhook_id,
        ))
        .first(conn)
        .await
        .optional()?;
    let (delivery, webhook, body, occurred_at, test_webhook_id) = row.ok_or(DbError::NotFound)?;
    Ok(DeliveryJob {
        delivery: delivery.try_into()?,
        webhook: webhook.try_into()?,
        body,
        occurred_at,
        test: test_webhook_id.is_some(),
    })
}

/// Deliveries of an event that still wait for their first attempt (to re-enqueue them when
/// the event is redelivered after a crash).
pub async fn waiting_for_first_attempt(
    conn: &mut AsyncPgConnection,
    event_id: Uuid,
) -> Result<Vec<Uuid>, DbError> {
    Ok(deliveries::table
        .filter(deliveries::event_id.eq(event_id))
        .filter(deliveries::state.eq(DeliveryState::Pending.as_str()))
        .filter(deliveries::attempt_count.eq(0))
        .select(deliveries::id)
        .load(conn)
        .await?)
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
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let auto_increment = i32::from(attempt.trigger == Trigger::Automatic);
        let target = deliveries::table.find(delivery_id);
        let updated: Option<DeliveryRow> = match expected_auto_attempts {
            Some(expected) => diesel::update(target.filter(deliveries::auto_attempts.eq(expected)))
                .set((
                    deliveries::attempt_count.eq(deliveries::attempt_count + 1),
                    deliveries::auto_attempts.eq(deliveries::auto_attempts + auto_increment),
                    deliveries::state.eq(state.as_str()),
                    deliveries::next_attempt_at.eq(next_attempt_at),
                    deliveries::updated_at.eq(now),
                ))
                .returning(DeliveryRow::as_returning())
                .get_result(conn)
                .await
                .optional()?,
            None => diesel::update(target)
                .set((
                    deliveries::attempt_count.eq(deliveries::attempt_count + 1),
                    deliveries::state.eq(state.as_str()),
                    deliveries::next_attempt_at.eq(next_attempt_at),
                    deliveries::updated_at.eq(now),
                ))
                .returning(DeliveryRow::as_returning())
                .get_result(conn)
                .await
                .optional()?,
        };
        let Some(row) = updated else {
            return Ok(None);
        };
        diesel::insert_into(attempts::table)
            .values((
                attempts::delivery_id.eq(delivery_id),
                attempts::number.eq(row.attempt_count),
                attempts::trigger.eq(attempt.trigger.as_str()),
                attempts::started_at.eq(attempt.started_at),
                attempts::success.eq(attempt.success),
                attempts::status_code.eq(attempt.status_code.map(i32::from)),
                attempts::duration_ms.eq(attempt.duration_ms),
                attempts::error.eq(attempt.error.map(AttemptError::as_str)),
                attempts::error_detail.eq(attempt.error_detail.as_deref()),
                attempts::request_headers.eq(&attempt.request_headers),
                attempts::response_body.eq(attempt.response_body.as_deref()),
                attempts::response_truncated.eq(attempt.response_truncated),
            ))
            .execute(conn)
            .await?;
        Ok(Some(row.try_into()?))
    })
    .await
}

/// Marks a delivery failed without an attempt (its webhook is gone or disabled).
pub async fn mark_failed(conn: &mut AsyncPgConnection, id: Uuid) -> Result<(), DbError> {
    diesel::update(
        deliveries::table
            .find(id)
            .filter(deliveries::state.eq_any(["pending", "retrying"])),
    )
    .set((
        deliveries::state.eq(DeliveryState::Failed.as_str()),
        deliveries::next_attempt_at.eq(None::<OffsetDateTime>),
        deliveries::updated_at.eq(OffsetDateTime::now_utc()),
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// Unfinished deliveries whose next attempt is overdue by more than `grace`: the sweeper
/// re-enqueues them. Their `next_attempt_at` is pushed `grace` ahead so they are not taken twice.
/// Returns `(delivery id, automatic attempts made)`.
pub async fn claim_overdue(
    conn: &mut AsyncPgConnection,
    grace: std::time::Duration,
    limit: i64,
) -> Result<Vec<(Uuid, i32)>, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let grace = time::Duration::try_from(grace).unwrap_or(time::Duration::MINUTE);
        let due: Vec<(Uuid, i32)> = deliveries::table
            .filter(deliveries::state.eq_any(["pending", "retrying"]))
            .filter(deliveries::next_attempt_at.lt(now - grace))
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
