//! Storage against the real PostgreSQL: migrations, incidents and their events with the outbox
//! rows that announce them, and the delivery engine's repository: fan-out, the claim of each
//! attempt before it is sent, its completion, waiting for room, the sweeper's queries, stopping a
//! webhook's deliveries, and retention.

use std::collections::HashSet;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use time::OffsetDateTime;
use tocsin_broker::messages::EventMessage;
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::delivery::{Transition, Trigger, WaitReason};
use tocsin_domain::{
    EventKind, EventPayload, IncidentData, IncidentStatus, IncidentTitle, RetrySchedule,
    RetrySettings, Severity, TargetUrl, TransitionError, WebhookName,
};
use tocsin_storage::attempts::{
    self, AttemptResult, Claim, ClaimRules, Completed, Completion, Job,
};
use tocsin_storage::deliveries::{self, Delivery, DeliveryState, Due};
use tocsin_storage::fan_out::{self, FanOut, FanOutRules, FannedOut};
use tocsin_storage::incidents::{self, Change};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::schema;
use tocsin_storage::webhooks::{self, NewWebhook, Webhook, WebhookChanges};
use tocsin_testkit::deliveries::{answered, claim_rules, mark_failed, record_attempt};
use tocsin_testkit::{wait_until, TestDb};
use uuid::Uuid;

pub(crate) const DEADLINE: Duration = Duration::from_secs(15);

pub(crate) fn signal(key: &str, action: AlertAction) -> AlertSignal {
    AlertSignal {
        dedup_key: key.to_owned(),
        action,
        title: IncidentTitle::parse("Disk full on db-1").unwrap(),
        severity: Severity::SEV2,
        description: None,
        source: Some("test".into()),
        reply_key: None,
        labels: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Migrations

#[tokio::test]
async fn migrations_apply_twice_without_error() {
    let db = TestDb::empty().await;
    let first = tocsin_storage::migrate(&db.url)
        .await
        .expect("first migration run");
    assert!(first >= 1, "a fresh database gets every migration");
    let second = tocsin_storage::migrate(&db.url)
        .await
        .expect("second migration run");
    assert_eq!(second, 0, "nothing is pending the second time");
}

#[tokio::test]
async fn concurrent_migrations_serialise_on_the_lock() {
    let db = TestDb::empty().await;
    let runs = futures::future::join_all((0..4).map(|_| tocsin_storage::migrate(&db.url))).await;
    let applied: usize = runs.into_iter().map(|r| r.expect("migration run")).sum();
    assert_eq!(
        applied,
        tocsin_storage::migration_count(),
        "each migration applied exactly once in all"
    );
}

/// What the previous release left in its database: a webhook marked slow, deliveries held apart
/// in `held_deliveries` (one of them, 13, also written as a delivery by a pod of the release
/// before, and attempted once), a delivery row still `held` (14), and the first attempt of 14
/// written for the deferral queue, unpublished.
const PREVIOUS_RELEASE_ROWS: &str = "
INSERT INTO webhooks (id, name, url, events, max_attempts, timeout_ms, secret, created_at,
    updated_at, slow_until)
VALUES ('00000000-0000-7000-8000-000000000001', 'slow', 'http://127.0.0.1:9/',
    '{incidents.opened}', 5, 10000, 'whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', now(), now(),
    now() + interval '1 minute');
INSERT INTO events (id, kind, incident_id, occurred_at, body)
SELECT ('00000000-0000-7000-8000-00000000001' || n)::uuid, 'incidents.opened', gen_random_uuid(),
    now() - interval '2 hours', '{}'
FROM generate_series(1, 4) n;
INSERT INTO held_deliveries (webhook_id, event_id, held_at) VALUES
    ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000011',
        now() - interval '60 minutes'),
    ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000012',
        now() - interval '30 minutes'),
    ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000013',
        now() - interval '20 minutes');
INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state, attempt_count,
    auto_attempts, held, next_attempt_at, created_at, updated_at)
SELECT ('00000000-0000-7000-8000-00000000010' || n)::uuid, '00000000-0000-7000-8000-000000000001',
    e.id, e.kind, e.incident_id, CASE n WHEN 3 THEN 'retrying' ELSE 'pending' END,
    CASE n WHEN 3 THEN 1 ELSE 0 END, CASE n WHEN 3 THEN 1 ELSE 0 END, n = 4,
    now() + interval '1 minute', now() - interval '10 minutes', now()
FROM events e
JOIN generate_series(3, 4) n ON e.id = ('00000000-0000-7000-8000-00000000001' || n)::uuid;
INSERT INTO attempts (delivery_id, number, trigger, started_at, success, status_code, duration_ms,
    request_headers)
VALUES ('00000000-0000-7000-8000-000000000103', 1, 'automatic', now() - interval '5 minutes',
    false, 500, 12, '{}');
INSERT INTO outbox (topic, headers, payload) VALUES ('deferred',
    '{\"tocsin-attempt\": 1, \"tocsin-trigger\": \"automatic\",
      \"tocsin-webhook\": \"00000000-0000-7000-8000-000000000001\"}',
    convert_to('{\"delivery_id\": \"00000000-0000-7000-8000-000000000104\"}', 'UTF8'));";

/// The migration to one delivery engine makes the previous release's held deliveries pending
/// deliveries in the log, in their place by the time they were held (a pair with its delivery
/// already keeps that one), turns its unpublished deferred first attempts into delivery-queue
/// rows and drops what only that release used; the new engine then works on the rows it left.
/// Its `down.sql` gives the previous release a schema it can run on: waiting deliveries become
/// pending, attempts under way are recorded as failed, and the removed tables and columns return.
#[tokio::test]
async fn the_one_engine_migration_makes_held_and_deferred_rows_deliveries_and_down_reverts_it() {
    use diesel::connection::SimpleConnection;
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
    use diesel_migrations::MigrationHarness;
    let db = TestDb::empty().await;
    let conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let mut wrapper: AsyncConnectionWrapper<AsyncPgConnection> = conn.into();
    let mut wrapper = tokio::task::spawn_blocking(move || {
        // Up to the one before it (the migrations after it are applied next).
        while wrapper
            .pending_migrations(tocsin_storage::MIGRATIONS)
            .unwrap()[0]
            .name()
            .version()
            .to_string()
            != "20261124000000"
        {
            wrapper
                .run_next_migration(tocsin_storage::MIGRATIONS)
                .unwrap();
        }
        SimpleConnection::batch_execute(&mut wrapper, PREVIOUS_RELEASE_ROWS).unwrap();
        let applied = wrapper
            .run_next_migration(tocsin_storage::MIGRATIONS)
            .unwrap();
        assert_eq!(
            applied.to_string(),
            "20261124000000",
            "the one-engine migration"
        );
        wrapper
            .run_pending_migrations(tocsin_storage::MIGRATIONS)
            .unwrap();
        wrapper
    })
    .await
    .unwrap();
    let pair = |event: &str| format!("00000000-0000-7000-8000-0000000000{event}");

    assert_eq!(
        db.count("pg_tables WHERE tablename = 'held_deliveries'")
            .await,
        0
    );
    assert_eq!(
        db.count(
            "information_schema.columns WHERE (table_name, column_name)
             IN (('deliveries', 'held'), ('webhooks', 'slow_until'))"
        )
        .await,
        0
    );
    assert_eq!(db.count("deliveries").await, 4, "one delivery per event");
    for (event, held_minutes_ago) in [("11", 60), ("12", 30)] {
        assert_eq!(
            db.count(&format!(
                "deliveries d JOIN events e ON e.id = d.event_id
                 WHERE d.event_id = '{}' AND d.event = e.kind AND d.incident_id = e.incident_id
                 AND d.webhook_id = '00000000-0000-7000-8000-000000000001'
                 AND d.state = 'pending' AND d.attempt_count = 0 AND d.auto_attempts = 0
                 AND d.wait_reason IS NULL AND d.attempting_until IS NULL
                 AND d.next_attempt_at BETWEEN now() - interval '1 minute' AND now()
                 AND d.created_at BETWEEN now() - interval '{} minutes'
                     AND now() - interval '{} minutes'",
                pair(event),
                held_minutes_ago + 1,
                held_minutes_ago - 1
            ))
            .await,
            1,
            "the held pair of event {event} is a pending delivery due now, logged when held"
        );
    }
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE event_id = '{}' AND id = '00000000-0000-7000-8000-000000000103'
             AND state = 'retrying' AND attempt_count = 1",
            pair("13")
        ))
        .await,
        1,
        "a pair with its delivery already keeps that delivery"
    );
    assert_eq!(
        db.count(
            "deliveries WHERE id = '00000000-0000-7000-8000-000000000104' AND state = 'pending'"
        )
        .await,
        1,
        "a row still held is an ordinary delivery"
    );
    assert_eq!(db.count("outbox WHERE topic = 'deferred'").await, 0);
    assert_eq!(
        db.count(
            "outbox WHERE topic = 'delivery' AND published_at IS NULL
             AND convert_from(payload, 'UTF8')::jsonb ->> 'delivery_id'
                 = '00000000-0000-7000-8000-000000000104'"
        )
        .await,
        1,
        "the deferred first attempt goes to the delivery queue"
    );

    // The new engine on the rows the migration left: an attempt under way, a waiting delivery
    // and an interrupted attempt, for the way back.
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let held_11 = delivery_of_event(&mut conn, &pair("11")).await;
    let held_12 = delivery_of_event(&mut conn, &pair("12")).await;
    let under_way = claim_auto(&mut conn, held_11, 0)
        .await
        .expect("a migrated pending delivery is claimed");
    assert_eq!(under_way.number, 1);
    let webhook_id: Uuid = "00000000-0000-7000-8000-000000000001".parse().unwrap();
    assert_eq!(
        deliveries::wait(
            &mut conn,
            &[Due {
                delivery_id: held_12,
                webhook_id,
                auto_attempts: 0,
            }],
            WaitReason::WebhookBusy,
        )
        .await
        .unwrap(),
        [true]
    );
    let attempted: Uuid = "00000000-0000-7000-8000-000000000103".parse().unwrap();
    let second = claim_auto(&mut conn, attempted, 1)
        .await
        .expect("the attempted delivery's next attempt is claimed");
    assert_eq!(second.number, 2);
    let interrupted = Completion {
        result: AttemptResult::interrupted(),
        ..completion(&second, answered(500))
    };
    assert!(complete(&mut conn, interrupted).await.unwrap().moved);
    drop(conn);

    tokio::task::spawn_blocking(move || {
        // Every later migration, then the one-engine migration itself.
        loop {
            let reverted = wrapper
                .revert_last_migration(tocsin_storage::MIGRATIONS)
                .unwrap();
            if reverted.to_string() == "20261124000000" {
                break;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(db.count("deliveries").await, 4, "no delivery is lost");
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE id = '{held_12}' AND state = 'pending'
             AND next_attempt_at BETWEEN now() - interval '1 minute' AND now()"
        ))
        .await,
        1,
        "a waiting delivery becomes pending, due now"
    );
    assert_eq!(
        db.count(&format!(
            "attempts WHERE delivery_id = '{held_11}' AND number = 1 AND success = false
             AND duration_ms = 0 AND error = 'other'
             AND error_detail = 'under way when the schema was rolled back'"
        ))
        .await,
        1,
        "an attempt under way is recorded as failed"
    );
    assert_eq!(
        db.count(&format!(
            "attempts WHERE delivery_id = '{attempted}' AND number = 2 AND error = 'other'"
        ))
        .await,
        1,
        "an interrupted attempt is an `other` error to the previous release"
    );
    assert_eq!(
        db.count(
            "information_schema.columns WHERE (table_name, column_name)
             IN (('deliveries', 'held'), ('webhooks', 'slow_until'))"
        )
        .await,
        2
    );
    assert_eq!(
        db.count(
            "information_schema.columns WHERE table_name = 'deliveries'
             AND column_name IN ('wait_reason', 'attempting_until')"
        )
        .await,
        0
    );
    assert_eq!(
        db.count(
            "information_schema.columns WHERE table_name = 'attempts'
             AND column_name IN ('success', 'duration_ms') AND is_nullable = 'NO'"
        )
        .await,
        2
    );
    // The previous release writes its rows again, and no `waiting` state.
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    conn.batch_execute(&format!(
        "INSERT INTO outbox (topic, payload) VALUES ('deferred', '\\x00');
         INSERT INTO held_deliveries (webhook_id, event_id, held_at)
         VALUES ('{webhook_id}', '{}', now());",
        pair("11")
    ))
    .await
    .expect("the previous release's rows are accepted again");
    assert!(conn
        .batch_execute(&format!(
            "UPDATE deliveries SET state = 'waiting' WHERE id = '{held_12}'"
        ))
        .await
        .is_err());
}

