//! Sentry's integration webhooks (an internal integration with "Alert Rule Action" on, and
//! the `issue` resource subscribed). The body says which resource it is about:
//!
//! - `data.event`: an issue alert (`Sentry-Hook-Resource: event_alert`, action `triggered`),
//!   keyed `sentry:issue:<data.event.issue_id>`: opens the issue's incident;
//! - `data.issue`: an issue webhook (`issue`), keyed `sentry:issue:<data.issue.id>`: `created`
//!   and `unresolved` open, `assigned` acknowledges, `resolved` and `archived` (`ignored`)
//!   resolve;
//! - `data.metric_alert`: a metric alert (`metric_alert`), keyed
//!   `sentry:metric_alert:<data.metric_alert.id>` (Sentry's incident of the rule): `critical`
//!   and `warning` open, `resolved` resolves;
//! - `data.installation`: the integration's installation notice, accepted and ignored.
//!
//! Sentry signs each body: `Sentry-Hook-Signature` is the hex HMAC-SHA256 of the body with the
//! integration's client secret ([`sentry_signature_matches`]).

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

/// The header Sentry signs its bodies in.
pub const SENTRY_SIGNATURE_HEADER: &str = "sentry-hook-signature";

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let action = body.required_text("action")?;
    let data = body.required_object("data")?;
    if let Some(event) = data.object("event")? {
        issue_alert(&data, &event).map(Reading::one)
    } else if let Some(issue) = data.object("issue")? {
        issue_webhook(action, &issue).map(Reading::one)
    } else if let Some(alert) = data.object("metric_alert")? {
        metric_alert(action, &data, &alert).map(Reading::one)
    } else if data.get("installation").is_some() {
        Ok(Reading::ignored(
            "a Sentry installation notice changes no incident",
        ))
    } else {
        Err(AlertError::invalid(
            "data",
            "must hold event (issue alert), issue or metric_alert",
        ))
    }
}

/// An issue alert rule fired for `event`.
fn issue_alert(data: &Object<'_>, event: &Object<'_>) -> Result<AlertSignal, AlertError> {
    let issue_id = event.required_id("issue_id")?;
    let title = event.required_text("title")?;
    let rule = data.text("triggered_rule")?;
    let mut labels = tag_pairs(event)?;
    labels.extend(rule.map(|rule| ("rule", rule.to_owned())));
    labels.extend(
        event
            .text("level")?
            .map(|level| ("level", level.to_owned())),
    );
    labels.extend(event.id("project")?.map(|project| ("project", project)));
    let description: Vec<String> = [
        rule.map(|rule| format!("Alert rule: {rule}")),
        event
            .text("culprit")?
            .map(|culprit| format!("Culprit: {culprit}")),
        event.text("web_url")?.map(str::to_owned),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Sentry, &["issue", &issue_id]),
        action: AlertAction::Trigger,
        title: super::title(title, "data.event.title")?,
        severity: level(event.text("level")?),
        description: super::description(Some(&description.join("\n"))),
        source: super::source(event.text("web_url")?),
        reply_key: None,
        labels: super::labels(labels),
    })
}

/// A change of an issue's state.
fn issue_webhook(action: &str, issue: &Object<'_>) -> Result<AlertSignal, AlertError> {
    let action = match action {
        "created" | "unresolved" => AlertAction::Trigger,
        "assigned" => AlertAction::Acknowledge,
        "resolved" | "archived" | "ignored" => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "action",
                "must be one of created, unresolved, assigned, resolved, archived, ignored for an issue",
            ))
        }
    };
    let id = issue.required_id("id")?;
    let title = issue.required_text("title")?;
    let mut labels: Vec<(&str, String)> = Vec::new();
    labels.extend(
        issue
            .text("level")?
            .map(|level| ("level", level.to_owned())),
    );
    labels.extend(issue.text("platform")?.map(|p| ("platform", p.to_owned())));
    if let Some(project) = issue.object("project")? {
        labels.extend(
            project
                .text("slug")?
                .map(|slug| ("project", slug.to_owned())),
        );
    }
    let web_url = issue.text("web_url")?;
    Ok(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Sentry, &["issue", &id]),
        action,
        title: super::title(title, "data.issue.title")?,
        severity: level(issue.text("level")?),
        description: super::description(issue.text("culprit")?),
        source: super::source(web_url),
        reply_key: None,
        labels: super::labels(labels),
    })
}

