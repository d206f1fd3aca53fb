//! Datadog monitors through Datadog's Webhooks integration, whose body is a template the user
//! pastes: Tocsin's is `docs/sources/datadog-payload.json` (each field one of Datadog's
//! `$VARIABLES`). One signal per notification, keyed `datadog:<aggreg_key>` (`$AGGREG_KEY`,
//! the same for a monitor group's alert and its recovery): `transition` (`$ALERT_TRANSITION`)
//! `Recovered` resolves, every other transition (`Triggered`, `Re-Triggered`, `Warn`,
//! `Re-Warn`, `No Data`, `Re-No Data`, `Renotify`) opens. Datadog has no acknowledgement it
//! notifies about.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

/// The transitions that open an incident (case-insensitive, `-` and spaces ignored).
const OPENING: [&str; 7] = [
    "triggered",
    "retriggered",
    "warn",
    "rewarn",
    "nodata",
    "renodata",
    "renotify",
];

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let key = body.required_text("aggreg_key")?;
    let transition = body.required_text("transition")?;
    let normalised: String = transition
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    let action = if normalised == "recovered" {
        AlertAction::Resolve
    } else if OPENING.contains(&normalised.as_str()) {
        AlertAction::Trigger
    } else {
        return Err(AlertError::invalid(
            "transition",
            "must be a Datadog alert transition: Triggered, Re-Triggered, Warn, Re-Warn, No Data, Re-No Data, Renotify or Recovered",
        ));
    };
    let title = body.required_text("title")?;
    // `$ALERT_PRIORITY` (P1..P5) when the monitor has one, else `$ALERT_TYPE`.
    let severity = match body.text("priority")? {
        Some(word) => Some(super::priority(word).ok_or_else(|| {
            AlertError::invalid("priority", "must be P1, P2, P3, P4 or P5 (or empty)")
        })?),
        None => None,
    }
    .or(match body.text("alert_type")? {
        Some("error") => Some(Severity::SEV2),
        Some("warning") => Some(Severity::SEV3),
        Some("info" | "success") => Some(Severity::SEV5),
        _ => None,
    })
    .unwrap_or(Severity::DEFAULT);
    let mut labels = match body.text("tags")? {
        Some(tags) => super::tag_labels(tags.split(',')),
        None => Vec::new(),
    };
    labels.extend(body.id("alert_id")?.map(|id| ("monitor_id", id)));
    let hostname = body.text("hostname")?;
    let description: Vec<&str> = [
        body.text("message")?,
        body.text("status")?,
        body.text("link")?,
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Datadog, &[key]),
        action,
        title: super::title(title, "title")?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(hostname.or(body.text("scope")?)),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::alerts::testing::*;

    const TRIGGERED: &str = include_str!("../../tests/fixtures/alerts/datadog-triggered.json");
    const RECOVERED: &str = include_str!("../../tests/fixtures/alerts/datadog-recovered.json");

    #[test]
    fn triggered_opens_and_recovered_resolves_the_same_key() {
        let open = one(parse, fixture(TRIGGERED));
        assert_eq!(open.dedup_key, "datadog:2c5fa6bb6a0e1f9b0c8e1a2d3c4b5a69");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(
            open.title.as_str(),
            "Checkout API p95 latency above 2s on service:checkout-api"
        );
        assert_eq!(open.severity, Severity::SEV2);
        assert_eq!(open.source.as_deref(), Some("checkout-api-7d9f"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "env=prod",
                "monitor=true",
                "monitor_id=184722091",
                "service=checkout-api",
                "team=checkout"
            ]
        );
        assert_eq!(one(parse, fixture(TRIGGERED)), open);
        let resolved = one(parse, fixture(RECOVERED));
        assert_eq!(resolved.dedup_key, open.dedup_key);
        assert_eq!(resolved.action, AlertAction::Resolve);
    }

    #[test]
    fn transitions() {
        for transition in [
            "Re-Triggered",
            "Warn",
            "Re-Warn",
            "No Data",
            "Re-No Data",
            "Renotify",
        ] {
            let value = with_pointer(fixture(TRIGGERED), "/transition", json!(transition));
            assert_eq!(
                one(parse, value).action,
                AlertAction::Trigger,
                "{transition}"
            );
        }
        assert_eq!(
            error(
                parse,
                with_pointer(fixture(TRIGGERED), "/transition", json!("Escalated"))
            )
            .0,
            "transition"
        );
    }

    #[test]
    fn severity_from_priority_else_alert_type() {
        for (priority, expected) in [("P1", Severity::SEV1), ("p5", Severity::SEV5)] {
            let value = with_pointer(fixture(TRIGGERED), "/priority", json!(priority));
            assert_eq!(one(parse, value).severity, expected);
        }
        let no_priority = with_pointer(fixture(TRIGGERED), "/priority", json!(""));
        assert_eq!(one(parse, no_priority.clone()).severity, Severity::SEV2);
        let mut warning = no_priority;
        warning["alert_type"] = json!("warning");
        assert_eq!(one(parse, warning.clone()).severity, Severity::SEV3);
        warning["alert_type"] = json!("other");
        assert_eq!(one(parse, warning).severity, Severity::DEFAULT);
        assert_eq!(
            error(
                parse,
                with_pointer(fixture(TRIGGERED), "/priority", json!("high"))
            )
            .0,
            "priority"
        );
    }

    #[test]
    fn bad_bodies_name_the_field() {
        for field in ["aggreg_key", "transition", "title"] {
            assert_eq!(
                error(parse, without(fixture(TRIGGERED), "", field)).0,
                field
            );
        }
        assert_eq!(
            error(
                parse,
                with_pointer(fixture(TRIGGERED), "/tags", json!(["a"]))
            )
            .0,
            "tags"
        );
        assert_eq!(error(parse, json!("x")).0, "body");
    }
}