async fn delivery_of_event(conn: &mut AsyncPgConnection, event_id: &str) -> Uuid {
    use schema::deliveries::dsl;
    dsl::deliveries
        .filter(dsl::event_id.eq(event_id.parse::<Uuid>().unwrap()))
        .select(dsl::id)
        .first(conn)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Incidents and their events

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
    for row in outbox::claim_and_mark(&mut conn, 10).await.unwrap() {
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
        outbox::Wake::Caller,
    )
    .await
    .unwrap();
    expected.extend(batch.iter().flatten().flat_map(|o| o.events.clone()));
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

// ---------------------------------------------------------------------------------------------
// Fan-out

/// One delivery per enabled, undeleted webhook subscribed to the event's kind, due now and not
/// attempted; a disabled webhook's delivery is listed `waiting` (`webhook_disabled`); fanned
/// out again (a redelivered message, or the same event twice in a batch), an event creates
/// nothing more.
#[tokio::test]
async fn fan_out_delivers_to_undeleted_subscribed_webhooks_once_and_a_disabled_ones_wait() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let opened = webhook(&mut conn, "opened", &[EventKind::IncidentOpened], 5).await;
    let resolved = webhook(&mut conn, "resolved", &[EventKind::IncidentResolved], 5).await;
    let off = webhook(&mut conn, "off", &[EventKind::IncidentOpened], 5).await;
    webhooks::update(&mut conn, off.id, &disable())
        .await
        .unwrap();
    let deleted = webhook(&mut conn, "deleted", &[EventKind::IncidentOpened], 5).await;
    webhooks::delete(&mut conn, deleted.id).await.unwrap();

    let a = open(&mut conn, "a").await;
    let b = open(&mut conn, "b").await;
    // b given twice in one batch, as a dispatcher gathering concurrent messages may.
    let requests = [
        fan_out_request(&a, false),
        fan_out_request(&b, false),
        fan_out_request(&b, false),
    ];
    let before = OffsetDateTime::now_utc();
    let fanned = fan_out::fan_out(&mut conn, &requests, &[], PENDING)
        .await
        .unwrap();
    assert_eq!(fanned.len(), 3, "an answer per request");
    for (n, event) in [(0, &a), (1, &b)] {
        assert_eq!(fanned[n].waiting, 0);
        assert_eq!(fanned[n].disabled, 1, "`off` gets its delivery, waiting");
        assert_eq!(
            fanned[n].pending.len(),
            1,
            "only `opened` gets {:?}",
            event.kind
        );
        let due = fanned[n].pending[0];
        assert_eq!((due.webhook_id, due.auto_attempts), (opened.id, 0));
        let delivery = deliveries::get(&mut conn, due.delivery_id).await.unwrap();
        assert_eq!(
            (
                delivery.event_id,
                delivery.event,
                delivery.incident_id,
                delivery.state,
                delivery.wait_reason,
                delivery.attempt_count,
                delivery.auto_attempts,
            ),
            (
                event.id,
                event.kind,
                event.incident_id,
                DeliveryState::Pending,
                None,
                0,
                0
            )
        );
        let due_at = delivery.next_attempt_at.unwrap();
        assert_between(due_at, before, OffsetDateTime::now_utc(), "due now");
    }
    assert!(nothing(&fanned[2]), "the second copy creates none");
    assert_eq!(db.count("deliveries").await, 4);

    let again = fan_out::fan_out(&mut conn, &requests[..2], &[], PENDING)
        .await
        .unwrap();
    assert!(again.iter().all(nothing), "idempotent");
    assert_eq!(db.count("deliveries").await, 4);

    // An event nobody subscribes to makes no delivery; resolving makes one to `resolved`.
    let resolution = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("a", AlertAction::Resolve)],
        outbox::Wake::Caller,
    )
    .await
    .unwrap()[0]
        .events
        .clone();
    let requests: Vec<FanOut> = resolution
        .iter()
        .map(|e| fan_out_request(e, false))
        .collect();
    let fanned = fan_out::fan_out(&mut conn, &requests, &[], PENDING)
        .await
        .unwrap();
    assert!(nothing(&fanned[0]), "status_changed: nobody");
    assert_eq!(fanned[1].pending.len(), 1);
    assert_eq!(fanned[1].pending[0].webhook_id, resolved.id);
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE webhook_id = '{}' AND state = 'waiting'
             AND wait_reason = 'webhook_disabled' AND attempt_count = 0",
            off.id
        ))
        .await,
        2
    );
    assert_eq!(
        db.count(&format!("deliveries WHERE webhook_id = '{}'", deleted.id))
            .await,
        0
    );
}

/// With claims asked for (as a dispatcher fans out), each delivery not `waiting` starts with
/// its first attempt claimed in the fan-out's own statement: counted, leased, logged with no
/// outcome yet, and handed back ready to make. A busy webhook's delivery starts `waiting`. A
/// redelivered event claims nothing twice.
#[tokio::test]
async fn a_fan_out_claims_the_first_attempts_of_the_deliveries_it_creates() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let free = webhook(&mut conn, "free", &[EventKind::IncidentOpened], 5).await;
    let busy = webhook(&mut conn, "busy", &[EventKind::IncidentOpened], 5).await;
    let event = open(&mut conn, "claimed").await;
    let rules = FanOutRules {
        claim: true,
        lease_margin: Duration::from_secs(5),
        replay_to: None,
    };
    let fanned = fan_out::fan_out(
        &mut conn,
        &[fan_out_request(&event, false)],
        &[(busy.id, 0)],
        rules,
    )
    .await
    .unwrap()
    .pop()
    .unwrap();
    assert_eq!(fanned.waiting, 1);
    assert!(fanned.pending.is_empty());
    assert_eq!(fanned.claimed.len(), 1);
    let job = &fanned.claimed[0];
    assert_eq!(
        (
            job.webhook.id,
            job.number,
            job.trigger,
            job.delivery.auto_attempts,
            job.delivery.attempt_count,
            job.delivery.state,
        ),
        (free.id, 1, Trigger::Automatic, 1, 1, DeliveryState::Pending)
    );
    assert_eq!(job.body, event.body);
    let attempts = deliveries::get_detail(&mut conn, job.delivery.id)
        .await
        .unwrap()
        .attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!((attempts[0].number, attempts[0].success), (1, None));
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE id = '{}' AND attempting_until > now()",
            job.delivery.id
        ))
        .await,
        1,
        "leased"
    );
    let claim = Claim {
        delivery_id: job.delivery.id,
        trigger: Trigger::Automatic,
        expected_auto_attempts: 0,
    };
    let again = attempts::claim(&mut conn, &[claim], claim_rules())
        .await
        .unwrap();
    assert!(again[0].is_none(), "the first attempt is claimed once");
    let refanned = fan_out::fan_out(&mut conn, &[fan_out_request(&event, true)], &[], rules)
        .await
        .unwrap();
    assert!(refanned.iter().all(nothing), "nothing claimed twice");
    assert_eq!(db.count("attempts").await, 1);
}

/// A delivery to a webhook the fanning dispatcher has no room for starts `waiting`, with its
/// reason, and is not handed back for an attempt.
#[tokio::test]
async fn fan_out_starts_deliveries_to_busy_webhooks_waiting() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let free = webhook_for_every_event(&mut conn, "free").await;
    let busy = webhook_for_every_event(&mut conn, "busy").await;
    let event = open(&mut conn, "busy").await;
    let fanned = fan_out(&mut conn, &event, &[busy.id, Uuid::now_v7()]).await;
    assert_eq!(fanned.waiting, 1);
    assert_eq!(fanned.pending.len(), 1);
    assert_eq!(fanned.pending[0].webhook_id, free.id);
    let waiting = deliveries_of(&mut conn, busy.id).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].state, DeliveryState::Waiting);
    assert_eq!(waiting[0].wait_reason, Some(WaitReason::WebhookBusy));
    assert_eq!(waiting[0].attempt_count, 0);
    let pending = deliveries::get(&mut conn, fanned.pending[0].delivery_id)
        .await
        .unwrap();
    assert_eq!(pending.state, DeliveryState::Pending);
    assert_eq!(pending.wait_reason, None);
}

