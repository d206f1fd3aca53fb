//! Retention (`retention::prune`): which old rows go (finished deliveries with their attempts,
//! events no delivery refers to once their outbox row was published, published outbox rows) and
//! which stay.

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_storage::deliveries;
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;

use crate::common::{delivery_to, open, webhook_for_every_event};

/// Retention removes old finished deliveries (with their attempts), old events no delivery refers
/// to unless their outbox row still waits for the relay, and old published outbox rows.
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
