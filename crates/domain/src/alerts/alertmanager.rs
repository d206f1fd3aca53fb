//! Prometheus Alertmanager webhook notifications (`version` "4"). A notification reports one
//! alert group, so it becomes one signal keyed `alertmanager:<receiver>:<groupKey>`: the group
//! opens one incident and its resolved notification resolves it. Grafana's webhook sends the
//! same group shape with more fields, so [`Group`] is shared with grafana.rs.
//!
//! Fields Tocsin does not use (`version`, `startsAt`, `endsAt`, `generatorURL`, `fingerprint`,
//! `truncatedAlerts`, `notification_reason`, `routeLabels`, ...) are neither interpreted nor
//! validated, so zero-time and nanosecond timestamps and newer fields pass untouched.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object};
use crate::{IncidentTitle, Severity};

/// Title when the notification has neither a common summary nor an alert name.
const FALLBACK_TITLE: &str = "Alertmanager alert";

pub(super) fn parse(value: Value) -> Result<Vec<AlertSignal>, AlertError> {
    let body = Object::body(&value)?;
    let group = Group::read(&body)?;
    let action = match body.required_text("status")? {
        status if status.eq_ignore_ascii_case("firing") => AlertAction::Trigger,
        status if status.eq_ignore_ascii_case("resolved") => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "status",
                "must be \"firing\" or \"resolved\"",
            ))
        }
    };
    let title = group.title(None, FALLBACK_TITLE)?;
    Ok(vec![AlertSignal {
        dedup_key: super::dedup_key(
            AlertFormat::Alertmanager,
            &[group.receiver, group.group_key],
        ),
        action,
        description: group.description(title.as_str(), None),
        title,
        severity: group.severity(),
        source: super::source(group.external_url),
        reply_key: None,
        labels: group.labels(),
    }])
}

/// The parts of an Alertmanager-shaped group notification that Tocsin uses.
#[derive(Debug)]
pub(super) struct Group<'a> {
    /// `receiver`; absent counts as empty (Alertmanager and Grafana always send it).
    pub(super) receiver: &'a str,
    /// `groupKey`, required.
    pub(super) group_key: &'a str,
    pub(super) alerts: Vec<GroupAlert<'a>>,
    pub(super) group_labels: BTreeMap<&'a str, &'a str>,
    pub(super) common_labels: BTreeMap<&'a str, &'a str>,
    pub(super) common_annotations: BTreeMap<&'a str, &'a str>,
    /// `externalURL`: the sender's own address, used as the incident source.
    pub(super) external_url: Option<&'a str>,
}

/// One entry of `alerts`.
#[derive(Debug)]
pub(super) struct GroupAlert<'a> {
    pub(super) status: Option<&'a str>,
    pub(super) labels: BTreeMap<&'a str, &'a str>,
    pub(super) annotations: BTreeMap<&'a str, &'a str>,
}

