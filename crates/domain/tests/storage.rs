//! Storage against the real PostgreSQL: migrations, incidents, their events and the outbox rows
//! of their deliveries.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::amqp::messages::{
    DeliveryMessage, ATTEMPT_HEADER, TRIGGER_HEADER, WEBHOOK_HEADER,
};
use tocsin_domain::db::deliveries::{self, DeliveryState};
use tocsin_domain::db::incidents::{self, Change};
use tocsin_domain::db::{self, outbox};
use tocsin_domain::{EventKind, IncidentStatus, IncidentTitle, Severity, TransitionError};
use tocsin_testkit::TestDb;

fn signal(key: &str, action: AlertAction) -> AlertSignal {
    AlertSignal {
        dedup_key: key.to_owned(),
        action,
        title: IncidentTitle::parse("Disk full on db-1").unwrap(),
        severity: Severity::SEV2,
        description: None,
        source: Some("test".into()),
        reply_key: None,
    }
}

#[tokio::test]
async fn migrations_apply_twice_without_error() {
    let db = TestDb::empty().await;
    let first = db::migrate(&db.url).await.expect("first migration run");
    assert!(first >= 1, "a fresh database gets every migration");
    let second = db::migrate(&db.url).await.expect("second migration run");
    assert_eq!(second, 0, "nothing is pending the second time");
}

/// The migration that keeps held deliveries apart moves the previous release's held rows that
/// were never attempted into `held_deliveries`, leaving one attempted while held as an ordinary
/// delivery; its `down.sql` moves them back as held rows.
#[tokio::test]
async fn held_rows_of_the_previous_release_move_to_held_deliveries_and_back() {
    use diesel::connection::SimpleConnection;
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
    use diesel_migrations::MigrationHarness;
    let db = TestDb::empty().await;
    let conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let mut wrapper: AsyncConnectionWrapper<AsyncPgConnection> = conn.into();
    let mut wrapper = tokio::task::spawn_blocking(move || {
        for _ in 1..db::migration_count() {
            wrapper.run_next_migration(db::MIGRATIONS).unwrap();
        }
        wrapper
            .batch_execute(
                "INSERT INTO webhooks (id, name, url, events, max_attempts, timeout_ms, secret,
                    created_at, updated_at, slow_until)
                 VALUES ('00000000-0000-7000-8000-000000000001', 'slow', 'http://127.0.0.1:9/',
                    '{incidents.opened}', 5, 10000, 'whsec_x', now(), now(),
                    now() + interval '1 minute');
                 INSERT INTO events (id, kind, incident_id, occurred_at, body)
                 SELECT ('00000000-0000-7000-8000-00000000001' || n)::uuid, 'incidents.opened',
                    gen_random_uuid(), now(), '{}'
                 FROM generate_series(1, 2) n;
                 INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state,
                    attempt_count, held, next_attempt_at, created_at, updated_at)
                 SELECT gen_random_uuid(), '00000000-0000-7000-8000-000000000001', e.id, e.kind,
                    e.incident_id, 'pending', n - 1, true, now() + interval '1 minute', now(),
                    now()
                 FROM events e
                 JOIN generate_series(1, 2) n
                    ON e.id = ('00000000-0000-7000-8000-00000000001' || n)::uuid;",
            )
            .unwrap();
        wrapper.run_next_migration(db::MIGRATIONS).unwrap();
        wrapper
    })
    .await
    .unwrap();
    assert_eq!(
        db.count("held_deliveries WHERE event_id = '00000000-0000-7000-8000-000000000011'")
            .await,
        1
    );
    assert_eq!(db.count("held_deliveries").await, 1);
    assert_eq!(
        db.count("deliveries WHERE attempt_count = 1").await,
        1,
        "the attempted one stays"
    );
    assert_eq!(db.count("deliveries").await, 1);

    tokio::task::spawn_blocking(move || {
        wrapper.revert_last_migration(db::MIGRATIONS).unwrap();
    })
    .await
    .unwrap();
    assert_eq!(
        db.count("deliveries WHERE held AND state = 'pending' AND attempt_count = 0")
            .await,
        1
    );
    assert_eq!(db.count("deliveries").await, 2);
    assert_eq!(
        db.count("pg_tables WHERE tablename = 'held_deliveries'")
            .await,
        0
    );
}

