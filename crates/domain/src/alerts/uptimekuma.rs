//! Uptime Kuma's webhook notification (body "Preset - application/json"): `heartbeat`,
//! `monitor` and `msg`. One signal per important heartbeat, keyed `uptimekuma:<monitor.id>`:
//! status 0 (down) opens, 1 (up) resolves; 2 (pending) and 3 (maintenance), and the test
//! notification (no heartbeat or monitor), change nothing. Uptime Kuma has no acknowledgement.
//!
//! Monitors have no severity: a monitor tag named `severity` (a word or `SEVn`) gives one,
//! else SEV3. The monitor's other tags become labels.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let message = body.text("msg")?;
    let (Some(heartbeat), Some(monitor)) = (body.object("heartbeat")?, body.object("monitor")?)
    else {
        return Ok(Reading::ignored(
            "an Uptime Kuma message without heartbeat and monitor (a test) changes no incident",
        ));
    };
    let action = match heartbeat.get("status").and_then(Value::as_u64) {
        Some(0) => AlertAction::Trigger,
        Some(1) => AlertAction::Resolve,
        Some(2) => return Ok(Reading::ignored("a pending heartbeat changes no incident")),
        Some(3) => {
            return Ok(Reading::ignored(
                "a maintenance heartbeat changes no incident",
            ))
        }
        _ => {
            return Err(AlertError::invalid(
                "heartbeat.status",
                "must be 0 (down), 1 (up), 2 (pending) or 3 (maintenance)",
            ))
        }
    };
    let id = monitor.required_id("id")?;
    let name = monitor.required_text("name")?;
    let mut severity = Severity::DEFAULT;
    let mut labels: Vec<(&str, String)> = Vec::new();
    if let Some(tags) = monitor.array("tags")? {
        for (i, tag) in tags.iter().enumerate() {
            let tag = Object::at(tag, format!("monitor.tags[{i}]"))?;
            let tag_name = tag.required_text("name")?;
            let value = tag.text("value")?;
            if tag_name.eq_ignore_ascii_case("severity") {
                severity = value
                    .and_then(Severity::from_source)
                    .unwrap_or(Severity::DEFAULT);
            }
            labels.push((tag_name, value.unwrap_or("true").to_owned()));
        }
    }
    labels.extend(
        monitor
            .text("type")?
            .map(|t| ("monitor_type", t.to_owned())),
    );
    labels.push(("monitor", name.to_owned()));
    // The monitored address: an HTTP monitor's `url`, else its `hostname` (Uptime Kuma keeps
    // the form's placeholder `https://` in `url` for monitors without one).
    let url = monitor
        .text("url")?
        .filter(|url| url.len() > "https://".len());
    let source = match url {
        Some(url) => Some(url),
        None => monitor.text("hostname")?,
    };
    let description: Vec<&str> = heartbeat.text("msg")?.into_iter().chain(message).collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::UptimeKuma, &[&id]),
        action,
        title: super::title(&format!("{name} is down"), "monitor.name")?,
        severity,
        description: super::description(Some(&description.join("\n"))),
        source: super::source(source),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{parse as parse_body, Notice};
    use super::*;
    use crate::alerts::testing::*;

    const DOWN: &str = include_str!("../../tests/fixtures/alerts/uptimekuma-down.json");
    const UP: &str = include_str!("../../tests/fixtures/alerts/uptimekuma-up.json");

    #[test]
    fn down_opens_and_up_resolves_the_monitors_incident() {
        let open = one(parse, fixture(DOWN));
        assert_eq!(open.dedup_key, "uptimekuma:12");
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "Checkout storefront is down");
        assert_eq!(open.severity, Severity::SEV1);
        assert_eq!(
            open.source.as_deref(),
            Some("https://shop.example.com/health")
        );
        assert_eq!(
            open.description.as_deref(),
            Some("Request failed with status code 503\n[Checkout storefront] [🔴 Down] Request failed with status code 503")
        );
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "monitor=Checkout storefront",
                "monitor_type=http",
                "public=true",
                "severity=critical",
                "team=checkout",
            ]
        );
        assert_eq!(one(parse, fixture(DOWN)), open);
        let up = one(parse, fixture(UP));
        assert_eq!(up.dedup_key, open.dedup_key);
        assert_eq!(up.action, AlertAction::Resolve);
    }

    #[test]
    fn fixtures_are_detected_as_uptime_kuma() {
        for text in [DOWN, UP] {
            assert_eq!(
                parse_body(text.as_bytes(), None).unwrap().format,
                AlertFormat::UptimeKuma
            );
        }
    }

    #[test]
    fn tests_pending_and_maintenance_change_nothing() {
        let test = json!({"heartbeat": null, "monitor": null, "msg": "Tocsin Testing"});
        for value in [
            test,
            with_pointer(fixture(DOWN), "/heartbeat/status", json!(2)),
            with_pointer(fixture(DOWN), "/heartbeat/status", json!(3)),
        ] {
            let reading = parse(value).unwrap();
            assert!(reading.signals.is_empty());
            assert!(matches!(reading.notice, Some(Notice::Ignored(_))));
        }
    }

    #[test]
    fn without_a_severity_tag_it_is_sev3_and_a_hostname_is_the_source() {
        let mut value = with_pointer(fixture(DOWN), "/monitor/tags", json!([]));
        value["monitor"]["url"] = json!("https://");
        value["monitor"]["hostname"] = json!("db.example.com");
        let signal = one(parse, value);
        assert_eq!(signal.severity, Severity::DEFAULT);
        assert_eq!(signal.source.as_deref(), Some("db.example.com"));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (
                with_pointer(fixture(DOWN), "/heartbeat/status", json!("down")),
                "heartbeat.status",
            ),
            (
                with_pointer(fixture(DOWN), "/heartbeat/status", json!(7)),
                "heartbeat.status",
            ),
            (without(fixture(DOWN), "/monitor", "id"), "monitor.id"),
            (without(fixture(DOWN), "/monitor", "name"), "monitor.name"),
            (
                with_pointer(fixture(DOWN), "/monitor/tags/0", json!("x")),
                "monitor.tags[0]",
            ),
            (
                with_pointer(fixture(DOWN), "/heartbeat", json!([])),
                "heartbeat",
            ),
            (with_pointer(fixture(DOWN), "/msg", json!(1)), "msg"),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
