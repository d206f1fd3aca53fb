//! What a webhook asks of its deliveries beyond its target, on the real database: its health
//! as dispatchers record their tallies, auto-disable, subscription filters in the fan-out, the
//! recovery of deliveries that waited while it was disabled, and the rate budget that every
//! dispatcher's claims share.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::delivery::WaitReason;
use tocsin_domain::{RateLimit, Severity, WebhookFilters};
use tocsin_storage::attempts::{self, Claim};
use tocsin_storage::deliveries::{self, DeliveryState};
use tocsin_storage::health::{self, Tally, WebhookHealth};
use tocsin_storage::webhooks::{self, WebhookChanges};
use tocsin_storage::{fan_out, outbox};
use tocsin_testkit::deliveries::claim_rules;
use tocsin_testkit::{wait_until, TestDb};
use uuid::Uuid;

use crate::common::{
    claim_auto, delivery_to, fan_out_request, open, signal, webhook_for_every_event, DEADLINE,
    PENDING,
};

async fn health_of(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> WebhookHealth {
    health::for_webhooks(conn, &[webhook_id])
        .await
        .unwrap()
        .remove(&webhook_id)
        .unwrap()
}

/// Records, as a dispatcher does once a second, that `webhook_id` answered `statuses` in order.
async fn answered_in_order(conn: &mut AsyncPgConnection, webhook_id: Uuid, statuses: &[u16]) {
    let mut tally = Tally::default();
    for status in statuses {
        let success = (200..300).contains(status);
        let error = (!success).then(|| format!("http_status: the target answered {status}"));
        tally.add(success, error, OffsetDateTime::now_utc());
    }
    health::record(conn, &[(webhook_id, tally)]).await.unwrap();
}

async fn change(conn: &mut AsyncPgConnection, id: Uuid, changes: WebhookChanges) {
    webhooks::update(conn, id, &changes).await.unwrap();
}

#[tokio::test]
async fn health_follows_the_outcomes_dispatchers_record() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "health").await;
    assert_eq!(
        health_of(&mut conn, webhook.id).await,
        WebhookHealth::default(),
        "no attempt yet"
    );

    answered_in_order(&mut conn, webhook.id, &[500, 502]).await;
    let failing = health_of(&mut conn, webhook.id).await;
    assert_eq!(failing.consecutive_failures, 2);
    assert!(failing.last_failure_at.is_some() && failing.last_success_at.is_none());
    assert_eq!(
        failing.last_error.as_deref(),
        Some("http_status: the target answered 502")
    );
    assert_eq!(failing.success_rate_1h, Some(0.0));
    // Another dispatcher's tally: failures add up.
    answered_in_order(&mut conn, webhook.id, &[503]).await;
    assert_eq!(
        health_of(&mut conn, webhook.id).await.consecutive_failures,
        3
    );

    answered_in_order(&mut conn, webhook.id, &[204]).await;
    let healthy = health_of(&mut conn, webhook.id).await;
    assert_eq!(healthy.consecutive_failures, 0);
    assert!(healthy.last_success_at.is_some());
    assert_eq!(
        healthy.last_error.as_deref(),
        Some("http_status: the target answered 503"),
        "the last error stays"
    );
    assert_eq!(healthy.success_rate_1h, Some(1.0 / 4.0));
    assert_eq!(healthy.success_rate_24h, Some(1.0 / 4.0));

    // In one tally, only the failures after its last success count.
    answered_in_order(&mut conn, webhook.id, &[500, 200, 503]).await;
    let mixed = health_of(&mut conn, webhook.id).await;
    assert_eq!(mixed.consecutive_failures, 1);
    assert_eq!(mixed.success_rate_1h, Some(2.0 / 7.0));
}

