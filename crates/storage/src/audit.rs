//! The audit log: who changed what, or revealed which secret, when and from where, through any
//! surface of admin. Entries are only added here (and removed by [`prune`] once older than
//! their retention); nothing changes them. An entry's `before` and `after` hold the resource's
//! readable fields, never a secret.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::audit_log;
use crate::{Cursor, DbError, Listed, Page};

/// Rows deleted per statement by [`prune`].
const PRUNE_BATCH: i64 = 1000;

/// One entry as stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = audit_log)]
pub struct AuditEntry {
    pub id: Uuid,
    pub created_at: OffsetDateTime,
    /// `key`, `bootstrap`, `oidc` or `cli`.
    pub actor_kind: String,
    /// The admin key's id (`key` only).
    pub actor_id: Option<Uuid>,
    pub actor_name: String,
    /// `api`, `pages` or `cli`.
    pub surface: String,
    pub address: Option<String>,
    pub user_agent: Option<String>,
    pub action: String,
    pub resource_type: String,
    pub resource_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl Listed for AuditEntry {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

/// An entry to record.
#[derive(Debug, Clone)]
pub struct NewAuditEntry<'a> {
    pub actor_kind: &'a str,
    pub actor_id: Option<Uuid>,
    pub actor_name: &'a str,
    pub surface: &'a str,
    pub address: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub action: &'a str,
    pub resource_type: &'a str,
    pub resource_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// Which entries to list; every field set narrows the list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// An admin key's id, or `bootstrap` / `oidc` / `cli` for those actors.
    pub actor: Option<String>,
    pub resource_type: Option<String>,
    pub resource_id: Option<String>,
    pub action: Option<String>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
}

/// Records an entry (in the caller's transaction, beside the change it describes).
pub async fn record(
    conn: &mut AsyncPgConnection,
    entry: &NewAuditEntry<'_>,
) -> Result<(), DbError> {
    diesel::insert_into(audit_log::table)
        .values((
            audit_log::id.eq(Uuid::now_v7()),
            audit_log::created_at.eq(OffsetDateTime::now_utc()),
            audit_log::actor_kind.eq(entry.actor_kind),
            audit_log::actor_id.eq(entry.actor_id),
            audit_log::actor_name.eq(entry.actor_name),
            audit_log::surface.eq(entry.surface),
            audit_log::address.eq(entry.address),
            audit_log::user_agent.eq(entry.user_agent),
            audit_log::action.eq(entry.action),
            audit_log::resource_type.eq(entry.resource_type),
            audit_log::resource_id.eq(entry.resource_id.as_deref()),
            audit_log::before.eq(entry.before.as_ref()),
            audit_log::after.eq(entry.after.as_ref()),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Entries, newest first, narrowed by `filter`.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &AuditFilter,
    page: &Page,
) -> Result<(Vec<AuditEntry>, Option<Cursor>), DbError> {
    let mut query = audit_log::table
        .select(AuditEntry::as_select())
        .order((audit_log::created_at.desc(), audit_log::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(actor) = &filter.actor {
        query = match actor.parse::<Uuid>() {
            Ok(id) => query.filter(audit_log::actor_id.eq(id)),
            Err(_) => query.filter(audit_log::actor_kind.eq(actor.clone())),
        };
    }
    if let Some(resource_type) = &filter.resource_type {
        query = query.filter(audit_log::resource_type.eq(resource_type.clone()));
    }
    if let Some(resource_id) = &filter.resource_id {
        query = query.filter(audit_log::resource_id.eq(resource_id.clone()));
    }
    if let Some(action) = &filter.action {
        query = query.filter(audit_log::action.eq(action.clone()));
    }
    if let Some(since) = filter.since {
        query = query.filter(audit_log::created_at.ge(since));
    }
    if let Some(until) = filter.until {
        query = query.filter(audit_log::created_at.lt(until));
    }
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("audit_log"));
    }
    let rows: Vec<AuditEntry> = query.load(conn).await?;
    page.finish(rows)
}

/// Deletes the entries older than `cutoff`, a batch at a time; returns how many.
pub async fn prune(conn: &mut AsyncPgConnection, cutoff: OffsetDateTime) -> Result<usize, DbError> {
    let mut total = 0;
    loop {
        let deleted = diesel::sql_query(
            "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE created_at < $1 \
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind::<diesel::sql_types::Timestamptz, _>(cutoff)
        .bind::<diesel::sql_types::BigInt, _>(PRUNE_BATCH)
        .execute(conn)
        .await?;
        total += deleted;
        if deleted < PRUNE_BATCH as usize {
            return Ok(total);
        }
    }
}
