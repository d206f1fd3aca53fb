//! `/api/v1/tokens`: the inbound access tokens monitoring tools present to ingest.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_domain::{InvalidName, WebhookName};
use tocsin_storage::tokens as repo;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::{AdminError, OrNotFound};
use crate::params::PageQuery;
use crate::schema;
use crate::state::AdminState;

/// An inbound token's record. The token itself is never stored and never shown again.
#[derive(Debug, Serialize, ToSchema)]
pub struct Token {
    pub id: Uuid,
    #[schema(example = "alertmanager-prod")]
    pub name: String,
    /// The token's public lookup part (`tsn_<prefix>_…`), to tell tokens apart.
    #[schema(example = "Hq3xv0b_Y2nT")]
    pub prefix: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last accepted use, to the minute.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_used_at: Option<OffsetDateTime>,
    /// When it was revoked; a revoked token is refused.
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

impl From<repo::InboundToken> for Token {
    fn from(t: repo::InboundToken) -> Self {
        Token {
            id: t.id,
            name: t.name,
            prefix: t.lookup,
            created_at: t.created_at,
            last_used_at: t.last_used_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// A new token, with the token itself: shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCreated {
    #[serde(flatten)]
    pub record: Token,
    /// Send as `Authorization: Bearer <token>` to `POST /api/v1/webhooks/alerts`.
    #[schema(example = "tsn_Hq3xv0b_Y2nT_4xV9kq1m0pA7Jc2sWb8dLr5tYe3uGh6iKo0nZf1QvXw")]
    pub token: String,
}

/// A page of tokens, newest first, revoked ones included.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<Token>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A token to issue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// At most 100 characters as sent and at least 1 once surrounding spaces are trimmed, no
    /// control characters; e.g. the sending tool.
    #[schema(min_length = 1, max_length = 100, example = "alertmanager-prod")]
    pub name: String,
}

/// A token's name: the rules of a webhook name (at most 100 characters as sent, at least 1 once
/// trimmed, no control characters).
pub fn parse_name(raw: &str) -> Result<String, InvalidName> {
    WebhookName::parse(raw).map(|name| name.as_str().to_owned())
}

/// Issues an inbound token.
#[utoipa::path(
    post,
    path = "/api/v1/tokens",
    operation_id = "createToken",
    tag = "tokens",
    request_body = NewToken,
    responses(
        (status = 201, description = "Issued; `token` is shown this once", body = TokenCreated),
        schema::JsonBodyErrors,
        (status = 422, description = "`name` is invalid", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let new: NewToken = state.json(&req, payload).await?;
    let name = parse_name(&new.name).map_err(|e| AdminError::invalid("name", e))?;
    let mut conn = state.conn().await?;
    let (record, token) = repo::create(&mut conn, &name).await?;
    tracing::info!(token = %record.id, "inbound token issued");
    Ok(HttpResponse::Created().json(TokenCreated {
        token: token.expose().to_owned(),
        record: record.into(),
    }))
}

/// Lists tokens, newest first (never the tokens themselves).
#[utoipa::path(
    get,
    path = "/api/v1/tokens",
    operation_id = "listTokens",
    tag = "tokens",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of tokens", body = TokenList),
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
    let (tokens, next) = repo::list(&mut conn, &page).await?;
    Ok(HttpResponse::Ok().json(TokenList {
        items: tokens.into_iter().map(Token::from).collect(),
        next_cursor: next.map(|c| c.encode()),
    }))
}

/// Revokes a token: the next request with it is refused with 401.
#[utoipa::path(
    delete,
    path = "/api/v1/tokens/{id}",
    operation_id = "revokeToken",
    tag = "tokens",
    params(("id" = Uuid, Path, description = "The token's id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 404, description = "No such token, or it was already revoked", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all, fields(id = %id))]
pub async fn revoke(
    id: web::Path<Uuid>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    repo::revoke(&mut conn, *id).await.or_not_found("token")?;
    tracing::info!(token = %*id, "inbound token revoked");
    Ok(HttpResponse::NoContent().finish())
}
