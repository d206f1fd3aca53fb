//! Settings → Audit log (admins only): who changed what, or revealed which secret, when and
//! from where, newest first, filtered as `GET /api/v1/audit-log` filters.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use askama::Template;

use super::session::Session;
use super::templates::{Layout, When};
use super::{query_string, render, PageError};
use crate::api::audit_log::AuditQuery;
use crate::params::page;
use crate::state::AdminState;

/// One entry as shown.
pub struct EntryRow {
    pub at: When,
    pub actor: String,
    pub surface: String,
    pub address: String,
    pub action: String,
    pub resource: String,
    /// `before → after`, as compact JSON; empty when the entry has neither.
    pub fields: String,
}

/// `GET /settings/audit-log`.
#[derive(Template)]
#[template(path = "audit_log.html")]
pub struct AuditLogPage {
    pub layout: Layout,
    pub rows: Vec<EntryRow>,
    pub next_page: Option<String>,
    pub actor: String,
    pub resource_type: String,
    pub action: String,
    pub since: String,
    pub until: String,
}

/// `GET /settings/audit-log`.
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<AuditQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let filter = query.filter()?;
    let page = page(None, query.cursor.as_deref())?;
    let mut conn = state.conn().await?;
    let (entries, next) = tocsin_storage::audit::list(&mut conn, &filter, &page).await?;
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    let rows = entries
        .into_iter()
        .map(|e| {
            let json = |v: &Option<serde_json::Value>| {
                v.as_ref().map_or_else(|| "—".to_owned(), |v| v.to_string())
            };
            let fields = if e.before.is_none() && e.after.is_none() {
                String::new()
            } else {
                format!("{} → {}", json(&e.before), json(&e.after))
            };
            EntryRow {
                at: When::of(e.created_at),
                actor: e.actor_name,
                surface: e.surface,
                address: e.address.unwrap_or_default(),
                action: e.action,
                resource: format!("{} {}", e.resource_type, e.resource_id.unwrap_or_default()),
                fields,
            }
        })
        .collect();
    let next_page = next.map(|cursor| {
        let cursor = cursor.encode();
        let (actor, resource_type, action, since, until) = (
            text(&query.actor),
            text(&query.resource_type),
            text(&query.action),
            text(&query.since),
            text(&query.until),
        );
        format!(
            "/settings/audit-log?{}",
            query_string([
                ("actor", actor.as_str()),
                ("resource_type", resource_type.as_str()),
                ("action", action.as_str()),
                ("since", since.as_str()),
                ("until", until.as_str()),
                ("cursor", cursor.as_str()),
            ])
        )
    });
    render(
        StatusCode::OK,
        &AuditLogPage {
            layout: session.layout("audit-log"),
            rows,
            next_page,
            actor: text(&query.actor),
            resource_type: text(&query.resource_type),
            action: text(&query.action),
            since: text(&query.since),
            until: text(&query.until),
        },
    )
}
