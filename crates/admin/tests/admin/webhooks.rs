//! Webhooks through the API: created with their defaults, read and listed without their secret,
//! changed field by field, their secret revealed and rotated, deleted (their pending deliveries
//! stopped, the log kept); a change that cannot read the health changes nothing; filters,
//! headers, rate limits and ordering; pages that stay stable; test events.

use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::RunQueryDsl;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_domain::EventKind;
use tocsin_testkit::wait_until;
use uuid::Uuid;

use crate::api::{assert_error, id_of, keys, seed_delivery, set, TestAdmin, DEADLINE};

/// The webhook the lifecycle tests create: a name to trim, a URL with a query, its events out of
/// order.
fn ops_pager() -> Value {
    json!({
        "name": "  ops pager  ",
        "url": "https://hooks.example.com/tocsin?team=ops",
        "events": ["incidents.resolved", "incidents.opened"],
    })
}

/// Creates the webhook of [`ops_pager`]; its id and its secret.
async fn create_ops_pager(admin: &TestAdmin) -> (Uuid, String) {
    let (status, created) = admin.post("/api/v1/webhooks", &ops_pager()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    (
        id_of(&created),
        created["secret"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_webhook_is_created_with_its_defaults_and_read_and_listed_without_its_secret() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin.post("/api/v1/webhooks", &ops_pager()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        keys(&created),
        set(&[
            "id",
            "name",
            "url",
            "events",
            "retry",
            "enabled",
            "previous_secret_expires_at",
            "created_at",
            "updated_at",
            "disabled_reason",
            "disabled_at",
            "filters",
            "headers",
            "rate_limit_per_second",
            "ordering",
            "health",
            "secret"
        ])
    );
    assert_eq!(created["filters"], json!({}));
    assert_eq!(created["headers"], json!({}));
    assert_eq!(created["rate_limit_per_second"], Value::Null);
    assert_eq!(
        created["health"],
        json!({"consecutive_failures": 0, "last_success_at": null, "last_failure_at": null,
               "last_error": null, "success_rate_1h": null, "success_rate_24h": null})
    );
    assert_eq!(created["disabled_reason"], Value::Null);
    assert_eq!(created["name"], "ops pager");
    assert_eq!(created["url"], "https://hooks.example.com/tocsin?team=ops");
    assert_eq!(
        created["events"],
        json!(["incidents.opened", "incidents.resolved"])
    );
    assert_eq!(
        created["retry"],
        json!({"max_attempts": 5, "timeout_ms": 10000})
    );
    assert_eq!(created["enabled"], true);
    assert_eq!(created["previous_secret_expires_at"], Value::Null);
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let id = id_of(&created);

    let (status, read) = admin.get(&format!("/api/v1/webhooks/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        read.get("secret").is_none(),
        "the secret is not shown: {read}"
    );
    assert_eq!(read["name"], "ops pager");

    let (status, list) = admin.get("/api/v1/webhooks").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys(&list), set(&["items", "next_cursor"]));
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(list["items"][0].get("secret").is_none());
    assert_eq!(list["next_cursor"], Value::Null);
    admin.stop().await;
}

#[tokio::test]
async fn a_change_sets_only_the_fields_given_and_enabling_clears_the_disabled_reason() {
    let admin = TestAdmin::start().await;
    let (id, _) = create_ops_pager(&admin).await;
    // Only the fields given change; a partial retry keeps the other retry field.
    let (status, changed) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"name": "ops", "retry": {"timeout_ms": 2000}, "events": ["incidents.status_changed"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["name"], "ops");
    assert_eq!(changed["url"], "https://hooks.example.com/tocsin?team=ops");
    assert_eq!(changed["events"], json!(["incidents.status_changed"]));
    assert_eq!(
        changed["retry"],
        json!({"max_attempts": 5, "timeout_ms": 2000})
    );
    let (status, changed) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"retry": {"max_attempts": 2}, "enabled": false, "url": "http://10.0.0.7:9000/hook"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(
        changed["retry"],
        json!({"max_attempts": 2, "timeout_ms": 2000})
    );
    assert_eq!(changed["enabled"], false);
    assert_eq!(changed["disabled_reason"], "disabled by an operator");
    assert!(changed["disabled_at"].is_string());
    assert_eq!(changed["url"], "http://10.0.0.7:9000/hook");
    assert!(changed.get("secret").is_none());
    // Enabled again, it has no disabled reason.
    let (status, enabled) = admin
        .patch(&format!("/api/v1/webhooks/{id}"), &json!({"enabled": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{enabled}");
    assert_eq!(enabled["disabled_reason"], Value::Null);
    admin.stop().await;
}

/// The secret is revealed, and rotated with the previous one still signing for a day; of a
/// disabled webhook too (as in the lifecycle these checks come from).
#[tokio::test]
async fn a_webhooks_secret_is_revealed_and_rotated_and_the_previous_one_signs_for_a_day() {
    let admin = TestAdmin::start().await;
    let (id, secret) = create_ops_pager(&admin).await;
    let (status, disabled) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{disabled}");
    assert_eq!(disabled["enabled"], false);

    let (status, revealed) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/reveal-secret"))
        .await;
    assert_eq!(status, StatusCode::OK, "{revealed}");
    assert_eq!(revealed["secret"], secret);

    let before = OffsetDateTime::now_utc();
    let (status, rotated) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/rotate-secret"))
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_"));
    assert_ne!(new_secret, secret);
    let expires = OffsetDateTime::parse(
        rotated["previous_secret_expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let grace = expires - before;
    assert!(
        grace >= time::Duration::hours(24)
            && grace < time::Duration::hours(24) + time::Duration::minutes(1),
        "{grace}"
    );
    let (_, revealed) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/reveal-secret"))
        .await;
    assert_eq!(revealed["secret"], new_secret);
    let mut conn = admin.conn().await;
    let stored = tocsin_storage::webhooks::get(&mut conn, id).await.unwrap();
    let signing: Vec<&str> = stored
        .signing_secrets(OffsetDateTime::now_utc())
        .into_iter()
        .map(|s| s.expose())
        .collect();
    assert_eq!(
        signing,
        [new_secret, secret.as_str()],
        "the old one still signs"
    );
    admin.stop().await;
}

#[tokio::test]
async fn deleting_a_webhook_stops_its_pending_deliveries_and_keeps_the_delivery_log_readable() {
    let admin = TestAdmin::start().await;
    let (id, _) = create_ops_pager(&admin).await;
    let mut conn = admin.conn().await;
    // Deleting stops pending retries and keeps the delivery log readable.
    let (delivery_id, _) =
        seed_delivery(&mut conn, id, EventKind::IncidentOpened, Uuid::now_v7()).await;
    let (status, body) = admin.delete(&format!("/api/v1/webhooks/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(body, Value::Null);
    for path in [
        format!("/api/v1/webhooks/{id}"),
        format!("/api/v1/webhooks/{id}/reveal-secret"),
    ] {
        let method = if path.ends_with("secret") {
            Method::POST
        } else {
            Method::GET
        };
        let answer = admin.send(method, &path, None).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }
    let answer = admin.delete(&format!("/api/v1/webhooks/{id}")).await;
    assert_error("deleted twice", &answer, StatusCode::NOT_FOUND, None);
    let (_, list) = admin.get("/api/v1/webhooks").await;
    assert_eq!(list["items"], json!([]));
    let (status, delivery) = admin
        .get(&format!("/api/v1/deliveries/{delivery_id}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{delivery}");
    assert_eq!(
        delivery["state"], "failed",
        "its pending delivery was stopped"
    );
    admin.stop().await;
}

#[tokio::test]
async fn an_unknown_or_malformed_webhook_id_is_not_found() {
    let admin = TestAdmin::start().await;
    create_ops_pager(&admin).await;
    for path in [
        "/api/v1/webhooks/not-a-uuid".to_owned(),
        format!("/api/v1/webhooks/{}", Uuid::now_v7()),
    ] {
        let answer = admin.get(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
        let answer = admin.patch(&path, &json!({"name": "x"})).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
        let answer = admin.delete(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }
    admin.stop().await;
}

/// A change reads the webhook's health before it writes it, so that when the read fails the
/// answer is an error and nothing was changed: a client that retries a failed rotation
/// rotates once, and the secret its receivers know stays the previous one.
#[tokio::test]
async fn a_change_whose_health_cannot_be_read_answers_an_error_and_changes_nothing() {
    let admin = TestAdmin::start().await;
    let created = admin.create_webhook("before").await;
    let id = id_of(&created);
    let mut conn = admin.conn().await;
    let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
    diesel::sql_query(rename("webhook_outcomes", "webhook_outcomes_away"))
        .execute(&mut conn)
        .await
        .unwrap();

    let (status, rotated) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/rotate-secret"))
        .await;
    assert!(status.is_server_error(), "{status} {rotated}");
    let (status, changed) = admin
        .patch(&format!("/api/v1/webhooks/{id}"), &json!({"name": "after"}))
        .await;
    assert!(status.is_server_error(), "{status} {changed}");

    diesel::sql_query(rename("webhook_outcomes_away", "webhook_outcomes"))
        .execute(&mut conn)
        .await
        .unwrap();
    let (_, revealed) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/reveal-secret"))
        .await;
    assert_eq!(revealed["secret"], created["secret"], "not rotated");
    assert_eq!(revealed["previous_secret_expires_at"], Value::Null);
    assert_eq!(revealed["name"], "before", "not renamed");
    let (status, rotated) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/rotate-secret"))
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_eq!(rotated["health"]["consecutive_failures"], 0);
    admin.stop().await;
}

/// Filters, headers and a rate limit are set at creation, read back (header values masked),
/// and changed: a masked value written back keeps the stored one, `null` removes the limit.
#[tokio::test]
async fn filters_headers_and_rate_limits_are_set_read_and_changed() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post(
            "/api/v1/webhooks",
            &json!({
                "name": "db pager",
                "url": "https://hooks.example.com/db",
                "events": ["incidents.opened"],
                "filters": {"severities": ["SEV2", "SEV1", "SEV1"], "sources": ["alertmanager"],
                            "labels": {"team": "db"}},
                "headers": {"X-Team-Key": "k1", "Authorization": "Bearer s3cret"},
                "rate_limit_per_second": 5,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        created["filters"],
        json!({"severities": ["SEV1", "SEV2"], "sources": ["alertmanager"], "labels": {"team": "db"}})
    );
    assert_eq!(
        created["headers"],
        json!({"authorization": "***", "x-team-key": "***"})
    );
    assert!(!created.to_string().contains("s3cret"));
    assert_eq!(created["rate_limit_per_second"], 5);
    let id = id_of(&created);

    // Written back as read: the masked values keep their secrets; a new one is added.
    let mut headers = created["headers"].clone();
    headers["X-Extra"] = json!("2");
    let (status, changed) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"headers": headers, "rate_limit_per_second": null, "filters": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["rate_limit_per_second"], Value::Null);
    assert_eq!(changed["filters"], json!({}));
    let mut conn = admin.conn().await;
    let stored = tocsin_storage::webhooks::get(&mut conn, id).await.unwrap();
    let sent: Vec<(&str, &str)> = stored.headers.iter().collect();
    assert_eq!(
        sent,
        [
            ("authorization", "Bearer s3cret"),
            ("x-extra", "2"),
            ("x-team-key", "k1")
        ]
    );
    // A mask for a header that is not set is refused, and nothing changes.
    let answer = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"headers": {"x-other": "***"}}),
        )
        .await;
    assert_error(
        "unknown mask",
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Some("headers.x-other"),
    );
    let again = tocsin_storage::webhooks::get(&mut conn, id).await.unwrap();
    assert_eq!(again.headers, stored.headers);
    admin.stop().await;
}

#[tokio::test]
async fn webhook_pages_are_stable_while_webhooks_are_added() {
    let admin = TestAdmin::start().await;
    let mut created = Vec::new();
    for n in 0..5 {
        created.push(id_of(&admin.create_webhook(&format!("hook {n}")).await));
    }
    let (status, first) = admin.get("/api/v1/webhooks?limit=2").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let ids = |page: &Value| -> Vec<Uuid> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect()
    };
    assert_eq!(ids(&first), [created[4], created[3]], "newest first");
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();

    // A webhook created between pages does not shift the next ones.
    admin.create_webhook("late").await;
    let (_, second) = admin
        .get(&format!("/api/v1/webhooks?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(ids(&second), [created[2], created[1]]);
    let cursor = second["next_cursor"].as_str().unwrap();
    let (_, third) = admin
        .get(&format!("/api/v1/webhooks?cursor={cursor}&limit=2"))
        .await;
    assert_eq!(ids(&third), [created[0]]);
    assert_eq!(third["next_cursor"], Value::Null);

    let (_, all) = admin.get("/api/v1/webhooks").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 6);
    for (query, parameter) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=two", "limit"),
        ("cursor=not-a-cursor", "cursor"),
    ] {
        let answer = admin.get(&format!("/api/v1/webhooks?{query}")).await;
        assert_error(query, &answer, StatusCode::BAD_REQUEST, Some(parameter));
    }
    let answer = admin.get("/api/v1/webhooks?page=2").await;
    assert_error("unknown parameter", &answer, StatusCode::BAD_REQUEST, None);
    admin.stop().await;
}

#[tokio::test]
async fn a_test_event_is_recorded_for_that_webhook_only_and_published() {
    let admin = TestAdmin::start().await;
    let id = id_of(&admin.create_webhook("ops").await);
    let (status, body) = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/test"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["event"], "incidents.opened");
    let event_id: Uuid = body["event_id"].as_str().unwrap().parse().unwrap();

    #[derive(diesel::QueryableByName)]
    struct Event {
        #[diesel(sql_type = Text)]
        kind: String,
        #[diesel(sql_type = Text)]
        body: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<SqlUuid>)]
        test_webhook_id: Option<Uuid>,
    }
    let mut conn = admin.conn().await;
    let event = diesel::sql_query("SELECT kind, body, test_webhook_id FROM events WHERE id = $1")
        .bind::<SqlUuid, _>(event_id)
        .load::<Event>(&mut conn)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(event.kind, "incidents.opened");
    assert_eq!(event.test_webhook_id, Some(id));
    let payload: Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!(payload["event"], "incidents.opened");
    assert_eq!(payload["data"]["title"], "Tocsin test event");
    assert_eq!(payload["data"]["severity"], "SEV5");
    assert_eq!(payload["data"]["status"], "triggered");
    assert_eq!(payload["data"]["id"], body["incident_id"]);
    assert_eq!(admin.count("incidents").await, 0, "no incident is stored");
    // The event is published for the dispatchers' fan-out, which gives it one delivery, to
    // that webhook only.
    let message = format!(
        "outbox WHERE topic = 'event'
            AND convert_from(payload, 'UTF8')::jsonb ->> 'event_id' = '{event_id}'
            AND convert_from(payload, 'UTF8')::jsonb ->> 'test_webhook_id' = '{id}'"
    );
    assert_eq!(
        admin.count(&message).await,
        1,
        "the event's message names its webhook"
    );
    wait_until("the relay to publish the event", DEADLINE, || async {
        admin
            .count(&format!("{message} AND published_at IS NOT NULL"))
            .await
            == 1
    })
    .await;

    let (status, _) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let answer = admin
        .post_empty(&format!("/api/v1/webhooks/{id}/test"))
        .await;
    assert_error("disabled", &answer, StatusCode::CONFLICT, None);
    for path in [
        format!("/api/v1/webhooks/{}/test", Uuid::now_v7()),
        "/api/v1/webhooks/nope/test".to_owned(),
    ] {
        let answer = admin.post_empty(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }
    assert_eq!(admin.count("events").await, 1);
    admin.stop().await;
}

/// A webhook's `ordering` is `none` by default, set at creation, changed by PATCH, and
/// anything else is refused naming the field.
#[tokio::test]
async fn a_webhooks_ordering_is_set_read_and_checked() {
    let admin = TestAdmin::start().await;
    let created = admin.create_webhook("ops").await;
    assert_eq!(created["ordering"], "none");
    let id = id_of(&created);
    let (status, body) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"ordering": "incident"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ordering"], "incident");
    let (status, body) = admin
        .patch(
            &format!("/api/v1/webhooks/{id}"),
            &json!({"ordering": "by-time"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "ordering", "{body}");
    admin.stop().await;
}
