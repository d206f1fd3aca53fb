//! Retention (`retention::prune`): days of the delivery log past retention go whole, but for
//! their unfinished deliveries (with their attempts and events); published outbox rows go after
//! their own retention.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use time::OffsetDateTime;
use tocsin_storage::deliveries;
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;

use crate::common::{delivery_to, execute, open, webhook_for_every_event};

/// A day past retention goes whole, but for its unfinished deliveries, which stay with their
/// attempts and events (and an event whose outbox row still waits for the relay); a day within
/// retention stays; a day left with only what it keeps is not touched again, and once that is
/// finished too, the day's partitions are dropped.
#[tokio::test]
async fn a_day_past_retention_goes_whole_but_for_its_unfinished_deliveries() {
    use tocsin_storage::{partitions, retention};

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
    for (state, id) in [
        ("succeeded", delivery_ids[0]),
        ("failed", delivery_ids[1]),
        ("succeeded", delivery_ids[2]),
        ("retrying", delivery_ids[3]),
        ("waiting", delivery_ids[4]),
    ] {
        let reason = if state == "waiting" {
            "'webhook_disabled'"
        } else {
            "NULL"
        };
        execute(
            &mut conn,
            format!(
                "UPDATE deliveries SET state = '{state}', wait_reason = {reason} \
                 WHERE id = '{id}'"
            ),
        )
        .await;
    }
    execute(
        &mut conn,
        format!(
            "UPDATE outbox SET published_at = now() - interval '2 days' \
             WHERE convert_from(payload, 'UTF8')::jsonb ->> 'event_id' <> '{}'",
            unannounced.id
        ),
    )
    .await;
    let now = OffsetDateTime::now_utc();
    let today = now.date();
    let prune = async |conn: &mut AsyncPgConnection, cutoff: OffsetDateTime| {
        retention::prune(conn, cutoff, now - time::Duration::DAY)
            .await
            .unwrap()
    };
    let (events, attempts) = (db.count("events").await, db.count("attempts").await);

    // Within retention: nothing of the delivery log goes.
    let pruned = prune(&mut conn, now - time::Duration::days(30)).await;
    assert_eq!(pruned.days, partitions::Expired::default());
    assert_eq!(
        pruned.outbox, 6,
        "published outbox rows have their own retention"
    );
    assert_eq!(db.count("deliveries").await, 5);
    assert_eq!(db.count("events").await, events);

    // Today past retention (the cutoff at the next midnight): all but what is unfinished goes.
    let end_of_today = (today + time::Duration::DAY).midnight().assume_utc();
    let pruned = prune(&mut conn, end_of_today).await;
    assert_eq!(
        pruned.days,
        partitions::Expired {
            dropped: 0,
            emptied: 1,
            kept: 2
        }
    );
    assert_eq!(db.count("deliveries").await, 2);
    for kept in [delivery_ids[3], delivery_ids[4]] {
        let delivery = deliveries::get(&mut conn, kept)
            .await
            .expect("a kept delivery");
        assert_eq!(
            db.count(&format!("events WHERE id = '{}'", delivery.event_id))
                .await,
            1,
            "a kept delivery keeps its event"
        );
        assert_eq!(
            db.count(&format!("attempts WHERE delivery_id = '{kept}'"))
                .await,
            1,
            "a kept delivery keeps its attempts"
        );
    }
    assert!(attempts > 2);
    assert_eq!(db.count("attempts").await, 2);
    assert_eq!(
        db.count(&format!("events WHERE id = '{}'", unannounced.id))
            .await,
        1,
        "an event still to announce stays"
    );
    assert_eq!(db.count("events").await, 3);

    // Only what it keeps is left: the day is not emptied again.
    let pruned = prune(&mut conn, end_of_today).await;
    assert_eq!(pruned.days, partitions::Expired::default());
    assert_eq!(db.count("deliveries").await, 2);

    // Once those are finished and announced, the day's partitions are dropped.
    execute(
        &mut conn,
        "UPDATE deliveries SET state = 'failed', wait_reason = NULL".to_owned(),
    )
    .await;
    execute(
        &mut conn,
        "UPDATE outbox SET published_at = now() - interval '2 days'".to_owned(),
    )
    .await;
    let pruned = prune(&mut conn, end_of_today).await;
    assert_eq!(pruned.days.dropped, 1);
    for table in ["events", "deliveries", "attempts"] {
        assert_eq!(db.count(table).await, 0, "{table}");
        let day = format!(
            "{table}_{:04}{:02}{:02}",
            today.year(),
            u8::from(today.month()),
            today.day()
        );
        assert_eq!(
            db.count(&format!("pg_class WHERE relname = '{day}'")).await,
            0,
            "{day} is dropped"
        );
    }
    // The days ahead are still there: today's work goes on in tomorrow's partition.
    assert!(
        db.count("pg_inherits WHERE inhparent = 'deliveries'::regclass")
            .await
            >= 7
    );
}

