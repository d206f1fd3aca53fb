//! Inbound alert formats (docs/ingest.md): one endpoint accepts Prometheus
//! Alertmanager, Grafana alerting, PagerDuty Events API v2 and Tocsin's generic JSON, detected
//! from the body, and the bodies of the alert sources a token is bound to or `?format=` names
//! (AWS CloudWatch through SNS, Azure Monitor, Google Cloud Monitoring, Sentry, Datadog, New
//! Relic, Kibana, Zabbix, Uptime Kuma, Opsgenie-style senders). Each body is parsed into
//! [`AlertSignal`]s, which say what should happen to which incident, and sometimes a [`Notice`]
//! (a sender's own housekeeping, such as SNS asking for its subscription to be confirmed).

mod alertmanager;
mod azure;
mod cloudwatch;
mod datadog;
mod generic;
mod google;
mod grafana;
mod kibana;
mod newrelic;
mod opsgenie;
mod pagerduty;
mod sentry;
#[cfg(test)]
mod testing;
mod uptimekuma;
mod zabbix;

pub use opsgenie::OpsgenieAction;
pub use sentry::{sentry_signature_matches, SENTRY_SIGNATURE_HEADER};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::{IncidentTitle, Severity};

/// The formats the inbound endpoint understands: one per alert source. A format's name is the
/// source's name everywhere: `?format=`, a token's `source`, metrics labels, the namespace of
/// dedup keys, and so webhook `filters.sources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertFormat {
    Alertmanager,
    Grafana,
    PagerDuty,
    Generic,
    /// AWS CloudWatch alarms, delivered by an Amazon SNS HTTP(S) subscription.
    CloudWatch,
    /// Azure Monitor alerts in the common alert schema.
    Azure,
    /// Google Cloud Monitoring webhooks (schema 1.2).
    Google,
    /// Sentry issue alerts, metric alerts and issue webhooks.
    Sentry,
    /// Datadog monitors, with the payload template in docs/sources/.
    Datadog,
    /// New Relic workflows, with New Relic's default webhook payload.
    NewRelic,
    /// Kibana (Elastic) rules, with the webhook connector body in docs/sources/.
    Kibana,
    /// Zabbix, with the media type in docs/sources/.
    Zabbix,
    /// Uptime Kuma's webhook notification.
    UptimeKuma,
    /// Opsgenie Alert API calls (create, close, acknowledge) from tools that only speak that.
    Opsgenie,
}

impl AlertFormat {
    pub const ALL: [AlertFormat; 14] = [
        AlertFormat::Alertmanager,
        AlertFormat::Grafana,
        AlertFormat::PagerDuty,
        AlertFormat::Generic,
        AlertFormat::CloudWatch,
        AlertFormat::Azure,
        AlertFormat::Google,
        AlertFormat::Sentry,
        AlertFormat::Datadog,
        AlertFormat::NewRelic,
        AlertFormat::Kibana,
        AlertFormat::Zabbix,
        AlertFormat::UptimeKuma,
        AlertFormat::Opsgenie,
    ];

    /// The name used in `?format=`, a token's `source`, metrics labels and dedup-key namespaces.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Alertmanager => "alertmanager",
            AlertFormat::Grafana => "grafana",
            AlertFormat::PagerDuty => "pagerduty",
            AlertFormat::Generic => "generic",
            AlertFormat::CloudWatch => "cloudwatch",
            AlertFormat::Azure => "azure",
            AlertFormat::Google => "google",
            AlertFormat::Sentry => "sentry",
            AlertFormat::Datadog => "datadog",
            AlertFormat::NewRelic => "newrelic",
            AlertFormat::Kibana => "kibana",
            AlertFormat::Zabbix => "zabbix",
            AlertFormat::UptimeKuma => "uptimekuma",
            AlertFormat::Opsgenie => "opsgenie",
        }
    }

    /// Every name, comma-separated, for error messages and documentation.
    pub fn names() -> String {
        AlertFormat::ALL.map(AlertFormat::as_str).join(", ")
    }

    /// The format whose namespace a dedup key is in (`cloudwatch:...` → CloudWatch): the alert
    /// source an incident came from.
    pub fn of_dedup_key(key: &str) -> Option<AlertFormat> {
        key.split_once(':')?.0.parse().ok()
    }
}

impl fmt::Display for AlertFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertFormat {
    type Err = AlertError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AlertFormat::ALL
            .into_iter()
            .find(|format| format.as_str() == s)
            .ok_or_else(|| {
                AlertError::invalid("format", format!("must be one of {}", AlertFormat::names()))
            })
    }
}

/// What an alert asks of its incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertAction {
    /// Open an incident for the key unless one is open already.
    Trigger,
    /// Move the open incident for the key to `acknowledged`.
    Acknowledge,
    /// Resolve the open incident for the key.
    Resolve,
}

/// One instruction parsed from an alert body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSignal {
    /// Identifies the incident across notifications, namespaced by format
    /// (`alertmanager:<receiver>:<groupKey>`, `pagerduty:<dedup_key>`, ...). At most 1 024 bytes.
    pub dedup_key: String,
    pub action: AlertAction,
    pub title: IncidentTitle,
    pub severity: Severity,
    /// Free text (message, annotations), at most 10 000 characters.
    pub description: Option<String>,
    /// Where the alert came from (the sending system or host), at most 255 characters.
    pub source: Option<String>,
    /// The key as the sender should use it again: for PagerDuty, the `dedup_key` that was sent
    /// or generated, returned in the response.
    pub reply_key: Option<String>,
    /// The alert's labels, which an incident it opens keeps (for subscription filters):
    /// Alertmanager's and Grafana's `commonLabels` (else `groupLabels`), PagerDuty's scalar
    /// `custom_details`, the generic format's `labels`. See [`labels`] for the bounds.
    pub labels: BTreeMap<String, String>,
}

