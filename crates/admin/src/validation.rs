//! Turning webhook input into validated records. The JSON API and the settings forms both call
//! these functions, so every rule lives in one place; they collect every refused field (the
//! forms show each beside its input, the API answers with the first).

use std::collections::{BTreeMap, BTreeSet};

use tocsin_domain::{
    EventKind, InvalidRetry, InvalidSetting, RateLimit, RetrySettings, TargetUrl, WebhookFilters,
    WebhookHeaders, WebhookName, WebhookOrdering,
};
use tocsin_storage::webhooks::{NewWebhook, WebhookChanges};

use crate::error::AdminError;
use crate::store::WebhookPatch;

/// One refused field: its name as the API spells it (`name`, `url`, `events`, `events[1]`,
/// `retry.max_attempts`, `retry.timeout_ms`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl ToString) -> Self {
        FieldError {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

/// Every refused field of one input, in the order of the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl From<FieldErrors> for AdminError {
    /// The API answers 422 naming the first refused field.
    fn from(errors: FieldErrors) -> Self {
        match errors.0.into_iter().next() {
            Some(first) => AdminError::invalid(first.field, first.message),
            None => AdminError::invalid("body", "is not acceptable"),
        }
    }
}

/// A webhook's fields as a client gave them, before validation. `None` means left out: a
/// default at creation, unchanged in a change.
#[derive(Debug, Clone, Copy, Default)]
pub struct WebhookInput<'a> {
    pub name: Option<&'a str>,
    pub url: Option<&'a str>,
    pub events: Option<&'a [String]>,
    pub max_attempts: Option<i64>,
    pub timeout_ms: Option<i64>,
    pub enabled: Option<bool>,
    pub filters: Option<FiltersInput<'a>>,
    pub headers: Option<&'a BTreeMap<String, String>>,
    /// The headers as stored, in a change: a value given as `***` keeps its stored value.
    pub current_headers: Option<&'a WebhookHeaders>,
    /// `Some(None)`: no limit.
    pub rate_limit_per_second: Option<Option<i64>>,
    pub ordering: Option<WebhookOrdering>,
}

/// Subscription filters as a client gave them; each `None` is a filter left out.
#[derive(Debug, Clone, Copy, Default)]
pub struct FiltersInput<'a> {
    pub severities: Option<&'a [String]>,
    pub sources: Option<&'a [String]>,
    pub labels: Option<&'a BTreeMap<String, String>>,
}

impl From<InvalidSetting> for FieldError {
    fn from(error: InvalidSetting) -> Self {
        FieldError::new(error.field, error.message)
    }
}

/// The settings beyond the target and retries, each checked on its own.
struct Subscription {
    filters: Option<Option<WebhookFilters>>,
    headers: Option<Option<WebhookHeaders>>,
    rate_limit: Option<Option<Option<RateLimit>>>,
}

fn parse_subscription(input: &WebhookInput<'_>, errors: &mut Collector) -> Subscription {
    let filters = input.filters.map(|f| {
        errors.check(
            WebhookFilters::parse(f.severities, f.sources, f.labels).map_err(FieldError::from),
        )
    });
    let headers = input.headers.map(|given| {
        errors.check(WebhookHeaders::parse(given, input.current_headers).map_err(FieldError::from))
    });
    let rate_limit = input.rate_limit_per_second.map(|limit| match limit {
        None => Some(None),
        Some(n) => errors
            .check(RateLimit::new(n).map_err(FieldError::from))
            .map(Some),
    });
    Subscription {
        filters,
        headers,
        rate_limit,
    }
}

/// Collects the outcome of each field check, keeping every error.
#[derive(Default)]
struct Collector(Vec<FieldError>);

impl Collector {
    fn check<T>(&mut self, result: Result<T, FieldError>) -> Option<T> {
        result.map_err(|error| self.0.push(error)).ok()
    }

    fn finish<T>(self, value: impl FnOnce() -> Option<T>) -> Result<T, FieldErrors> {
        if self.0.is_empty() {
            value().ok_or_else(|| FieldErrors(vec![FieldError::new("body", "is not acceptable")]))
        } else {
            Err(FieldErrors(self.0))
        }
    }
}

/// Validates a new webhook: name, URL and events are required; retry settings and `enabled`
/// take their defaults (5 attempts, 10 s, enabled) when left out.
pub fn new_webhook(input: &WebhookInput<'_>) -> Result<NewWebhook, FieldErrors> {
    let mut errors = Collector::default();
    let name = errors.check(parse_name(input.name.unwrap_or("")));
    let url = errors.check(parse_url(input.url.unwrap_or("")));
    let events = errors.check(parse_events(input.events.unwrap_or(&[])));
    let (max_attempts, timeout_ms) = parse_retry_fields(input, &mut errors);
    let subscription = parse_subscription(input, &mut errors);
    let defaults = RetrySettings::default();
    let retry = RetrySettings::new(
        max_attempts.unwrap_or(defaults.max_attempts()).into(),
        timeout_ms.unwrap_or(defaults.timeout_ms()).into(),
    )
    .ok();
    errors.finish(|| {
        Some(NewWebhook {
            name: name?,
            url: url?,
            events: events?,
            retry: retry?,
            enabled: input.enabled.unwrap_or(true),
            filters: subscription
                .filters
                .unwrap_or(Some(WebhookFilters::default()))?,
            headers: subscription
                .headers
                .unwrap_or(Some(WebhookHeaders::default()))?,
            rate_limit: subscription.rate_limit.unwrap_or(Some(None))?,
            ordering: input.ordering.unwrap_or_default(),
        })
    })
}

