//! Google Cloud Monitoring webhook notifications (schema `version` "1.2", from a notification
//! channel of type "Webhook with basic authentication" or "with token authentication"). One
//! signal per notification, keyed `google:<incident.incident_id>`: `state` "open" opens and
//! "closed" resolves. Cloud Monitoring sends no notification on acknowledgement.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let incident = body.required_object("incident")?;
    let id = incident.required_id("incident_id")?;
    let action = match incident.required_text("state")? {
        state if state.eq_ignore_ascii_case("open") => AlertAction::Trigger,
        state if state.eq_ignore_ascii_case("closed") => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "incident.state",
                "must be open or closed",
            ))
        }
    };
    let documentation = incident.object("documentation")?;
    let subject = match &documentation {
        Some(documentation) => documentation.text("subject")?,
        None => None,
    };
    let policy = incident.text("policy_name")?;
    let condition = incident.text("condition_name")?;
    let summary = incident.text("summary")?;
    let fallback = format!("Google Cloud Monitoring incident {id}");
    let (title, field) = [
        (subject, "incident.documentation.subject"),
        (policy, "incident.policy_name"),
        (condition, "incident.condition_name"),
        (summary, "incident.summary"),
    ]
    .into_iter()
    .find_map(|(text, field)| text.map(|text| (text, field)))
    .unwrap_or((fallback.as_str(), "incident.incident_id"));

    let user_labels = incident.string_map("policy_user_labels")?;
    // "Critical", "Error", "Warning" or "No severity"; else the policy's `severity` label.
    let severity = incident
        .text("severity")?
        .and_then(Severity::from_source)
        .or_else(|| {
            user_labels
                .get("severity")
                .and_then(|w| Severity::from_source(w))
        })
        .unwrap_or(Severity::DEFAULT);

    let mut labels: Vec<(&str, String)> = user_labels
        .iter()
        .map(|(k, v)| (*k, (*v).to_owned()))
        .collect();
    labels.extend(policy.map(|p| ("policy", p.to_owned())));
    labels.extend(
        incident
            .text("scoping_project_id")?
            .map(|p| ("project", p.to_owned())),
    );
    if let Some(resource) = incident.object("resource")? {
        labels.extend(
            resource
                .text("type")?
                .map(|t| ("resource_type", t.to_owned())),
        );
    }
    if let Some(metric) = incident.object("metric")? {
        labels.extend(metric.text("type")?.map(|t| ("metric", t.to_owned())));
    }

    let content = match &documentation {
        Some(documentation) => documentation.text("content")?,
        None => None,
    };
    let description: Vec<&str> = summary
        .into_iter()
        .chain(content)
        .chain(incident.text("url")?)
        .collect();
    let source = match incident.text("resource_display_name")? {
        Some(name) => Some(name),
        None => incident.text("resource_name")?,
    };
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Google, &[&id]),
        action,
        title: super::title(title, field)?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(source),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse as parse_body;
    use super::*;
    use crate::alerts::testing::*;

    const OPEN: &str = include_str!("../../tests/fixtures/alerts/google-open.json");
    const CLOSED: &str = include_str!("../../tests/fixtures/alerts/google-closed.json");

    fn open_with(pointer: &str, new: Value) -> Value {
        with_pointer(fixture(OPEN), pointer, new)
    }

    #[test]
    fn open_opens_and_closed_resolves_the_same_key() {
        let open = one(parse, fixture(OPEN));
        assert_eq!(open.dedup_key, "google:0.nvp3l2x8kqw1");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "Checkout DB CPU above 90%");
        assert_eq!(open.severity, Severity::SEV1);
        assert_eq!(open.source.as_deref(), Some("checkout-db-1"));
        let description = open.description.clone().unwrap();
        assert!(description.starts_with("CPU utilization for checkout-db-1"));
        assert!(description.contains("runbooks.example.com/checkout-db-cpu"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "env=prod",
                "metric=compute.googleapis.com/instance/cpu/utilization",
                "policy=Checkout DB CPU high",
                "project=checkout-prod-4711",
                "resource_type=gce_instance",
                "team=checkout",
            ]
        );
        assert_eq!(one(parse, fixture(OPEN)), open);

        let closed = one(parse, fixture(CLOSED));
        assert_eq!(closed.dedup_key, open.dedup_key);
        assert_eq!(closed.action, AlertAction::Resolve);
    }

    #[test]
    fn fixtures_are_detected_as_google() {
        for text in [OPEN, CLOSED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::Google);
        }
    }

    #[test]
    fn title_falls_back_to_policy_condition_summary_and_id() {
        let mut value = without(fixture(OPEN), "/incident/documentation", "subject");
        assert_eq!(
            one(parse, value.clone()).title.as_str(),
            "Checkout DB CPU high"
        );
        value["incident"]["policy_name"] = Value::Null;
        assert_eq!(
            one(parse, value.clone()).title.as_str(),
            "VM Instance - CPU utilization"
        );
        value["incident"]["condition_name"] = json!("");
        assert!(one(parse, value.clone())
            .title
            .as_str()
            .starts_with("CPU utilization for checkout-db-1"));
        value["incident"]["summary"] = Value::Null;
        assert_eq!(
            one(parse, value).title.as_str(),
            "Google Cloud Monitoring incident 0.nvp3l2x8kqw1"
        );
    }

    #[test]
    fn severities() {
        let cases = [
            ("Critical", Severity::SEV1),
            ("Error", Severity::SEV2),
            ("Warning", Severity::SEV3),
            ("No severity", Severity::DEFAULT),
        ];
        for (word, expected) in cases {
            assert_eq!(
                one(parse, open_with("/incident/severity", json!(word))).severity,
                expected
            );
        }
        let mut value = open_with("/incident/severity", json!("No severity"));
        value["incident"]["policy_user_labels"]["severity"] = json!("low");
        assert_eq!(one(parse, value).severity, Severity::SEV4);
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (without(fixture(OPEN), "", "incident"), "incident"),
            (open_with("/incident", json!([])), "incident"),
            (
                without(fixture(OPEN), "/incident", "incident_id"),
                "incident.incident_id",
            ),
            (
                open_with("/incident/incident_id", json!(1.5)),
                "incident.incident_id",
            ),
            (
                without(fixture(OPEN), "/incident", "state"),
                "incident.state",
            ),
            (
                open_with("/incident/state", json!("acked")),
                "incident.state",
            ),
            (
                open_with("/incident/policy_user_labels/team", json!(1)),
                "incident.policy_user_labels.team",
            ),
            (
                open_with("/incident/documentation", json!("x")),
                "incident.documentation",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
