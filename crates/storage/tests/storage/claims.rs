//! Claims: every attempt is logged before its request is sent, and only where the guard allows
//! (the expected count, `max_attempts` and the schedule, the lease, the webhook, the due time);
//! a manual attempt is claimed beside the automatic schedule and leaves it alone.

use std::time::Duration;

use time::OffsetDateTime;
use tocsin_domain::delivery::Trigger;
use tocsin_storage::attempts::ClaimRules;
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_storage::webhooks::{self, Webhook, WebhookChanges};
use tocsin_testkit::deliveries::{answered, claim_rules, mark_failed, record_attempt};
use tocsin_testkit::TestDb;

use crate::common::{
    assert_between, attempt_rows, claim, claim_auto, claim_manual, complete, completion,
    delivery_to, disable, fan_out, lease, open, set_max_attempts, webhook_for_every_event,
};

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
    assert_eq!(job.delivery.attempting_until, Some(lease));
    assert_eq!(
        job.delivery.next_attempt_at, None,
        "none is due while one is under way"
    );
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