/// A delivery made in a day while retention waits to lock it (by a transaction already under
/// way: a replay of the day's events, say) is kept: retention waits for that transaction, then
/// keeps the delivery and removes the rest of the day, in the same pass.
#[tokio::test]
async fn a_delivery_made_while_its_day_expires_is_kept() {
    use tocsin_storage::partitions;

    let db = TestDb::new().await;
    // A transaction under way that uses the table: retention waits for it to end.
    let (mut racer, pruning, id) = prune_today_beside_a_reader(&db, "raced").await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let late = webhook_for_every_event(&mut conn, "late").await;
    wait_for_retention_to_wait(&db).await;
    execute(
        &mut racer,
        format!(
            "INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state, \
                 attempt_count, auto_attempts, next_attempt_at, created_at, updated_at, replayed) \
             SELECT uuid_v7_sharing_time(event_id), '{}', event_id, event, incident_id, \
                 'pending', 0, 0, now(), now(), now(), true \
             FROM deliveries WHERE id = '{id}'",
            late.id
        ),
    )
    .await;
    execute(&mut racer, "COMMIT".to_owned()).await;

    let pruned = pruning.await.unwrap();
    assert_eq!(
        pruned.days,
        partitions::Expired {
            dropped: 0,
            emptied: 1,
            kept: 1
        }
    );
    let kept = format!("deliveries WHERE webhook_id = '{}'", late.id);
    assert_eq!(db.count(&kept).await, 1, "the late delivery is kept");
    assert_eq!(db.count("deliveries").await, 1);
}

/// A day left without some of its partitions (a drop partition by partition, by an earlier
/// version, cut short) loses the rest in the next pass.
#[tokio::test]
async fn what_is_left_of_a_day_dropped_in_part_goes() {
    use tocsin_storage::partitions;

    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let today = OffsetDateTime::now_utc().date();
    let day = format!(
        "{:04}{:02}{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    execute(&mut conn, format!("DROP TABLE attempts_{day}")).await;
    let end_of_today = (today + time::Duration::DAY).midnight().assume_utc();
    let expired = partitions::expire(&mut conn, end_of_today).await.unwrap();
    assert_eq!(
        expired,
        partitions::Expired {
            dropped: 1,
            emptied: 0,
            kept: 0
        }
    );
    for table in ["events", "deliveries", "attempts"] {
        assert_eq!(
            db.count(&format!("pg_class WHERE relname = '{table}_{day}'"))
                .await,
            0,
            "{table}_{day} is dropped"
        );
    }
}

/// Retention waiting for its lock holds the services' statements behind it for at most its lock
/// timeout, however long the transaction it waits for lasts (a backup's, say): each time it finds
/// the delivery log's lock still held, it gives up and tries again a second later (for its
/// first ten tries, and this test needs three). A statement
/// arriving while it waits, itself allowed to wait 250 ms (five times that timeout), is never
/// cancelled; at the earlier timeout of 500 ms, it was.
#[tokio::test]
async fn retention_waiting_for_a_lock_holds_statements_up_for_at_most_its_lock_timeout() {
    use diesel_async::SimpleAsyncConnection;
    use tocsin_storage::partitions;

    let db = TestDb::new().await;
    // A long transaction that read the delivery log and keeps its lock.
    let (mut holder, pruning, _) = prune_today_beside_a_reader(&db, "held").await;
    let mut service = AsyncPgConnection::establish(&db.url).await.unwrap();
    // What a service's statement may be held up by retention: 250 ms, five lock timeouts.
    let allowed = std::time::Duration::from_millis(250);
    assert!(partitions::LOCK_TIMEOUT * 5 <= allowed);
    service
        .batch_execute(&format!("SET lock_timeout = '{}ms'", allowed.as_millis()))
        .await
        .unwrap();
    // Three of retention's tries, each met by a statement on a table it has locked (the
    // statement returns once that try has given up).
    for _ in 0..3 {
        wait_for_retention_to_wait(&db).await;
        if let Err(error) = service.batch_execute("SELECT 1 FROM events").await {
            panic!("a statement waited behind retention beyond {allowed:?}: {error}");
        }
    }
    execute(&mut holder, "COMMIT".to_owned()).await;
    let pruned = pruning.await.unwrap();
    assert_eq!(
        pruned.days,
        partitions::Expired {
            dropped: 1,
            emptied: 0,
            kept: 0
        }
    );
    assert_eq!(db.count("deliveries").await, 0);
}

/// Makes one delivery of today, succeeded and its event published, opens a transaction that
/// reads the delivery log and keeps it open, and starts retention of today beside it: returns
/// that transaction's connection, the retention pass and the delivery.
async fn prune_today_beside_a_reader(
    db: &TestDb,
    name: &str,
) -> (
    AsyncPgConnection,
    tokio::task::JoinHandle<tocsin_storage::retention::Pruned>,
    uuid::Uuid,
) {
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, name).await;
    let id = delivery_to(&mut conn, name, webhook.id).await;
    record_attempt(&mut conn, id, answered(200)).await;
    execute(
        &mut conn,
        format!("UPDATE deliveries SET state = 'succeeded' WHERE id = '{id}'"),
    )
    .await;
    execute(
        &mut conn,
        "UPDATE outbox SET published_at = now() - interval '2 days'".to_owned(),
    )
    .await;
    let mut reader = AsyncPgConnection::establish(&db.url).await.unwrap();
    execute(&mut reader, "BEGIN".to_owned()).await;
    execute(&mut reader, "SELECT 1 FROM ONLY deliveries".to_owned()).await;
    let now = OffsetDateTime::now_utc();
    let end_of_today = (now.date() + time::Duration::DAY).midnight().assume_utc();
    let url = db.url.clone();
    let pruning = tokio::spawn(async move {
        let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
        tocsin_storage::retention::prune(&mut conn, end_of_today, now - time::Duration::DAY)
            .await
            .unwrap()
    });
    (reader, pruning, id)
}

/// Waits until retention waits for the delivery log's lock.
async fn wait_for_retention_to_wait(db: &TestDb) {
    tocsin_testkit::wait_until(
        "retention waiting for the delivery log's lock",
        std::time::Duration::from_secs(30),
        || async {
            db.count("pg_locks WHERE NOT granted AND relation = 'deliveries'::regclass")
                .await
                >= 1
        },
    )
    .await;
}
