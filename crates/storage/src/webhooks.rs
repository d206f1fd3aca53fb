//! Outbound webhooks: the configuration records with their signing secrets.

use std::collections::BTreeSet;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::{deliveries, webhook_health, webhook_rate_budgets, webhooks};
use crate::{found, Cursor, DbError, Listed, Page};
use tocsin_domain::delivery::DeliveryState;
use tocsin_domain::{
    EventKind, RateLimit, RetrySettings, TargetUrl, WebhookFilters, WebhookHeaders, WebhookName,
    WebhookOrdering, WebhookSecret,
};

/// A webhook row as stored; also read from `row_to_json(webhooks)` where one statement returns
/// it beside another table's row.
#[derive(Debug, Clone, Queryable, Selectable, serde::Deserialize)]
#[diesel(table_name = webhooks)]
pub(crate) struct WebhookRow {
    id: Uuid,
    name: String,
    url: String,
    events: Vec<String>,
    max_attempts: i16,
    timeout_ms: i32,
    enabled: bool,
    secret: String,
    previous_secret: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    previous_secret_expires_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    updated_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    deleted_at: Option<OffsetDateTime>,
    filters: serde_json::Value,
    headers: serde_json::Value,
    rate_limit_per_second: Option<i32>,
    disabled_reason: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    disabled_at: Option<OffsetDateTime>,
    ordering: String,
}

/// A webhook as stored. Its `Debug` masks its secrets and header values.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub id: Uuid,
    pub name: WebhookName,
    pub url: TargetUrl,
    pub events: BTreeSet<EventKind>,
    pub retry: RetrySettings,
    pub enabled: bool,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    pub secret: WebhookSecret,
    pub previous_secret: Option<(WebhookSecret, OffsetDateTime)>,
    /// Which of the events it subscribes to it receives.
    pub filters: WebhookFilters,
    /// Sent with every delivery; shown masked everywhere but the form that sets them.
    pub headers: WebhookHeaders,
    pub rate_limit: Option<RateLimit>,
    /// Why it is disabled (an operator, or auto-disable with its figures); `None` while enabled.
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<OffsetDateTime>,
    /// In what order it receives an incident's events.
    pub ordering: WebhookOrdering,
}

impl Listed for Webhook {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

impl Webhook {
    /// The secrets that sign a delivery at `now`: the current one, then the previous one while
    /// its grace period lasts.
    pub fn signing_secrets(&self, now: OffsetDateTime) -> Vec<&WebhookSecret> {
        let mut secrets = vec![&self.secret];
        if let Some((previous, expires_at)) = &self.previous_secret {
            if *expires_at > now {
                secrets.push(previous);
            }
        }
        secrets
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted_at.is_some()
    }
}

impl TryFrom<WebhookRow> for Webhook {
    type Error = DbError;
    fn try_from(row: WebhookRow) -> Result<Self, DbError> {
        let corrupt = |what: &str| DbError::Corrupt(format!("webhook {}: bad {what}", row.id));
        let events = row
            .events
            .iter()
            .map(|e| e.parse::<EventKind>())
            .collect::<Result<BTreeSet<_>, _>>()
            .map_err(|_| corrupt("events"))?;
        let retry = RetrySettings::new(row.max_attempts.into(), row.timeout_ms.into())
            .map_err(|_| corrupt("retry settings"))?;
        let secret = WebhookSecret::parse(&row.secret).map_err(|_| corrupt("secret"))?;
        let previous_secret = match (row.previous_secret, row.previous_secret_expires_at) {
            (Some(text), Some(expires)) => Some((
                WebhookSecret::parse(&text).map_err(|_| corrupt("previous secret"))?,
                expires,
            )),
            _ => None,
        };
        let filters: WebhookFilters =
            serde_json::from_value(row.filters).map_err(|_| corrupt("filters"))?;
        let headers: std::collections::BTreeMap<String, String> =
            serde_json::from_value(row.headers).map_err(|_| corrupt("headers"))?;
        let rate_limit = row
            .rate_limit_per_second
            .map(|n| RateLimit::new(n.into()))
            .transpose()
            .map_err(|_| corrupt("rate limit"))?;
        let ordering = WebhookOrdering::parse(&row.ordering).map_err(|_| corrupt("ordering"))?;
        Ok(Webhook {
            ordering,
            filters,
            headers: WebhookHeaders::from_stored(headers),
            rate_limit,
            disabled_reason: row.disabled_reason,
            disabled_at: row.disabled_at,
            id: row.id,
            name: WebhookName::from_stored(row.name),
            url: TargetUrl::from_stored(&row.url).map_err(|_| corrupt("url"))?,
            events,
            retry,
            enabled: row.enabled,
            created_at: row.created_at,
            updated_at: row.updated_at,
            deleted_at: row.deleted_at,
            secret,
            previous_secret,
        })
    }
}

/// A validated new webhook.
#[derive(Debug, Clone)]
pub struct NewWebhook {
    pub name: WebhookName,
    pub url: TargetUrl,
    pub events: BTreeSet<EventKind>,
    pub retry: RetrySettings,
    pub enabled: bool,
    pub filters: WebhookFilters,
    pub headers: WebhookHeaders,
    pub rate_limit: Option<RateLimit>,
    pub ordering: WebhookOrdering,
}

/// Why an operator's change disabled a webhook.
pub const DISABLED_BY_OPERATOR: &str = "disabled by an operator";

fn json_of<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("settings serialise")
}

