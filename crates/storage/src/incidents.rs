//! Incidents: applying alert signals and status changes, each committed with the events it
//! emits and their outbox rows (the transactional outbox), and reading them back. A batch of
//! signals that only open incidents is one statement; the keys among them that had an open
//! incident already, and any other batch, are one transaction.

use std::collections::{BTreeMap, HashSet};

use diesel::prelude::*;
use diesel::upsert::DecoratableTarget;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::outbox::{self, NewEvent, OutboxRow, Wake};
use crate::schema::incidents;
use crate::statement::Statement;
use crate::{found, tokens, Cursor, DbError, Listed, Page};
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{
    EventKind, EventPayload, IncidentData, IncidentStatus, Severity, TransitionError,
};

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = incidents)]
struct IncidentRow {
    id: Uuid,
    dedup_key: String,
    title: String,
    severity: String,
    status: String,
    source: Option<String>,
    description: Option<String>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
    resolved_at: Option<OffsetDateTime>,
    labels: serde_json::Value,
}

/// An incident as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    pub id: Uuid,
    pub dedup_key: String,
    pub title: String,
    pub severity: Severity,
    pub status: IncidentStatus,
    pub source: Option<String>,
    pub description: Option<String>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub resolved_at: Option<OffsetDateTime>,
    /// The labels of the alert that opened it (subscription filters match them).
    pub labels: BTreeMap<String, String>,
}

impl Listed for Incident {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

impl TryFrom<IncidentRow> for Incident {
    type Error = DbError;
    fn try_from(row: IncidentRow) -> Result<Self, DbError> {
        let corrupt = |what: &str| DbError::Corrupt(format!("incident {}: bad {what}", row.id));
        Ok(Incident {
            severity: row.severity.parse().map_err(|_| corrupt("severity"))?,
            status: row.status.parse().map_err(|_| corrupt("status"))?,
            id: row.id,
            dedup_key: row.dedup_key,
            title: row.title,
            source: row.source,
            description: row.description,
            created_at: row.created_at,
            updated_at: row.updated_at,
            resolved_at: row.resolved_at,
            labels: serde_json::from_value(row.labels).map_err(|_| corrupt("labels"))?,
        })
    }
}

impl Incident {
    fn data(&self, previous_status: Option<IncidentStatus>) -> IncidentData {
        IncidentData {
            id: self.id,
            title: self.title.clone(),
            severity: self.severity,
            status: self.status,
            previous_status,
        }
    }
}

/// What a signal or a status change did to its incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// A new incident was opened.
    Opened,
    /// The open incident's status moved.
    StatusChanged { from: IncidentStatus },
    /// The incident was already in the asked-for state: nothing changed, nothing emitted.
    Unchanged,
    /// Acknowledge or resolve for a key with no open incident: accepted, nothing done.
    NoOpenIncident,
}

/// The result of applying one alert signal.
#[derive(Debug, Clone)]
pub struct SignalOutcome {
    pub dedup_key: String,
    pub action: AlertAction,
    pub change: Change,
    pub incident: Option<Incident>,
    pub events: Vec<NewEvent>,
}

/// One alert body: its signals, the headers the messages of the events they cause carry (the
/// trace context of the request that brought it; `None`: none), and the inbound token it came
/// with (`None`: none to check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertBody {
    pub signals: Vec<AlertSignal>,
    pub headers: Option<serde_json::Value>,
    /// Checked live in the statement or transaction that applies the body, so that a token
    /// revoked before then applies nothing, whatever its sender's process remembered of it.
    pub token: Option<Uuid>,
}

impl From<Vec<AlertSignal>> for AlertBody {
    fn from(signals: Vec<AlertSignal>) -> Self {
        AlertBody {
            signals,
            ..AlertBody::default()
        }
    }
}

/// What applying one alert body gave: its signals' outcomes, or [`TokenRevoked`] (nothing of
/// it applied).
pub type Applied = Result<Vec<SignalOutcome>, TokenRevoked>;

