//! The SQL guards held to the domain's table of the delivery's rules
//! (`tocsin_domain::delivery::rules`): every act the statements carry out is run on a delivery
//! in every standing, on the real database, with the act's other conditions granted, and what
//! it did (admitted or not, the state and the lease after) must be the table's cell. A guard
//! that disagrees with the table, or a cell that disagrees with a guard, fails here.
//!
//! An operator's request for a manual attempt is not a statement's guard: admin asks the table
//! itself (`rules::allows_in_state`).

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_domain::delivery::rules::{self, Act, Cell, Lease, Standing};
use tocsin_storage::attempts::{self, AttemptResult, Claim, Completion};
use tocsin_storage::deliveries::{self, DeliveryState, Due, Transition, Trigger, WaitReason};
use tocsin_testkit::deliveries::claim_rules;
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::{delivery_to, execute, webhook_for_every_event};

/// A delivery made to stand as `standing`, with `act`'s other conditions granted.
struct Subject {
    webhook_id: Uuid,
    delivery_id: Uuid,
    auto_attempts: i32,
    /// The number of the automatic attempt without an outcome, when one is under way.
    open_automatic: Option<i32>,
    /// The number of the manual attempt without an outcome, for a manual attempt's outcome.
    open_manual: Option<i32>,
}

async fn subject(conn: &mut AsyncPgConnection, standing: Standing, act: Act, n: usize) -> Subject {
    let webhook = webhook_for_every_event(conn, &format!("rules-{n}")).await;
    let id = delivery_to(conn, &format!("rules-{n}"), webhook.id).await;
    let auto_attempts = i32::from(standing.attempted);
    let mut attempts = 0;
    let mut open_automatic = None;
    if standing.attempted {
        attempts += 1;
        // The automatic attempt: under way (no outcome yet) or failed.
        let success = if standing.under_way { "NULL" } else { "false" };
        let error = if standing.under_way {
            "NULL"
        } else {
            "'connect'"
        };
        execute(
            conn,
            format!(
                "INSERT INTO attempts (delivery_id, number, trigger, started_at, request_headers, \
                 success, error) VALUES ('{id}', 1, 'automatic', now(), '{{}}', {success}, {error})"
            ),
        )
        .await;
        open_automatic = standing.under_way.then_some(1);
    }
    let mut open_manual = None;
    if matches!(act, Act::SucceedManual | Act::Keep) {
        attempts += 1;
        execute(
            conn,
            format!(
                "INSERT INTO attempts (delivery_id, number, trigger, started_at, request_headers) \
                 VALUES ('{id}', {attempts}, 'manual', now(), '{{}}')"
            ),
        )
        .await;
        open_manual = Some(attempts);
    }
    let wait_reason = match (standing.state, act) {
        (DeliveryState::Waiting, Act::Recover) => "'webhook_disabled'",
        (DeliveryState::Waiting, _) => "'webhook_busy'",
        _ => "NULL",
    };
    // A lease that holds, or (for the sweeper) one that ended an hour ago.
    let lease = match (standing.under_way, act) {
        (false, _) => "NULL",
        (true, Act::Sweep) => "now() - interval '1 hour'",
        (true, _) => "now() + interval '1 hour'",
    };
    let next_attempt_at = if standing.state.is_finished() {
        "NULL"
    } else {
        "now() - interval '1 second'"
    };
    execute(
        conn,
        format!(
            "UPDATE deliveries SET state = '{state}', wait_reason = {wait_reason}, \
             auto_attempts = {auto_attempts}, attempt_count = {attempts}, \
             attempting_until = {lease}, next_attempt_at = {next_attempt_at}, \
             manual_requested = {manual} WHERE id = '{id}'",
            state = standing.state,
            manual = act == Act::ClaimManual,
        ),
    )
    .await;
    if act == Act::Stop {
        // The condition that allows no more automatic attempt: the webhook is deleted.
        execute(
            conn,
            format!(
                "UPDATE webhooks SET deleted_at = now() WHERE id = '{}'",
                webhook.id
            ),
        )
        .await;
    }
    Subject {
        webhook_id: webhook.id,
        delivery_id: id,
        auto_attempts,
        open_automatic,
        open_manual,
    }
}

fn result(success: bool) -> AttemptResult {
    AttemptResult {
        success,
        status_code: Some(if success { 204 } else { 500 }),
        duration_ms: 5,
        error: (!success).then_some(deliveries::AttemptError::HttpStatus),
        error_detail: None,
        request_headers: serde_json::json!({}),
        response_body: None,
        response_truncated: false,
    }
}

