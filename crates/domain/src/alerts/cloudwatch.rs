//! AWS CloudWatch alarms delivered by an Amazon SNS HTTP(S) subscription. The body is SNS's
//! envelope (`Type`, `TopicArn`, `MessageId`, `Message`, ...): a `SubscriptionConfirmation` or
//! an `UnsubscribeConfirmation` is a [`Notice`]; a `Notification` carries the alarm as a JSON
//! string in `Message`. A subscription with raw message delivery posts the alarm itself, which
//! is read the same way. One signal per alarm state change, keyed
//! `cloudwatch:<AlarmArn>` (or `cloudwatch:<AWSAccountId>:<Region>:<AlarmName>` without an
//! ARN): `ALARM` opens, `OK` resolves, `INSUFFICIENT_DATA` is not acted on.
//!
//! CloudWatch alarms carry no severity: SEV3, unless `AlarmDescription` has a line
//! `severity: <word>` (a word of the severity table or a `SEVn` code).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{AlertAction, AlertError, AlertFormat, AlertSignal, Notice, Object, Reading};
use crate::Severity;

pub(super) fn parse(value: Value) -> Result<Reading, AlertError> {
    let body = Object::body(&value)?;
    if body.get("Type").is_none() && body.get("AlarmName").is_some() {
        return alarm(&body, None);
    }
    let kind = body.required_text("Type")?;
    let topic_arn = body.required_text("TopicArn")?;
    match kind {
        "SubscriptionConfirmation" => Ok(Reading::notice(Notice::ConfirmSubscription {
            topic_arn: topic_arn.to_owned(),
            subscribe_url: body.required_text("SubscribeURL")?.to_owned(),
        })),
        "UnsubscribeConfirmation" => Ok(Reading::notice(Notice::Unsubscribed {
            topic_arn: topic_arn.to_owned(),
        })),
        "Notification" => {
            let text = body.required_text("Message")?;
            let message: Value = serde_json::from_str(text).map_err(|_| {
                AlertError::invalid("Message", "must be a CloudWatch alarm as JSON text")
            })?;
            let message = Object::at(&message, "Message".to_owned())?;
            alarm(&message, Some(topic_arn))
        }
        _ => Err(AlertError::invalid(
            "Type",
            "must be one of Notification, SubscriptionConfirmation, UnsubscribeConfirmation",
        )),
    }
}

/// The signal of one alarm state change; `topic_arn` is the SNS topic that carried it.
fn alarm(alarm: &Object<'_>, topic_arn: Option<&str>) -> Result<Reading, AlertError> {
    let name = alarm.required_text("AlarmName")?;
    let action = match alarm.required_text("NewStateValue")? {
        "ALARM" => AlertAction::Trigger,
        "OK" => AlertAction::Resolve,
        "INSUFFICIENT_DATA" => {
            return Ok(Reading::ignored(
                "a CloudWatch alarm entering INSUFFICIENT_DATA changes no incident",
            ))
        }
        _ => {
            return Err(AlertError::invalid(
                alarm.path_of("NewStateValue"),
                "must be one of ALARM, OK, INSUFFICIENT_DATA",
            ))
        }
    };
    let account = alarm.text("AWSAccountId")?;
    let region = alarm.text("Region")?;
    let description = alarm.text("AlarmDescription")?;
    let key = match alarm.text("AlarmArn")? {
        Some(arn) => super::dedup_key(AlertFormat::CloudWatch, &[arn]),
        None => super::dedup_key(
            AlertFormat::CloudWatch,
            &[account.unwrap_or(""), region.unwrap_or(""), name],
        ),
    };
    let mut labels: Vec<(&str, String)> = vec![("alarm", name.to_owned())];
    labels.extend(account.map(|a| ("aws_account", a.to_owned())));
    labels.extend(region.map(|r| ("region", r.to_owned())));
    labels.extend(topic_arn.map(|t| ("topic", topic_name(t).to_owned())));
    let mut source = None;
    if let Some(trigger) = alarm.object("Trigger")? {
        let namespace = trigger.text("Namespace")?;
        labels.extend(namespace.map(|n| ("namespace", n.to_owned())));
        labels.extend(
            trigger
                .text("MetricName")?
                .map(|m| ("metric", m.to_owned())),
        );
        let dimensions = dimensions(&trigger)?;
        source = namespace.map(|namespace| {
            let pairs: Vec<String> = dimensions.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if pairs.is_empty() {
                namespace.to_owned()
            } else {
                format!("{namespace} {}", pairs.join(", "))
            }
        });
        labels.extend(dimensions.into_iter().map(|(k, v)| (k, v.to_owned())));
    }
    let reason = alarm.text("NewStateReason")?;
    let text: Vec<&str> = description.into_iter().chain(reason).collect();
    Ok(Reading::one(AlertSignal {
        dedup_key: key,
        action,
        title: super::title(name, &alarm.path_of("AlarmName"))?,
        severity: description
            .and_then(severity_line)
            .unwrap_or(Severity::DEFAULT),
        description: super::description(Some(&text.join("\n\n"))),
        source: super::source(source.as_deref().or(account)),
        reply_key: None,
        labels: super::labels(labels),
    }))
}

