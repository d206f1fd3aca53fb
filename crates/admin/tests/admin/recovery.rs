//! Sending deliveries again: a manual retry enqueues one attempt through the outbox; a recovery
//! retries a webhook's failed deliveries since a time, a page at a time through any backlog; both
//! refuse once they meet a disabling; a replay is recorded at once, its fields checked.

use std::collections::BTreeSet;

use diesel::sql_types::Uuid as SqlUuid;
use diesel_async::RunQueryDsl;
use reqwest::StatusCode;
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_domain::EventKind;
use tocsin_testkit::wait_until;
use uuid::Uuid;

use crate::api::{
    assert_error, id_of, rfc3339, seed_delivery, seed_failed_delivery, set, set_created_at,
    TestAdmin, DEADLINE,
};

#[tokio::test]
async fn a_manual_retry_enqueues_one_attempt_through_the_outbox() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let delivery = seed_failed_delivery(&mut conn, webhook).await;

    let (status, body) = admin
        .post_empty(&format!("/api/v1/deliveries/{delivery}/retry"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["delivery_id"], delivery.to_string());
    let rows = admin.manual_retry_outbox_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, json!({"tocsin-trigger": "manual"}));
    assert_eq!(rows[0].1["delivery_id"], delivery.to_string());
    wait_until("the relay to publish the retry", DEADLINE, || async {
        admin
            .count("outbox WHERE topic = 'delivery' AND published_at IS NULL")
            .await
            == 0
    })
    .await;

    for path in [
        format!("/api/v1/deliveries/{}/retry", Uuid::now_v7()),
        "/api/v1/deliveries/not-an-id/retry".to_owned(),
    ] {
        let answer = admin.post_empty(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }
    let (status, _) = admin.delete(&format!("/api/v1/webhooks/{webhook}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let answer = admin
        .post_empty(&format!("/api/v1/deliveries/{delivery}/retry"))
        .await;
    assert_error("deleted webhook", &answer, StatusCode::CONFLICT, None);
    assert_eq!(
        admin.manual_retry_outbox_rows().await.len(),
        1,
        "nothing more"
    );
    admin.stop().await;
}

/// A recovery reads the webhook under a lock: one that meets a disabling under way waits for
/// it, sees the webhook disabled and enqueues nothing (it used to check before, and then
/// retried a disabled webhook's deliveries).
#[tokio::test]
async fn a_recovery_meeting_a_disabling_waits_for_it_and_refuses() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    seed_failed_delivery(&mut admin.conn().await, webhook).await;
    let since = rfc3339(OffsetDateTime::now_utc() - time::Duration::days(1));
    let path = format!("/api/v1/webhooks/{webhook}/recover");
    meeting_a_disabling(&admin, webhook, &path, &json!({"since": since})).await;
    admin.stop().await;
}

/// A retry takes the webhook's row lock as recover does: one that meets a disabling under way
/// waits for it and is refused (409), where it used to check "enabled" before and enqueue the
/// disabled webhook's attempt.
#[tokio::test]
async fn a_retry_meeting_a_disabling_waits_for_it_and_refuses() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let delivery = seed_failed_delivery(&mut admin.conn().await, webhook).await;
    let path = format!("/api/v1/deliveries/{delivery}/retry");
    meeting_a_disabling(&admin, webhook, &path, &json!({})).await;
    admin.stop().await;
}

