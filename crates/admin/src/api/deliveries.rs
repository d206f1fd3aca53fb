//! `/api/v1/deliveries`: the delivery log and manual retry.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_domain::EventKind;
use tocsin_storage::deliveries::{self as repo, DeliveryFilter, DeliveryState, WaitReason};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::params::{page, param, rfc3339};
use crate::state::AdminState;
use crate::{actions, schema};

/// A delivery of one event to one webhook.
#[derive(Debug, Serialize, ToSchema)]
pub struct Delivery {
    /// Also the `webhook-id` header of every attempt, stable across retries.
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub event_id: Uuid,
    #[schema(value_type = schema::EventKind)]
    pub event: EventKind,
    pub incident_id: Uuid,
    #[schema(value_type = schema::DeliveryState)]
    pub state: DeliveryState,
    /// Why the delivery is `waiting` (`null` in any other state).
    #[schema(value_type = Option<schema::WaitReason>)]
    pub wait_reason: Option<WaitReason>,
    /// Attempts made so far, automatic and manual.
    pub attempt_count: i32,
    /// When the next automatic attempt is due (`null` while one is under way, and when none is
    /// scheduled).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// While an automatic attempt is under way, when its lease ends: an attempt whose outcome
    /// is not recorded by then is recorded `interrupted` (`null` when none is under way).
    #[serde(with = "time::serde::rfc3339::option")]
    pub attempting_until: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// Made by a replay of past events to the webhook (`POST /api/v1/webhooks/{id}/replay`),
    /// not by the event's fan-out.
    pub replayed: bool,
}

impl From<repo::Delivery> for Delivery {
    fn from(d: repo::Delivery) -> Self {
        Delivery {
            id: d.id,
            webhook_id: d.webhook_id,
            event_id: d.event_id,
            event: d.event,
            incident_id: d.incident_id,
            state: d.state,
            wait_reason: d.wait_reason,
            attempt_count: d.attempt_count,
            next_attempt_at: d.next_attempt_at,
            attempting_until: d.attempting_until,
            created_at: d.created_at,
            updated_at: d.updated_at,
            replayed: d.replayed,
        }
    }
}

/// A delivery with every attempt, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: Delivery,
    /// For a delivery `waiting` for its incident's order (`wait_reason` `ordering`), the
    /// earlier delivery of the same incident and webhook it waits for; `null` otherwise.
    pub waits_for: Option<Uuid>,
    pub attempts: Vec<Attempt>,
}

/// One logged attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct Attempt {
    /// 1, 2, ... in the order made.
    pub number: i32,
    #[schema(value_type = schema::AttemptTrigger)]
    pub trigger: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// Whether the target answered 2xx; `null` while the attempt is under way (it is logged
    /// before its request is sent).
    pub success: Option<bool>,
    /// The target's HTTP status, when it answered.
    pub status_code: Option<i32>,
    /// `null` while the attempt is under way.
    pub duration_ms: Option<i32>,
    /// Why the attempt failed (`null` on success).
    #[schema(value_type = Option<schema::AttemptError>)]
    pub error: Option<String>,
    /// More about the failure, for people.
    pub error_detail: Option<String>,
    /// The request headers sent, signature included.
    #[schema(value_type = Object)]
    pub request_headers: serde_json::Value,
    /// The JSON body sent, exactly as signed: the same on every attempt.
    pub request_body: String,
    /// The target's answer, capped (see `response_truncated`).
    pub response_body: Option<String>,
    pub response_truncated: bool,
}

impl Attempt {
    fn new(attempt: repo::Attempt, request_body: &str) -> Self {
        Attempt {
            number: attempt.number,
            trigger: attempt.trigger,
            started_at: attempt.started_at,
            success: attempt.success,
            status_code: attempt.status_code,
            duration_ms: attempt.duration_ms,
            error: attempt.error,
            error_detail: attempt.error_detail,
            request_headers: attempt.request_headers,
            request_body: request_body.to_owned(),
            response_body: attempt.response_body,
            response_truncated: attempt.response_truncated,
        }
    }
}