/// The parsed body: its format, the signals it carries, and what else it asks of Tocsin. At
/// least one signal, unless there is a notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAlerts {
    pub format: AlertFormat,
    pub signals: Vec<AlertSignal>,
    pub notice: Option<Notice>,
}

/// What a body says besides alert signals: a sender's own housekeeping, or why a valid body
/// asks nothing of any incident. Such a body is accepted (202) and touches no incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Amazon SNS asks the new subscriber to confirm by fetching `subscribe_url` (ingest does,
    /// for hosts its allowlist permits).
    ConfirmSubscription {
        topic_arn: String,
        subscribe_url: String,
    },
    /// Amazon SNS says the endpoint was unsubscribed from the topic.
    Unsubscribed { topic_arn: String },
    /// A valid body that asks nothing of any incident (a test message, a state Tocsin does not
    /// act on); the reason is told back to the sender.
    Ignored(String),
}

/// What one source's parser read from one body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reading {
    signals: Vec<AlertSignal>,
    notice: Option<Notice>,
}

impl Reading {
    fn one(signal: AlertSignal) -> Self {
        Reading {
            signals: vec![signal],
            notice: None,
        }
    }

    fn notice(notice: Notice) -> Self {
        Reading {
            signals: Vec::new(),
            notice: Some(notice),
        }
    }

    fn ignored(reason: impl Into<String>) -> Self {
        Reading::notice(Notice::Ignored(reason.into()))
    }
}

impl From<Vec<AlertSignal>> for Reading {
    fn from(signals: Vec<AlertSignal>) -> Self {
        Reading {
            signals,
            notice: None,
        }
    }
}

/// Why a body was refused. `Syntax` answers 400; `Invalid` answers 422 naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertError {
    #[error("body is not valid JSON: {0}")]
    Syntax(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl AlertError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AlertError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Parses a body in the given format, or detects the format from the body's fields when `None`.
pub fn parse(body: &[u8], format: Option<AlertFormat>) -> Result<ParsedAlerts, AlertError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| AlertError::Syntax(e.to_string()))?;
    let format = match format {
        Some(format) => format,
        None => detect(&value)?,
    };
    let reading = match format {
        AlertFormat::Alertmanager => alertmanager::parse(value)?.into(),
        AlertFormat::Grafana => grafana::parse(value)?.into(),
        AlertFormat::PagerDuty => pagerduty::parse(value)?.into(),
        AlertFormat::Generic => generic::parse(value)?.into(),
        AlertFormat::CloudWatch => cloudwatch::parse(value)?,
        AlertFormat::Azure => azure::parse(value)?,
        AlertFormat::Google => google::parse(value)?,
        AlertFormat::Sentry => sentry::parse(value)?,
        AlertFormat::Datadog => datadog::parse(value)?,
        AlertFormat::NewRelic => newrelic::parse(value)?,
        AlertFormat::Kibana => kibana::parse(value)?,
        AlertFormat::Zabbix => zabbix::parse(value)?,
        AlertFormat::UptimeKuma => uptimekuma::parse(value)?,
        AlertFormat::Opsgenie => opsgenie::parse(value)?,
    };
    Ok(finish(format, reading))
}

/// Parses the body of an Opsgenie Alert API call on an existing alert,
/// `POST /v2/alerts/{identifier}/close` or `/acknowledge`, whose identifier and
/// `identifierType` come from the request's path and query. An empty body counts as `{}`.
pub fn parse_opsgenie_action(
    body: &[u8],
    identifier: &str,
    identifier_type: Option<&str>,
    action: OpsgenieAction,
) -> Result<ParsedAlerts, AlertError> {
    let value: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Object(Map::new())
    } else {
        serde_json::from_slice(body).map_err(|e| AlertError::Syntax(e.to_string()))?
    };
    let reading = opsgenie::parse_action(value, identifier, identifier_type, action)?;
    Ok(finish(AlertFormat::Opsgenie, reading))
}

fn finish(format: AlertFormat, reading: Reading) -> ParsedAlerts {
    ParsedAlerts {
        format,
        signals: reading.signals.into_iter().map(without_nul).collect(),
        notice: reading.notice.map(notice_without_nul),
    }
}

fn notice_without_nul(notice: Notice) -> Notice {
    let clean = |text: String| text.replace('\0', "");
    match notice {
        Notice::ConfirmSubscription {
            topic_arn,
            subscribe_url,
        } => Notice::ConfirmSubscription {
            topic_arn: clean(topic_arn),
            subscribe_url,
        },
        Notice::Unsubscribed { topic_arn } => Notice::Unsubscribed {
            topic_arn: clean(topic_arn),
        },
        Notice::Ignored(reason) => Notice::Ignored(clean(reason)),
    }
}

/// PostgreSQL text cannot hold NUL: drop it from every stored string (titles already turn
/// control characters into spaces).
fn without_nul(mut signal: AlertSignal) -> AlertSignal {
    let strip = |text: &mut String| {
        if text.contains('\0') {
            text.retain(|c| c != '\0');
        }
    };
    strip(&mut signal.dedup_key);
    for text in [
        &mut signal.description,
        &mut signal.source,
        &mut signal.reply_key,
    ]
    .into_iter()
    .flatten()
    {
        strip(text);
    }
    signal
}

