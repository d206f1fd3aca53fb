//! Inbound alert formats (DESIGN §3, docs/ingest.md): one endpoint accepts Prometheus
//! Alertmanager, Grafana alerting, PagerDuty Events API v2 and Tocsin's generic JSON. Each body
//! is parsed into [`AlertSignal`]s, which say what should happen to which incident.

mod alertmanager;
mod generic;
mod grafana;
mod pagerduty;

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::{IncidentTitle, Severity};

/// The formats the inbound endpoint understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertFormat {
    Alertmanager,
    Grafana,
    PagerDuty,
    Generic,
}

impl AlertFormat {
    pub const ALL: [AlertFormat; 4] = [
        AlertFormat::Alertmanager,
        AlertFormat::Grafana,
        AlertFormat::PagerDuty,
        AlertFormat::Generic,
    ];

    /// The name used in `?format=`, in metrics labels and in dedup-key namespaces.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Alertmanager => "alertmanager",
            AlertFormat::Grafana => "grafana",
            AlertFormat::PagerDuty => "pagerduty",
            AlertFormat::Generic => "generic",
        }
    }
}

impl fmt::Display for AlertFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertFormat {
    type Err = AlertError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AlertFormat::ALL
            .into_iter()
            .find(|format| format.as_str() == s)
            .ok_or_else(|| {
                AlertError::invalid(
                    "format",
                    "must be one of alertmanager, grafana, pagerduty, generic",
                )
            })
    }
}

/// What an alert asks of its incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertAction {
    /// Open an incident for the key unless one is open already.
    Trigger,
    /// Move the open incident for the key to `acknowledged`.
    Acknowledge,
    /// Resolve the open incident for the key.
    Resolve,
}

/// One instruction parsed from an alert body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSignal {
    /// Identifies the incident across notifications, namespaced by format
    /// (`alertmanager:<receiver>:<groupKey>`, `pagerduty:<dedup_key>`, ...). At most 1 024 bytes.
    pub dedup_key: String,
    pub action: AlertAction,
    pub title: IncidentTitle,
    pub severity: Severity,
    /// Free text (message, annotations), at most 10 000 characters.
    pub description: Option<String>,
    /// Where the alert came from (the sending system or host), at most 255 characters.
    pub source: Option<String>,
    /// The key as the sender should use it again: for PagerDuty, the `dedup_key` that was sent
    /// or generated, returned in the response.
    pub reply_key: Option<String>,
}

/// The parsed body: its format and the signals it carries (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAlerts {
    pub format: AlertFormat,
    pub signals: Vec<AlertSignal>,
}

/// Why a body was refused. `Syntax` answers 400; `Invalid` answers 422 naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertError {
    #[error("body is not valid JSON: {0}")]
    Syntax(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl AlertError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AlertError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Parses a body in the given format, or detects the format from the body's fields when `None`.
pub fn parse(body: &[u8], format: Option<AlertFormat>) -> Result<ParsedAlerts, AlertError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| AlertError::Syntax(e.to_string()))?;
    let format = match format {
        Some(format) => format,
        None => detect(&value)?,
    };
    let signals = match format {
        AlertFormat::Alertmanager => alertmanager::parse(value)?,
        AlertFormat::Grafana => grafana::parse(value)?,
        AlertFormat::PagerDuty => pagerduty::parse(value)?,
        AlertFormat::Generic => generic::parse(value)?,
    };
    Ok(ParsedAlerts { format, signals })
}

/// Detects the format from the body's distinctive fields.
pub fn detect(value: &serde_json::Value) -> Result<AlertFormat, AlertError> {
    let Some(object) = value.as_object() else {
        return Err(AlertError::invalid("body", "must be a JSON object"));
    };
    if object.contains_key("event_action") || object.contains_key("routing_key") {
        Ok(AlertFormat::PagerDuty)
    } else if object.contains_key("orgId")
        || (object.contains_key("state") && object.contains_key("alerts"))
    {
        Ok(AlertFormat::Grafana)
    } else if object.contains_key("alerts") && object.contains_key("groupKey") {
        Ok(AlertFormat::Alertmanager)
    } else {
        Ok(AlertFormat::Generic)
    }
}
