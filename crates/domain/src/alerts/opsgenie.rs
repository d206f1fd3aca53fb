//! Opsgenie's Alert API, for tools that can only send to Opsgenie (Alertmanager's
//! `opsgenie_configs`, Grafana's Opsgenie contact point, Zabbix's and Uptime Kuma's Opsgenie
//! integrations, scripts): pointed at Tocsin's `.../opsgenie/` base URL, their
//! `POST /v2/alerts` creates and `POST /v2/alerts/{alias}/close` or `/acknowledge`
//! (`identifierType=alias`) close or acknowledge. Keyed `opsgenie:<alias>`, or
//! `opsgenie:<message>` for a create without an alias. `priority` P1..P5 is SEV1..SEV5
//! (Opsgenie's default P3 when absent).

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object, Reading};
use crate::Severity;

/// Opsgenie's limits: `message` 130 characters, `alias` 512.
const MAX_MESSAGE_CHARS: usize = 130;
const MAX_ALIAS_CHARS: usize = 512;

/// An Alert API call on an existing alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsgenieAction {
    /// `POST /v2/alerts/{identifier}/close`.
    Close,
    /// `POST /v2/alerts/{identifier}/acknowledge`.
    Acknowledge,
}

/// `POST /v2/alerts`: create an alert.
pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    let message = body.required_text("message")?;
    if message.chars().count() > MAX_MESSAGE_CHARS {
        return Err(AlertError::invalid(
            "message",
            "must be at most 130 characters",
        ));
    }
    let alias = body.text("alias")?;
    if alias.is_some_and(|alias| alias.chars().count() > MAX_ALIAS_CHARS) {
        return Err(AlertError::invalid(
            "alias",
            "must be at most 512 characters",
        ));
    }
    let severity = match body.text("priority")? {
        None => Severity::DEFAULT,
        Some(word) => super::priority(word)
            .ok_or_else(|| AlertError::invalid("priority", "must be one of P1, P2, P3, P4, P5"))?,
    };
    let tags = body.strings("tags")?;
    let details = body.string_map("details")?;
    let entity = body.text("entity")?;
    let mut labels = super::tag_labels(tags);
    labels.extend(details.iter().map(|(k, v)| (*k, (*v).to_owned())));
    labels.extend(entity.map(|entity| ("entity", entity.to_owned())));
    let key = alias.unwrap_or(message);
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Opsgenie, &[key]),
        action: AlertAction::Trigger,
        title: super::title(message, "message")?,
        severity,
        description: super::description(body.text("description")?),
        source: super::source(body.text("source")?.or(entity)),
        reply_key: Some(key.to_owned()),
        labels: super::labels(labels),
    }))
}