impl<'a> Group<'a> {
    /// Reads the group fields, checking the type of each and naming the path of the first
    /// wrong one. `status` is left to the caller: Alertmanager and Grafana treat it differently.
    pub(super) fn read(body: &Object<'a>) -> Result<Self, AlertError> {
        let group_key = body.required_text("groupKey")?;
        let receiver = body.text("receiver")?.unwrap_or("");
        let Some(items) = body.array("alerts")? else {
            return Err(AlertError::invalid("alerts", "is required"));
        };
        let alerts = items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let alert = Object::at(item, format!("alerts[{index}]"))?;
                Ok(GroupAlert {
                    status: alert.text("status")?,
                    labels: alert.string_map("labels")?,
                    annotations: alert.string_map("annotations")?,
                })
            })
            .collect::<Result<Vec<_>, AlertError>>()?;
        Ok(Group {
            receiver,
            group_key,
            alerts,
            group_labels: body.string_map("groupLabels")?,
            common_labels: body.string_map("commonLabels")?,
            common_annotations: body.string_map("commonAnnotations")?,
            external_url: body.text("externalURL")?,
        })
    }

    /// The most severe `severity` label among the firing alerts (among all alerts when none is
    /// firing, as in a resolved notification), falling back to `commonLabels.severity`. Words
    /// [`Severity::from_source`] does not know are ignored; with none left, SEV3.
    pub(super) fn severity(&self) -> Severity {
        let firing: Vec<&GroupAlert<'a>> = self
            .alerts
            .iter()
            .filter(|alert| {
                alert
                    .status
                    .is_some_and(|status| status.eq_ignore_ascii_case("firing"))
            })
            .collect();
        let considered: Vec<&GroupAlert<'a>> = if firing.is_empty() {
            self.alerts.iter().collect()
        } else {
            firing
        };
        considered
            .iter()
            .filter_map(|alert| alert.labels.get("severity"))
            .filter_map(|word| Severity::from_source(word))
            .min()
            .or_else(|| {
                self.common_labels
                    .get("severity")
                    .and_then(|word| Severity::from_source(word))
            })
            .unwrap_or(Severity::DEFAULT)
    }

    /// The incident title, first non-blank of: `commonAnnotations.summary`; `extra` (Grafana's
    /// top-level `title`, with the field it came from); the alert name (`commonLabels.alertname`,
    /// else `groupLabels.alertname`, else `fallback`) followed by the other non-empty group
    /// labels in key order, as in `HighLatency (cluster=eu1, service=api)`.
    pub(super) fn title(
        &self,
        extra: Option<(&str, &str)>,
        fallback: &str,
    ) -> Result<IncidentTitle, AlertError> {
        if let Some(summary) = non_blank(self.common_annotations.get("summary")) {
            return super::title(summary, "commonAnnotations.summary");
        }
        if let Some((text, field)) = extra {
            return super::title(text, field);
        }
        let (name, field) = if let Some(name) = non_blank(self.common_labels.get("alertname")) {
            (name, "commonLabels.alertname")
        } else if let Some(name) = non_blank(self.group_labels.get("alertname")) {
            (name, "groupLabels.alertname")
        } else {
            (fallback, "groupLabels")
        };
        let labels: Vec<String> = self
            .group_labels
            .iter()
            .filter(|(key, value)| **key != "alertname" && !value.trim().is_empty())
            .map(|(key, value)| format!("{key}={}", value.trim()))
            .collect();
        if labels.is_empty() {
            super::title(name, field)
        } else {
            super::title(&format!("{name} ({})", labels.join(", ")), field)
        }
    }

    /// The labels an incident opened by this group keeps: `commonLabels`, else `groupLabels`.
    pub(super) fn labels(&self) -> BTreeMap<String, String> {
        let chosen = if self.common_labels.is_empty() {
            &self.group_labels
        } else {
            &self.common_labels
        };
        super::labels(chosen.iter().map(|(k, v)| (*k, (*v).to_owned())))
    }

    /// The incident description, first present of: `commonAnnotations.description`; `extra`
    /// (Grafana's `message`); the distinct per-alert `description` (else `summary`)
    /// annotations other than the title, one `- ` line each.
    pub(super) fn description(&self, title: &str, extra: Option<&str>) -> Option<String> {
        if let Some(text) = non_blank(self.common_annotations.get("description")) {
            return super::description(Some(text));
        }
        if let Some(text) = extra {
            return super::description(Some(text));
        }
        let mut lines: Vec<&str> = Vec::new();
        for alert in &self.alerts {
            let text = non_blank(alert.annotations.get("description"))
                .or_else(|| non_blank(alert.annotations.get("summary")));
            if let Some(text) = text {
                if text != title && !lines.contains(&text) {
                    lines.push(text);
                }
            }
        }
        let list: Vec<String> = lines.iter().map(|line| format!("- {line}")).collect();
        super::description(Some(&list.join("\n")))
    }
}