/// A metric alert rule's incident changed.
fn metric_alert(
    action: &str,
    data: &Object<'_>,
    alert: &Object<'_>,
) -> Result<AlertSignal, AlertError> {
    let (action, severity) = match action {
        "critical" => (AlertAction::Trigger, Severity::SEV1),
        "warning" => (AlertAction::Trigger, Severity::SEV3),
        "resolved" => (AlertAction::Resolve, Severity::DEFAULT),
        _ => {
            return Err(AlertError::invalid(
                "action",
                "must be one of critical, warning, resolved for a metric alert",
            ))
        }
    };
    let id = alert.required_id("id")?;
    let rule = alert.object("alert_rule")?;
    let rule_name = match &rule {
        Some(rule) => rule.text("name")?,
        None => None,
    };
    let (title, field) = match (rule_name, alert.text("title")?) {
        (Some(name), _) => (name, "data.metric_alert.alert_rule.name"),
        (None, Some(title)) => (title, "data.metric_alert.title"),
        (None, None) => (
            data.required_text("description_title")?,
            "data.description_title",
        ),
    };
    let mut labels: Vec<(&str, String)> = Vec::new();
    labels.extend(rule_name.map(|name| ("rule", name.to_owned())));
    if let Some(rule) = &rule {
        labels.extend(rule.text("aggregate")?.map(|a| ("aggregate", a.to_owned())));
        labels.extend(rule.text("dataset")?.map(|d| ("dataset", d.to_owned())));
        labels.extend(
            rule.text("environment")?
                .map(|e| ("environment", e.to_owned())),
        );
    }
    let projects = alert.strings("projects")?;
    if !projects.is_empty() {
        labels.push(("project", projects.join(",")));
    }
    let web_url = data.text("web_url")?;
    let description: Vec<&str> = data
        .text("description_text")?
        .into_iter()
        .chain(web_url)
        .collect();
    Ok(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Sentry, &["metric_alert", &id]),
        action,
        title: super::title(title, field)?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(web_url),
        reply_key: None,
        labels: super::labels(labels),
    })
}

/// An event's `tags`, `[["name", "value"], ...]`, as label pairs.
fn tag_pairs<'a>(event: &Object<'a>) -> Result<Vec<(&'a str, String)>, AlertError> {
    let Some(tags) = event.array("tags")? else {
        return Ok(Vec::new());
    };
    let path = event.path_of("tags");
    tags.iter()
        .enumerate()
        .map(|(i, tag)| match tag.as_array().map(Vec::as_slice) {
            Some([Value::String(name), Value::String(value)]) => Ok((name.as_str(), value.clone())),
            _ => Err(AlertError::invalid(
                format!("{path}[{i}]"),
                "must be a [name, value] pair of strings",
            )),
        })
        .collect()
}

/// Sentry's event levels (`fatal`, `error`, `warning`, `info`, `debug`) by the severity table;
/// SEV3 when absent or unknown.
fn level(word: Option<&str>) -> Severity {
    word.and_then(Severity::from_source)
        .unwrap_or(Severity::DEFAULT)
}

/// Whether `signature` (the `Sentry-Hook-Signature` header: hex) is the HMAC-SHA256 of `body`
/// with `secret`, compared in constant time.
pub fn sentry_signature_matches(secret: &str, body: &[u8], signature: &str) -> bool {
    let Some(tag) = hex(signature.trim()) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    ring::hmac::verify(&key, body, &tag).is_ok()
}