/// `POST /v2/alerts/{identifier}/close` or `/acknowledge`. Tocsin knows alerts by alias only
/// (it hands out no Opsgenie alert ids), so `identifierType` must be `alias` or absent.
pub(super) fn parse_action(
    value: Value,
    identifier: &str,
    identifier_type: Option<&str>,
    action: OpsgenieAction,
) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    match identifier_type.map(str::trim) {
        None | Some("") | Some("alias") => {}
        Some(_) => {
            return Err(AlertError::invalid(
                "identifierType",
                "must be alias: Tocsin knows alerts by their alias",
            ))
        }
    }
    let alias = identifier.trim();
    if alias.is_empty() || alias.chars().count() > MAX_ALIAS_CHARS {
        return Err(AlertError::invalid(
            "identifier",
            "must be the alert's alias, 1 to 512 characters",
        ));
    }
    let note = body.text("note")?;
    body.text("user")?;
    let source = body.text("source")?;
    Ok(Reading::one(AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Opsgenie, &[alias]),
        action: match action {
            OpsgenieAction::Close => AlertAction::Resolve,
            OpsgenieAction::Acknowledge => AlertAction::Acknowledge,
        },
        title: super::title(&format!("Opsgenie alert {alias}"), "identifier")?,
        severity: Severity::DEFAULT,
        description: super::description(note),
        source: super::source(source),
        reply_key: Some(alias.to_owned()),
        labels: Default::default(),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::alerts::testing::*;

    const CREATE: &str = include_str!("../../tests/fixtures/alerts/opsgenie-create.json");
    const CLOSE: &str = include_str!("../../tests/fixtures/alerts/opsgenie-close.json");
    const ACKNOWLEDGE: &str = include_str!("../../tests/fixtures/alerts/opsgenie-acknowledge.json");

    const ALIAS: &str = "checkout-db-1/disk/var-lib-postgresql";

    #[test]
    fn create_opens_and_acknowledge_and_close_by_alias_follow() {
        let open = one(parse, fixture(CREATE));
        assert_eq!(open.dedup_key, format!("opsgenie:{ALIAS}"));
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "Disk almost full on checkout-db-1");
        assert_eq!(open.severity, Severity::SEV2);
        assert_eq!(
            open.description.as_deref(),
            Some("/var/lib/postgresql is 94% full (threshold 90%).")
        );
        assert_eq!(open.source.as_deref(), Some("nagios.example.com"));
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "disk=true",
                "entity=checkout-db-1",
                "env=prod",
                "mount=/var/lib/postgresql",
                "team=checkout",
                "used_percent=94",
            ]
        );
        assert_eq!(one(parse, fixture(CREATE)), open);

        let ack = parse_action(
            fixture(ACKNOWLEDGE),
            ALIAS,
            Some("alias"),
            OpsgenieAction::Acknowledge,
        )
        .unwrap();
        assert_eq!(ack.signals[0].dedup_key, open.dedup_key);
        assert_eq!(ack.signals[0].action, AlertAction::Acknowledge);
        let close = parse_action(fixture(CLOSE), ALIAS, None, OpsgenieAction::Close).unwrap();
        assert_eq!(close.signals[0].dedup_key, open.dedup_key);
        assert_eq!(close.signals[0].action, AlertAction::Resolve);
        assert_eq!(
            close.signals[0].description.as_deref(),
            Some("Disk usage back to 71%")
        );
    }

    #[test]
    fn without_an_alias_the_message_is_the_key() {
        let signal = one(parse, without(fixture(CREATE), "", "alias"));
        assert_eq!(
            signal.dedup_key,
            "opsgenie:Disk almost full on checkout-db-1"
        );
        let signal = one(parse, json!({"message": "m"}));
        assert_eq!(signal.severity, Severity::DEFAULT);
    }

    #[test]
    fn priorities() {
        for (word, expected) in [
            ("P1", Severity::SEV1),
            ("P3", Severity::SEV3),
            ("P5", Severity::SEV5),
        ] {
            let value = with_pointer(fixture(CREATE), "/priority", json!(word));
            assert_eq!(one(parse, value).severity, expected);
        }
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (without(fixture(CREATE), "", "message"), "message"),
            (
                with_pointer(fixture(CREATE), "/message", json!("m".repeat(131))),
                "message",
            ),
            (
                with_pointer(fixture(CREATE), "/alias", json!("a".repeat(513))),
                "alias",
            ),
            (
                with_pointer(fixture(CREATE), "/priority", json!("critical")),
                "priority",
            ),
            (
                with_pointer(fixture(CREATE), "/tags", json!("env:prod")),
                "tags",
            ),
            (
                with_pointer(fixture(CREATE), "/details/used_percent", json!(94)),
                "details.used_percent",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
        let action = |value: Value, identifier: &str, kind: Option<&str>| match parse_action(
            value,
            identifier,
            kind,
            OpsgenieAction::Close,
        ) {
            Err(AlertError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(action(fixture(CLOSE), ALIAS, Some("id")), "identifierType");
        assert_eq!(action(fixture(CLOSE), " ", None), "identifier");
        assert_eq!(action(json!({"note": 1}), ALIAS, None), "note");
        assert_eq!(action(json!([]), ALIAS, None), "body");
    }
}