#[tokio::test]
async fn auto_disable_takes_only_webhooks_failing_for_the_whole_period() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let long = webhook_for_every_event(&mut conn, "failing for two hours").await;
    let short = webhook_for_every_event(&mut conn, "failing for ten minutes").await;
    let quiet = webhook_for_every_event(&mut conn, "one old failure").await;
    for webhook in [&long, &short, &quiet] {
        answered_in_order(&mut conn, webhook.id, &[500]).await;
    }
    // Back-date their failing times: `long` has failed from two hours ago until now; `short`
    // for ten minutes; `quiet` failed once two hours ago and has had no attempt since.
    conn.batch_execute(&format!(
        "UPDATE webhook_health SET failing_since = now() - interval '2 hours' WHERE webhook_id = '{}';
         UPDATE webhook_health SET failing_since = now() - interval '10 minutes' WHERE webhook_id = '{}';
         UPDATE webhook_health SET failing_since = now() - interval '2 hours',
             last_failure_at = now() - interval '2 hours' WHERE webhook_id = '{}';",
        long.id, short.id, quiet.id
    ))
    .await
    .unwrap();
    // An unfinished delivery of `long`, stopped with it.
    let unfinished = delivery_to(&mut conn, "unfinished", long.id).await;

    let disabled = health::auto_disable(&mut conn, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(disabled[0].webhook_id, long.id);
    let reason = &disabled[0].reason;
    assert!(
        reason.starts_with("disabled automatically: failing without a success since ")
            && reason.contains("(1 consecutive failures)")
            && reason.ends_with("last error: http_status: the target answered 500"),
        "{reason}"
    );
    let read = webhooks::get(&mut conn, long.id).await.unwrap();
    assert!(!read.enabled);
    assert_eq!(read.disabled_reason.as_ref(), Some(reason));
    assert!(read.disabled_at.is_some());
    assert_eq!(
        deliveries::get(&mut conn, unfinished).await.unwrap().state,
        DeliveryState::Failed,
        "disabled as an operator disables it"
    );
    for other in [&short, &quiet] {
        assert!(webhooks::get(&mut conn, other.id).await.unwrap().enabled);
    }
    assert!(health::auto_disable(&mut conn, Duration::from_secs(3600))
        .await
        .unwrap()
        .is_empty());

    // Enabled again, it starts its failing time afresh: one more failure does not disable it.
    change(
        &mut conn,
        long.id,
        WebhookChanges {
            enabled: Some(true),
            ..Default::default()
        },
    )
    .await;
    let enabled = webhooks::get(&mut conn, long.id).await.unwrap();
    assert_eq!((enabled.disabled_reason, enabled.disabled_at), (None, None));
    answered_in_order(&mut conn, long.id, &[500]).await;
    assert!(health::auto_disable(&mut conn, Duration::from_secs(3600))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn filters_choose_the_webhooks_an_event_reaches() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let filtered = |severities: Option<&[Severity]>,
                    sources: Option<&[&str]>,
                    pairs: Option<&[(&str, &str)]>| WebhookFilters {
        severities: severities.map(|s| s.iter().copied().collect()),
        sources: sources.map(|s| s.iter().map(|t| (*t).to_owned()).collect()),
        labels: pairs.map(labels),
    };
    let cases = [
        ("every event", WebhookFilters::default(), true),
        ("SEV2", filtered(Some(&[Severity::SEV2]), None, None), true),
        (
            "SEV1 only",
            filtered(Some(&[Severity::SEV1]), None, None),
            false,
        ),
        ("its format", filtered(None, Some(&["generic"]), None), true),
        ("its source", filtered(None, Some(&["test"]), None), true),
        (
            "another source",
            filtered(None, Some(&["grafana"]), None),
            false,
        ),
        (
            "its label",
            filtered(None, None, Some(&[("team", "db")])),
            true,
        ),
        (
            "its labels and severity",
            filtered(
                Some(&[Severity::SEV2, Severity::SEV3]),
                None,
                Some(&[("team", "db"), ("env", "prod")]),
            ),
            true,
        ),
        (
            "another label",
            filtered(None, None, Some(&[("team", "web")])),
            false,
        ),
        (
            "a label it lacks",
            filtered(None, None, Some(&[("team", "db"), ("region", "eu")])),
            false,
        ),
    ];
    let mut ids = Vec::new();
    for (name, filters, _) in &cases {
        let webhook = webhook_for_every_event(&mut conn, name).await;
        change(
            &mut conn,
            webhook.id,
            WebhookChanges {
                filters: Some(filters.clone()),
                ..Default::default()
            },
        )
        .await;
        ids.push(webhook.id);
    }
    // A generic alert (its format is the dedup key's namespace) from source `test`, SEV2,
    // labelled team=db and env=prod.
    let mut alert = signal("generic:filtered", AlertAction::Trigger);
    alert.labels = labels(&[("team", "db"), ("env", "prod")]);
    let outcome = tocsin_testkit::apply_signals(&mut conn, &[alert], outbox::Wake::Listeners)
        .await
        .unwrap();
    let event = outcome[0].events[0].clone();
    let incident = outcome[0].incident.clone().unwrap();
    assert_eq!(incident.labels, labels(&[("env", "prod"), ("team", "db")]));
    let fanned = fan_out::fan_out(&mut conn, &[fan_out_request(&event, false)], &[], PENDING)
        .await
        .unwrap()
        .remove(0);
    let reached: Vec<Uuid> = fanned.pending.iter().map(|d| d.webhook_id).collect();
    for ((name, _, expected), id) in cases.iter().zip(&ids) {
        assert_eq!(reached.contains(id), *expected, "{name}");
    }
    // A test event ignores filters.
    let excluded = ids[2];
    let test = crate::common::record_test_event(&mut conn, excluded).await;
    let fanned = fan_out::fan_out(&mut conn, &[fan_out_request(&test, false)], &[], PENDING)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fanned.pending.len(), 1);
    assert_eq!(fanned.pending[0].webhook_id, excluded);
}

