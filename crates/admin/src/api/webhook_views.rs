//! The API's views of webhooks (what `/api/v1/webhooks` answers and takes), with their
//! OpenAPI schemas: the webhook with its health and filters, a new webhook, a change of one,
//! and what the recover and test actions answer.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize};
use time::OffsetDateTime;
use tocsin_domain::{EventKind, WebhookFilters, WebhookHeaders, WebhookOrdering};
use tocsin_storage::health::{self, WebhookHealth};
use tocsin_storage::webhooks::{self as repo, NewWebhook as NewRecord};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::AdminError;
use crate::schema;
use crate::state::AdminState;
use crate::store::WebhookPatch;
use crate::validation::{self, FiltersInput, WebhookInput};

/// An outbound webhook. Its secret is shown only at creation, by `reveal-secret` and by
/// `rotate-secret`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Webhook {
    pub id: Uuid,
    #[schema(example = "ops pager")]
    pub name: String,
    #[schema(example = "https://hooks.example.com/tocsin")]
    pub url: String,
    /// The event kinds it receives.
    #[schema(value_type = Vec<schema::EventKind>)]
    pub events: BTreeSet<EventKind>,
    pub retry: Retry,
    /// A disabled webhook makes no request: its unfinished deliveries were stopped, and events
    /// that come while it is disabled are listed as deliveries `waiting` (`webhook_disabled`),
    /// sent once it is enabled again and recovered (`POST .../recover`).
    pub enabled: bool,
    /// Why it is disabled: `disabled by an operator`, or auto-disable's reason with its
    /// figures; `null` while enabled.
    pub disabled_reason: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub disabled_at: Option<OffsetDateTime>,
    pub filters: Filters,
    /// Headers sent with every delivery; values read as `***`.
    #[schema(example = json!({"x-team-key": "***"}))]
    pub headers: BTreeMap<String, String>,
    /// At most this many automatic attempts a second, across every dispatcher; `null`: no
    /// limit.
    #[schema(minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<u32>,
    /// In what order it receives an incident's events.
    #[schema(value_type = schema::Ordering)]
    pub ordering: WebhookOrdering,
    pub health: Health,
    /// Until when the secret before the last rotation still signs beside the current one
    /// (`null` when no rotation is in its grace period).
    #[serde(with = "time::serde::rfc3339::option")]
    pub previous_secret_expires_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl Webhook {
    pub fn new(webhook: &repo::Webhook, health: WebhookHealth) -> Self {
        let now = OffsetDateTime::now_utc();
        Webhook {
            disabled_reason: webhook.disabled_reason.clone(),
            disabled_at: webhook.disabled_at,
            filters: Filters::from(&webhook.filters),
            headers: webhook.headers.masked(),
            rate_limit_per_second: webhook.rate_limit.map(|r| r.per_second()),
            ordering: webhook.ordering,
            health: health.into(),
            id: webhook.id,
            name: webhook.name.as_str().to_owned(),
            url: webhook.url.as_str().to_owned(),
            events: webhook.events.clone(),
            retry: Retry {
                max_attempts: webhook.retry.max_attempts(),
                timeout_ms: webhook.retry.timeout_ms(),
            },
            enabled: webhook.enabled,
            previous_secret_expires_at: webhook
                .previous_secret
                .as_ref()
                .map(|(_, expires_at)| *expires_at)
                .filter(|expires_at| *expires_at > now),
            created_at: webhook.created_at,
            updated_at: webhook.updated_at,
        }
    }
}

/// Loads the health of `webhooks` (one query) and makes their API views.
pub async fn views(
    state: &AdminState,
    webhooks: &[repo::Webhook],
) -> Result<Vec<Webhook>, AdminError> {
    let ids: Vec<Uuid> = webhooks.iter().map(|w| w.id).collect();
    let mut conn = state.conn().await?;
    let mut health = health::for_webhooks(&mut conn, &ids).await?;
    Ok(webhooks
        .iter()
        .map(|w| Webhook::new(w, health.remove(&w.id).unwrap_or_default()))
        .collect())
}

pub(super) async fn view(
    state: &AdminState,
    webhook: &repo::Webhook,
) -> Result<Webhook, AdminError> {
    Ok(views(state, std::slice::from_ref(webhook)).await?.remove(0))
}

/// The health of webhook `id` (the default when it has none, or does not exist). A change
/// reads it before it writes, and answers with it: no change of a webhook alters its health,
/// and a failed read after the commit would answer an error for a change that was made (a
/// client retrying a rotation would then rotate twice and drop the secret its receivers
/// know).
pub(super) async fn health_before_change(
    state: &AdminState,
    id: Uuid,
) -> Result<WebhookHealth, AdminError> {
    let mut conn = state.conn().await?;
    Ok(health::for_webhooks(&mut conn, &[id])
        .await?
        .remove(&id)
        .unwrap_or_default())
}

