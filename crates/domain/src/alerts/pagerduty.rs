//! PagerDuty Events API v2 alert events (`trigger`, `acknowledge`, `resolve`), as sent to
//! `https://events.pagerduty.com/v2/enqueue`. One signal per event, keyed
//! `pagerduty:<dedup_key>`. `routing_key` is accepted and ignored: the bearer token
//! authenticates the sender. A trigger without `dedup_key` gets a fresh UUID v4, returned to
//! the sender as the signal's `reply_key` so it can acknowledge or resolve later.
//! `payload.timestamp`, `links` and `images` are neither interpreted nor validated.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object};
use crate::{IncidentTitle, Severity};

/// PagerDuty's own limit on `dedup_key`.
const MAX_DEDUP_KEY_CHARS: usize = 255;
/// PagerDuty's own limit on `payload.summary`.
const MAX_SUMMARY_CHARS: usize = 1024;

pub(super) fn parse(value: Value) -> Result<Vec<AlertSignal>, AlertError> {
    let body = Object::body(&value)?;
    let action = match body.required_text("event_action")? {
        action if action.eq_ignore_ascii_case("trigger") => AlertAction::Trigger,
        action if action.eq_ignore_ascii_case("acknowledge") => AlertAction::Acknowledge,
        action if action.eq_ignore_ascii_case("resolve") => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "event_action",
                "must be one of trigger, acknowledge, resolve",
            ))
        }
    };
    let sent_key = body.text("dedup_key")?;
    if sent_key.is_some_and(|key| key.chars().nth(MAX_DEDUP_KEY_CHARS).is_some()) {
        return Err(AlertError::invalid(
            "dedup_key",
            "must be at most 255 characters",
        ));
    }
    let client = body.text("client")?;
    let client_url = body.text("client_url")?;
    let payload = body.object("payload")?;

    let signal = if action == AlertAction::Trigger {
        let Some(payload) = payload else {
            return Err(AlertError::invalid("payload", "is required for trigger"));
        };
        let summary = payload.required_text("summary")?;
        if summary.chars().nth(MAX_SUMMARY_CHARS).is_some() {
            return Err(AlertError::invalid(
                "payload.summary",
                "must be at most 1024 characters",
            ));
        }
        let severity = match payload.required_text("severity")? {
            word if is_pagerduty_severity(word) => Severity::from_source(word),
            _ => None,
        }
        .ok_or_else(|| {
            AlertError::invalid(
                "payload.severity",
                "must be one of critical, error, warning, info",
            )
        })?;
        let source = payload.required_text("source")?;
        let key = sent_key.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
        // The title holds 500 characters; a longer summary is kept whole in the description.
        let full_summary = (summary.chars().count() > IncidentTitle::MAX_CHARS).then_some(summary);
        AlertSignal {
            dedup_key: super::dedup_key(AlertFormat::PagerDuty, &[&key]),
            action,
            title: super::title(summary, "payload.summary")?,
            severity,
            description: description(full_summary, &payload, client, client_url)?,
            source: super::source(Some(source)),
            reply_key: Some(key),
            labels: custom_details_labels(&payload),
        }
    } else {
        let Some(key) = sent_key else {
            return Err(AlertError::invalid(
                "dedup_key",
                "is required for acknowledge and resolve",
            ));
        };
        // PagerDuty ignores the payload of these events; Tocsin reads what is there for the
        // title and never refuses an unknown severity word here.
        let (title, severity, description, source) = match &payload {
            Some(payload) => {
                let summary = payload.text("summary")?;
                let severity = payload
                    .text("severity")?
                    .and_then(Severity::from_source)
                    .unwrap_or(Severity::DEFAULT);
                let title = match summary {
                    Some(summary) => super::title(summary, "payload.summary")?,
                    None => fallback_title(key)?,
                };
                (
                    title,
                    severity,
                    description(None, payload, client, client_url)?,
                    super::source(payload.text("source")?),
                )
            }
            None => (fallback_title(key)?, Severity::DEFAULT, None, None),
        };
        AlertSignal {
            dedup_key: super::dedup_key(AlertFormat::PagerDuty, &[key]),
            action,
            title,
            severity,
            description,
            source,
            reply_key: Some(key.to_owned()),
            // Only a trigger opens an incident, and only an opened incident keeps labels.
            labels: Default::default(),
        }
    };
    Ok(vec![signal])
}

/// The scalar entries of `payload.custom_details` (strings as they are, numbers and booleans
/// as JSON writes them), as the labels an incident keeps; other entries are left out.
fn custom_details_labels(payload: &Object<'_>) -> std::collections::BTreeMap<String, String> {
    let Some(Value::Object(details)) = payload.get("custom_details") else {
        return Default::default();
    };
    super::labels(details.iter().filter_map(|(key, value)| match value {
        Value::String(text) => Some((key.as_str(), text.clone())),
        Value::Number(_) | Value::Bool(_) => Some((key.as_str(), value.to_string())),
        _ => None,
    }))
}