/// Bytes of a hex string (either case); `None` if it is not one.
fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse as parse_body;
    use super::*;
    use crate::alerts::testing::*;

    const ISSUE_ALERT: &str = include_str!("../../tests/fixtures/alerts/sentry-issue-alert.json");
    const ASSIGNED: &str = include_str!("../../tests/fixtures/alerts/sentry-issue-assigned.json");
    const RESOLVED: &str = include_str!("../../tests/fixtures/alerts/sentry-issue-resolved.json");
    const CRITICAL: &str =
        include_str!("../../tests/fixtures/alerts/sentry-metric-alert-critical.json");
    const METRIC_RESOLVED: &str =
        include_str!("../../tests/fixtures/alerts/sentry-metric-alert-resolved.json");

    #[test]
    fn an_issue_alert_opens_and_the_issue_webhooks_acknowledge_and_resolve_it() {
        let open = one(parse, fixture(ISSUE_ALERT));
        assert_eq!(open.dedup_key, "sentry:issue:1117540176");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "ReferenceError: heck is not defined");
        assert_eq!(open.severity, Severity::SEV2);
        assert_eq!(
            open.description.as_deref(),
            Some(concat!(
                "Alert rule: Checkout front-end errors\n",
                "Culprit: ?(<anonymous>)\n",
                "https://sentry.io/organizations/example-org/issues/1117540176/events/e4874d664c3540c1a32eab185f12c5ab/"
            ))
        );
        assert_eq!(open.labels["environment"], "production");
        assert_eq!(open.labels["rule"], "Checkout front-end errors");
        assert_eq!(open.labels["level"], "error");
        assert_eq!(open.labels["project"], "1");
        assert_eq!(one(parse, fixture(ISSUE_ALERT)), open);

        let ack = one(parse, fixture(ASSIGNED));
        assert_eq!(ack.dedup_key, open.dedup_key);
        assert_eq!(ack.action, AlertAction::Acknowledge);
        let resolve = one(parse, fixture(RESOLVED));
        assert_eq!(resolve.dedup_key, open.dedup_key);
        assert_eq!(resolve.action, AlertAction::Resolve);
        assert_eq!(resolve.labels["project"], "front-end");
    }

    #[test]
    fn issue_actions() {
        let cases = [
            ("created", AlertAction::Trigger),
            ("unresolved", AlertAction::Trigger),
            ("assigned", AlertAction::Acknowledge),
            ("resolved", AlertAction::Resolve),
            ("archived", AlertAction::Resolve),
            ("ignored", AlertAction::Resolve),
        ];
        for (action, expected) in cases {
            let value = with_pointer(fixture(RESOLVED), "/action", json!(action));
            assert_eq!(one(parse, value).action, expected, "{action}");
        }
        let value = with_pointer(fixture(RESOLVED), "/action", json!("commented"));
        assert_eq!(error(parse, value).0, "action");
    }

    #[test]
    fn a_metric_alert_opens_and_resolves_its_incident() {
        let open = one(parse, fixture(CRITICAL));
        assert_eq!(open.dedup_key, "sentry:metric_alert:4");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "Too many checkout errors");
        assert_eq!(open.severity, Severity::SEV1);
        assert_eq!(
            open.source.as_deref(),
            Some("https://sentry.io/organizations/example-org/alerts/1/")
        );
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "aggregate=count()",
                "dataset=events",
                "environment=production",
                "project=front-end",
                "rule=Too many checkout errors",
            ]
        );
        let warning = one(
            parse,
            with_pointer(fixture(CRITICAL), "/action", json!("warning")),
        );
        assert_eq!(
            (warning.action, warning.severity),
            (AlertAction::Trigger, Severity::SEV3)
        );

        let resolved = one(parse, fixture(METRIC_RESOLVED));
        assert_eq!(resolved.dedup_key, open.dedup_key);
        assert_eq!(resolved.action, AlertAction::Resolve);
    }

    #[test]
    fn fixtures_are_detected_as_sentry() {
        for text in [ISSUE_ALERT, ASSIGNED, RESOLVED, CRITICAL, METRIC_RESOLVED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::Sentry);
        }
    }

    #[test]
    fn installation_notices_are_ignored() {
        let value = json!({"action": "created", "data": {"installation": {"uuid": "x"}},
                           "installation": {"uuid": "x"}});
        let reading = parse(value).unwrap();
        assert!(reading.signals.is_empty());
        assert!(reading.notice.is_some());
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (without(fixture(ISSUE_ALERT), "", "action"), "action"),
            (without(fixture(ISSUE_ALERT), "", "data"), "data"),
            (
                with_pointer(fixture(ISSUE_ALERT), "/data", json!({})),
                "data",
            ),
            (
                without(fixture(ISSUE_ALERT), "/data/event", "issue_id"),
                "data.event.issue_id",
            ),
            (
                without(fixture(ISSUE_ALERT), "/data/event", "title"),
                "data.event.title",
            ),
            (
                with_pointer(fixture(ISSUE_ALERT), "/data/event/tags/0", json!("x")),
                "data.event.tags[0]",
            ),
            (
                without(fixture(RESOLVED), "/data/issue", "id"),
                "data.issue.id",
            ),
            (
                without(fixture(CRITICAL), "/data/metric_alert", "id"),
                "data.metric_alert.id",
            ),
            (
                with_pointer(fixture(CRITICAL), "/action", json!("triggered")),
                "action",
            ),
            (
                with_pointer(fixture(CRITICAL), "/data/metric_alert/projects", json!([1])),
                "data.metric_alert.projects[0]",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }

    #[test]
    fn the_signature_is_the_hex_hmac_of_the_body() {
        let body = ISSUE_ALERT.as_bytes();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"client-secret");
        let tag = ring::hmac::sign(&key, body);
        let signature: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert!(sentry_signature_matches("client-secret", body, &signature));
        assert!(sentry_signature_matches(
            "client-secret",
            body,
            &signature.to_uppercase()
        ));
        assert!(!sentry_signature_matches("other-secret", body, &signature));
        assert!(!sentry_signature_matches(
            "client-secret",
            b"{}",
            &signature
        ));
        for bad in ["", "zz", "abc", &signature[..62]] {
            assert!(
                !sentry_signature_matches("client-secret", body, bad),
                "{bad}"
            );
        }
    }
}