/// The inbound token an alert body came with was revoked (or deleted) before the body was
/// applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the inbound token was revoked")]
pub struct TokenRevoked;

impl SignalOutcome {
    /// Gives its events `headers`.
    fn with_headers(mut self, headers: Option<&serde_json::Value>) -> Self {
        if headers.is_some() {
            for event in &mut self.events {
                event.headers = headers.cloned();
            }
        }
        self
    }
}

/// The events of a change of `incident` at `at`.
pub fn events_for(incident: &Incident, change: Change, at: OffsetDateTime) -> Vec<NewEvent> {
    let event = |kind: EventKind, previous: Option<IncidentStatus>| {
        NewEvent::new(
            &EventPayload {
                event: kind,
                timestamp: at,
                data: incident.data(previous),
            },
            None,
        )
    };
    match change {
        Change::Opened => vec![event(EventKind::IncidentOpened, None)],
        Change::StatusChanged { from } => {
            let mut events = vec![event(EventKind::IncidentStatusChanged, Some(from))];
            if incident.status == IncidentStatus::Resolved {
                events.push(event(EventKind::IncidentResolved, None));
            }
            events
        }
        Change::Unchanged | Change::NoOpenIncident => Vec::new(),
    }
}

/// Applies the signals of several alert bodies in one transaction (one commit for all: ingest
/// gathers the alerts it receives concurrently), recording their events in the outbox with
/// their body's headers (`wake` says how relays learn of them). Concurrent signals for the
/// same new key open one incident. Answers per body; a body whose token is not live is not
/// applied.
pub async fn apply_alerts(
    conn: &mut AsyncPgConnection,
    bodies: &[AlertBody],
    wake: Wake,
) -> Result<Vec<Applied>, DbError> {
    // The database keeps microseconds: outcomes then hold what a read gives back.
    let now = truncate_to_micros(OffsetDateTime::now_utc());
    if let Some(answers) = open_all(conn, bodies, now, &wake).await? {
        return Ok(answers);
    }
    let (answers, rows) = conn
        .transaction::<_, DbError, _>(async |conn| {
            let revoked = tokens::not_live(conn, bodies.iter().filter_map(|b| b.token)).await?;
            let applies = |body: &AlertBody| body.token.is_none_or(|t| !revoked.contains(&t));
            // Keys are locked in key order, so that concurrent batches cannot deadlock; the sort is
            // stable, so signals for one key keep the order they came in.
            let mut order: Vec<(usize, usize)> = bodies
                .iter()
                .enumerate()
                .filter(|(_, body)| applies(body))
                .flat_map(|(n, body)| (0..body.signals.len()).map(move |signal| (n, signal)))
                .collect();
            let key = |(body, signal): &(usize, usize)| &bodies[*body].signals[*signal].dedup_key;
            order.sort_by(|a, b| key(a).cmp(key(b)));
            let mut applied: Vec<Vec<Option<SignalOutcome>>> = bodies
                .iter()
                .map(|body| vec![None; body.signals.len()])
                .collect();
            for (n, signal) in order {
                let body = &bodies[n];
                let outcome = apply_one(conn, &body.signals[signal], now).await?;
                applied[n][signal] = Some(outcome.with_headers(body.headers.as_ref()));
            }
            let answers: Vec<Applied> = applied
                .into_iter()
                .zip(bodies)
                .map(|(outcomes, body)| {
                    if applies(body) {
                        Ok(outcomes.into_iter().flatten().collect())
                    } else {
                        Err(TokenRevoked)
                    }
                })
                .collect();
            // Events go out in the order the alerts came in.
            let events: Vec<NewEvent> = answers
                .iter()
                .flatten()
                .flatten()
                .flat_map(|o| o.events.iter().cloned())
                .collect();
            let rows = outbox::record_events(conn, &events, &wake).await?;
            Ok((answers, rows))
        })
        .await?;
    wake.committed(rows);
    Ok(answers)
}

