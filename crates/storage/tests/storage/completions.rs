//! Completions: an attempt's outcome moves its delivery (succeeded, retrying after the schedule's
//! delay, failed after the last automatic attempt); a succeeded delivery is never moved back, and
//! an attempt the sweeper recorded as interrupted is not recorded again.

use std::time::Duration;

use time::OffsetDateTime;
use tocsin_domain::delivery::Transition;
use tocsin_domain::{EventKind, RetrySchedule};
use tocsin_storage::attempts::{AttemptResult, Completed, Completion};
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_testkit::deliveries::{answered, record_attempt};
use tocsin_testkit::TestDb;

use crate::common::{
    assert_between, claim_auto, claim_manual, complete, completion, delivery_to, end_lease, lease,
    webhook, webhook_for_every_event,
};

#[tokio::test]
async fn a_successful_attempt_succeeds_the_delivery() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "ok").await;
    let id = delivery_to(&mut conn, "ok", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.unwrap();
    let done = completion(&job, answered(204));
    assert_eq!(done.transition, Transition::Succeed);
    let completed = complete(&mut conn, done).await.unwrap();
    assert_eq!(
        completed,
        Completed {
            moved: true,
            state: Some(DeliveryState::Succeeded),
            next_attempt_at: None
        }
    );
    let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
    assert_eq!(detail.delivery.state, DeliveryState::Succeeded);
    assert_eq!(detail.delivery.next_attempt_at, None);
    assert_eq!(lease(&mut conn, id).await, None);
    let attempt = &detail.attempts[0];
    assert_eq!(
        (
            attempt.success,
            attempt.status_code,
            attempt.duration_ms,
            attempt.error.as_deref(),
            attempt.response_body.as_deref()
        ),
        (Some(true), Some(204), Some(42), None, Some("ok"))
    );
    assert_eq!(attempt.request_headers["content-type"], "application/json");
}

/// Once succeeded, a delivery stays succeeded: neither the failure nor the success of the
/// automatic attempt that was under way beside the manual one that succeeded it moves it back,
/// though both are logged.
#[tokio::test]
async fn a_succeeded_delivery_is_never_moved_back() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "final").await;
    for (key, late_status) in [("late failure", 500), ("late success", 200)] {
        let id = delivery_to(&mut conn, key, webhook.id).await;
        let automatic = claim_auto(&mut conn, id, 0).await.unwrap();
        let manual = claim_manual(&mut conn, id).await.unwrap();
        let succeeded = complete(&mut conn, completion(&manual, answered(200)))
            .await
            .unwrap();
        assert_eq!(
            (succeeded.moved, succeeded.state),
            (true, Some(DeliveryState::Succeeded))
        );
        let late = complete(&mut conn, completion(&automatic, answered(late_status)))
            .await
            .expect("the late attempt is logged");
        assert!(!late.moved, "{key}");
        assert_eq!(late.state, Some(DeliveryState::Succeeded), "{key}");
        let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
        assert_eq!(detail.delivery.state, DeliveryState::Succeeded);
        assert_eq!(detail.delivery.next_attempt_at, None);
        assert_eq!(
            detail
                .attempts
                .iter()
                .map(|a| a.success)
                .collect::<Vec<_>>(),
            [Some(late_status == 200), Some(true)]
        );
        assert_eq!(lease(&mut conn, id).await, None);
    }
}

