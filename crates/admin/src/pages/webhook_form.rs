//! The webhook form of the settings pages, shared by create and edit: the page, the values
//! it shows, and a submitted form read and checked before `crate::validation` judges it.

use std::collections::BTreeMap;

use tocsin_domain::{
    EventKind, InvalidRetry, RetrySettings, Severity, WebhookHeaders, WebhookOrdering,
};
use tocsin_storage::webhooks::Webhook;
use uuid::Uuid;

use super::session::Session;
use super::templates::{
    event_description, schedule_steps, schedule_text, EventOption, FormErrors, WebhookFormPage,
    WebhookFormValues,
};
use super::{webhook_href, Form, PagesState};
use crate::validation::{FieldError, FieldErrors, FiltersInput, WebhookInput};

/// A submitted webhook form: the values as typed, what its subscription fields say, and the
/// fields refused before validation (not numbers, lines that are not pairs).
pub(super) struct Submitted {
    values: WebhookFormValues,
    fields: SubscriptionFields,
    refused: Vec<FieldError>,
}

impl Submitted {
    pub(super) fn read(form: &Form) -> Self {
        let (values, mut refused) = read_values(form);
        let fields = SubscriptionFields::read(&values, &mut refused);
        Submitted {
            values,
            fields,
            refused,
        }
    }

    /// What `crate::validation` takes: `enabled` for a new webhook, and for a change the
    /// stored headers whose values a `***` sent back keeps.
    pub(super) fn input<'a>(
        &'a self,
        enabled: Option<bool>,
        current_headers: Option<&'a WebhookHeaders>,
    ) -> WebhookInput<'a> {
        let values = &self.values;
        WebhookInput {
            name: Some(&values.name),
            url: Some(&values.url),
            events: Some(&values.events),
            max_attempts: number(&values.max_attempts),
            timeout_ms: number(&values.timeout_ms),
            enabled,
            filters: Some(self.fields.filters()),
            headers: Some(&self.fields.headers),
            current_headers,
            rate_limit_per_second: Some(self.fields.rate_limit),
            ordering: self.fields.ordering,
        }
    }

    /// The validated value, unless a field was refused; then the values as typed and every
    /// refusal beside its field, to show the form again.
    pub(super) fn checked<T>(
        self,
        validated: Result<T, FieldErrors>,
    ) -> Result<T, Box<(WebhookFormValues, FormErrors)>> {
        match validated {
            Ok(value) if self.refused.is_empty() => Ok(value),
            other => Err(Box::new((
                self.values,
                form_errors(self.refused, other.err()),
            ))),
        }
    }
}

/// The create form's values: empty, with the default retry settings.
pub(super) fn new_values() -> WebhookFormValues {
    let defaults = RetrySettings::default();
    WebhookFormValues {
        max_attempts: defaults.max_attempts().to_string(),
        timeout_ms: defaults.timeout_ms().to_string(),
        ordering: WebhookOrdering::default().as_str().to_owned(),
        ..WebhookFormValues::default()
    }
}

/// The edit form's values: the webhook's as stored (header values masked as `***`).
pub(super) fn edit_values(webhook: &Webhook) -> WebhookFormValues {
    WebhookFormValues {
        name: webhook.name.as_str().to_owned(),
        url: webhook.url.as_str().to_owned(),
        events: webhook
            .events
            .iter()
            .map(|e| e.as_str().to_owned())
            .collect(),
        max_attempts: webhook.retry.max_attempts().to_string(),
        timeout_ms: webhook.retry.timeout_ms().to_string(),
        severities: webhook
            .filters
            .severities
            .iter()
            .flatten()
            .map(|s| s.as_str().to_owned())
            .collect(),
        sources: webhook
            .filters
            .sources
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        labels: lines(webhook.filters.labels.iter().flatten(), "="),
        headers: lines(webhook.headers.iter(), ": "),
        rate_limit: webhook
            .rate_limit
            .map(|r| r.per_second().to_string())
            .unwrap_or_default(),
        ordering: webhook.ordering.as_str().to_owned(),
    }
}

/// Which form: a new webhook, or a change of one.
pub(super) enum FormKind {
    Create,
    Edit { id: Uuid, name: String },
}

impl FormKind {
    pub(super) fn edit(webhook: &Webhook) -> Self {
        FormKind::Edit {
            id: webhook.id,
            name: webhook.name.as_str().to_owned(),
        }
    }
}

pub(super) fn form_page(
    session: &Session,
    pages: &PagesState,
    kind: FormKind,
    values: WebhookFormValues,
    errors: FormErrors,
) -> WebhookFormPage {
    let max_attempts = values
        .max_attempts
        .trim()
        .parse::<u8>()
        .unwrap_or(RetrySettings::MAX_ATTEMPTS);
    let event_options = EventKind::ALL
        .iter()
        .enumerate()
        .map(|(i, kind)| EventOption {
            id: format!("event-{i}"),
            value: kind.as_str(),
            description: event_description(*kind),
            checked: values.events.iter().any(|e| e == kind.as_str()),
        })
        .collect();
    let severity_options = Severity::ALL
        .iter()
        .enumerate()
        .map(|(i, sev)| {
            (
                format!("severity-{i}"),
                sev.as_str(),
                values.severities.iter().any(|s| s == sev.as_str()),
            )
        })
        .collect();
    let (heading, breadcrumb, action, submit_label, cancel_href) = match kind {
        FormKind::Create => (
            "Create outbound webhook".to_owned(),
            None,
            "/settings/webhooks/new".to_owned(),
            "Create webhook",
            "/settings/".to_owned(),
        ),
        FormKind::Edit { id, name } => (
            format!("Edit {name}"),
            Some((name, webhook_href(id))),
            format!("/settings/webhooks/{id}/edit"),
            "Save changes",
            webhook_href(id),
        ),
    };
    WebhookFormPage {
        layout: session.layout("webhooks"),
        heading,
        breadcrumb,
        action,
        submit_label,
        cancel_href,
        values,
        errors,
        event_options,
        severity_options,
        schedule_steps: schedule_steps(&pages.schedule).join("|"),
        schedule_text: schedule_text(&pages.schedule, max_attempts),
        max_attempts_limit: RetrySettings::MAX_ATTEMPTS,
    }
}