/// A page of the delivery log, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    pub items: Vec<Delivery>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A manual retry was enqueued.
#[derive(Debug, Serialize, ToSchema)]
pub struct RetryAccepted {
    pub delivery_id: Uuid,
    /// Always `enqueued`: the dispatcher makes the attempt shortly and logs it with trigger
    /// `manual`.
    #[schema(example = "enqueued")]
    pub status: &'static str,
}

/// Filters and paging of the delivery log.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this webhook's deliveries (deleted webhooks included).
    #[param(value_type = Option<Uuid>)]
    pub webhook_id: Option<String>,
    /// Only deliveries in this state.
    #[param(value_type = Option<schema::DeliveryState>)]
    pub state: Option<String>,
    /// Only deliveries of this event kind.
    #[param(value_type = Option<schema::EventKind>)]
    pub event: Option<String>,
    /// Only deliveries about this incident.
    #[param(value_type = Option<Uuid>)]
    pub incident_id: Option<String>,
    /// Only deliveries created at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<String>,
    /// Only deliveries created before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
    /// Items per page, 1 to 200 (default 50).
    #[param(value_type = Option<u8>, minimum = 1, maximum = 200)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl ListQuery {
    fn filter(&self) -> Result<DeliveryFilter, AdminError> {
        let uuid = |text: &str| text.parse::<Uuid>().map_err(|_| "must be a UUID");
        Ok(DeliveryFilter {
            webhook_id: param("webhook_id", self.webhook_id.as_deref(), uuid)?,
            state: param("state", self.state.as_deref(), str::parse::<DeliveryState>)?,
            event: param("event", self.event.as_deref(), str::parse::<EventKind>)?,
            incident_id: param("incident_id", self.incident_id.as_deref(), uuid)?,
            since: param("since", self.since.as_deref(), rfc3339)?,
            until: param("until", self.until.as_deref(), rfc3339)?,
        })
    }
}

/// The delivery log, newest first. The cursor stays valid while new deliveries arrive.
#[utoipa::path(
    get,
    path = "/api/v1/deliveries",
    operation_id = "listDeliveries",
    tag = "deliveries",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryList),
        (status = 400, description = "A bad query parameter; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let filter = query.filter()?;
    let page = page(query.limit.as_deref(), query.cursor.as_deref())?;
    let mut conn = state.conn().await?;
    let (deliveries, next) = repo::list(&mut conn, &filter, &page).await?;
    Ok(HttpResponse::Ok().json(DeliveryList {
        items: deliveries.into_iter().map(Delivery::from).collect(),
        next_cursor: next.map(|c| c.encode()),
    }))
}

/// One delivery with all its attempts.
#[utoipa::path(
    get,
    path = "/api/v1/deliveries/{id}",
    operation_id = "getDelivery",
    tag = "deliveries",
    params(("id" = Uuid, Path, description = "The delivery's id")),
    responses(
        (status = 200, description = "The delivery and its attempts, oldest first", body = DeliveryDetail),
        (status = 404, description = "No such delivery", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn get(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    let detail = repo::get_detail(&mut conn, *id)
        .await
        .or_not_found("delivery")?;
    let body = detail.request_body;
    Ok(HttpResponse::Ok().json(DeliveryDetail {
        delivery: detail.delivery.into(),
        waits_for: detail.waits_for,
        attempts: detail
            .attempts
            .into_iter()
            .map(|attempt| Attempt::new(attempt, &body))
            .collect(),
    }))
}

/// Enqueues one immediate attempt of the delivery, logged with trigger `manual`. It updates
/// the delivery's state and does not restart the automatic schedule.
#[utoipa::path(
    post,
    path = "/api/v1/deliveries/{id}/retry",
    operation_id = "retryDelivery",
    tag = "deliveries",
    params(("id" = Uuid, Path, description = "The delivery's id")),
    responses(
        (status = 202, description = "The attempt is enqueued", body = RetryAccepted),
        (status = 404, description = "No such delivery", body = schema::ErrorBody),
        (status = 409, description = "The delivery succeeded already, or its webhook was deleted or is disabled", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn retry(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let delivery = actions::retry_delivery(&state, &actor, *id).await?;
    Ok(HttpResponse::Accepted().json(RetryAccepted {
        delivery_id: delivery.id,
        status: "enqueued",
    }))
}