fn truncate_to_micros(at: OffsetDateTime) -> OffsetDateTime {
    at.replace_nanosecond(at.nanosecond() / 1_000 * 1_000)
        .unwrap_or(at)
}

/// The common case in one statement: when every signal of the batch is a trigger and no key
/// comes twice, the incidents, their `incidents.opened` events and their outbox rows are
/// inserted together by one statement that commits on its own (one round trip instead of one
/// per signal plus `BEGIN` and `COMMIT`). The keys that already had an open incident are then
/// applied as usual, in a transaction of their own; a trigger for an open incident writes
/// nothing unless that incident was resolved meanwhile. The statement checks the bodies'
/// tokens too, and applies nothing of a body whose token is not live. Any other batch gives
/// `None`, and is applied signal by signal in one transaction, where the order of signals for
/// one key matters.
/// Prepares the statement that opens a batch of incidents on `conn` (executed with no alert: it
/// changes nothing); see [`crate::warm`].
pub async fn prepare(conn: &mut AsyncPgConnection) -> Result<(), DbError> {
    let now = truncate_to_micros(OffsetDateTime::now_utc());
    open_all(conn, &[], now, &Wake::Listeners).await?;
    Ok(())
}

async fn open_all(
    conn: &mut AsyncPgConnection,
    bodies: &[AlertBody],
    now: OffsetDateTime,
    wake: &Wake,
) -> Result<Option<Vec<Applied>>, DbError> {
    use diesel::sql_types::{Array, Int4, Jsonb, Nullable, Text, Timestamptz};
    let signals: Vec<&AlertSignal> = bodies.iter().flat_map(|b| &b.signals).collect();
    // Each signal's body's headers.
    let headers: Vec<Option<&serde_json::Value>> = bodies
        .iter()
        .flat_map(|b| std::iter::repeat_n(b.headers.as_ref(), b.signals.len()))
        .collect();
    let mut keys: Vec<&str> = signals.iter().map(|s| s.dedup_key.as_str()).collect();
    keys.sort_unstable();
    let distinct = keys.windows(2).all(|pair| pair[0] != pair[1]);
    if !distinct || signals.iter().any(|s| s.action != AlertAction::Trigger) {
        return Ok(None);
    }
    // Each signal as the incident it would open, with the event that would announce it.
    let opening: Vec<(Incident, NewEvent)> = signals
        .iter()
        .zip(&headers)
        .map(|(signal, headers)| {
            let incident = Incident {
                id: Uuid::now_v7(),
                dedup_key: signal.dedup_key.clone(),
                title: signal.title.as_str().to_owned(),
                severity: signal.severity,
                status: IncidentStatus::Triggered,
                source: signal.source.clone(),
                description: signal.description.clone(),
                created_at: now,
                updated_at: now,
                resolved_at: None,
                labels: signal.labels.clone(),
            };
            let mut events = events_for(&incident, Change::Opened, now);
            let mut event = events.pop().expect("an opened incident has its event");
            event.headers = headers.cloned();
            (incident, event)
        })
        .collect();
    let column = |f: fn(&(Incident, NewEvent)) -> Option<&str>| -> Vec<Option<&str>> {
        opening.iter().map(f).collect()
    };
    let ids: Vec<Uuid> = opening.iter().map(|(i, _)| i.id).collect();
    let dedup_keys: Vec<&str> = opening.iter().map(|(i, _)| i.dedup_key.as_str()).collect();
    let titles: Vec<&str> = opening.iter().map(|(i, _)| i.title.as_str()).collect();
    let severities: Vec<&str> = opening.iter().map(|(i, _)| i.severity.as_str()).collect();
    let sources = column(|(i, _)| i.source.as_deref());
    let descriptions = column(|(i, _)| i.description.as_deref());
    let labels: Vec<serde_json::Value> = opening
        .iter()
        .map(|(i, _)| serde_json::to_value(&i.labels).unwrap_or_default())
        .collect();
    let event_ids: Vec<Uuid> = opening.iter().map(|(_, e)| e.id).collect();
    let event_bodies: Vec<&str> = opening.iter().map(|(_, e)| e.body.as_str()).collect();
    let arrival: Vec<i32> = (0..opening.len())
        .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
        .collect();
    let messages: Vec<Vec<u8>> = opening
        .iter()
        .map(|(_, e)| e.message().to_bytes())
        .collect();
    // No array at all when no body has headers (traces off).
    let message_headers: Option<Vec<Option<&serde_json::Value>>> =
        headers.iter().any(Option::is_some).then(|| headers.clone());
    // Each signal's body's token.
    let tokens: Vec<Option<Uuid>> = bodies
        .iter()
        .flat_map(|b| std::iter::repeat_n(b.token, b.signals.len()))
        .collect();
    let answered: Vec<OpenAllRow> = Statement::new(include_str!("sql/open_all.sql"))
        .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
        .bind::<Array<Text>, _>(&dedup_keys)
        .bind::<Array<Text>, _>(&titles)
        .bind::<Array<Text>, _>(&severities)
        .bind::<Array<Nullable<Text>>, _>(&sources)
        .bind::<Array<Nullable<Text>>, _>(&descriptions)
        .bind::<Array<diesel::sql_types::Uuid>, _>(&event_ids)
        .bind::<Array<Text>, _>(&event_bodies)
        .bind::<Array<Int4>, _>(&arrival)
        .bind::<Timestamptz, _>(now)
        .bind::<Array<diesel::sql_types::Binary>, _>(&messages)
        .bind::<Array<Jsonb>, _>(&labels)
        .bind::<Nullable<Array<Nullable<Jsonb>>>, _>(&message_headers)
        .bind::<Array<Nullable<diesel::sql_types::Uuid>>, _>(&tokens)
        .bind::<Nullable<Timestamptz>, _>(wake.held_until())
        .load(conn)
        .await?;
    let mut opened: HashSet<Uuid> = HashSet::new();
    let mut revoked: HashSet<Uuid> = HashSet::new();
    let mut queued: Vec<OutboxRow> = Vec::new();
    for row in answered {
        match row {
            OpenAllRow {
                id: Some(id),
                revoked: Some(false),
                ..
            } => {
                opened.insert(id);
            }
            OpenAllRow {
                id: Some(token),
                revoked: Some(true),
                ..
            } => {
                revoked.insert(token);
            }
            OpenAllRow {
                outbox_id: Some(id),
                topic: Some(topic),
                headers: Some(headers),
                payload: Some(payload),
                ..
            } => queued.push(OutboxRow {
                id,
                topic,
                headers,
                payload,
            }),
            _ => return Err(DbError::Corrupt("open_all: a row of no kind".into())),
        }
    }
    // Committed by the statement itself: out at once, before the keys taken are applied.
    match wake {
        Wake::Listeners if !queued.is_empty() => outbox::notify(conn).await?,
        _ => wake.committed(queued),
    }
    let applies = |token: &Option<Uuid>| token.is_none_or(|t| !revoked.contains(&t));
    // Keys with an open incident already, in key order as everywhere keys are locked.
    let mut taken: Vec<usize> = (0..signals.len())
        .filter(|&n| applies(&tokens[n]) && !opened.contains(&opening[n].0.id))
        .collect();
    taken.sort_by(|&a, &b| signals[a].dedup_key.cmp(&signals[b].dedup_key));
    let mut outcomes: Vec<Option<SignalOutcome>> = vec![None; signals.len()];
    if !taken.is_empty() {
        let (applied, rows) = conn
            .transaction::<_, DbError, _>(async |conn| {
                let mut applied = Vec::with_capacity(taken.len());
                for &n in &taken {
                    let outcome = apply_one(conn, signals[n], now).await?;
                    applied.push(outcome.with_headers(headers[n]));
                }
                let events: Vec<NewEvent> = applied
                    .iter()
                    .flat_map(|o| o.events.iter().cloned())
                    .collect();
                let rows = outbox::record_events(conn, &events, wake).await?;
                Ok((applied, rows))
            })
            .await?;
        wake.committed(rows);
        for (n, outcome) in taken.into_iter().zip(applied) {
            outcomes[n] = Some(outcome);
        }
    }
    let mut flat = outcomes.into_iter().zip(opening).zip(&signals).map(
        |((outcome, (incident, event)), signal)| {
            outcome.unwrap_or_else(|| SignalOutcome {
                dedup_key: signal.dedup_key.clone(),
                action: signal.action,
                change: Change::Opened,
                incident: Some(incident),
                events: vec![event],
            })
        },
    );
    Ok(Some(
        bodies
            .iter()
            .map(|body| {
                let outcomes = flat.by_ref().take(body.signals.len()).collect();
                if applies(&body.token) {
                    Ok(outcomes)
                } else {
                    Err(TokenRevoked)
                }
            })
            .collect(),
    ))
}

