//! Azure Monitor alerts in the common alert schema (`schemaId`
//! "azureMonitorCommonAlertSchema"), as an action group's webhook posts them when "Enable the
//! common alert schema" is on. One signal per notification, keyed `azure:<alertId>` (the alert
//! instance, the same in its `Fired` and `Resolved` notifications). Azure sends no
//! notification when an alert is acknowledged (its alert state), so there is no acknowledge.
//! `alertContext`, which differs per signal type, is not read.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

/// The `schemaId` of the common alert schema.
pub(super) const SCHEMA_ID: &str = "azureMonitorCommonAlertSchema";

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    if body.required_text("schemaId")? != SCHEMA_ID {
        return Err(AlertError::invalid(
            "schemaId",
            "must be azureMonitorCommonAlertSchema: enable the common alert schema on the action group's webhook",
        ));
    }
    let data = body.required_object("data")?;
    let essentials = data.required_object("essentials")?;
    let alert_id = essentials.required_text("alertId")?;
    let rule = essentials.required_text("alertRule")?;
    let action = match essentials.required_text("monitorCondition")? {
        condition if condition.eq_ignore_ascii_case("fired") => AlertAction::Trigger,
        condition if condition.eq_ignore_ascii_case("resolved") => AlertAction::Resolve,
        _ => {
            return Err(AlertError::invalid(
                "data.essentials.monitorCondition",
                "must be Fired or Resolved",
            ))
        }
    };
    let severity = match essentials.text("severity")? {
        None => Severity::DEFAULT,
        Some(word) => severity(word).ok_or_else(|| {
            AlertError::invalid("data.essentials.severity", "must be one of Sev0..Sev4")
        })?,
    };
    let items = essentials.strings("configurationItems")?;
    let targets = essentials.strings("alertTargetIDs")?;
    let title = if items.is_empty() {
        rule.to_owned()
    } else {
        format!("{rule} ({})", items.join(", "))
    };
    let mut labels: Vec<(&str, String)> = vec![("alert_rule", rule.to_owned())];
    for (name, field) in [
        ("severity", "severity"),
        ("signal_type", "signalType"),
        ("monitoring_service", "monitoringService"),
        ("target_resource_type", "targetResourceType"),
        ("target_resource_group", "targetResourceGroup"),
    ] {
        labels.extend(
            essentials
                .text(field)?
                .map(|value| (name, value.to_owned())),
        );
    }
    let custom = data.string_map("customProperties")?;
    labels.extend(custom.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let description: Vec<&str> = essentials
        .text("description")?
        .into_iter()
        .chain(essentials.text("investigationLink")?)
        .collect();
    // The affected resources by name, else by resource id.
    let source = if items.is_empty() {
        targets.first().map(|target| (*target).to_owned())
    } else {
        Some(items.join(", "))
    };
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Azure, &[alert_id]),
        action,
        title: super::title(&title, "data.essentials.alertRule")?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(source.as_deref()),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

/// Azure's five severities, `Sev0` (critical) to `Sev4` (verbose), as `SEV1` to `SEV5`.
fn severity(word: &str) -> Option<Severity> {
    match word.trim().to_ascii_lowercase().as_str() {
        "sev0" => Some(Severity::SEV1),
        "sev1" => Some(Severity::SEV2),
        "sev2" => Some(Severity::SEV3),
        "sev3" => Some(Severity::SEV4),
        "sev4" => Some(Severity::SEV5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse as parse_body;
    use super::*;
    use crate::alerts::testing::*;

    const FIRED: &str = include_str!("../../tests/fixtures/alerts/azure-fired.json");
    const RESOLVED: &str = include_str!("../../tests/fixtures/alerts/azure-resolved.json");

    const KEY: &str = "azure:/subscriptions/11111111-2222-3333-4444-555555555555/providers/Microsoft.AlertsManagement/alerts/b9569717-bc32-442f-add5-83a997729330";

    fn fired_with(pointer: &str, new: Value) -> Value {
        with_pointer(fixture(FIRED), pointer, new)
    }

    #[test]
    fn fired_opens_and_resolved_resolves_the_same_key() {
        let open = one(parse, fixture(FIRED));
        assert_eq!(open.dedup_key, KEY);
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "checkout-vm-cpu-high (checkout-vm-1)");
        assert_eq!(open.severity, Severity::SEV2);
        assert!(open.description.as_deref().unwrap().starts_with(
            "CPU above 90% for 10 minutes on a checkout VM.\n\nhttps://portal.azure.com/"
        ));
        assert_eq!(open.source.as_deref(), Some("checkout-vm-1"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "alert_rule=checkout-vm-cpu-high",
                "env=prod",
                "monitoring_service=Platform",
                "severity=Sev1",
                "signal_type=Metric",
                "team=checkout",
            ]
        );
        assert_eq!(one(parse, fixture(FIRED)), open);

        let resolved = one(parse, fixture(RESOLVED));
        assert_eq!(resolved.dedup_key, KEY);
        assert_eq!(resolved.action, AlertAction::Resolve);
    }

    #[test]
    fn fixtures_are_detected_as_azure() {
        for text in [FIRED, RESOLVED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::Azure);
        }
    }

    #[test]
    fn severities_map_sev0_to_sev4() {
        let cases = [
            ("Sev0", Severity::SEV1),
            ("Sev1", Severity::SEV2),
            ("Sev2", Severity::SEV3),
            ("Sev3", Severity::SEV4),
            ("sev4", Severity::SEV5),
        ];
        for (word, expected) in cases {
            let value = fired_with("/data/essentials/severity", json!(word));
            assert_eq!(one(parse, value).severity, expected, "{word}");
        }
        let value = without(fixture(FIRED), "/data/essentials", "severity");
        assert_eq!(one(parse, value).severity, Severity::DEFAULT);
    }

    #[test]
    fn several_configuration_items_and_none() {
        let value = fired_with("/data/essentials/configurationItems", json!(["a", "b"]));
        let signal = one(parse, value);
        assert_eq!(signal.title.as_str(), "checkout-vm-cpu-high (a, b)");
        assert_eq!(signal.source.as_deref(), Some("a, b"));
        let value = fired_with("/data/essentials/configurationItems", json!([]));
        let signal = one(parse, value);
        assert_eq!(signal.title.as_str(), "checkout-vm-cpu-high");
        assert!(signal
            .source
            .unwrap()
            .ends_with("/virtualmachines/checkout-vm-1"));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (
                fired_with("/schemaId", json!("Microsoft.Insights/activityLogs")),
                "schemaId",
            ),
            (without(fixture(FIRED), "", "schemaId"), "schemaId"),
            (without(fixture(FIRED), "", "data"), "data"),
            (
                without(fixture(FIRED), "/data", "essentials"),
                "data.essentials",
            ),
            (
                without(fixture(FIRED), "/data/essentials", "alertId"),
                "data.essentials.alertId",
            ),
            (
                without(fixture(FIRED), "/data/essentials", "alertRule"),
                "data.essentials.alertRule",
            ),
            (
                fired_with("/data/essentials/monitorCondition", json!("Active")),
                "data.essentials.monitorCondition",
            ),
            (
                fired_with("/data/essentials/severity", json!("High")),
                "data.essentials.severity",
            ),
            (
                fired_with("/data/essentials/configurationItems", json!([1])),
                "data.essentials.configurationItems[0]",
            ),
            (
                fired_with("/data/customProperties/team", json!(1)),
                "data.customProperties.team",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