/// Which of the events it subscribes to a webhook receives. A filter left out lets every
/// event through; each given must match: the incident's severity is listed; its alert format
/// (`alertmanager`, `grafana`, `pagerduty`, `generic`) or source name is listed; it carries
/// every label pair listed (the labels of the alert that opened it). Test events ignore
/// filters.
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<schema::Severity>>, min_items = 1, max_items = 50, example = json!(["SEV1", "SEV2"]))]
    pub severities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 50, example = json!(["alertmanager"]))]
    pub sources: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = json!({"team": "db"}))]
    pub labels: Option<BTreeMap<String, String>>,
}

impl<'de> Deserialize<'de> for Filters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            severities: Option<Vec<String>>,
            #[serde(default)]
            sources: Option<Vec<String>>,
            #[serde(default)]
            labels: Option<BTreeMap<String, String>>,
        }
        let fields: Fields = from_object(d)?;
        Ok(Filters {
            severities: fields.severities,
            sources: fields.sources,
            labels: fields.labels,
        })
    }
}

impl From<&WebhookFilters> for Filters {
    fn from(filters: &WebhookFilters) -> Self {
        Filters {
            severities: filters
                .severities
                .as_ref()
                .map(|set| set.iter().map(|s| s.as_str().to_owned()).collect()),
            sources: filters
                .sources
                .as_ref()
                .map(|set| set.iter().cloned().collect()),
            labels: filters.labels.clone(),
        }
    }
}

impl Filters {
    fn input(&self) -> FiltersInput<'_> {
        FiltersInput {
            severities: self.severities.as_deref(),
            sources: self.sources.as_deref(),
            labels: self.labels.as_ref(),
        }
    }
}

/// How a webhook's target has been answering, from every recorded attempt (interrupted ones,
/// which are the dispatcher's doing, do not count).
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Failed attempts since the last successful one.
    pub consecutive_failures: i32,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_success_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_failure_at: Option<OffsetDateTime>,
    /// The last failure's error kind and detail.
    #[schema(example = "http_status: the target answered 500")]
    pub last_error: Option<String>,
    /// Successful attempts over all attempts in the last hour (five-minute buckets); `null`
    /// without any attempt.
    #[schema(minimum = 0, maximum = 1)]
    pub success_rate_1h: Option<f64>,
    /// The same over the last 24 hours.
    #[schema(minimum = 0, maximum = 1)]
    pub success_rate_24h: Option<f64>,
}

impl From<WebhookHealth> for Health {
    fn from(h: WebhookHealth) -> Self {
        Health {
            consecutive_failures: h.consecutive_failures,
            last_success_at: h.last_success_at,
            last_failure_at: h.last_failure_at,
            last_error: h.last_error,
            success_rate_1h: h.success_rate_1h,
            success_rate_24h: h.success_rate_24h,
        }
    }
}

/// Retry settings: how many attempts of the schedule (0 s, 1 min, 5 min, 30 min, 2 h) a
/// delivery gets, and how long one attempt may take.
#[derive(Debug, Serialize, ToSchema)]
pub struct Retry {
    #[schema(minimum = 1, maximum = 5, example = 5)]
    pub max_attempts: u8,
    #[schema(minimum = 1000, maximum = 30000, example = 10000)]
    pub timeout_ms: u32,
}

/// A webhook with its current signing secret.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookWithSecret {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// `whsec_` + base64 of the HMAC-SHA256 key (Standard Webhooks).
    #[schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    pub secret: String,
}

impl WebhookWithSecret {
    pub(super) async fn load(
        state: &AdminState,
        webhook: &repo::Webhook,
    ) -> Result<Self, AdminError> {
        Ok(Self::with_view(webhook, view(state, webhook).await?))
    }

    /// A webhook just created: it has no outcomes yet, so its health is not read (a failed
    /// read would answer an error for a webhook that was created).
    pub(super) fn created(webhook: &repo::Webhook) -> Self {
        Self::new(webhook, WebhookHealth::default())
    }

    /// A webhook with the health read before it was changed.
    pub(super) fn new(webhook: &repo::Webhook, health: WebhookHealth) -> Self {
        Self::with_view(webhook, Webhook::new(webhook, health))
    }

    fn with_view(webhook: &repo::Webhook, view: Webhook) -> Self {
        WebhookWithSecret {
            webhook: view,
            secret: webhook.secret.expose().to_owned(),
        }
    }
}

