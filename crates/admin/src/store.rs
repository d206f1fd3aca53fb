//! Admin's writes that combine several repository calls, each in one transaction, so that a
//! change, the outbox rows it causes and its audit log entry commit together or not at all.
//! The API, the pages (through `crate::actions`) and the CLI all write through these.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde_json::json;
use time::OffsetDateTime;
use tocsin_domain::delivery::rules::{self, Act};
use tocsin_domain::delivery::Trigger;
use tocsin_domain::{
    AccessToken, EventKind, EventPayload, IncidentData, IncidentStatus, RetrySettings, Severity,
};
use tocsin_storage::admin_keys::{self, AdminKey, NewAdminKey};
use tocsin_storage::incidents::{self, Incident, StatusChangeError};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::replays::{self, NewReplay, Replay};
use tocsin_storage::tokens::{self, InboundToken, NewToken};
use tocsin_storage::webhooks::{self, NewWebhook, Webhook, WebhookChanges};
use tocsin_storage::{deliveries, Cursor, DbError};
use uuid::Uuid;

use crate::actor::Actor;
use crate::audit::{admin_key_fields, token_fields, webhook_fields, Change};

/// Outbox rows written per statement (each row binds three parameters; PostgreSQL allows
/// 65 535 per statement).
const ENQUEUE_CHUNK: usize = 1000;

/// Title of the sample incident a test event describes.
pub const TEST_EVENT_TITLE: &str = "Tocsin test event";

/// A validated change of a webhook. Retry fields left out keep their current values.
#[derive(Debug, Clone, Default)]
pub struct WebhookPatch {
    /// Every change but the retry settings (`changes.retry` is ignored).
    pub changes: WebhookChanges,
    pub max_attempts: Option<u8>,
    pub timeout_ms: Option<u32>,
}

/// Creates a webhook with a new signing secret.
pub async fn create_webhook(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    new: &NewWebhook,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let webhook = webhooks::create(conn, new).await?;
        let change = Change::new("webhook.create", "webhook", webhook.id);
        actor
            .record(conn, change.after(webhook_fields(&webhook)))
            .await?;
        Ok(webhook)
    })
    .await
}

/// Applies a patch, merging partial retry settings into the current ones under a row lock.
pub async fn update_webhook(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    patch: &WebhookPatch,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let before = webhooks::get_for_update(conn, id).await?;
        let mut changes = patch.changes.clone();
        changes.retry = None;
        if patch.max_attempts.is_some() || patch.timeout_ms.is_some() {
            let current = &before.retry;
            let max_attempts = patch.max_attempts.unwrap_or(current.max_attempts());
            let timeout_ms = patch.timeout_ms.unwrap_or(current.timeout_ms());
            let merged = RetrySettings::new(max_attempts.into(), timeout_ms.into())
                .map_err(|e| DbError::Corrupt(format!("merged retry settings: {e}")))?;
            changes.retry = Some(merged);
        }
        let after = webhooks::update(conn, id, &changes).await?;
        let change = Change::new("webhook.update", "webhook", id)
            .before(webhook_fields(&before))
            .after(webhook_fields(&after));
        actor.record(conn, change).await?;
        Ok(after)
    })
    .await
}

/// Deletes a webhook; its delivery log stays readable.
pub async fn delete_webhook(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
) -> Result<(), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let before = webhooks::get(conn, id).await?;
        webhooks::delete(conn, id).await?;
        let change = Change::new("webhook.delete", "webhook", id).before(webhook_fields(&before));
        actor.record(conn, change).await
    })
    .await
}

/// Issues a new signing secret; the old one keeps signing for `grace`.
pub async fn rotate_secret(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    grace: std::time::Duration,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let webhook = webhooks::rotate_secret(conn, id, grace).await?;
        let change = Change::new("webhook.rotate_secret", "webhook", id);
        actor.record(conn, change).await?;
        Ok(webhook)
    })
    .await
}

/// Reads a webhook to show its secret, recording the reveal (not the secret).
pub async fn reveal_secret(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let webhook = webhooks::get(conn, id).await?;
        let change = Change::new("webhook.reveal_secret", "webhook", id);
        actor.record(conn, change).await?;
        Ok(webhook)
    })
    .await
}