fn event_texts(events: &BTreeSet<EventKind>) -> Vec<String> {
    events.iter().map(|e| e.as_str().to_owned()).collect()
}

/// Creates a webhook with a new secret, and its rate budget.
pub async fn create(conn: &mut AsyncPgConnection, new: &NewWebhook) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let webhook = insert(conn, new).await?;
        diesel::insert_into(webhook_rate_budgets::table)
            .values(webhook_rate_budgets::webhook_id.eq(webhook.id))
            .execute(conn)
            .await?;
        Ok(webhook)
    })
    .await
}

async fn insert(conn: &mut AsyncPgConnection, new: &NewWebhook) -> Result<Webhook, DbError> {
    let now = OffsetDateTime::now_utc();
    let secret = WebhookSecret::generate();
    let row: WebhookRow = diesel::insert_into(webhooks::table)
        .values((
            webhooks::id.eq(Uuid::now_v7()),
            webhooks::name.eq(new.name.as_str()),
            webhooks::url.eq(new.url.as_str()),
            webhooks::events.eq(event_texts(&new.events)),
            webhooks::max_attempts.eq(i16::from(new.retry.max_attempts())),
            webhooks::timeout_ms.eq(new.retry.timeout_ms() as i32),
            webhooks::enabled.eq(new.enabled),
            webhooks::secret.eq(secret.expose()),
            webhooks::created_at.eq(now),
            webhooks::updated_at.eq(now),
            webhooks::filters.eq(json_of(&new.filters)),
            webhooks::headers.eq(json_of(new.headers.as_map())),
            webhooks::rate_limit_per_second.eq(new.rate_limit.map(|r| r.per_second() as i32)),
            webhooks::disabled_reason.eq((!new.enabled).then_some(DISABLED_BY_OPERATOR)),
            webhooks::disabled_at.eq((!new.enabled).then_some(now)),
            webhooks::ordering.eq(new.ordering.as_str()),
        ))
        .returning(WebhookRow::as_returning())
        .get_result(conn)
        .await?;
    row.try_into()
}

