//! Migrations against the real PostgreSQL: they apply once however many run at a time, and the
//! one-engine migration makes the previous release's held and deferred rows deliveries, the new
//! engine works on what it left, and its `down.sql` gives that release a schema it can run on.

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tocsin_domain::delivery::WaitReason;
use tocsin_storage::attempts::{AttemptResult, Completion};
use tocsin_storage::deliveries::{self, Due};
use tocsin_storage::schema;
use tocsin_testkit::deliveries::answered;
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{claim_auto, complete, completion};

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
