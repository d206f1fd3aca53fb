//! New Relic workflows through a webhook destination, with New Relic's default webhook payload
//! template (`docs/sources/newrelic-payload.hbs` is that template, to paste where it was
//! changed). One signal per notification, keyed `newrelic:<id>` (`{{issueId}}`): `state`
//! `CREATED` and `ACTIVATED` open, `ACKNOWLEDGED` acknowledges, `CLOSED` resolves.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let id = body.required_id("id")?;
    let action = match body.required_text("state")?.to_ascii_uppercase().as_str() {
        "CREATED" | "ACTIVATED" => AlertAction::Trigger,
        "ACKNOWLEDGED" => AlertAction::Acknowledge,
        "CLOSED" => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "state",
                "must be one of CREATED, ACTIVATED, ACKNOWLEDGED, CLOSED",
            ))
        }
    };
    let title = body.required_text("title")?;
    let severity = match body.text("priority")? {
        None => Severity::DEFAULT,
        Some(word) => match word.to_ascii_uppercase().as_str() {
            "CRITICAL" => Severity::SEV1,
            "HIGH" => Severity::SEV2,
            "MEDIUM" => Severity::SEV3,
            "LOW" => Severity::SEV4,
            _ => {
                return Err(AlertError::invalid(
                    "priority",
                    "must be one of CRITICAL, HIGH, MEDIUM, LOW",
                ))
            }
        },
    };
    let entities = body.strings("impactedEntities")?;
    let policies = body.strings("alertPolicyNames")?;
    let conditions = body.strings("alertConditionNames")?;
    let sources = body.strings("sources")?;
    let mut labels: Vec<(&str, String)> = Vec::new();
    for (name, list) in [
        ("policy", &policies),
        ("condition", &conditions),
        ("entity", &entities),
    ] {
        if !list.is_empty() {
            labels.push((name, list.join(",")));
        }
    }
    labels.extend(
        body.text("workflowName")?
            .map(|w| ("workflow", w.to_owned())),
    );
    labels.extend(body.text("priority")?.map(|p| ("priority", p.to_owned())));
    let description: Vec<String> = [
        (!sources.is_empty()).then(|| format!("Sources: {}", sources.join(", "))),
        body.text("issueUrl")?.map(str::to_owned),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::NewRelic, &[&id]),
        action,
        title: super::title(title, "title")?,
        severity,
        description: super::description(Some(&description.join("\n"))),
        source: super::source(
            (!entities.is_empty())
                .then(|| entities.join(", "))
                .as_deref(),
        ),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::alerts::testing::*;

    const ACTIVATED: &str = include_str!("../../tests/fixtures/alerts/newrelic-activated.json");
    const ACKNOWLEDGED: &str =
        include_str!("../../tests/fixtures/alerts/newrelic-acknowledged.json");
    const CLOSED: &str = include_str!("../../tests/fixtures/alerts/newrelic-closed.json");

    #[test]
    fn activated_opens_acknowledged_acknowledges_closed_resolves() {
        let open = one(parse, fixture(ACTIVATED));
        assert_eq!(
            open.dedup_key,
            "newrelic:3f1d2a7e-8c4b-4f0e-9a6d-5b2c1e0f7a93"
        );
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(
            open.title.as_str(),
            "checkout-api query result is > 5.0 for 5 minutes on 'Checkout API error rate'"
        );
        assert_eq!(open.severity, Severity::SEV1);
        assert_eq!(open.source.as_deref(), Some("checkout-api"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "condition=Checkout API error rate",
                "entity=checkout-api",
                "policy=Checkout golden signals",
                "priority=CRITICAL",
                "workflow=Checkout to Tocsin",
            ]
        );
        assert_eq!(one(parse, fixture(ACTIVATED)), open);
        let ack = one(parse, fixture(ACKNOWLEDGED));
        assert_eq!(
            (ack.dedup_key.as_str(), ack.action),
            (open.dedup_key.as_str(), AlertAction::Acknowledge)
        );
        let closed = one(parse, fixture(CLOSED));
        assert_eq!(
            (closed.dedup_key.as_str(), closed.action),
            (open.dedup_key.as_str(), AlertAction::Resolve)
        );
    }

    #[test]
    fn priorities() {
        for (word, expected) in [
            ("CRITICAL", Severity::SEV1),
            ("HIGH", Severity::SEV2),
            ("MEDIUM", Severity::SEV3),
            ("low", Severity::SEV4),
        ] {
            let value = with_pointer(fixture(ACTIVATED), "/priority", json!(word));
            assert_eq!(one(parse, value).severity, expected);
        }
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (without(fixture(ACTIVATED), "", "id"), "id"),
            (without(fixture(ACTIVATED), "", "state"), "state"),
            (
                with_pointer(fixture(ACTIVATED), "/state", json!("OPEN")),
                "state",
            ),
            (without(fixture(ACTIVATED), "", "title"), "title"),
            (
                with_pointer(fixture(ACTIVATED), "/priority", json!("P1")),
                "priority",
            ),
            (
                with_pointer(fixture(ACTIVATED), "/impactedEntities", json!("x")),
                "impactedEntities",
            ),
            (
                with_pointer(fixture(ACTIVATED), "/alertPolicyNames", json!([1])),
                "alertPolicyNames[0]",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
