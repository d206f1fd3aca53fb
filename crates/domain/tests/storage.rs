//! Storage against the real PostgreSQL: migrations, incidents and their events in the outbox.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tocsin_domain::alerts::{AlertAction, AlertSignal};
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

    let opened = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Trigger)])
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

    let repeated = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Trigger)])
        .await
        .unwrap();
    assert_eq!(repeated[0].change, Change::Unchanged);
    assert!(repeated[0].events.is_empty());

    let acked = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Acknowledge)])
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

    let resolved = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Resolve)])
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

    let nothing = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Resolve)])
        .await
        .unwrap();
    assert_eq!(nothing[0].change, Change::NoOpenIncident);

    // Resolved is final: the same key opens a new incident.
    let reopened = incidents::apply_signals(&mut conn, &[signal("k1", AlertAction::Trigger)])
        .await
        .unwrap();
    assert_eq!(reopened[0].change, Change::Opened);
    assert_ne!(reopened[0].incident.as_ref().unwrap().id, incident.id);

    // Every event of the story waits in the outbox, in order: 1 + 1 + 2 + 1.
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 5);

    let refused = incidents::change_status(&mut conn, incident.id, IncidentStatus::Triggered).await;
    assert!(matches!(
        refused,
        Err(incidents::StatusChangeError::Transition(
            TransitionError::FromResolved
        ))
    ));
}

#[tokio::test]
async fn fifty_concurrent_alerts_with_one_new_key_open_one_incident() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let tasks = (0..50).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.get().await.unwrap();
            incidents::apply_signals(&mut conn, &[signal("race", AlertAction::Trigger)])
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
    for i in 0..12 {
        let outcome = incidents::apply_signals(
            &mut conn,
            &[signal(&format!("key-{i}"), AlertAction::Trigger)],
        )
        .await
        .unwrap_or_else(|e| panic!("incident {i}: {e}"));
        assert_eq!(outcome[0].change, Change::Opened);
    }
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
    let mut too_long = signal("x", AlertAction::Trigger);
    // A key the database refuses (NUL bytes are not valid in PostgreSQL text).
    too_long.dedup_key = "bad\0key".into();
    let good = signal("good", AlertAction::Trigger);
    let result = incidents::apply_signals(&mut conn, &[good, too_long]).await;
    assert!(result.is_err());
    let count: i64 = diesel::sql_query("SELECT count(*) AS n FROM incidents")
        .load::<Count>(&mut conn)
        .await
        .unwrap()[0]
        .n;
    assert_eq!(count, 0, "the good signal was rolled back with the bad one");
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);
}

#[tokio::test]
async fn ping_reports_an_unreachable_database() {
    let pool = db::pool("postgres://postgres@127.0.0.1:1/none", 1).unwrap();
    let error = db::ping(&pool, Duration::from_secs(2)).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

#[tokio::test]
async fn retention_prunes_old_finished_deliveries_and_keeps_the_rest() {
    use tocsin_domain::db::deliveries::{self as repo};
    use tocsin_domain::db::retention;
    use tocsin_domain::db::webhooks::{self, NewWebhook};
    use tocsin_domain::{RetrySettings, TargetUrl, WebhookName};

    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let webhook = webhooks::create(
        &mut conn,
        &NewWebhook {
            name: WebhookName::parse("r").unwrap(),
            url: TargetUrl::parse("https://example.com/").unwrap(),
            events: EventKind::ALL.into_iter().collect(),
            retry: RetrySettings::default(),
            enabled: true,
        },
    )
    .await
    .unwrap();
    let mut delivery_ids = Vec::new();
    for i in 0..5 {
        let outcome =
            incidents::apply_signals(&mut conn, &[signal(&format!("r{i}"), AlertAction::Trigger)])
                .await
                .unwrap();
        let event = &outcome[0].events[0];
        delivery_ids.extend(
            repo::create_for_event(
                &mut conn,
                event.id,
                event.kind,
                event.incident_id,
                &[webhook.id],
            )
            .await
            .unwrap(),
        );
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
    let now = time::OffsetDateTime::now_utc();
    let pruned = retention::prune(
        &mut conn,
        now - time::Duration::days(30),
        now - time::Duration::DAY,
    )
    .await
    .unwrap();
    assert_eq!(pruned.deliveries, 3);
    assert_eq!(pruned.events, 3, "events of the pruned deliveries go too");
    assert_eq!(pruned.outbox, 5);
    for kept in [delivery_ids[3], delivery_ids[4]] {
        assert!(repo::get(&mut conn, kept).await.is_ok());
    }
    let again = retention::prune(
        &mut conn,
        now - time::Duration::days(30),
        now - time::Duration::DAY,
    )
    .await
    .unwrap();
    assert_eq!(again, retention::Pruned::default());
}
