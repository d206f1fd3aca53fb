//! Fan-out: one delivery per subscribed webhook for each event, created idempotently, with
//! each first attempt claimed in the same statement (`sql/fan_out.sql`).

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int8, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::attempts::{Job, JobRow};
use crate::deliveries::{millis, Delivery, Due};
use crate::partitions::{day_floor, v7_millis};
use crate::schema::deliveries;
use crate::statement::Statement;
use crate::DbError;
pub use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger, WaitReason};
use tocsin_domain::EventKind;

type SqlUuid = diesel::sql_types::Uuid;

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

/// What fanning out one event made.
#[derive(Debug, Clone, Default)]
pub struct FannedOut {
    /// First attempts claimed with the deliveries: the caller makes them.
    pub claimed: Vec<Job>,
    /// Deliveries created `pending` (the caller did not ask for claims), or, for a redelivered
    /// event, still waiting for their first attempt: the caller claims and makes them.
    pub pending: Vec<Due>,
    /// Deliveries created `waiting` (`webhook_busy`): their webhooks had no room in the caller.
    pub waiting: usize,
    /// Deliveries created `waiting` because their webhooks are disabled (`webhook_disabled`).
    pub disabled: usize,
    /// Deliveries created `waiting` for an earlier delivery of their incident (`ordering`).
    pub ordering: usize,
}

/// How a fan-out starts the deliveries it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOutRules {
    /// Whether the first attempt of each delivery not `waiting` is claimed with it.
    pub claim: bool,
    /// How much longer than its webhook's timeout a claimed attempt's lease lasts.
    pub lease_margin: Duration,
    /// A replay: the events go to this one webhook only (subscription and filters still
    /// apply), and the deliveries are marked `replayed`.
    pub replay_to: Option<Uuid>,
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
    let floor = read_floor(&firsts, OffsetDateTime::now_utc());
    let created: Vec<JobRow> = Statement::new(statement_from(floor))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<SqlUuid>, _>(&incidents)
        .bind::<Array<Nullable<SqlUuid>>, _>(&tests)
        .bind::<Array<SqlUuid>, _>(&limited)
        .bind::<Bool, _>(rules.claim)
        .bind::<BigInt, _>(millis(rules.lease_margin))
        .bind::<Array<Int8>, _>(&rooms)
        .bind::<Nullable<SqlUuid>, _>(rules.replay_to)
        .load(conn)
        .await?;
    let mut results = vec![FannedOut::default(); events.len()];
    // A delivery of an incident's earlier event, made for an ordered webhook, is the work of
    // the given event of that incident that brought it in.
    let by_incident: HashMap<Uuid, usize> = firsts
        .iter()
        .rev()
        .map(|e| (e.incident_id, first_copy[&e.event_id]))
        .collect();
    for row in created {
        let Some(&index) = first_copy
            .get(&row.delivery.event_id)
            .or_else(|| by_incident.get(&row.delivery.incident_id))
        else {
            continue;
        };
        let delivery: Delivery = row.delivery.clone().try_into()?;
        if delivery.state == DeliveryState::Waiting {
            match delivery.wait_reason {
                Some(WaitReason::WebhookDisabled) => results[index].disabled += 1,
                Some(WaitReason::Ordering) => results[index].ordering += 1,
                _ => results[index].waiting += 1,
            }
        } else if delivery.attempt_count == 1 {
            results[index]
                .claimed
                .push(row.into_job(delivery, Trigger::Automatic)?);
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
            .filter(deliveries::id.ge(floor))
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

/// How far the clock of the host that made an id may be behind this one's.
const CLOCK_SKEW_MILLIS: u64 = 3_600_000;

/// The least id the fan-out of `events` reads in `events` and `deliveries`, so that PostgreSQL
/// leaves the older days' partitions out: the first id of the day in which the oldest of their
/// incidents opened (an incident's events come after it, and a delivery's id holds its event's
/// time, or, made before the delivery log was reshaped, a later one), less
/// [`CLOCK_SKEW_MILLIS`] for the clocks of other hosts. An id that holds no time (not a
/// UUIDv7) leaves every day in.
fn read_floor(events: &[&FanOut], now: OffsetDateTime) -> Uuid {
    let mut low = (now.unix_timestamp_nanos() / 1_000_000) as u64;
    for event in events {
        for id in [event.incident_id, event.event_id] {
            low = low.min(v7_millis(id).unwrap_or(0));
        }
    }
    let low = low.saturating_sub(CLOCK_SKEW_MILLIS);
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(low) * 1_000_000)
        .map_or(Uuid::nil(), |at| day_floor(at.date()))
}

/// `sql/fan_out.sql` with its read floor written in (`$10`) as a literal: PostgreSQL then plans
/// only the partitions from that day on, once per connection and floor (a day, mostly today's
/// or yesterday's). With the floor a parameter, its generic plan held every partition, and was
/// made again on every connection whenever retention dropped a day: 22-25 ms at 37 partitions,
/// against 2.7-3.0 ms with the literal (psql, three runs each).
pub fn statement_from(floor: Uuid) -> String {
    include_str!("sql/fan_out.sql").replace("$10", &format!("'{floor}'::uuid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(incident_id: Uuid, event_id: Uuid) -> FanOut {
        FanOut {
            event_id,
            kind: EventKind::IncidentOpened,
            incident_id,
            test_webhook_id: None,
            redelivered: false,
        }
    }

    #[test]
    fn the_reads_start_the_day_of_an_hour_before_the_oldest_incident_opened() {
        let now = OffsetDateTime::now_utc();
        let v7 = |t: OffsetDateTime| {
            let secs = t.unix_timestamp() as u64;
            Uuid::new_v7(uuid::Timestamp::from_unix(
                uuid::NoContext,
                secs,
                t.nanosecond(),
            ))
        };
        let day = time::Duration::days(1);
        let events = [
            event(v7(now - day * 3), v7(now - day)),
            event(v7(now - day), v7(now)),
        ];
        let firsts: Vec<&FanOut> = events.iter().collect();
        let floor = read_floor(&firsts, now);
        let oldest: OffsetDateTime =
            now - day * 3 - time::Duration::milliseconds(CLOCK_SKEW_MILLIS as i64);
        assert_eq!(floor, day_floor(oldest.date()));
        // An incident whose id holds no time: every day.
        let events = [event(Uuid::new_v4(), v7(now))];
        assert_eq!(read_floor(&[&events[0]], now), Uuid::nil());
    }
}