/// The broker redelivers an event whose dispatcher stopped after the fan-out: the deliveries
/// still pending with no attempt are handed back (a fresh copy of the message, not marked
/// redelivered, gets nothing); one attempted meanwhile or waiting is not.
#[tokio::test]
async fn a_redelivered_event_returns_its_deliveries_still_without_an_attempt() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let attempted = webhook_for_every_event(&mut conn, "attempted").await;
    let untouched = webhook_for_every_event(&mut conn, "untouched").await;
    let busy = webhook_for_every_event(&mut conn, "busy").await;
    let event = open(&mut conn, "redelivered").await;
    let first = fan_out(&mut conn, &event, &[busy.id]).await;
    assert_eq!(first.pending.len(), 2);
    assert_eq!(first.waiting, 1);
    let to_attempted = first
        .pending
        .iter()
        .find(|d| d.webhook_id == attempted.id)
        .unwrap();
    claim_auto(&mut conn, to_attempted.delivery_id, 0)
        .await
        .expect("the first attempt is claimed");

    let again = fan_out::fan_out(&mut conn, &[fan_out_request(&event, true)], &[], PENDING)
        .await
        .unwrap();
    let untouched_due = *first
        .pending
        .iter()
        .find(|d| d.webhook_id == untouched.id)
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].pending, [untouched_due]);
    assert!(again[0].claimed.is_empty());
    assert_eq!(again[0].waiting, 0);
    let fresh = fan_out::fan_out(&mut conn, &[fan_out_request(&event, false)], &[], PENDING)
        .await
        .unwrap();
    assert!(fresh.iter().all(nothing));
    assert_eq!(db.count("deliveries").await, 3);
}

/// A test event goes to its one webhook (whatever that one subscribes to), never to the others
/// subscribed to its kind; a test event for a deleted webhook goes nowhere.
#[tokio::test]
async fn a_test_event_reaches_only_its_webhook() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let subscriber = webhook_for_every_event(&mut conn, "subscriber").await;
    let target = webhook(&mut conn, "target", &[EventKind::IncidentResolved], 5).await;
    let test = record_test_event(&mut conn, target.id).await;
    assert_eq!(test.kind, EventKind::IncidentOpened);
    let fanned = fan_out(&mut conn, &test, &[]).await;
    assert_eq!(fanned.waiting, 0);
    assert_eq!(fanned.pending.len(), 1);
    assert_eq!(fanned.pending[0].webhook_id, target.id);
    assert!(deliveries_of(&mut conn, subscriber.id).await.is_empty());
    let job = claim_auto(&mut conn, fanned.pending[0].delivery_id, 0)
        .await
        .unwrap();
    assert!(job.test, "the job knows it is a test");
    assert_eq!(job.body, test.body);

    let gone = webhook_for_every_event(&mut conn, "gone").await;
    let late = record_test_event(&mut conn, gone.id).await;
    webhooks::delete(&mut conn, gone.id).await.unwrap();
    assert!(nothing(&fan_out(&mut conn, &late, &[]).await));
    assert_eq!(db.count("deliveries").await, 1);
}

// ---------------------------------------------------------------------------------------------
// Claims: every attempt is logged before its request is sent, and only where the guard allows.

#[tokio::test]
async fn an_automatic_claim_logs_its_attempt_before_the_request_and_takes_a_lease() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "claimed").await;
    let event = open(&mut conn, "claimed").await;
    let id = fan_out(&mut conn, &event, &[]).await.pending[0].delivery_id;
    let before = OffsetDateTime::now_utc();
    let job = claim_auto(&mut conn, id, 0).await.expect("admitted");
    let after = OffsetDateTime::now_utc();
    assert_eq!(job.number, 1);
    assert_eq!(job.trigger, Trigger::Automatic);
    assert_eq!(job.webhook.id, webhook.id);
    assert_eq!(job.body, event.body);
    assert!(!job.test);
    assert_eq!(
        (
            job.delivery.state,
            job.delivery.attempt_count,
            job.delivery.auto_attempts
        ),
        (DeliveryState::Pending, 1, 1)
    );
    // The lease: the webhook's timeout plus the margin, and no automatic attempt is due before.
    let lease = lease(&mut conn, id).await.expect("a lease");
    let lasts = webhook.retry.timeout() + claim_rules().lease_margin;
    assert_between(lease, before + lasts, after + lasts, "the lease");
    assert_eq!(job.delivery.next_attempt_at, Some(lease));
    let logged = deliveries::get_detail(&mut conn, id)
        .await
        .unwrap()
        .attempts;
    assert_eq!(logged.len(), 1);
    assert_eq!(
        (
            logged[0].number,
            logged[0].trigger.as_str(),
            logged[0].success,
            logged[0].duration_ms
        ),
        (1, "automatic", None, None),
        "logged as under way"
    );
}

/// The guard's expected count: a duplicate message for an attempt already claimed, whether
/// that attempt is still under way or finished, claims nothing and logs nothing.
#[tokio::test]
async fn a_second_claim_for_the_same_automatic_attempt_is_refused() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "twice").await;
    let id = delivery_to(&mut conn, "twice", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.expect("the first claim");
    assert!(
        claim_auto(&mut conn, id, 0).await.is_none(),
        "while under way"
    );
    complete(&mut conn, completion(&job, answered(500)))
        .await
        .unwrap();
    // No lease now, due (the claim rules allow a day early), attempts left: only the count
    // differs.
    assert!(
        claim_auto(&mut conn, id, 0).await.is_none(),
        "after it ended"
    );
    assert_eq!(attempt_rows(&db, id).await, 1);
    assert!(
        claim_auto(&mut conn, id, 1).await.is_some(),
        "the next attempt is"
    );
}

/// The guard's limit: no automatic attempt past the webhook's `max_attempts` (lowered after two
/// attempts here), nor past the schedule's length.
#[tokio::test]
async fn no_automatic_claim_goes_past_max_attempts_or_the_schedule() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "limited").await;
    let id = delivery_to(&mut conn, "limited", webhook.id).await;
    for _ in 0..2 {
        record_attempt(&mut conn, id, answered(500)).await;
    }
    assert_eq!(
        deliveries::get(&mut conn, id).await.unwrap().state,
        DeliveryState::Retrying
    );
    let short_schedule = ClaimRules {
        schedule_attempts: 2,
        ..claim_rules()
    };
    assert!(
        claim(&mut conn, id, Trigger::Automatic, 2, short_schedule)
            .await
            .is_none(),
        "past the schedule"
    );
    set_max_attempts(&mut conn, webhook.id, 2).await;
    assert!(
        claim_auto(&mut conn, id, 2).await.is_none(),
        "past max_attempts"
    );
    assert_eq!(attempt_rows(&db, id).await, 2);
    set_max_attempts(&mut conn, webhook.id, 3).await;
    let third = claim_auto(&mut conn, id, 2).await.expect("within both");
    assert_eq!(third.delivery.auto_attempts, 3);
}

/// The guard's lease: while an automatic attempt is under way, the next one is not claimed,
/// even with the right count.
#[tokio::test]
async fn no_automatic_claim_while_another_automatic_attempt_is_under_way() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "leased").await;
    let id = delivery_to(&mut conn, "leased", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.unwrap();
    assert!(claim_auto(&mut conn, id, 1).await.is_none());
    assert_eq!(attempt_rows(&db, id).await, 1);
    complete(&mut conn, completion(&job, answered(500)))
        .await
        .unwrap();
    assert_eq!(lease(&mut conn, id).await, None, "the lease ends with it");
    assert!(claim_auto(&mut conn, id, 1).await.is_some());
}

/// The guard's webhook: a delivery whose webhook was disabled or deleted while an attempt was
/// under way (so the delivery was not stopped) gets no further attempt, automatic or manual.
#[tokio::test]
async fn no_claim_for_a_disabled_or_deleted_webhook() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let disabled = webhook_for_every_event(&mut conn, "disabled").await;
    let deleted = webhook_for_every_event(&mut conn, "deleted").await;
    let event = open(&mut conn, "both").await;
    let fanned = fan_out(&mut conn, &event, &[]).await;
    let to = |webhook: &Webhook| {
        fanned
            .pending
            .iter()
            .find(|d| d.webhook_id == webhook.id)
            .unwrap()
            .delivery_id
    };
    let (on_disabled, on_deleted) = (to(&disabled), to(&deleted));
    let jobs = [
        claim_auto(&mut conn, on_disabled, 0).await.unwrap(),
        claim_auto(&mut conn, on_deleted, 0).await.unwrap(),
    ];
    webhooks::update(&mut conn, disabled.id, &disable())
        .await
        .unwrap();
    webhooks::delete(&mut conn, deleted.id).await.unwrap();
    for job in &jobs {
        let completed = complete(&mut conn, completion(job, answered(500)))
            .await
            .unwrap();
        assert_eq!(completed.state, Some(DeliveryState::Retrying));
    }
    for id in [on_disabled, on_deleted] {
        // Retrying, no lease, the right count, due: only the webhook refuses.
        assert!(claim_auto(&mut conn, id, 1).await.is_none(), "automatic");
        assert!(claim_manual(&mut conn, id).await.is_none(), "manual");
        assert_eq!(attempt_rows(&db, id).await, 1);
    }
    webhooks::update(
        &mut conn,
        disabled.id,
        &WebhookChanges {
            enabled: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        claim_auto(&mut conn, on_disabled, 1).await.is_some(),
        "enabled again"
    );
}

/// The guard's due time: a retry is claimed no earlier than the rules allow before it is due.
#[tokio::test]
async fn a_retry_is_not_claimed_before_it_is_due() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "early").await;
    let id = delivery_to(&mut conn, "early", webhook.id).await;
    let failed = record_attempt(&mut conn, id, answered(500)).await;
    assert_eq!(failed.state, Some(DeliveryState::Retrying));
    let on_time = ClaimRules {
        early: Duration::ZERO,
        ..claim_rules()
    };
    assert!(
        claim(&mut conn, id, Trigger::Automatic, 1, on_time)
            .await
            .is_none(),
        "a minute early"
    );
    assert_eq!(attempt_rows(&db, id).await, 1);
    let two_minutes_early = ClaimRules {
        early: Duration::from_secs(120),
        ..claim_rules()
    };
    assert!(
        claim(&mut conn, id, Trigger::Automatic, 1, two_minutes_early)
            .await
            .is_some()
    );
}

