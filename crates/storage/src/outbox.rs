//! The transactional outbox: incident events and manual retries are written here in the same
//! transaction as the change that caused them; the relay publishes them to RabbitMQ (events to
//! the events exchange, where dispatchers fan them out and any other consumer may subscribe).

use std::sync::Arc;
use std::time::Instant;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::schema::{events, outbox};
use crate::statement::Statement;
use crate::DbError;
use tocsin_broker::messages::{attempt_headers, DeliveryMessage, EventMessage};
use tocsin_domain::delivery::Trigger;
use tocsin_domain::{EventKind, EventPayload};

/// PostgreSQL channel notified when outbox rows are committed, so relays wake at once.
pub const NOTIFY_CHANNEL: &str = "tocsin_outbox";

/// Where the relay publishes a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// To the events exchange: one incident event, which dispatchers fan out.
    Event,
    /// To the delivery exchange: one attempt of a delivery (a manual retry).
    Delivery,
}

impl Topic {
    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Event => "event",
            Topic::Delivery => "delivery",
        }
    }
}

/// An event about to be recorded: its row, and the exact body targets will receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub id: Uuid,
    pub kind: EventKind,
    pub incident_id: Uuid,
    pub occurred_at: OffsetDateTime,
    pub body: String,
    /// For a test event: the one webhook that receives it.
    pub test_webhook_id: Option<Uuid>,
    /// Headers its message carries besides the body, a JSON object of strings: the trace
    /// context of the request that caused it, when traces are exported. `None`: none.
    pub headers: Option<serde_json::Value>,
}

impl NewEvent {
    pub fn new(payload: &EventPayload, test_webhook_id: Option<Uuid>) -> Self {
        NewEvent {
            id: Uuid::now_v7(),
            kind: payload.event,
            incident_id: payload.data.id,
            occurred_at: payload.timestamp,
            body: payload.to_body(),
            test_webhook_id,
            headers: None,
        }
    }

    /// The message that announces it on the events exchange.
    pub fn message(&self) -> EventMessage {
        EventMessage {
            event_id: self.id,
            event: self.kind,
            incident_id: self.incident_id,
            test_webhook_id: self.test_webhook_id,
        }
    }
}

/// How long a row handed over to its writer's relay is held from every relay's claim: past
/// it, a row whose hand-over was lost (its process stopped before publishing it) is claimed
/// like any other.
pub const HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// How relays learn that outbox rows were committed.
#[derive(Clone)]
pub enum Wake {
    /// `NOTIFY` every listening relay, in any process, at commit. PostgreSQL serialises the
    /// commits of notifying transactions (a global lock held through the WAL flush, so they
    /// cannot share a flush): for low-rate writers such as admin.
    Listeners,
    /// The rows are held from every relay's claim for [`HOLD`], and handed to this process's
    /// relay once the transaction commits, which publishes them without reading them back
    /// (ingest's hot path: no `NOTIFY`, where group commit matters, and no claim).
    HandOver(Arc<RelayWaker>),
}

impl Wake {
    /// Until when rows written this way are held from claims.
    pub(crate) fn held_until(&self) -> Option<OffsetDateTime> {
        match self {
            Wake::Listeners => None,
            Wake::HandOver(_) => Some(OffsetDateTime::now_utc() + HOLD),
        }
    }

    /// Call once the rows written this way are committed.
    pub fn committed(&self, rows: Vec<OutboxRow>) {
        if let Wake::HandOver(relay) = self {
            relay.hand_over(rows);
        }
    }
}

/// Records events and the outbox row that publishes each, with the event's headers (the relay
/// publishes them as the message's); call inside the transaction of the change, and
/// [`Wake::committed`] with the rows once it commits.
pub async fn record_events(
    conn: &mut AsyncPgConnection,
    new: &[NewEvent],
    wake: &Wake,
) -> Result<Vec<OutboxRow>, DbError> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let event_rows: Vec<_> = new
        .iter()
        .map(|e| {
            (
                events::id.eq(e.id),
                events::kind.eq(e.kind.as_str()),
                events::incident_id.eq(e.incident_id),
                events::occurred_at.eq(e.occurred_at),
                events::body.eq(&e.body),
                events::test_webhook_id.eq(e.test_webhook_id),
            )
        })
        .collect();
    diesel::insert_into(events::table)
        .values(&event_rows)
        .execute(conn)
        .await?;
    // An event without headers leaves the column to its default, the empty object.
    let held_until = wake.held_until();
    let outbox_rows: Vec<_> = new
        .iter()
        .map(|e| {
            (
                outbox::topic.eq(Topic::Event.as_str()),
                e.headers
                    .as_ref()
                    .map(|headers| outbox::headers.eq(headers)),
                outbox::payload.eq(e.message().to_bytes()),
                outbox::held_until.eq(held_until),
            )
        })
        .collect();
    let rows: Vec<OutboxRow> = diesel::insert_into(outbox::table)
        .values(&outbox_rows)
        .returning((outbox::id, outbox::topic, outbox::headers, outbox::payload))
        .get_results(conn)
        .await?;
    if matches!(wake, Wake::Listeners) {
        notify(conn).await?;
    }
    Ok(rows)
}

