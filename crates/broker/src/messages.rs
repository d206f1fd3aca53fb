//! The messages Tocsin passes through RabbitMQ, and the headers they carry.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use tocsin_domain::delivery::Trigger;
use tocsin_domain::EventKind;

/// Header of a delivery message asking for an automatic attempt: the automatic attempts its
/// sender saw made of the delivery. The claim admits the attempt only while the delivery still
/// has that count, so a late or duplicate message claims nothing.
pub const AUTO_ATTEMPTS_HEADER: &str = "tocsin-auto-attempts";
/// The header's name before `tocsin-auto-attempts`, which carried the count plus one. For one
/// more release it is read, for messages sent before an upgrade, and written beside the new
/// one, for dispatchers of the previous release running beside these during a rolling upgrade
/// (docs/operations/upgrade.md, "Names changed").
pub const FORMER_ATTEMPT_HEADER: &str = "tocsin-attempt";
/// Header saying who asked for the attempt, a [`tocsin_domain::delivery::Trigger`] as text:
/// `automatic` (the default) or `manual`.
pub const TRIGGER_HEADER: &str = "tocsin-trigger";

/// The headers of a message asking for an attempt of a delivery: who asked, and for an
/// automatic attempt the automatic attempts its sender saw made. Every sender builds them
/// here: the dispatcher's next attempts, and the outbox's recoveries and manual attempts.
pub fn attempt_headers(trigger: Trigger, auto_attempts: Option<i32>) -> serde_json::Value {
    let mut headers = serde_json::Map::new();
    headers.insert(TRIGGER_HEADER.into(), trigger.as_str().into());
    if let Some(count) = auto_attempts {
        headers.insert(AUTO_ATTEMPTS_HEADER.into(), count.into());
        headers.insert(FORMER_ATTEMPT_HEADER.into(), (count + 1).into());
    }
    serde_json::Value::Object(headers)
}

/// The automatic attempts a delivery message's sender saw made, from its headers (`None`:
/// neither header).
pub fn auto_attempts_of(properties: &lapin::BasicProperties) -> Option<i32> {
    let count = crate::header_int(properties, AUTO_ATTEMPTS_HEADER)
        .or_else(|| crate::header_int(properties, FORMER_ATTEMPT_HEADER).map(|n| n - 1))?;
    i32::try_from(count).ok()
}
/// Header of a message the outbox relay published: when, in microseconds since the Unix
/// epoch. The dispatcher's `broker` stage runs from it to the message's arrival (on one
/// machine's clock; across machines, their clocks' difference is in it too).
pub const PUBLISHED_AT_HEADER: &str = "tocsin-published-at";

/// The [`PUBLISHED_AT_HEADER`] of a message published now.
pub fn published_at_header() -> (lapin::types::ShortString, lapin::types::AMQPValue) {
    (
        PUBLISHED_AT_HEADER.into(),
        lapin::types::AMQPValue::LongLongInt(unix_micros()),
    )
}

/// How long ago a message was published, from its [`PUBLISHED_AT_HEADER`] (`None`: no such
/// header; zero when the clocks disagree the other way).
pub fn since_published(properties: &lapin::BasicProperties) -> Option<std::time::Duration> {
    let micros = crate::header_int(properties, PUBLISHED_AT_HEADER)?;
    let elapsed = u64::try_from(unix_micros().saturating_sub(micros)).unwrap_or(0);
    Some(std::time::Duration::from_micros(elapsed))
}

fn unix_micros() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_micros()).unwrap_or(i64::MAX)
}

/// Header explaining why a message was parked.
pub const PARKED_REASON_HEADER: &str = "tocsin-parked-reason";

/// An event to fan out (queue `<prefix>.events.fanout`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMessage {
    pub event_id: Uuid,
    pub event: EventKind,
    pub incident_id: Uuid,
    /// For a test event, the one webhook that receives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_webhook_id: Option<Uuid>,
}

/// One attempt of a delivery (queue `<prefix>.deliveries` and the retry queues).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub delivery_id: Uuid,
    /// The webhook it goes to, where the sender knew it: the dispatcher takes one of the
    /// webhook's slots before it claims the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_id: Option<Uuid>,
}

macro_rules! json_message {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn to_bytes(&self) -> Vec<u8> {
                serde_json::to_vec(self).expect("messages always serialise")
            }
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
                serde_json::from_slice(bytes)
            }
        }
    )*};
}
json_message!(EventMessage, DeliveryMessage);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let event = EventMessage {
            event_id: Uuid::now_v7(),
            event: EventKind::IncidentResolved,
            incident_id: Uuid::now_v7(),
            test_webhook_id: None,
        };
        assert_eq!(EventMessage::from_bytes(&event.to_bytes()).unwrap(), event);
        assert!(!String::from_utf8(event.to_bytes())
            .unwrap()
            .contains("test_webhook_id"));
        let delivery = DeliveryMessage {
            delivery_id: Uuid::now_v7(),
            webhook_id: Some(Uuid::now_v7()),
        };
        assert_eq!(
            DeliveryMessage::from_bytes(&delivery.to_bytes()).unwrap(),
            delivery
        );
        assert!(DeliveryMessage::from_bytes(b"{}").is_err());
    }

    #[test]
    fn attempt_headers_carry_the_count_and_the_former_header_is_read() {
        assert_eq!(
            attempt_headers(Trigger::Automatic, Some(2)),
            serde_json::json!({"tocsin-trigger": "automatic", "tocsin-auto-attempts": 2,
                               "tocsin-attempt": 3})
        );
        assert_eq!(
            attempt_headers(Trigger::Manual, None),
            serde_json::json!({"tocsin-trigger": "manual"})
        );
        let with = |headers: serde_json::Value| {
            lapin::BasicProperties::default().with_headers(crate::headers_from_json(&headers))
        };
        let sent = with(attempt_headers(Trigger::Automatic, Some(2)));
        assert_eq!(auto_attempts_of(&sent), Some(2));
        // A message of the release before: automatic attempt number 3 is the count 2.
        let former = with(serde_json::json!({"tocsin-attempt": 3}));
        assert_eq!(auto_attempts_of(&former), Some(2));
        assert_eq!(auto_attempts_of(&with(serde_json::json!({}))), None);
    }

    #[test]
    fn the_time_since_publishing_is_read_from_the_header() {
        let (name, value) = published_at_header();
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(name, value);
        let published = lapin::BasicProperties::default().with_headers(headers);
        let since = since_published(&published).expect("the header is read");
        assert!(since < std::time::Duration::from_secs(60), "{since:?}");
        let ahead = with_published_at(i64::MAX);
        assert_eq!(since_published(&ahead), Some(std::time::Duration::ZERO));
        assert_eq!(since_published(&lapin::BasicProperties::default()), None);
    }

    fn with_published_at(micros: i64) -> lapin::BasicProperties {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            PUBLISHED_AT_HEADER.into(),
            lapin::types::AMQPValue::LongLongInt(micros),
        );
        lapin::BasicProperties::default().with_headers(headers)
    }
}
