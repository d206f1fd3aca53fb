//! Settings → Admin keys (admins only): issue a key with a role and an optional expiry (the
//! same checks as `POST /api/v1/admin-keys`), shown once; list and revoke keys.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;
use tocsin_domain::Role;
use tocsin_storage::admin_keys as repo;
use uuid::Uuid;

use super::session::{Session, SignedForm};
use super::templates::{Layout, SelectOption, When};
use super::{given, notice, older_page, redirect, render, PageError};
use crate::api::admin_keys::{CheckedKey, NewAdminKey};
use crate::error::{AdminError, OrNotFound};
use crate::params::page;
use crate::state::AdminState;
use crate::store;

/// One key in the list.
pub struct KeyRow {
    pub name: String,
    pub role: &'static str,
    pub prefix: String,
    pub expires: Option<When>,
    pub last_used: Option<When>,
    pub revoked: Option<When>,
    pub revoke_action: String,
}

/// `GET /settings/admin-keys`: the list and the form to issue one.
#[derive(Template)]
#[template(path = "admin_keys.html")]
pub struct AdminKeysPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub rows: Vec<KeyRow>,
    pub next_page: Option<String>,
    pub name: String,
    pub expires_at: String,
    pub role_options: Vec<SelectOption>,
    /// The refused field (`name`, `role`, `expires_at`) and why.
    pub error: Option<(String, String)>,
}

/// A new key, shown this once.
#[derive(Template)]
#[template(path = "admin_key_created.html")]
pub struct AdminKeyCreatedPage {
    pub layout: Layout,
    pub name: String,
    pub role: &'static str,
    pub key: String,
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    cursor: Option<String>,
    notice: Option<String>,
}

/// `GET /settings/admin-keys`.
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let form = NewAdminKey {
        name: String::new(),
        role: Role::Viewer.as_str().to_owned(),
        expires_at: None,
    };
    let page = keys_page(
        &session,
        &state,
        given(&query.cursor),
        notice(query.notice.as_deref(), None),
        &form,
        None,
    )
    .await?;
    render(StatusCode::OK, &page)
}

/// `POST /settings/admin-keys`: issues a key and shows it once, or shows the form again with
/// the refused field.
#[tracing::instrument(skip_all)]
pub async fn create(
    signed: SignedForm,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let form = signed.form;
    let new = NewAdminKey {
        name: form.get("name").unwrap_or_default().to_owned(),
        role: form.get("role").unwrap_or_default().to_owned(),
        expires_at: form
            .get("expires_at")
            .map(str::trim)
            .filter(|text| !text.is_empty())
            .map(str::to_owned),
    };
    let checked = match CheckedKey::check(&new) {
        Ok(checked) => checked,
        Err(AdminError::Invalid { field, message }) => {
            let page = keys_page(
                &signed.session,
                &state,
                None,
                None,
                &new,
                Some((field, message)),
            )
            .await?;
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(other) => return Err(other.into()),
    };
    let mut conn = state.conn().await?;
    let (record, key) =
        store::issue_admin_key(&mut conn, &signed.session.actor, &checked.as_new()).await?;
    tracing::info!(key = %record.id, role = %record.role, "admin key issued");
    render(
        StatusCode::OK,
        &AdminKeyCreatedPage {
            layout: signed.session.layout("admin-keys"),
            name: record.name,
            role: record.role.as_str(),
            key: key.expose().to_owned(),
        },
    )
}

/// `POST /settings/admin-keys/{id}/revoke`.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn revoke(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let mut conn = state.conn().await?;
    store::revoke_admin_key(&mut conn, &signed.session.actor, *id)
        .await
        .or_not_found("admin key")?;
    tracing::info!(key = %*id, "admin key revoked");
    Ok(redirect("/settings/admin-keys?notice=key-revoked"))
}

async fn keys_page(
    session: &Session,
    state: &AdminState,
    cursor: Option<&str>,
    notice: Option<String>,
    form: &NewAdminKey,
    error: Option<(String, String)>,
) -> Result<AdminKeysPage, PageError> {
    let page = page(None, cursor)?;
    let mut conn = state.conn().await?;
    let (keys, next) = repo::list(&mut conn, &page).await?;
    let rows = keys
        .into_iter()
        .map(|key| KeyRow {
            revoke_action: format!("/settings/admin-keys/{}/revoke", key.id),
            name: key.name,
            role: key.role.as_str(),
            prefix: key.lookup,
            expires: key.expires_at.map(When::of),
            last_used: key.last_used_at.map(When::of),
            revoked: key.revoked_at.map(When::of),
        })
        .collect();
    let role_options = Role::ALL
        .iter()
        .map(|role| SelectOption {
            value: role.as_str().to_owned(),
            label: role.as_str().to_owned(),
            selected: role.as_str() == form.role,
        })
        .collect();
    Ok(AdminKeysPage {
        layout: session.layout("admin-keys"),
        notice,
        rows,
        next_page: older_page("/settings/admin-keys", next),
        name: form.name.clone(),
        expires_at: form.expires_at.clone().unwrap_or_default(),
        role_options,
        error,
    })
}
