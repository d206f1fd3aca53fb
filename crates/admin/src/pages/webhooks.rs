//! Settings → Webhooks: the list, the create and edit forms, a webhook's page with its
//! delivery log, and its actions (enable, disable, rotate the secret, test event, recover,
//! delete).

use std::collections::{BTreeMap, HashMap};

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime};
use tocsin_domain::{EventKind, InvalidRetry, RetrySettings, Severity, WebhookFilters};
use tocsin_storage::deliveries::{self, DeliveryFilter};
use tocsin_storage::health;
use tocsin_storage::webhooks::{self as repo, Webhook};
use uuid::Uuid;

use super::deliveries::{delivery_log, LogQuery};
use super::session::{Session, SignedForm};
use super::templates::{
    event_description, schedule_steps, schedule_text, state_label, ConfirmDeletePage, EventOption,
    FormErrors, HealthView, LastDelivery, SecretPage, WebhookFormPage, WebhookFormValues,
    WebhookListPage, WebhookPage, WebhookRow, WebhookView, When,
};
use super::{
    given, notice, query_string, redirect, render, webhook_href, Form, PageError, PagesState,
};
use crate::actions;
use crate::error::{AdminError, OrNotFound};
use crate::params::page;
use crate::state::AdminState;
use crate::validation::{self, FieldError, FieldErrors, FiltersInput, WebhookInput};

/// Paging and the notice of a redirect.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    cursor: Option<String>,
    notice: Option<String>,
}

/// `GET /settings/`: every webhook with its newest delivery.
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let page = page(None, given(&query.cursor))?;
    let mut conn = state.conn().await?;
    let (webhooks, next) = repo::list(&mut conn, &page).await?;
    let ids: Vec<Uuid> = webhooks.iter().map(|w| w.id).collect();
    let latest: HashMap<Uuid, deliveries::Delivery> =
        deliveries::latest_for_webhooks(&mut conn, &ids)
            .await?
            .into_iter()
            .map(|d| (d.webhook_id, d))
            .collect();
    let mut health = health::for_webhooks(&mut conn, &ids).await?;
    let rows = webhooks
        .iter()
        .map(|webhook| WebhookRow {
            health: HealthView::of(&health.remove(&webhook.id).unwrap_or_default()),
            href: webhook_href(webhook.id),
            name: webhook.name.as_str().to_owned(),
            url: webhook.url.as_str().to_owned(),
            events: webhook.events.iter().map(|e| e.as_str()).collect(),
            enabled: webhook.enabled,
            last: latest.get(&webhook.id).map(|d| LastDelivery {
                href: format!("/settings/deliveries/{}", d.id),
                state: d.state.as_str(),
                label: state_label(d.state),
                at: When::of(d.updated_at),
            }),
        })
        .collect();
    render(
        StatusCode::OK,
        &WebhookListPage {
            layout: session.layout("webhooks"),
            notice: notice(query.notice.as_deref(), None),
            rows,
            next_page: next.map(|c| {
                format!(
                    "/settings/?{}",
                    query_string([("cursor", c.encode().as_str())])
                )
            }),
        },
    )
}

/// `GET /settings/webhooks/new`: the create form.
#[tracing::instrument(skip_all)]
pub async fn new_form(
    session: Session,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let defaults = RetrySettings::default();
    let values = WebhookFormValues {
        max_attempts: defaults.max_attempts().to_string(),
        timeout_ms: defaults.timeout_ms().to_string(),
        ..WebhookFormValues::default()
    };
    render(
        StatusCode::OK,
        &form_page(
            &session,
            &pages,
            FormKind::Create,
            values,
            FormErrors::default(),
        ),
    )
}

/// Which form: a new webhook, or a change of one.
enum FormKind {
    Create,
    Edit { id: Uuid, name: String },
}

