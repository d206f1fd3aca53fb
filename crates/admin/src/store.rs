//! Admin's writes that combine several repository calls, each in one transaction, so that a
//! change and the outbox rows it causes commit together or not at all.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use time::OffsetDateTime;
use tocsin_domain::delivery::rules::{self, Act};
use tocsin_domain::delivery::Trigger;
use tocsin_domain::{
    EventKind, EventPayload, IncidentData, IncidentStatus, RetrySettings, Severity,
};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::webhooks::{self, Webhook, WebhookChanges};
use tocsin_storage::{deliveries, Cursor, DbError};
use uuid::Uuid;

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

/// Applies a patch, merging partial retry settings into the current ones under a row lock.
pub async fn update_webhook(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    patch: &WebhookPatch,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let mut changes = patch.changes.clone();
        changes.retry = None;
        if patch.max_attempts.is_some() || patch.timeout_ms.is_some() {
            let current = webhooks::get_for_update(conn, id).await?.retry;
            let max_attempts = patch.max_attempts.unwrap_or(current.max_attempts());
            let timeout_ms = patch.timeout_ms.unwrap_or(current.timeout_ms());
            let merged = RetrySettings::new(max_attempts.into(), timeout_ms.into())
                .map_err(|e| DbError::Corrupt(format!("merged retry settings: {e}")))?;
            changes.retry = Some(merged);
        }
        webhooks::update(conn, id, &changes).await
    })
    .await
}

/// Records a sample `incidents.opened` event for one webhook only; returns it.
pub async fn record_test_event(
    conn: &mut AsyncPgConnection,
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
        outbox::record_events(conn, std::slice::from_ref(&event), &outbox::Wake::Listeners).await
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
pub async fn recover<E: Send>(
    conn: &mut AsyncPgConnection,
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
    Ok(Ok((retried, sent_waiting)))
}

async fn enqueue_chunked(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<(), DbError> {
    for chunk in ids.chunks(ENQUEUE_CHUNK) {
        outbox::enqueue_attempt(conn, chunk, Trigger::Manual).await?;
    }
    Ok(())
}
