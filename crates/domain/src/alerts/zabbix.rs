//! Zabbix problems through the webhook media type Tocsin ships
//! (`docs/sources/zabbix-media-tocsin.yaml`), whose script posts the event's macros as JSON.
//! One signal per message, keyed `zabbix:<event_id>` (`{EVENT.ID}`, the problem event, which
//! Zabbix's recovery and update messages also carry): a problem (`event_value` "1") opens, a
//! recovery (`event_value` "0") resolves, an update (`event_update_status` "1") whose
//! `event_update_action` says "acknowledged" acknowledges and one that says "closed" resolves;
//! other updates (a comment, a changed severity) change nothing.
//!
//! Zabbix's six severities (`{EVENT.NSEVERITY}`): 5 Disaster → SEV1, 4 High → SEV2,
//! 3 Average → SEV3, 2 Warning → SEV4, 1 Information and 0 Not classified → SEV5. Zabbix's
//! Warning sits below its Average, hence SEV4 rather than the table's SEV3 for "warning".

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let event_id = body.required_id("event_id")?;
    let problem = match body.required_id("event_value")?.as_str() {
        "1" => true,
        "0" => false,
        _ => {
            return Err(AlertError::invalid(
                "event_value",
                "must be 1 (problem) or 0 (recovery)",
            ))
        }
    };
    // Outside an update, Zabbix leaves `{EVENT.UPDATE.STATUS}` unexpanded: only "1" counts.
    let update = body.id("event_update_status")?.as_deref() == Some("1");
    let update_action = body.text("event_update_action")?.unwrap_or("");
    let closed = update && update_action.contains("closed");
    let acknowledged = update
        && update_action.contains("acknowledged")
        && !update_action.contains("unacknowledged");
    let action = if !problem || closed {
        AlertAction::Resolve
    } else if acknowledged {
        AlertAction::Acknowledge
    } else {
        AlertAction::Trigger
    };
    let title = body.required_text("event_name")?;
    let severity = match body.id("event_nseverity")?.as_deref() {
        None => Severity::DEFAULT,
        Some("5") => Severity::SEV1,
        Some("4") => Severity::SEV2,
        Some("3") => Severity::SEV3,
        Some("2") => Severity::SEV4,
        Some("1" | "0") => Severity::SEV5,
        Some(_) => {
            return Err(AlertError::invalid(
                "event_nseverity",
                "must be 0 to 5 ({EVENT.NSEVERITY})",
            ))
        }
    };
    let mut labels = event_tags(&body)?;
    labels.extend(body.id("trigger_id")?.map(|id| ("trigger_id", id)));
    labels.extend(
        body.text("event_severity")?
            .map(|s| ("zabbix_severity", s.to_owned())),
    );
    let host = body.text("host_name")?;
    labels.extend(host.map(|h| ("host", h.to_owned())));
    let description: Vec<&str> = [
        body.text("event_opdata")?,
        body.text("trigger_description")?,
        body.text("event_url")?,
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Zabbix, &[&event_id]),
        action,
        title: super::title(title, "event_name")?,
        severity,
        description: super::description(Some(&description.join("\n\n"))),
        source: super::source(host),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

/// `event_tags` (`{EVENT.TAGSJSON}`): `[{"tag": ..., "value": ...}]` as label pairs.
fn event_tags<'a>(body: &Object<'a>) -> Result<Vec<(&'a str, String)>, AlertError> {
    let Some(items) = body.array("event_tags")? else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let tag = Object::at(item, format!("event_tags[{i}]"))?;
            let name = tag.required_text("tag")?;
            Ok((name, tag.text("value")?.unwrap_or("true").to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::alerts::testing::*;

    const PROBLEM: &str = include_str!("../../tests/fixtures/alerts/zabbix-problem.json");
    const ACKNOWLEDGED: &str = include_str!("../../tests/fixtures/alerts/zabbix-acknowledged.json");
    const RESOLVED: &str = include_str!("../../tests/fixtures/alerts/zabbix-resolved.json");

    #[test]
    fn a_problem_opens_its_acknowledgement_acknowledges_and_its_recovery_resolves() {
        let open = one(parse, fixture(PROBLEM));
        assert_eq!(open.dedup_key, "zabbix:48211");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(
            open.title.as_str(),
            "High CPU utilization (over 90% for 5m)"
        );
        assert_eq!(open.severity, Severity::SEV2);
        assert_eq!(open.source.as_deref(), Some("checkout-db-2"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "component=cpu",
                "host=checkout-db-2",
                "scope=performance",
                "team=checkout",
                "trigger_id=23544",
                "zabbix_severity=High",
            ]
        );
        assert_eq!(one(parse, fixture(PROBLEM)), open);
        let ack = one(parse, fixture(ACKNOWLEDGED));
        assert_eq!(
            (ack.dedup_key.as_str(), ack.action),
            ("zabbix:48211", AlertAction::Acknowledge)
        );
        let resolved = one(parse, fixture(RESOLVED));
        assert_eq!(
            (resolved.dedup_key.as_str(), resolved.action),
            ("zabbix:48211", AlertAction::Resolve)
        );
    }

    #[test]
    fn updates() {
        let cases = [
            ("acknowledged", AlertAction::Acknowledge),
            ("commented", AlertAction::Trigger),
            ("unacknowledged", AlertAction::Trigger),
            ("changed severity", AlertAction::Trigger),
            ("closed", AlertAction::Resolve),
        ];
        for (update, expected) in cases {
            let mut value = with_pointer(fixture(PROBLEM), "/event_update_status", json!("1"));
            value["event_update_action"] = json!(update);
            assert_eq!(one(parse, value).action, expected, "{update}");
        }
        // Not an update: an unexpanded macro.
        let mut value = with_pointer(
            fixture(PROBLEM),
            "/event_update_status",
            json!("{EVENT.UPDATE.STATUS}"),
        );
        value["event_update_action"] = json!("{EVENT.UPDATE.ACTION}");
        assert_eq!(one(parse, value).action, AlertAction::Trigger);
    }

    #[test]
    fn the_six_severities() {
        let cases = [
            ("5", Severity::SEV1),
            ("4", Severity::SEV2),
            ("3", Severity::SEV3),
            ("2", Severity::SEV4),
            ("1", Severity::SEV5),
            ("0", Severity::SEV5),
        ];
        for (level, expected) in cases {
            assert_eq!(
                one(
                    parse,
                    with_pointer(fixture(PROBLEM), "/event_nseverity", json!(level))
                )
                .severity,
                expected
            );
        }
        assert_eq!(
            one(
                parse,
                with_pointer(fixture(PROBLEM), "/event_nseverity", json!(5))
            )
            .severity,
            Severity::SEV1
        );
    }

    #[test]
    fn bad_bodies_name_the_field() {
        for field in ["event_id", "event_value", "event_name"] {
            assert_eq!(error(parse, without(fixture(PROBLEM), "", field)).0, field);
        }
        let cases = [
            (
                with_pointer(fixture(PROBLEM), "/event_value", json!("2")),
                "event_value",
            ),
            (
                with_pointer(fixture(PROBLEM), "/event_nseverity", json!("6")),
                "event_nseverity",
            ),
            (
                with_pointer(fixture(PROBLEM), "/event_tags", json!({})),
                "event_tags",
            ),
            (
                with_pointer(fixture(PROBLEM), "/event_tags", json!([{"value": "x"}])),
                "event_tags[0].tag",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
