//! The delivery log: every delivery with its state, filters by state and event,
//! paging; a delivery's page with every attempt; and the Retry button.

use std::collections::HashMap;

use actix_web::http::header::ACCEPT;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde::Deserialize;
use tocsin_domain::EventKind;
use tocsin_storage::deliveries::{self as repo, DeliveryFilter, DeliveryState};
use tocsin_storage::webhooks;
use uuid::Uuid;

use super::session::{Session, SignedForm};
use super::templates::{
    attempts_text, state_label, AttemptView, DeliveriesPage, DeliveryLog, DeliveryPage,
    DeliveryRow, DeliverySummary, SelectOption, When,
};
use super::webhook_href;
use super::{given, notice, query_string, redirect, render, PageError};
use crate::actions;
use crate::api::deliveries::RetryAccepted;
use crate::error::{AdminError, OrNotFound};
use crate::params::{page, param};
use crate::state::AdminState;

/// Filters, paging and the notice of a delivery log page. Empty values mean "any".
#[derive(Debug, Deserialize)]
pub struct LogQuery {
    pub state: Option<String>,
    pub event: Option<String>,
    pub webhook_id: Option<String>,
    pub cursor: Option<String>,
    pub notice: Option<String>,
    pub count: Option<String>,
}

impl LogQuery {
    /// The filter the query asks for, parsed as the API parses it (400 for a bad value).
    pub fn filter(&self) -> Result<DeliveryFilter, AdminError> {
        let uuid = |text: &str| text.parse::<Uuid>().map_err(|_| "must be a UUID");
        Ok(DeliveryFilter {
            webhook_id: param("webhook_id", given(&self.webhook_id), uuid)?,
            state: param("state", given(&self.state), str::parse::<DeliveryState>)?,
            event: param("event", given(&self.event), str::parse::<EventKind>)?,
            ..DeliveryFilter::default()
        })
    }
}

/// A page of the delivery log under `filter`, with the filter form pointing at `action`.
#[tracing::instrument(skip_all)]
pub async fn delivery_log(
    state: &AdminState,
    action: &str,
    query: &LogQuery,
    filter: DeliveryFilter,
    hidden: Vec<(&'static str, String)>,
    show_webhook: bool,
) -> Result<DeliveryLog, PageError> {
    let page = page(None, given(&query.cursor))?;
    let mut conn = state.conn().await?;
    let (items, next) = repo::list(&mut conn, &filter, &page).await?;
    let names: HashMap<Uuid, String> = if show_webhook {
        let mut ids: Vec<Uuid> = items.iter().map(|d| d.webhook_id).collect();
        ids.sort_unstable();
        ids.dedup();
        webhooks::get_many_any(&mut conn, &ids)
            .await?
            .into_iter()
            .map(|w| (w.id, w.name.as_str().to_owned()))
            .collect()
    } else {
        HashMap::new()
    };
    let rows = items
        .iter()
        .map(|d| DeliveryRow {
            href: format!("/settings/deliveries/{}", d.id),
            created: When::of(d.created_at),
            event: d.event.as_str(),
            incident_id: d.incident_id.to_string(),
            incident_short: d.incident_id.to_string()[..8].to_owned(),
            state: d.state.as_str(),
            state_label: state_label(d.state),
            next_attempt: d
                .next_attempt_at
                .filter(|_| d.state == DeliveryState::Retrying)
                .map(When::of),
            wait_reason: d.wait_reason.map(|reason| reason.describe()),
            replayed: d.replayed,
            attempts: d.attempt_count,
            webhook: show_webhook.then(|| {
                (
                    names
                        .get(&d.webhook_id)
                        .cloned()
                        .unwrap_or_else(|| d.webhook_id.to_string()),
                    webhook_href(d.webhook_id),
                )
            }),
        })
        .collect();
    let state_filter = filter.state.map(DeliveryState::as_str).unwrap_or_default();
    let event_filter = filter.event.map(EventKind::as_str).unwrap_or_default();
    let next_page = next.map(|cursor| {
        let cursor = cursor.encode();
        let mut pairs = vec![("state", state_filter), ("event", event_filter)];
        pairs.extend(hidden.iter().map(|(name, value)| (*name, value.as_str())));
        pairs.push(("cursor", cursor.as_str()));
        format!("{action}?{}#log", query_string(pairs))
    });
    let clear_query = query_string(hidden.iter().map(|(name, value)| (*name, value.as_str())));
    let clear_href = if clear_query.is_empty() {
        action.to_owned()
    } else {
        format!("{action}?{clear_query}")
    };
    Ok(DeliveryLog {
        action: action.to_owned(),
        clear_href,
        state_options: options(
            DeliveryState::ALL
                .iter()
                .map(|s| (s.as_str(), state_label(*s))),
            state_filter,
        ),
        event_options: options(
            EventKind::ALL.iter().map(|e| (e.as_str(), e.as_str())),
            event_filter,
        ),
        filtered: filter.state.is_some() || filter.event.is_some(),
        hidden,
        rows,
        next_page,
        show_webhook,
    })
}

fn options<'a>(
    choices: impl Iterator<Item = (&'a str, &'a str)>,
    selected: &str,
) -> Vec<SelectOption> {
    choices
        .map(|(value, label)| SelectOption {
            value: value.to_owned(),
            label: label.to_owned(),
            selected: value == selected,
        })
        .collect()
}

