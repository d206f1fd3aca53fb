//! The delivery log through the API: listed newest first, filtered, paged stably while new
//! deliveries arrive, and a delivery's detail with its attempts.

use diesel::sql_types::{Jsonb, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_domain::EventKind;
use uuid::Uuid;

use crate::api::{
    assert_error, id_of, keys, rfc3339, seed_delivery, set, set_created_at, TestAdmin,
};

#[tokio::test]
async fn the_delivery_log_lists_filters_and_shows_attempts() {
    let admin = TestAdmin::start().await;
    let first = id_of(&admin.create_webhook("first").await);
    let second = id_of(&admin.create_webhook("second").await);
    let incident = Uuid::now_v7();
    let mut conn = admin.conn().await;
    let (old, _) = seed_delivery(&mut conn, first, EventKind::IncidentOpened, incident).await;
    let hour_ago = OffsetDateTime::now_utc() - time::Duration::hours(1);
    set_created_at(&mut conn, old, hour_ago).await;
    let (failing, event) =
        seed_delivery(&mut conn, first, EventKind::IncidentResolved, incident).await;
    seed_failed_attempt(&mut conn, failing).await;
    let (other, _) =
        seed_delivery(&mut conn, second, EventKind::IncidentOpened, Uuid::now_v7()).await;

    let (status, list) = admin.get("/api/v1/deliveries").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let ids = |page: &Value| -> Vec<Uuid> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect()
    };
    assert_eq!(ids(&list), [other, failing, old], "newest first");
    assert_eq!(
        keys(&list["items"][1]),
        set(&[
            "id",
            "webhook_id",
            "event_id",
            "event",
            "incident_id",
            "state",
            "wait_reason",
            "attempt_count",
            "next_attempt_at",
            "attempting_until",
            "created_at",
            "updated_at",
            "replayed"
        ])
    );
    let item = &list["items"][1];
    assert_eq!(item["webhook_id"], first.to_string());
    assert_eq!(item["event_id"], event.id.to_string());
    assert_eq!(item["event"], "incidents.resolved");
    assert_eq!(item["incident_id"], incident.to_string());
    assert_eq!(item["state"], "retrying");
    assert_eq!(item["attempt_count"], 1);
    assert!(item["next_attempt_at"].is_string());

    let since = rfc3339(hour_ago + time::Duration::minutes(1));
    for (query, expected) in [
        (format!("webhook_id={first}"), vec![failing, old]),
        (format!("webhook_id={second}"), vec![other]),
        ("state=retrying".to_owned(), vec![failing]),
        ("state=pending".to_owned(), vec![other, old]),
        ("event=incidents.resolved".to_owned(), vec![failing]),
        (format!("incident_id={incident}"), vec![failing, old]),
        (format!("webhook_id={first}&state=pending"), vec![old]),
        (format!("since={since}"), vec![other, failing]),
        (format!("until={since}"), vec![old]),
        ("limit=1".to_owned(), vec![other]),
    ] {
        let query = query.replace('+', "%2B");
        let (status, page) = admin.get(&format!("/api/v1/deliveries?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {page}");
        assert_eq!(ids(&page), expected, "{query}");
    }
    let (_, page) = admin.get("/api/v1/deliveries?limit=2").await;
    let cursor = page["next_cursor"].as_str().unwrap();
    seed_delivery(&mut conn, second, EventKind::IncidentOpened, Uuid::now_v7()).await;
    let (_, page) = admin
        .get(&format!("/api/v1/deliveries?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(ids(&page), [old], "stable while new deliveries arrive");
    assert_eq!(page["next_cursor"], Value::Null);

    for (query, parameter) in [
        ("state=lost", "state"),
        ("event=incidents.closed", "event"),
        ("webhook_id=12", "webhook_id"),
        ("incident_id=x", "incident_id"),
        ("since=yesterday", "since"),
        ("until=2026-13-01T00:00:00Z", "until"),
        ("limit=500", "limit"),
        ("cursor=abc", "cursor"),
    ] {
        let answer = admin.get(&format!("/api/v1/deliveries?{query}")).await;
        assert_error(query, &answer, StatusCode::BAD_REQUEST, Some(parameter));
    }

    let (status, detail) = admin.get(&format!("/api/v1/deliveries/{failing}")).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let mut expected_keys = keys(&list["items"][1]);
    expected_keys.insert("attempts".into());
    expected_keys.insert("waits_for".into());
    assert_eq!(keys(&detail), expected_keys);
    assert!(
        detail["waits_for"].is_null(),
        "it waits for no earlier delivery"
    );
    let attempts = detail["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        keys(&attempts[0]),
        set(&[
            "number",
            "trigger",
            "started_at",
            "success",
            "status_code",
            "duration_ms",
            "error",
            "error_detail",
            "request_headers",
            "request_body",
            "response_body",
            "response_truncated"
        ])
    );
    let attempt = &attempts[0];
    assert_eq!(attempt["number"], 1);
    assert_eq!(attempt["trigger"], "automatic");
    assert_eq!(attempt["success"], false);
    assert_eq!(attempt["status_code"], 500);
    assert_eq!(attempt["duration_ms"], 87);
    assert_eq!(attempt["error"], "http_status");
    assert_eq!(attempt["error_detail"], "HTTP 500");
    assert_eq!(
        attempt["request_headers"]["webhook-id"],
        failing.to_string()
    );
    assert_eq!(attempt["request_body"], event.body, "the exact bytes sent");
    assert_eq!(attempt["response_body"], "upstream exploded");
    assert_eq!(attempt["response_truncated"], false);
    let (_, pending) = admin.get(&format!("/api/v1/deliveries/{other}")).await;
    assert_eq!(pending["attempts"], json!([]));

    for path in [
        format!("/api/v1/deliveries/{}", Uuid::now_v7()),
        "/api/v1/deliveries/42".to_owned(),
    ] {
        let answer = admin.get(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }
    admin.stop().await;
}

/// Logs a failed automatic attempt of a delivery, as the dispatcher would.
async fn seed_failed_attempt(conn: &mut AsyncPgConnection, delivery_id: Uuid) {
    diesel::sql_query(
        "INSERT INTO attempts (delivery_id, number, trigger, started_at, success, status_code, \
         duration_ms, error, error_detail, request_headers, response_body, response_truncated) \
         VALUES ($1, 1, 'automatic', now(), false, 500, 87, 'http_status', 'HTTP 500', $2, \
         'upstream exploded', false)",
    )
    .bind::<SqlUuid, _>(delivery_id)
    .bind::<Jsonb, _>(
        json!({"webhook-id": delivery_id.to_string(), "content-type": "application/json"}),
    )
    .execute(conn)
    .await
    .unwrap();
    diesel::sql_query(
        "UPDATE deliveries SET attempt_count = 1, auto_attempts = 1, state = 'retrying', \
         next_attempt_at = now() + interval '1 minute' WHERE id = $1",
    )
    .bind::<SqlUuid, _>(delivery_id)
    .execute(conn)
    .await
    .unwrap();
}
