//! The sweeper's queries: `claim_overdue` takes overdue deliveries with no attempt under way,
//! and `interrupted` finds the attempts whose dispatcher stopped before recording them.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_domain::delivery::Trigger;
use tocsin_domain::EventKind;
use tocsin_storage::attempts::ClaimRules;
use tocsin_storage::deliveries::{self, DeliveryState, Due};
use tocsin_testkit::deliveries::{answered, claim_rules, mark_failed, record_attempt};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{
    assert_between, claim, claim_auto, claim_manual, complete, completion, deliveries_of,
    delivery_to, end_lease, fan_out, open, webhook, webhook_for_every_event,
};

/// `claim_overdue` takes pending and retrying deliveries overdue by more than the grace with no
/// attempt under way (oldest first, at most the limit), and makes each due now, so that the
/// next pass does not take it again; it leaves waiting, finished, leased and not yet overdue
/// deliveries alone.
#[tokio::test]
async fn the_sweeper_claims_only_overdue_deliveries_with_no_attempt_under_way_once_per_grace() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "swept").await;
    let overdue_pending = delivery_to(&mut conn, "overdue pending", webhook.id).await;
    set_due(&mut conn, overdue_pending, "now() - interval '10 minutes'").await;
    let overdue_retrying = delivery_to(&mut conn, "overdue retrying", webhook.id).await;
    record_attempt(&mut conn, overdue_retrying, answered(500)).await;
    set_due(&mut conn, overdue_retrying, "now() - interval '5 minutes'").await;
    let recent = delivery_to(&mut conn, "recent", webhook.id).await;
    set_due(&mut conn, recent, "now() - interval '30 seconds'").await;
    let event = open(&mut conn, "waiting").await;
    fan_out(&mut conn, &event, &[webhook.id]).await;
    let waiting = deliveries_of(&mut conn, webhook.id)
        .await
        .into_iter()
        .find(|d| d.state == DeliveryState::Waiting)
        .unwrap()
        .id;
    set_due(&mut conn, waiting, "now() - interval '10 minutes'").await;
    let leased = delivery_to(&mut conn, "leased", webhook.id).await;
    claim_auto(&mut conn, leased, 0).await.unwrap();
    end_lease(&mut conn, leased, "10 minutes").await;
    let failed = delivery_to(&mut conn, "failed", webhook.id).await;
    mark_failed(&mut conn, failed).await;
    set_due(&mut conn, failed, "now() - interval '10 minutes'").await;

    let grace = Duration::from_secs(120);
    let before = OffsetDateTime::now_utc();
    let first = deliveries::claim_overdue(&mut conn, grace, 1)
        .await
        .unwrap();
    assert_eq!(
        first,
        [Due {
            delivery_id: overdue_pending,
            webhook_id: webhook.id,
            auto_attempts: 0
        }],
        "the oldest, within the limit"
    );
    let rest = deliveries::claim_overdue(&mut conn, grace, 10)
        .await
        .unwrap();
    assert_eq!(
        rest,
        [Due {
            delivery_id: overdue_retrying,
            webhook_id: webhook.id,
            auto_attempts: 1
        }]
    );
    assert!(
        deliveries::claim_overdue(&mut conn, grace, 10)
            .await
            .unwrap()
            .is_empty(),
        "taken once per grace"
    );
    for id in [overdue_pending, overdue_retrying] {
        let due_at = deliveries::get(&mut conn, id)
            .await
            .unwrap()
            .next_attempt_at
            .unwrap();
        assert_between(due_at, before, OffsetDateTime::now_utc(), "made due now");
    }
    let on_time = ClaimRules {
        early: Duration::ZERO,
        ..claim_rules()
    };
    assert!(
        claim(&mut conn, overdue_retrying, Trigger::Automatic, 1, on_time)
            .await
            .is_some(),
        "and claimed as due"
    );
}

/// `interrupted` finds the attempts whose dispatcher stopped before recording them: an automatic
/// one once its lease ended more than the grace ago, a manual one started more than
/// `manual_after` ago; never one recorded, oldest first, at most the limit.
#[tokio::test]
async fn interrupted_finds_attempts_whose_dispatcher_stopped() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook(&mut conn, "stopped", &EventKind::ALL, 3).await;
    let mut ids = std::collections::HashMap::new();
    for key in [
        "lease long over",
        "lease just over",
        "lease running",
        "manual old",
        "manual new",
        "recorded",
    ] {
        ids.insert(key, delivery_to(&mut conn, key, webhook.id).await);
    }
    for key in ["lease long over", "lease just over", "lease running"] {
        claim_auto(&mut conn, ids[key], 0).await.unwrap();
    }
    end_lease(&mut conn, ids["lease long over"], "10 minutes").await;
    end_lease(&mut conn, ids["lease just over"], "1 minute").await;
    for key in ["manual old", "manual new"] {
        claim_manual(&mut conn, ids[key]).await.unwrap();
    }
    let recorded = claim_auto(&mut conn, ids["recorded"], 0).await.unwrap();
    complete(&mut conn, completion(&recorded, answered(500)))
        .await
        .unwrap();
    for key in ["manual old", "recorded"] {
        diesel::sql_query(format!(
            "UPDATE attempts SET started_at = now() - interval '20 minutes' \
             WHERE delivery_id = '{}'",
            ids[key]
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    end_lease(&mut conn, ids["recorded"], "10 minutes").await;

    let grace = Duration::from_secs(120);
    let manual_after = Duration::from_secs(300);
    let found = deliveries::interrupted(&mut conn, grace, manual_after, 10)
        .await
        .unwrap();
    let summary: Vec<(Uuid, Uuid, i32, Trigger, i32, u8)> = found
        .iter()
        .map(|u| {
            (
                u.delivery_id,
                u.webhook_id,
                u.number,
                u.trigger(),
                u.auto_attempts,
                u.max_attempts(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (ids["manual old"], webhook.id, 1, Trigger::Manual, 0, 3),
            (
                ids["lease long over"],
                webhook.id,
                1,
                Trigger::Automatic,
                1,
                3
            ),
        ]
    );
    let oldest = deliveries::interrupted(&mut conn, grace, manual_after, 1)
        .await
        .unwrap();
    assert_eq!(oldest.len(), 1);
    assert_eq!(oldest[0].delivery_id, ids["manual old"]);
}

async fn set_due(conn: &mut AsyncPgConnection, id: Uuid, at: &str) {
    diesel::sql_query(format!(
        "UPDATE deliveries SET next_attempt_at = {at} WHERE id = '{id}'"
    ))
    .execute(conn)
    .await
    .unwrap();
}