/// A manual attempt may be claimed in any state but `succeeded` (a failed delivery is what it
/// is for).
#[tokio::test]
async fn a_manual_claim_is_refused_once_the_delivery_succeeded() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "manual").await;
    let succeeded = delivery_to(&mut conn, "succeeded", webhook.id).await;
    record_attempt(&mut conn, succeeded, answered(200)).await;
    assert!(claim_manual(&mut conn, succeeded).await.is_none());
    assert_eq!(attempt_rows(&db, succeeded).await, 1);
    let failed = delivery_to(&mut conn, "failed", webhook.id).await;
    mark_failed(&mut conn, failed).await;
    let job = claim_manual(&mut conn, failed).await.expect("failed: yes");
    assert_eq!(job.trigger, Trigger::Manual);
}

/// A manual attempt is logged like any other but leaves the automatic count, the state, the due
/// time and the lease alone: the automatic attempt it stands beside is still claimed.
#[tokio::test]
async fn a_manual_claim_leaves_the_automatic_schedule_alone() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "beside").await;
    let id = delivery_to(&mut conn, "beside", webhook.id).await;
    let before = deliveries::get(&mut conn, id).await.unwrap();
    let manual = claim_manual(&mut conn, id).await.unwrap();
    assert_eq!((manual.number, manual.trigger), (1, Trigger::Manual));
    let after = deliveries::get(&mut conn, id).await.unwrap();
    assert_eq!(
        (
            after.state,
            after.auto_attempts,
            after.attempt_count,
            after.next_attempt_at
        ),
        (DeliveryState::Pending, 0, 1, before.next_attempt_at)
    );
    assert_eq!(lease(&mut conn, id).await, None);
    let automatic = claim_auto(&mut conn, id, 0)
        .await
        .expect("the first automatic attempt");
    assert_eq!((automatic.number, automatic.delivery.auto_attempts), (2, 1));
    // A failed manual attempt keeps the state and the automatic attempt's lease.
    let kept = complete(&mut conn, completion(&manual, answered(500)))
        .await
        .unwrap();
    assert!(!kept.moved);
    let after = deliveries::get(&mut conn, id).await.unwrap();
    assert_eq!(
        (after.state, after.auto_attempts),
        (DeliveryState::Pending, 1)
    );
    assert!(lease(&mut conn, id).await.is_some());
}

// ---------------------------------------------------------------------------------------------
// Completions

#[tokio::test]
async fn a_successful_attempt_succeeds_the_delivery() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "ok").await;
    let id = delivery_to(&mut conn, "ok", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.unwrap();
    let done = completion(&job, answered(204));
    assert_eq!(done.transition, Transition::Succeed);
    let completed = complete(&mut conn, done).await.unwrap();
    assert_eq!(
        completed,
        Completed {
            moved: true,
            state: Some(DeliveryState::Succeeded),
            next_attempt_at: None
        }
    );
    let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
    assert_eq!(detail.delivery.state, DeliveryState::Succeeded);
    assert_eq!(detail.delivery.next_attempt_at, None);
    assert_eq!(lease(&mut conn, id).await, None);
    let attempt = &detail.attempts[0];
    assert_eq!(
        (
            attempt.success,
            attempt.status_code,
            attempt.duration_ms,
            attempt.error.as_deref(),
            attempt.response_body.as_deref()
        ),
        (Some(true), Some(204), Some(42), None, Some("ok"))
    );
    assert_eq!(attempt.request_headers["content-type"], "application/json");
}

/// Once succeeded, a delivery stays succeeded: neither the failure nor the success of the
/// automatic attempt that was under way beside the manual one that succeeded it moves it back,
/// though both are logged.
#[tokio::test]
async fn a_succeeded_delivery_is_never_moved_back() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "final").await;
    for (key, late_status) in [("late failure", 500), ("late success", 200)] {
        let id = delivery_to(&mut conn, key, webhook.id).await;
        let automatic = claim_auto(&mut conn, id, 0).await.unwrap();
        let manual = claim_manual(&mut conn, id).await.unwrap();
        let succeeded = complete(&mut conn, completion(&manual, answered(200)))
            .await
            .unwrap();
        assert_eq!(
            (succeeded.moved, succeeded.state),
            (true, Some(DeliveryState::Succeeded))
        );
        let late = complete(&mut conn, completion(&automatic, answered(late_status)))
            .await
            .expect("the late attempt is logged");
        assert!(!late.moved, "{key}");
        assert_eq!(late.state, Some(DeliveryState::Succeeded), "{key}");
        let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
        assert_eq!(detail.delivery.state, DeliveryState::Succeeded);
        assert_eq!(detail.delivery.next_attempt_at, None);
        assert_eq!(
            detail
                .attempts
                .iter()
                .map(|a| a.success)
                .collect::<Vec<_>>(),
            [Some(late_status == 200), Some(true)]
        );
        assert_eq!(lease(&mut conn, id).await, None);
    }
}

/// The sweeper records an attempt whose dispatcher stopped (its lease ended) as interrupted and
/// moves the delivery on; should that dispatcher come back with the answer, its completion finds
/// the attempt recorded and changes nothing.
#[tokio::test]
async fn an_attempt_recorded_as_interrupted_is_not_recorded_again() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "interrupted").await;
    let id = delivery_to(&mut conn, "interrupted", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.unwrap();
    end_lease(&mut conn, id, "10 minutes").await;
    let found = deliveries::unrecorded(
        &mut conn,
        Duration::from_secs(120),
        Duration::from_secs(300),
        10,
    )
    .await
    .unwrap();
    assert_eq!(found.len(), 1);
    let sweep = Completion {
        delivery_id: found[0].delivery_id,
        number: found[0].number,
        auto_number: Some(found[0].auto_attempts),
        result: AttemptResult::interrupted(),
        transition: Transition::after_attempt(
            found[0].trigger(),
            found[0].auto_attempts,
            false,
            found[0].max_attempts(),
            &RetrySchedule::specification(),
        ),
    };
    let swept = complete(&mut conn, sweep.clone()).await.unwrap();
    assert_eq!(
        (swept.moved, swept.state),
        (true, Some(DeliveryState::Retrying))
    );
    assert_eq!(
        complete(&mut conn, completion(&job, answered(200))).await,
        None,
        "the dispatcher's late answer"
    );
    assert_eq!(complete(&mut conn, sweep).await, None, "a second sweep");
    let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
    assert_eq!(detail.delivery.state, DeliveryState::Retrying);
    assert_eq!(detail.attempts.len(), 1);
    assert_eq!(detail.attempts[0].success, Some(false));
    assert_eq!(detail.attempts[0].error.as_deref(), Some("interrupted"));
    assert!(
        deliveries::unrecorded(&mut conn, Duration::ZERO, Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A failed automatic attempt with attempts left moves the delivery to `retrying`, its next
/// attempt due after the schedule's delay, and ends the lease.
#[tokio::test]
async fn a_failed_attempt_schedules_the_next_after_its_delay() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "retry").await;
    let id = delivery_to(&mut conn, "retry", webhook.id).await;
    for (expected, delay) in [(0, 60), (1, 300)] {
        let job = claim_auto(&mut conn, id, expected).await.unwrap();
        let failed = completion(&job, answered(503));
        let delay = Duration::from_secs(delay);
        assert_eq!(failed.transition, Transition::Retry { delay });
        let before = OffsetDateTime::now_utc();
        let completed = complete(&mut conn, failed).await.unwrap();
        let after = OffsetDateTime::now_utc();
        assert_eq!(
            (completed.moved, completed.state),
            (true, Some(DeliveryState::Retrying))
        );
        let next = completed.next_attempt_at.expect("a next attempt");
        assert_between(
            next,
            before + delay,
            after + delay,
            &format!("due {delay:?} after the failure"),
        );
        let delivery = deliveries::get(&mut conn, id).await.unwrap();
        assert_eq!(delivery.next_attempt_at, Some(next));
        assert_eq!(lease(&mut conn, id).await, None);
    }
    let attempts = deliveries::get_detail(&mut conn, id)
        .await
        .unwrap()
        .attempts;
    assert_eq!(attempts.len(), 2);
    for attempt in &attempts {
        assert_eq!(attempt.success, Some(false));
        assert_eq!(attempt.status_code, Some(503));
        assert_eq!(attempt.error.as_deref(), Some("http_status"));
        assert_eq!(attempt.response_body.as_deref(), Some("upstream exploded"));
    }
}

#[tokio::test]
async fn the_last_failed_automatic_attempt_fails_the_delivery() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook(&mut conn, "two tries", &EventKind::ALL, 2).await;
    let id = delivery_to(&mut conn, "two tries", webhook.id).await;
    let first = record_attempt(&mut conn, id, answered(500)).await;
    assert_eq!(first.state, Some(DeliveryState::Retrying));
    let job = claim_auto(&mut conn, id, 1).await.unwrap();
    let last = completion(&job, answered(500));
    assert_eq!(last.transition, Transition::Fail);
    let completed = complete(&mut conn, last).await.unwrap();
    assert_eq!(
        completed,
        Completed {
            moved: true,
            state: Some(DeliveryState::Failed),
            next_attempt_at: None
        }
    );
    let delivery = deliveries::get(&mut conn, id).await.unwrap();
    assert_eq!(
        (
            delivery.state,
            delivery.auto_attempts,
            delivery.next_attempt_at
        ),
        (DeliveryState::Failed, 2, None)
    );
    assert_eq!(lease(&mut conn, id).await, None);
    assert!(claim_auto(&mut conn, id, 2).await.is_none());
}

// ---------------------------------------------------------------------------------------------
// Concurrency: claims raced on separate connections, released together from one row lock.

#[tokio::test]
async fn concurrent_claims_of_one_automatic_attempt_admit_exactly_one() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let mut conn = pool.get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "raced").await;
    let id = delivery_to(&mut conn, "raced", webhook.id).await;
    drop(conn);
    let claims = vec![
        Claim {
            delivery_id: id,
            trigger: Trigger::Automatic,
            expected_auto_attempts: 0,
        };
        RACERS
    ];
    let jobs = race(&db, &pool, id, claims).await;
    let won: Vec<&Job> = jobs.iter().flatten().collect();
    assert_eq!(won.len(), 1, "exactly one claim admitted");
    assert_eq!(won[0].number, 1);
    assert_eq!(attempt_rows(&db, id).await, 1);
    let delivery = deliveries::get(&mut pool.get().await.unwrap(), id)
        .await
        .unwrap();
    assert_eq!((delivery.attempt_count, delivery.auto_attempts), (1, 1));
}