/// A page of webhooks, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub items: Vec<Webhook>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A new webhook.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// At most 100 characters as sent and at least 1 once surrounding spaces are trimmed, no
    /// control characters.
    #[schema(min_length = 1, max_length = 100, example = "ops pager")]
    pub name: String,
    /// An absolute http or https URL, without credentials, at most 2048 bytes.
    #[schema(example = "https://hooks.example.com/tocsin")]
    pub url: String,
    /// At least one event kind.
    #[schema(value_type = Vec<schema::EventKind>, min_items = 1)]
    pub events: Vec<String>,
    #[serde(default)]
    pub retry: Option<RetryInput>,
    /// Default `true`.
    #[serde(default)]
    #[schema(default = true)]
    pub enabled: Option<bool>,
    /// Default: none (every event it subscribes to).
    #[serde(default)]
    pub filters: Option<Filters>,
    /// Sent with every delivery. Names are HTTP header names (kept in lower case), at most 20;
    /// `content-type`, `content-length`, `host`, `user-agent`, `webhook-*`, `tocsin-*` and the
    /// names that frame the body or connection (`content-encoding`, `transfer-encoding`,
    /// `connection`, `keep-alive`, `upgrade`, `te`, `trailer`, `proxy-*`) are reserved.
    /// Values: printable ASCII, at most 1000 characters.
    #[serde(default)]
    #[schema(example = json!({"X-Team-Key": "k1"}))]
    pub headers: Option<BTreeMap<String, String>>,
    /// 1 to 10000; default `null`, no limit.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<i64>,
    /// Default `none`.
    #[serde(default)]
    #[schema(value_type = Option<schema::Ordering>, default = "none")]
    pub ordering: Option<WebhookOrdering>,
}

/// Retry settings in a request; a field left out takes its default at creation and keeps its
/// value in a change. Only a JSON object is one (see its `Deserialize`).
#[derive(Debug, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryInput {
    /// 1 to 5 (default 5).
    #[schema(value_type = u8, minimum = 1, maximum = 5, default = 5, required = false)]
    pub max_attempts: Option<i64>,
    /// 1000 to 30000 (default 10000).
    #[schema(value_type = u32, minimum = 1000, maximum = 30000, default = 10000, required = false)]
    pub timeout_ms: Option<i64>,
}

impl<'de> Deserialize<'de> for RetryInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default, deserialize_with = "present")]
            max_attempts: Option<i64>,
            #[serde(default, deserialize_with = "present")]
            timeout_ms: Option<i64>,
        }
        let fields: Fields = from_object(d)?;
        Ok(RetryInput {
            max_attempts: fields.max_attempts,
            timeout_ms: fields.timeout_ms,
        })
    }
}

/// A struct from a JSON object only: serde's derive also takes a struct from an array of its
/// fields, so `"retry": []` would pass as "no change". Errors keep their paths.
fn from_object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    struct Object<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Object(std::marker::PhantomData))
}

/// A change to a webhook: any subset of the fields, each validated as at creation. `null` is
/// refused: leave a field out to keep it.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookChange {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = String)]
    pub url: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Vec<schema::EventKind>, min_items = 1)]
    pub events: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = RetryInput)]
    pub retry: Option<RetryInput>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub enabled: Option<bool>,
    /// Replaces the filters; `{}` removes them.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Filters)]
    pub filters: Option<Filters>,
    /// Replaces the headers; a value given as `***` keeps the value that header has.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub headers: Option<BTreeMap<String, String>>,
    /// `null` removes the limit.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<Option<i64>>,
    /// Changing it to `none` releases the deliveries waiting for their incident's order within
    /// a second.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = schema::Ordering)]
    pub ordering: Option<WebhookOrdering>,
}

/// Bulk recovery: send what the webhook missed since a time.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Recover {
    /// RFC 3339.
    #[schema(format = DateTime, example = "2026-11-22T00:00:00Z")]
    pub since: String,
}

/// A replay: the webhook's past events of a window that it has no delivery of.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// RFC 3339: events that happened at or after this time.
    #[schema(format = DateTime, example = "2026-11-01T00:00:00Z")]
    pub since: String,
    /// RFC 3339: events that happened before this time; default now. At or before `since`,
    /// the window is empty and nothing is replayed.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub until: Option<String>,
    /// Only these kinds (each one the webhook subscribes to); default every kind it subscribes
    /// to.
    #[serde(default)]
    #[schema(value_type = Option<Vec<schema::EventKind>>, min_items = 1)]
    pub events: Option<Vec<String>>,
}

