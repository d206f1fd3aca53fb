//! `GET /api/v1/audit-log`: who changed what, or revealed which secret, when and from where,
//! through the API, the pages or the CLI. Read-only: nothing in the API changes or deletes an
//! entry; entries older than `TOCSIN_AUDIT_RETENTION` are deleted by admin.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_storage::audit::{self as repo, AuditFilter};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::error::AdminError;
use crate::params::{page, rfc3339};
use crate::schema;
use crate::state::AdminState;

/// One audit log entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditEntry {
    pub id: Uuid,
    /// When it was done.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub actor: AuditActor,
    /// Where it was done: `api`, `pages` or `cli`.
    #[schema(example = "api")]
    pub surface: String,
    /// The client's address (`null` on the CLI).
    pub address: Option<String>,
    /// The client's `User-Agent` (the CLI's own marker on the CLI).
    pub user_agent: Option<String>,
    /// What was done, `<resource type>.<verb>`: `webhook.create`, `webhook.update`,
    /// `webhook.delete`, `webhook.reveal_secret`, `webhook.rotate_secret`,
    /// `webhook.test_event`, `webhook.recover`, `webhook.replay`, `delivery.retry`,
    /// `delivery.prune` (the CLI's `prune`, with no resource id), `incident.change_status`,
    /// `token.create`, `token.revoke`, `admin_key.create`, `admin_key.revoke`.
    #[schema(example = "webhook.update")]
    pub action: String,
    /// `webhook`, `delivery`, `incident`, `token` or `admin_key`.
    #[schema(example = "webhook")]
    pub resource_type: String,
    pub resource_id: Option<String>,
    /// The resource's readable fields before the change (never a secret).
    pub before: Option<serde_json::Value>,
    /// The resource's readable fields after it (never a secret).
    pub after: Option<serde_json::Value>,
}

/// Who did it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditActor {
    /// `key` (an admin key), `bootstrap` (the bootstrap token, TOCSIN_ADMIN_TOKEN), `oidc` (a
    /// person signed in to the pages through the identity provider) or `cli`.
    #[schema(example = "key")]
    pub kind: String,
    /// The admin key's id (`key` only).
    pub id: Option<Uuid>,
    /// The key's name, `bootstrap token (TOCSIN_ADMIN_TOKEN)`, `<name> (<subject>)` of an
    /// identity, or `cli:<user>`.
    #[schema(example = "on-call laptop")]
    pub name: String,
}

impl From<repo::AuditEntry> for AuditEntry {
    fn from(e: repo::AuditEntry) -> Self {
        AuditEntry {
            id: e.id,
            at: e.created_at,
            actor: AuditActor {
                kind: e.actor_kind,
                id: e.actor_id,
                name: e.actor_name,
            },
            surface: e.surface,
            address: e.address,
            user_agent: e.user_agent,
            action: e.action,
            resource_type: e.resource_type,
            resource_id: e.resource_id,
            before: e.before,
            after: e.after,
        }
    }
}

/// A page of audit log entries, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditLog {
    pub items: Vec<AuditEntry>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Which entries to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only this actor's: an admin key's id, `bootstrap`, `oidc` or `cli`.
    pub actor: Option<String>,
    /// Only entries about this kind of resource.
    pub resource_type: Option<String>,
    /// Only entries about this resource.
    pub resource_id: Option<String>,
    /// Only this action, e.g. `webhook.update`.
    pub action: Option<String>,
    /// RFC 3339 time: entries at or after it.
    pub since: Option<String>,
    /// RFC 3339 time: entries before it.
    pub until: Option<String>,
    /// Page size, 1 to 200 (default 50).
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl AuditQuery {
    /// The filter it asks for (400 naming a bad time, or a text holding a NUL character, which
    /// PostgreSQL cannot compare and no entry holds).
    pub fn filter(&self) -> Result<AuditFilter, AdminError> {
        let time = |name: &'static str, text: &Option<String>| {
            text.as_deref()
                .filter(|t| !t.trim().is_empty())
                .map(|t| rfc3339(t.trim()).map_err(|e| AdminError::bad_parameter(name, e)))
                .transpose()
        };
        let text = |name: &'static str, value: &Option<String>| {
            let value = value.as_deref().map(str::trim).filter(|v| !v.is_empty());
            match value {
                Some(v) if v.contains('\0') => Err(AdminError::bad_parameter(
                    name,
                    "must not contain a NUL character",
                )),
                _ => Ok(value.map(str::to_owned)),
            }
        };
        Ok(AuditFilter {
            actor: text("actor", &self.actor)?,
            resource_type: text("resource_type", &self.resource_type)?,
            resource_id: text("resource_id", &self.resource_id)?,
            action: text("action", &self.action)?,
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
        })
    }
}

/// Lists audit log entries, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/audit-log",
    operation_id = "listAuditLog",
    tag = "audit log",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of entries", body = AuditLog),
        (status = 400, description = "A bad query parameter; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    query: web::Query<AuditQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let filter = query.filter()?;
    let page = page(query.limit.as_deref(), query.cursor.as_deref())?;
    let mut conn = state.conn().await?;
    let (entries, next) = repo::list(&mut conn, &filter, &page).await?;
    Ok(HttpResponse::Ok().json(AuditLog {
        items: entries.into_iter().map(AuditEntry::from).collect(),
        next_cursor: next.map(|c| c.encode()),
    }))
}