/// Records a replay of past events to a webhook (`NotFound` for a deleted one).
pub async fn replay(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    request: &NewReplay,
) -> Result<Replay, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        webhooks::get(conn, request.webhook_id).await?;
        let replay = replays::create(conn, request).await?;
        let fields = json!({
            "replay_id": replay.id,
            "since": tocsin_domain::rfc3339_utc::format(request.since),
            "until": request.until.map(tocsin_domain::rfc3339_utc::format),
            "events": request.kinds.as_ref().map(|kinds| kinds.iter().map(ToString::to_string).collect::<Vec<_>>()),
        });
        let change = Change::new("webhook.replay", "webhook", request.webhook_id).after(fields);
        actor.record(conn, change).await?;
        Ok(replay)
    })
    .await
}

/// Moves an incident to another status and records the events it emits (and, when it
/// changed, the audit entry).
pub async fn change_incident_status(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    to: IncidentStatus,
) -> Result<(Incident, Vec<NewEvent>), StatusChangeError> {
    conn.transaction::<_, StatusChangeError, _>(async |conn| {
        let before = incidents::get(conn, id).await.map_err(|e| match e {
            DbError::NotFound => StatusChangeError::NotFound,
            other => other.into(),
        })?;
        let (incident, events) = incidents::change_status(conn, id, to).await?;
        if !events.is_empty() {
            let change = Change::new("incident.change_status", "incident", id)
                .before(json!({"status": before.status.to_string()}))
                .after(json!({"status": incident.status.to_string()}));
            actor.record(conn, change).await?;
        }
        Ok((incident, events))
    })
    .await
}

/// Issues an inbound token; the returned [`AccessToken`] is the only copy of it.
pub async fn issue_token(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    new: &NewToken<'_>,
) -> Result<(InboundToken, AccessToken), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let (record, token) = tokens::issue(conn, new).await?;
        let change = Change::new("token.create", "token", record.id).after(token_fields(&record));
        actor.record(conn, change).await?;
        Ok((record, token))
    })
    .await
}

/// Revokes an inbound token (`NotFound` for an unknown or revoked one).
pub async fn revoke_token(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
) -> Result<(), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        tokens::revoke(conn, id).await?;
        actor
            .record(conn, Change::new("token.revoke", "token", id))
            .await
    })
    .await
}

/// Issues an admin key; the returned [`AccessToken`] is the only copy of it.
pub async fn issue_admin_key(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    new: &NewAdminKey<'_>,
) -> Result<(AdminKey, AccessToken), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let (key, secret) = admin_keys::issue(conn, new).await?;
        let change =
            Change::new("admin_key.create", "admin_key", key.id).after(admin_key_fields(&key));
        actor.record(conn, change).await?;
        Ok((key, secret))
    })
    .await
}

/// Revokes an admin key (`NotFound` for an unknown or revoked one): its next request is
/// refused on every admin instance.
pub async fn revoke_admin_key(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
) -> Result<AdminKey, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let key = admin_keys::revoke(conn, id).await?;
        let change =
            Change::new("admin_key.revoke", "admin_key", id).before(admin_key_fields(&key));
        actor.record(conn, change).await?;
        Ok(key)
    })
    .await
}

/// Records a sample `incidents.opened` event for one webhook only; returns it.
pub async fn record_test_event(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    webhook_id: Uuid,
) -> Result<NewEvent, DbError> {
    let payload = EventPayload {
        event: EventKind::IncidentOpened,
        timestamp: OffsetDateTime::now_utc(),
        data: IncidentData {
            id: Uuid::now_v7(),
            title: TEST_EVENT_TITLE.to_owned(),
            severity: Severity::SEV5,
            status: IncidentStatus::Triggered,
            previous_status: None,
        },
    };
    let event = NewEvent::new(&payload, Some(webhook_id));
    conn.transaction::<_, DbError, _>(async |conn| {
        outbox::record_events(conn, std::slice::from_ref(&event), &outbox::Wake::Listeners).await?;
        let change = Change::new("webhook.test_event", "webhook", webhook_id)
            .after(json!({"event_id": event.id}));
        actor.record(conn, change).await
    })
    .await?;
    Ok(event)
}