/// One press of Retry, one request: however many manual claims race for one request (a
/// message redelivered, published twice), one is admitted; an automatic claim among them is
/// admitted beside it, with the next number. Fails on a claim that does not consume the
/// request (every racer was admitted).
#[tokio::test]
async fn racing_manual_claims_of_one_request_admit_one() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let mut conn = pool.get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "manual race").await;
    let id = delivery_to(&mut conn, "manual race", webhook.id).await;
    request_manual(&mut conn, &[id]).await;
    drop(conn);
    // Every racer manual, and one automatic among them.
    let mut claims = vec![
        Claim {
            delivery_id: id,
            trigger: Trigger::Manual,
            expected_auto_attempts: 0,
        };
        RACERS
    ];
    claims[RACERS / 2].trigger = Trigger::Automatic;
    let jobs = race(&db, &pool, id, claims).await;
    let mut admitted: Vec<(i32, Trigger)> = jobs
        .iter()
        .flatten()
        .map(|job| (job.number, job.trigger))
        .collect();
    admitted.sort_unstable_by_key(|(number, _)| *number);
    assert_eq!(
        admitted.len(),
        2,
        "one manual and the automatic: {admitted:?}"
    );
    assert_eq!(admitted[0].0, 1);
    assert_eq!(admitted[1].0, 2);
    assert_eq!(
        db.count(&format!(
            "attempts WHERE delivery_id = '{id}' AND trigger = 'manual'"
        ))
        .await,
        1
    );
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE id = '{id}' AND manual_requested"
        ))
        .await,
        0,
        "the claim consumed the request"
    );
    // A second request gets a second attempt.
    let mut conn = pool.get().await.unwrap();
    assert!(claim_manual(&mut conn, id).await.is_some());
}

/// Racing claims per test (the pool holds eight connections).
const RACERS: usize = 6;

/// Runs `claims` at once, each on a pooled connection of its own: they are started while
/// another transaction holds the delivery's row lock, and that lock is released only once every
/// one of them waits for it, so they all contend for the row.
async fn race(
    db: &TestDb,
    pool: &tocsin_storage::DbPool,
    delivery_id: Uuid,
    claims: Vec<Claim>,
) -> Vec<Option<Job>> {
    let mut gate = AsyncPgConnection::establish(&db.url).await.unwrap();
    gate.batch_execute(&format!(
        "BEGIN; SELECT id FROM deliveries WHERE id = '{delivery_id}' FOR UPDATE"
    ))
    .await
    .unwrap();
    let mut conns = Vec::new();
    for _ in &claims {
        conns.push(pool.get().await.unwrap());
    }
    let racers = claims.len() as i64;
    let tasks: Vec<_> = claims
        .into_iter()
        .zip(conns)
        .map(|(claim, mut conn)| {
            tokio::spawn(async move {
                attempts::claim(&mut conn, &[claim], claim_rules())
                    .await
                    .unwrap()
                    .pop()
                    .unwrap()
            })
        })
        .collect();
    wait_until("every claim waiting for the row lock", DEADLINE, || async {
        db.count(&format!(
            "pg_stat_activity WHERE datname = '{}' AND wait_event_type = 'Lock'",
            db.name
        ))
        .await
            == racers
    })
    .await;
    gate.batch_execute("COMMIT").await.unwrap();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|joined| joined.unwrap())
        .collect()
}

/// Claims and completions gathered in one batch (as the dispatcher's batchers send them) move
/// each delivery as they would alone: a stale claim is refused, a delivery twice in one batch
/// is handled copy after copy, and answers come back in request order.
#[tokio::test]
async fn claims_and_completions_in_one_batch_move_each_delivery_as_alone() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "batch").await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(delivery_to(&mut conn, &format!("b{i}"), webhook.id).await);
    }
    request_manual(&mut conn, &[ids[1], ids[2]]).await;
    let auto = |id: Uuid, expected: i32| Claim {
        delivery_id: id,
        trigger: Trigger::Automatic,
        expected_auto_attempts: expected,
    };
    let manual = |id: Uuid| Claim {
        delivery_id: id,
        trigger: Trigger::Manual,
        expected_auto_attempts: 0,
    };
    let claims = [
        auto(ids[3], 0),
        auto(ids[0], 0),
        // Stale: no automatic attempt of this delivery was made yet, not one.
        auto(ids[1], 1),
        manual(ids[2]),
        // The same attempt again in the same batch.
        auto(ids[0], 0),
        // A later copy of a delivery whose first copy was refused.
        manual(ids[1]),
    ];
    let jobs = attempts::claim(&mut conn, &claims, claim_rules())
        .await
        .unwrap();
    let summary: Vec<Option<(Uuid, i32, Trigger)>> = jobs
        .iter()
        .map(|job| {
            job.as_ref()
                .map(|job| (job.delivery.id, job.number, job.trigger))
        })
        .collect();
    assert_eq!(
        summary,
        [
            Some((ids[3], 1, Trigger::Automatic)),
            Some((ids[0], 1, Trigger::Automatic)),
            None,
            Some((ids[2], 1, Trigger::Manual)),
            None,
            Some((ids[1], 1, Trigger::Manual)),
        ]
    );
    let job = |n: usize| jobs[n].as_ref().unwrap();
    let completions = [
        completion(job(0), answered(200)),
        completion(job(1), answered(500)),
        completion(job(3), answered(200)),
        completion(job(5), answered(500)),
        // The same attempt twice in one batch: recorded once.
        completion(job(1), answered(200)),
    ];
    let answers = attempts::complete(&mut conn, &completions).await.unwrap();
    let summary: Vec<Option<(bool, Option<DeliveryState>)>> = answers
        .iter()
        .map(|c| c.map(|c| (c.moved, c.state)))
        .collect();
    assert_eq!(
        summary,
        [
            Some((true, Some(DeliveryState::Succeeded))),
            Some((true, Some(DeliveryState::Retrying))),
            Some((true, Some(DeliveryState::Succeeded))),
            Some((false, None)),
            None,
        ]
    );
    let states: Vec<(DeliveryState, i32, i32)> = {
        let mut states = Vec::new();
        for &id in &ids {
            let d = deliveries::get(&mut conn, id).await.unwrap();
            states.push((d.state, d.attempt_count, d.auto_attempts));
        }
        states
    };
    assert_eq!(
        states,
        [
            (DeliveryState::Retrying, 1, 1),
            (DeliveryState::Pending, 1, 0),
            (DeliveryState::Succeeded, 1, 0),
            (DeliveryState::Succeeded, 1, 1),
        ]
    );
    assert_eq!(
        db.count("attempts WHERE success IS NOT NULL").await,
        4,
        "every claimed attempt recorded once"
    );
    assert_eq!(db.count("attempts").await, 4);
}

// ---------------------------------------------------------------------------------------------
// Waiting for room

/// `take_waiting` hands out each webhook's waiting deliveries oldest first, at most the room
/// given for it (the default room for any other webhook) and the limit in all; it moves none.
#[tokio::test]
async fn waiting_deliveries_are_taken_oldest_first_within_each_webhooks_room() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let a = webhook_for_every_event(&mut conn, "a").await;
    let b = webhook_for_every_event(&mut conn, "b").await;
    for i in 0..3 {
        let event = open(&mut conn, &format!("w{i}")).await;
        let fanned = fan_out(&mut conn, &event, &[a.id, b.id]).await;
        assert_eq!((fanned.pending.len(), fanned.waiting), (0, 2));
    }
    let oldest_first = |webhook: &Webhook, deliveries: &[Delivery]| -> Vec<Uuid> {
        let mut mine: Vec<&Delivery> = deliveries
            .iter()
            .filter(|d| d.webhook_id == webhook.id)
            .collect();
        mine.sort_by_key(|d| (d.created_at, d.id));
        mine.into_iter().map(|d| d.id).collect()
    };
    let all = [
        deliveries_of(&mut conn, a.id).await,
        deliveries_of(&mut conn, b.id).await,
    ]
    .concat();
    let (of_a, of_b) = (oldest_first(&a, &all), oldest_first(&b, &all));
    assert_eq!((of_a.len(), of_b.len()), (3, 3));

    let taken = deliveries::take_waiting(&mut conn, &[(a.id, 2)], 1, 10)
        .await
        .unwrap();
    let taken_of = |webhook: &Webhook, taken: &[Due]| -> Vec<Uuid> {
        taken
            .iter()
            .filter(|d| d.webhook_id == webhook.id)
            .map(|d| d.delivery_id)
            .collect()
    };
    assert_eq!(taken_of(&a, &taken), of_a[..2], "a's room");
    assert_eq!(taken_of(&b, &taken), of_b[..1], "the default room");
    assert_eq!(taken.len(), 3);
    assert!(taken.iter().all(|d| d.auto_attempts == 0));
    let created: Vec<(OffsetDateTime, Uuid)> = taken
        .iter()
        .map(|due| {
            let d = all.iter().find(|d| d.id == due.delivery_id).unwrap();
            (d.created_at, d.id)
        })
        .collect();
    assert!(created.windows(2).all(|w| w[0] <= w[1]), "oldest first");

    let limited = deliveries::take_waiting(&mut conn, &[], 10, 2)
        .await
        .unwrap();
    let limited: HashSet<Uuid> = limited.iter().map(|d| d.delivery_id).collect();
    assert_eq!(limited, HashSet::from([of_a[0], of_b[0]]), "the limit");
    let no_room = deliveries::take_waiting(&mut conn, &[(a.id, 0)], 10, 10)
        .await
        .unwrap();
    assert_eq!(taken_of(&a, &no_room), Vec::<Uuid>::new());
    assert_eq!(taken_of(&b, &no_room), of_b);
    assert_eq!(
        db.count("deliveries WHERE state = 'waiting'").await,
        6,
        "taking moves nothing"
    );
}