fn form_page(
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

/// The form's fields as typed, and the refusals of fields that are not even numbers or
/// `key=value` lines (the rest is `crate::validation`'s to judge).
fn read_webhook_form(form: &Form) -> (WebhookFormValues, Vec<FieldError>) {
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

/// `POST /settings/webhooks/new`: creates the webhook and shows its secret once, or shows the
/// form again (422) with each refused field's error beside it.
#[tracing::instrument(skip_all)]
pub async fn create(
    signed: SignedForm,
    state: web::Data<AdminState>,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let SignedForm { session, form } = signed;
    let (values, mut refused) = read_webhook_form(&form);
    let fields = SubscriptionFields::read(&values, &mut refused);
    let input = WebhookInput {
        name: Some(&values.name),
        url: Some(&values.url),
        events: Some(&values.events),
        max_attempts: number(&values.max_attempts),
        timeout_ms: number(&values.timeout_ms),
        enabled: Some(true),
        filters: Some(fields.filters()),
        headers: Some(&fields.headers),
        current_headers: None,
        rate_limit_per_second: Some(fields.rate_limit),
    };
    let validated = validation::new_webhook(&input);
    let record = match validated {
        Ok(record) if refused.is_empty() => record,
        other => {
            let errors = form_errors(refused, other.err());
            return render(
                StatusCode::UNPROCESSABLE_ENTITY,
                &form_page(&session, &pages, FormKind::Create, values, errors),
            );
        }
    };
    let webhook = actions::create_webhook(&state, &record).await?;
    render(
        StatusCode::OK,
        &secret_page(
            &session,
            &webhook,
            "Webhook created",
            "Copy the signing secret now: this page shows it once. Receivers use it to check \
             that each delivery comes from Tocsin.",
        ),
    )
}

fn secret_page(
    session: &Session,
    webhook: &Webhook,
    heading: &'static str,
    intro: &'static str,
) -> SecretPage {
    let now = OffsetDateTime::now_utc();
    SecretPage {
        layout: session.layout("webhooks"),
        heading,
        intro,
        webhook_name: webhook.name.as_str().to_owned(),
        webhook_href: webhook_href(webhook.id),
        secret: webhook.secret.expose().to_owned(),
        previous_expires: webhook
            .previous_secret
            .as_ref()
            .map(|(_, expires)| *expires)
            .filter(|expires| *expires > now)
            .map(When::of),
    }
}

/// `GET /settings/webhooks/{id}`: the webhook, its actions and its delivery log.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn detail(
    session: Session,
    id: web::Path<Uuid>,
    query: web::Query<LogQuery>,
    state: web::Data<AdminState>,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let mut conn = state.conn().await?;
    let webhook = repo::get_any(&mut conn, *id)
        .await
        .or_not_found("webhook")?;
    let health = health::for_webhooks(&mut conn, &[webhook.id])
        .await?
        .remove(&webhook.id)
        .unwrap_or_default();
    drop(conn);
    let filter = DeliveryFilter {
        webhook_id: Some(webhook.id),
        ..query.filter()?
    };
    let log = delivery_log(
        &state,
        &webhook_href(webhook.id),
        &query,
        filter,
        Vec::new(),
        false,
    )
    .await?;
    let now = OffsetDateTime::now_utc();
    let view = WebhookView {
        id: webhook.id.to_string(),
        href: webhook_href(webhook.id),
        name: webhook.name.as_str().to_owned(),
        url: webhook.url.as_str().to_owned(),
        events: webhook.events.iter().map(|e| e.as_str()).collect(),
        enabled: webhook.enabled,
        deleted: webhook.is_deleted(),
        max_attempts: webhook.retry.max_attempts(),
        schedule_text: schedule_text(&pages.schedule, webhook.retry.max_attempts()),
        timeout: format!("{} ms", webhook.retry.timeout_ms()),
        created: When::of(webhook.created_at),
        updated: When::of(webhook.updated_at),
        previous_secret_expires: webhook
            .previous_secret
            .as_ref()
            .map(|(_, expires)| *expires)
            .filter(|expires| *expires > now)
            .map(When::of),
        disabled_reason: webhook.disabled_reason.clone(),
        disabled_at: webhook.disabled_at.map(When::of),
        health: HealthView::of(&health),
        filters: describe_filters(&webhook.filters),
        header_names: webhook
            .headers
            .iter()
            .map(|(name, _)| name.to_owned())
            .collect(),
        rate_limit: webhook.rate_limit.map(|r| r.per_second()),
    };
    let day_ago = now - time::Duration::DAY;
    render(
        StatusCode::OK,
        &WebhookPage {
            layout: session.layout("webhooks"),
            notice: notice(query.notice.as_deref(), query.count.as_deref()),
            webhook: view,
            log,
            recover_since: day_ago
                .format(format_description!("[year]-[month]-[day]T[hour]:[minute]"))
                .unwrap_or_default(),
        },
    )
}

/// The filters in words, one line each.
fn describe_filters(filters: &WebhookFilters) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(severities) = &filters.severities {
        let list: Vec<&str> = severities.iter().map(|s| s.as_str()).collect();
        lines.push(format!("Severity is {}", list.join(" or ")));
    }
    if let Some(sources) = &filters.sources {
        let list: Vec<&str> = sources.iter().map(String::as_str).collect();
        lines.push(format!("Format or source is {}", list.join(" or ")));
    }
    if let Some(labels) = &filters.labels {
        let list: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push(format!("Labels include {}", list.join(", ")));
    }
    lines
}