/// A map value, trimmed, when it is not blank.
fn non_blank<'a>(value: Option<&&'a str>) -> Option<&'a str> {
    value
        .map(|text| text.trim())
        .filter(|text| !text.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{parse as parse_body, AlertFormat};
    use super::*;
    use crate::alerts::testing::*;

    const FIRING: &str = include_str!("../../tests/fixtures/alerts/alertmanager-0.25-firing.json");
    const RESOLVED: &str =
        include_str!("../../tests/fixtures/alerts/alertmanager-0.25-resolved.json");

    /// Sets `pointer` (a JSON pointer) in a copy of the firing fixture.
    fn firing_with(pointer: &str, new: Value) -> Value {
        with_pointer(fixture(FIRING), pointer, new)
    }

    fn firing_without(field: &str) -> Value {
        without(fixture(FIRING), "", field)
    }

    #[test]
    fn captured_firing_notification_triggers_the_group() {
        let signal = one(parse, fixture(FIRING));
        assert_eq!(
            signal.dedup_key,
            "alertmanager:tocsin:{}:{alertname=\"HighLatency\"}"
        );
        assert_eq!(signal.action, AlertAction::Trigger);
        assert_eq!(signal.title.as_str(), "p99 latency above 2s");
        assert_eq!(signal.severity, Severity::SEV1);
        assert_eq!(signal.description, None);
        assert_eq!(
            signal.source.as_deref(),
            Some("http://alertmanager.example:9093")
        );
        assert_eq!(signal.reply_key, None);
    }

    #[test]
    fn captured_resolved_notification_resolves_the_same_key() {
        let firing = one(parse, fixture(FIRING));
        let resolved = one(parse, fixture(RESOLVED));
        assert_eq!(resolved.action, AlertAction::Resolve);
        assert_eq!(resolved.dedup_key, firing.dedup_key);
        assert_eq!(resolved.title, firing.title);
        assert_eq!(resolved.severity, Severity::SEV1);
    }

    #[test]
    fn fixtures_are_detected_as_alertmanager() {
        for text in [FIRING, RESOLVED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::Alertmanager);
        }
    }

    #[test]
    fn newer_fields_are_ignored() {
        let mut value = fixture(FIRING);
        let body = value.as_object_mut().unwrap();
        body.insert("notification_reason".into(), json!("new_alerts"));
        body.insert("routeLabels".into(), json!({"team": "sre"}));
        body.insert("somethingElse".into(), json!([1, {"x": null}]));
        value["alerts"][0]["newAlertField"] = json!({"nested": true});
        // Fields Tocsin does not read are not validated either.
        value["version"] = json!(4);
        value["truncatedAlerts"] = json!("none");
        value["alerts"][0]["startsAt"] = json!(null);
        value["alerts"][0]["endsAt"] = json!(12);
        assert_eq!(one(parse, value), one(parse, fixture(FIRING)));
    }

    #[test]
    fn title_falls_back_to_alertname_with_group_labels() {
        let mut value = firing_with("/commonAnnotations", json!({}));
        value["groupLabels"] =
            json!({"alertname": "HighLatency", "service": "api", "cluster": "eu1"});
        assert_eq!(
            one(parse, value.clone()).title.as_str(),
            "HighLatency (cluster=eu1, service=api)"
        );

        value["groupLabels"] = json!({"alertname": "HighLatency"});
        assert_eq!(one(parse, value.clone()).title.as_str(), "HighLatency");

        value["commonLabels"] = json!({"service": "api"});
        value["groupLabels"] = json!({"service": "api", "zone": ""});
        assert_eq!(
            one(parse, value.clone()).title.as_str(),
            "Alertmanager alert (service=api)"
        );

        value["groupLabels"] = json!({});
        assert_eq!(one(parse, value).title.as_str(), "Alertmanager alert");
    }

    #[test]
    fn blank_summary_is_skipped_but_a_control_only_title_is_refused() {
        let value = firing_with("/commonAnnotations/summary", json!("   "));
        assert_eq!(one(parse, value).title.as_str(), "HighLatency");

        let value = firing_with("/commonAnnotations/summary", json!("\u{1}\u{7}"));
        assert_eq!(error(parse, value).0, "commonAnnotations.summary");
    }

    #[test]
    fn severity_is_the_most_severe_firing_alert() {
        let mut value = fixture(FIRING);
        value["alerts"] = json!([
            {"status": "firing", "labels": {"severity": "warning"}},
            {"status": "firing", "labels": {"severity": "error"}},
            {"status": "resolved", "labels": {"severity": "critical"}},
            {"status": "firing", "labels": {"severity": "purple"}},
        ]);
        value["commonLabels"] = json!({"alertname": "X"});
        assert_eq!(one(parse, value.clone()).severity, Severity::SEV2);

        value["alerts"] = json!([
            {"status": "resolved", "labels": {"severity": "info"}},
            {"status": "resolved", "labels": {"severity": "low"}},
        ]);
        assert_eq!(one(parse, value.clone()).severity, Severity::SEV4);

        value["alerts"] = json!([{"status": "firing", "labels": {"severity": "SEV2"}}]);
        assert_eq!(one(parse, value.clone()).severity, Severity::SEV2);

        value["alerts"] = json!([{"status": "firing", "labels": {"severity": "purple"}}]);
        assert_eq!(one(parse, value.clone()).severity, Severity::DEFAULT);

        value["alerts"] = json!([{"status": "firing", "labels": {}}]);
        assert_eq!(one(parse, value.clone()).severity, Severity::SEV3);

        value["alerts"] = json!([]);
        value["commonLabels"] = json!({"severity": "minor"});
        assert_eq!(one(parse, value).severity, Severity::SEV4);
    }

    #[test]
    fn description_prefers_common_description_then_lists_alerts() {
        let value = firing_with(
            "/commonAnnotations",
            json!({"summary": "API slow", "description": "  p99 above 2s for 5m  "}),
        );
        assert_eq!(
            one(parse, value).description.as_deref(),
            Some("p99 above 2s for 5m")
        );

        let mut value = firing_with("/commonAnnotations", json!({"summary": "API slow"}));
        value["alerts"] = json!([
            {"status": "firing", "annotations": {"summary": "API slow"}},
            {"status": "firing", "annotations": {"summary": "eu1 slow", "description": "eu1 p99 3s"}},
            {"status": "firing", "annotations": {"summary": "us1 slow"}},
            {"status": "firing", "annotations": {"summary": "us1 slow"}},
        ]);
        assert_eq!(
            one(parse, value).description.as_deref(),
            Some("- eu1 p99 3s\n- us1 slow")
        );

        let mut value = fixture(FIRING);
        value["commonAnnotations"]["description"] = json!("d".repeat(20_000));
        let description = one(parse, value).description.unwrap();
        assert_eq!(description.chars().count(), 10_000);
        assert!(description.ends_with('…'));
    }

    #[test]
    fn source_is_trimmed_and_capped() {
        let value = firing_with(
            "/externalURL",
            json!(format!("  http://{}  ", "a".repeat(400))),
        );
        let source = one(parse, value).source.unwrap();
        assert_eq!(source.chars().count(), 255);
        assert!(source.starts_with("http://a"));

        let value = firing_with("/externalURL", json!(""));
        assert_eq!(one(parse, value).source, None);
    }

    #[test]
    fn status_must_be_firing_or_resolved() {
        let (field, _) = error(parse, firing_with("/status", json!("pending")));
        assert_eq!(field, "status");
        let (field, message) = error(parse, firing_without("status"));
        assert_eq!(
            (field.as_str(), message.as_str()),
            ("status", "is required")
        );
        assert_eq!(
            one(parse, firing_with("/status", json!(" Resolved "))).action,
            AlertAction::Resolve
        );
    }

    #[test]
    fn missing_required_fields_are_named() {
        for field in ["groupKey", "status", "alerts"] {
            assert_eq!(error(parse, firing_without(field)).0, field);
        }
        assert_eq!(
            error(parse, firing_with("/groupKey", json!(" "))).0,
            "groupKey"
        );
    }

    #[test]
    fn missing_receiver_counts_as_empty() {
        let signal = one(parse, firing_without("receiver"));
        assert_eq!(
            signal.dedup_key,
            "alertmanager::{}:{alertname=\"HighLatency\"}"
        );
    }

    #[test]
    fn wrong_types_name_their_path() {
        let cases = [
            ("/groupKey", json!(7), "groupKey"),
            ("/status", json!(true), "status"),
            ("/alerts", json!({}), "alerts"),
            ("/alerts/0", json!("x"), "alerts[0]"),
            ("/alerts/0/labels", json!([]), "alerts[0].labels"),
            (
                "/alerts/0/labels/severity",
                json!(1),
                "alerts[0].labels.severity",
            ),
            ("/alerts/0/annotations", json!("x"), "alerts[0].annotations"),
            ("/alerts/0/status", json!(0), "alerts[0].status"),
            ("/groupLabels", json!(1), "groupLabels"),
            (
                "/commonLabels/service",
                json!(["api"]),
                "commonLabels.service",
            ),
            (
                "/commonAnnotations/summary",
                json!({}),
                "commonAnnotations.summary",
            ),
            ("/externalURL", json!(1), "externalURL"),
            ("/receiver", json!(1), "receiver"),
        ];
        for (pointer, new, expected) in cases {
            assert_eq!(
                error(parse, firing_with(pointer, new)).0,
                expected,
                "{pointer}"
            );
        }
    }

    #[test]
    fn null_counts_as_absent() {
        let mut value = fixture(FIRING);
        value["commonAnnotations"] = Value::Null;
        value["groupLabels"] = Value::Null;
        value["alerts"][0]["annotations"] = Value::Null;
        value["externalURL"] = Value::Null;
        let signal = one(parse, value);
        assert_eq!(signal.title.as_str(), "HighLatency");
        assert_eq!(signal.source, None);
        assert_eq!(
            error(parse, firing_with("/groupKey", Value::Null)).0,
            "groupKey"
        );
    }

    #[test]
    fn body_must_be_an_object() {
        assert_eq!(error(parse, json!([1, 2])).0, "body");
        assert_eq!(error(parse, json!("firing")).0, "body");
    }

    #[test]
    fn over_long_keys_are_hashed() {
        let value = firing_with("/groupKey", json!("g".repeat(2_000)));
        let key = one(parse, value).dedup_key;
        assert!(key.starts_with("alertmanager:sha256:"), "{key}");
        assert_eq!(key.len(), "alertmanager:sha256:".len() + 64);
        let again = one(parse, firing_with("/groupKey", json!("g".repeat(2_000)))).dedup_key;
        assert_eq!(key, again);
        let other = one(parse, firing_with("/groupKey", json!("h".repeat(2_000)))).dedup_key;
        assert_ne!(key, other);
    }
}