#[tokio::test]
async fn deliveries_that_waited_while_disabled_are_recovered_since_a_time() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "disabled").await;
    change(
        &mut conn,
        webhook.id,
        WebhookChanges {
            enabled: Some(false),
            ..Default::default()
        },
    )
    .await;
    let before = open(&mut conn, "before").await;
    fan_out::fan_out(&mut conn, &[fan_out_request(&before, false)], &[], PENDING)
        .await
        .unwrap();
    let since = OffsetDateTime::now_utc();
    let after = open(&mut conn, "after").await;
    fan_out::fan_out(&mut conn, &[fan_out_request(&after, false)], &[], PENDING)
        .await
        .unwrap();
    let waiting = crate::common::deliveries_of(&mut conn, webhook.id).await;
    assert_eq!(waiting.len(), 2);
    assert!(waiting
        .iter()
        .all(|d| d.state == DeliveryState::Waiting
            && d.wait_reason == Some(WaitReason::WebhookDisabled)));
    // The waiting pass never takes them, and disabling again does not fail them.
    assert!(deliveries::take_waiting(&mut conn, &[], 10, 10)
        .await
        .unwrap()
        .is_empty());
    let stopped = deliveries::stop(
        &mut conn,
        &waiting.iter().map(|d| d.id).collect::<Vec<_>>(),
        5,
    )
    .await
    .unwrap();
    assert!(stopped.is_empty());

    change(
        &mut conn,
        webhook.id,
        WebhookChanges {
            enabled: Some(true),
            ..Default::default()
        },
    )
    .await;
    let recovered = deliveries::recover_disabled(&mut conn, webhook.id, since, 1000)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1, "only the one created since then");
    let delivery = deliveries::get(&mut conn, recovered[0].delivery_id)
        .await
        .unwrap();
    assert_eq!(delivery.event_id, after.id);
    assert_eq!(
        (delivery.state, delivery.wait_reason),
        (DeliveryState::Pending, None)
    );
    assert!(claim_auto(&mut conn, delivery.id, 0).await.is_some());
}

/// Whether a statement of this test's database waits for a row lock.
async fn waits_for_a_lock(db: &TestDb) -> bool {
    db.count("pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
        .await
        > 0
}

async fn disabled_webhook(conn: &mut AsyncPgConnection) -> webhooks::Webhook {
    let webhook = webhook_for_every_event(conn, "re-enabled").await;
    change(
        conn,
        webhook.id,
        WebhookChanges {
            enabled: Some(false),
            ..Default::default()
        },
    )
    .await;
    webhook
}

/// A fan-out that meets a disabled webhook being enabled waits for the enabling and sees it:
/// its delivery starts as an enabled webhook's, not waiting for a recovery that may have run.
#[tokio::test]
async fn a_fan_out_meeting_an_enabling_waits_for_it_and_sees_it() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = disabled_webhook(&mut conn).await;
    let event = open(&mut conn, "meets an enabling").await;
    let mut enabling = AsyncPgConnection::establish(&db.url).await.unwrap();
    enabling
        .batch_execute(&format!(
            "BEGIN; UPDATE webhooks SET enabled = true WHERE id = '{}'",
            webhook.id
        ))
        .await
        .unwrap();
    let mut fanning = AsyncPgConnection::establish(&db.url).await.unwrap();
    let request = fan_out_request(&event, false);
    let fan_out = tokio::spawn(async move {
        fan_out::fan_out(&mut fanning, &[request], &[], PENDING)
            .await
            .unwrap()
    });
    wait_until("the fan-out waits for the enabling", DEADLINE, || async {
        fan_out.is_finished() || waits_for_a_lock(&db).await
    })
    .await;
    enabling.batch_execute("COMMIT").await.unwrap();
    let fanned = fan_out.await.unwrap();
    assert_eq!((fanned[0].disabled, fanned[0].pending.len()), (0, 1));
    let delivery = &crate::common::deliveries_of(&mut conn, webhook.id).await[0];
    assert_eq!(
        (delivery.state, delivery.wait_reason),
        (DeliveryState::Pending, None)
    );
}

