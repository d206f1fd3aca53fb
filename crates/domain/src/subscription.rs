//! What a webhook asks of its deliveries beyond its target: subscription filters (which events
//! it receives), custom headers (sent with every delivery) and a rate limit (how fast its
//! attempts may start). Each is validated here; the fan-out applies the filters in SQL
//! (`webhook_filters_accept`, in the storage crate's migrations), with the same meaning.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Severity;

/// Which of the events a webhook subscribes to it receives. Each filter left out lets every
/// event through; each given one must match: the incident's severity is listed, its alert
/// format (`alertmanager`, `grafana`, `pagerduty`, `generic`) or source name is listed, and it
/// carries every label pair listed. Test events ignore filters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookFilters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severities: Option<BTreeSet<Severity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<BTreeSet<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A filter refused, with the field it is about (`filters.severities[1]`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSetting {
    pub field: String,
    pub message: String,
}

impl InvalidSetting {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        InvalidSetting {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl WebhookFilters {
    /// Most entries in each filter.
    pub const MAX_ENTRIES: usize = 50;
    /// Longest source name or label key or value, in characters.
    pub const MAX_CHARS: usize = 255;

    /// Filters from their parts as a client gave them; a list given must not be empty (leave
    /// the filter out to receive everything).
    pub fn parse(
        severities: Option<&[String]>,
        sources: Option<&[String]>,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Result<Self, InvalidSetting> {
        let severities = severities
            .map(|list| {
                non_empty("filters.severities", list.len())?;
                list.iter()
                    .enumerate()
                    .map(|(i, raw)| {
                        raw.parse::<Severity>().map_err(|_| {
                            InvalidSetting::new(
                                format!("filters.severities[{i}]"),
                                "must be one of SEV1, SEV2, SEV3, SEV4, SEV5",
                            )
                        })
                    })
                    .collect::<Result<BTreeSet<_>, _>>()
            })
            .transpose()?;
        let sources = sources
            .map(|list| {
                non_empty("filters.sources", list.len())?;
                list.iter()
                    .enumerate()
                    .map(|(i, raw)| {
                        let field = format!("filters.sources[{i}]");
                        text(&field, raw).map(str::to_owned)
                    })
                    .collect::<Result<BTreeSet<_>, _>>()
            })
            .transpose()?;
        let labels = labels
            .map(|pairs| {
                non_empty("filters.labels", pairs.len())?;
                for (key, value) in pairs {
                    let field = format!("filters.labels.{key}");
                    text(&field, key)?;
                    if value.chars().count() > Self::MAX_CHARS || value.contains('\0') {
                        return Err(InvalidSetting::new(
                            field,
                            "must be at most 255 characters, without NUL",
                        ));
                    }
                }
                Ok(pairs.clone())
            })
            .transpose()?;
        Ok(WebhookFilters {
            severities,
            sources,
            labels,
        })
    }

    /// Whether every event passes (no filter given).
    pub fn is_empty(&self) -> bool {
        self.severities.is_none() && self.sources.is_none() && self.labels.is_none()
    }
}

fn non_empty(field: &str, len: usize) -> Result<(), InvalidSetting> {
    if len == 0 {
        Err(InvalidSetting::new(
            field,
            "must not be empty; leave the filter out to receive every event",
        ))
    } else if len > WebhookFilters::MAX_ENTRIES {
        Err(InvalidSetting::new(field, "must have at most 50 entries"))
    } else {
        Ok(())
    }
}

fn text<'a>(field: &str, raw: &'a str) -> Result<&'a str, InvalidSetting> {
    if raw.trim().is_empty()
        || raw.chars().count() > WebhookFilters::MAX_CHARS
        || raw.chars().any(char::is_control)
    {
        return Err(InvalidSetting::new(
            field,
            "must be 1 to 255 characters, without control characters",
        ));
    }
    Ok(raw)
}

/// Headers sent with every delivery of a webhook (an API key of the receiver, a routing key),
/// after Tocsin's own. Names are HTTP tokens, kept in lower case; names Tocsin sets or that
/// frame the request are reserved. Values are secrets to whoever reads the delivery log: they
/// are shown as [`WebhookHeaders::MASK`] everywhere but the form that sets them.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WebhookHeaders(BTreeMap<String, String>);

/// Names with their values masked: a record that holds headers never prints them.
impl std::fmt::Debug for WebhookHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|name| (name, Self::MASK)))
            .finish()
    }
}