/// A replay, as asked for and as far as it got.
#[derive(Debug, Serialize, ToSchema)]
pub struct Replay {
    pub id: Uuid,
    pub webhook_id: Uuid,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub until: Option<OffsetDateTime>,
    /// `null`: every kind the webhook subscribes to.
    #[schema(value_type = Option<Vec<schema::EventKind>>)]
    pub events: Option<Vec<String>>,
    /// Deliveries created so far (events the webhook had a delivery of get none).
    pub created: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When the replay reached the end of its window; `null` while dispatchers work on it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<tocsin_storage::replays::Replay> for Replay {
    fn from(r: tocsin_storage::replays::Replay) -> Self {
        Replay {
            id: r.id,
            webhook_id: r.webhook_id,
            since: r.since,
            until: r.until,
            events: r.kinds,
            created: r.created,
            created_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}

/// How many deliveries a bulk recovery enqueued.
#[derive(Debug, Serialize, ToSchema)]
pub struct Recovered {
    /// Failed deliveries given one manual attempt each.
    pub retried: usize,
    /// Deliveries that waited because the webhook was disabled when their events came, now
    /// due (their automatic attempts follow the retry schedule).
    pub sent_waiting: usize,
}

/// The test event recorded for a webhook.
#[derive(Debug, Serialize, ToSchema)]
pub struct TestEventAccepted {
    pub event_id: Uuid,
    #[schema(value_type = schema::EventKind)]
    pub event: EventKind,
    /// The sample incident's id (no such incident is stored).
    pub incident_id: Uuid,
}

/// A field that may be left out, given, or `null` (`Some(None)`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A field that may be left out but, when given, must not be `null`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl NewWebhook {
    pub(super) fn validate(&self) -> Result<NewRecord, AdminError> {
        let retry = self.retry.as_ref();
        Ok(validation::new_webhook(&WebhookInput {
            name: Some(&self.name),
            url: Some(&self.url),
            events: Some(&self.events),
            max_attempts: retry.and_then(|r| r.max_attempts),
            timeout_ms: retry.and_then(|r| r.timeout_ms),
            enabled: self.enabled,
            filters: self.filters.as_ref().map(Filters::input),
            headers: self.headers.as_ref(),
            current_headers: None,
            rate_limit_per_second: self.rate_limit_per_second.map(Some),
            ordering: self.ordering,
        })?)
    }
}

impl WebhookChange {
    pub(super) fn validate(
        &self,
        current_headers: Option<&WebhookHeaders>,
    ) -> Result<WebhookPatch, AdminError> {
        let retry = self.retry.as_ref();
        Ok(validation::webhook_patch(&WebhookInput {
            name: self.name.as_deref(),
            url: self.url.as_deref(),
            events: self.events.as_deref(),
            max_attempts: retry.and_then(|r| r.max_attempts),
            timeout_ms: retry.and_then(|r| r.timeout_ms),
            enabled: self.enabled,
            filters: self.filters.as_ref().map(Filters::input),
            headers: self.headers.as_ref(),
            current_headers,
            rate_limit_per_second: self.rate_limit_per_second,
            ordering: self.ordering,
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tocsin_domain::RetrySettings;

    fn field_of(error: AdminError) -> String {
        match error {
            AdminError::Invalid { field, .. } => field,
            other => panic!("not a 422: {other:?}"),
        }
    }

    fn new(events: &[&str]) -> NewWebhook {
        NewWebhook {
            name: "ops".into(),
            url: "https://example.com/hook".into(),
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            retry: None,
            enabled: None,
            filters: None,
            headers: None,
            rate_limit_per_second: None,
            ordering: None,
        }
    }

    #[test]
    fn creation_defaults_and_field_names() {
        let record = new(&["incidents.opened", "incidents.opened"])
            .validate()
            .unwrap();
        assert_eq!(record.events.len(), 1);
        assert_eq!(record.retry, RetrySettings::default());
        assert!(record.enabled);
        assert_eq!(field_of(new(&[]).validate().unwrap_err()), "events");
        assert_eq!(
            field_of(
                new(&["incidents.opened", "incident.closed"])
                    .validate()
                    .unwrap_err()
            ),
            "events[1]"
        );
        let mut bad = new(&["incidents.resolved"]);
        bad.retry = Some(RetryInput {
            max_attempts: Some(6),
            timeout_ms: None,
        });
        assert_eq!(field_of(bad.validate().unwrap_err()), "retry.max_attempts");
        bad.retry = Some(RetryInput {
            max_attempts: Some(2),
            timeout_ms: Some(999),
        });
        assert_eq!(field_of(bad.validate().unwrap_err()), "retry.timeout_ms");
        bad.retry = Some(RetryInput {
            max_attempts: Some(2),
            timeout_ms: None,
        });
        let record = bad.validate().unwrap();
        assert_eq!(
            (record.retry.max_attempts(), record.retry.timeout_ms()),
            (2, 10_000)
        );
    }

    #[test]
    fn nulls_are_refused_in_a_change() {
        let parsed: Result<WebhookChange, _> = serde_json::from_str(r#"{"name": null}"#);
        assert!(parsed.is_err());
        let parsed: WebhookChange =
            serde_json::from_str(r#"{"retry": {"timeout_ms": 2000}}"#).unwrap();
        let patch = parsed.validate(None).unwrap();
        assert_eq!((patch.max_attempts, patch.timeout_ms), (None, Some(2000)));
    }
}
