//! Incidents and their events: an incident's lifecycle through its signals, the one outbox row
//! of topic `event` that announces each recorded event (and no delivery), one incident for
//! concurrent alerts of a new key, a failed transaction that leaves no row behind, and a
//! revoked token's alerts applying nothing.

use std::collections::HashSet;

use diesel::QueryDsl;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tocsin_broker::messages::EventMessage;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::{EventKind, IncidentStatus, Severity, TransitionError};
use tocsin_storage::incidents::{self, AlertBody, Change};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::{schema, tokens};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{open, record_test_event, signal, webhook_for_every_event};

#[tokio::test]
async fn an_incident_moves_through_its_lifecycle_with_its_events() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    webhook_for_every_event(&mut conn, "every event").await;

    let opened = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(opened[0].change, Change::Opened);
    let incident = opened[0].incident.clone().unwrap();
    assert_eq!(incident.status, IncidentStatus::Triggered);
    assert_eq!(incident.severity, Severity::SEV2);
    let kinds: Vec<EventKind> = opened[0].events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::IncidentOpened]);
    let body: serde_json::Value = serde_json::from_str(&opened[0].events[0].body).unwrap();
    assert_eq!(body["data"]["id"], incident.id.to_string());
    assert_eq!(body["data"]["status"], "triggered");

    let repeated = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(repeated[0].change, Change::Unchanged);
    assert!(repeated[0].events.is_empty());

    let acked = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Acknowledge)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(
        acked[0].change,
        Change::StatusChanged {
            from: IncidentStatus::Triggered
        }
    );
    let kinds: Vec<EventKind> = acked[0].events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::IncidentStatusChanged]);

    let resolved = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Resolve)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let kinds: Vec<EventKind> = resolved[0].events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::IncidentStatusChanged,
            EventKind::IncidentResolved
        ]
    );
    let changed: serde_json::Value = serde_json::from_str(&resolved[0].events[0].body).unwrap();
    assert_eq!(changed["data"]["previous_status"], "acknowledged");
    assert_eq!(changed["data"]["status"], "resolved");

    let nothing = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Resolve)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(nothing[0].change, Change::NoOpenIncident);

    // Resolved is final: the same key opens a new incident.
    let reopened = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(reopened[0].change, Change::Opened);
    assert_ne!(reopened[0].incident.as_ref().unwrap().id, incident.id);

    // Every event of the story waits in the outbox for the events exchange, in order:
    // 1 + 1 + 2 + 1. Deliveries are the dispatchers' to make: none yet, subscriber or not.
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 5);
    let mut kinds = Vec::new();
    for row in outbox::claim_and_mark(&mut conn, 10, 0).await.unwrap() {
        assert_eq!(row.topic(), Some(outbox::Topic::Event));
        let message = EventMessage::from_bytes(&row.payload).unwrap();
        kinds.push(message.event.as_str().to_owned());
    }
    assert_eq!(
        kinds,
        [
            "incidents.opened",
            "incidents.status_changed",
            "incidents.status_changed",
            "incidents.resolved",
            "incidents.opened"
        ]
    );
    assert_eq!(db.count("deliveries").await, 0);

    let refused = incidents::change_status(&mut conn, incident.id, IncidentStatus::Triggered).await;
    assert!(matches!(
        refused,
        Err(incidents::StatusChangeError::Transition(
            TransitionError::FromResolved
        ))
    ));
}

/// Every path that records events (ingest's one-statement batch of triggers, the general
/// transaction, an admin's status change, a test event) writes each event with one outbox row
/// of topic `event` whose payload is its [`EventMessage`], in the order the events happened, and
/// no delivery. An event nobody subscribes to is announced all the same: the events exchange is
/// an integration point of its own.
#[tokio::test]
async fn recording_events_writes_one_event_outbox_row_per_event_and_no_delivery() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let alone = open(&mut conn, "alone").await;
    assert_eq!(
        outbox_messages(&mut conn).await,
        [alone.message()],
        "announced with no subscriber"
    );

    let webhook = webhook_for_every_event(&mut conn, "every event").await;
    let mut expected = vec![alone.clone()];
    let batch = incidents::apply_alerts(
        &mut conn,
        &[
            vec![signal("a", AlertAction::Trigger)].into(),
            vec![signal("b", AlertAction::Trigger)].into(),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    expected.extend(
        batch
            .iter()
            .flatten()
            .flatten()
            .flat_map(|o| o.events.clone()),
    );
    let general = tocsin_testkit::apply_signals(
        &mut conn,
        &[
            signal("c", AlertAction::Trigger),
            signal("c", AlertAction::Acknowledge),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    expected.extend(general.iter().flat_map(|o| o.events.clone()));
    let incident_c = general[0].incident.as_ref().unwrap().id;
    let (_, changed) = incidents::change_status(&mut conn, incident_c, IncidentStatus::Resolved)
        .await
        .unwrap();
    expected.extend(changed);
    let test = record_test_event(&mut conn, webhook.id).await;
    expected.push(test.clone());

    let kinds: Vec<EventKind> = expected.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::IncidentOpened,
            EventKind::IncidentOpened,
            EventKind::IncidentOpened,
            EventKind::IncidentOpened,
            EventKind::IncidentStatusChanged,
            EventKind::IncidentStatusChanged,
            EventKind::IncidentResolved,
            EventKind::IncidentOpened,
        ]
    );
    let messages = outbox_messages(&mut conn).await;
    assert_eq!(
        messages,
        expected.iter().map(NewEvent::message).collect::<Vec<_>>()
    );
    assert_eq!(messages[7].test_webhook_id, Some(webhook.id));
    assert_eq!(
        db.count("outbox WHERE topic = 'event' AND headers = '{}'")
            .await,
        8
    );
    assert_eq!(db.count("events").await, 8);
    assert_eq!(db.count("deliveries").await, 0);
}

/// The event messages of every outbox row, in id order (all rows must be of topic `event`).
async fn outbox_messages(conn: &mut AsyncPgConnection) -> Vec<EventMessage> {
    use schema::outbox::dsl;
    let rows: Vec<(String, Vec<u8>)> = dsl::outbox
        .order(dsl::id)
        .select((dsl::topic, dsl::payload))
        .load(conn)
        .await
        .unwrap();
    rows.into_iter()
        .map(|(topic, payload)| {
            assert_eq!(topic, "event");
            EventMessage::from_bytes(&payload).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn fifty_concurrent_alerts_with_one_new_key_open_one_incident() {
    let db = TestDb::new().await;
    let pool = db.pool();
    webhook_for_every_event(&mut pool.get().await.unwrap(), "every event").await;
    let tasks = (0..50).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.get().await.unwrap();
            tocsin_testkit::apply_signals(
                &mut conn,
                &[signal("race", AlertAction::Trigger)],
                outbox::Wake::Listeners,
            )
            .await
            .unwrap()
        })
    });
    let outcomes = futures::future::join_all(tasks).await;
    let opened = outcomes
        .iter()
        .filter(|o| o.as_ref().unwrap()[0].change == Change::Opened)
        .count();
    assert_eq!(opened, 1);
    let ids: HashSet<_> = outcomes
        .iter()
        .map(|o| o.as_ref().unwrap()[0].incident.as_ref().unwrap().id)
        .collect();
    assert_eq!(ids.len(), 1, "everyone sees the one incident");
    assert_eq!(db.count("incidents").await, 1);
    let mut conn = pool.get().await.unwrap();
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 1);
}