/// An enabling that starts while a fan-out's delivery to the disabled webhook is uncommitted
/// waits for it, so that the recovery after the enabling finds that delivery.
#[tokio::test]
async fn an_enabling_waits_for_a_fan_out_to_the_disabled_webhook() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = disabled_webhook(&mut conn).await;
    let since = OffsetDateTime::now_utc();
    let event = open(&mut conn, "before an enabling").await;
    let mut fanning = AsyncPgConnection::establish(&db.url).await.unwrap();
    fanning.batch_execute("BEGIN").await.unwrap();
    let fanned = fan_out::fan_out(
        &mut fanning,
        &[fan_out_request(&event, false)],
        &[],
        PENDING,
    )
    .await
    .unwrap();
    assert_eq!(fanned[0].disabled, 1);
    let mut enabling = AsyncPgConnection::establish(&db.url).await.unwrap();
    let id = webhook.id;
    let enable = tokio::spawn(async move {
        let changes = WebhookChanges {
            enabled: Some(true),
            ..Default::default()
        };
        change(&mut enabling, id, changes).await;
        deliveries::recover_disabled(&mut enabling, id, since, 1000)
            .await
            .unwrap()
    });
    wait_until("the enabling waits for the fan-out", DEADLINE, || async {
        enable.is_finished() || waits_for_a_lock(&db).await
    })
    .await;
    fanning.batch_execute("COMMIT").await.unwrap();
    let recovered = enable.await.unwrap();
    assert_eq!(
        recovered.len(),
        1,
        "the recovery finds the fan-out's delivery"
    );
}

/// Two dispatchers claiming at once spend one budget: a webhook limited to 2 a second gets two
/// attempts now, and the rest wait, `rate_limited`, until the budget allows more.
#[tokio::test]
async fn a_rate_limited_webhooks_claims_share_one_budget() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let mut conn = pool.get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "limited").await;
    change(
        &mut conn,
        webhook.id,
        WebhookChanges {
            rate_limit: Some(Some(RateLimit::new(2).unwrap())),
            ..Default::default()
        },
    )
    .await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(delivery_to(&mut conn, &format!("r{n}"), webhook.id).await);
    }
    let claims = |ids: &[Uuid]| -> Vec<Claim> {
        ids.iter()
            .map(|id| Claim {
                delivery_id: *id,
                trigger: tocsin_domain::delivery::Trigger::Automatic,
                auto_attempts: 0,
            })
            .collect()
    };
    let (first, second) = (claims(&ids[..3]), claims(&ids[3..]));
    let (mut a, mut b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    let before = OffsetDateTime::now_utc();
    let (one, two) = tokio::join!(
        attempts::claim(&mut a, &first, claim_rules()),
        attempts::claim(&mut b, &second, claim_rules()),
    );
    let admitted = one
        .unwrap()
        .into_iter()
        .chain(two.unwrap())
        .flatten()
        .count();
    assert_eq!(admitted, 2, "a bucket of two");
    let mut due: Vec<OffsetDateTime> = Vec::new();
    for id in &ids {
        let delivery = deliveries::get(&mut conn, *id).await.unwrap();
        if delivery.attempt_count == 0 {
            assert_eq!(
                (delivery.state, delivery.wait_reason),
                (DeliveryState::Waiting, Some(WaitReason::RateLimited))
            );
            due.push(delivery.next_attempt_at.unwrap());
        }
    }
    assert_eq!(due.len(), 4, "the others wait, none dropped");
    // Waiting ones do not hold slots of their own: each competes again when due, and none is
    // due before the bucket allows a third attempt, half a second on.
    due.sort();
    assert!(
        due[0] - before >= time::Duration::milliseconds(499),
        "{before} {due:?}"
    );
    // A manual attempt is an operator's: it spends no budget.
    crate::common::request_manual(&mut conn, &[ids[5]]).await;
    let manual = attempts::claim(
        &mut conn,
        &[Claim {
            delivery_id: ids[5],
            trigger: tocsin_domain::delivery::Trigger::Manual,
            auto_attempts: 0,
        }],
        claim_rules(),
    )
    .await
    .unwrap();
    assert!(manual[0].is_some());
}
