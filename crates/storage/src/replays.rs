//! Replays: the past events of a window given to one webhook that has no delivery of them yet
//! (a new integration brought up to date). Asking for one records it and answers at once;
//! dispatchers work through it a page of events at a time ([`advance`]), in the order the
//! events happened, each page in one transaction with its place in the window, so that any
//! window is worked through in bounded memory, by any number of dispatchers, and a dispatcher
//! that stops leaves the rest to the others.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_domain::EventKind;
use uuid::Uuid;

use crate::deliveries::Due;
use crate::fan_out::{self, FanOut, FanOutRules};
use crate::outbox;
use crate::schema::{events, replays};
use crate::{found, DbError};

/// A replay as asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReplay {
    pub webhook_id: Uuid,
    pub since: OffsetDateTime,
    /// `None`: up to now (events recorded after the replay was asked for have their own
    /// deliveries).
    pub until: Option<OffsetDateTime>,
    /// `None`: every kind the webhook subscribes to.
    pub kinds: Option<Vec<EventKind>>,
}

/// A replay and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = replays)]
pub struct Replay {
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub since: OffsetDateTime,
    pub until: Option<OffsetDateTime>,
    pub kinds: Option<Vec<String>>,
    pub cursor_at: OffsetDateTime,
    pub cursor_id: Uuid,
    /// Deliveries created so far.
    pub created: i64,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
}

/// Records a replay; dispatchers work through it. A window without an end ends now.
pub async fn create(conn: &mut AsyncPgConnection, new: &NewReplay) -> Result<Replay, DbError> {
    let now = OffsetDateTime::now_utc();
    let kinds: Option<Vec<String>> = new
        .kinds
        .as_ref()
        .map(|kinds| kinds.iter().map(|k| k.as_str().to_owned()).collect());
    Ok(diesel::insert_into(replays::table)
        .values((
            replays::id.eq(Uuid::now_v7()),
            replays::webhook_id.eq(new.webhook_id),
            replays::since.eq(new.since),
            replays::until.eq(new.until.unwrap_or(now)),
            replays::kinds.eq(kinds),
            replays::cursor_at.eq(new.since),
            replays::cursor_id.eq(Uuid::nil()),
            replays::created_at.eq(now),
        ))
        .returning(Replay::as_returning())
        .get_result(conn)
        .await?)
}

/// A replay by id.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Replay, DbError> {
    let row = replays::table.find(id).select(Replay::as_select());
    found::<Replay, Replay>(row.first(conn).await.optional()?)
}

/// What one step of a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advanced {
    pub replay_id: Uuid,
    /// Deliveries created by this page.
    pub created: usize,
    /// Whether the replay reached the end of its window.
    pub finished: bool,
}

/// Works through one page of at most `page` events of the oldest unfinished replay that no
/// other dispatcher is working on: gives them to its webhook as their fan-out would have
/// (subscription, filters and ordering apply; an event the webhook has a delivery of already
/// gets none), marks the deliveries `replayed`, enqueues their first attempts, and moves the
/// replay's place past the page, all in one transaction. `None` when no replay waits.
pub async fn advance(
    conn: &mut AsyncPgConnection,
    page: i64,
    lease_margin: std::time::Duration,
) -> Result<Option<Advanced>, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let Some(replay) = replays::table
            .filter(replays::finished_at.is_null())
            .order(replays::created_at)
            .for_update()
            .skip_locked()
            .select(Replay::as_select())
            .first(conn)
            .await
            .optional()?
        else {
            return Ok(None);
        };
        let mut query = events::table
            .filter(events::test_webhook_id.is_null())
            // The place reached, as a range the time index answers; the row comparison
            // below then skips the events of that instant already given.
            .filter(events::occurred_at.ge(replay.cursor_at.max(replay.since)))
            .filter(
                diesel::dsl::sql::<diesel::sql_types::Bool>("(events.occurred_at, events.id) > (")
                    .bind::<diesel::sql_types::Timestamptz, _>(replay.cursor_at)
                    .sql(", ")
                    .bind::<diesel::sql_types::Uuid, _>(replay.cursor_id)
                    .sql(")"),
            )
            .order((events::occurred_at.asc(), events::id.asc()))
            .limit(page)
            .select((
                events::id,
                events::kind,
                events::incident_id,
                events::occurred_at,
            ))
            .into_boxed();
        if let Some(until) = replay.until {
            query = query.filter(events::occurred_at.lt(until));
        }
        if let Some(kinds) = &replay.kinds {
            query = query.filter(events::kind.eq_any(kinds.clone()));
        }
        let rows: Vec<(Uuid, String, Uuid, OffsetDateTime)> = query.load(conn).await?;
        let mut requests = Vec::with_capacity(rows.len());
        for (event_id, kind, incident_id, _) in &rows {
            requests.push(FanOut {
                event_id: *event_id,
                kind: kind
                    .parse()
                    .map_err(|_| DbError::Corrupt(format!("event {event_id}: bad kind")))?,
                incident_id: *incident_id,
                test_webhook_id: None,
                redelivered: false,
            });
        }
        let rules = FanOutRules {
            claim: false,
            lease_margin,
            replay_to: Some(replay.webhook_id),
        };
        let fanned = fan_out::fan_out(conn, &requests, &[], rules).await?;
        let due: Vec<Due> = fanned
            .iter()
            .flat_map(|f| f.pending.iter().copied())
            .collect();
        let created: usize = fanned
            .iter()
            .map(|f| f.pending.len() + f.waiting + f.disabled + f.ordering)
            .sum();
        outbox::enqueue_automatic(conn, &due).await?;
        let finished = (rows.len() as i64) < page;
        let (cursor_at, cursor_id) = rows
            .last()
            .map(|(id, _, _, at)| (*at, *id))
            .unwrap_or((replay.cursor_at, replay.cursor_id));
        diesel::update(replays::table.find(replay.id))
            .set((
                replays::cursor_at.eq(cursor_at),
                replays::cursor_id.eq(cursor_id),
                replays::created.eq(replays::created + created as i64),
                replays::finished_at.eq(finished.then(OffsetDateTime::now_utc)),
            ))
            .execute(conn)
            .await?;
        Ok(Some(Advanced {
            replay_id: replay.id,
            created,
            finished,
        }))
    })
    .await
}