/// The sweeper records an attempt whose dispatcher stopped (its lease ended) as interrupted and
/// moves the delivery on; should that dispatcher come back with the answer, its completion finds
/// the attempt recorded and changes nothing.
#[tokio::test]
async fn an_attempt_recorded_as_interrupted_is_not_recorded_again() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "interrupted").await;
    let id = delivery_to(&mut conn, "interrupted", webhook.id).await;
    let job = claim_auto(&mut conn, id, 0).await.unwrap();
    end_lease(&mut conn, id, "10 minutes").await;
    let found = deliveries::interrupted(
        &mut conn,
        Duration::from_secs(120),
        Duration::from_secs(300),
        10,
    )
    .await
    .unwrap();
    assert_eq!(found.len(), 1);
    let sweep = Completion {
        delivery_id: found[0].delivery_id,
        number: found[0].number,
        auto_attempts: Some(found[0].auto_attempts),
        result: AttemptResult::interrupted(),
        transition: Transition::after_attempt(
            found[0].trigger(),
            found[0].auto_attempts,
            false,
            found[0].max_attempts(),
            &RetrySchedule::specification(),
        ),
    };
    let swept = complete(&mut conn, sweep.clone()).await.unwrap();
    assert_eq!(
        (swept.moved, swept.state),
        (true, Some(DeliveryState::Retrying))
    );
    assert_eq!(
        complete(&mut conn, completion(&job, answered(200))).await,
        None,
        "the dispatcher's late answer"
    );
    assert_eq!(complete(&mut conn, sweep).await, None, "a second sweep");
    let detail = deliveries::get_detail(&mut conn, id).await.unwrap();
    assert_eq!(detail.delivery.state, DeliveryState::Retrying);
    assert_eq!(detail.attempts.len(), 1);
    assert_eq!(detail.attempts[0].success, Some(false));
    assert_eq!(detail.attempts[0].error.as_deref(), Some("interrupted"));
    assert!(
        deliveries::interrupted(&mut conn, Duration::ZERO, Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A failed automatic attempt with attempts left moves the delivery to `retrying`, its next
/// attempt due after the schedule's delay, and ends the lease.
#[tokio::test]
async fn a_failed_attempt_schedules_the_next_after_its_delay() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "retry").await;
    let id = delivery_to(&mut conn, "retry", webhook.id).await;
    for (expected, delay) in [(0, 60), (1, 300)] {
        let job = claim_auto(&mut conn, id, expected).await.unwrap();
        let failed = completion(&job, answered(503));
        let delay = Duration::from_secs(delay);
        assert_eq!(failed.transition, Transition::Retry { delay });
        let before = OffsetDateTime::now_utc();
        let completed = complete(&mut conn, failed).await.unwrap();
        let after = OffsetDateTime::now_utc();
        assert_eq!(
            (completed.moved, completed.state),
            (true, Some(DeliveryState::Retrying))
        );
        let next = completed.next_attempt_at.expect("a next attempt");
        assert_between(
            next,
            before + delay,
            after + delay,
            &format!("due {delay:?} after the failure"),
        );
        let delivery = deliveries::get(&mut conn, id).await.unwrap();
        assert_eq!(delivery.next_attempt_at, Some(next));
        assert_eq!(lease(&mut conn, id).await, None);
    }
    let attempts = deliveries::get_detail(&mut conn, id)
        .await
        .unwrap()
        .attempts;
    assert_eq!(attempts.len(), 2);
    for attempt in &attempts {
        assert_eq!(attempt.success, Some(false));
        assert_eq!(attempt.status_code, Some(503));
        assert_eq!(attempt.error.as_deref(), Some("http_status"));
        assert_eq!(attempt.response_body.as_deref(), Some("upstream exploded"));
    }
}

#[tokio::test]
async fn the_last_failed_automatic_attempt_fails_the_delivery() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook(&mut conn, "two tries", &EventKind::ALL, 2).await;
    let id = delivery_to(&mut conn, "two tries", webhook.id).await;
    let first = record_attempt(&mut conn, id, answered(500)).await;
    assert_eq!(first.state, Some(DeliveryState::Retrying));
    let job = claim_auto(&mut conn, id, 1).await.unwrap();
    let last = completion(&job, answered(500));
    assert_eq!(last.transition, Transition::Fail);
    let completed = complete(&mut conn, last).await.unwrap();
    assert_eq!(
        completed,
        Completed {
            moved: true,
            state: Some(DeliveryState::Failed),
            next_attempt_at: None
        }
    );
    let delivery = deliveries::get(&mut conn, id).await.unwrap();
    assert_eq!(
        (
            delivery.state,
            delivery.auto_attempts,
            delivery.next_attempt_at
        ),
        (DeliveryState::Failed, 2, None)
    );
    assert_eq!(lease(&mut conn, id).await, None);
    assert!(claim_auto(&mut conn, id, 2).await.is_none());
}
