//! Deliveries made for a test through the real repository: created as a fan-out creates them,
//! attempts claimed and recorded as a dispatcher does, with no HTTP request.

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tocsin_domain::delivery::{AttemptError, Transition, Trigger};
use tocsin_domain::{EventKind, RetrySchedule};
use tocsin_storage::attempts::{self, AttemptResult, Claim, ClaimRules, Completed, Completion};
use tocsin_storage::deliveries;
use tocsin_storage::fan_out::{self, FanOut};
use uuid::Uuid;

/// Creates the delivery of a recorded event to one webhook (as the fan-out of a test event
/// does); returns its id.
pub async fn create_delivery(
    conn: &mut AsyncPgConnection,
    event_id: Uuid,
    kind: EventKind,
    incident_id: Uuid,
    webhook_id: Uuid,
) -> Uuid {
    let fanned = fan_out::fan_out(
        conn,
        &[FanOut {
            event_id,
            kind,
            incident_id,
            test_webhook_id: Some(webhook_id),
            redelivered: false,
        }],
        &[],
        fan_out::FanOutRules {
            claim: false,
            lease_margin: std::time::Duration::from_secs(5),
            replay_to: None,
        },
    )
    .await
    .expect("fan-out");
    fanned[0].pending[0].delivery_id
}

/// Claims rules with the specification's schedule and no waiting for due times.
pub fn claim_rules() -> ClaimRules {
    ClaimRules {
        schedule_attempts: RetrySchedule::specification().attempts(),
        lease_margin: std::time::Duration::from_secs(30),
        early: std::time::Duration::from_secs(24 * 3600),
    }
}

/// What a target answering `status` looks like as an attempt's result.
pub fn answered(status: u16) -> AttemptResult {
    let success = (200..300).contains(&status);
    AttemptResult {
        success,
        status_code: Some(status),
        duration_ms: 42,
        error: (!success).then_some(AttemptError::HttpStatus),
        error_detail: (!success).then(|| format!("the target answered {status}")),
        request_headers: serde_json::json!({"content-type": "application/json"}),
        response_body: Some(if success { "ok" } else { "upstream exploded" }.into()),
        response_truncated: false,
    }
}

/// Claims and records the next automatic attempt of a delivery with `result`, moving it as the
/// state machine says for the specification's schedule. Panics when the claim is refused.
pub async fn record_attempt(
    conn: &mut AsyncPgConnection,
    delivery_id: Uuid,
    result: AttemptResult,
) -> Completed {
    let delivery = deliveries::get(conn, delivery_id).await.expect("delivery");
    let job = attempts::claim(
        conn,
        &[Claim {
            delivery_id,
            trigger: Trigger::Automatic,
            auto_attempts: delivery.auto_attempts,
        }],
        claim_rules(),
    )
    .await
    .expect("claim")
    .pop()
    .flatten()
    .expect("the claim is admitted");
    let transition = Transition::after_attempt(
        Trigger::Automatic,
        job.delivery.auto_attempts,
        result.success,
        job.webhook.retry.max_attempts(),
        &RetrySchedule::specification(),
    );
    attempts::complete(
        conn,
        &[Completion {
            delivery_id,
            number: job.number,
            auto_attempts: Some(job.delivery.auto_attempts),
            result,
            transition,
        }],
    )
    .await
    .expect("complete")
    .pop()
    .flatten()
    .expect("the attempt is recorded")
}

/// Marks a delivery failed with no attempt, as if its schedule had ended (a test's shortcut).
pub async fn mark_failed(conn: &mut AsyncPgConnection, delivery_id: Uuid) {
    diesel::sql_query(
        "UPDATE deliveries SET state = 'failed', next_attempt_at = NULL, updated_at = now() \
         WHERE id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(delivery_id)
    .execute(conn)
    .await
    .expect("mark failed");
}