/// Validates a change: each given field as at creation; retry fields left out keep their
/// current values (merged by `store::update_webhook`).
pub fn webhook_patch(input: &WebhookInput<'_>) -> Result<WebhookPatch, FieldErrors> {
    let mut errors = Collector::default();
    let name = input.name.map(|name| errors.check(parse_name(name)));
    let url = input.url.map(|url| errors.check(parse_url(url)));
    let events = input
        .events
        .map(|events| errors.check(parse_events(events)));
    let (max_attempts, timeout_ms) = parse_retry_fields(input, &mut errors);
    let subscription = parse_subscription(input, &mut errors);
    errors.finish(|| {
        Some(WebhookPatch {
            changes: WebhookChanges {
                name: match name {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                url: match url {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                events: match events {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                retry: None,
                enabled: input.enabled,
                filters: match subscription.filters {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                headers: match subscription.headers {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                rate_limit: match subscription.rate_limit {
                    Some(checked) => Some(checked?),
                    None => None,
                },
                ordering: input.ordering,
            },
            max_attempts,
            timeout_ms,
        })
    })
}

fn parse_name(raw: &str) -> Result<WebhookName, FieldError> {
    WebhookName::parse(raw).map_err(|e| FieldError::new("name", e))
}

fn parse_url(raw: &str) -> Result<TargetUrl, FieldError> {
    TargetUrl::parse(raw).map_err(|e| FieldError::new("url", e))
}

fn parse_events(raw: &[String]) -> Result<BTreeSet<EventKind>, FieldError> {
    if raw.is_empty() {
        return Err(FieldError::new(
            "events",
            "must list at least one event kind",
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, kind)| {
            kind.parse::<EventKind>()
                .map_err(|e| FieldError::new(format!("events[{i}]"), e))
        })
        .collect()
}

/// Checks each given retry field on its own; returns them as the domain holds them.
fn parse_retry_fields(
    input: &WebhookInput<'_>,
    errors: &mut Collector,
) -> (Option<u8>, Option<u32>) {
    let defaults = RetrySettings::default();
    let check = |max: i64, timeout: i64| {
        RetrySettings::new(max, timeout).map_err(|e: InvalidRetry| FieldError::new(e.field(), e))
    };
    let max_attempts = input.max_attempts.and_then(|max| {
        errors.check(check(max, defaults.timeout_ms().into()).map(RetrySettings::max_attempts))
    });
    let timeout_ms = input.timeout_ms.and_then(|timeout| {
        errors.check(check(defaults.max_attempts().into(), timeout).map(RetrySettings::timeout_ms))
    });
    (max_attempts, timeout_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(kinds: &[&str]) -> Vec<String> {
        kinds.iter().map(|k| (*k).to_owned()).collect()
    }

    fn fields(errors: FieldErrors) -> Vec<String> {
        errors.0.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn creation_defaults_and_field_names() {
        let kinds = events(&["incidents.opened", "incidents.opened"]);
        let input = WebhookInput {
            name: Some("ops"),
            url: Some("https://example.com/hook"),
            events: Some(&kinds),
            ..WebhookInput::default()
        };
        let record = new_webhook(&input).unwrap();
        assert_eq!(record.events.len(), 1);
        assert_eq!(record.retry, RetrySettings::default());
        assert!(record.enabled);

        let retry = new_webhook(&WebhookInput {
            max_attempts: Some(2),
            ..input
        })
        .unwrap()
        .retry;
        assert_eq!((retry.max_attempts(), retry.timeout_ms()), (2, 10_000));
    }

    #[test]
    fn every_refused_field_is_reported_in_order() {
        let kinds = events(&["incidents.opened", "incident.closed"]);
        let errors = new_webhook(&WebhookInput {
            name: Some("  "),
            url: Some("ftp://example.com/"),
            events: Some(&kinds),
            max_attempts: Some(6),
            timeout_ms: Some(999),
            ..WebhookInput::default()
        })
        .unwrap_err();
        assert_eq!(
            fields(errors),
            [
                "name",
                "url",
                "events[1]",
                "retry.max_attempts",
                "retry.timeout_ms"
            ]
        );
        let errors = new_webhook(&WebhookInput::default()).unwrap_err();
        assert_eq!(fields(errors), ["name", "url", "events"]);
    }

    #[test]
    fn the_api_answers_with_the_first_field() {
        let error = AdminError::from(new_webhook(&WebhookInput::default()).unwrap_err());
        assert!(matches!(error, AdminError::Invalid { field, .. } if field == "name"));
    }

    #[test]
    fn a_change_checks_only_what_it_gives() {
        let patch = webhook_patch(&WebhookInput {
            timeout_ms: Some(2000),
            ..WebhookInput::default()
        })
        .unwrap();
        assert_eq!((patch.max_attempts, patch.timeout_ms), (None, Some(2000)));
        assert!(patch.changes.name.is_none());
        let none: Vec<String> = Vec::new();
        let errors = webhook_patch(&WebhookInput {
            events: Some(&none),
            url: Some("nope"),
            ..WebhookInput::default()
        })
        .unwrap_err();
        assert_eq!(fields(errors), ["url", "events"]);
    }
}