#[tokio::test]
async fn many_incidents_open_on_one_connection() {
    // PostgreSQL switches a prepared statement to a generic plan after five runs: the upsert
    // against the partial unique index must keep working past that, outbox rows included.
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    webhook_for_every_event(&mut conn, "every event").await;
    for i in 0..12 {
        let outcome = tocsin_testkit::apply_signals(
            &mut conn,
            &[signal(&format!("key-{i}"), AlertAction::Trigger)],
            outbox::Wake::Listeners,
        )
        .await
        .unwrap_or_else(|e| panic!("incident {i}: {e}"));
        assert_eq!(outcome[0].change, Change::Opened);
    }
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 12);
}

#[tokio::test]
async fn a_failed_transaction_leaves_no_row_behind() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    webhook_for_every_event(&mut conn, "every event").await;
    let mut too_long = signal("x", AlertAction::Trigger);
    // A key the database refuses (NUL bytes are not valid in PostgreSQL text).
    too_long.dedup_key = "bad\0key".into();
    let good = signal("good", AlertAction::Trigger);
    let result =
        tocsin_testkit::apply_signals(&mut conn, &[good, too_long], outbox::Wake::Listeners).await;
    assert!(result.is_err());
    assert_eq!(
        db.count("incidents").await,
        0,
        "the good signal was rolled back with the bad one"
    );
    assert_eq!(db.count("events").await, 0);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);
}

/// A body whose token was revoked applies nothing, whichever way its batch is written (the one
/// statement that opens new keys, or the transaction), while the rest of its batch is applied.
#[tokio::test]
async fn a_body_whose_token_was_revoked_applies_nothing_and_its_batch_goes_on() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let (live, _) = tokens::create(&mut conn, "live").await.unwrap();
    let (revoked, _) = tokens::create(&mut conn, "revoked").await.unwrap();
    tokens::revoke(&mut conn, revoked.id).await.unwrap();
    let body = |key: &str, action, token: Uuid| AlertBody {
        signals: vec![signal(key, action)],
        headers: None,
        token: Some(token),
    };

    // New keys only: the one statement.
    let answers = incidents::apply_alerts(
        &mut conn,
        &[
            body("a", AlertAction::Trigger, live.id),
            body("b", AlertAction::Trigger, revoked.id),
            body("c", AlertAction::Trigger, live.id),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert!(matches!(answers[1], Err(incidents::TokenRevoked)));
    for n in [0, 2] {
        let outcomes = answers[n].as_ref().expect("a live token's body is applied");
        assert_eq!(outcomes[0].change, Change::Opened);
    }
    assert_eq!(db.count("incidents WHERE dedup_key = 'b'").await, 0);
    assert_eq!(db.count("events").await, 2);
    assert_eq!(db.count("outbox").await, 2);

    // An acknowledge among them: the transaction.
    let answers = incidents::apply_alerts(
        &mut conn,
        &[
            body("a", AlertAction::Acknowledge, live.id),
            body("c", AlertAction::Acknowledge, revoked.id),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let acknowledged = answers[0].as_ref().expect("a live token's body is applied");
    assert!(matches!(
        acknowledged[0].change,
        Change::StatusChanged { .. }
    ));
    assert!(matches!(answers[1], Err(incidents::TokenRevoked)));
    assert_eq!(
        db.count("incidents WHERE status = 'acknowledged'").await,
        1,
        "only the live token's acknowledge"
    );
    assert_eq!(db.count("events").await, 3);
    assert_eq!(db.count("outbox").await, 3);
}
