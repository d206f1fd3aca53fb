//! Settings → Webhooks: the list, the create and edit forms, a webhook's page with its
//! delivery log, and its actions (enable, disable, rotate the secret, test event, recover,
//! delete).

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime};
use tocsin_domain::WebhookFilters;
use tocsin_storage::deliveries::{self, DeliveryFilter};
use tocsin_storage::health;
use tocsin_storage::replays::NewReplay;
use tocsin_storage::webhooks::{self as repo, Webhook};
use uuid::Uuid;

use super::deliveries::{delivery_log, LogQuery};
use super::session::{Session, SignedForm};
use super::templates::{
    schedule_text, state_label, ConfirmDeletePage, FormErrors, HealthView, LastDelivery,
    SecretPage, WebhookListPage, WebhookPage, WebhookRow, WebhookView, When,
};
use super::webhook_form::{edit_values, form_page, new_values, FormKind, Submitted};
use super::{
    given, notice, older_page, redirect, render, webhook_href, Form, PageError, PagesState,
};
use crate::actions;
use crate::error::{AdminError, OrNotFound};
use crate::params::page;
use crate::state::AdminState;
use crate::validation::{self, WebhookInput};

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
            next_page: older_page("/settings/", next),
        },
    )
}

/// `GET /settings/webhooks/new`: the create form.
#[tracing::instrument(skip_all)]
pub async fn new_form(
    session: Session,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let page = form_page(
        &session,
        &pages,
        FormKind::Create,
        new_values(),
        FormErrors::default(),
    );
    render(StatusCode::OK, &page)
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
    let submitted = Submitted::read(&form);
    let validated = validation::new_webhook(&submitted.input(Some(true), None));
    let record = match submitted.checked(validated) {
        Ok(record) => record,
        Err(refused) => {
            let (values, errors) = *refused;
            let page = form_page(&session, &pages, FormKind::Create, values, errors);
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
    };
    let webhook = actions::create_webhook(&state, &session.actor, &record).await?;
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
        ordering: webhook.ordering.as_str(),
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
    let page = form_page(
        &session,
        &pages,
        FormKind::edit(&webhook),
        edit_values(&webhook),
        FormErrors::default(),
    );
    render(StatusCode::OK, &page)
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
    let submitted = Submitted::read(&form);
    let mut conn = state.conn().await?;
    let current = repo::get(&mut conn, *id).await.or_not_found("webhook")?;
    drop(conn);
    let validated = validation::webhook_patch(&submitted.input(None, Some(&current.headers)));
    let patch = match submitted.checked(validated) {
        Ok(patch) => patch,
        Err(refused) => {
            let (values, errors) = *refused;
            let page = form_page(&session, &pages, FormKind::edit(&current), values, errors);
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
    };
    let webhook = actions::update_webhook(&state, &session.actor, *id, &patch).await?;
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
    signed: SignedForm,
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
    actions::update_webhook(&state, &signed.session.actor, id, &patch).await?;
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
    let webhook = actions::rotate_secret(&state, &session.actor, *id).await?;
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
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    actions::send_test_event(&state, &signed.session.actor, *id).await?;
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
    let since = since_of(&signed.form)?;
    let (retried, sent_waiting) =
        actions::recover(&state, &signed.session.actor, *id, since).await?;
    Ok(redirect(&format!(
        "{}?notice=recovered&count={}",
        webhook_href(*id),
        retried + sent_waiting
    )))
}

/// `POST /settings/webhooks/{id}/replay`: gives the webhook the past events since a time
/// (UTC) that it has no delivery of; dispatchers make the deliveries in the background.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn replay(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let request = NewReplay {
        webhook_id: *id,
        since: since_of(&signed.form)?,
        until: None,
        kinds: None,
    };
    actions::replay(&state, &signed.session.actor, &request).await?;
    Ok(redirect(&format!("{}?notice=replaying", webhook_href(*id))))
}

/// The `since` field of the recover and replay forms.
fn since_of(form: &Form) -> Result<OffsetDateTime, AdminError> {
    parse_since(form.get("since").unwrap_or_default())
        .map_err(|message| AdminError::invalid("since", message))
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
    actions::delete_webhook(&state, &session.actor, *id).await?;
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
}