#[tokio::test]
async fn concurrent_migrations_serialise_on_the_lock() {
    let db = TestDb::empty().await;
    let runs = futures::future::join_all((0..4).map(|_| db::migrate(&db.url))).await;
    let applied: usize = runs.into_iter().map(|r| r.expect("migration run")).sum();
    assert_eq!(
        applied,
        db::migration_count(),
        "each migration applied exactly once in all"
    );
}

#[tokio::test]
async fn an_incident_moves_through_its_lifecycle_with_its_events() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "every event").await;

    let opened = incidents::apply_signals(
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

    let repeated = incidents::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(repeated[0].change, Change::Unchanged);
    assert!(repeated[0].events.is_empty());

    let acked = incidents::apply_signals(
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

    let resolved = incidents::apply_signals(
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

    let nothing = incidents::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Resolve)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(nothing[0].change, Change::NoOpenIncident);

    // Resolved is final: the same key opens a new incident.
    let reopened = incidents::apply_signals(
        &mut conn,
        &[signal("k1", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(reopened[0].change, Change::Opened);
    assert_ne!(reopened[0].incident.as_ref().unwrap().id, incident.id);

    // Every event of the story has its delivery, whose first attempt waits in the outbox, in
    // order: 1 + 1 + 2 + 1.
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 5);
    let mut kinds = Vec::new();
    for row in outbox::claim_and_mark(&mut conn, 10).await.unwrap() {
        assert_eq!(row.topic(), Some(outbox::Topic::Delivery));
        assert_eq!(
            row.headers,
            serde_json::json!({
                ATTEMPT_HEADER: 1,
                TRIGGER_HEADER: "automatic",
                WEBHOOK_HEADER: webhook.id.to_string(),
            })
        );
        let message = DeliveryMessage::from_bytes(&row.payload).unwrap();
        let delivery = deliveries::get(&mut conn, message.delivery_id)
            .await
            .unwrap();
        assert_eq!(delivery.webhook_id, webhook.id);
        assert_eq!(delivery.state, DeliveryState::Pending);
        kinds.push(delivery.event.as_str().to_owned());
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

    let refused = incidents::change_status(&mut conn, incident.id, IncidentStatus::Triggered).await;
    assert!(matches!(
        refused,
        Err(incidents::StatusChangeError::Transition(
            TransitionError::FromResolved
        ))
    ));
}

#[tokio::test]
async fn events_go_only_to_enabled_undeleted_subscribed_webhooks_and_without_one_nothing_is_published(
) {
    use tocsin_domain::db::webhooks::{self, NewWebhook};
    use tocsin_domain::{RetrySettings, TargetUrl, WebhookName};
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    // Nobody subscribes: the events are recorded, and nothing waits to be published.
    let alone = incidents::apply_signals(
        &mut conn,
        &[signal("alone", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(alone[0].change, Change::Opened);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);

    let webhook = |name: &str, events: &[EventKind], enabled: bool| NewWebhook {
        name: WebhookName::parse(name).unwrap(),
        url: TargetUrl::parse("https://example.com/").unwrap(),
        events: events.iter().copied().collect(),
        retry: RetrySettings::default(),
        enabled,
    };
    for (name, kind, enabled) in [
        ("opened", EventKind::IncidentOpened, true),
        ("resolved", EventKind::IncidentResolved, true),
        ("off", EventKind::IncidentOpened, false),
        ("deleted", EventKind::IncidentOpened, true),
    ] {
        webhooks::create(&mut conn, &webhook(name, &[kind], enabled))
            .await
            .unwrap();
    }
    diesel::sql_query("UPDATE webhooks SET deleted_at = now() WHERE name = 'deleted'")
        .execute(&mut conn)
        .await
        .unwrap();
    // A batch of triggers takes the one-statement path; a body with two signals for one key,
    // the general one.
    incidents::apply_alerts(
        &mut conn,
        &[
            vec![signal("a", AlertAction::Trigger)],
            vec![signal("b", AlertAction::Trigger)],
        ],
        outbox::Wake::Caller,
    )
    .await
    .unwrap();
    incidents::apply_signals(
        &mut conn,
        &[
            signal("c", AlertAction::Trigger),
            signal("c", AlertAction::Acknowledge),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let deliveries: Vec<(String, String, String)> = diesel::sql_query(
        "SELECT w.name, i.dedup_key, d.event FROM deliveries d
         JOIN webhooks w ON w.id = d.webhook_id JOIN incidents i ON i.id = d.incident_id
         ORDER BY i.dedup_key",
    )
    .load::<Targeted>(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .map(|row| (row.name, row.dedup_key, row.event))
    .collect();
    let expected = [("opened", "a"), ("opened", "b"), ("opened", "c")]
        .map(|(n, k)| (n.to_owned(), k.to_owned(), "incidents.opened".to_owned()));
    assert_eq!(deliveries, expected);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 3);
}

/// A first attempt whose message waits in the outbox is the relays' to send: the sweeper takes
/// it only once no outbox row older than its grace is waiting, so that a long broker outage does
/// not end with each first attempt queued twice.
#[tokio::test]
async fn the_sweeper_leaves_first_attempts_to_the_relays_while_they_are_behind() {
    use tocsin_domain::db::deliveries::claim_overdue;
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    webhook_for_every_event(&mut conn, "every event").await;
    incidents::apply_signals(
        &mut conn,
        &[signal("outage", AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    // Written ten minutes ago, during an outage; its outbox row is still unpublished.
    for statement in [
        "UPDATE deliveries SET next_attempt_at = now() - interval '10 minutes'",
        "UPDATE outbox SET created_at = now() - interval '10 minutes'",
    ] {
        diesel::sql_query(statement)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let grace = Duration::from_secs(120);
    assert!(claim_overdue(&mut conn, grace, 10)
        .await
        .unwrap()
        .is_empty());
    // The relays caught up: a first attempt still overdue now was lost on the way.
    diesel::sql_query("UPDATE outbox SET published_at = now()")
        .execute(&mut conn)
        .await
        .unwrap();
    let claimed = claim_overdue(&mut conn, grace, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].1, 0, "no automatic attempt made yet");
}

/// While a dispatcher has a webhook marked slow, its new deliveries are held: a row of
/// `held_deliveries` each, with no delivery row and no outbox row, which neither the sweeper nor
/// the release takes while the mark lasts, on each path that creates deliveries (ingest's one
/// statement, `record_events`, and the dispatcher's fan-out of an earlier version's event
/// message). Once the mark lapses they are released into pending deliveries, once.
#[tokio::test]
async fn deliveries_to_a_webhook_marked_slow_are_held_until_the_mark_lapses() {
    use tocsin_domain::db::deliveries::{claim_overdue, release_held, FanOut, ReleaseQuota};
    use tocsin_domain::db::webhooks;
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    // An event written before any webhook existed, for the dispatcher's fan-out below.
    let legacy = incidents::apply_signals(
        &mut conn,
        &[signal("legacy", AlertAction::Trigger)],
        outbox::Wake::Caller,
    )
    .await
    .unwrap()[0]
        .events[0]
        .clone();
    let webhook = webhook_for_every_event(&mut conn, "slow").await;
    webhooks::mark_slow(&mut conn, webhook.id, Duration::from_secs(60))
        .await
        .unwrap();
    let before = outbox::backlog(&mut conn).await.unwrap();

    for (key, action) in [
        ("held", AlertAction::Trigger),
        ("held", AlertAction::Resolve),
    ] {
        incidents::apply_signals(&mut conn, &[signal(key, action)], outbox::Wake::Caller)
            .await
            .unwrap();
    }
    let legacy_fan_out = [FanOut {
        event_id: legacy.id,
        kind: legacy.kind,
        incident_id: legacy.incident_id,
        test_webhook_id: None,
        redelivered: false,
    }];
    let fanned = deliveries::fan_out(&mut conn, &legacy_fan_out)
        .await
        .unwrap();
    assert_eq!((fanned[0].created, fanned[0].held), (0, 1));
    assert!(
        fanned[0].to_enqueue.is_empty(),
        "a held delivery is not enqueued"
    );
    // Opened, the resolve's events, and the fanned-out event: every one held until the mark
    // lapses, none a delivery yet.
    let held = db.count("held_deliveries").await;
    assert_eq!(held, 4);
    assert_eq!(db.count("deliveries").await, 0);
    assert_eq!(
        outbox::backlog(&mut conn).await.unwrap(),
        before,
        "no outbox row for a held delivery"
    );
    // Fanned out again while the mark lasts, an event is held once.
    let again = deliveries::fan_out(&mut conn, &legacy_fan_out)
        .await
        .unwrap();
    assert_eq!((again[0].created, again[0].held), (0, 0));
    assert_eq!(db.count("held_deliveries").await, held);

    // While the mark lasts nothing takes them.
    let every = ReleaseQuota::each(10);
    assert!(release_held(&mut conn, 10, &every)
        .await
        .unwrap()
        .is_empty());
    assert!(claim_overdue(&mut conn, Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());

    webhooks::mark_slow(&mut conn, webhook.id, Duration::ZERO)
        .await
        .unwrap();
    // Fanned out again once the mark has lapsed, an event gets its delivery at once; its held
    // pair (the oldest) is then only dropped by the release.
    let again = deliveries::fan_out(&mut conn, &legacy_fan_out)
        .await
        .unwrap();
    assert_eq!((again[0].created, again[0].held), (1, 0));
    assert!(
        release_held(&mut conn, 1, &every).await.unwrap().is_empty(),
        "the pair whose delivery exists is dropped, not released"
    );
    assert_eq!(db.count("held_deliveries").await, held - 1);
    let released = release_held(&mut conn, 1, &every).await.unwrap();
    assert_eq!(released.len(), 1, "at most the limit per call");
    assert!(released.iter().all(|w| w.webhook_id == webhook.id));
    let paced = ReleaseQuota {
        default: 10,
        webhooks: vec![(uuid::Uuid::now_v7(), 10), (webhook.id, 1)],
    };
    assert_eq!(
        release_held(&mut conn, 10, &paced).await.unwrap().len(),
        1,
        "at most the webhook's own quota"
    );
    assert_eq!(
        release_held(&mut conn, 10, &ReleaseQuota::each(1))
            .await
            .unwrap()
            .len(),
        1,
        "at most the quota of every webhook"
    );
    assert!(release_held(&mut conn, 10, &every)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(db.count("held_deliveries").await, 0);
    assert_eq!(
        db.count(
            "deliveries WHERE state = 'pending' AND attempt_count = 0
             AND next_attempt_at > now() - interval '1 minute'"
        )
        .await,
        held,
        "one delivery per held event, due now"
    );
    assert_eq!(
        db.count("(SELECT DISTINCT event_id FROM deliveries) d")
            .await,
        held
    );

    // A new delivery once the mark has lapsed is an ordinary one.
    incidents::apply_signals(
        &mut conn,
        &[signal("after", AlertAction::Trigger)],
        outbox::Wake::Caller,
    )
    .await
    .unwrap();
    assert_eq!(db.count("held_deliveries").await, 0);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), before + 1);

    // Deleting a webhook stops its deliveries, and makes each held one a failed delivery with
    // no attempt, leaving the release nothing to do for it.
    webhooks::mark_slow(&mut conn, webhook.id, Duration::from_secs(60))
        .await
        .unwrap();
    incidents::apply_signals(
        &mut conn,
        &[signal("deleted", AlertAction::Trigger)],
        outbox::Wake::Caller,
    )
    .await
    .unwrap();
    assert_eq!(db.count("held_deliveries").await, 1);
    webhooks::delete(&mut conn, webhook.id).await.unwrap();
    assert_eq!(db.count("held_deliveries").await, 0);
    assert_eq!(
        db.count("deliveries WHERE state = 'pending' OR state = 'retrying'")
            .await,
        0
    );
    assert_eq!(
        db.count(
            "deliveries d JOIN incidents i ON i.id = d.incident_id
             WHERE i.dedup_key = 'deleted' AND d.state = 'failed' AND d.attempt_count = 0
             AND d.next_attempt_at IS NULL"
        )
        .await,
        1
    );
}

#[derive(diesel::QueryableByName)]
struct Targeted {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    dedup_key: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    event: String,
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
            incidents::apply_signals(
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
    let ids: std::collections::HashSet<_> = outcomes
        .iter()
        .map(|o| o.as_ref().unwrap()[0].incident.as_ref().unwrap().id)
        .collect();
    assert_eq!(ids.len(), 1, "everyone sees the one incident");
    let mut conn = pool.get().await.unwrap();
    let count: i64 = diesel::sql_query("SELECT count(*) AS n FROM incidents")
        .load::<Count>(&mut conn)
        .await
        .unwrap()[0]
        .n;
    assert_eq!(count, 1);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 1);
}

#[tokio::test]
async fn many_incidents_open_on_one_connection() {
    // PostgreSQL switches a prepared statement to a generic plan after five runs: the upsert
    // against the partial unique index must keep working past that.
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    // With a subscriber, so that the fan-out part of the statement runs on the generic plan too.
    webhook_for_every_event(&mut conn, "every event").await;
    for i in 0..12 {
        let outcome = incidents::apply_signals(
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

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
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
        incidents::apply_signals(&mut conn, &[good, too_long], outbox::Wake::Listeners).await;
    assert!(result.is_err());
    let count: i64 = diesel::sql_query("SELECT count(*) AS n FROM incidents")
        .load::<Count>(&mut conn)
        .await
        .unwrap()[0]
        .n;
    assert_eq!(count, 0, "the good signal was rolled back with the bad one");
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);
}

/// The pool's connections plan as `db::SESSION_SETTINGS` says; without `jit = off`, the release
/// pass of held deliveries was compiled with LLVM on every call (docs/performance.md).
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
    let pool = db::pool("postgres://postgres@127.0.0.1:1/none", 1).unwrap();
    let error = db::ping(&pool, Duration::from_secs(2)).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

#[tokio::test]
async fn a_multi_host_database_url_skips_an_unreachable_host() {
    let db = TestDb::new().await;
    let url = db.multi_host_url("127.0.0.1:1");
    assert!(url.contains("127.0.0.1:1,"), "{url}");
    assert_eq!(db::migrate(&url).await.unwrap(), 0, "already migrated");
    let pool = db::pool(&url, 2).unwrap();
    db::ping(&pool, Duration::from_secs(5)).await.unwrap();
    // Only unreachable hosts: unavailable, as with one.
    let nowhere = db::pool("postgres://postgres@127.0.0.1:1,127.0.0.1:2/none", 1).unwrap();
    let error = db::ping(&nowhere, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

#[tokio::test]
async fn retention_prunes_old_finished_deliveries_and_keeps_the_rest() {
    use tocsin_domain::db::deliveries::{self as repo};
    use tocsin_domain::db::retention;

    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "r").await;
    let mut delivery_ids = Vec::new();
    for i in 0..5 {
        let outcome = incidents::apply_signals(
            &mut conn,
            &[signal(&format!("r{i}"), AlertAction::Trigger)],
            outbox::Wake::Listeners,
        )
        .await
        .unwrap();
        // Its delivery was created with the event.
        let waiting = repo::waiting_for_first_attempt(&mut conn, outcome[0].events[0].id)
            .await
            .unwrap();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].webhook_id, webhook.id);
        delivery_ids.push(waiting[0].delivery_id);
    }
    // Three old finished deliveries, one old unfinished, one recent finished.
    let set = |state: &str, age_days: i32, id: uuid::Uuid| {
        diesel::sql_query(format!(
            "UPDATE deliveries SET state = '{state}', updated_at = now() - interval '{age_days} days' WHERE id = $1"
        ))
        .bind::<diesel::sql_types::Uuid, _>(id)
    };
    for (state, age, id) in [
        ("succeeded", 40, delivery_ids[0]),
        ("failed", 40, delivery_ids[1]),
        ("succeeded", 31, delivery_ids[2]),
        ("retrying", 40, delivery_ids[3]),
        ("succeeded", 2, delivery_ids[4]),
    ] {
        set(state, age, id).execute(&mut conn).await.unwrap();
    }
    diesel::sql_query("UPDATE events SET occurred_at = now() - interval '40 days'")
        .execute(&mut conn)
        .await
        .unwrap();
    diesel::sql_query("UPDATE outbox SET published_at = now() - interval '2 days'")
        .execute(&mut conn)
        .await
        .unwrap();
    // The event of one pruned delivery, a little younger than the others, is also held for
    // another webhook, marked slow.
    diesel::sql_query(
        "WITH held AS (
             INSERT INTO held_deliveries (webhook_id, event_id, held_at)
             SELECT gen_random_uuid(), event_id, now() - interval '35 days' FROM deliveries
             WHERE id = $1
             RETURNING event_id)
         UPDATE events SET occurred_at = now() - interval '35 days'
         WHERE id IN (SELECT event_id FROM held)",
    )
    .bind::<diesel::sql_types::Uuid, _>(delivery_ids[1])
    .execute(&mut conn)
    .await
    .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let pruned = retention::prune(
        &mut conn,
        now - time::Duration::days(30),
        now - time::Duration::DAY,
    )
    .await
    .unwrap();
    assert_eq!(pruned.deliveries, 3);
    assert_eq!(
        pruned.events, 2,
        "events of the pruned deliveries go too, but for the one still held"
    );
    assert_eq!(
        db.count("events e JOIN held_deliveries h ON h.event_id = e.id")
            .await,
        1
    );
    assert_eq!(pruned.outbox, 5);
    for kept in [delivery_ids[3], delivery_ids[4]] {
        assert!(repo::get(&mut conn, kept).await.is_ok());
    }
    // With nothing held, it goes too.
    diesel::sql_query("DELETE FROM held_deliveries")
        .execute(&mut conn)
        .await
        .unwrap();
    let again = retention::prune(
        &mut conn,
        now - time::Duration::days(30),
        now - time::Duration::DAY,
    )
    .await
    .unwrap();
    assert_eq!(
        again,
        retention::Pruned {
            events: 1,
            ..Default::default()
        }
    );
    let last = retention::prune(
        &mut conn,
        now - time::Duration::days(30),
        now - time::Duration::DAY,
    )
    .await
    .unwrap();
    assert_eq!(last, retention::Pruned::default());
}

/// Attempts logged together (the dispatcher's batches) move each delivery as they would alone:
/// a stale automatic attempt is refused, a manual one always counts, a delivery twice in one
/// batch is logged by the copy that still matches, and answers come back in request order.
#[tokio::test]
async fn attempts_logged_in_one_batch_move_each_delivery_as_alone() {
    use tocsin_domain::amqp::messages::Trigger;
    use tocsin_domain::db::deliveries::{
        self as repo, AttemptRecord, DeliveryState, FanOut, NewAttempt,
    };

    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    // Four events fanned out in one batch (as the dispatcher does an event message), one of
    // them given twice. The webhook comes after the events: their own transactions found no
    // subscriber, so this fan-out creates their deliveries.
    let mut requests = Vec::new();
    for i in 0..4 {
        let outcome = incidents::apply_signals(
            &mut conn,
            &[signal(&format!("b{i}"), AlertAction::Trigger)],
            outbox::Wake::Caller,
        )
        .await
        .unwrap();
        let event = &outcome[0].events[0];
        requests.push(FanOut {
            event_id: event.id,
            kind: event.kind,
            incident_id: event.incident_id,
            test_webhook_id: None,
            redelivered: false,
        });
    }
    requests.push(requests[0].clone());
    webhook_for_every_event(&mut conn, "batch").await;
    let fanned = repo::fan_out(&mut conn, &requests).await.unwrap();
    assert_eq!(
        fanned.iter().map(|f| f.created).collect::<Vec<_>>(),
        [1, 1, 1, 1, 0],
        "one delivery per event; the second copy creates none"
    );
    assert!(fanned[4].to_enqueue.is_empty());
    let ids: Vec<uuid::Uuid> = fanned[..4]
        .iter()
        .map(|f| f.to_enqueue[0].delivery_id)
        .collect();

    let attempt = |trigger: Trigger, success: bool| NewAttempt {
        trigger,
        started_at: time::OffsetDateTime::now_utc(),
        success,
        status_code: Some(if success { 200 } else { 500 }),
        duration_ms: 3,
        error: None,
        error_detail: None,
        request_headers: serde_json::json!({"webhook-id": "x"}),
        response_body: None,
        response_truncated: false,
    };
    let record = |id, expected, trigger, success, state| AttemptRecord {
        delivery_id: id,
        expected_auto_attempts: expected,
        attempt: attempt(trigger, success),
        state,
        next_attempt_at: None,
    };
    let batch = [
        record(
            ids[3],
            Some(0),
            Trigger::Automatic,
            true,
            DeliveryState::Succeeded,
        ),
        record(
            ids[0],
            Some(0),
            Trigger::Automatic,
            false,
            DeliveryState::Retrying,
        ),
        // Stale: this delivery has made no automatic attempt yet, not one.
        record(
            ids[1],
            Some(1),
            Trigger::Automatic,
            true,
            DeliveryState::Succeeded,
        ),
        record(ids[2], None, Trigger::Manual, true, DeliveryState::Pending),
    ];
    let answers = repo::record_attempts(&mut conn, &batch).await.unwrap();
    let summary: Vec<Option<(uuid::Uuid, DeliveryState, i32, i32)>> = answers
        .iter()
        .map(|d| {
            d.as_ref()
                .map(|d| (d.id, d.state, d.attempt_count, d.auto_attempts))
        })
        .collect();
    assert_eq!(
        summary,
        [
            Some((ids[3], DeliveryState::Succeeded, 1, 1)),
            Some((ids[0], DeliveryState::Retrying, 1, 1)),
            None,
            Some((ids[2], DeliveryState::Pending, 1, 0)),
        ]
    );
    // The same delivery twice: the first copy is logged, the second is stale.
    let twice = [
        record(
            ids[0],
            Some(1),
            Trigger::Automatic,
            false,
            DeliveryState::Retrying,
        ),
        record(
            ids[0],
            Some(1),
            Trigger::Automatic,
            true,
            DeliveryState::Succeeded,
        ),
    ];
    let answers = repo::record_attempts(&mut conn, &twice).await.unwrap();
    assert_eq!(answers[0].as_ref().map(|d| d.auto_attempts), Some(2));
    assert!(answers[1].is_none());
    // Every logged attempt has its row, numbered in order; the refused ones have none.
    let numbers: Vec<(uuid::Uuid, i32)> =
        diesel::sql_query("SELECT delivery_id, number FROM attempts ORDER BY delivery_id, number")
            .load::<AttemptNumber>(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .map(|row| (row.delivery_id, row.number))
            .collect();
    let mut expected = vec![(ids[0], 1), (ids[0], 2), (ids[2], 1), (ids[3], 1)];
    expected.sort();
    assert_eq!(numbers, expected);
}

#[derive(diesel::QueryableByName)]
struct AttemptNumber {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    delivery_id: uuid::Uuid,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    number: i32,
}

/// A webhook subscribed to every event kind.
async fn webhook_for_every_event(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> tocsin_domain::db::webhooks::Webhook {
    use tocsin_domain::db::webhooks::{self, NewWebhook};
    use tocsin_domain::{RetrySettings, TargetUrl, WebhookName};
    webhooks::create(
        conn,
        &NewWebhook {
            name: WebhookName::parse(name).unwrap(),
            url: TargetUrl::parse("https://example.com/").unwrap(),
            events: EventKind::ALL.into_iter().collect(),
            retry: RetrySettings::default(),
            enabled: true,
        },
    )
    .await
    .unwrap()
}