impl WebhookHeaders {
    /// What a header value reads as outside the form that sets it.
    pub const MASK: &'static str = "***";
    /// Most headers a webhook may have.
    pub const MAX_HEADERS: usize = 20;
    /// Longest name, in bytes.
    pub const MAX_NAME_BYTES: usize = 100;
    /// Longest value, in bytes.
    pub const MAX_VALUE_BYTES: usize = 1000;
    /// Names Tocsin sets itself, or that frame the request or the connection (sent with every
    /// delivery they would break them all); `webhook-`, `tocsin-` and `proxy-` are reserved
    /// prefixes.
    pub const RESERVED: [&'static str; 11] = [
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "host",
        "user-agent",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
    ];
    pub const RESERVED_PREFIXES: [&'static str; 3] = ["webhook-", "tocsin-", "proxy-"];

    /// Headers as a client gave them. A value of [`WebhookHeaders::MASK`] keeps the value the
    /// same name has in `current` (so that a read, changed and written back, keeps its
    /// secrets); without one it is refused.
    pub fn parse(
        given: &BTreeMap<String, String>,
        current: Option<&WebhookHeaders>,
    ) -> Result<Self, InvalidSetting> {
        if given.len() > Self::MAX_HEADERS {
            return Err(InvalidSetting::new(
                "headers",
                "must have at most 20 headers",
            ));
        }
        let mut headers = BTreeMap::new();
        for (raw_name, value) in given {
            let field = format!("headers.{raw_name}");
            let name = raw_name.to_ascii_lowercase();
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || name.len() > Self::MAX_NAME_BYTES || !name.chars().all(token) {
                return Err(InvalidSetting::new(
                    field,
                    "must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~), at most 100 characters",
                ));
            }
            if Self::RESERVED.contains(&name.as_str())
                || Self::RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
            {
                return Err(InvalidSetting::new(
                    field,
                    "is reserved: Tocsin sets content-type, content-length, host, user-agent, webhook-* and tocsin-* itself, and content-encoding, transfer-encoding, connection, keep-alive, upgrade, te, trailer and proxy-* frame the request or the connection",
                ));
            }
            let value = if value == Self::MASK {
                match current.and_then(|c| c.0.get(&name)) {
                    Some(kept) => kept.clone(),
                    None => {
                        return Err(InvalidSetting::new(
                            field,
                            "is the mask of a value that is not set; give the value itself",
                        ))
                    }
                }
            } else {
                value.clone()
            };
            let visible = |c: char| c == '\t' || (' '..='~').contains(&c);
            if value.len() > Self::MAX_VALUE_BYTES || !value.chars().all(visible) {
                return Err(InvalidSetting::new(
                    field,
                    "must be at most 1000 characters of printable ASCII",
                ));
            }
            if headers.insert(name, value).is_some() {
                return Err(InvalidSetting::new(
                    field,
                    "is given twice (header names are not case-sensitive)",
                ));
            }
        }
        Ok(WebhookHeaders(headers))
    }

    /// A stored map (what [`WebhookHeaders::parse`] made), not checked again.
    pub fn from_stored(map: BTreeMap<String, String>) -> Self {
        WebhookHeaders(map)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Names with their values masked, for reads and the delivery log.
    pub fn masked(&self) -> BTreeMap<String, String> {
        self.0
            .keys()
            .map(|name| (name.clone(), Self::MASK.to_owned()))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names and values as they are sent.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

/// At most how many automatic attempts a second a webhook gets, across every dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RateLimit(u32);

impl RateLimit {
    pub const MAX: u32 = 10_000;

    pub fn new(per_second: i64) -> Result<Self, InvalidSetting> {
        u32::try_from(per_second)
            .ok()
            .filter(|n| (1..=Self::MAX).contains(n))
            .map(RateLimit)
            .ok_or_else(|| {
                InvalidSetting::new("rate_limit_per_second", "must be between 1 and 10000")
            })
    }

    pub fn per_second(self) -> u32 {
        self.0
    }
}

/// In what order a webhook receives an incident's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookOrdering {
    /// Every first attempt is made at once (the specification's default): an incident's events
    /// may arrive in any order.
    #[default]
    None,
    /// Each incident's events arrive in the order of the incident's changes: a delivery waits
    /// (`waiting`, `ordering`) until the delivery of the incident's previous event to the same
    /// webhook has finished (succeeded, or failed after its last automatic attempt).
    Incident,
}

impl WebhookOrdering {
    pub const ALL: [WebhookOrdering; 2] = [WebhookOrdering::None, WebhookOrdering::Incident];

    pub fn as_str(self) -> &'static str {
        match self {
            WebhookOrdering::None => "none",
            WebhookOrdering::Incident => "incident",
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidSetting> {
        WebhookOrdering::ALL
            .into_iter()
            .find(|o| o.as_str() == text)
            .ok_or_else(|| InvalidSetting::new("ordering", "must be `none` or `incident`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn filters_are_checked_field_by_field() {
        let sev = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = WebhookFilters::parse(Some(&sev(&["SEV1", "SEV1", "SEV2"])), None, None).unwrap();
        assert_eq!(ok.severities.unwrap().len(), 2);
        let bad = WebhookFilters::parse(Some(&sev(&["SEV1", "sev9"])), None, None).unwrap_err();
        assert_eq!(bad.field, "filters.severities[1]");
        let empty = WebhookFilters::parse(Some(&[]), None, None).unwrap_err();
        assert_eq!(empty.field, "filters.severities");
        let blank = WebhookFilters::parse(None, Some(&sev(&[" "])), None).unwrap_err();
        assert_eq!(blank.field, "filters.sources[0]");
        let label = WebhookFilters::parse(None, None, Some(&map(&[("", "x")]))).unwrap_err();
        assert_eq!(label.field, "filters.labels.");
        assert!(WebhookFilters::parse(None, None, None).unwrap().is_empty());
        // Serialised with only the filters given, as the fan-out's SQL reads them.
        let some = WebhookFilters::parse(None, None, Some(&map(&[("team", "db")]))).unwrap();
        assert_eq!(
            serde_json::to_string(&some).unwrap(),
            r#"{"labels":{"team":"db"}}"#
        );
    }

    #[test]
    fn reserved_and_malformed_header_names_are_refused() {
        for name in [
            "Content-Type",
            "content-length",
            "Host",
            "user-agent",
            "Webhook-Signature",
            "webhook-id",
            "tocsin-event",
            "Tocsin-Anything",
            "Transfer-Encoding",
            "content-encoding",
            "Connection",
            "keep-alive",
            "upgrade",
            "TE",
            "trailer",
            "Proxy-Authorization",
        ] {
            let error = WebhookHeaders::parse(&map(&[(name, "x")]), None).unwrap_err();
            assert_eq!(error.field, format!("headers.{name}"));
            assert!(error.message.contains("reserved"), "{name}: {error}");
        }
        for name in ["", "with space", "colon:", "nl\n"] {
            assert!(WebhookHeaders::parse(&map(&[(name, "x")]), None).is_err());
        }
        assert!(WebhookHeaders::parse(&map(&[("x-a", "line\r\nx-b: 1")]), None).is_err());
        assert!(WebhookHeaders::parse(&map(&[("X-A", "1"), ("x-a", "2")]), None).is_err());
        let ok = WebhookHeaders::parse(&map(&[("X-Team-Key", "k1")]), None).unwrap();
        assert_eq!(ok.iter().collect::<Vec<_>>(), vec![("x-team-key", "k1")]);
        assert_eq!(ok.masked(), map(&[("x-team-key", "***")]));
        assert_eq!(format!("{ok:?}"), r#"{"x-team-key": "***"}"#);
    }

    #[test]
    fn a_masked_value_keeps_the_stored_one() {
        let current = WebhookHeaders::parse(&map(&[("x-key", "secret")]), None).unwrap();
        let again =
            WebhookHeaders::parse(&map(&[("X-Key", "***"), ("x-new", "2")]), Some(&current))
                .unwrap();
        assert_eq!(again.as_map(), &map(&[("x-key", "secret"), ("x-new", "2")]));
        assert!(WebhookHeaders::parse(&map(&[("x-other", "***")]), Some(&current)).is_err());
    }

    #[test]
    fn rate_limits_are_bounded() {
        assert_eq!(RateLimit::new(1).unwrap().per_second(), 1);
        assert!(RateLimit::new(10_000).is_ok());
        assert!(RateLimit::new(0).is_err());
        assert!(RateLimit::new(10_001).is_err());
        assert!(RateLimit::new(-1).is_err());
    }
}
