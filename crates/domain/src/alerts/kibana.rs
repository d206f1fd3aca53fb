//! Kibana (Elastic) alerting rules through a Webhook connector, whose body is a mustache
//! template the user pastes into the rule's action: Tocsin's is
//! `docs/sources/kibana-webhook-body.json` (rule and alert variables). One signal per
//! notification, keyed `kibana:<rule_id>:<alert_id>`: `action_group` `recovered` resolves (the
//! action run "When: Recovered"), any other action group opens. Kibana does not notify about
//! acknowledgement.
//!
//! Kibana rules have no common severity: `severity` (a word or `SEVn`, which the template sets
//! per rule) when given, else the action group's name when it is a severity word (as the SLO
//! burn-rate rule's `critical`, `high`, `medium`, `low`), else SEV3.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let rule_id = body.required_text("rule_id")?;
    let alert_id = body.required_text("alert_id")?;
    let rule_name = body.required_text("rule_name")?;
    let group = body.required_text("action_group")?;
    let action = if group.eq_ignore_ascii_case("recovered") {
        AlertAction::Resolve
    } else {
        AlertAction::Trigger
    };
    let severity = match body.text("severity")? {
        Some(word) => Severity::from_source(word).ok_or_else(|| {
            AlertError::invalid(
                "severity",
                "must be SEV1..SEV5 or a known severity word (critical, high, warning, low, info, ...)",
            )
        })?,
        None => Severity::from_source(group).unwrap_or(Severity::DEFAULT),
    };
    // A rule alerting on one thing names its alert after a group (a host, a service); a query
    // rule names it "query matched", which the title leaves out.
    let title = if alert_id == rule_id || alert_id.eq_ignore_ascii_case("query matched") {
        rule_name.to_owned()
    } else {
        format!("{rule_name} ({alert_id})")
    };
    let mut labels = match body.text("tags")? {
        Some(tags) => super::tag_labels(tags.split(',')),
        None => Vec::new(),
    };
    labels.push(("rule", rule_name.to_owned()));
    labels.extend(body.text("rule_type")?.map(|t| ("rule_type", t.to_owned())));
    labels.extend(body.text("space_id")?.map(|s| ("space", s.to_owned())));
    let description: Vec<&str> = [
        body.text("reason")?,
        body.text("message")?,
        body.text("url")?,
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Kibana, &[rule_id, alert_id]),
        action,
        title: super::title(&title, "rule_name")?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(body.text("url")?),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::alerts::testing::*;

    const ACTIVE: &str = include_str!("../../tests/fixtures/alerts/kibana-active.json");
    const RECOVERED: &str = include_str!("../../tests/fixtures/alerts/kibana-recovered.json");

    #[test]
    fn an_active_alert_opens_and_its_recovery_resolves() {
        let open = one(parse, fixture(ACTIVE));
        assert_eq!(
            open.dedup_key,
            "kibana:6b8e7d10-4f2a-11ef-9c3b-2b7e5d1a0c44:query matched"
        );
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "Checkout error logs");
        assert_eq!(open.severity, Severity::SEV2);
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "env=prod",
                "rule=Checkout error logs",
                "rule_type=.es-query",
                "space=default",
                "team=checkout",
            ]
        );
        assert!(open
            .description
            .unwrap()
            .starts_with("Document count is 412"));
        assert_eq!(one(parse, fixture(ACTIVE)).dedup_key, open.dedup_key);
        let resolved = one(parse, fixture(RECOVERED));
        assert_eq!(resolved.dedup_key, open.dedup_key);
        assert_eq!(resolved.action, AlertAction::Resolve);
    }

    #[test]
    fn alerts_of_a_group_are_named_in_the_title_and_key() {
        let value = with_pointer(fixture(ACTIVE), "/alert_id", json!("checkout-db-2"));
        let signal = one(parse, value);
        assert_eq!(signal.title.as_str(), "Checkout error logs (checkout-db-2)");
        assert!(signal.dedup_key.ends_with(":checkout-db-2"));
    }

    #[test]
    fn severity_from_the_field_else_the_action_group() {
        let mut value = with_pointer(fixture(ACTIVE), "/severity", json!(""));
        assert_eq!(one(parse, value.clone()).severity, Severity::DEFAULT);
        value["action_group"] = json!("critical");
        assert_eq!(one(parse, value).severity, Severity::SEV1);
        assert_eq!(
            error(
                parse,
                with_pointer(fixture(ACTIVE), "/severity", json!("purple"))
            )
            .0,
            "severity"
        );
    }

    #[test]
    fn bad_bodies_name_the_field() {
        for field in ["rule_id", "alert_id", "rule_name", "action_group"] {
            assert_eq!(error(parse, without(fixture(ACTIVE), "", field)).0, field);
        }
        assert_eq!(
            error(parse, with_pointer(fixture(ACTIVE), "/tags", json!(1))).0,
            "tags"
        );
    }
}
