//! Waiting for room: `take_waiting` hands out waiting deliveries within each webhook's room,
//! `wait` moves only deliveries as the caller saw them, a claim takes a waiting delivery back to
//! `pending` or `retrying`; a deleted webhook's waiting deliveries are taken to fail, a disabled
//! one's wait.

use std::collections::HashSet;

use diesel_async::SimpleAsyncConnection;
use time::OffsetDateTime;
use tocsin_domain::delivery::WaitReason;
use tocsin_storage::deliveries::{self, Delivery, DeliveryState, Due};
use tocsin_storage::webhooks::Webhook;
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{
    claim_auto, deliveries_of, delivery_to, fan_out, open, webhook_for_every_event,
};

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