/// `wait` moves a delivery to `waiting` only as the caller saw it: unfinished, with the count
/// given, and no automatic attempt under way.
#[tokio::test]
async fn wait_moves_only_deliveries_as_the_caller_saw_them() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "full").await;
    let mut due = Vec::new();
    for key in ["pending", "stale", "under way", "succeeded", "retrying"] {
        let id = delivery_to(&mut conn, key, webhook.id).await;
        due.push(Due {
            delivery_id: id,
            webhook_id: webhook.id,
            auto_attempts: 0,
        });
    }
    due[1].auto_attempts = 1;
    claim_auto(&mut conn, due[2].delivery_id, 0).await.unwrap();
    due[2].auto_attempts = 1;
    record_attempt(&mut conn, due[3].delivery_id, answered(200)).await;
    due[3].auto_attempts = 1;
    record_attempt(&mut conn, due[4].delivery_id, answered(500)).await;
    due[4].auto_attempts = 1;
    let moved = deliveries::wait(&mut conn, &due, WaitReason::WebhookBusy)
        .await
        .unwrap();
    assert_eq!(moved, [true, false, false, false, true]);
    let states: Vec<(DeliveryState, Option<WaitReason>)> = {
        let mut states = Vec::new();
        for d in &due {
            let d = deliveries::get(&mut conn, d.delivery_id).await.unwrap();
            states.push((d.state, d.wait_reason));
        }
        states
    };
    let busy = Some(WaitReason::WebhookBusy);
    assert_eq!(
        states,
        [
            (DeliveryState::Waiting, busy),
            (DeliveryState::Pending, None),
            (DeliveryState::Pending, None),
            (DeliveryState::Succeeded, None),
            (DeliveryState::Waiting, busy),
        ]
    ); // One waiting already stays as it is, and is not counted again.
    let again = deliveries::wait(&mut conn, &due[..1], WaitReason::WebhookBusy)
        .await
        .unwrap();
    assert_eq!(again, [false]);
}

/// Claimed from `waiting`, a delivery goes back to `pending` when it has had no automatic
/// attempt and to `retrying` otherwise, its wait reason cleared.
#[tokio::test]
async fn a_claim_takes_a_waiting_delivery_back_to_pending_or_retrying() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "room").await;
    let event = open(&mut conn, "first").await;
    assert_eq!(fan_out(&mut conn, &event, &[webhook.id]).await.waiting, 1);
    let first = deliveries_of(&mut conn, webhook.id).await[0].id;

    let second = delivery_to(&mut conn, "second", webhook.id).await;
    record_attempt(&mut conn, second, answered(500)).await;
    let waiting = Due {
        delivery_id: second,
        webhook_id: webhook.id,
        auto_attempts: 1,
    };
    assert_eq!(
        deliveries::wait(&mut conn, &[waiting], WaitReason::WebhookBusy)
            .await
            .unwrap(),
        [true]
    );
    let taken = deliveries::take_waiting(&mut conn, &[], 10, 10)
        .await
        .unwrap();
    let expected: HashSet<(Uuid, i32)> = HashSet::from([(first, 0), (second, 1)]);
    assert_eq!(
        taken
            .iter()
            .map(|d| (d.delivery_id, d.auto_attempts))
            .collect::<HashSet<_>>(),
        expected
    );

    for (id, expected, state, number) in [
        (first, 0, DeliveryState::Pending, 1),
        (second, 1, DeliveryState::Retrying, 2),
    ] {
        let job = claim_auto(&mut conn, id, expected).await.unwrap();
        assert_eq!(job.number, number);
        assert_eq!(
            (job.delivery.state, job.delivery.wait_reason),
            (state, None)
        );
    }
    assert!(deliveries::take_waiting(&mut conn, &[], 10, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A delivery left waiting for a slot of a webhook that was deleted meanwhile (by a fan-out that
/// met the deletion, after the deletion stopped the others) is taken, so that its refused claim
/// fails it; one of a webhook disabled meanwhile waits for the webhook to be enabled.
#[tokio::test]
async fn a_deleted_webhooks_waiting_deliveries_are_taken_to_fail_and_a_disabled_ones_wait() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let deleted = webhook_for_every_event(&mut conn, "deleted").await;
    let disabled = webhook_for_every_event(&mut conn, "disabled").await;
    let event = open(&mut conn, "busy").await;
    let fanned = fan_out(&mut conn, &event, &[deleted.id, disabled.id]).await;
    assert_eq!(fanned.waiting, 2);
    conn.batch_execute(&format!(
        "UPDATE webhooks SET deleted_at = now() WHERE id = '{}';
         UPDATE webhooks SET enabled = false WHERE id = '{}'",
        deleted.id, disabled.id
    ))
    .await
    .unwrap();
    let of_deleted = deliveries_of(&mut conn, deleted.id).await[0].id;
    let taken = deliveries::take_waiting(&mut conn, &[], 10, 10)
        .await
        .unwrap();
    assert_eq!(
        taken.iter().map(|d| d.delivery_id).collect::<Vec<_>>(),
        [of_deleted]
    );
    assert!(claim_auto(&mut conn, of_deleted, 0).await.is_none());
    assert_eq!(
        deliveries::stop(&mut conn, &[of_deleted], 5).await.unwrap(),
        [of_deleted]
    );
}

// ---------------------------------------------------------------------------------------------
// The sweeper's queries

/// `claim_overdue` takes pending and retrying deliveries overdue by more than the grace with no
/// attempt under way (oldest first, at most the limit), and makes each due now, so that the
/// next pass does not take it again; it leaves waiting, finished, leased and not yet overdue
/// deliveries alone.
#[tokio::test]
async fn the_sweeper_claims_only_overdue_deliveries_with_no_attempt_under_way_once_per_grace() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "swept").await;
    let overdue_pending = delivery_to(&mut conn, "overdue pending", webhook.id).await;
    set_due(&mut conn, overdue_pending, "now() - interval '10 minutes'").await;
    let overdue_retrying = delivery_to(&mut conn, "overdue retrying", webhook.id).await;
    record_attempt(&mut conn, overdue_retrying, answered(500)).await;
    set_due(&mut conn, overdue_retrying, "now() - interval '5 minutes'").await;
    let recent = delivery_to(&mut conn, "recent", webhook.id).await;
    set_due(&mut conn, recent, "now() - interval '30 seconds'").await;
    let event = open(&mut conn, "waiting").await;
    fan_out(&mut conn, &event, &[webhook.id]).await;
    let waiting = deliveries_of(&mut conn, webhook.id)
        .await
        .into_iter()
        .find(|d| d.state == DeliveryState::Waiting)
        .unwrap()
        .id;
    set_due(&mut conn, waiting, "now() - interval '10 minutes'").await;
    let leased = delivery_to(&mut conn, "leased", webhook.id).await;
    claim_auto(&mut conn, leased, 0).await.unwrap();
    end_lease(&mut conn, leased, "10 minutes").await;
    let failed = delivery_to(&mut conn, "failed", webhook.id).await;
    mark_failed(&mut conn, failed).await;
    set_due(&mut conn, failed, "now() - interval '10 minutes'").await;

    let grace = Duration::from_secs(120);
    let before = OffsetDateTime::now_utc();
    let first = deliveries::claim_overdue(&mut conn, grace, 1)
        .await
        .unwrap();
    assert_eq!(
        first,
        [Due {
            delivery_id: overdue_pending,
            webhook_id: webhook.id,
            auto_attempts: 0
        }],
        "the oldest, within the limit"
    );
    let rest = deliveries::claim_overdue(&mut conn, grace, 10)
        .await
        .unwrap();
    assert_eq!(
        rest,
        [Due {
            delivery_id: overdue_retrying,
            webhook_id: webhook.id,
            auto_attempts: 1
        }]
    );
    assert!(
        deliveries::claim_overdue(&mut conn, grace, 10)
            .await
            .unwrap()
            .is_empty(),
        "taken once per grace"
    );
    for id in [overdue_pending, overdue_retrying] {
        let due_at = deliveries::get(&mut conn, id)
            .await
            .unwrap()
            .next_attempt_at
            .unwrap();
        assert_between(due_at, before, OffsetDateTime::now_utc(), "made due now");
    }
    let on_time = ClaimRules {
        early: Duration::ZERO,
        ..claim_rules()
    };
    assert!(
        claim(&mut conn, overdue_retrying, Trigger::Automatic, 1, on_time)
            .await
            .is_some(),
        "and claimed as due"
    );
}