/// Marks rows handed over and published as published.
pub async fn mark_published<C>(conn: &mut C, ids: &[i64]) -> Result<(), DbError>
where
    C: diesel_async::AsyncConnectionCore<Backend = diesel::pg::Pg> + Send,
{
    update_rows(
        conn,
        "UPDATE outbox SET published_at = now(), held_until = NULL WHERE id = ANY($1)",
        ids,
    )
    .await
}

/// Ends the hold of rows handed over whose publish failed: every relay may claim them now.
pub async fn release<C>(conn: &mut C, ids: &[i64]) -> Result<(), DbError>
where
    C: diesel_async::AsyncConnectionCore<Backend = diesel::pg::Pg> + Send,
{
    update_rows(
        conn,
        "UPDATE outbox SET held_until = NULL WHERE id = ANY($1)",
        ids,
    )
    .await
}

/// Runs `sql`, an update of the rows whose ids are `$1`, as a `Statement` prepared once per
/// connection: diesel prepares an `eq_any` anew on every call, and these run for every alert.
async fn update_rows<C>(conn: &mut C, sql: &'static str, ids: &[i64]) -> Result<(), DbError>
where
    C: diesel_async::AsyncConnectionCore<Backend = diesel::pg::Pg> + Send,
{
    Statement::new(sql)
        .bind::<diesel::sql_types::Array<diesel::sql_types::BigInt>, _>(ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a request for the next automatic attempt of each delivery, due now (a recovered
/// delivery), with the automatic attempts its claim expects.
pub async fn enqueue_automatic(
    conn: &mut AsyncPgConnection,
    due: &[crate::deliveries::Due],
) -> Result<(), DbError> {
    let messages = due.iter().map(|due| {
        let headers = attempt_headers(Trigger::Automatic, Some(due.auto_attempts));
        let message = DeliveryMessage {
            delivery_id: due.delivery_id,
            webhook_id: Some(due.webhook_id),
        };
        (headers, message)
    });
    enqueue(conn, messages.collect()).await
}

/// Records a request for one immediate attempt of each delivery (a manual retry): marks each
/// delivery as having a manual attempt asked for (`manual_requested`, which the attempt's claim
/// clears: one request, one attempt, however often its message is delivered) and writes its
/// message. Call it in the caller's transaction, so that both commit together.
pub async fn enqueue_attempt(
    conn: &mut AsyncPgConnection,
    delivery_ids: &[Uuid],
    trigger: Trigger,
) -> Result<(), DbError> {
    if trigger == Trigger::Manual {
        diesel::update(
            crate::schema::deliveries::table
                .filter(crate::schema::deliveries::id.eq_any(delivery_ids)),
        )
        .set(crate::schema::deliveries::manual_requested.eq(true))
        .execute(conn)
        .await?;
    }
    let headers = attempt_headers(trigger, None);
    let messages = delivery_ids.iter().map(|id| {
        let message = DeliveryMessage {
            delivery_id: *id,
            webhook_id: None,
        };
        (headers.clone(), message)
    });
    enqueue(conn, messages.collect()).await
}

/// Writes delivery messages, with their headers, for the relay to publish.
async fn enqueue(
    conn: &mut AsyncPgConnection,
    messages: Vec<(serde_json::Value, DeliveryMessage)>,
) -> Result<(), DbError> {
    if messages.is_empty() {
        return Ok(());
    }
    let rows: Vec<_> = messages
        .into_iter()
        .map(|(headers, message)| {
            (
                outbox::topic.eq(Topic::Delivery.as_str()),
                outbox::headers.eq(headers),
                outbox::payload.eq(message.to_bytes()),
            )
        })
        .collect();
    diesel::insert_into(outbox::table)
        .values(&rows)
        .execute(conn)
        .await?;
    notify(conn).await
}

pub(crate) async fn notify(conn: &mut AsyncPgConnection) -> Result<(), DbError> {
    // Delivered to listeners when the transaction commits, and only then.
    diesel::sql_query(format!("NOTIFY {NOTIFY_CHANNEL}"))
        .execute(conn)
        .await?;
    Ok(())
}

/// Wakes the relay after a commit that wrote outbox rows: to claim them from the table
/// ([`RelayWaker::wake`]), or to publish rows handed over to it ([`RelayWaker::hand_over`], the
/// hand-over).
/// Keeps the time of the earliest wake or hand-over not yet answered: the relay's `wake` stage
/// runs from it to the claim, or to the publish of the rows handed over.
#[derive(Default)]
pub struct RelayWaker {
    pub(crate) notify: Notify,
    /// The earliest wake to claim not yet answered.
    since: std::sync::Mutex<Option<Instant>>,
    /// Rows handed over and not yet taken, with the time of the earliest hand-over.
    handed: std::sync::Mutex<(Vec<OutboxRow>, Option<Instant>)>,
}

impl RelayWaker {
    /// Call after committing outbox rows that are not handed over: the relay claims them at
    /// once.
    pub fn wake(&self) {
        self.since
            .lock()
            .expect("the wake time")
            .get_or_insert_with(Instant::now);
        self.notify.notify_one();
    }

    /// Call with committed outbox rows written held (`outbox::Wake::HandOver`): the relay
    /// publishes them at once, without reading them back.
    pub fn hand_over(&self, rows: Vec<OutboxRow>) {
        if rows.is_empty() {
            return;
        }
        {
            let mut handed = self.handed.lock().expect("the rows handed over");
            handed.0.extend(rows);
            handed.1.get_or_insert_with(Instant::now);
        }
        self.notify.notify_one();
    }

    /// The earliest wake to claim since the last call.
    pub(crate) fn take_since(&self) -> Option<Instant> {
        self.since.lock().expect("the wake time").take()
    }

    /// Whether a wake to claim is waiting.
    pub(crate) fn claim_wanted(&self) -> bool {
        self.since.lock().expect("the wake time").is_some()
    }

    /// Up to `limit` of the rows handed over, oldest first, with the earliest hand-over's
    /// time; the rest wait for the next call, which the relay is woken for.
    pub(crate) fn take_handed(&self, limit: usize) -> (Vec<OutboxRow>, Option<Instant>) {
        let mut handed = self.handed.lock().expect("the rows handed over");
        if handed.0.len() <= limit {
            return std::mem::take(&mut *handed);
        }
        let rest = handed.0.split_off(limit);
        let taken = std::mem::replace(&mut handed.0, rest);
        self.notify.notify_one();
        // The rest were handed over no earlier than the taken: their wait is counted from the
        // same time.
        (taken, handed.1)
    }
}

/// An outbox row waiting to be published.
#[derive(Debug, Clone, Queryable, QueryableByName)]
#[diesel(table_name = outbox)]
pub struct OutboxRow {
    pub id: i64,
    pub topic: String,
    pub headers: serde_json::Value,
    pub payload: Vec<u8>,
}

impl OutboxRow {
    pub fn topic(&self) -> Option<Topic> {
        match self.topic.as_str() {
            "event" => Some(Topic::Event),
            "delivery" => Some(Topic::Delivery),
            _ => None,
        }
    }
}

/// Claims up to `limit` unpublished rows with ids from `from` on, oldest first, skipping rows
/// another relay holds, and marks them published in the same statement: call inside a
/// transaction, publish the rows, then commit (the mark stands) or roll back (the rows wait for
/// the next pass). The locks last until the transaction ends. Rows come back in id order.
pub async fn claim_and_mark<C>(
    conn: &mut C,
    limit: i64,
    from: i64,
) -> Result<Vec<OutboxRow>, DbError>
where
    C: diesel_async::AsyncConnectionCore<Backend = diesel::pg::Pg> + Send,
{
    let mut rows: Vec<OutboxRow> = Statement::new(include_str!("sql/claim_and_mark.sql"))
        .bind::<diesel::sql_types::BigInt, _>(limit)
        .bind::<diesel::sql_types::Timestamptz, _>(OffsetDateTime::now_utc())
        .bind::<diesel::sql_types::BigInt, _>(from)
        .load(conn)
        .await?;
    rows.sort_unstable_by_key(|row| row.id);
    Ok(rows)
}

/// The last id the outbox handed out, committed or not: every row with an id up to it took its
/// id before now.
pub async fn last_id(conn: &mut AsyncPgConnection) -> Result<i64, DbError> {
    Ok(
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT last_value FROM outbox_id_seq)",
        ))
        .get_result(conn)
        .await?,
    )
}

/// How many rows wait to be published.
pub async fn backlog(conn: &mut AsyncPgConnection) -> Result<i64, DbError> {
    Ok(outbox::table
        .filter(outbox::published_at.is_null())
        .count()
        .get_result(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64) -> OutboxRow {
        OutboxRow {
            id,
            topic: "event".into(),
            headers: serde_json::json!({}),
            payload: Vec::new(),
        }
    }

    #[test]
    fn rows_handed_over_are_taken_oldest_first_at_most_a_batch_at_a_time() {
        let waker = RelayWaker::default();
        waker.hand_over((1..=5).map(row).collect());
        let (taken, since) = waker.take_handed(2);
        assert_eq!(taken.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2]);
        assert!(since.is_some());
        let (taken, rest_since) = waker.take_handed(2);
        assert_eq!(taken.iter().map(|r| r.id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(
            rest_since, since,
            "the rest's wait counts from the first hand-over"
        );
        let (taken, _) = waker.take_handed(2);
        assert_eq!(taken.iter().map(|r| r.id).collect::<Vec<_>>(), [5]);
        let (taken, since) = waker.take_handed(2);
        assert!(taken.is_empty());
        assert_eq!(since, None);
    }
}
