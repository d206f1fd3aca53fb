//! The admin API against the real PostgreSQL and RabbitMQ: every endpoint, every validation
//! rule, pagination, the outbox rows manual retries and status changes write, the OpenAPI
//! document, every CLI subcommand (tokens, migrate, deliveries, prune, parked messages),
//! `/readyz` with a dependency unreachable, the failed-token limit that never refuses the right
//! token, and a graceful stop on SIGTERM.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use diesel::sql_types::{Bytea, Jsonb, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_admin::Config;
use tocsin_broker::messages::DeliveryMessage;
use tocsin_broker::Outgoing;
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{
    AccessToken, EventKind, EventPayload, IncidentData, IncidentStatus, IncidentTitle, Severity,
};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::tokens;
use tocsin_testkit::{amqp_url, wait_for, wait_until, TcpProxy, TestDb, TestPrefix};

use crate::common::RunningAdmin;
use tocsin_web::config::CommonConfig;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(15);
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The admin under test, with the API helpers of this module.
struct TestAdmin(RunningAdmin);

impl std::ops::Deref for TestAdmin {
    type Target = RunningAdmin;
    fn deref(&self) -> &RunningAdmin {
        &self.0
    }
}

impl TestAdmin {
    async fn start() -> Self {
        Self::start_with(TestDb::new().await, |_| {}).await
    }

    async fn start_with(db: TestDb, adjust: impl FnOnce(&mut Config)) -> Self {
        TestAdmin(RunningAdmin::start(db, ADMIN_TOKEN, adjust).await)
    }

    async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(body);
        }
        read(request.send().await.expect("sending to admin")).await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body)).await
    }

    /// A POST without a body (actions such as retry).
    async fn post_empty(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::POST, path, None).await
    }

    async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(Method::PATCH, path, Some(body)).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::DELETE, path, None).await
    }

    /// Sends exactly these bytes with this content type.
    async fn send_raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: String,
    ) -> (StatusCode, Value) {
        let request = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", content_type)
            .body(body);
        read(request.send().await.expect("sending to admin")).await
    }

    async fn create_webhook(&self, name: &str) -> Value {
        let (status, body) = self
            .post(
                "/api/v1/webhooks",
                &json!({
                    "name": name,
                    "url": "https://hooks.example.com/tocsin",
                    "events": ["incidents.opened", "incidents.resolved"],
                }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    async fn count(&self, table_and_condition: &str) -> i64 {
        self.db.count(table_and_condition).await
    }

    /// Outbox rows of manual retries: (headers, payload). (Each new delivery's first attempt
    /// has its own row, with the event.)
    async fn manual_retry_outbox_rows(&self) -> Vec<(Value, Value)> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = Jsonb)]
            headers: Value,
            #[diesel(sql_type = Bytea)]
            payload: Vec<u8>,
        }
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT headers, payload FROM outbox
             WHERE topic = 'delivery' AND headers ->> 'tocsin-trigger' = 'manual' ORDER BY id",
        )
        .load::<Row>(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.headers, serde_json::from_slice(&r.payload).unwrap()))
        .collect()
    }

    async fn stop(self) {
        self.0.stop().await;
    }
}