/// Detects the format from the body's distinctive fields (docs/ingest.md, "Format detection"):
/// `event_action` or `routing_key` → PagerDuty; an `alerts` field with `orgId`, `state` or
/// `version` "1" → Grafana; any other body with `alerts` → Alertmanager. A body without
/// `dedup_key` (which the generic format requires) may then be one of the vendor shapes that
/// cannot be mistaken: SNS's `Type` and `TopicArn` → CloudWatch; `schemaId`
/// "azureMonitorCommonAlertSchema" → Azure; an `incident` object with a string `version` →
/// Google; an `installation` object with a `data` object → Sentry; `heartbeat` and `monitor`
/// objects with a string `msg` → Uptime Kuma. Anything else → generic. A field whose value is
/// `null` counts as absent.
pub fn detect(value: &serde_json::Value) -> Result<AlertFormat, AlertError> {
    let Some(object) = value.as_object() else {
        return Err(AlertError::invalid("body", "must be a JSON object"));
    };
    let has = |name: &str| object.get(name).is_some_and(|value| !value.is_null());
    let is_string = |name: &str| object.get(name).is_some_and(Value::is_string);
    let is_object = |name: &str| object.get(name).is_some_and(Value::is_object);
    let format = if has("event_action") || has("routing_key") {
        AlertFormat::PagerDuty
    } else if has("alerts") {
        let grafana_version = object.get("version").and_then(Value::as_str) == Some("1");
        if has("orgId") || has("state") || grafana_version {
            AlertFormat::Grafana
        } else {
            AlertFormat::Alertmanager
        }
    } else if has("dedup_key") {
        AlertFormat::Generic
    } else if is_string("Type") && is_string("TopicArn") {
        AlertFormat::CloudWatch
    } else if object.get("schemaId").and_then(Value::as_str) == Some(azure::SCHEMA_ID) {
        AlertFormat::Azure
    } else if is_object("incident") && is_string("version") {
        AlertFormat::Google
    } else if is_object("installation") && is_object("data") {
        AlertFormat::Sentry
    } else if is_object("heartbeat") && is_object("monitor") && is_string("msg") {
        AlertFormat::UptimeKuma
    } else {
        AlertFormat::Generic
    };
    Ok(format)
}

/// Longest dedup key kept as is; longer keys are replaced by a hash (see [`dedup_key`]).
const MAX_DEDUP_KEY_BYTES: usize = 1024;
/// Longest description kept; longer ones are cut.
const MAX_DESCRIPTION_CHARS: usize = 10_000;
/// Longest source kept; longer ones are cut.
const MAX_SOURCE_CHARS: usize = 255;