/// Runs `act` on the subject through the statement that carries it out; whether it was
/// admitted.
async fn run(conn: &mut AsyncPgConnection, act: Act, s: &Subject) -> bool {
    let due = Due {
        delivery_id: s.delivery_id,
        webhook_id: s.webhook_id,
        auto_attempts: s.auto_attempts,
    };
    let claim = |trigger| Claim {
        delivery_id: s.delivery_id,
        trigger,
        auto_attempts: s.auto_attempts,
    };
    // The outcome of the open automatic attempt (of a number no attempt has, when none is).
    let automatic = |success, transition| Completion {
        delivery_id: s.delivery_id,
        number: s.open_automatic.unwrap_or(99),
        auto_attempts: Some(s.auto_attempts),
        result: result(success),
        transition,
    };
    let manual = |success, transition| Completion {
        delivery_id: s.delivery_id,
        number: s.open_manual.expect("a manual attempt"),
        auto_attempts: None,
        result: result(success),
        transition,
    };
    let moved = |completed: Option<attempts::Completed>| completed.is_some_and(|c| c.moved);
    let retry = Transition::Retry {
        delay: Duration::from_secs(60),
    };
    match act {
        Act::ClaimAutomatic => {
            let claims = [claim(Trigger::Automatic)];
            attempts::claim(conn, &claims, claim_rules()).await.unwrap()[0].is_some()
        }
        Act::ClaimManual => {
            let claims = [claim(Trigger::Manual)];
            attempts::claim(conn, &claims, claim_rules()).await.unwrap()[0].is_some()
        }
        Act::Succeed | Act::Retry | Act::Fail => {
            let completion = match act {
                Act::Succeed => automatic(true, Transition::Succeed),
                Act::Retry => automatic(false, retry),
                _ => automatic(false, Transition::Fail),
            };
            moved(attempts::complete(conn, &[completion]).await.unwrap()[0])
        }
        Act::SucceedManual => {
            let completion = manual(true, Transition::Succeed);
            moved(attempts::complete(conn, &[completion]).await.unwrap()[0])
        }
        Act::Keep => {
            let completion = manual(false, Transition::Keep);
            attempts::complete(conn, &[completion]).await.unwrap()[0].is_some()
        }
        Act::Wait => deliveries::wait(conn, &[due], WaitReason::WebhookBusy)
            .await
            .unwrap()[0],
        Act::Release => deliveries::take_waiting(conn, &[], 100, 1000)
            .await
            .unwrap()
            .iter()
            .any(|taken| taken.delivery_id == s.delivery_id),
        Act::Sweep => deliveries::interrupted(
            conn,
            Duration::from_secs(60),
            Duration::from_secs(3600),
            1000,
        )
        .await
        .unwrap()
        .iter()
        .any(|found| found.delivery_id == s.delivery_id),
        Act::Stop => deliveries::stop(conn, &[s.delivery_id], 5)
            .await
            .unwrap()
            .contains(&s.delivery_id),
        Act::Recover => {
            let since = OffsetDateTime::now_utc() - time::Duration::days(1);
            deliveries::recover_disabled(conn, s.webhook_id, since, 100)
                .await
                .unwrap()
                .iter()
                .any(|recovered| recovered.delivery_id == s.delivery_id)
        }
        Act::RequestManual => unreachable!("not a statement's guard"),
    }
}

#[derive(diesel::QueryableByName)]
struct After {
    #[diesel(sql_type = diesel::sql_types::Text)]
    state: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    under_way: bool,
}

#[tokio::test]
async fn every_guard_does_what_the_rules_table_says() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let mut disagreements = Vec::new();
    let mut n = 0;
    for act in rules::Act::ALL {
        if act == Act::RequestManual {
            continue;
        }
        for standing in Standing::ALL {
            n += 1;
            // Each pair has a webhook of its own, so that no pair sees another's delivery.
            let subject = subject(&mut conn, standing, act, n).await;
            let admitted = run(&mut conn, act, &subject).await;
            let after: After = diesel::sql_query(format!(
                "SELECT state, attempting_until IS NOT NULL AS under_way \
                 FROM deliveries WHERE id = '{}'",
                subject.delivery_id
            ))
            .get_result(&mut conn)
            .await
            .unwrap();
            let expected = match rules::cell(act, standing) {
                Cell::Refused => (false, standing.state, standing.under_way),
                Cell::Admits => (true, standing.state, standing.under_way),
                Cell::Moves(state, lease) => (
                    true,
                    state,
                    match lease {
                        Lease::Taken => true,
                        Lease::Ended => false,
                        Lease::Kept => standing.under_way,
                    },
                ),
            };
            let got = (admitted, after.state.parse().unwrap(), after.under_way);
            if got != expected {
                disagreements.push(format!(
                    "{} × {}: the table says {:?}, the statement did {got:?} (admitted, state, under way)",
                    act.label(),
                    standing.label(),
                    expected,
                ));
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} pairs disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}
