//! The messages Tocsin passes through RabbitMQ, and the headers they carry.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use tocsin_domain::EventKind;

/// Header with the number of the automatic attempt a delivery message asks for (1-based).
pub const ATTEMPT_HEADER: &str = "tocsin-attempt";
/// Header saying who asked for the attempt, a [`tocsin_domain::delivery::Trigger`] as text:
/// `automatic` (the default) or `manual`.
pub const TRIGGER_HEADER: &str = "tocsin-trigger";
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
}
