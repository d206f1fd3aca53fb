//! The fan-out: one delivery per enabled, undeleted webhook subscribed to an event's kind (a
//! disabled or busy webhook's waiting), the first attempts claimed in the fan-out's own
//! statement, a redelivered event's deliveries still without an attempt, and test events.

use std::time::Duration;

use time::OffsetDateTime;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::delivery::{Trigger, WaitReason};
use tocsin_domain::EventKind;
use tocsin_storage::attempts::{self, Claim};
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_storage::fan_out::{self, FanOut, FanOutRules, FannedOut};
use tocsin_storage::outbox;
use tocsin_storage::webhooks;
use tocsin_testkit::deliveries::claim_rules;
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{
    assert_between, claim_auto, deliveries_of, disable, fan_out, fan_out_request, open,
    record_test_event, signal, webhook, webhook_for_every_event, PENDING,
};

/// One delivery per enabled, undeleted webhook subscribed to the event's kind, due now and not
/// attempted; a disabled webhook's delivery is listed `waiting` (`webhook_disabled`); fanned
/// out again (a redelivered message, or the same event twice in a batch), an event creates
/// nothing more.
#[tokio::test]
async fn fan_out_delivers_to_undeleted_subscribed_webhooks_once_and_a_disabled_ones_wait() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let opened = webhook(&mut conn, "opened", &[EventKind::IncidentOpened], 5).await;
    let resolved = webhook(&mut conn, "resolved", &[EventKind::IncidentResolved], 5).await;
    let off = webhook(&mut conn, "off", &[EventKind::IncidentOpened], 5).await;
    webhooks::update(&mut conn, off.id, &disable())
        .await
        .unwrap();
    let deleted = webhook(&mut conn, "deleted", &[EventKind::IncidentOpened], 5).await;
    webhooks::delete(&mut conn, deleted.id).await.unwrap();

    let a = open(&mut conn, "a").await;
    let b = open(&mut conn, "b").await;
    // b given twice in one batch, as a dispatcher gathering concurrent messages may.
    let requests = [
        fan_out_request(&a, false),
        fan_out_request(&b, false),
        fan_out_request(&b, false),
    ];
    let before = OffsetDateTime::now_utc();
    let fanned = fan_out::fan_out(&mut conn, &requests, &[], PENDING)
        .await
        .unwrap();
    assert_eq!(fanned.len(), 3, "an answer per request");
    for (n, event) in [(0, &a), (1, &b)] {
        assert_eq!(fanned[n].waiting, 0);
        assert_eq!(fanned[n].disabled, 1, "`off` gets its delivery, waiting");
        assert_eq!(
            fanned[n].pending.len(),
            1,
            "only `opened` gets {:?}",
            event.kind
        );
        let due = fanned[n].pending[0];
        assert_eq!((due.webhook_id, due.auto_attempts), (opened.id, 0));
        let delivery = deliveries::get(&mut conn, due.delivery_id).await.unwrap();
        assert_eq!(
            (
                delivery.event_id,
                delivery.event,
                delivery.incident_id,
                delivery.state,
                delivery.wait_reason,
                delivery.attempt_count,
                delivery.auto_attempts,
            ),
            (
                event.id,
                event.kind,
                event.incident_id,
                DeliveryState::Pending,
                None,
                0,
                0
            )
        );
        let due_at = delivery.next_attempt_at.unwrap();
        assert_between(due_at, before, OffsetDateTime::now_utc(), "due now");
    }
    assert!(nothing(&fanned[2]), "the second copy creates none");
    assert_eq!(db.count("deliveries").await, 4);

    let again = fan_out::fan_out(&mut conn, &requests[..2], &[], PENDING)
        .await
        .unwrap();
    assert!(again.iter().all(nothing), "idempotent");
    assert_eq!(db.count("deliveries").await, 4);

    // An event nobody subscribes to makes no delivery; resolving makes one to `resolved`.
    let resolution = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("a", AlertAction::Resolve)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap()[0]
        .events
        .clone();
    let requests: Vec<FanOut> = resolution
        .iter()
        .map(|e| fan_out_request(e, false))
        .collect();
    let fanned = fan_out::fan_out(&mut conn, &requests, &[], PENDING)
        .await
        .unwrap();
    assert!(nothing(&fanned[0]), "status_changed: nobody");
    assert_eq!(fanned[1].pending.len(), 1);
    assert_eq!(fanned[1].pending[0].webhook_id, resolved.id);
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE webhook_id = '{}' AND state = 'waiting'
             AND wait_reason = 'webhook_disabled' AND attempt_count = 0",
            off.id
        ))
        .await,
        2
    );
    assert_eq!(
        db.count(&format!("deliveries WHERE webhook_id = '{}'", deleted.id))
            .await,
        0
    );
}