/// A webhook, deleted or not.
pub async fn get_any(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Webhook, DbError> {
    let row = webhooks::table.find(id).select(WebhookRow::as_select());
    found(row.first(conn).await.optional()?)
}

/// The webhooks with these ids, deleted or not, in no particular order (to name the webhooks
/// of a page of the delivery log in one query).
pub async fn get_many_any(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<Vec<Webhook>, DbError> {
    let rows: Vec<WebhookRow> = webhooks::table
        .filter(webhooks::id.eq_any(ids))
        .select(WebhookRow::as_select())
        .load(conn)
        .await?;
    rows.into_iter().map(Webhook::try_from).collect()
}

/// A webhook that has not been deleted.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Webhook, DbError> {
    let webhook = get_any(conn, id).await?;
    if webhook.is_deleted() {
        return Err(DbError::NotFound);
    }
    Ok(webhook)
}

/// A webhook that has not been deleted, its row locked until the end of the caller's
/// transaction (to merge a partial change into the current values without losing another).
pub async fn get_for_update(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Webhook, DbError> {
    let row = webhooks::table
        .find(id)
        .filter(webhooks::deleted_at.is_null())
        .for_update()
        .select(WebhookRow::as_select());
    found(row.first(conn).await.optional()?)
}

/// A webhook, deleted or not, its row locked `FOR SHARE` until the end of the caller's
/// transaction: a change of it under way (enabling, disabling, deletion) is waited for and
/// seen, and one that starts later waits for the caller to commit.
pub async fn get_any_for_share(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Webhook, DbError> {
    let row = webhooks::table
        .find(id)
        .for_share()
        .select(WebhookRow::as_select());
    found(row.first(conn).await.optional()?)
}

/// Webhooks that have not been deleted, newest first.
pub async fn list(
    conn: &mut AsyncPgConnection,
    page: &Page,
) -> Result<(Vec<Webhook>, Option<Cursor>), DbError> {
    let mut query = webhooks::table
        .filter(webhooks::deleted_at.is_null())
        .select(WebhookRow::as_select())
        .order((webhooks::created_at.desc(), webhooks::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("webhooks"));
    }
    let rows: Vec<WebhookRow> = query.load(conn).await?;
    page.finish(rows)
}

/// A validated partial change; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct WebhookChanges {
    pub name: Option<WebhookName>,
    pub url: Option<TargetUrl>,
    pub events: Option<BTreeSet<EventKind>>,
    pub retry: Option<RetrySettings>,
    pub enabled: Option<bool>,
    pub filters: Option<WebhookFilters>,
    pub headers: Option<WebhookHeaders>,
    /// `Some(None)` removes the limit.
    pub rate_limit: Option<Option<RateLimit>>,
    pub ordering: Option<WebhookOrdering>,
}

#[derive(AsChangeset)]
#[diesel(table_name = webhooks)]
struct WebhookChangeset {
    name: Option<String>,
    url: Option<String>,
    events: Option<Vec<String>>,
    max_attempts: Option<i16>,
    timeout_ms: Option<i32>,
    filters: Option<serde_json::Value>,
    headers: Option<serde_json::Value>,
    rate_limit_per_second: Option<Option<i32>>,
    ordering: Option<&'static str>,
    updated_at: OffsetDateTime,
}

/// Applies a change. Disabling a webhook stops its unfinished deliveries and records why
/// (`DISABLED_BY_OPERATOR`); enabling it clears that and starts its failing time afresh, so
/// that auto-disable measures from the enabling.
pub async fn update(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    changes: &WebhookChanges,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let changeset = WebhookChangeset {
            name: changes.name.as_ref().map(|n| n.as_str().to_owned()),
            url: changes.url.as_ref().map(|u| u.as_str().to_owned()),
            events: changes.events.as_ref().map(event_texts),
            max_attempts: changes.retry.map(|r| i16::from(r.max_attempts())),
            timeout_ms: changes.retry.map(|r| r.timeout_ms() as i32),
            filters: changes.filters.as_ref().map(json_of),
            headers: changes.headers.as_ref().map(|h| json_of(h.as_map())),
            rate_limit_per_second: changes
                .rate_limit
                .map(|limit| limit.map(|r| r.per_second() as i32)),
            ordering: changes.ordering.map(WebhookOrdering::as_str),
            updated_at: now,
        };
        let row: WebhookRow = diesel::update(
            webhooks::table
                .find(id)
                .filter(webhooks::deleted_at.is_null()),
        )
        .set(&changeset)
        .returning(WebhookRow::as_returning())
        .get_result(conn)
        .await
        .optional()?
        .ok_or(DbError::NotFound)?;
        match changes.enabled {
            Some(enabled) => set_enabled(conn, id, enabled, DISABLED_BY_OPERATOR, now)
                .await
                .map(|(webhook, _)| webhook),
            None => row.try_into(),
        }
    })
    .await
}