/// `GET /settings/webhooks/{id}/edit`: the edit form with the current values.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn edit_form(
    session: Session,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let mut conn = state.conn().await?;
    let webhook = repo::get(&mut conn, *id).await.or_not_found("webhook")?;
    let values = WebhookFormValues {
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
    };
    let kind = FormKind::Edit {
        id: webhook.id,
        name: webhook.name.as_str().to_owned(),
    };
    render(
        StatusCode::OK,
        &form_page(&session, &pages, kind, values, FormErrors::default()),
    )
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

/// `POST /settings/webhooks/{id}/edit`: saves the change, or shows the form again (422).
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn update(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let SignedForm { session, form } = signed;
    let (values, mut refused) = read_webhook_form(&form);
    let fields = SubscriptionFields::read(&values, &mut refused);
    let mut conn = state.conn().await?;
    let current = repo::get(&mut conn, *id).await.or_not_found("webhook")?;
    drop(conn);
    let input = WebhookInput {
        name: Some(&values.name),
        url: Some(&values.url),
        events: Some(&values.events),
        max_attempts: number(&values.max_attempts),
        timeout_ms: number(&values.timeout_ms),
        enabled: None,
        filters: Some(fields.filters()),
        headers: Some(&fields.headers),
        current_headers: Some(&current.headers),
        rate_limit_per_second: Some(fields.rate_limit),
    };
    let patch = match validation::webhook_patch(&input) {
        Ok(patch) if refused.is_empty() => patch,
        other => {
            let errors = form_errors(refused, other.err());
            let kind = FormKind::Edit {
                id: current.id,
                name: current.name.as_str().to_owned(),
            };
            return render(
                StatusCode::UNPROCESSABLE_ENTITY,
                &form_page(&session, &pages, kind, values, errors),
            );
        }
    };
    let webhook = actions::update_webhook(&state, *id, &patch).await?;
    Ok(redirect(&format!(
        "{}?notice=updated",
        webhook_href(webhook.id)
    )))
}

/// Which way `POST /settings/webhooks/{id}/{switch}` turns the webhook.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    Enable,
    /// Also stops its unfinished deliveries.
    Disable,
}

