//! What an operator can do, whichever surface asks: the JSON API and the settings pages both
//! call these, so the checks (no test event for a disabled webhook, no retry for a deleted
//! one), the log lines, the audit entries (each write names its [`Actor`]) and the relay
//! wake-ups are the same for both.

use time::OffsetDateTime;
use tocsin_domain::IncidentStatus;
use tocsin_storage::deliveries::Delivery;
use tocsin_storage::incidents::Incident;
use tocsin_storage::outbox::NewEvent;
use tocsin_storage::replays::{NewReplay, Replay};
use tocsin_storage::webhooks::{self, NewWebhook, Webhook};
use uuid::Uuid;

use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::state::AdminState;
use crate::store::{self, WebhookPatch};

/// Creates a webhook with a new signing secret.
#[tracing::instrument(skip_all)]
pub async fn create_webhook(
    state: &AdminState,
    actor: &Actor,
    new: &NewWebhook,
) -> Result<Webhook, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = store::create_webhook(&mut conn, actor, new).await?;
    tracing::info!(webhook = %webhook.id, "webhook created");
    Ok(webhook)
}

/// Applies a validated change. Disabling stops the webhook's unfinished deliveries.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn update_webhook(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
    patch: &WebhookPatch,
) -> Result<Webhook, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = store::update_webhook(&mut conn, actor, id, patch)
        .await
        .or_not_found("webhook")?;
    tracing::info!(webhook = %webhook.id, "webhook changed");
    Ok(webhook)
}

/// Deletes a webhook; its delivery log stays readable.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn delete_webhook(state: &AdminState, actor: &Actor, id: Uuid) -> Result<(), AdminError> {
    let mut conn = state.conn().await?;
    store::delete_webhook(&mut conn, actor, id)
        .await
        .or_not_found("webhook")?;
    tracing::info!(webhook = %id, "webhook deleted");
    Ok(())
}

/// Issues a new signing secret; the old one keeps signing for the grace period.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn rotate_secret(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
) -> Result<Webhook, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = store::rotate_secret(&mut conn, actor, id, state.secret_grace)
        .await
        .or_not_found("webhook")?;
    tracing::info!(webhook = %webhook.id, "webhook secret rotated");
    Ok(webhook)
}

/// Records a sample `incidents.opened` event for this webhook only (409 when disabled).
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn send_test_event(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
) -> Result<NewEvent, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = webhooks::get(&mut conn, id).await.or_not_found("webhook")?;
    if !webhook.enabled {
        return Err(AdminError::Conflict(
            "the webhook is disabled; enable it to send it events".into(),
        ));
    }
    let event = store::record_test_event(&mut conn, actor, webhook.id).await?;
    state.wake_relay();
    tracing::info!(webhook = %webhook.id, event = %event.id, "test event recorded");
    Ok(event)
}

/// Enqueues one immediate manual attempt of a delivery (409 when it succeeded already, or its
/// webhook was deleted or is disabled: checked under the webhook's row lock, as recover does).
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn retry_delivery(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
) -> Result<Delivery, AdminError> {
    let mut conn = state.conn().await?;
    let delivery = store::retry(&mut conn, actor, id, undeliverable)
        .await
        .or_not_found("delivery")??
        .ok_or_else(|| {
            AdminError::Conflict("the delivery succeeded already; nothing is retried".into())
        })?;
    state.wake_relay();
    tracing::info!(delivery = %delivery.id, "manual retry enqueued");
    Ok(delivery)
}

/// Sends what a webhook missed since `since`: a manual attempt of every failed delivery
/// created since then, and the deliveries waiting because it was disabled made due now;
/// returns how many of each.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn recover(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
    since: OffsetDateTime,
) -> Result<(usize, usize), AdminError> {
    let mut conn = state.conn().await?;
    let (retried, sent_waiting) = store::recover(&mut conn, actor, id, since, undeliverable)
        .await
        .or_not_found("webhook")??;
    if retried + sent_waiting > 0 {
        state.wake_relay();
    }
    tracing::info!(webhook = %id, retried, sent_waiting, "deliveries recovered");
    Ok((retried, sent_waiting))
}

/// A replay as asked for, checked: `since` and `until` RFC 3339 times (an `until` at or before
/// `since` is an empty window: nothing is replayed), `events` known kinds, at least one (422
/// naming the field otherwise).
pub fn replay_request(
    webhook_id: Uuid,
    since: &str,
    until: Option<&str>,
    events: Option<&[String]>,
) -> Result<NewReplay, AdminError> {
    let since = crate::params::rfc3339(since).map_err(|e| AdminError::invalid("since", e))?;
    let until = until
        .map(|text| crate::params::rfc3339(text).map_err(|e| AdminError::invalid("until", e)))
        .transpose()?;
    let kinds = events
        .map(|kinds| {
            if kinds.is_empty() {
                return Err(AdminError::invalid(
                    "events",
                    "must name at least one kind, or be left out",
                ));
            }
            kinds
                .iter()
                .enumerate()
                .map(|(i, kind)| {
                    kind.parse::<tocsin_domain::EventKind>()
                        .map_err(|e| AdminError::invalid(format!("events[{i}]"), e))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(NewReplay {
        webhook_id,
        since,
        until,
        kinds,
    })
}

/// Records a replay of past events to a webhook (404 for a deleted one); dispatchers work
/// through it.
#[tracing::instrument(skip_all, fields(id = %request.webhook_id))]
pub async fn replay(
    state: &AdminState,
    actor: &Actor,
    request: &NewReplay,
) -> Result<Replay, AdminError> {
    let mut conn = state.conn().await?;
    let replay = store::replay(&mut conn, actor, request)
        .await
        .or_not_found("webhook")?;
    tracing::info!(webhook = %request.webhook_id, replay = %replay.id, "replay recorded");
    Ok(replay)
}

/// Moves an incident to another status and records the events it emits.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn change_incident_status(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
    to: IncidentStatus,
) -> Result<(Incident, Vec<NewEvent>), AdminError> {
    let mut conn = state.conn().await?;
    let (incident, events) = store::change_incident_status(&mut conn, actor, id, to).await?;
    if !events.is_empty() {
        state.wake_relay();
        tracing::info!(incident = %incident.id, status = %incident.status, "incident status changed");
    }
    Ok((incident, events))
}

/// Reads a webhook to show its signing secret, recording the reveal in the audit log.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn reveal_secret(
    state: &AdminState,
    actor: &Actor,
    id: Uuid,
) -> Result<Webhook, AdminError> {
    let mut conn = state.conn().await?;
    let webhook = store::reveal_secret(&mut conn, actor, id)
        .await
        .or_not_found("webhook")?;
    tracing::info!(webhook = %webhook.id, "webhook secret revealed");
    Ok(webhook)
}

/// 409 unless the webhook can receive deliveries (not deleted, enabled).
pub fn ensure_deliverable(webhook: &Webhook) -> Result<(), AdminError> {
    undeliverable(webhook).map_or(Ok(()), Err)
}

/// Why the deliveries of `webhook` cannot be retried now, if they cannot: it was deleted, or it
/// is disabled.
pub fn undeliverable(webhook: &Webhook) -> Option<AdminError> {
    if webhook.is_deleted() {
        Some(AdminError::Conflict(
            "the webhook was deleted; its deliveries can no longer be retried".into(),
        ))
    } else if !webhook.enabled {
        Some(AdminError::Conflict(
            "the webhook is disabled; enable it before retrying its deliveries".into(),
        ))
    } else {
        None
    }
}
