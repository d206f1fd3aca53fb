//! Tocsin's native JSON format, for scripts and tools without a built-in integration:
//! `title`, `dedup_key`, optional `status` (`firing`, `acknowledged`, `resolved`), `severity`,
//! `description`, `source` and `labels`. One signal per body, keyed `generic:<dedup_key>`.
//! Unknown fields are ignored.

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Object};
use crate::Severity;

/// Longest `dedup_key` accepted.
const MAX_DEDUP_KEY_CHARS: usize = 255;

pub(super) fn parse(value: Value) -> Result<Vec<AlertSignal>, AlertError> {
    let body = Object::body(&value)?;
    let title = super::title(body.required_text("title")?, "title")?;
    let key = body.required_text("dedup_key")?;
    if key.chars().nth(MAX_DEDUP_KEY_CHARS).is_some() {
        return Err(AlertError::invalid(
            "dedup_key",
            "must be at most 255 characters",
        ));
    }
    let action = match body.text("status")? {
        None => AlertAction::Trigger,
        Some(status) if status.eq_ignore_ascii_case("firing") => AlertAction::Trigger,
        Some(status) if status.eq_ignore_ascii_case("acknowledged") => AlertAction::Acknowledge,
        Some(status) if status.eq_ignore_ascii_case("resolved") => AlertAction::Resolve,
        Some(_) => {
            return Err(AlertError::invalid(
                "status",
                "must be one of firing, acknowledged, resolved",
            ))
        }
    };
    let severity = match body.text("severity")? {
        None => Severity::DEFAULT,
        Some(word) => Severity::from_source(word).ok_or_else(|| {
            AlertError::invalid(
                "severity",
                "must be SEV1..SEV5 or a known severity word (critical, error, warning, low, info, ...)",
            )
        })?,
    };
    let labels = body.string_map("labels")?;
    Ok(vec![AlertSignal {
        dedup_key: super::dedup_key(AlertFormat::Generic, &[key]),
        action,
        title,
        severity,
        description: super::description(body.string("description")?),
        source: super::source(body.string("source")?),
        reply_key: None,
        labels: super::labels(labels.into_iter().map(|(k, v)| (k, v.to_owned()))),
    }])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse as parse_body;
    use super::*;
    use crate::alerts::testing::*;

    const FIRING: &str = include_str!("../../tests/fixtures/alerts/generic-firing.json");
    const RESOLVED: &str = include_str!("../../tests/fixtures/alerts/generic-resolved.json");

    fn minimal() -> Value {
        json!({"title": "Backup failed", "dedup_key": "backup/nightly"})
    }

    fn with(field: &str, new: Value) -> Value {
        let mut value = minimal();
        value[field] = new;
        value
    }

    #[test]
    fn firing_fixture_triggers() {
        let signal = one(parse, fixture(FIRING));
        assert_eq!(signal.dedup_key, "generic:backup/nightly/db-main");
        assert_eq!(signal.action, AlertAction::Trigger);
        assert_eq!(signal.title.as_str(), "Nightly backup of db-main failed");
        assert_eq!(signal.severity, Severity::SEV2);
        assert_eq!(
            signal.description.as_deref(),
            Some("pg_dump exited with status 1: could not connect to server: Connection refused")
        );
        assert_eq!(signal.source.as_deref(), Some("backup-runner-3"));
        assert_eq!(signal.reply_key, None);
    }

    #[test]
    fn resolved_fixture_resolves_the_same_key() {
        let signal = one(parse, fixture(RESOLVED));
        assert_eq!(signal.dedup_key, "generic:backup/nightly/db-main");
        assert_eq!(signal.action, AlertAction::Resolve);
        assert_eq!(signal.title.as_str(), "Nightly backup of db-main failed");
        assert_eq!(signal.severity, Severity::SEV2);
        assert_eq!(signal.description, None);
        assert_eq!(signal.source.as_deref(), Some("backup-runner-3"));
    }

    #[test]
    fn fixtures_are_detected_as_generic() {
        for text in [FIRING, RESOLVED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::Generic);
        }
    }

    #[test]
    fn defaults_are_firing_and_sev3() {
        let signal = one(parse, minimal());
        assert_eq!(signal.action, AlertAction::Trigger);
        assert_eq!(signal.severity, Severity::DEFAULT);
        assert_eq!(signal.description, None);
        assert_eq!(signal.source, None);
    }

    #[test]
    fn statuses() {
        let cases = [
            ("firing", AlertAction::Trigger),
            ("acknowledged", AlertAction::Acknowledge),
            ("resolved", AlertAction::Resolve),
            (" Resolved ", AlertAction::Resolve),
        ];
        for (status, action) in cases {
            assert_eq!(
                one(parse, with("status", json!(status))).action,
                action,
                "{status}"
            );
        }
        for bad in [json!("closed"), json!(1)] {
            assert_eq!(error(parse, with("status", bad)).0, "status");
        }
    }

    #[test]
    fn severity_accepts_codes_and_known_words_only() {
        let cases = [
            ("SEV1", Severity::SEV1),
            ("sev4", Severity::SEV4),
            ("critical", Severity::SEV1),
            ("high", Severity::SEV2),
            ("warning", Severity::SEV3),
            ("minor", Severity::SEV4),
            ("info", Severity::SEV5),
        ];
        for (word, expected) in cases {
            assert_eq!(
                one(parse, with("severity", json!(word))).severity,
                expected,
                "{word}"
            );
        }
        for bad in [json!("purple"), json!("SEV9"), json!(1)] {
            assert_eq!(error(parse, with("severity", bad)).0, "severity");
        }
        assert_eq!(
            one(parse, with("severity", json!(""))).severity,
            Severity::DEFAULT
        );
    }

    #[test]
    fn required_fields_are_named() {
        for field in ["title", "dedup_key"] {
            let mut value = minimal();
            value.as_object_mut().unwrap().remove(field);
            assert_eq!(
                error(parse, value),
                (field.to_owned(), "is required".to_owned())
            );
            assert_eq!(error(parse, with(field, json!(" \n"))).0, field);
            assert_eq!(error(parse, with(field, json!(["x"]))).0, field);
        }
        assert_eq!(error(parse, with("title", json!("\u{1b}"))).0, "title");
    }

    #[test]
    fn dedup_key_length_is_bounded() {
        assert!(parse(with("dedup_key", json!("k".repeat(255)))).is_ok());
        let (field, _) = error(parse, with("dedup_key", json!("k".repeat(256))));
        assert_eq!(field, "dedup_key");
        let signal = one(parse, with("dedup_key", json!("🦀".repeat(255))));
        assert!(signal.dedup_key.starts_with("generic:sha256:"));
        assert_eq!(signal.dedup_key.len(), "generic:sha256:".len() + 64);
    }

    #[test]
    fn long_text_is_cut_not_refused() {
        let mut value = minimal();
        value["title"] = json!("t".repeat(600));
        value["description"] = json!("d".repeat(10_001));
        value["source"] = json!("s".repeat(256));
        let signal = one(parse, value);
        assert_eq!(signal.title.as_str().chars().count(), 500);
        assert_eq!(signal.description.unwrap().chars().count(), 10_000);
        assert_eq!(signal.source.unwrap().chars().count(), 255);
    }

    #[test]
    fn labels_must_be_strings() {
        assert!(parse(with("labels", json!({"team": "db", "env": "prod"}))).is_ok());
        assert_eq!(
            error(parse, with("labels", json!({"team": 1}))).0,
            "labels.team"
        );
        assert_eq!(error(parse, with("labels", json!(["team"]))).0, "labels");
    }

    #[test]
    fn other_wrong_types_and_bodies_are_named() {
        assert_eq!(error(parse, with("description", json!(1))).0, "description");
        assert_eq!(error(parse, with("source", json!({}))).0, "source");
        assert_eq!(error(parse, json!([])).0, "body");
        assert_eq!(error(parse, json!(1)).0, "body");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let mut value = fixture(FIRING);
        value["runbook"] = json!({"url": "https://runbooks.example.com"});
        value["priority"] = json!(1);
        assert_eq!(one(parse, value), one(parse, fixture(FIRING)));
    }
}