/// The four severities of the Events API, case-insensitively.
fn is_pagerduty_severity(word: &str) -> bool {
    ["critical", "error", "warning", "info"]
        .iter()
        .any(|known| word.eq_ignore_ascii_case(known))
}

/// Title of an acknowledge or resolve event without a summary.
fn fallback_title(key: &str) -> Result<IncidentTitle, AlertError> {
    super::title(&format!("PagerDuty alert {key}"), "dedup_key")
}

/// The description: the full summary when the title had to cut it, then one `name: value` line
/// for each of `payload.component`, `payload.group`, `payload.class`, `client`, `client_url`,
/// then `custom_details` (a string as is, anything else as compact JSON).
fn description(
    full_summary: Option<&str>,
    payload: &Object<'_>,
    client: Option<&str>,
    client_url: Option<&str>,
) -> Result<Option<String>, AlertError> {
    let mut lines: Vec<String> = Vec::new();
    if let Some(summary) = full_summary {
        lines.push(summary.to_owned());
    }
    let fields = [
        ("component", payload.text("component")?),
        ("group", payload.text("group")?),
        ("class", payload.text("class")?),
        ("client", client),
        ("client_url", client_url),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            lines.push(format!("{name}: {value}"));
        }
    }
    match payload.get("custom_details") {
        None => {}
        Some(Value::String(text)) => lines.push(format!("custom_details: {}", text.trim())),
        Some(details) => lines.push(format!("custom_details: {details}")),
    }
    Ok(super::description(Some(&lines.join("\n"))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse as parse_body;
    use super::*;
    use crate::alerts::testing::*;

    const TRIGGER: &str = include_str!("../../tests/fixtures/alerts/pagerduty-trigger.json");
    const ACKNOWLEDGE: &str =
        include_str!("../../tests/fixtures/alerts/pagerduty-acknowledge.json");
    const RESOLVE: &str = include_str!("../../tests/fixtures/alerts/pagerduty-resolve.json");

    const KEY: &str = "checkout-db/replication-lag";

    fn trigger_with(pointer: &str, new: Value) -> Value {
        with_pointer(fixture(TRIGGER), pointer, new)
    }

    #[test]
    fn trigger_fixture_opens_its_key() {
        let signal = one(parse, fixture(TRIGGER));
        assert_eq!(signal.dedup_key, format!("pagerduty:{KEY}"));
        assert_eq!(signal.action, AlertAction::Trigger);
        assert_eq!(
            signal.title.as_str(),
            "Replication lag on checkout-db-2 is 94s (threshold 30s)"
        );
        assert_eq!(signal.severity, Severity::SEV2);
        assert_eq!(
            signal.description.as_deref(),
            Some(concat!(
                "component: postgres\n",
                "group: checkout\n",
                "class: replication lag\n",
                "client: Nagios\n",
                "client_url: https://nagios.example.com/nagios/\n",
                "custom_details: {\"lag_seconds\":94,\"primary\":\"checkout-db-1\",\"replica\":\"checkout-db-2\"}"
            ))
        );
        assert_eq!(
            signal.source.as_deref(),
            Some("checkout-db-2.prod.example.com")
        );
        assert_eq!(signal.reply_key.as_deref(), Some(KEY));
    }

    #[test]
    fn acknowledge_and_resolve_fixtures_target_the_same_key() {
        let ack = one(parse, fixture(ACKNOWLEDGE));
        assert_eq!(ack.dedup_key, format!("pagerduty:{KEY}"));
        assert_eq!(ack.action, AlertAction::Acknowledge);
        assert_eq!(ack.title.as_str(), format!("PagerDuty alert {KEY}"));
        assert_eq!(ack.severity, Severity::DEFAULT);
        assert_eq!(ack.description, None);
        assert_eq!(ack.source, None);
        assert_eq!(ack.reply_key.as_deref(), Some(KEY));

        let resolve = one(parse, fixture(RESOLVE));
        assert_eq!(resolve.dedup_key, format!("pagerduty:{KEY}"));
        assert_eq!(resolve.action, AlertAction::Resolve);
        assert_eq!(resolve.title.as_str(), format!("PagerDuty alert {KEY}"));
        assert_eq!(resolve.reply_key.as_deref(), Some(KEY));
    }

    #[test]
    fn fixtures_are_detected_as_pagerduty() {
        for text in [TRIGGER, ACKNOWLEDGE, RESOLVE] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::PagerDuty);
        }
    }

    #[test]
    fn a_trigger_without_dedup_key_gets_a_uuid() {
        let value = without(fixture(TRIGGER), "", "dedup_key");
        let first = one(parse, value.clone());
        let key = first.reply_key.clone().unwrap();
        let parsed = uuid::Uuid::parse_str(&key).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(first.dedup_key, format!("pagerduty:{key}"));
        assert_ne!(one(parse, value).reply_key, first.reply_key);

        let blank = trigger_with("/dedup_key", json!("  "));
        assert!(one(parse, blank).reply_key.is_some());
    }

    #[test]
    fn acknowledge_and_resolve_require_a_dedup_key() {
        for text in [ACKNOWLEDGE, RESOLVE] {
            let (field, _) = error(parse, without(fixture(text), "", "dedup_key"));
            assert_eq!(field, "dedup_key");
        }
    }

    #[test]
    fn payload_summary_and_severity_are_used_on_resolve_when_present() {
        let mut value = fixture(RESOLVE);
        value["payload"] = json!({"summary": "Lag back to 0s", "severity": "info", "source": "db"});
        let signal = one(parse, value.clone());
        assert_eq!(signal.title.as_str(), "Lag back to 0s");
        assert_eq!(signal.severity, Severity::SEV5);
        assert_eq!(signal.source.as_deref(), Some("db"));

        value["payload"] = json!({"severity": "purple"});
        assert_eq!(one(parse, value.clone()).severity, Severity::DEFAULT);

        value["payload"] = json!("text");
        assert_eq!(error(parse, value).0, "payload");
    }

    #[test]
    fn severities_map_to_the_table() {
        let table = [
            ("critical", Severity::SEV1),
            ("error", Severity::SEV2),
            ("warning", Severity::SEV3),
            ("info", Severity::SEV5),
            ("CRITICAL", Severity::SEV1),
        ];
        for (word, expected) in table {
            let signal = one(parse, trigger_with("/payload/severity", json!(word)));
            assert_eq!(signal.severity, expected, "{word}");
        }
        for word in ["high", "SEV1", "purple", " "] {
            let (field, _) = error(parse, trigger_with("/payload/severity", json!(word)));
            assert_eq!(field, "payload.severity", "{word}");
        }
    }

    #[test]
    fn trigger_requires_payload_fields() {
        assert_eq!(
            error(parse, without(fixture(TRIGGER), "", "payload")).0,
            "payload"
        );
        for field in ["summary", "severity", "source"] {
            let (path, message) = error(parse, without(fixture(TRIGGER), "/payload", field));
            assert_eq!(path, format!("payload.{field}"));
            assert_eq!(message, "is required");
        }
        let (path, message) = error(parse, trigger_with("/payload/summary", json!("   ")));
        assert_eq!(
            (path.as_str(), message.as_str()),
            ("payload.summary", "must not be empty")
        );
    }

    #[test]
    fn summary_length_is_bounded_by_pagerdutys_limit() {
        let signal = one(
            parse,
            trigger_with("/payload/summary", json!("s".repeat(1024))),
        );
        assert_eq!(
            signal.title.as_str().chars().count(),
            IncidentTitle::MAX_CHARS
        );
        assert!(signal.title.as_str().ends_with('…'));
        let description = signal.description.unwrap();
        assert!(description.starts_with(&"s".repeat(1024)));

        let (field, _) = error(
            parse,
            trigger_with("/payload/summary", json!("s".repeat(1025))),
        );
        assert_eq!(field, "payload.summary");
    }

    #[test]
    fn event_action_must_be_known() {
        assert_eq!(
            error(parse, trigger_with("/event_action", json!("escalate"))).0,
            "event_action"
        );
        assert_eq!(
            error(parse, trigger_with("/event_action", json!(1))).0,
            "event_action"
        );
        assert_eq!(
            error(parse, without(fixture(TRIGGER), "", "event_action")).0,
            "event_action"
        );
    }

    #[test]
    fn dedup_key_is_bounded_and_long_keys_hash() {
        let (field, _) = error(parse, trigger_with("/dedup_key", json!("k".repeat(256))));
        assert_eq!(field, "dedup_key");
        // 255 four-byte characters make a key over 1 024 bytes once namespaced.
        let wide = "🦀".repeat(255);
        let signal = one(parse, trigger_with("/dedup_key", json!(wide)));
        assert!(signal.dedup_key.starts_with("pagerduty:sha256:"));
        assert_eq!(signal.reply_key.as_deref(), Some(wide.as_str()));
    }

    #[test]
    fn wrong_types_name_their_path() {
        let cases = [
            ("/dedup_key", json!(12), "dedup_key"),
            ("/payload", json!([]), "payload"),
            ("/payload/summary", json!(1), "payload.summary"),
            ("/payload/source", json!({}), "payload.source"),
            ("/payload/component", json!(1), "payload.component"),
            ("/payload/group", json!(true), "payload.group"),
            ("/payload/class", json!([]), "payload.class"),
            ("/client", json!(1), "client"),
            ("/client_url", json!(1), "client_url"),
        ];
        for (pointer, new, expected) in cases {
            assert_eq!(
                error(parse, trigger_with(pointer, new)).0,
                expected,
                "{pointer}"
            );
        }
    }

    #[test]
    fn routing_key_and_unknown_fields_are_ignored() {
        let mut value = fixture(TRIGGER);
        value["routing_key"] = json!(42);
        value["payload"]["new_field"] = json!({"x": 1});
        value["something_new"] = json!([null]);
        // Fields Tocsin does not read are not validated either.
        value["links"] = json!("not a list");
        value["images"] = json!(null);
        value["payload"]["timestamp"] = json!(1_700_000_000);
        assert_eq!(one(parse, value), one(parse, fixture(TRIGGER)));
    }
}
