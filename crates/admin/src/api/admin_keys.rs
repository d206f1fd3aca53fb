//! `/api/v1/admin-keys`: the named keys people and scripts present to the admin API and the
//! settings pages, each with one role (`viewer`, `operator`, `admin`), an optional expiry,
//! shown once and revoked at once on every admin instance.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_domain::Role;
use tocsin_storage::admin_keys::{self as repo, NewAdminKey as RepoKey};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::params::PageQuery;
use crate::schema;
use crate::state::AdminState;
use crate::store;

/// An admin key's record. The key itself is never stored and never shown again.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminKey {
    pub id: Uuid,
    #[schema(example = "on-call laptop")]
    pub name: String,
    #[schema(value_type = schema::Role)]
    pub role: String,
    /// The key's public lookup part (`tak_<prefix>_…`), to tell keys apart.
    #[schema(example = "Hq3xv0b_Y2nT")]
    pub prefix: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// After this time the key is refused; `null`: never.
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// Last accepted use, to the minute.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_used_at: Option<OffsetDateTime>,
    /// When it was revoked; a revoked key is refused.
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

impl From<&repo::AdminKey> for AdminKey {
    fn from(key: &repo::AdminKey) -> Self {
        AdminKey {
            id: key.id,
            name: key.name.clone(),
            role: key.role.as_str().to_owned(),
            prefix: key.lookup.clone(),
            created_at: key.created_at,
            expires_at: key.expires_at,
            last_used_at: key.last_used_at,
            revoked_at: key.revoked_at,
        }
    }
}

/// A new key, with the key itself: shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminKeyCreated {
    #[serde(flatten)]
    pub record: AdminKey,
    /// Send as `Authorization: Bearer <key>` to `/api/v1`, or sign in to the pages with it.
    #[schema(example = "tak_Hq3xv0b_Y2nT_4xV9kq1m0pA7Jc2sWb8dLr5tYe3uGh6iKo0nZf1QvXw")]
    pub key: String,
}

/// A page of admin keys, newest first, revoked and expired ones included.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminKeyList {
    pub items: Vec<AdminKey>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A key to issue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewAdminKey {
    /// At most 100 characters as sent and at least 1 once surrounding spaces are trimmed, no
    /// control characters; e.g. its holder.
    #[schema(min_length = 1, max_length = 100, example = "on-call laptop")]
    pub name: String,
    #[schema(value_type = schema::Role)]
    pub role: String,
    /// RFC 3339 time after which the key is refused; in the future. Left out or `null`: never.
    #[serde(default)]
    #[schema(example = "2027-01-01T00:00:00Z")]
    pub expires_at: Option<String>,
}

/// A key's settings as checked.
pub struct CheckedKey {
    pub name: String,
    pub role: Role,
    pub expires_at: Option<OffsetDateTime>,
}

impl CheckedKey {
    /// Checks a key's settings, naming the first field refused.
    pub fn check(new: &NewAdminKey) -> Result<Self, AdminError> {
        let name = crate::api::tokens::parse_name(&new.name)
            .map_err(|e| AdminError::invalid("name", e))?;
        let role = new
            .role
            .parse::<Role>()
            .map_err(|e| AdminError::invalid("role", e))?;
        let expires_at = new
            .expires_at
            .as_deref()
            .map(|text| {
                crate::params::rfc3339(text).map_err(|e| AdminError::invalid("expires_at", e))
            })
            .transpose()?;
        if expires_at.is_some_and(|at| at <= OffsetDateTime::now_utc()) {
            return Err(AdminError::invalid("expires_at", "must be in the future"));
        }
        Ok(CheckedKey {
            name,
            role,
            expires_at,
        })
    }

    pub fn as_new(&self) -> RepoKey<'_> {
        RepoKey {
            name: &self.name,
            role: self.role,
            expires_at: self.expires_at,
        }
    }
}

/// Issues an admin key.
#[utoipa::path(
    post,
    path = "/api/v1/admin-keys",
    operation_id = "createAdminKey",
    tag = "admin keys",
    request_body = NewAdminKey,
    responses(
        (status = 201, description = "Issued; `key` is shown this once", body = AdminKeyCreated),
        schema::JsonBodyErrors,
        (status = 422, description = "`name`, `role` or `expires_at` is invalid; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let new: NewAdminKey = state.json(&req, payload).await?;
    let checked = CheckedKey::check(&new)?;
    let mut conn = state.conn().await?;
    let (record, key) = store::issue_admin_key(&mut conn, &actor, &checked.as_new()).await?;
    tracing::info!(key = %record.id, role = %record.role, "admin key issued");
    Ok(HttpResponse::Created().json(AdminKeyCreated {
        key: key.expose().to_owned(),
        record: AdminKey::from(&record),
    }))
}

/// Lists admin keys, newest first (never the keys themselves).
#[utoipa::path(
    get,
    path = "/api/v1/admin-keys",
    operation_id = "listAdminKeys",
    tag = "admin keys",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of admin keys", body = AdminKeyList),
        (status = 400, description = "A bad query parameter; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn list(
    query: web::Query<PageQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let page = query.page()?;
    let mut conn = state.conn().await?;
    let (keys, next) = repo::list(&mut conn, &page).await?;
    Ok(HttpResponse::Ok().json(AdminKeyList {
        items: keys.iter().map(AdminKey::from).collect(),
        next_cursor: next.map(|c| c.encode()),
    }))
}

/// Revokes an admin key: its next request, on any admin instance, is refused with 401, and its
/// sessions on the pages end.
#[utoipa::path(
    delete,
    path = "/api/v1/admin-keys/{id}",
    operation_id = "revokeAdminKey",
    tag = "admin keys",
    params(("id" = Uuid, Path, description = "The key's id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 404, description = "No such key, or it was already revoked", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn revoke(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    store::revoke_admin_key(&mut conn, &actor, *id)
        .await
        .or_not_found("admin key")?;
    tracing::info!(key = %*id, "admin key revoked");
    Ok(HttpResponse::NoContent().finish())
}
