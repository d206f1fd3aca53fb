//! Stopping a webhook's deliveries: disabling or deleting a webhook fails its unfinished
//! deliveries (an attempt under way finishes first), and `stop` fails only the deliveries that
//! can get no further automatic attempt.

use std::collections::HashSet;

use diesel_async::AsyncPgConnection;
use tocsin_domain::delivery::WaitReason;
use tocsin_domain::RetrySchedule;
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_storage::webhooks::{self, WebhookChanges};
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{
    claim_auto, claim_manual, complete, completion, deliveries_of, delivery_to, disable, fan_out,
    lease, open, set_max_attempts, webhook_for_every_event,
};

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