/// Enqueues one immediate manual attempt of a delivery, unless the rules refuse one in its state
/// (it succeeded already: `Ok(None)`)
/// or `refusal` refuses its webhook, whose row is locked first (`FOR SHARE`): a disabling or
/// deletion under way is waited for and seen, and one that comes later waits until this has
/// committed.
pub async fn retry<E: Send>(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    delivery_id: Uuid,
    refusal: impl Fn(&Webhook) -> Option<E> + Send + Sync,
) -> Result<Result<Option<deliveries::Delivery>, E>, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let delivery = deliveries::get(conn, delivery_id).await?;
        if !rules::allows_in_state(Act::RequestManual, delivery.state) {
            return Ok(Ok(None));
        }
        let webhook = webhooks::get_any_for_share(conn, delivery.webhook_id).await?;
        if let Some(refused) = refusal(&webhook) {
            return Ok(Err(refused));
        }
        enqueue_chunked(conn, &[delivery.id]).await?;
        let change = Change::new("delivery.retry", "delivery", delivery.id)
            .after(json!({"webhook_id": delivery.webhook_id}));
        actor.record(conn, change).await?;
        Ok(Ok(Some(delivery)))
    })
    .await
}

/// Enqueues a manual attempt of every failed delivery of a webhook created since `since`, and
/// the next automatic attempt of every one created since then that waits because the webhook
/// was disabled; returns how many of each. It works a page of [`ENQUEUE_CHUNK`] deliveries at
/// a time, each page in a transaction of its own, so that memory and the transaction stay
/// small however many there are. Each page locks the webhook's row first (`FOR SHARE`) and
/// gives it to `refusal`: a disabling or deletion is either seen there, and nothing more is
/// done (the pages before it stay enqueued; the first page's refusal is the answer), or waits
/// until that page has committed.
///
/// Its audit entry is written once the pages are done, with the counts (a refusal before any
/// page writes none).
pub async fn recover<E: Send>(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    webhook_id: Uuid,
    since: OffsetDateTime,
    refusal: impl Fn(&Webhook) -> Option<E> + Send + Sync,
) -> Result<Result<(usize, usize), E>, DbError> {
    let page = ENQUEUE_CHUNK as i64;
    let (mut retried, mut sent_waiting) = (0, 0);
    let mut after = Cursor::new(since, Uuid::nil());
    let mut failed_left = true;
    let mut waiting_left = true;
    while failed_left || waiting_left {
        let done = conn
            .transaction::<_, DbError, _>(async |conn| {
                let webhook = webhooks::get_any_for_share(conn, webhook_id).await?;
                if let Some(refused) = refusal(&webhook) {
                    return Ok(Err(refused));
                }
                let mut failed = Vec::new();
                if failed_left {
                    let next;
                    (failed, next) = deliveries::failed_page(conn, webhook_id, after, page).await?;
                    enqueue_chunked(conn, &failed).await?;
                    after = next.unwrap_or(after);
                }
                let mut waiting = Vec::new();
                if waiting_left {
                    waiting = deliveries::recover_disabled(conn, webhook_id, since, page).await?;
                    outbox::enqueue_automatic(conn, &waiting).await?;
                }
                Ok(Ok((failed.len(), waiting.len())))
            })
            .await?;
        let (failed, waiting) = match done {
            Ok(counts) => counts,
            Err(refused) if retried + sent_waiting == 0 => return Ok(Err(refused)),
            Err(_) => {
                tracing::warn!(%webhook_id, retried, sent_waiting, "recovery stopped: the webhook was disabled or deleted meanwhile");
                break;
            }
        };
        retried += failed;
        sent_waiting += waiting;
        failed_left = failed_left && failed == ENQUEUE_CHUNK;
        waiting_left = waiting_left && waiting == ENQUEUE_CHUNK;
    }
    let change = Change::new("webhook.recover", "webhook", webhook_id).after(json!({
        "since": tocsin_domain::rfc3339_utc::format(since),
        "retried": retried,
        "sent_waiting": sent_waiting,
    }));
    actor.record(conn, change).await?;
    Ok(Ok((retried, sent_waiting)))
}

async fn enqueue_chunked(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<(), DbError> {
    for chunk in ids.chunks(ENQUEUE_CHUNK) {
        outbox::enqueue_attempt(conn, chunk, Trigger::Manual).await?;
    }
    Ok(())
}
