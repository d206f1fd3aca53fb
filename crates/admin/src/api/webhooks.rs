//! `/api/v1/webhooks`: outbound webhooks, their secrets, test events and bulk
//! recovery of failed deliveries. Their views are `webhook_views`.

use actix_web::{web, HttpRequest, HttpResponse};
use tocsin_storage::webhooks as repo;
use uuid::Uuid;

use super::webhook_views::{
    health_before_change, view, views, NewWebhook, Recover, Recovered, Replay, ReplayRequest,
    TestEventAccepted, Webhook, WebhookChange, WebhookList, WebhookWithSecret,
};
use crate::actions;
use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::params::{rfc3339, PageQuery};
use crate::schema;
use crate::state::AdminState;

/// Creates a webhook with a new signing secret.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks",
    operation_id = "createWebhook",
    tag = "webhooks",
    request_body = NewWebhook,
    responses(
        (status = 201, description = "Created. The secret is shown here, and later only by reveal-secret and rotate-secret.", body = WebhookWithSecret),
        schema::JsonBodyErrors,
        (status = 422, description = "A field is invalid; `field` names it (`events[1]`, `retry.max_attempts`)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let new: NewWebhook = state.json(&req, payload).await?;
    let record = new.validate()?;
    let webhook = actions::create_webhook(&state, &actor, &record).await?;
    Ok(HttpResponse::Created().json(WebhookWithSecret::created(&webhook)))
}

/// Lists webhooks, newest first (deleted ones are not listed).
#[utoipa::path(
    get,
    path = "/api/v1/webhooks",
    operation_id = "listWebhooks",
    tag = "webhooks",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of webhooks", body = WebhookList),
        (status = 400, description = "A bad query parameter (`limit`, `cursor`); `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    query: web::Query<PageQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let page = query.page()?;
    let mut conn = state.conn().await?;
    let (webhooks, next) = repo::list(&mut conn, &page).await?;
    drop(conn);
    Ok(HttpResponse::Ok().json(WebhookList {
        items: views(&state, &webhooks).await?,
        next_cursor: next.map(|c| c.encode()),
    }))
}

/// Reads one webhook.
#[utoipa::path(
    get,
    path = "/api/v1/webhooks/{id}",
    operation_id = "getWebhook",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    responses(
        (status = 200, description = "The webhook", body = Webhook),
        (status = 404, description = "No such webhook (or it was deleted)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn get(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = repo::get(&mut conn, *id).await.or_not_found("webhook")?;
    drop(conn);
    Ok(HttpResponse::Ok().json(view(&state, &webhook).await?))
}

/// Changes any of a webhook's fields. Disabling it stops its unfinished deliveries.
#[utoipa::path(
    patch,
    path = "/api/v1/webhooks/{id}",
    operation_id = "updateWebhook",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    request_body = WebhookChange,
    responses(
        (status = 200, description = "The changed webhook", body = Webhook),
        schema::JsonBodyErrors,
        (status = 404, description = "No such webhook (or it was deleted)", body = schema::ErrorBody),
        (status = 422, description = "A field is invalid; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn update(
    req: HttpRequest,
    id: web::Path<Uuid>,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let change: WebhookChange = state.json(&req, payload).await?;
    let current = match change.headers {
        // Masked values keep the stored ones.
        Some(_) => {
            let mut conn = state.conn().await?;
            Some(
                repo::get(&mut conn, *id)
                    .await
                    .or_not_found("webhook")?
                    .headers,
            )
        }
        None => None,
    };
    let patch = change.validate(current.as_ref())?;
    let health = health_before_change(&state, *id).await?;
    let webhook = actions::update_webhook(&state, &actor, *id, &patch).await?;
    Ok(HttpResponse::Ok().json(Webhook::new(&webhook, health)))
}

/// Deletes a webhook: it receives nothing more and its pending retries stop; its delivery log
/// stays readable.
#[utoipa::path(
    delete,
    path = "/api/v1/webhooks/{id}",
    operation_id = "deleteWebhook",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such webhook (or it was already deleted)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn delete(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    actions::delete_webhook(&state, &actor, *id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Shows a webhook's current signing secret.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/{id}/reveal-secret",
    operation_id = "revealWebhookSecret",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    responses(
        (status = 200, description = "The webhook with its secret", body = WebhookWithSecret),
        (status = 404, description = "No such webhook (or it was deleted)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn reveal_secret(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let webhook = actions::reveal_secret(&state, &actor, *id).await?;
    Ok(HttpResponse::Ok().json(WebhookWithSecret::load(&state, &webhook).await?))
}

/// Issues a new signing secret. The old one keeps signing beside it for the grace period
/// (`TOCSIN_SECRET_GRACE`, default 24 h), so receivers can switch without losing deliveries.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/{id}/rotate-secret",
    operation_id = "rotateWebhookSecret",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    responses(
        (status = 200, description = "The webhook with its new secret; `previous_secret_expires_at` says until when the old one signs", body = WebhookWithSecret),
        (status = 404, description = "No such webhook (or it was deleted)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn rotate_secret(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let health = health_before_change(&state, *id).await?;
    let webhook = actions::rotate_secret(&state, &actor, *id).await?;
    Ok(HttpResponse::Ok().json(WebhookWithSecret::new(&webhook, health)))
}

/// Sends a sample `incidents.opened` event (title "Tocsin test event", SEV5) to this webhook
/// only, marked with the `tocsin-test: true` header. It is logged like any delivery.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/{id}/test",
    operation_id = "sendTestEvent",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    responses(
        (status = 202, description = "The test event is recorded; its delivery follows", body = TestEventAccepted),
        (status = 404, description = "No such webhook (or it was deleted)", body = schema::ErrorBody),
        (status = 409, description = "The webhook is disabled", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn send_test_event(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let event = actions::send_test_event(&state, &actor, *id).await?;
    Ok(HttpResponse::Accepted().json(TestEventAccepted {
        event_id: event.id,
        event: event.kind,
        incident_id: event.incident_id,
    }))
}

/// Gives the webhook the past events of a window (`since`, `until`, kinds) that it subscribes
/// to, its filters accept, and it has no delivery of yet: a new integration brought up to date.
/// Answers at once; dispatchers create the deliveries a page at a time, marked `replayed`, and
/// they follow the schedule, the rate limit and the ordering like any other. A second replay of
/// the same window makes nothing new. Events older than the retention period are gone.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/{id}/replay",
    operation_id = "replayEvents",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    request_body = ReplayRequest,
    responses(
        (status = 202, description = "The replay is recorded; dispatchers work through it", body = Replay),
        schema::JsonBodyErrors,
        (status = 404, description = "No such webhook", body = schema::ErrorBody),
        (status = 422, description = "A field is not valid (named in `field`)", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn replay(
    req: HttpRequest,
    id: web::Path<Uuid>,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let body: ReplayRequest = state.json(&req, payload).await?;
    let request = actions::replay_request(
        *id,
        &body.since,
        body.until.as_deref(),
        body.events.as_deref(),
    )?;
    let replay = actions::replay(&state, &actor, &request).await?;
    Ok(HttpResponse::Accepted().json(Replay::from(replay)))
}

/// Sends what the webhook missed since `since`: every failed delivery created since then gets
/// one immediate manual attempt, as from the delivery log, and every delivery waiting because
/// the webhook was disabled when its event came is made due now. The webhook must be enabled.
#[utoipa::path(
    post,
    path = "/api/v1/webhooks/{id}/recover",
    operation_id = "recoverFailedDeliveries",
    tag = "webhooks",
    params(("id" = Uuid, Path, description = "The webhook's id")),
    request_body = Recover,
    responses(
        (status = 202, description = "The attempts are enqueued", body = Recovered),
        schema::JsonBodyErrors,
        (status = 404, description = "No such webhook", body = schema::ErrorBody),
        (status = 409, description = "The webhook was deleted or is disabled", body = schema::ErrorBody),
        (status = 422, description = "`since` is not an RFC 3339 time", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn recover(
    req: HttpRequest,
    id: web::Path<Uuid>,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let body: Recover = state.json(&req, payload).await?;
    let since = rfc3339(&body.since).map_err(|e| AdminError::invalid("since", e))?;
    let (retried, sent_waiting) = actions::recover(&state, &actor, *id, since).await?;
    Ok(HttpResponse::Accepted().json(Recovered {
        retried,
        sent_waiting,
    }))
}
