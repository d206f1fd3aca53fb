//! The reshape of a delivery log that holds rows into day partitions (`partitions::reshape`),
//! online: on the schema the previous release left, with deliveries, their attempts and events
//! (one delivery with a random, not time-ordered, id), while incidents keep being opened and
//! fanned out beside it; every row is still there afterwards, found by id, and the history
//! stays in one partition before the first day's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use tocsin_storage::{deliveries, partitions};
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{delivery_to, webhook_for_every_event};

/// The schema as the previous release left it: every migration, no partitions.
async fn previous_release(db: &TestDb) {
    use diesel_migrations::MigrationHarness;
    let conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let mut wrapper: AsyncConnectionWrapper<AsyncPgConnection> = conn.into();
    tokio::task::spawn_blocking(move || {
        wrapper
            .run_pending_migrations(tocsin_storage::MIGRATIONS)
            .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_delivery_log_holding_rows_is_reshaped_while_it_is_written() {
    let db = TestDb::empty().await;
    previous_release(&db).await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    assert!(!partitions::partitioned(&mut conn).await.unwrap());
    let webhook = webhook_for_every_event(&mut conn, "reshape").await;
    let mut before = Vec::new();
    for n in 0..20 {
        let id = delivery_to(&mut conn, &format!("before {n}"), webhook.id).await;
        record_attempt(&mut conn, id, answered(500)).await;
        before.push(id);
    }
    // A delivery with a random id, as the 2026-11-24 migration made them, past the cut.
    let random = Uuid::parse_str("ffffffff-0000-4000-8000-000000000001").unwrap();
    conn.batch_execute(&format!(
        "CREATE TEMP TABLE d AS SELECT * FROM deliveries WHERE id = '{old}';
         CREATE TEMP TABLE a AS SELECT * FROM attempts WHERE delivery_id = '{old}';
         DELETE FROM attempts WHERE delivery_id = '{old}';
         DELETE FROM deliveries WHERE id = '{old}';
         UPDATE d SET id = '{random}';
         UPDATE a SET delivery_id = '{random}';
         INSERT INTO deliveries SELECT * FROM d;
         INSERT INTO attempts SELECT * FROM a;",
        old = before[0]
    ))
    .await
    .unwrap();
    let random_event = deliveries::get(&mut conn, random).await.unwrap().event_id;

    // A writer opening incidents and fanning them out throughout the reshape.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (url, stop, webhook) = (db.url.clone(), stop.clone(), webhook.id);
        async move {
            let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
            let mut written = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) || written.len() < 5 {
                written.push(delivery_to(&mut conn, &format!("during {n}"), webhook).await);
                n += 1;
                assert!(n < 10_000, "the writer ends");
            }
            written
        }
    });
    let reshaped = partitions::reshape(&mut conn, time::OffsetDateTime::now_utc())
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let during = writer.await.unwrap();
    assert_eq!(reshaped.tables, ["events", "deliveries", "attempts"]);
    assert_eq!(reshaped.rekeyed, 1, "the random id got a time-ordered one");
    assert!(partitions::partitioned(&mut conn).await.unwrap());

    // Written after the reshape, too.
    let after = delivery_to(&mut conn, "after", webhook.id).await;
    record_attempt(&mut conn, after, answered(200)).await;

    let expected = before.len() as i64 + during.len() as i64 + 1;
    assert_eq!(db.count("deliveries").await, expected, "no delivery lost");
    assert_eq!(db.count("events").await, expected, "no event lost");
    assert_eq!(db.count("attempts").await, 21);
    for id in before.iter().skip(1).chain(&during).chain([&after]) {
        deliveries::get(&mut conn, *id).await.expect("found by id");
    }
    assert_eq!(
        db.count(&format!("deliveries WHERE id = '{random}'")).await,
        0
    );
    assert_eq!(
        db.count(&format!(
            "deliveries d JOIN attempts a ON a.delivery_id = d.id WHERE d.event_id = '{random_event}'"
        ))
        .await,
        1,
        "the rekeyed delivery keeps its attempt"
    );
    // Every row until the day after tomorrow lives in the `before` partition; days after it
    // have their own.
    let before_rows = db
        .count("deliveries WHERE tableoid::regclass::text LIKE 'deliveries_before_%'")
        .await;
    assert_eq!(before_rows, expected);
    assert!(
        db.count("pg_inherits WHERE inhparent = 'events'::regclass")
            .await
            >= 6
    );
    // Once more: nothing to do.
    let again = partitions::reshape(&mut conn, time::OffsetDateTime::now_utc())
        .await
        .unwrap();
    assert!(again.tables.is_empty());
}