/// Enables or disables a webhook in the caller's transaction. Disabling one that is enabled
/// records `reason` and stops its unfinished deliveries; enabling one that is disabled clears
/// the reason and starts its failing time afresh. Either is a no-op when it is so already.
/// Returns the webhook, and whether this call changed it.
pub(crate) async fn set_enabled(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    enabled: bool,
    reason: &str,
    now: OffsetDateTime,
) -> Result<(Webhook, bool), DbError> {
    let changed: Option<WebhookRow> = diesel::update(
        webhooks::table
            .find(id)
            .filter(webhooks::deleted_at.is_null())
            .filter(webhooks::enabled.ne(enabled)),
    )
    .set((
        webhooks::enabled.eq(enabled),
        webhooks::disabled_reason.eq((!enabled).then_some(reason)),
        webhooks::disabled_at.eq((!enabled).then_some(now)),
        webhooks::updated_at.eq(now),
    ))
    .returning(WebhookRow::as_returning())
    .get_result(conn)
    .await
    .optional()?;
    let Some(row) = changed else {
        return Ok((get(conn, id).await?, false));
    };
    if enabled {
        diesel::update(webhook_health::table.find(id))
            .set(webhook_health::failing_since.eq(None::<OffsetDateTime>))
            .execute(conn)
            .await?;
    } else {
        stop_unfinished(conn, id, now).await?;
    }
    Ok((row.try_into()?, true))
}

/// Deletes a webhook: it receives nothing more and its unfinished deliveries stop, but the
/// record stays so its delivery log can still be read.
pub async fn delete(conn: &mut AsyncPgConnection, id: Uuid) -> Result<(), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let updated = diesel::update(
            webhooks::table
                .find(id)
                .filter(webhooks::deleted_at.is_null()),
        )
        .set((
            webhooks::deleted_at.eq(now),
            webhooks::enabled.eq(false),
            webhooks::updated_at.eq(now),
        ))
        .execute(conn)
        .await?;
        if updated == 0 {
            return Err(DbError::NotFound);
        }
        stop_unfinished(conn, id, now).await
    })
    .await
}

/// Fails a webhook's unfinished deliveries that have no automatic attempt under way, so no
/// further attempt is made (one under way ends as the state machine says, and gets no next
/// one; a manual attempt under way still records its answer, and a success succeeds it).
async fn stop_unfinished(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    _now: OffsetDateTime,
) -> Result<(), DbError> {
    // Locked in id order first, as everywhere deliveries are locked in bulk, so that this
    // cannot deadlock with a dispatcher recording a batch of attempts.
    let unfinished: Vec<Uuid> = deliveries::table
        .filter(deliveries::webhook_id.eq(webhook_id))
        .filter(deliveries::state.eq_any(DeliveryState::UNFINISHED.map(DeliveryState::as_str)))
        .order(deliveries::id)
        .select(deliveries::id)
        .for_update()
        .load(conn)
        .await?;
    crate::deliveries::stop(
        conn,
        &unfinished,
        tocsin_domain::RetrySchedule::specification().attempts(),
    )
    .await?;
    Ok(())
}

/// Issues a new secret; the old one keeps signing for `grace`.
pub async fn rotate_secret(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    grace: std::time::Duration,
) -> Result<Webhook, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        let now = OffsetDateTime::now_utc();
        let current = get(conn, id).await?;
        let grace = time::Duration::try_from(grace).unwrap_or(time::Duration::DAY);
        let row: WebhookRow = diesel::update(webhooks::table.find(id))
            .set((
                webhooks::secret.eq(WebhookSecret::generate().expose()),
                webhooks::previous_secret.eq(Some(current.secret.expose())),
                webhooks::previous_secret_expires_at.eq(Some(now + grace)),
                webhooks::updated_at.eq(now),
            ))
            .returning(WebhookRow::as_returning())
            .get_result(conn)
            .await?;
        row.try_into()
    })
    .await
}