/// With claims asked for (as a dispatcher fans out), each delivery not `waiting` starts with
/// its first attempt claimed in the fan-out's own statement: counted, leased, logged with no
/// outcome yet, and handed back ready to make. A busy webhook's delivery starts `waiting`. A
/// redelivered event claims nothing twice.
#[tokio::test]
async fn a_fan_out_claims_the_first_attempts_of_the_deliveries_it_creates() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let free = webhook(&mut conn, "free", &[EventKind::IncidentOpened], 5).await;
    let busy = webhook(&mut conn, "busy", &[EventKind::IncidentOpened], 5).await;
    let event = open(&mut conn, "claimed").await;
    let rules = FanOutRules {
        claim: true,
        lease_margin: Duration::from_secs(5),
        replay_to: None,
    };
    let fanned = fan_out::fan_out(
        &mut conn,
        &[fan_out_request(&event, false)],
        &[(busy.id, 0)],
        rules,
    )
    .await
    .unwrap()
    .pop()
    .unwrap();
    assert_eq!(fanned.waiting, 1);
    assert!(fanned.pending.is_empty());
    assert_eq!(fanned.claimed.len(), 1);
    let job = &fanned.claimed[0];
    assert_eq!(
        (
            job.webhook.id,
            job.number,
            job.trigger,
            job.delivery.auto_attempts,
            job.delivery.attempt_count,
            job.delivery.state,
        ),
        (free.id, 1, Trigger::Automatic, 1, 1, DeliveryState::Pending)
    );
    assert_eq!(job.body, event.body);
    let attempts = deliveries::get_detail(&mut conn, job.delivery.id)
        .await
        .unwrap()
        .attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!((attempts[0].number, attempts[0].success), (1, None));
    assert_eq!(
        db.count(&format!(
            "deliveries WHERE id = '{}' AND attempting_until > now()",
            job.delivery.id
        ))
        .await,
        1,
        "leased"
    );
    let claim = Claim {
        delivery_id: job.delivery.id,
        trigger: Trigger::Automatic,
        auto_attempts: 0,
    };
    let again = attempts::claim(&mut conn, &[claim], claim_rules())
        .await
        .unwrap();
    assert!(again[0].is_none(), "the first attempt is claimed once");
    let refanned = fan_out::fan_out(&mut conn, &[fan_out_request(&event, true)], &[], rules)
        .await
        .unwrap();
    assert!(refanned.iter().all(nothing), "nothing claimed twice");
    assert_eq!(db.count("attempts").await, 1);
}

