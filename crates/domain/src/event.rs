//! Outbound events: their kinds and the JSON body sent to targets.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::{IncidentStatus, Severity};

/// The event kinds, serialised exactly as the specification writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "incidents.opened")]
    IncidentOpened,
    #[serde(rename = "incidents.status_changed")]
    IncidentStatusChanged,
    #[serde(rename = "incidents.resolved")]
    IncidentResolved,
}

/// Not one of the three event kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event must be one of incidents.opened, incidents.status_changed, incidents.resolved (got {0:?})")]
pub struct InvalidEventKind(pub String);

impl EventKind {
    pub const ALL: [EventKind; 3] = [
        EventKind::IncidentOpened,
        EventKind::IncidentStatusChanged,
        EventKind::IncidentResolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::IncidentOpened => "incidents.opened",
            EventKind::IncidentStatusChanged => "incidents.status_changed",
            EventKind::IncidentResolved => "incidents.resolved",
        }
    }
}

impl FromStr for EventKind {
    type Err = InvalidEventKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| InvalidEventKind(s.to_owned()))
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `data` of an event: the incident as it is after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentData {
    pub id: Uuid,
    pub title: String,
    pub severity: Severity,
    pub status: IncidentStatus,
    /// Only on `incidents.status_changed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_status: Option<IncidentStatus>,
}

/// The JSON body POSTed to a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventPayload {
    pub event: EventKind,
    /// Time of the change, RFC 3339 UTC (`2026-11-22T01:32:00.226Z`).
    #[serde(with = "rfc3339_utc")]
    pub timestamp: OffsetDateTime,
    pub data: IncidentData,
}

impl EventPayload {
    /// The exact bytes sent to targets (and signed).
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("an event payload always serialises")
    }
}

/// Formats times as RFC 3339 in UTC with millisecond precision and a `Z` suffix.
pub mod rfc3339_utc {
    use serde::{Deserialize, Deserializer, Serializer};
    use time::format_description::well_known::Rfc3339;
    use time::macros::format_description;
    use time::{OffsetDateTime, UtcOffset};

    /// `2026-11-22T01:32:00.226Z`.
    pub fn format(t: OffsetDateTime) -> String {
        t.to_offset(UtcOffset::UTC)
            .format(format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            ))
            .expect("every UTC time formats")
    }

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        let raw = String::deserialize(d)?;
        OffsetDateTime::parse(&raw, &Rfc3339).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn kinds_serialise_exactly_as_the_specification_writes_them() {
        for (kind, text) in [
            (EventKind::IncidentOpened, "incidents.opened"),
            (EventKind::IncidentStatusChanged, "incidents.status_changed"),
            (EventKind::IncidentResolved, "incidents.resolved"),
        ] {
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{text}\""));
            assert_eq!(text.parse::<EventKind>().unwrap(), kind);
        }
        assert!("incident.opened".parse::<EventKind>().is_err());
    }

    #[test]
    fn payload_has_exactly_the_specified_shape() {
        let payload = EventPayload {
            event: EventKind::IncidentOpened,
            timestamp: datetime!(2026-11-22 01:32:00.226037496 UTC),
            data: IncidentData {
                id: Uuid::parse_str("0b9c6c8e-4f7a-4a53-9b1e-2a1d4c8f7e10").unwrap(),
                title: "p99 latency above 2s".into(),
                severity: Severity::SEV1,
                status: IncidentStatus::Triggered,
                previous_status: None,
            },
        };
        let json: serde_json::Value = serde_json::from_str(&payload.to_body()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "event": "incidents.opened",
                "timestamp": "2026-11-22T01:32:00.226Z",
                "data": {
                    "id": "0b9c6c8e-4f7a-4a53-9b1e-2a1d4c8f7e10",
                    "title": "p99 latency above 2s",
                    "severity": "SEV1",
                    "status": "triggered"
                }
            })
        );
        let back: EventPayload = serde_json::from_value(json).unwrap();
        assert_eq!(back.data, payload.data);
    }

    #[test]
    fn status_changed_carries_the_previous_status() {
        let payload = EventPayload {
            event: EventKind::IncidentStatusChanged,
            timestamp: datetime!(2026-01-02 03:04:05 +02:00),
            data: IncidentData {
                id: Uuid::nil(),
                title: "t".into(),
                severity: Severity::SEV3,
                status: IncidentStatus::Acknowledged,
                previous_status: Some(IncidentStatus::Triggered),
            },
        };
        let json: serde_json::Value = serde_json::from_str(&payload.to_body()).unwrap();
        assert_eq!(json["data"]["previous_status"], "triggered");
        assert_eq!(json["timestamp"], "2026-01-02T01:04:05.000Z");
    }
}