/// Posts `body` to `path` while a disabling of `webhook` holds its row in an open transaction,
/// commits the disabling once the request waits for the row, and checks that the request was
/// refused (409) with nothing enqueued.
async fn meeting_a_disabling(admin: &TestAdmin, webhook: Uuid, path: &str, body: &Value) {
    let mut disabling = admin.conn().await;
    diesel::sql_query("BEGIN")
        .execute(&mut disabling)
        .await
        .unwrap();
    diesel::sql_query("UPDATE webhooks SET enabled = false WHERE id = $1")
        .bind::<SqlUuid, _>(webhook)
        .execute(&mut disabling)
        .await
        .unwrap();
    let request = admin.post(path, body);
    let commit = async {
        wait_until("the request to wait for the webhook's row", DEADLINE, || async {
            admin
                .count("pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
                .await
                == 1
        })
        .await;
        diesel::sql_query("COMMIT")
            .execute(&mut disabling)
            .await
            .unwrap();
    };
    let ((status, body), ()) = tokio::join!(request, commit);
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(admin.manual_retry_outbox_rows().await.is_empty());
}

/// Recover works through any number of failed deliveries a page at a time (1 000 per
/// transaction): 2 500 are each asked for once.
#[tokio::test]
async fn recovery_works_through_a_backlog_in_pages() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let one = seed_failed_delivery(&mut conn, webhook).await;
    // 2 499 more failed deliveries like the first, each of an event of its own.
    diesel::sql_query(format!(
        "WITH e AS (
            INSERT INTO events (id, kind, incident_id, occurred_at, body)
            SELECT uuid_v7(now()), kind, incident_id, occurred_at, body
            FROM events, generate_series(1, 2499)
            WHERE id = (SELECT event_id FROM deliveries WHERE id = '{one}')
            RETURNING id)
         INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state,
             attempt_count, auto_attempts, created_at, updated_at)
         SELECT uuid_v7_sharing_time(e.id), d.webhook_id, e.id, d.event, d.incident_id, 'failed', 1, 1,
             now(), now()
         FROM e, deliveries d WHERE d.id = '{one}'"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let since = rfc3339(OffsetDateTime::now_utc() - time::Duration::days(1));
    let (status, body) = admin
        .post(
            &format!("/api/v1/webhooks/{webhook}/recover"),
            &json!({"since": since}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, json!({"retried": 2500, "sent_waiting": 0}));
    let rows = admin.manual_retry_outbox_rows().await;
    let distinct: BTreeSet<String> = rows
        .iter()
        .map(|(_, payload)| payload.to_string())
        .collect();
    assert_eq!((rows.len(), distinct.len()), (2500, 2500));
    assert_eq!(admin.count("deliveries WHERE manual_requested").await, 2500);
    admin.stop().await;
}

#[tokio::test]
async fn bulk_recovery_retries_the_failed_deliveries_since_a_time() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let other = id_of(&admin.create_webhook("other").await);
    let mut conn = admin.conn().await;
    let mut failed = Vec::new();
    for _ in 0..3 {
        let id = seed_failed_delivery(&mut conn, webhook).await;
        failed.push(id);
    }
    let long_ago = OffsetDateTime::now_utc() - time::Duration::days(2);
    set_created_at(&mut conn, failed[0], long_ago).await;
    seed_delivery(
        &mut conn,
        webhook,
        EventKind::IncidentOpened,
        Uuid::now_v7(),
    )
    .await;
    seed_failed_delivery(&mut conn, other).await;

    let since = rfc3339(OffsetDateTime::now_utc() - time::Duration::days(1));
    let (status, body) = admin
        .post(
            &format!("/api/v1/webhooks/{webhook}/recover"),
            &json!({"since": since}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, json!({"retried": 2, "sent_waiting": 0}));
    let rows = admin.manual_retry_outbox_rows().await;
    let retried: BTreeSet<String> = rows
        .iter()
        .map(|(headers, payload)| {
            assert_eq!(headers["tocsin-trigger"], "manual");
            payload["delivery_id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        retried,
        set(&[&failed[1].to_string(), &failed[2].to_string()])
    );

    let future = rfc3339(OffsetDateTime::now_utc() + time::Duration::hours(1));
    let (status, body) = admin
        .post(
            &format!("/api/v1/webhooks/{webhook}/recover"),
            &json!({"since": future}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body, json!({"retried": 0, "sent_waiting": 0}));
    let path = format!("/api/v1/webhooks/{webhook}/recover");
    for (what, body, field) in [
        (
            "not a time",
            json!({"since": "last tuesday"}),
            Some("since"),
        ),
        ("wrong type", json!({"since": 5}), Some("since")),
        ("missing", json!({}), None),
    ] {
        let answer = admin.post(&path, &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, field);
    }
    let answer = admin
        .post(
            &format!("/api/v1/webhooks/{}/recover", Uuid::now_v7()),
            &json!({"since": since}),
        )
        .await;
    assert_error("unknown webhook", &answer, StatusCode::NOT_FOUND, None);
    admin.delete(&format!("/api/v1/webhooks/{other}")).await;
    let answer = admin
        .post(
            &format!("/api/v1/webhooks/{other}/recover"),
            &json!({"since": since}),
        )
        .await;
    assert_error("deleted webhook", &answer, StatusCode::CONFLICT, None);
    assert_eq!(admin.manual_retry_outbox_rows().await.len(), 2);
    admin.stop().await;
}

/// `POST /api/v1/webhooks/{id}/replay` records a replay and answers at once (202) with it;
/// each field is checked (422 naming it), and an unknown webhook is 404.
#[tokio::test]
async fn a_replay_is_recorded_at_once_and_its_fields_are_checked() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let path = format!("/api/v1/webhooks/{webhook}/replay");
    let (status, body) = admin
        .post(
            &path,
            &json!({"since": "2026-11-01T00:00:00Z", "events": ["incidents.opened"]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["webhook_id"], webhook.to_string());
    assert_eq!(body["events"], json!(["incidents.opened"]));
    assert_eq!(body["created"], 0);
    assert!(body["finished_at"].is_null());
    assert_eq!(admin.count("replays").await, 1);
    for (request, field) in [
        (json!({"since": "yesterday"}), "since"),
        (
            json!({"since": "2026-11-02T00:00:00Z", "until": "tomorrow"}),
            "until",
        ),
        (
            json!({"since": "2026-11-01T00:00:00Z", "events": ["incidents.closed"]}),
            "events[0]",
        ),
        (
            json!({"since": "2026-11-01T00:00:00Z", "events": []}),
            "events",
        ),
    ] {
        let (status, body) = admin.post(&path, &request).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{request}: {body}"
        );
        assert_eq!(body["error"]["field"], field, "{request}: {body}");
    }
    let (status, _) = admin
        .post(
            &format!("/api/v1/webhooks/{}/replay", Uuid::now_v7()),
            &json!({"since": "2026-11-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        admin.count("replays").await,
        1,
        "nothing recorded for a refusal"
    );
    // An `until` before `since` is an empty window, not an error: nothing will be replayed.
    let (status, body) = admin
        .post(
            &path,
            &json!({"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    admin.stop().await;
}