async fn read(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

fn id_of(body: &Value) -> Uuid {
    body["id"].as_str().expect("an id").parse().unwrap()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Asserts the common error shape, the status and (when given) the field named.
fn assert_error(
    what: &str,
    (status, body): &(StatusCode, Value),
    expected: StatusCode,
    field: Option<&str>,
) {
    assert_eq!(*status, expected, "{what}: {body}");
    assert!(body["error"]["code"].is_string(), "{what}: {body}");
    assert!(body["error"]["message"].is_string(), "{what}: {body}");
    if let Some(field) = field {
        assert_eq!(body["error"]["field"], field, "{what}: {body}");
    }
}

/// Records an event of a new incident and one delivery of it to `webhook_id`, failed.
async fn seed_failed_delivery(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> Uuid {
    let (id, _) = seed_delivery(conn, webhook_id, EventKind::IncidentOpened, Uuid::now_v7()).await;
    tocsin_testkit::deliveries::mark_failed(conn, id).await;
    id
}

/// Records an event and one delivery of it to `webhook_id` (and none to other webhooks).
async fn seed_delivery(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    kind: EventKind,
    incident_id: Uuid,
) -> (Uuid, NewEvent) {
    let payload = EventPayload {
        event: kind,
        timestamp: OffsetDateTime::now_utc(),
        data: IncidentData {
            id: incident_id,
            title: "Disk full on db-1".into(),
            severity: Severity::SEV2,
            status: IncidentStatus::Triggered,
            previous_status: None,
        },
    };
    let event = NewEvent::new(&payload, None);
    outbox::record_events(conn, std::slice::from_ref(&event), outbox::Wake::Listeners)
        .await
        .unwrap();
    let id =
        tocsin_testkit::deliveries::create_delivery(conn, event.id, kind, incident_id, webhook_id)
            .await;
    (id, event)
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

async fn set_created_at(conn: &mut AsyncPgConnection, delivery_id: Uuid, at: OffsetDateTime) {
    diesel::sql_query("UPDATE deliveries SET created_at = $2 WHERE id = $1")
        .bind::<SqlUuid, _>(delivery_id)
        .bind::<Timestamptz, _>(at)
        .execute(conn)
        .await
        .unwrap();
}

fn signal(key: &str) -> AlertSignal {
    AlertSignal {
        dedup_key: key.to_owned(),
        action: AlertAction::Trigger,
        title: IncidentTitle::parse("p99 latency above 2s").unwrap(),
        severity: Severity::SEV2,
        description: None,
        source: Some("test".into()),
        reply_key: None,
        labels: Default::default(),
    }
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

#[tokio::test]
async fn every_api_call_needs_the_admin_token_but_the_open_endpoints_do_not() {
    // Many wrong tokens from one address on purpose: lift the per-address limit here.
    let admin = TestAdmin::start_with(TestDb::new().await, |c| c.auth_failures = 100).await;
    for (token, what) in [
        (None, "no token"),
        (Some("wrong-token-0123456789"), "wrong token"),
        (
            Some(&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]),
            "a prefix of the token",
        ),
    ] {
        for path in [
            "/api/v1/webhooks",
            "/api/v1/deliveries",
            "/api/v1/incidents",
            "/api/v1/tokens",
            "/api/v1/no-such-route",
        ] {
            let mut request = admin.client.get(admin.url(path));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response
                    .headers()
                    .get("www-authenticate")
                    .map(|v| v.to_str().unwrap()),
                Some("Bearer"),
                "{what} {path}"
            );
            let answer = read(response).await;
            assert_error(
                &format!("{what} {path}"),
                &answer,
                StatusCode::UNAUTHORIZED,
                None,
            );
            assert_eq!(answer.1["error"]["code"], "unauthorized");
        }
    }
    let response = admin
        .client
        .post(admin.url("/api/v1/webhooks"))
        .header("authorization", format!("Basic {ADMIN_TOKEN}"))
        .json(&json!({"name": "x", "url": "https://example.com", "events": ["incidents.opened"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(admin.count("webhooks").await, 0);

    let (status, body) = admin.get("/api/v1/webhooks").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for path in ["/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"] {
        let response = admin.client.get(admin.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let (status, body) = admin.get("/api/v1/no-such-route").await;
    assert_error(
        "unknown route",
        &(status, body),
        StatusCode::NOT_FOUND,
        None,
    );
    let answer = admin.send(Method::PUT, "/api/v1/webhooks", None).await;
    assert_error(
        "wrong method",
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        None,
    );
    admin.stop().await;
}

/// `GET /readyz`: the status and the JSON body.
async fn readiness(admin: &TestAdmin) -> (StatusCode, Value) {
    read(admin.client.get(admin.url("/readyz")).send().await.unwrap()).await
}

#[tokio::test]
async fn readyz_answers_503_naming_rabbitmq_when_the_broker_is_unreachable() {
    // A closed port; the password must not show in the answer.
    let admin = TestAdmin::start_with(TestDb::new().await, |config| {
        config.common.amqp_url = "amqp://guest:pw-never-shown@127.0.0.1:1/%2f".into();
    })
    .await;
    let (status, body) = readiness(&admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["checks"]["postgres"], "ok");
    assert!(
        body["checks"]["rabbitmq"]
            .as_str()
            .is_some_and(|e| e != "ok"),
        "{body}"
    );
    assert!(!body.to_string().contains("pw-never-shown"), "{body}");
    // Alive all the same, and the API that needs only PostgreSQL still answers.
    let alive = admin
        .client
        .get(admin.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status(), StatusCode::OK);
    assert_eq!(admin.get("/api/v1/webhooks").await.0, StatusCode::OK);
    admin.stop().await;
}

#[tokio::test]
async fn readyz_answers_503_naming_postgres_when_the_database_is_unreachable() {
    // Admin migrates at start, so it starts through a proxy that then refuses connections,
    // like a closed port (the shared server keeps running).
    let db = TestDb::new().await;
    let server = db
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(host, _)| host.to_owned())
        .expect("host:port in the test database URL");
    let proxy = TcpProxy::start(&server).await;
    let proxied = db
        .url
        .replacen(&server, &format!("127.0.0.1:{}", proxy.port()), 1);
    let admin = TestAdmin::start_with(db, |config| config.common.database_url = proxied).await;
    assert_eq!(readiness(&admin).await.0, StatusCode::OK);
    proxy.cut();
    let body = wait_for("readyz to answer 503", DEADLINE, || async {
        let (status, body) = readiness(&admin).await;
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "not_ready");
    assert!(
        body["checks"]["postgres"]
            .as_str()
            .is_some_and(|e| e != "ok"),
        "{body}"
    );
    assert_eq!(body["checks"]["rabbitmq"], "ok");
    proxy.restore();
    wait_until("readyz to answer 200 again", DEADLINE, || async {
        readiness(&admin).await.0 == StatusCode::OK
    })
    .await;
    admin.stop().await;
}

#[tokio::test]
async fn webhooks_are_created_read_changed_and_deleted() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post(
            "/api/v1/webhooks",
            &json!({
                "name": "  ops pager  ",
                "url": "https://hooks.example.com/tocsin?team=ops",
                "events": ["incidents.resolved", "incidents.opened"],
            }),
        )
        .await;
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

    // Deleting stops pending retries and keeps the delivery log readable.
    let (status, enabled) = admin
        .patch(&format!("/api/v1/webhooks/{id}"), &json!({"enabled": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{enabled}");
    assert_eq!(enabled["disabled_reason"], Value::Null);
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
async fn invalid_webhooks_are_refused_naming_the_field_and_nothing_is_written() {
    let admin = TestAdmin::start_with(TestDb::new().await, |config| config.body_limit = 4096).await;
    let valid = json!({
        "name": "ops",
        "url": "https://hooks.example.com/tocsin",
        "events": ["incidents.opened"],
        "retry": {"max_attempts": 3, "timeout_ms": 5000},
        "enabled": true,
    });
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        body
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        ("empty name", with("name", json!("")), "name"),
        ("blank name", with("name", json!("   ")), "name"),
        (
            "name too long",
            with("name", json!("n".repeat(101))),
            "name",
        ),
        ("name with a newline", with("name", json!("a\nb")), "name"),
        ("name of the wrong type", with("name", json!(42)), "name"),
        (
            "ftp url",
            with("url", json!("ftp://example.com/hook")),
            "url",
        ),
        ("relative url", with("url", json!("/hooks/tocsin")), "url"),
        ("not a url", with("url", json!("hooks dot example")), "url"),
        (
            "url with credentials",
            with("url", json!("https://user:pw@example.com/")),
            "url",
        ),
        (
            "url of the wrong type",
            with("url", json!(["https://a.b"])),
            "url",
        ),
        ("empty events", with("events", json!([])), "events"),
        (
            "unknown event kind",
            with("events", json!(["incidents.opened", "incident.closed"])),
            "events[1]",
        ),
        (
            "events not a list",
            with("events", json!("incidents.opened")),
            "events",
        ),
        (
            "event of the wrong type",
            with("events", json!([7])),
            "events[0]",
        ),
        (
            "max_attempts 0",
            with("retry", json!({"max_attempts": 0})),
            "retry.max_attempts",
        ),
        (
            "max_attempts 6",
            with("retry", json!({"max_attempts": 6})),
            "retry.max_attempts",
        ),
        (
            "max_attempts of the wrong type",
            with("retry", json!({"max_attempts": "5"})),
            "retry.max_attempts",
        ),
        (
            "max_attempts not whole",
            with("retry", json!({"max_attempts": 2.5})),
            "retry.max_attempts",
        ),
        (
            "timeout_ms too short",
            with("retry", json!({"timeout_ms": 999})),
            "retry.timeout_ms",
        ),
        (
            "timeout_ms too long",
            with("retry", json!({"timeout_ms": 30001})),
            "retry.timeout_ms",
        ),
        ("retry not an object", with("retry", json!(5)), "retry"),
        // serde's derive takes a struct from an array of its fields too: refused here.
        ("retry an empty array", with("retry", json!([])), "retry"),
        (
            "filters an array",
            with("filters", json!([null, null])),
            "filters",
        ),
        ("retry an array", with("retry", json!([3, 5000])), "retry"),
        (
            "enabled of the wrong type",
            with("enabled", json!("yes")),
            "enabled",
        ),
        (
            "unknown severity",
            with("filters", json!({"severities": ["SEV1", "SEV9"]})),
            "filters.severities[1]",
        ),
        (
            "empty severities",
            with("filters", json!({"severities": []})),
            "filters.severities",
        ),
        (
            "severities not a list",
            with("filters", json!({"severities": "SEV1"})),
            "filters.severities",
        ),
        (
            "blank source",
            with("filters", json!({"sources": [" "]})),
            "filters.sources[0]",
        ),
        (
            "label of the wrong type",
            with("filters", json!({"labels": {"team": 1}})),
            "filters.labels.team",
        ),
        (
            "unknown filter",
            with("filters", json!({"teams": ["db"]})),
            "filters.teams",
        ),
        (
            "reserved header",
            with("headers", json!({"Content-Type": "text/plain"})),
            "headers.Content-Type",
        ),
        (
            "reserved header prefix",
            with("headers", json!({"webhook-signature": "v1,forged"})),
            "headers.webhook-signature",
        ),
        (
            "tocsin header",
            with("headers", json!({"Tocsin-Event": "x"})),
            "headers.Tocsin-Event",
        ),
        (
            "header value with a newline",
            with("headers", json!({"x-key": "a\r\nx-injected: 1"})),
            "headers.x-key",
        ),
        (
            "header name with a space",
            with("headers", json!({"x key": "1"})),
            "headers.x key",
        ),
        (
            "masked header at creation",
            with("headers", json!({"x-key": "***"})),
            "headers.x-key",
        ),
        (
            "header value of the wrong type",
            with("headers", json!({"x-key": 1})),
            "headers.x-key",
        ),
        (
            "rate limit 0",
            with("rate_limit_per_second", json!(0)),
            "rate_limit_per_second",
        ),
        (
            "rate limit too high",
            with("rate_limit_per_second", json!(10001)),
            "rate_limit_per_second",
        ),
        (
            "rate limit of the wrong type",
            with("rate_limit_per_second", json!("2")),
            "rate_limit_per_second",
        ),
    ];
    for (what, body, field) in &cases {
        let answer = admin.post("/api/v1/webhooks", body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
        assert_eq!(answer.1["error"]["code"], "invalid", "{what}");
    }
    for (what, body, needle) in [
        (
            "unknown field",
            with("secret", json!("whsec_x")),
            "unknown field",
        ),
        (
            "unknown retry field",
            with("retry", json!({"attempts": 3})),
            "unknown field",
        ),
        (
            "missing name",
            json!({"url": "https://a.example", "events": ["incidents.opened"]}),
            "name",
        ),
        ("not an object", json!([1, 2]), ""),
    ] {
        let answer = admin.post("/api/v1/webhooks", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, None);
        let message = answer.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{what}: {message}");
    }
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "application/json",
            "{\"name\":".into(),
        )
        .await;
    assert_error("unparseable", &answer, StatusCode::BAD_REQUEST, None);
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "application/json",
            String::new(),
        )
        .await;
    assert_error("empty body", &answer, StatusCode::BAD_REQUEST, None);
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "text/plain",
            valid.to_string(),
        )
        .await;
    assert_error(
        "not JSON",
        &answer,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        None,
    );
    let mut large = valid.clone();
    large["name"] = json!("x".repeat(5000));
    let answer = admin.post("/api/v1/webhooks", &large).await;
    assert_error("too large", &answer, StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(admin.count("webhooks").await, 0, "nothing was written");

    // The same rules apply to a change, which leaves the webhook as it was.
    let created = admin.create_webhook("keep me").await;
    let path = format!("/api/v1/webhooks/{}", id_of(&created));
    let (_, before) = admin.get(&path).await;
    for (what, body, field) in &cases {
        let answer = admin.patch(&path, body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
    }
    for (what, body, field) in [
        ("null name", json!({"name": null}), "name"),
        ("null events", json!({"events": null}), "events"),
        (
            "null retry field",
            json!({"retry": {"max_attempts": null}}),
            "retry.max_attempts",
        ),
    ] {
        let answer = admin.patch(&path, &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
    }
    let answer = admin.patch(&path, &json!({"colour": "red"})).await;
    assert_error(
        "unknown field",
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
    );
    let answer = admin
        .send_raw(Method::PATCH, &path, "text/plain", "{}".into())
        .await;
    assert_error(
        "not JSON",
        &answer,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        None,
    );
    let (_, after) = admin.get(&path).await;
    assert_eq!(before, after, "refused changes change nothing");
    assert_eq!(admin.count("webhooks").await, 1);
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
            SELECT gen_random_uuid(), kind, incident_id, occurred_at, body
            FROM events, generate_series(1, 2499)
            WHERE id = (SELECT event_id FROM deliveries WHERE id = '{one}')
            RETURNING id)
         INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state,
             attempt_count, auto_attempts, created_at, updated_at)
         SELECT gen_random_uuid(), d.webhook_id, e.id, d.event, d.incident_id, 'failed', 1, 1,
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

#[tokio::test]
async fn incident_status_changes_follow_the_rules_and_emit_events() {
    let admin = TestAdmin::start().await;
    let mut conn = admin.conn().await;
    let opened = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("a"), signal("b")],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let id = opened[0].incident.as_ref().unwrap().id;
    let other = opened[1].incident.as_ref().unwrap().id;
    let events_before = admin.count("events").await;

    let (status, list) = admin.get("/api/v1/incidents").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let (status, incident) = admin.get(&format!("/api/v1/incidents/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        keys(&incident),
        set(&[
            "id",
            "dedup_key",
            "title",
            "severity",
            "status",
            "source",
            "description",
            "created_at",
            "updated_at",
            "resolved_at",
            "labels",
            "format"
        ])
    );
    assert_eq!(incident["labels"], json!({}));
    // Its key is in no source's namespace.
    assert_eq!(incident["format"], Value::Null);
    assert_eq!(incident["status"], "triggered");
    assert_eq!(incident["severity"], "SEV2");

    let path = format!("/api/v1/incidents/{id}");
    let (status, body) = admin.patch(&path, &json!({"status": "acknowledged"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "acknowledged");
    assert_eq!(body["events"], json!(["incidents.status_changed"]));
    assert_eq!(admin.count("events").await, events_before + 1);

    let (status, body) = admin.patch(&path, &json!({"status": "acknowledged"})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the same status again is harmless: {body}"
    );
    assert_eq!(body["events"], json!([]));
    assert_eq!(admin.count("events").await, events_before + 1);

    let (status, body) = admin.patch(&path, &json!({"status": "resolved"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["events"],
        json!(["incidents.status_changed", "incidents.resolved"])
    );
    assert!(body["resolved_at"].is_string());
    assert_eq!(admin.count("events").await, events_before + 3);
    wait_until("the relay to publish the events", DEADLINE, || async {
        admin.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;

    let answer = admin.patch(&path, &json!({"status": "triggered"})).await;
    assert_error("out of resolved", &answer, StatusCode::CONFLICT, None);
    let (status, body) = admin.patch(&path, &json!({"status": "resolved"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events"], json!([]));
    for (what, body) in [
        ("unknown status", json!({"status": "closed"})),
        ("capitalised", json!({"status": "Resolved"})),
        ("wrong type", json!({"status": 3})),
    ] {
        let answer = admin
            .patch(&format!("/api/v1/incidents/{other}"), &body)
            .await;
        assert_error(
            what,
            &answer,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("status"),
        );
    }
    let answer = admin
        .patch(
            &format!("/api/v1/incidents/{other}"),
            &json!({"status": "mitigated", "note": "x"}),
        )
        .await;
    assert_error(
        "unknown field",
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
    );
    assert_eq!(admin.count("events").await, events_before + 3);
    for path in [
        format!("/api/v1/incidents/{}", Uuid::now_v7()),
        "/api/v1/incidents/zzz".to_owned(),
    ] {
        let answer = admin.patch(&path, &json!({"status": "mitigated"})).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
        let answer = admin.get(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }

    let ids = |page: &Value| -> Vec<Uuid> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect()
    };
    let (_, resolved) = admin.get("/api/v1/incidents?status=resolved").await;
    assert_eq!(ids(&resolved), [id]);
    let (_, triggered) = admin
        .get("/api/v1/incidents?status=triggered&severity=SEV2")
        .await;
    assert_eq!(ids(&triggered), [other]);
    let (_, none) = admin.get("/api/v1/incidents?severity=SEV1").await;
    assert_eq!(none["items"], json!([]));
    let (_, page) = admin.get("/api/v1/incidents?limit=1").await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, page) = admin
        .get(&format!("/api/v1/incidents?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    for (query, parameter) in [("status=closed", "status"), ("severity=SEV9", "severity")] {
        let answer = admin.get(&format!("/api/v1/incidents?{query}")).await;
        assert_error(query, &answer, StatusCode::BAD_REQUEST, Some(parameter));
    }
    admin.stop().await;
}

#[tokio::test]
async fn inbound_tokens_are_issued_listed_and_revoked() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post("/api/v1/tokens", &json!({"name": "alertmanager-prod"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for field in ["id", "name", "prefix", "created_at", "token"] {
        assert!(!created[field].is_null(), "{field}: {created}");
    }
    let token = created["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with(&format!("tsn_{}_", created["prefix"].as_str().unwrap())));
    let id = id_of(&created);
    let presented = AccessToken::from_presented(&token).expect("well-formed");
    let mut conn = admin.conn().await;
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        Some(id)
    );

    let (status, list) = admin.get("/api/v1/tokens").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let listed = &list["items"][0];
    assert_eq!(
        keys(listed),
        set(&[
            "id",
            "name",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
            "source",
            "basic_auth",
            "query_token",
            "signed"
        ])
    );
    assert_eq!(
        (
            &listed["source"],
            &listed["basic_auth"],
            &listed["query_token"],
            &listed["signed"]
        ),
        (&Value::Null, &json!(false), &json!(false), &json!(false)),
        "a token is bound to no source and takes the bearer header only, by default"
    );
    assert!(
        !list.to_string().contains(&token[17..]),
        "no secrets listed"
    );
    assert!(listed["last_used_at"].is_string(), "the use was noted");

    let (status, body) = admin.delete(&format!("/api/v1/tokens/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        None
    );
    let (_, list) = admin.get("/api/v1/tokens").await;
    assert!(list["items"][0]["revoked_at"].is_string());
    for path in [
        format!("/api/v1/tokens/{id}"),
        format!("/api/v1/tokens/{}", Uuid::now_v7()),
        "/api/v1/tokens/abc".to_owned(),
    ] {
        let answer = admin.delete(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }

    for (what, body, field) in [
        ("empty name", json!({"name": ""}), Some("name")),
        (
            "name too long",
            json!({"name": "t".repeat(101)}),
            Some("name"),
        ),
        (
            "name of the wrong type",
            json!({"name": false}),
            Some("name"),
        ),
        ("unknown field", json!({"name": "x", "scope": "all"}), None),
        ("missing name", json!({}), None),
    ] {
        let answer = admin.post("/api/v1/tokens", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, field);
    }
    assert_eq!(admin.count("inbound_tokens").await, 1);
    admin.stop().await;
}

#[tokio::test]
async fn a_token_binds_a_source_and_opts_in_to_other_credentials() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post(
            "/api/v1/tokens",
            &json!({"name": "sentry", "source": "sentry", "basic_auth": true,
                    "signing_secret": "sentry-client-secret"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["source"], "sentry");
    assert_eq!(created["basic_auth"], true);
    assert_eq!(created["query_token"], false);
    assert_eq!(created["signed"], true);
    assert!(!created.to_string().contains("sentry-client-secret"));
    let (status, created) = admin
        .post(
            "/api/v1/tokens",
            &json!({"name": "azure", "source": "azure", "query_token": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, list) = admin.get("/api/v1/tokens").await;
    assert!(!list.to_string().contains("sentry-client-secret"));
    let sources: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["source"])
        .collect();
    assert_eq!(sources, [&json!("azure"), &json!("sentry")]);
    let presented = AccessToken::from_presented(created["token"].as_str().unwrap()).unwrap();
    let mut conn = admin.conn().await;
    let live = tokens::authenticate_all(&mut conn, &[presented])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(live.source, Some(tocsin_domain::alerts::AlertFormat::Azure));
    assert!(live.query_token && !live.basic_auth);

    for (what, body, field) in [
        (
            "unknown source",
            json!({"name": "x", "source": "nagios"}),
            Some("source"),
        ),
        (
            "source of the wrong type",
            json!({"name": "x", "source": 1}),
            Some("source"),
        ),
        (
            "a secret without sentry",
            json!({"name": "x", "source": "cloudwatch", "signing_secret": "s"}),
            Some("signing_secret"),
        ),
        (
            "a secret without a source",
            json!({"name": "x", "signing_secret": "s"}),
            Some("signing_secret"),
        ),
        (
            "an empty secret",
            json!({"name": "x", "source": "sentry", "signing_secret": " "}),
            Some("signing_secret"),
        ),
        (
            "basic_auth not a boolean",
            json!({"name": "x", "basic_auth": "yes"}),
            Some("basic_auth"),
        ),
    ] {
        let answer = admin.post("/api/v1/tokens", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, field);
    }
    assert_eq!(admin.count("inbound_tokens").await, 2);
    admin.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_the_whole_contract() {
    let admin = TestAdmin::start().await;
    let response = admin
        .client
        .get(admin.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let document: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let contract = [
        ("/api/v1/webhooks", vec!["get", "post"]),
        ("/api/v1/webhooks/{id}", vec!["get", "patch", "delete"]),
        ("/api/v1/webhooks/{id}/reveal-secret", vec!["post"]),
        ("/api/v1/webhooks/{id}/rotate-secret", vec!["post"]),
        ("/api/v1/webhooks/{id}/test", vec!["post"]),
        ("/api/v1/webhooks/{id}/recover", vec!["post"]),
        ("/api/v1/deliveries", vec!["get"]),
        ("/api/v1/deliveries/{id}", vec!["get"]),
        ("/api/v1/deliveries/{id}/retry", vec!["post"]),
        ("/api/v1/incidents", vec!["get"]),
        ("/api/v1/incidents/{id}", vec!["get", "patch"]),
        ("/api/v1/tokens", vec!["get", "post"]),
        ("/api/v1/tokens/{id}", vec!["delete"]),
    ];
    let paths = &document["paths"];
    for (path, methods) in &contract {
        for method in methods {
            let operation = &paths[path][method];
            assert!(operation.is_object(), "{method} {path} is documented");
            assert_eq!(
                operation["security"],
                json!([{"admin_token": []}]),
                "{method} {path} needs the admin token"
            );
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("401"), "{method} {path}");
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}"
            );
        }
    }
    assert!(
        paths["/api/v1/webhooks/alerts"]["post"].is_object(),
        "ingest"
    );
    assert!(paths["/api/v1/openapi.json"]["get"].is_object());
    assert!(paths["/api/v1/openapi.json"]["get"]["security"].is_null());
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(schemes["admin_token"]["type"], "http");
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    assert_eq!(schemes["inbound_token"]["scheme"], "bearer");
    let schemas = &document["components"]["schemas"];
    for name in [
        "Webhook",
        "WebhookWithSecret",
        "NewWebhook",
        "WebhookChange",
        "Delivery",
        "DeliveryDetail",
        "Attempt",
        "Incident",
        "TokenCreated",
        "ErrorBody",
        "EventKind",
    ] {
        assert!(schemas[name].is_object(), "schema {name}");
    }
    assert_eq!(
        schemas["EventKind"]["enum"],
        json!([
            "incidents.opened",
            "incidents.status_changed",
            "incidents.resolved"
        ])
    );
    let create = &paths["/api/v1/webhooks"]["post"];
    assert!(create["responses"]["422"].is_object());
    assert!(create["requestBody"].is_object());
    admin.stop().await;
}

#[tokio::test]
async fn with_postgres_unreachable_it_answers_503() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let proxied = db
        .url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
    let admin = TestAdmin::start_with(db, |config| config.common.database_url = proxied).await;
    proxy.cut();
    let answer = admin.get("/api/v1/webhooks").await;
    assert_error(
        "storage down",
        &answer,
        StatusCode::SERVICE_UNAVAILABLE,
        None,
    );
    assert_eq!(answer.1["error"]["code"], "unavailable");
    proxy.restore();
    wait_for("admin to answer again", DEADLINE, || async {
        let (status, _) = admin.get("/api/v1/webhooks").await;
        (status == StatusCode::OK).then_some(())
    })
    .await;
    admin.stop().await;
}

/// A spawned binary, killed if the test ends before it exits.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The command for the built binary, with only the given environment.
fn binary(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tocsin-admin"));
    command.env_clear();
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

#[tokio::test]
async fn the_token_cli_prints_a_token_that_ingest_accepts() {
    let db = TestDb::new().await;
    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "create", "--name", "grafana"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the token on stdout: {stdout:?}"
    );
    let presented = AccessToken::from_presented(stdout.trim()).expect("a well-formed token");
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let id = tokens::authenticate(&mut conn, &presented)
        .await
        .unwrap()
        .expect("the token is accepted");

    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "list"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let listing = String::from_utf8(output.stdout).unwrap();
    assert!(
        listing.contains(&id.to_string()) && listing.contains("grafana"),
        "{listing}"
    );
    assert!(!listing.contains(&stdout.trim()[17..]), "no secret listed");

    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "revoke", &id.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        None
    );
    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "revoke", &id.to_string()])
        .output()
        .unwrap();
    assert!(!output.status.success(), "revoking twice fails");

    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "create", "--name", ""])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());

    // A token bound to a source, with basic authentication.
    let output = binary(&[("DATABASE_URL", &db.url)])
        .args([
            "token",
            "create",
            "--name",
            "sns",
            "--source",
            "cloudwatch",
            "--basic-auth",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let presented =
        AccessToken::from_presented(String::from_utf8(output.stdout).unwrap().trim()).unwrap();
    let live = tokens::authenticate_all(&mut conn, &[presented])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        live.source,
        Some(tocsin_domain::alerts::AlertFormat::CloudWatch)
    );
    assert!(live.basic_auth && !live.query_token);
    let output = binary(&[("DATABASE_URL", &db.url)])
        .args(["token", "create", "--name", "x", "--source", "nagios"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--source"), "{stderr}");
}

/// Messages waiting in the delivery queue.
async fn waiting(broker: &tocsin_broker::Broker) -> u32 {
    let queue = broker.topology().delivery_queue();
    broker
        .queue_depths()
        .await
        .unwrap()
        .into_iter()
        .find_map(|(name, n)| (name == queue).then_some(n))
        .unwrap()
}

/// Runs the CLI with `env`; (success, stdout, stderr).
fn cli(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let output = binary(env).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn every_cli_subcommand_does_its_job() {
    // migrate: on an empty database it applies every migration, then none.
    let empty = TestDb::empty().await;
    let env = [("DATABASE_URL", empty.url.as_str())];
    let (ok, _, said) = cli(&env, &["migrate"]);
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!(
            "applied {} migration(s)",
            tocsin_storage::migration_count()
        )),
        "{said}"
    );
    let (ok, _, said) = cli(&env, &["migrate"]);
    assert!(ok && said.contains("applied 0 migration(s)"), "{said}");
    let (ok, _, said) = cli(
        &[(
            "DATABASE_URL",
            "postgres://postgres:pw-not-shown@127.0.0.1:1/x",
        )],
        &["migrate"],
    );
    assert!(
        !ok && said.contains("DATABASE_URL") && !said.contains("pw-not-shown"),
        "{said}"
    );

    // deliveries failed | retry | recover, against the delivery log of a running admin.
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let failed = seed_failed_delivery(&mut conn, webhook).await;
    let (pending, _) = seed_delivery(
        &mut conn,
        webhook,
        EventKind::IncidentOpened,
        Uuid::now_v7(),
    )
    .await;
    let url = admin.db.url.clone();
    let env = [("DATABASE_URL", url.as_str())];
    let (ok, listing, said) = cli(
        &env,
        &["deliveries", "failed", "--webhook", &webhook.to_string()],
    );
    assert!(ok, "{said}");
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines[0], "ID\tWEBHOOK\tEVENT\tINCIDENT\tATTEMPTS\tUPDATED");
    assert_eq!(lines.len(), 2, "only the failed delivery: {listing}");
    assert!(
        lines[1].starts_with(&format!("{failed}\t{webhook}\tincidents.opened\t")),
        "{listing}"
    );
    assert!(!listing.contains(&pending.to_string()));

    let (ok, _, said) = cli(&env, &["deliveries", "retry", &failed.to_string()]);
    assert!(
        ok && said.contains(&format!("enqueued a manual attempt of delivery {failed}")),
        "{said}"
    );
    let rows = admin.manual_retry_outbox_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1["delivery_id"], failed.to_string());
    let (ok, _, said) = cli(&env, &["deliveries", "retry", &Uuid::now_v7().to_string()]);
    assert!(!ok && said.contains("no delivery"), "{said}");
    // A succeeded delivery is final: the CLI refuses, as the API does.
    tocsin_testkit::deliveries::record_attempt(
        &mut conn,
        pending,
        tocsin_testkit::deliveries::answered(200),
    )
    .await;
    let (ok, _, said) = cli(&env, &["deliveries", "retry", &pending.to_string()]);
    assert!(!ok && said.contains("succeeded already"), "{said}");
    assert_eq!(
        admin.manual_retry_outbox_rows().await.len(),
        1,
        "nothing enqueued"
    );

    let since = rfc3339(OffsetDateTime::now_utc() - time::Duration::hours(1));
    let (ok, count, said) = cli(
        &env,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            &since,
        ],
    );
    assert!(ok, "{said}");
    assert_eq!(count.trim(), "1", "the one failed delivery: {said}");
    assert_eq!(admin.manual_retry_outbox_rows().await.len(), 2);
    let (ok, _, said) = cli(
        &env,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &Uuid::now_v7().to_string(),
            "--since",
            &since,
        ],
    );
    assert!(!ok && said.contains("no webhook"), "{said}");
    let (ok, _, said) = cli(
        &env,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            "yesterday",
        ],
    );
    assert!(!ok && said.contains("RFC 3339"), "{said}");
    let (status, _) = admin
        .patch(
            &format!("/api/v1/webhooks/{webhook}"),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (ok, _, said) = cli(
        &env,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            &since,
        ],
    );
    assert!(!ok && said.contains("the webhook is disabled"), "{said}");
    let (ok, _, said) = cli(&env, &["deliveries", "retry", &failed.to_string()]);
    assert!(!ok && said.contains("the webhook is disabled"), "{said}");
    assert_eq!(
        admin.manual_retry_outbox_rows().await.len(),
        2,
        "nothing enqueued for a disabled webhook"
    );

    // prune: a failed delivery last changed long ago goes, with its attempts; the rest stays.
    diesel::sql_query(
        "UPDATE deliveries SET updated_at = now() - interval '40 days' WHERE id = $1",
    )
    .bind::<SqlUuid, _>(failed)
    .execute(&mut conn)
    .await
    .unwrap();
    let (ok, _, said) = cli(&env, &["prune", "--retention", "30d"]);
    assert!(ok && said.contains("pruned 1 deliveries"), "{said}");
    assert_eq!(
        admin
            .count(&format!("deliveries WHERE id = '{failed}'"))
            .await,
        0
    );
    assert_eq!(
        admin
            .count(&format!("deliveries WHERE id = '{pending}'"))
            .await,
        1
    );

    // parked list | replay, on this admin's prefix.
    let amqp = amqp_url();
    let prefix = admin.prefix.prefix.clone();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("AMQP_URL", amqp.as_str()),
        ("TOCSIN_AMQP_PREFIX", prefix.as_str()),
    ];
    let broker = CommonConfig::new(&url, &amqp, &prefix).broker("test");
    let parked = DeliveryMessage {
        delivery_id: pending,
        webhook_id: None,
    };
    for body in [parked.to_bytes(), b"garbage".to_vec()] {
        broker
            .publish(Outgoing {
                exchange: broker.topology().parking_exchange(),
                routing_key: String::new(),
                body,
                headers: tocsin_broker::headers_from_json(&json!({"tocsin-parked-reason": "test"})),
            })
            .await
            .unwrap();
    }
    let (ok, listing, said) = cli(&env, &["parked", "list"]);
    assert!(ok, "{said}");
    assert_eq!(
        listing,
        format!("KIND\tID\tREASON\tFROM\ndelivery\t{pending}\ttest\t-\nunreadable\t-\ttest\t-\n")
    );
    // The relay published the attempts this test enqueued; then one more from parking.
    wait_until("the relay to publish every retry", DEADLINE, || async {
        admin.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;
    let before = waiting(&broker).await;
    let (ok, count, said) = cli(&env, &["parked", "replay"]);
    assert!(ok, "{said}");
    assert_eq!(count.trim(), "1", "{said}");
    assert!(said.contains("1 unreadable message(s) left"), "{said}");
    let (_, listing, _) = cli(&env, &["parked", "list"]);
    assert_eq!(
        listing.lines().count(),
        2,
        "only the unreadable one is left: {listing}"
    );
    let after = waiting(&broker).await;
    assert_eq!(
        after,
        before + 1,
        "the attempt is back in the delivery queue"
    );
    broker.close().await;
    admin.stop().await;
}

#[tokio::test]
async fn it_refuses_to_serve_without_a_good_admin_token() {
    let db = TestDb::new().await;
    let output = binary(&[
        ("DATABASE_URL", &db.url),
        ("TOCSIN_ADMIN_ADDR", "127.0.0.1:0"),
    ])
    .output()
    .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TOCSIN_ADMIN_TOKEN"));
    let output = binary(&[
        ("DATABASE_URL", &db.url),
        ("TOCSIN_ADMIN_ADDR", "127.0.0.1:0"),
        ("TOCSIN_ADMIN_TOKEN", "too-short"),
    ])
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TOCSIN_ADMIN_TOKEN"), "{stderr}");
    assert!(
        !stderr.contains("too-short"),
        "the token is not printed: {stderr}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_binary_cleanly() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let amqp = amqp_url();
    let mut child = Running(
        binary(&[
            ("DATABASE_URL", &db.url),
            ("AMQP_URL", &amqp),
            ("TOCSIN_AMQP_PREFIX", &prefix.prefix),
            ("TOCSIN_ADMIN_ADDR", &addr),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "3s"),
            ("TOCSIN_HTTP_WORKERS", "1"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let client = reqwest::Client::new();
    let healthz = format!("http://{addr}/healthz");
    wait_until("the binary to serve /healthz", DEADLINE, || async {
        client
            .get(&healthz)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_for("the binary to exit", DEADLINE, || {
        let exited = child.0.try_wait().unwrap();
        async move { exited }
    })
    .await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test]
async fn wrong_admin_tokens_are_limited_per_address_but_the_right_one_always_passes() {
    let admin = TestAdmin::start().await;
    let client = reqwest::Client::new();
    let call = |token: &'static str| {
        client
            .get(format!("{}/api/v1/webhooks", admin.base))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..5 {
        assert_eq!(call("wrong-token-wrong-token").await.unwrap().status(), 401);
    }
    // Twelve wrong tokens in all from this address: the sixth on are refused with 429.
    for _ in 5..12 {
        let limited = call("wrong-token-wrong-token").await.unwrap();
        assert_eq!(limited.status(), 429);
        let retry_after: u64 = limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=61).contains(&retry_after), "{retry_after}");
        let body: serde_json::Value = limited.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limited");
    }
    // The right token from the same address is never refused: behind an ingress every admin
    // shares that address, and a guesser must not lock them out.
    assert_eq!(call(ADMIN_TOKEN).await.unwrap().status(), 200);
    // A request without any token is not a guess: 401, not 429.
    let bare = client
        .get(format!("{}/api/v1/webhooks", admin.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 401);
    assert_eq!(call("wrong-token-wrong-token").await.unwrap().status(), 429);
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
}