/// The form's fields as typed, and the refusals of fields that are not even numbers (the rest
/// is `crate::validation`'s to judge).
fn read_values(form: &Form) -> (WebhookFormValues, Vec<FieldError>) {
    let values = WebhookFormValues {
        name: form.get("name").unwrap_or_default().to_owned(),
        url: form.get("url").unwrap_or_default().to_owned(),
        events: form.all("events"),
        max_attempts: form.get("max_attempts").unwrap_or_default().to_owned(),
        timeout_ms: form.get("timeout_ms").unwrap_or_default().to_owned(),
        severities: form.all("severities"),
        sources: form.get("sources").unwrap_or_default().to_owned(),
        labels: form.get("labels").unwrap_or_default().to_owned(),
        headers: form.get("headers").unwrap_or_default().to_owned(),
        rate_limit: form.get("rate_limit").unwrap_or_default().to_owned(),
        ordering: form.get("ordering").unwrap_or("none").to_owned(),
    };
    let mut refused = Vec::new();
    for (text, error) in [
        (&values.max_attempts, InvalidRetry::MaxAttempts),
        (&values.timeout_ms, InvalidRetry::Timeout),
    ] {
        let text = text.trim();
        if !text.is_empty() && text.parse::<i64>().is_err() {
            refused.push(FieldError::new(error.field(), error));
        }
    }
    let rate = values.rate_limit.trim();
    if !rate.is_empty() && rate.parse::<i64>().is_err() {
        refused.push(FieldError::new(
            "rate_limit_per_second",
            "must be a whole number from 1 to 10000, or empty for no limit",
        ));
    }
    (values, refused)
}

/// What the form's subscription fields say, as the API takes them.
struct SubscriptionFields {
    severities: Vec<String>,
    sources: Vec<String>,
    labels: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    rate_limit: Option<i64>,
    ordering: Option<WebhookOrdering>,
}

impl SubscriptionFields {
    /// Reads them, refusing lines that are not `key=value` (labels) or `Name: value`
    /// (headers).
    fn read(values: &WebhookFormValues, refused: &mut Vec<FieldError>) -> Self {
        let pairs = |text: &str, separator: char, field: &str, refused: &mut Vec<FieldError>| {
            let mut map = BTreeMap::new();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                match line.split_once(separator) {
                    Some((key, value)) => {
                        map.insert(key.trim().to_owned(), value.trim().to_owned());
                    }
                    // The line is not echoed: a header's may hold its secret value.
                    None => refused.push(FieldError::new(
                        field,
                        format!("each line must be name{separator}value"),
                    )),
                }
            }
            map
        };
        SubscriptionFields {
            severities: values.severities.clone(),
            sources: values
                .sources
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            labels: pairs(&values.labels, '=', "filters.labels", refused),
            headers: pairs(&values.headers, ':', "headers", refused),
            rate_limit: number(&values.rate_limit),
            ordering: match WebhookOrdering::parse(values.ordering.trim()) {
                Ok(ordering) => Some(ordering),
                Err(error) => {
                    refused.push(FieldError::new(error.field, error.message));
                    None
                }
            },
        }
    }

    /// The filters: an empty field is a filter left out.
    fn filters(&self) -> FiltersInput<'_> {
        FiltersInput {
            severities: (!self.severities.is_empty()).then_some(self.severities.as_slice()),
            sources: (!self.sources.is_empty()).then_some(self.sources.as_slice()),
            labels: (!self.labels.is_empty()).then_some(&self.labels),
        }
    }
}

fn number(text: &str) -> Option<i64> {
    text.trim().parse().ok()
}

fn form_errors(refused: Vec<FieldError>, validation: Option<FieldErrors>) -> FormErrors {
    let mut errors = FormErrors::default();
    for error in refused
        .into_iter()
        .chain(validation.into_iter().flat_map(|e| e.0))
    {
        errors.add(&error.field, error.message);
    }
    errors
}

/// Pairs as the form's text areas hold them, one a line.
fn lines<K: AsRef<str>, V: AsRef<str>>(
    pairs: impl Iterator<Item = (K, V)>,
    separator: &str,
) -> String {
    pairs
        .map(|(k, v)| format!("{}{separator}{}", k.as_ref(), v.as_ref()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_numbers_are_refused_with_the_domain_message() {
        let form = Form::default();
        let (_, refused) = read_values(&form);
        assert!(refused.is_empty());
        let errors = form_errors(
            vec![FieldError::new(
                "retry.max_attempts",
                InvalidRetry::MaxAttempts,
            )],
            Some(FieldErrors(vec![FieldError::new(
                "url",
                "must have a host",
            )])),
        );
        assert_eq!(
            errors.max_attempts.as_deref(),
            Some("max_attempts must be between 1 and 5")
        );
        assert_eq!(errors.url.as_deref(), Some("must have a host"));
        assert!(errors.name.is_none());
    }
}