/// A row of `sql/open_all.sql`: an opened incident's id (`revoked` false), a token that is
/// not live (`revoked` true), or an outbox row written.
#[derive(QueryableByName)]
struct OpenAllRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Uuid>)]
    id: Option<Uuid>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    revoked: Option<bool>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    outbox_id: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    topic: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
    headers: Option<serde_json::Value>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Binary>)]
    payload: Option<Vec<u8>>,
}

async fn open_incident_for_update(
    conn: &mut AsyncPgConnection,
    key: &str,
) -> Result<Option<Incident>, DbError> {
    incidents::table
        .filter(incidents::dedup_key.eq(key))
        // A literal, as in the partial index's predicate: with a bound parameter, PostgreSQL's
        // generic plan cannot use `incidents_open_dedup_key` and scans the whole table.
        .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
            "status <> 'resolved'",
        ))
        .for_update()
        .select(IncidentRow::as_select())
        .first(conn)
        .await
        .optional()?
        .map(Incident::try_from)
        .transpose()
}

async fn apply_one(
    conn: &mut AsyncPgConnection,
    signal: &AlertSignal,
    now: OffsetDateTime,
) -> Result<SignalOutcome, DbError> {
    let outcome = |change, incident: Option<Incident>| {
        let events = incident
            .as_ref()
            .map(|i| events_for(i, change, now))
            .unwrap_or_default();
        SignalOutcome {
            dedup_key: signal.dedup_key.clone(),
            action: signal.action,
            change,
            incident,
            events,
        }
    };
    if signal.action == AlertAction::Trigger {
        // Insert first: a new key costs one statement. An open incident with the key makes the
        // insert do nothing (waiting for a concurrent opener to commit); it is read then.
        let inserted: Option<IncidentRow> = diesel::insert_into(incidents::table)
            .values((
                incidents::id.eq(Uuid::now_v7()),
                incidents::dedup_key.eq(&signal.dedup_key),
                incidents::title.eq(signal.title.as_str()),
                incidents::severity.eq(signal.severity.as_str()),
                incidents::status.eq(IncidentStatus::Triggered.as_str()),
                incidents::source.eq(signal.source.as_deref()),
                incidents::description.eq(signal.description.as_deref()),
                incidents::created_at.eq(now),
                incidents::updated_at.eq(now),
                incidents::labels.eq(serde_json::to_value(&signal.labels).unwrap_or_default()),
            ))
            .on_conflict(incidents::dedup_key)
            // A literal, not a bound parameter: PostgreSQL must match the partial index's
            // predicate when planning, which a generic plan over `$n` cannot do.
            .filter_target(diesel::dsl::sql::<diesel::sql_types::Bool>(
                "status <> 'resolved'",
            ))
            .do_nothing()
            .returning(IncidentRow::as_returning())
            .get_result(conn)
            .await
            .optional()?;
        if let Some(row) = inserted {
            return Ok(outcome(Change::Opened, Some(row.try_into()?)));
        }
        let open = open_incident_for_update(conn, &signal.dedup_key).await?;
        return Ok(outcome(Change::Unchanged, open));
    }
    let to = if signal.action == AlertAction::Resolve {
        IncidentStatus::Resolved
    } else {
        IncidentStatus::Acknowledged
    };
    match open_incident_for_update(conn, &signal.dedup_key).await? {
        None => Ok(outcome(Change::NoOpenIncident, None)),
        Some(open)
            if to == IncidentStatus::Acknowledged && open.status != IncidentStatus::Triggered =>
        {
            // Already acknowledged or further along: an acknowledge changes nothing.
            Ok(outcome(Change::Unchanged, Some(open)))
        }
        Some(open) => {
            let (incident, change) = set_status(conn, open, to, now).await?;
            Ok(outcome(change, Some(incident)))
        }
    }
}