/// `POST /settings/webhooks/{id}/enable` and `.../disable`.
#[tracing::instrument(skip_all, fields(id = %path.0, switch = ?path.1))]
pub async fn set_enabled(
    _: SignedForm,
    path: web::Path<(Uuid, Switch)>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let (id, switch) = *path;
    let enabled = matches!(switch, Switch::Enable);
    let patch = validation::webhook_patch(&WebhookInput {
        enabled: Some(enabled),
        ..WebhookInput::default()
    })
    .map_err(AdminError::from)?;
    actions::update_webhook(&state, id, &patch).await?;
    let notice = if enabled { "enabled" } else { "disabled" };
    Ok(redirect(&format!("{}?notice={notice}", webhook_href(id))))
}

/// `POST /settings/webhooks/{id}/rotate-secret`: shows the new secret once.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn rotate_secret(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let session = signed.session;
    let webhook = actions::rotate_secret(&state, *id).await?;
    render(
        StatusCode::OK,
        &secret_page(
            &session,
            &webhook,
            "Signing secret rotated",
            "Copy the new signing secret now: this page shows it once. Deliveries carry \
             signatures with both secrets until the old one expires, so receivers can switch \
             without missing any.",
        ),
    )
}

/// `POST /settings/webhooks/{id}/test`: sends a sample `incidents.opened` event to it.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn send_test_event(
    _: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    actions::send_test_event(&state, *id).await?;
    Ok(redirect(&format!("{}?notice=test", webhook_href(*id))))
}

/// `POST /settings/webhooks/{id}/recover`: sends what the webhook missed since a time (UTC):
/// failed deliveries get a manual attempt, those waiting because it was disabled are made due.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn recover(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let form = signed.form;
    let since = parse_since(form.get("since").unwrap_or_default())
        .map_err(|message| AdminError::invalid("since", message))?;
    let (retried, sent_waiting) = actions::recover(&state, *id, since).await?;
    Ok(redirect(&format!(
        "{}?notice=recovered&count={}",
        webhook_href(*id),
        retried + sent_waiting
    )))
}

/// A time from the recover form: the browser's `datetime-local` value, taken as UTC
/// (`2026-11-22T01:32`, seconds optional), or an RFC 3339 time.
fn parse_since(text: &str) -> Result<OffsetDateTime, &'static str> {
    let text = text.trim();
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at);
    }
    let minutes = format_description!("[year]-[month]-[day]T[hour]:[minute]");
    let seconds = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    PrimitiveDateTime::parse(text, &minutes)
        .or_else(|_| PrimitiveDateTime::parse(text, &seconds))
        .map(PrimitiveDateTime::assume_utc)
        .map_err(|_| "must be a date and time (UTC), such as 2026-11-22T01:32")
}

/// `POST /settings/webhooks/{id}/delete`: asks for confirmation unless the form says it was
/// given (the page's script asks in a dialog), then deletes.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn delete(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let SignedForm { session, form } = signed;
    if form.get("confirmed") != Some("yes") {
        let mut conn = state.conn().await?;
        let webhook = repo::get(&mut conn, *id).await.or_not_found("webhook")?;
        return render(
            StatusCode::OK,
            &ConfirmDeletePage {
                layout: session.layout("webhooks"),
                name: webhook.name.as_str().to_owned(),
                action: format!("/settings/webhooks/{}/delete", webhook.id),
                cancel_href: webhook_href(webhook.id),
            },
        );
    }
    actions::delete_webhook(&state, *id).await?;
    Ok(redirect("/settings/?notice=deleted"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_the_browser_value_as_utc() {
        let at = parse_since("2026-11-22T01:32").unwrap();
        assert_eq!(at, time::macros::datetime!(2026-11-22 01:32 UTC));
        assert!(parse_since("2026-11-22T01:32:10").is_ok());
        assert_eq!(
            parse_since("2026-11-22T01:32:00+01:00").unwrap(),
            time::macros::datetime!(2026-11-22 00:32 UTC)
        );
        assert!(parse_since("yesterday").is_err());
        assert!(parse_since("").is_err());
    }

    #[test]
    fn non_numbers_are_refused_with_the_domain_message() {
        let form = Form::default();
        let (_, refused) = read_webhook_form(&form);
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