/// `unrecorded` finds the attempts whose dispatcher stopped before recording them: an automatic
/// one once its lease ended more than the grace ago, a manual one started more than
/// `manual_after` ago; never one recorded, oldest first, at most the limit.
#[tokio::test]
async fn unrecorded_finds_attempts_whose_dispatcher_stopped() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook(&mut conn, "stopped", &EventKind::ALL, 3).await;
    let mut ids = std::collections::HashMap::new();
    for key in [
        "lease long over",
        "lease just over",
        "lease running",
        "manual old",
        "manual new",
        "recorded",
    ] {
        ids.insert(key, delivery_to(&mut conn, key, webhook.id).await);
    }
    for key in ["lease long over", "lease just over", "lease running"] {
        claim_auto(&mut conn, ids[key], 0).await.unwrap();
    }
    end_lease(&mut conn, ids["lease long over"], "10 minutes").await;
    end_lease(&mut conn, ids["lease just over"], "1 minute").await;
    for key in ["manual old", "manual new"] {
        claim_manual(&mut conn, ids[key]).await.unwrap();
    }
    let recorded = claim_auto(&mut conn, ids["recorded"], 0).await.unwrap();
    complete(&mut conn, completion(&recorded, answered(500)))
        .await
        .unwrap();
    for key in ["manual old", "recorded"] {
        diesel::sql_query(format!(
            "UPDATE attempts SET started_at = now() - interval '20 minutes' \
             WHERE delivery_id = '{}'",
            ids[key]
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    end_lease(&mut conn, ids["recorded"], "10 minutes").await;

    let grace = Duration::from_secs(120);
    let manual_after = Duration::from_secs(300);
    let found = deliveries::unrecorded(&mut conn, grace, manual_after, 10)
        .await
        .unwrap();
    let summary: Vec<(Uuid, Uuid, i32, Trigger, i32, u8)> = found
        .iter()
        .map(|u| {
            (
                u.delivery_id,
                u.webhook_id,
                u.number,
                u.trigger(),
                u.auto_attempts,
                u.max_attempts(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (ids["manual old"], webhook.id, 1, Trigger::Manual, 0, 3),
            (
                ids["lease long over"],
                webhook.id,
                1,
                Trigger::Automatic,
                1,
                3
            ),
        ]
    );
    let oldest = deliveries::unrecorded(&mut conn, grace, manual_after, 1)
        .await
        .unwrap();
    assert_eq!(oldest.len(), 1);
    assert_eq!(oldest[0].delivery_id, ids["manual old"]);
}

// ---------------------------------------------------------------------------------------------
// Stopping a webhook's deliveries

/// Disabling a webhook fails its unfinished deliveries at once (pending, waiting, retrying),
/// leaving finished ones and other webhooks' as they are; a delivery whose automatic attempt is
/// under way is left for that attempt to finish, which moves it as usual, and is stopped once
/// it can get no further attempt. A manual attempt under way still records its answer.
#[tokio::test]
async fn disabling_a_webhook_fails_its_unfinished_deliveries_but_lets_an_attempt_under_way_finish()
{
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "disabled").await;
    let other = webhook_for_every_event(&mut conn, "other").await;
    let event = open(&mut conn, "pending").await;
    let fanned = fan_out(&mut conn, &event, &[]).await;
    let of = |id: Uuid| {
        fanned
            .pending
            .iter()
            .find(|d| d.webhook_id == id)
            .unwrap()
            .delivery_id
    };
    let (pending, others) = (of(webhook.id), of(other.id));
    let event = open(&mut conn, "waiting").await;
    fan_out(&mut conn, &event, &[webhook.id, other.id]).await;
    let waiting = deliveries_of(&mut conn, webhook.id)
        .await
        .into_iter()
        .find(|d| d.state == DeliveryState::Waiting)
        .unwrap()
        .id;
    let retrying = delivery_to(&mut conn, "retrying", webhook.id).await;
    record_attempt(&mut conn, retrying, answered(500)).await;
    let succeeded = delivery_to(&mut conn, "succeeded", webhook.id).await;
    record_attempt(&mut conn, succeeded, answered(200)).await;
    let under_way = delivery_to(&mut conn, "under way", webhook.id).await;
    let automatic = claim_auto(&mut conn, under_way, 0).await.unwrap();
    let manual_under_way = delivery_to(&mut conn, "manual", webhook.id).await;
    let manual = claim_manual(&mut conn, manual_under_way).await.unwrap();

    webhooks::update(&mut conn, webhook.id, &disable())
        .await
        .unwrap();
    for (id, attempts) in [(pending, 0), (waiting, 0), (retrying, 1)] {
        let d = deliveries::get(&mut conn, id).await.unwrap();
        assert_eq!(
            (d.state, d.wait_reason, d.next_attempt_at, d.attempt_count),
            (DeliveryState::Failed, None, None, attempts)
        );
    }
    assert_eq!(
        deliveries::get(&mut conn, succeeded).await.unwrap().state,
        DeliveryState::Succeeded
    );
    for (id, state) in [
        (others, DeliveryState::Pending),
        (under_way, DeliveryState::Pending),
    ] {
        assert_eq!(deliveries::get(&mut conn, id).await.unwrap().state, state);
    }
    assert!(
        deliveries_of(&mut conn, other.id)
            .await
            .iter()
            .all(|d| !d.state.is_finished()),
        "other webhooks' deliveries go on"
    );
    assert!(lease(&mut conn, under_way).await.is_some());

    let finished = complete(&mut conn, completion(&automatic, answered(500)))
        .await
        .unwrap();
    assert_eq!(
        (finished.moved, finished.state),
        (true, Some(DeliveryState::Retrying))
    );
    assert!(claim_auto(&mut conn, under_way, 1).await.is_none());
    let stopped = deliveries::stop(
        &mut conn,
        &[under_way],
        RetrySchedule::specification().attempts(),
    )
    .await
    .unwrap();
    assert_eq!(stopped, [under_way]);
    assert_eq!(
        deliveries::get(&mut conn, under_way).await.unwrap().state,
        DeliveryState::Failed
    );

    let answered_manually = complete(&mut conn, completion(&manual, answered(200)))
        .await
        .expect("the manual attempt records its answer");
    assert_eq!(answered_manually.state, Some(DeliveryState::Succeeded));
}

/// Deleting a webhook stops its deliveries as disabling does: each one with no attempt under
/// way becomes a failed delivery with no next attempt. So does one that waited while it was
/// disabled and was not recovered, which nothing else would finish (and retention never deletes
/// unfinished ones).
#[tokio::test]
async fn deleting_a_webhook_stops_its_deliveries() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "deleted").await;
    webhooks::update(&mut conn, webhook.id, &disable())
        .await
        .unwrap();
    let event = open(&mut conn, "while disabled").await;
    assert_eq!(fan_out(&mut conn, &event, &[]).await.disabled, 1);
    let enable = WebhookChanges {
        enabled: Some(true),
        ..Default::default()
    };
    webhooks::update(&mut conn, webhook.id, &enable)
        .await
        .unwrap();
    let pending = delivery_to(&mut conn, "pending", webhook.id).await;
    let under_way = delivery_to(&mut conn, "under way", webhook.id).await;
    claim_auto(&mut conn, under_way, 0).await.unwrap();
    let waited = async |conn: &mut AsyncPgConnection| {
        let all = deliveries_of(conn, webhook.id).await;
        let d = all.into_iter().find(|d| d.event_id == event.id).unwrap();
        (d.state, d.wait_reason)
    };
    assert_eq!(
        waited(&mut conn).await,
        (DeliveryState::Waiting, Some(WaitReason::WebhookDisabled)),
        "enabling does not send it"
    );
    webhooks::delete(&mut conn, webhook.id).await.unwrap();
    let d = deliveries::get(&mut conn, pending).await.unwrap();
    assert_eq!(
        (d.state, d.attempt_count, d.next_attempt_at),
        (DeliveryState::Failed, 0, None)
    );
    assert_eq!(waited(&mut conn).await, (DeliveryState::Failed, None));
    assert_eq!(
        deliveries::get(&mut conn, under_way).await.unwrap().state,
        DeliveryState::Pending
    );
    assert!(lease(&mut conn, under_way).await.is_some());
    assert_eq!(
        db.count("deliveries WHERE state IN ('pending', 'waiting', 'retrying') AND attempting_until IS NULL")
            .await,
        0
    );
}

/// `stop` fails exactly the deliveries that can get no further automatic attempt (their
/// webhook's `max_attempts` or the schedule used up) and have none under way.
#[tokio::test]
async fn stop_fails_only_deliveries_that_can_get_no_more_automatic_attempt() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "stopped").await;
    let mut ids = Vec::new();
    for (key, failures) in [("a", 2), ("b", 2), ("c", 1), ("d", 2)] {
        let id = delivery_to(&mut conn, key, webhook.id).await;
        for _ in 0..failures {
            record_attempt(&mut conn, id, answered(500)).await;
        }
        ids.push(id);
    }
    let (a, b, c, d) = (ids[0], ids[1], ids[2], ids[3]);
    claim_auto(&mut conn, d, 2)
        .await
        .expect("d's third attempt");
    let stop = async |conn: &mut AsyncPgConnection, ids: &[Uuid], schedule: u8| -> HashSet<Uuid> {
        deliveries::stop(conn, ids, schedule)
            .await
            .unwrap()
            .into_iter()
            .collect()
    };
    assert!(
        stop(&mut conn, &ids, 5).await.is_empty(),
        "attempts left for all"
    );
    assert_eq!(
        stop(&mut conn, &[a, c, d], 2).await,
        HashSet::from([a]),
        "a two-attempt schedule"
    );
    set_max_attempts(&mut conn, webhook.id, 2).await;
    assert_eq!(
        stop(&mut conn, &[b, c, d], 5).await,
        HashSet::from([b]),
        "max_attempts lowered to two"
    );
    let mut states = Vec::new();
    for &id in &ids {
        states.push(deliveries::get(&mut conn, id).await.unwrap().state);
    }
    assert_eq!(
        states,
        [
            DeliveryState::Failed,
            DeliveryState::Failed,
            DeliveryState::Retrying,
            DeliveryState::Retrying
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Pool, ping, retention

/// The pool's connections plan as `tocsin_storage::SESSION_SETTINGS` says: without `jit = off`, a query
/// costed high under `enable_seqscan = off` was compiled with LLVM on every call
/// (docs/performance.md).
#[tokio::test]
async fn pooled_connections_plan_once_with_index_scans_and_no_jit() {
    use diesel::sql_types::Text;
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    for (setting, expected) in [
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_seqscan", "off"),
        ("jit", "off"),
    ] {
        let value: String = diesel::select(diesel::dsl::sql::<Text>(&format!(
            "current_setting('{setting}')"
        )))
        .get_result(&mut conn)
        .await
        .unwrap();
        assert_eq!(value, expected, "{setting}");
    }
}

#[tokio::test]
async fn ping_reports_an_unreachable_database() {
    let pool = tocsin_storage::pool("postgres://postgres@127.0.0.1:1/none", 1).unwrap();
    let error = tocsin_storage::ping(&pool, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
}

/// Retention removes old finished deliveries (with their attempts), old events no delivery refers
/// to unless their outbox row still waits for the relay, and old published outbox rows.
#[tokio::test]
async fn a_multi_host_database_url_skips_an_unreachable_host() {
    let db = TestDb::new().await;
    let url = db.multi_host_url("127.0.0.1:1");
    assert!(url.contains("127.0.0.1:1,"), "{url}");
    assert_eq!(
        tocsin_storage::migrate(&url).await.unwrap(),
        0,
        "already migrated"
    );
    let pool = tocsin_storage::pool(&url, 2).unwrap();
    tocsin_storage::ping(&pool, Duration::from_secs(5))
        .await
        .unwrap();
    // Only unreachable hosts: unavailable, as with one.
    let nowhere =
        tocsin_storage::pool("postgres://postgres@127.0.0.1:1,127.0.0.1:2/none", 1).unwrap();
    let error = tocsin_storage::ping(&nowhere, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
}

#[tokio::test]
async fn retention_prunes_old_finished_deliveries_and_keeps_the_rest() {
    use tocsin_storage::retention;

    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "r").await;
    let mut delivery_ids = Vec::new();
    for i in 0..5 {
        let id = delivery_to(&mut conn, &format!("r{i}"), webhook.id).await;
        record_attempt(&mut conn, id, answered(500)).await;
        delivery_ids.push(id);
    }
    // Two events never fanned out: one announced, one whose announcement still waits.
    open(&mut conn, "announced").await;
    let unannounced = open(&mut conn, "unannounced").await;
    // Three old finished deliveries, one old unfinished, one recent finished.
    for (state, age, id) in [
        ("succeeded", 40, delivery_ids[0]),
        ("failed", 40, delivery_ids[1]),
        ("succeeded", 31, delivery_ids[2]),
        ("retrying", 40, delivery_ids[3]),
        ("succeeded", 2, delivery_ids[4]),
    ] {
        diesel::sql_query(format!(
            "UPDATE deliveries SET state = '{state}', updated_at = now() - interval '{age} days' \
             WHERE id = '{id}'"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    for statement in [
        "UPDATE events SET occurred_at = now() - interval '40 days'".to_owned(),
        format!(
            "UPDATE outbox SET published_at = now() - interval '2 days' \
             WHERE convert_from(payload, 'UTF8')::jsonb ->> 'event_id' <> '{}'",
            unannounced.id
        ),
    ] {
        diesel::sql_query(statement)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let now = OffsetDateTime::now_utc();
    let prune = async |conn: &mut AsyncPgConnection| {
        retention::prune(
            conn,
            now - time::Duration::days(30),
            now - time::Duration::DAY,
        )
        .await
        .unwrap()
    };
    assert_eq!(
        prune(&mut conn).await,
        retention::Pruned {
            deliveries: 3,
            events: 4,
            outbox: 6,
            outcome_buckets: 0,
        },
        "the pruned deliveries' events and the announced one go, not the unannounced one"
    );
    assert_eq!(db.count("attempts").await, 2, "attempts go with deliveries");
    for kept in [delivery_ids[3], delivery_ids[4]] {
        assert!(deliveries::get(&mut conn, kept).await.is_ok());
    }
    assert_eq!(
        db.count(&format!("events WHERE id = '{}'", unannounced.id))
            .await,
        1
    );
    // Once announced, it goes too.
    diesel::sql_query(
        "UPDATE outbox SET published_at = now() - interval '2 days' WHERE published_at IS NULL",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        prune(&mut conn).await,
        retention::Pruned {
            events: 1,
            outbox: 1,
            ..Default::default()
        }
    );
    assert_eq!(prune(&mut conn).await, retention::Pruned::default());
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A webhook subscribed to `events`, allowing `max_attempts` automatic attempts.
pub(crate) async fn webhook(
    conn: &mut AsyncPgConnection,
    name: &str,
    events: &[EventKind],
    max_attempts: i64,
) -> Webhook {
    webhooks::create(
        conn,
        &NewWebhook {
            name: WebhookName::parse(name).unwrap(),
            url: TargetUrl::parse("https://example.com/").unwrap(),
            events: events.iter().copied().collect(),
            retry: RetrySettings::new(max_attempts, i64::from(RetrySettings::DEFAULT_TIMEOUT_MS))
                .unwrap(),
            enabled: true,
            filters: Default::default(),
            headers: Default::default(),
            rate_limit: None,
            ordering: Default::default(),
        },
    )
    .await
    .unwrap()
}

/// A webhook subscribed to every event kind, with the default retry settings.
pub(crate) async fn webhook_for_every_event(conn: &mut AsyncPgConnection, name: &str) -> Webhook {
    webhook(conn, name, &EventKind::ALL, 5).await
}

fn disable() -> WebhookChanges {
    WebhookChanges {
        enabled: Some(false),
        ..Default::default()
    }
}

async fn set_max_attempts(conn: &mut AsyncPgConnection, webhook_id: Uuid, max_attempts: i64) {
    let retry =
        RetrySettings::new(max_attempts, i64::from(RetrySettings::DEFAULT_TIMEOUT_MS)).unwrap();
    webhooks::update(
        conn,
        webhook_id,
        &WebhookChanges {
            retry: Some(retry),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Opens an incident; returns its `incidents.opened` event.
pub(crate) async fn open(conn: &mut AsyncPgConnection, key: &str) -> NewEvent {
    let outcome = tocsin_testkit::apply_signals(
        conn,
        &[signal(key, AlertAction::Trigger)],
        outbox::Wake::Caller,
    )
    .await
    .unwrap();
    assert_eq!(outcome[0].change, Change::Opened, "{key}");
    outcome[0].events[0].clone()
}

/// Records a test event for one webhook, as the admin's "send test event" does.
pub(crate) async fn record_test_event(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> NewEvent {
    let payload = EventPayload {
        event: EventKind::IncidentOpened,
        timestamp: OffsetDateTime::now_utc(),
        data: IncidentData {
            id: Uuid::now_v7(),
            title: "Test event".into(),
            severity: Severity::SEV5,
            status: IncidentStatus::Triggered,
            previous_status: None,
        },
    };
    let event = NewEvent::new(&payload, Some(webhook_id));
    conn.transaction::<_, tocsin_storage::DbError, _>(async |conn| {
        outbox::record_events(conn, std::slice::from_ref(&event), outbox::Wake::Listeners).await
    })
    .await
    .unwrap();
    event
}

/// Fan-out rules that leave new deliveries `pending` (no first attempt claimed with them).
pub(crate) const PENDING: FanOutRules = FanOutRules {
    claim: false,
    lease_margin: Duration::from_secs(5),
    replay_to: None,
};

/// Whether a fan-out made nothing.
fn nothing(fanned: &FannedOut) -> bool {
    fanned.claimed.is_empty()
        && fanned.pending.is_empty()
        && fanned.waiting == 0
        && fanned.disabled == 0
}

pub(crate) fn fan_out_request(event: &NewEvent, redelivered: bool) -> FanOut {
    FanOut {
        event_id: event.id,
        kind: event.kind,
        incident_id: event.incident_id,
        test_webhook_id: event.test_webhook_id,
        redelivered,
    }
}

/// Fans out one event, as a dispatcher with no room for the webhooks in `busy` does.
async fn fan_out(conn: &mut AsyncPgConnection, event: &NewEvent, busy: &[Uuid]) -> FannedOut {
    let room: Vec<(Uuid, i64)> = busy.iter().map(|id| (*id, 0)).collect();
    fan_out::fan_out(conn, &[fan_out_request(event, false)], &room, PENDING)
        .await
        .unwrap()
        .pop()
        .unwrap()
}

/// Opens an incident and fans out its event; returns its delivery to `webhook_id`.
pub(crate) async fn delivery_to(conn: &mut AsyncPgConnection, key: &str, webhook_id: Uuid) -> Uuid {
    let event = open(conn, key).await;
    fan_out(conn, &event, &[])
        .await
        .pending
        .iter()
        .find(|d| d.webhook_id == webhook_id)
        .expect("a delivery to the webhook")
        .delivery_id
}

/// A webhook's deliveries, newest first.
pub(crate) async fn deliveries_of(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> Vec<Delivery> {
    let filter = deliveries::DeliveryFilter {
        webhook_id: Some(webhook_id),
        ..Default::default()
    };
    let page = tocsin_storage::Page {
        limit: tocsin_storage::Page::MAX_LIMIT,
        cursor: None,
    };
    deliveries::list(conn, &filter, &page).await.unwrap().0
}

async fn claim(
    conn: &mut AsyncPgConnection,
    delivery_id: Uuid,
    trigger: Trigger,
    expected_auto_attempts: i32,
    rules: ClaimRules,
) -> Option<Job> {
    attempts::claim(
        conn,
        &[Claim {
            delivery_id,
            trigger,
            expected_auto_attempts,
        }],
        rules,
    )
    .await
    .unwrap()
    .pop()
    .unwrap()
}

/// Claims the automatic attempt after the `expected` ones (the rules allow it a day early).
pub(crate) async fn claim_auto(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    expected: i32,
) -> Option<Job> {
    claim(conn, id, Trigger::Automatic, expected, claim_rules()).await
}

/// Asks for one manual attempt of a delivery and claims it.
async fn claim_manual(conn: &mut AsyncPgConnection, id: Uuid) -> Option<Job> {
    request_manual(conn, &[id]).await;
    claim(conn, id, Trigger::Manual, 0, claim_rules()).await
}

/// Marks deliveries as having a manual attempt asked for, as a retry's request does (without
/// its outbox row).
pub(crate) async fn request_manual(conn: &mut AsyncPgConnection, ids: &[Uuid]) {
    for id in ids {
        diesel::sql_query(format!(
            "UPDATE deliveries SET manual_requested = true WHERE id = '{id}'"
        ))
        .execute(conn)
        .await
        .unwrap();
    }
}

/// The completion of a claimed attempt with `result`, moving the delivery as the state machine
/// says for the specification's schedule.
pub(crate) fn completion(job: &Job, result: AttemptResult) -> Completion {
    let automatic = job.trigger == Trigger::Automatic;
    Completion {
        delivery_id: job.delivery.id,
        number: job.number,
        auto_number: automatic.then_some(job.delivery.auto_attempts),
        transition: Transition::after_attempt(
            job.trigger,
            job.delivery.auto_attempts,
            result.success,
            job.webhook.retry.max_attempts(),
            &RetrySchedule::specification(),
        ),
        result,
    }
}

pub(crate) async fn complete(
    conn: &mut AsyncPgConnection,
    completion: Completion,
) -> Option<Completed> {
    attempts::complete(conn, &[completion])
        .await
        .unwrap()
        .pop()
        .unwrap()
}

/// The lease of the automatic attempt under way, if any.
async fn lease(conn: &mut AsyncPgConnection, id: Uuid) -> Option<OffsetDateTime> {
    use schema::deliveries::dsl;
    dsl::deliveries
        .find(id)
        .select(dsl::attempting_until)
        .first(conn)
        .await
        .unwrap()
}

/// Ends the lease of the automatic attempt under way `ago` ago, as if its dispatcher had
/// stopped that long before.
async fn end_lease(conn: &mut AsyncPgConnection, id: Uuid, ago: &str) {
    diesel::sql_query(format!(
        "UPDATE deliveries SET attempting_until = now() - interval '{ago}', \
         next_attempt_at = now() - interval '{ago}' WHERE id = '{id}'"
    ))
    .execute(conn)
    .await
    .unwrap();
}

async fn set_due(conn: &mut AsyncPgConnection, id: Uuid, at: &str) {
    diesel::sql_query(format!(
        "UPDATE deliveries SET next_attempt_at = {at} WHERE id = '{id}'"
    ))
    .execute(conn)
    .await
    .unwrap();
}

/// Logged attempts of a delivery.
async fn attempt_rows(db: &TestDb, id: Uuid) -> i64 {
    db.count(&format!("attempts WHERE delivery_id = '{id}'"))
        .await
}

/// `at` lies between two instants the test measured (give or take a clock tick).
fn assert_between(at: OffsetDateTime, from: OffsetDateTime, to: OffsetDateTime, what: &str) {
    let tick = time::Duration::milliseconds(1);
    assert!(
        at >= from - tick && at <= to + tick,
        "{what}: {at}, expected between {from} and {to}"
    );
}
