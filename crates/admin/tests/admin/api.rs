//! The set-up the modules of the admin API share: their `TestAdmin` (an admin started with
//! `ADMIN_TOKEN`, and the calls it is sent with that token), the checks of the common error shape
//! and of an object's keys, and the events and deliveries they record in its database.

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::sql_types::{Bytea, Jsonb, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_admin::Config;
use tocsin_domain::{EventKind, EventPayload, IncidentData, IncidentStatus, Severity};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::common::RunningAdmin;

pub(crate) const DEADLINE: Duration = Duration::from_secs(15);
pub(crate) const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The admin under test, with the API helpers of the API's modules.
pub(crate) struct TestAdmin(RunningAdmin);

impl std::ops::Deref for TestAdmin {
    type Target = RunningAdmin;
    fn deref(&self) -> &RunningAdmin {
        &self.0
    }
}

impl TestAdmin {
    pub(crate) async fn start() -> Self {
        Self::start_with(TestDb::new().await, |_| {}).await
    }

    pub(crate) async fn start_with(db: TestDb, adjust: impl FnOnce(&mut Config)) -> Self {
        TestAdmin(RunningAdmin::start(db, ADMIN_TOKEN, adjust).await)
    }

    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        self.send_with(ADMIN_TOKEN, method, path, body).await
    }

    /// [`Self::send`] with another credential (an admin key), as the client `tocsin-admin-tests`.
    pub(crate) async fn send_with(
        &self,
        credential: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, self.url(path))
            .bearer_auth(credential)
            .header("user-agent", "tocsin-admin-tests");
        if let Some(body) = body {
            request = request.json(body);
        }
        answered(self.exchange(request).await)
    }

    pub(crate) async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body)).await
    }

    /// A POST without a body (actions such as retry).
    pub(crate) async fn post_empty(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::POST, path, None).await
    }

    pub(crate) async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(Method::PATCH, path, Some(body)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::DELETE, path, None).await
    }

    /// Sends exactly these bytes with this content type.
    pub(crate) async fn send_raw(
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
        answered(self.exchange(request).await)
    }

    pub(crate) async fn create_webhook(&self, name: &str) -> Value {
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

    pub(crate) async fn count(&self, table_and_condition: &str) -> i64 {
        self.db.count(table_and_condition).await
    }

    /// Outbox rows of manual retries: (headers, payload). (Each new delivery's first attempt
    /// has its own row, with the event.)
    pub(crate) async fn manual_retry_outbox_rows(&self) -> Vec<(Value, Value)> {
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

    pub(crate) async fn stop(self) {
        self.0.stop().await;
    }
}

/// An exchange's status and JSON body (its text when not JSON, `Null` when empty).
pub(crate) fn answered(answer: tocsin_testkit::audit::Answer) -> (StatusCode, Value) {
    let body = if answer.text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&answer.text).unwrap_or(Value::String(answer.text))
    };
    (answer.status, body)
}

pub(crate) async fn read(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

pub(crate) fn id_of(body: &Value) -> Uuid {
    body["id"].as_str().expect("an id").parse().unwrap()
}

pub(crate) fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

pub(crate) fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Asserts the common error shape, the status and (when given) the field named.
pub(crate) fn assert_error(
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
pub(crate) async fn seed_failed_delivery(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> Uuid {
    let (id, _) = seed_delivery(conn, webhook_id, EventKind::IncidentOpened, Uuid::now_v7()).await;
    tocsin_testkit::deliveries::mark_failed(conn, id).await;
    id
}

/// Records an event and one delivery of it to `webhook_id` (and none to other webhooks).
pub(crate) async fn seed_delivery(
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
    outbox::record_events(conn, std::slice::from_ref(&event), &outbox::Wake::Listeners)
        .await
        .unwrap();
    let id =
        tocsin_testkit::deliveries::create_delivery(conn, event.id, kind, incident_id, webhook_id)
            .await;
    (id, event)
}

pub(crate) async fn set_created_at(
    conn: &mut AsyncPgConnection,
    delivery_id: Uuid,
    at: OffsetDateTime,
) {
    diesel::sql_query("UPDATE deliveries SET created_at = $2 WHERE id = $1")
        .bind::<SqlUuid, _>(delivery_id)
        .bind::<Timestamptz, _>(at)
        .execute(conn)
        .await
        .unwrap();
}

pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}
