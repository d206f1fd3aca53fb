//! Settings → Inbound tokens: the tokens monitoring tools present to ingest, issued with the
//! alert source they are bound to and the credentials they accept besides the bearer header
//! (the same checks as `POST /api/v1/tokens`), shown once, and revoked.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;
use tocsin_domain::alerts::AlertFormat;
use tocsin_storage::tokens as repo;
use uuid::Uuid;

use super::session::{Session, SignedForm};
use super::templates::{Layout, SelectOption, When};
use super::{given, notice, older_page, redirect, render, PageError};
use crate::api::tokens::{CheckedToken, NewToken};
use crate::error::{AdminError, OrNotFound};
use crate::params::page;
use crate::state::AdminState;
use crate::store;

/// One token in the list.
pub struct TokenRow {
    pub name: String,
    pub prefix: String,
    pub source: Option<String>,
    /// What it accepts besides the bearer header, for people: `basic auth, query token`.
    pub accepts: String,
    pub last_used: Option<When>,
    pub revoked: Option<When>,
    pub revoke_action: String,
}

/// What the form was filled with, to show it again with its error.
#[derive(Default)]
pub struct TokenValues {
    pub name: String,
    pub source: String,
    pub basic_auth: bool,
    pub query_token: bool,
    pub sns_signature: bool,
}

/// `GET /settings/tokens`: the list and the form to issue one.
#[derive(Template)]
#[template(path = "tokens.html")]
pub struct TokensPage {
    pub layout: Layout,
    pub notice: Option<String>,
    pub rows: Vec<TokenRow>,
    pub next_page: Option<String>,
    pub values: TokenValues,
    pub source_options: Vec<SelectOption>,
    /// The refused field (`name`, `source`, `signing_secret`, `sns_signature`) and why.
    pub error: Option<(String, String)>,
}

/// A new token, shown this once.
#[derive(Template)]
#[template(path = "token_created.html")]
pub struct TokenCreatedPage {
    pub layout: Layout,
    pub name: String,
    pub token: String,
    pub source: Option<String>,
    pub basic_auth: bool,
    pub query_token: bool,
    pub signed: bool,
    pub sns_signature: bool,
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    cursor: Option<String>,
    notice: Option<String>,
}

/// `GET /settings/tokens`.
#[tracing::instrument(skip_all)]
pub async fn list(
    session: Session,
    query: web::Query<ListQuery>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let page = tokens_page(
        &session,
        &state,
        given(&query.cursor),
        notice(query.notice.as_deref(), None),
        TokenValues::default(),
        None,
    )
    .await?;
    render(StatusCode::OK, &page)
}

/// `POST /settings/tokens`: issues a token and shows it once, or shows the form again with
/// the refused field.
#[tracing::instrument(skip_all)]
pub async fn create(
    signed: SignedForm,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let form = signed.form;
    let text = |name: &str| form.get(name).unwrap_or_default().to_owned();
    let optional = |name: &str| Some(text(name)).filter(|value| !value.trim().is_empty());
    let new = NewToken {
        name: text("name"),
        source: optional("source"),
        basic_auth: form.get("basic_auth").is_some(),
        query_token: form.get("query_token").is_some(),
        signing_secret: optional("signing_secret"),
        sns_signature: form.get("sns_signature").is_some(),
    };
    let values = TokenValues {
        name: new.name.clone(),
        source: new.source.clone().unwrap_or_default(),
        basic_auth: new.basic_auth,
        query_token: new.query_token,
        sns_signature: new.sns_signature,
    };
    let checked = match CheckedToken::check(new) {
        Ok(checked) => checked,
        Err(AdminError::Invalid { field, message }) => {
            let page = tokens_page(
                &signed.session,
                &state,
                None,
                None,
                values,
                Some((field, message)),
            )
            .await?;
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(other) => return Err(other.into()),
    };
    let mut conn = state.conn().await?;
    let (record, token) =
        store::issue_token(&mut conn, &signed.session.actor, &checked.as_new()).await?;
    tracing::info!(token = %record.id, source = record.source.as_deref(), "inbound token issued");
    render(
        StatusCode::OK,
        &TokenCreatedPage {
            layout: signed.session.layout("tokens"),
            name: record.name,
            token: token.expose().to_owned(),
            source: record.source,
            basic_auth: record.basic_auth,
            query_token: record.query_token,
            signed: record.signing_secret.is_some(),
            sns_signature: record.sns_signature,
        },
    )
}

/// `POST /settings/tokens/{id}/revoke`.
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn revoke(
    signed: SignedForm,
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let mut conn = state.conn().await?;
    store::revoke_token(&mut conn, &signed.session.actor, *id)
        .await
        .or_not_found("token")?;
    tracing::info!(token = %*id, "inbound token revoked");
    Ok(redirect("/settings/tokens?notice=revoked"))
}

async fn tokens_page(
    session: &Session,
    state: &AdminState,
    cursor: Option<&str>,
    notice: Option<String>,
    values: TokenValues,
    error: Option<(String, String)>,
) -> Result<TokensPage, PageError> {
    let page = page(None, cursor)?;
    let mut conn = state.conn().await?;
    let (tokens, next) = repo::list(&mut conn, &page).await?;
    let rows = tokens
        .into_iter()
        .map(|token| {
            let accepts: Vec<&str> = [
                (token.basic_auth, "basic auth"),
                (token.query_token, "query token"),
                (token.signing_secret.is_some(), "signature checked"),
                (token.sns_signature, "SNS signature checked"),
            ]
            .into_iter()
            .filter_map(|(on, what)| on.then_some(what))
            .collect();
            TokenRow {
                revoke_action: format!("/settings/tokens/{}/revoke", token.id),
                name: token.name,
                prefix: token.lookup,
                source: token.source,
                accepts: accepts.join(", "),
                last_used: token.last_used_at.map(When::of),
                revoked: token.revoked_at.map(When::of),
            }
        })
        .collect();
    let source_options = AlertFormat::ALL
        .iter()
        .map(|format| SelectOption {
            value: format.as_str().to_owned(),
            label: format.as_str().to_owned(),
            selected: format.as_str() == values.source,
        })
        .collect();
    Ok(TokensPage {
        layout: session.layout("tokens"),
        notice,
        rows,
        next_page: older_page("/settings/tokens", next),
        values,
        source_options,
        error,
    })
}