/// Builds the namespaced dedup key `<format>:<part>:<part>...`. A key over 1 024 bytes becomes
/// `<format>:sha256:<hex SHA-256 of the full key>`: still stable for the same input, and short
/// enough for the database index.
fn dedup_key(format: AlertFormat, parts: &[&str]) -> String {
    let mut key = String::from(format.as_str());
    for part in parts {
        key.push(':');
        key.push_str(part);
    }
    if key.len() <= MAX_DEDUP_KEY_BYTES {
        return key;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{format}:sha256:{hex}")
}

/// Makes an incident title from `raw`, which came from `field`. Control characters become
/// spaces before trimming, so a title made only of them counts as empty (422 naming `field`);
/// an over-long title is cut with an ellipsis rather than refused.
fn title(raw: &str, field: &str) -> Result<IncidentTitle, AlertError> {
    let cleaned: String = raw
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    IncidentTitle::truncating(&cleaned)
        .map_err(|error| AlertError::invalid(field, error.to_string()))
}

/// Cuts `text` to at most `max` characters, marking a cut with a trailing ellipsis.
fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().nth(max).is_none() {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A description: trimmed, `None` when empty, cut to 10 000 characters.
fn description(text: Option<&str>) -> Option<String> {
    let text = text?.trim();
    (!text.is_empty()).then(|| truncate_chars(text, MAX_DESCRIPTION_CHARS))
}

/// Most labels kept; the rest (in key order) are dropped.
const MAX_LABELS: usize = 64;

/// Labels as an incident keeps them: at most 64, keys and values cut to 255 characters, NUL
/// dropped; empty keys are dropped.
fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> BTreeMap<String, String> {
    let clean = |text: &str| truncate_chars(&text.replace('\0', ""), MAX_SOURCE_CHARS);
    pairs
        .into_iter()
        .filter(|(key, _)| !key.trim().is_empty())
        .map(|(key, value)| (clean(key), clean(&value)))
        .take(MAX_LABELS)
        .collect()
}

/// Tags written `key:value` (Datadog's, Opsgenie's and many users' convention) as label pairs,
/// split at the first `:`; a tag without one becomes `<tag>=true`.
fn tag_labels<'a>(tags: impl IntoIterator<Item = &'a str>) -> Vec<(&'a str, String)> {
    tags.into_iter()
        .map(str::trim)
        .filter(|tag| !tag.is_empty())
        .map(|tag| match tag.split_once(':') {
            Some((key, value)) => (key.trim(), value.trim().to_owned()),
            None => (tag, "true".to_owned()),
        })
        .collect()
}

/// A priority `P1`..`P5` (Opsgenie's, Datadog's), case-insensitive, as `SEV1`..`SEV5`.
fn priority(word: &str) -> Option<Severity> {
    match word.trim().as_bytes() {
        [b'P' | b'p', digit @ b'1'..=b'5'] => Severity::ALL.get(usize::from(digit - b'1')).copied(),
        _ => None,
    }
}

/// A source: trimmed, `None` when empty, cut to 255 characters.
fn source(text: Option<&str>) -> Option<String> {
    let text = text?.trim();
    (!text.is_empty()).then(|| truncate_chars(text, MAX_SOURCE_CHARS))
}

/// A JSON object being read field by field, with its path for error messages
/// (`alerts[0].labels`). `null` counts as absent everywhere, as Go senders write nil maps and
/// slices as `null`.
#[derive(Debug, Clone)]
struct Object<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Object<'a> {
    /// The request body, which must be an object (422 naming `body` otherwise).
    fn body(value: &'a Value) -> Result<Self, AlertError> {
        match value {
            Value::Object(map) => Ok(Object {
                map,
                path: String::new(),
            }),
            _ => Err(AlertError::invalid("body", "must be a JSON object")),
        }
    }

    /// `value` as an object found at `path`.
    fn at(value: &'a Value, path: String) -> Result<Self, AlertError> {
        match value {
            Value::Object(map) => Ok(Object { map, path }),
            _ => Err(AlertError::invalid(path, "must be an object")),
        }
    }

    /// The path of a field of this object.
    fn path_of(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|value| !value.is_null())
    }

    /// A string field as sent, or `None` when absent.
    fn string(&self, name: &str) -> Result<Option<&'a str>, AlertError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(AlertError::invalid(self.path_of(name), "must be a string")),
        }
    }

    /// A string field, trimmed; `None` when absent or blank.
    fn text(&self, name: &str) -> Result<Option<&'a str>, AlertError> {
        Ok(self
            .string(name)?
            .map(str::trim)
            .filter(|text| !text.is_empty()))
    }

    /// A string field that must be present and not blank, trimmed.
    fn required_text(&self, name: &str) -> Result<&'a str, AlertError> {
        match self.string(name)? {
            None => Err(AlertError::invalid(self.path_of(name), "is required")),
            Some(text) if text.trim().is_empty() => {
                Err(AlertError::invalid(self.path_of(name), "must not be empty"))
            }
            Some(text) => Ok(text.trim()),
        }
    }

    /// An object field, or `None` when absent.
    fn object(&self, name: &str) -> Result<Option<Object<'a>>, AlertError> {
        self.get(name)
            .map(|value| Object::at(value, self.path_of(name)))
            .transpose()
    }

    /// An array field, or `None` when absent.
    fn array(&self, name: &str) -> Result<Option<&'a [Value]>, AlertError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(_) => Err(AlertError::invalid(self.path_of(name), "must be an array")),
        }
    }

    /// An identifier sent as a string or as an integer (vendors differ, and some change over
    /// time), trimmed; `None` when absent or blank.
    fn id(&self, name: &str) -> Result<Option<String>, AlertError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.trim())
                .filter(|t| !t.is_empty())
                .map(str::to_owned)),
            Some(Value::Number(number)) if number.is_i64() || number.is_u64() => {
                Ok(Some(number.to_string()))
            }
            Some(_) => Err(AlertError::invalid(
                self.path_of(name),
                "must be a string or an integer",
            )),
        }
    }

    /// An [`Object::id`] that must be present.
    fn required_id(&self, name: &str) -> Result<String, AlertError> {
        self.id(name)?
            .ok_or_else(|| AlertError::invalid(self.path_of(name), "is required"))
    }

    /// An object field that must be present.
    fn required_object(&self, name: &str) -> Result<Object<'a>, AlertError> {
        self.object(name)?
            .ok_or_else(|| AlertError::invalid(self.path_of(name), "is required"))
    }

    /// An array of strings, trimmed, blanks dropped; empty when absent. An entry that is not a
    /// string is refused naming `<path>[i]`.
    fn strings(&self, name: &str) -> Result<Vec<&'a str>, AlertError> {
        let Some(items) = self.array(name)? else {
            return Ok(Vec::new());
        };
        let path = self.path_of(name);
        items
            .iter()
            .enumerate()
            .filter(|(_, item)| !item.is_null())
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.trim()),
                _ => Err(AlertError::invalid(
                    format!("{path}[{i}]"),
                    "must be a string",
                )),
            })
            .filter(|text| text.as_ref().map_or(true, |t| !t.is_empty()))
            .collect()
    }

    /// An object of string values (labels, annotations), sorted by key; empty when absent.
    /// A value that is not a string is refused naming `<path>.<key>`.
    fn string_map(&self, name: &str) -> Result<BTreeMap<&'a str, &'a str>, AlertError> {
        let Some(object) = self.object(name)? else {
            return Ok(BTreeMap::new());
        };
        object
            .map
            .iter()
            .map(|(key, value)| match value {
                Value::String(text) => Ok((key.as_str(), text.as_str())),
                _ => Err(AlertError::invalid(object.path_of(key), "must be a string")),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Every sample body, with the format detection must pick for it.
    const FIXTURES: [(&str, AlertFormat); 9] = [
        (
            include_str!("../../tests/fixtures/alerts/alertmanager-0.25-firing.json"),
            AlertFormat::Alertmanager,
        ),
        (
            include_str!("../../tests/fixtures/alerts/alertmanager-0.25-resolved.json"),
            AlertFormat::Alertmanager,
        ),
        (
            include_str!("../../tests/fixtures/alerts/grafana-firing.json"),
            AlertFormat::Grafana,
        ),
        (
            include_str!("../../tests/fixtures/alerts/grafana-resolved.json"),
            AlertFormat::Grafana,
        ),
        (
            include_str!("../../tests/fixtures/alerts/pagerduty-trigger.json"),
            AlertFormat::PagerDuty,
        ),
        (
            include_str!("../../tests/fixtures/alerts/pagerduty-acknowledge.json"),
            AlertFormat::PagerDuty,
        ),
        (
            include_str!("../../tests/fixtures/alerts/pagerduty-resolve.json"),
            AlertFormat::PagerDuty,
        ),
        (
            include_str!("../../tests/fixtures/alerts/generic-firing.json"),
            AlertFormat::Generic,
        ),
        (
            include_str!("../../tests/fixtures/alerts/generic-resolved.json"),
            AlertFormat::Generic,
        ),
    ];

    /// Every sample body of the sources chosen by a token or `?format=`, with its format and
    /// the format detection picks for it (generic for the bodies users template).
    const SOURCE_FIXTURES: [(&str, AlertFormat, AlertFormat); 29] = {
        use AlertFormat::*;
        macro_rules! fixture {
            ($name:literal) => {
                include_str!(concat!("../../tests/fixtures/alerts/", $name))
            };
        }
        [
            (
                fixture!("cloudwatch-sns-alarm.json"),
                CloudWatch,
                CloudWatch,
            ),
            (fixture!("cloudwatch-sns-ok.json"), CloudWatch, CloudWatch),
            (
                fixture!("cloudwatch-sns-subscription-confirmation.json"),
                CloudWatch,
                CloudWatch,
            ),
            (
                fixture!("cloudwatch-sns-unsubscribe-confirmation.json"),
                CloudWatch,
                CloudWatch,
            ),
            (fixture!("azure-fired.json"), Azure, Azure),
            (fixture!("azure-resolved.json"), Azure, Azure),
            (fixture!("google-open.json"), Google, Google),
            (fixture!("google-closed.json"), Google, Google),
            (fixture!("sentry-issue-alert.json"), Sentry, Sentry),
            (fixture!("sentry-issue-assigned.json"), Sentry, Sentry),
            (fixture!("sentry-issue-resolved.json"), Sentry, Sentry),
            (
                fixture!("sentry-metric-alert-critical.json"),
                Sentry,
                Sentry,
            ),
            (
                fixture!("sentry-metric-alert-resolved.json"),
                Sentry,
                Sentry,
            ),
            (fixture!("datadog-triggered.json"), Datadog, Generic),
            (fixture!("datadog-recovered.json"), Datadog, Generic),
            (fixture!("newrelic-activated.json"), NewRelic, Generic),
            (fixture!("newrelic-acknowledged.json"), NewRelic, Generic),
            (fixture!("newrelic-closed.json"), NewRelic, Generic),
            (fixture!("kibana-active.json"), Kibana, Generic),
            (fixture!("kibana-recovered.json"), Kibana, Generic),
            (fixture!("zabbix-problem.json"), Zabbix, Generic),
            (fixture!("zabbix-acknowledged.json"), Zabbix, Generic),
            (fixture!("zabbix-resolved.json"), Zabbix, Generic),
            (fixture!("uptimekuma-down.json"), UptimeKuma, UptimeKuma),
            (fixture!("uptimekuma-up.json"), UptimeKuma, UptimeKuma),
            (fixture!("opsgenie-create.json"), Opsgenie, Generic),
            (fixture!("generic-firing.json"), Generic, Generic),
            (fixture!("pagerduty-trigger.json"), PagerDuty, PagerDuty),
            (fixture!("grafana-firing.json"), Grafana, Grafana),
        ]
    };

    #[test]
    fn every_source_fixture_parses_as_its_source_and_detection_is_as_documented() {
        for (body, format, detected) in SOURCE_FIXTURES {
            let value: Value = serde_json::from_str(body).unwrap();
            assert_eq!(detect(&value).unwrap(), detected, "{body}");
            let parsed = parse(body.as_bytes(), Some(format)).unwrap();
            assert_eq!(parsed.format, format);
            assert_eq!(
                parsed.signals.len() + usize::from(parsed.notice.is_some()),
                1,
                "{body}"
            );
            for signal in &parsed.signals {
                assert!(signal.dedup_key.starts_with(&format!("{format}:")));
            }
            if detected == format {
                assert_eq!(parse(body.as_bytes(), None).unwrap(), parsed);
            }
        }
    }

    #[test]
    fn a_body_with_a_dedup_key_is_still_generic() {
        // Every body the generic format accepts is detected as before.
        let cases = [
            json!({"title": "t", "dedup_key": "k", "Type": "Notification", "TopicArn": "a"}),
            json!({"title": "t", "dedup_key": "k", "schemaId": "azureMonitorCommonAlertSchema"}),
            json!({"title": "t", "dedup_key": "k", "incident": {}, "version": "1.2"}),
            json!({"title": "t", "dedup_key": "k", "installation": {}, "data": {}}),
            json!({"title": "t", "dedup_key": "k", "heartbeat": {}, "monitor": {}, "msg": "m"}),
        ];
        for value in cases {
            assert_eq!(detect(&value).unwrap(), AlertFormat::Generic, "{value}");
        }
    }

    #[test]
    fn opsgenie_actions_take_an_empty_body() {
        for body in [&b""[..], b"  ", b"{}"] {
            let parsed =
                parse_opsgenie_action(body, "a/b", Some("alias"), OpsgenieAction::Close).unwrap();
            assert_eq!(parsed.format, AlertFormat::Opsgenie);
            assert_eq!(parsed.signals[0].dedup_key, "opsgenie:a/b");
            assert_eq!(parsed.signals[0].action, AlertAction::Resolve);
        }
        assert!(matches!(
            parse_opsgenie_action(b"{", "a", None, OpsgenieAction::Close),
            Err(AlertError::Syntax(_))
        ));
    }

    #[test]
    fn priorities_and_tags() {
        assert_eq!(priority("P1"), Some(Severity::SEV1));
        assert_eq!(priority(" p5 "), Some(Severity::SEV5));
        for bad in ["P0", "P6", "P", "P12", "high"] {
            assert_eq!(priority(bad), None, "{bad}");
        }
        assert_eq!(
            tag_labels(["env:prod", " a : b:c ", "solo", " "]),
            [
                ("env", "prod".to_owned()),
                ("a", "b:c".to_owned()),
                ("solo", "true".to_owned())
            ]
        );
    }

    #[test]
    fn every_format_gives_the_labels_an_incident_keeps() {
        let labels_of = |index: usize| {
            let parsed = parse(FIXTURES[index].0.as_bytes(), None).unwrap();
            parsed.signals[0]
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        // Alertmanager and Grafana: commonLabels; PagerDuty: scalar custom_details; generic: labels.
        assert_eq!(
            labels_of(0),
            "alertname=HighLatency,service=api,severity=critical"
        );
        assert_eq!(
            labels_of(2),
            "alertname=High memory usage,grafana_folder=Infrastructure,severity=critical,team=checkout"
        );
        assert_eq!(
            labels_of(4),
            "lag_seconds=94,primary=checkout-db-1,replica=checkout-db-2"
        );
        assert_eq!(labels_of(7), "env=prod,job=backup-nightly,team=platform");
        // Bounded: 64 at most, long keys and values cut, empty keys dropped.
        let many: Vec<(&str, String)> = (0..100)
            .map(|i| (if i == 0 { " " } else { "k" }, format!("{i}")))
            .collect();
        assert_eq!(labels(many).len(), 1);
        let long = "x".repeat(300);
        let cut = labels([(long.as_str(), long.clone())]);
        let (key, value) = cut.iter().next().unwrap();
        assert_eq!((key.chars().count(), value.chars().count()), (255, 255));
        let pairs: Vec<(String, String)> =
            (0..100).map(|i| (format!("k{i:03}"), "v".into())).collect();
        assert_eq!(
            labels(pairs.iter().map(|(k, v)| (k.as_str(), v.clone()))).len(),
            MAX_LABELS
        );
    }

    #[test]
    fn detection_picks_the_format_of_every_fixture() {
        for (body, format) in FIXTURES {
            let value: Value = serde_json::from_str(body).unwrap();
            assert_eq!(detect(&value).unwrap(), format, "{body}");
            let parsed = parse(body.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, format);
            assert_eq!(parsed.signals.len(), 1);
            assert!(parsed.signals[0].dedup_key.starts_with(format.as_str()));
            assert_eq!(parse(body.as_bytes(), Some(format)).unwrap(), parsed);
        }
    }

    #[test]
    fn detection_rules() {
        let cases = [
            (json!({"event_action": "trigger"}), AlertFormat::PagerDuty),
            (
                json!({"routing_key": "x", "alerts": []}),
                AlertFormat::PagerDuty,
            ),
            (json!({"alerts": [], "orgId": 1}), AlertFormat::Grafana),
            (json!({"alerts": [], "state": "ok"}), AlertFormat::Grafana),
            (json!({"alerts": [], "version": "1"}), AlertFormat::Grafana),
            (
                json!({"alerts": [], "version": "4"}),
                AlertFormat::Alertmanager,
            ),
            (json!({"alerts": []}), AlertFormat::Alertmanager),
            (
                json!({"alerts": null, "groupKey": "g"}),
                AlertFormat::Generic,
            ),
            (json!({"title": "t", "orgId": 1}), AlertFormat::Generic),
            (json!({}), AlertFormat::Generic),
        ];
        for (value, format) in cases {
            assert_eq!(detect(&value).unwrap(), format, "{value}");
        }
        for value in [json!([]), json!("x"), json!(1), json!(null)] {
            assert_eq!(
                detect(&value),
                Err(AlertError::invalid("body", "must be a JSON object"))
            );
        }
    }

    #[test]
    fn an_explicit_format_overrides_detection() {
        // Grafana's body is a superset of Alertmanager's.
        let (grafana, _) = FIXTURES[2];
        let parsed = parse(grafana.as_bytes(), Some(AlertFormat::Alertmanager)).unwrap();
        assert_eq!(parsed.format, AlertFormat::Alertmanager);
        assert!(parsed.signals[0]
            .dedup_key
            .starts_with("alertmanager:tocsin:"));

        let (generic, _) = FIXTURES[7];
        let error = parse(generic.as_bytes(), Some(AlertFormat::PagerDuty)).unwrap_err();
        assert_eq!(error, AlertError::invalid("event_action", "is required"));
    }

    #[test]
    fn syntax_errors_and_non_objects() {
        assert!(matches!(parse(b"{", None), Err(AlertError::Syntax(_))));
        assert!(matches!(parse(b"", None), Err(AlertError::Syntax(_))));
        assert!(matches!(
            parse(b"\xff\xfe", None),
            Err(AlertError::Syntax(_))
        ));
        for format in AlertFormat::ALL {
            let error = parse(b"[1]", Some(format)).unwrap_err();
            assert!(
                matches!(&error, AlertError::Invalid { field, .. } if field == "body"),
                "{format}: {error:?}"
            );
        }
    }

    #[test]
    fn format_names_round_trip() {
        for format in AlertFormat::ALL {
            assert_eq!(format.as_str().parse::<AlertFormat>().unwrap(), format);
            let key = dedup_key(format, &["a:b"]);
            assert_eq!(AlertFormat::of_dedup_key(&key), Some(format));
        }
        assert_eq!(AlertFormat::of_dedup_key("nagios:x"), None);
        assert_eq!(AlertFormat::of_dedup_key("generic"), None);
        assert!("prometheus".parse::<AlertFormat>().is_err());
    }

    #[test]
    fn long_keys_are_hashed_deterministically() {
        let short = dedup_key(AlertFormat::Generic, &["a", "b"]);
        assert_eq!(short, "generic:a:b");
        let exact = "k".repeat(MAX_DEDUP_KEY_BYTES - "generic:".len());
        assert_eq!(
            dedup_key(AlertFormat::Generic, &[&exact]).len(),
            MAX_DEDUP_KEY_BYTES
        );
        let long = format!("{exact}k");
        let hashed = dedup_key(AlertFormat::Generic, &[&long]);
        // SHA-256 of "generic:" followed by 1 017 "k"s.
        let digest =
            ring::digest::digest(&ring::digest::SHA256, format!("generic:{long}").as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hashed, format!("generic:sha256:{hex}"));
    }

    #[test]
    fn truncation_counts_characters() {
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("héllo!", 5), "héll…");
        assert_eq!(truncate_chars("", 0), "");
        assert_eq!(description(Some("  \n ")), None);
        assert_eq!(source(Some(" host ")).as_deref(), Some("host"));
    }

    // Property tests: no input panics, and every accepted body yields bounded signals.

    /// Field names the parsers read, so generated objects reach deep into them.
    const KNOWN_KEYS: &[&str] = &[
        "receiver",
        "status",
        "alerts",
        "labels",
        "annotations",
        "severity",
        "summary",
        "description",
        "alertname",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "version",
        "groupKey",
        "truncatedAlerts",
        "orgId",
        "state",
        "title",
        "message",
        "values",
        "event_action",
        "routing_key",
        "dedup_key",
        "payload",
        "source",
        "component",
        "group",
        "class",
        "custom_details",
        "client",
        "client_url",
        "links",
        "images",
        "timestamp",
        "Type",
        "TopicArn",
        "Message",
        "SubscribeURL",
        "AlarmName",
        "NewStateValue",
        "AlarmArn",
        "Trigger",
        "Dimensions",
        "schemaId",
        "data",
        "essentials",
        "alertId",
        "alertRule",
        "monitorCondition",
        "configurationItems",
        "incident",
        "incident_id",
        "policy_user_labels",
        "documentation",
        "event",
        "issue",
        "metric_alert",
        "issue_id",
        "tags",
        "aggreg_key",
        "transition",
        "priority",
        "id",
        "rule_id",
        "alert_id",
        "action_group",
        "event_id",
        "event_value",
        "event_update_status",
        "event_tags",
        "heartbeat",
        "monitor",
        "msg",
        "alias",
        "details",
    ];

    /// Values the parsers give meaning to.
    const KNOWN_WORDS: &[&str] = &[
        "firing",
        "resolved",
        "ok",
        "alerting",
        "no_data",
        "trigger",
        "acknowledge",
        "resolve",
        "acknowledged",
        "critical",
        "error",
        "warning",
        "info",
        "SEV1",
        "sev5",
        "4",
        "1",
        "",
        " ",
        "\u{0}\u{1b}",
        "Notification",
        "SubscriptionConfirmation",
        "ALARM",
        "OK",
        "INSUFFICIENT_DATA",
        "azureMonitorCommonAlertSchema",
        "Fired",
        "Resolved",
        "Sev0",
        "open",
        "closed",
        "triggered",
        "assigned",
        "Recovered",
        "P1",
        "ACTIVATED",
        "CLOSED",
        "recovered",
        "0",
        "{\"AlarmName\":\"a\",\"NewStateValue\":\"ALARM\"}",
    ];

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(KNOWN_KEYS).prop_map(str::to_owned),
            1 => "[a-zA-Z_.\\[\\]]{0,8}",
        ]
    }

    fn json_value() -> BoxedStrategy<Value> {
        let leaf = prop_oneof![
            1 => Just(Value::Null),
            1 => any::<bool>().prop_map(Value::Bool),
            1 => any::<i64>().prop_map(Value::from),
            1 => any::<u64>().prop_map(Value::from),
            1 => any::<f64>().prop_filter_map("finite", |f| {
                serde_json::Number::from_f64(f).map(Value::Number)
            }),
            3 => prop::sample::select(KNOWN_WORDS).prop_map(Value::from),
            2 => any::<String>().prop_map(Value::String),
            // Long text: exercises truncation and the hashing of long dedup keys.
            1 => ("[a-z é🦀\u{7}]{1,3}", 100usize..1_500).prop_map(|(unit, n)| Value::String(unit.repeat(n))),
        ];
        leaf.prop_recursive(5, 96, 8, |inner| {
            prop_oneof![
                1 => prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                3 => prop::collection::btree_map(key(), inner, 0..10)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
        .boxed()
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        /// Replace the n-th node (pre-order, modulo the node count) with a value.
        Replace(usize, Value),
        /// Remove a field of the n-th node if it is a non-empty object.
        Remove(usize, usize),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), json_value()).prop_map(|(n, value)| Mutation::Replace(n, value)),
            (any::<usize>(), any::<usize>()).prop_map(|(n, k)| Mutation::Remove(n, k)),
        ]
    }

    fn node_count(value: &Value) -> usize {
        1 + match value {
            Value::Array(items) => items.iter().map(node_count).sum(),
            Value::Object(map) => map.values().map(node_count).sum(),
            _ => 0,
        }
    }

    fn nth_node<'v>(value: &'v mut Value, n: &mut usize) -> Option<&'v mut Value> {
        if *n == 0 {
            return Some(value);
        }
        *n -= 1;
        match value {
            Value::Array(items) => items.iter_mut().find_map(|item| nth_node(item, n)),
            Value::Object(map) => map.values_mut().find_map(|item| nth_node(item, n)),
            _ => None,
        }
    }

    fn mutate(value: &mut Value, mutation: Mutation) {
        let count = node_count(value);
        match mutation {
            Mutation::Replace(n, new) => {
                if let Some(node) = nth_node(value, &mut (n % count)) {
                    *node = new;
                }
            }
            Mutation::Remove(n, k) => {
                if let Some(Value::Object(map)) = nth_node(value, &mut (n % count)) {
                    if let Some(key) = map.keys().nth(k % map.len().max(1)).cloned() {
                        map.remove(&key);
                    }
                }
            }
        }
    }

    /// Parses `body` with detection and with every explicit format, checking the invariants.
    fn check(body: &[u8]) -> Result<(), TestCaseError> {
        let formats = std::iter::once(None).chain(AlertFormat::ALL.into_iter().map(Some));
        for format in formats {
            match parse(body, format) {
                Ok(parsed) => {
                    prop_assert!(!parsed.signals.is_empty() || parsed.notice.is_some());
                    if let Some(format) = format {
                        prop_assert_eq!(parsed.format, format);
                    }
                    for signal in &parsed.signals {
                        prop_assert!(signal.dedup_key.len() <= MAX_DEDUP_KEY_BYTES);
                        prop_assert!(signal.dedup_key.starts_with(parsed.format.as_str()));
                        let title = signal.title.as_str();
                        prop_assert!(!title.is_empty());
                        prop_assert!(title.chars().count() <= IncidentTitle::MAX_CHARS);
                        prop_assert_eq!(title.trim(), title);
                        prop_assert!(!title.chars().any(char::is_control));
                        if let Some(description) = &signal.description {
                            prop_assert!(!description.is_empty());
                            prop_assert!(description.chars().count() <= MAX_DESCRIPTION_CHARS);
                        }
                        if let Some(source) = &signal.source {
                            prop_assert!(!source.is_empty());
                            prop_assert!(source.chars().count() <= MAX_SOURCE_CHARS);
                        }
                    }
                }
                Err(AlertError::Invalid { field, .. }) => prop_assert!(!field.is_empty()),
                Err(AlertError::Syntax(_)) => {}
            }
        }
        Ok(())
    }

    /// Cases per property: `PROPTEST_CASES` when set (as proptest reads it), else 512.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(512)
    }

    #[test]
    fn hostile_bodies_are_refused_by_every_parser() {
        let nested = |open: &str, close: &str, depth: usize| {
            format!("{}{}", open.repeat(depth), close.repeat(depth)).into_bytes()
        };
        let syntax: Vec<Vec<u8>> = vec![
            nested("[", "]", 10_000),
            nested(r#"{"alerts":"#, "}", 10_000),
            nested(r#"{"payload":"#, "}", 10_000),
            "[".repeat(100_000).into_bytes(),
            b"{\"title\":\"\xff\xfe\"}".to_vec(),
            br#"{"title":"\ud800"}"#.to_vec(),
            br#"{"title":"t","orgId":1e400}"#.to_vec(),
            br#"{"title":"t","severity":-1e400}"#.to_vec(),
            b"\xef\xbb\xbf{}".to_vec(),
        ];
        for body in &syntax {
            let formats = std::iter::once(None).chain(AlertFormat::ALL.into_iter().map(Some));
            for format in formats {
                assert!(
                    matches!(parse(body, format), Err(AlertError::Syntax(_))),
                    "{format:?}: {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(40)])
                );
            }
        }
        // Numbers JSON can hold but no field takes: refused naming the field, or ignored.
        for number in [
            "18446744073709551616",
            "-9223372036854775809",
            "1e308",
            "-0",
            "1.5",
        ] {
            let bodies = [
                (
                    format!(r#"{{"title":{number}}}"#),
                    AlertFormat::Generic,
                    "title",
                ),
                (
                    format!(r#"{{"event_action":"trigger","payload":{{"summary":{number}}}}}"#),
                    AlertFormat::PagerDuty,
                    "payload.summary",
                ),
                (
                    format!(
                        r#"{{"receiver":"r","status":"firing","groupKey":"g","alerts":[{{"status":"firing","labels":{{"alertname":{number}}}}}]}}"#
                    ),
                    AlertFormat::Alertmanager,
                    "alerts[0].labels.alertname",
                ),
            ];
            for (body, format, field) in bodies {
                match parse(body.as_bytes(), Some(format)) {
                    Err(AlertError::Invalid { field: refused, .. }) => {
                        assert_eq!(refused, field, "{body}")
                    }
                    other => panic!("{body}: {other:?}"),
                }
            }
            // Grafana's `orgId` must be an integer (of any size `i64` holds).
            let (grafana, _) = FIXTURES[2];
            let grafana = grafana.replacen(r#""orgId": 1"#, &format!(r#""orgId": {number}"#), 1);
            match parse(grafana.as_bytes(), None) {
                Ok(parsed) => assert_eq!(parsed.format, AlertFormat::Grafana),
                Err(AlertError::Invalid { field, .. }) => assert_eq!(field, "orgId", "{number}"),
                Err(error) => panic!("{number}: {error:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
            check(&body)?;
        }

        #[test]
        fn arbitrary_json_never_panics(value in json_value()) {
            check(&serde_json::to_vec(&value).unwrap())?;
        }

        #[test]
        fn mutated_fixtures_never_panic(
            index in 0..FIXTURES.len() + SOURCE_FIXTURES.len(),
            mutations in prop::collection::vec(mutation(), 0..4),
        ) {
            let body = match FIXTURES.get(index) {
                Some((body, _)) => body,
                None => SOURCE_FIXTURES[index - FIXTURES.len()].0,
            };
            let mut value: Value = serde_json::from_str(body).unwrap();
            for mutation in mutations {
                mutate(&mut value, mutation);
            }
            check(&serde_json::to_vec(&value).unwrap())?;
        }
    }
}
