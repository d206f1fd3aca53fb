//! Concurrency: claims raced on separate connections, released together from one row lock, and
//! claims and completions gathered in one batch as the dispatcher's batchers send them.

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use tocsin_domain::delivery::Trigger;
use tocsin_storage::attempts::{self, Claim, Job};
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_testkit::deliveries::{answered, claim_rules};
use tocsin_testkit::{wait_until, TestDb};
use uuid::Uuid;

use crate::common::{
    attempt_rows, claim_manual, completion, delivery_to, request_manual, webhook_for_every_event,
    DEADLINE,
};

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
            auto_attempts: 0,
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
            auto_attempts: 0,
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
        auto_attempts: expected,
    };
    let manual = |id: Uuid| Claim {
        delivery_id: id,
        trigger: Trigger::Manual,
        auto_attempts: 0,
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