/// `Trigger.Dimensions`: `[{"name": ..., "value": ...}]`, as name → value.
fn dimensions<'a>(trigger: &Object<'a>) -> Result<BTreeMap<&'a str, &'a str>, AlertError> {
    let Some(items) = trigger.array("Dimensions")? else {
        return Ok(BTreeMap::new());
    };
    let path = trigger.path_of("Dimensions");
    let mut pairs = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let dimension = Object::at(item, format!("{path}[{i}]"))?;
        if let (Some(name), Some(value)) = (dimension.text("name")?, dimension.text("value")?) {
            pairs.insert(name, value);
        }
    }
    Ok(pairs)
}

/// The severity a `severity: <word>` line of the alarm's description names.
fn severity_line(description: &str) -> Option<Severity> {
    description.lines().find_map(|line| {
        let (name, word) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("severity")
            .then(|| Severity::from_source(word))
            .flatten()
    })
}

/// The topic's name, the last part of its ARN.
fn topic_name(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{parse as parse_body, AlertFormat};
    use super::*;
    use crate::alerts::testing::*;

    const ALARM: &str = include_str!("../../tests/fixtures/alerts/cloudwatch-sns-alarm.json");
    const OK: &str = include_str!("../../tests/fixtures/alerts/cloudwatch-sns-ok.json");
    const CONFIRM: &str =
        include_str!("../../tests/fixtures/alerts/cloudwatch-sns-subscription-confirmation.json");
    const UNSUBSCRIBED: &str =
        include_str!("../../tests/fixtures/alerts/cloudwatch-sns-unsubscribe-confirmation.json");

    const KEY: &str =
        "cloudwatch:arn:aws:cloudwatch:eu-west-1:123456789012:alarm:checkout-api-5xx-rate";

    /// The alarm fixture with its message (the JSON text) changed by `change`.
    fn alarm_with(change: impl FnOnce(&mut Value)) -> Value {
        let mut envelope = fixture(ALARM);
        let mut message: Value =
            serde_json::from_str(envelope["Message"].as_str().unwrap()).unwrap();
        change(&mut message);
        envelope["Message"] = json!(message.to_string());
        envelope
    }

    #[test]
    fn alarm_opens_and_ok_resolves_the_same_key() {
        let open = one(parse, fixture(ALARM));
        assert_eq!(open.dedup_key, KEY);
        assert_eq!(open.action, AlertAction::Trigger);
        assert_eq!(open.title.as_str(), "checkout-api-5xx-rate");
        assert_eq!(open.severity, Severity::SEV1);
        let description = open.description.clone().unwrap();
        assert!(description.starts_with("5xx responses of the checkout API"));
        assert!(description.contains("Threshold Crossed: 5 out of the last 5"));
        assert_eq!(
            open.source.as_deref(),
            Some("AWS/ApplicationELB LoadBalancer=app/checkout-prod/50dc6c495c0c9188, TargetGroup=targetgroup/checkout-api/73e2d6bc24d8a067")
        );
        let labels: Vec<String> = open
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            labels,
            [
                "LoadBalancer=app/checkout-prod/50dc6c495c0c9188",
                "TargetGroup=targetgroup/checkout-api/73e2d6bc24d8a067",
                "alarm=checkout-api-5xx-rate",
                "aws_account=123456789012",
                "metric=HTTPCode_Target_5XX_Count",
                "namespace=AWS/ApplicationELB",
                "region=EU (Ireland)",
                "topic=tocsin-alarms",
            ]
        );

        let ok = one(parse, fixture(OK));
        assert_eq!(ok.dedup_key, KEY);
        assert_eq!(ok.action, AlertAction::Resolve);
        // A repeated notification (SNS retries with the same MessageId) is the same signal.
        assert_eq!(one(parse, fixture(ALARM)), open);
    }

    #[test]
    fn subscription_notices() {
        assert_eq!(
            parse(fixture(CONFIRM)).unwrap(),
            Reading::notice(Notice::ConfirmSubscription {
                topic_arn: "arn:aws:sns:eu-west-1:123456789012:tocsin-alarms".into(),
                subscribe_url: fixture(CONFIRM)["SubscribeURL"].as_str().unwrap().into(),
            })
        );
        assert_eq!(
            parse(fixture(UNSUBSCRIBED)).unwrap(),
            Reading::notice(Notice::Unsubscribed {
                topic_arn: "arn:aws:sns:eu-west-1:123456789012:tocsin-alarms".into(),
            })
        );
        assert_eq!(
            error(parse, without(fixture(CONFIRM), "", "SubscribeURL")).0,
            "SubscribeURL"
        );
    }

    #[test]
    fn every_fixture_is_detected_as_cloudwatch() {
        for text in [ALARM, OK, CONFIRM, UNSUBSCRIBED] {
            let parsed = parse_body(text.as_bytes(), None).unwrap();
            assert_eq!(parsed.format, AlertFormat::CloudWatch);
        }
    }

    #[test]
    fn insufficient_data_is_accepted_and_ignored() {
        let value = alarm_with(|m| m["NewStateValue"] = json!("INSUFFICIENT_DATA"));
        let parsed = parse_body(value.to_string().as_bytes(), None).unwrap();
        assert!(parsed.signals.is_empty());
        assert!(matches!(parsed.notice, Some(Notice::Ignored(_))));
    }

    #[test]
    fn raw_message_delivery_is_read_as_the_alarm() {
        let envelope = fixture(ALARM);
        let message: Value = serde_json::from_str(envelope["Message"].as_str().unwrap()).unwrap();
        let raw = one(parse, message);
        let mut labels = one(parse, fixture(ALARM)).labels;
        labels.remove("topic");
        assert_eq!(raw.dedup_key, KEY);
        assert_eq!(raw.labels, labels);
    }

    #[test]
    fn severity_comes_from_a_description_line() {
        let cases = [
            ("severity: warning", Severity::SEV3),
            ("x\nSeverity : SEV2", Severity::SEV2),
            ("no line", Severity::DEFAULT),
            ("severity: purple", Severity::DEFAULT),
        ];
        for (text, expected) in cases {
            let value = alarm_with(|m| m["AlarmDescription"] = json!(text));
            assert_eq!(one(parse, value).severity, expected, "{text}");
        }
    }

    #[test]
    fn without_an_arn_the_key_is_account_region_and_name() {
        let value = alarm_with(|m| {
            m.as_object_mut().unwrap().remove("AlarmArn");
        });
        assert_eq!(
            one(parse, value).dedup_key,
            "cloudwatch:123456789012:EU (Ireland):checkout-api-5xx-rate"
        );
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases = [
            (without(fixture(ALARM), "", "Type"), "Type"),
            (
                with_pointer(fixture(ALARM), "/Type", json!("Other")),
                "Type",
            ),
            (without(fixture(ALARM), "", "TopicArn"), "TopicArn"),
            (without(fixture(ALARM), "", "Message"), "Message"),
            (
                with_pointer(fixture(ALARM), "/Message", json!("not json")),
                "Message",
            ),
            (
                with_pointer(fixture(ALARM), "/Message", json!("[1]")),
                "Message",
            ),
            (
                alarm_with(|m| {
                    m.as_object_mut().unwrap().remove("AlarmName");
                }),
                "Message.AlarmName",
            ),
            (
                alarm_with(|m| m["NewStateValue"] = json!("FIRING")),
                "Message.NewStateValue",
            ),
            (
                alarm_with(|m| m["Trigger"]["Dimensions"] = json!({})),
                "Message.Trigger.Dimensions",
            ),
            (
                alarm_with(|m| m["Trigger"]["Dimensions"][0] = json!(1)),
                "Message.Trigger.Dimensions[0]",
            ),
            (json!([]), "body"),
        ];
        for (value, field) in cases {
            assert_eq!(error(parse, value).0, field);
        }
    }
}