/// A delivery to a webhook the fanning dispatcher has no room for starts `waiting`, with its
/// reason, and is not handed back for an attempt.
#[tokio::test]
async fn fan_out_starts_deliveries_to_busy_webhooks_waiting() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let free = webhook_for_every_event(&mut conn, "free").await;
    let busy = webhook_for_every_event(&mut conn, "busy").await;
    let event = open(&mut conn, "busy").await;
    let fanned = fan_out(&mut conn, &event, &[busy.id, Uuid::now_v7()]).await;
    assert_eq!(fanned.waiting, 1);
    assert_eq!(fanned.pending.len(), 1);
    assert_eq!(fanned.pending[0].webhook_id, free.id);
    let waiting = deliveries_of(&mut conn, busy.id).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].state, DeliveryState::Waiting);
    assert_eq!(waiting[0].wait_reason, Some(WaitReason::WebhookBusy));
    assert_eq!(waiting[0].attempt_count, 0);
    let pending = deliveries::get(&mut conn, fanned.pending[0].delivery_id)
        .await
        .unwrap();
    assert_eq!(pending.state, DeliveryState::Pending);
    assert_eq!(pending.wait_reason, None);
}

/// The broker redelivers an event whose dispatcher stopped after the fan-out: the deliveries
/// still pending with no attempt are handed back (a fresh copy of the message, not marked
/// redelivered, gets nothing); one attempted meanwhile or waiting is not.
#[tokio::test]
async fn a_redelivered_event_returns_its_deliveries_still_without_an_attempt() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let attempted = webhook_for_every_event(&mut conn, "attempted").await;
    let untouched = webhook_for_every_event(&mut conn, "untouched").await;
    let busy = webhook_for_every_event(&mut conn, "busy").await;
    let event = open(&mut conn, "redelivered").await;
    let first = fan_out(&mut conn, &event, &[busy.id]).await;
    assert_eq!(first.pending.len(), 2);
    assert_eq!(first.waiting, 1);
    let to_attempted = first
        .pending
        .iter()
        .find(|d| d.webhook_id == attempted.id)
        .unwrap();
    claim_auto(&mut conn, to_attempted.delivery_id, 0)
        .await
        .expect("the first attempt is claimed");

    let again = fan_out::fan_out(&mut conn, &[fan_out_request(&event, true)], &[], PENDING)
        .await
        .unwrap();
    let untouched_due = *first
        .pending
        .iter()
        .find(|d| d.webhook_id == untouched.id)
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].pending, [untouched_due]);
    assert!(again[0].claimed.is_empty());
    assert_eq!(again[0].waiting, 0);
    let fresh = fan_out::fan_out(&mut conn, &[fan_out_request(&event, false)], &[], PENDING)
        .await
        .unwrap();
    assert!(fresh.iter().all(nothing));
    assert_eq!(db.count("deliveries").await, 3);
}

/// A test event goes to its one webhook (whatever that one subscribes to), never to the others
/// subscribed to its kind; a test event for a deleted webhook goes nowhere.
#[tokio::test]
async fn a_test_event_reaches_only_its_webhook() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let subscriber = webhook_for_every_event(&mut conn, "subscriber").await;
    let target = webhook(&mut conn, "target", &[EventKind::IncidentResolved], 5).await;
    let test = record_test_event(&mut conn, target.id).await;
    assert_eq!(test.kind, EventKind::IncidentOpened);
    let fanned = fan_out(&mut conn, &test, &[]).await;
    assert_eq!(fanned.waiting, 0);
    assert_eq!(fanned.pending.len(), 1);
    assert_eq!(fanned.pending[0].webhook_id, target.id);
    assert!(deliveries_of(&mut conn, subscriber.id).await.is_empty());
    let job = claim_auto(&mut conn, fanned.pending[0].delivery_id, 0)
        .await
        .unwrap();
    assert!(job.test, "the job knows it is a test");
    assert_eq!(job.body, test.body);

    let gone = webhook_for_every_event(&mut conn, "gone").await;
    let late = record_test_event(&mut conn, gone.id).await;
    webhooks::delete(&mut conn, gone.id).await.unwrap();
    assert!(nothing(&fan_out(&mut conn, &late, &[]).await));
    assert_eq!(db.count("deliveries").await, 1);
}

/// Whether a fan-out made nothing.
fn nothing(fanned: &FannedOut) -> bool {
    fanned.claimed.is_empty()
        && fanned.pending.is_empty()
        && fanned.waiting == 0
        && fanned.disabled == 0
}