/// `GET /settings/deliveries`: the whole delivery log (or one webhook's, by `webhook_id`).
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<LogQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let filter = query.filter()?;
    let mut hidden = Vec::new();
    let mut webhook_filter = None;
    if let Some(id) = filter.webhook_id {
        let mut conn = state.conn().await?;
        let webhook = webhooks::get_any(&mut conn, id)
            .await
            .or_not_found("webhook")?;
        webhook_filter = Some((webhook.name.as_str().to_owned(), webhook_href(id)));
        hidden.push(("webhook_id", id.to_string()));
    }
    let log = delivery_log(&state, "/settings/deliveries", &query, filter, hidden, true).await?;
    render(
        StatusCode::OK,
        &DeliveriesPage {
            layout: session.layout("deliveries"),
            webhook_filter,
            log,
        },
    )
}

/// `GET /settings/deliveries/{id}`: a delivery and every attempt.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn detail(
    session: Session,
    id: web::Path<Uuid>,
    query: web::Query<LogQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let mut conn = state.conn().await?;
    let detail = repo::get_detail(&mut conn, *id)
        .await
        .or_not_found("delivery")?;
    let webhook = webhooks::get_any(&mut conn, detail.delivery.webhook_id).await?;
    let payload: Option<serde_json::Value> = serde_json::from_str(&detail.request_body).ok();
    let pretty = payload
        .as_ref()
        .and_then(|value| serde_json::to_string_pretty(value).ok())
        .unwrap_or_else(|| detail.request_body.clone());
    let title = payload
        .as_ref()
        .and_then(|value| value["data"]["title"].as_str())
        .map(str::to_owned);
    let delivery = &detail.delivery;
    let newest = detail.attempts.last().map(|a| a.number);
    let attempts = detail
        .attempts
        .iter()
        .map(|attempt| AttemptView {
            number: attempt.number,
            trigger: attempt.trigger.clone(),
            started: When::of(attempt.started_at),
            result: match attempt.success {
                Some(true) => "succeeded",
                Some(false) => "failed",
                None => "under-way",
            },
            result_label: match attempt.success {
                Some(true) => "Succeeded",
                Some(false) => "Failed",
                None => "Under way",
            },
            status_code: attempt.status_code,
            duration_ms: attempt.duration_ms,
            error: attempt
                .error
                .as_ref()
                .map(|kind| match &attempt.error_detail {
                    Some(detail) => format!("{kind}: {detail}"),
                    None => kind.clone(),
                }),
            headers: headers(&attempt.request_headers),
            payload: pretty.clone(),
            response_body: attempt.response_body.clone(),
            response_truncated: attempt.response_truncated,
            open: Some(attempt.number) == newest,
        })
        .collect();
    let retry_blocked = actions::ensure_deliverable(&webhook).err().map(|_| {
        if webhook.is_deleted() {
            "Its webhook was deleted: this delivery can no longer be retried."
        } else {
            "Its webhook is disabled: enable it to retry this delivery."
        }
    });
    let summary = DeliverySummary {
        id: delivery.id.to_string(),
        event: delivery.event.as_str(),
        incident_id: delivery.incident_id.to_string(),
        title,
        state: delivery.state.as_str(),
        state_label: state_label(delivery.state),
        attempts: attempts_text(
            delivery.attempt_count,
            delivery.auto_attempts,
            webhook.retry.max_attempts(),
        ),
        next_attempt: delivery
            .next_attempt_at
            .filter(|_| delivery.state == DeliveryState::Retrying)
            .map(When::of),
        wait_reason: delivery.wait_reason.map(|reason| reason.describe()),
        waits_for: detail.waits_for.map(|id| id.to_string()),
        replayed: delivery.replayed,
        created: When::of(delivery.created_at),
        updated: When::of(delivery.updated_at),
        webhook_name: webhook.name.as_str().to_owned(),
        webhook_href: webhook_href(webhook.id),
    };
    render(
        StatusCode::OK,
        &DeliveryPage {
            layout: session.layout("deliveries"),
            notice: notice(query.notice.as_deref(), None),
            retry_action: (delivery.state == DeliveryState::Failed && retry_blocked.is_none())
                .then(|| format!("/settings/deliveries/{}/retry", delivery.id)),
            retry_blocked: retry_blocked.filter(|_| delivery.state == DeliveryState::Failed),
            delivery: summary,
            attempts,
        },
    )
}

/// The request headers an attempt logged, as name and value.
fn headers(logged: &serde_json::Value) -> Vec<(String, String)> {
    logged
        .as_object()
        .map(|object| {
            object
                .iter()
                .map(|(name, value)| {
                    let value = value
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| value.to_string());
                    (name.clone(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `POST /settings/deliveries/{id}/retry`: enqueues a manual attempt. Answers JSON (202, or
/// the API's error body) to a script asking for it, else redirects back to the delivery.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn retry(
    signed: SignedForm,
    req: HttpRequest,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let wants_json = req
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json"));
    match actions::retry_delivery(&state, &signed.session.actor, *id).await {
        Ok(delivery) if wants_json => Ok(HttpResponse::Accepted().json(RetryAccepted {
            delivery_id: delivery.id,
            status: "enqueued",
        })),
        Ok(delivery) => Ok(redirect(&format!(
            "/settings/deliveries/{}?notice=retried",
            delivery.id
        ))),
        Err(error) if wants_json => Ok(error.error_response()),
        Err(error) => Err(error.into()),
    }
}