async fn set_status(
    conn: &mut AsyncPgConnection,
    current: Incident,
    to: IncidentStatus,
    now: OffsetDateTime,
) -> Result<(Incident, Change), DbError> {
    let from = current.status;
    let resolved_at = (to == IncidentStatus::Resolved).then_some(now);
    let row: IncidentRow = diesel::update(incidents::table.find(current.id))
        .set((
            incidents::status.eq(to.as_str()),
            incidents::updated_at.eq(now),
            incidents::resolved_at.eq(resolved_at),
        ))
        .returning(IncidentRow::as_returning())
        .get_result(conn)
        .await?;
    Ok((row.try_into()?, Change::StatusChanged { from }))
}

/// Why an admin's status change was refused.
#[derive(Debug, thiserror::Error)]
pub enum StatusChangeError {
    #[error("incident not found")]
    NotFound,
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<diesel::result::Error> for StatusChangeError {
    fn from(error: diesel::result::Error) -> Self {
        StatusChangeError::Db(error.into())
    }
}

/// Moves an incident to `to` and records its events, in one transaction.
/// Asking for the status the incident already has changes nothing and emits nothing (so a
/// repeated request is harmless), even for a resolved incident.
pub async fn change_status(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    to: IncidentStatus,
) -> Result<(Incident, Vec<NewEvent>), StatusChangeError> {
    conn.transaction::<_, StatusChangeError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let current: Incident = incidents::table
            .find(id)
            .for_update()
            .select(IncidentRow::as_select())
            .first(conn)
            .await
            .optional()?
            .ok_or(StatusChangeError::NotFound)?
            .try_into()?;
        if current.status == to {
            return Ok((current, Vec::new()));
        }
        current.status.transition(to)?;
        let (incident, change) = set_status(conn, current, to, now).await?;
        let events = events_for(&incident, change, now);
        outbox::record_events(conn, &events, &Wake::Listeners).await?;
        Ok((incident, events))
    })
    .await
}

/// One incident.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Incident, DbError> {
    let row = incidents::table.find(id).select(IncidentRow::as_select());
    found(row.first(conn).await.optional()?)
}

/// Filters of the incident list.
#[derive(Debug, Clone, Default)]
pub struct IncidentFilter {
    pub status: Option<IncidentStatus>,
    pub severity: Option<Severity>,
}

/// Incidents, newest first.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &IncidentFilter,
    page: &Page,
) -> Result<(Vec<Incident>, Option<Cursor>), DbError> {
    let mut query = incidents::table
        .select(IncidentRow::as_select())
        .order((incidents::created_at.desc(), incidents::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(status) = filter.status {
        query = query.filter(incidents::status.eq(status.as_str()));
    }
    if let Some(severity) = filter.severity {
        query = query.filter(incidents::severity.eq(severity.as_str()));
    }
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("incidents"));
    }
    let rows: Vec<IncidentRow> = query.load(conn).await?;
    page.finish(rows)
}
