//! `/api/v1/tokens`: the inbound access tokens monitoring tools present to ingest, each
//! optionally bound to an alert source and accepting, as opt-ins, credentials other than the
//! bearer header.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::{InvalidName, SigningSecret, WebhookName};
use tocsin_storage::tokens::{self as repo, NewToken as RepoToken};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::actor::Actor;
use crate::error::{AdminError, OrNotFound};
use crate::params::PageQuery;
use crate::schema;
use crate::state::AdminState;
use crate::store;

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
    /// The alert source its bodies are read as; `null`: detected from the body.
    #[schema(value_type = Option<schema::AlertSource>, example = "cloudwatch")]
    pub source: Option<String>,
    /// Accepts HTTP basic authentication with the token as password.
    pub basic_auth: bool,
    /// Accepts the token in the `token` query parameter.
    pub query_token: bool,
    /// Bodies must carry the source's signature: Sentry's (a signing secret is set; it is never
    /// shown) or SNS's (`sns_signature`).
    pub signed: bool,
    /// Bodies must be SNS messages carrying SNS's valid signature.
    pub sns_signature: bool,
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
            source: t.source,
            basic_auth: t.basic_auth,
            query_token: t.query_token,
            signed: t.signing_secret.is_some() || t.sns_signature,
            sns_signature: t.sns_signature,
        }
    }
}

/// A new token, with the token itself: shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCreated {
    #[serde(flatten)]
    pub record: Token,
    /// Send as `Authorization: Bearer <token>` to `POST /api/v1/webhooks/alerts` (or, when the
    /// token opts in, as the basic-authentication password or the `token` query parameter).
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
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// At most 100 characters as sent and at least 1 once surrounding spaces are trimmed, no
    /// control characters; e.g. the sending tool.
    #[schema(min_length = 1, max_length = 100, example = "alertmanager-prod")]
    pub name: String,
    /// Binds the token to an alert source: its bodies are read as that source, without
    /// detection. Left out or `null`: the format is detected from each body.
    #[serde(default)]
    #[schema(value_type = Option<schema::AlertSource>, example = "cloudwatch")]
    pub source: Option<String>,
    /// Also accept HTTP basic authentication with the token as password (for senders that put
    /// credentials in the URL: SNS, Google Cloud Monitoring). Default `false`.
    #[serde(default)]
    pub basic_auth: bool,
    /// Also accept the token in the `token` query parameter (for senders that can only
    /// configure a URL: Azure action groups). Default `false`.
    #[serde(default)]
    pub query_token: bool,
    /// The secret the source signs its bodies with (Sentry's client secret); only with
    /// `source` `sentry`. Bodies without a valid `Sentry-Hook-Signature` are then refused.
    /// Write-only: never shown again.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255, write_only)]
    pub signing_secret: Option<String>,
    /// Require SNS's own signature of every message; only with `source` `cloudwatch`. Ingest
    /// checks it with the certificate at the message's `SigningCertURL`, fetched only from a
    /// host `TOCSIN_SNS_HOSTS` permits. Default `false`.
    #[serde(default)]
    pub sns_signature: bool,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("basic_auth", &self.basic_auth)
            .field("query_token", &self.query_token)
            .field("signing_secret", &self.signing_secret.as_ref().map(|_| "…"))
            .field("sns_signature", &self.sns_signature)
            .finish()
    }
}

/// A token's settings as checked: its source and signing secret parsed.
pub struct CheckedToken {
    pub name: String,
    pub source: Option<AlertFormat>,
    pub basic_auth: bool,
    pub query_token: bool,
    pub signing_secret: Option<SigningSecret>,
    pub sns_signature: bool,
}

impl CheckedToken {
    /// Checks a token's settings, naming the first field refused.
    pub fn check(new: NewToken) -> Result<Self, AdminError> {
        let name = parse_name(&new.name).map_err(|e| AdminError::invalid("name", e))?;
        let source = new
            .source
            .as_deref()
            .map(|raw| {
                raw.parse::<AlertFormat>().map_err(|_| {
                    AdminError::invalid(
                        "source",
                        format!("must be one of {}", AlertFormat::names()),
                    )
                })
            })
            .transpose()?;
        let signing_secret = new
            .signing_secret
            .as_deref()
            .map(|raw| {
                SigningSecret::parse(raw).map_err(|e| AdminError::invalid("signing_secret", e))
            })
            .transpose()?;
        if signing_secret.is_some() && source != Some(AlertFormat::Sentry) {
            return Err(AdminError::invalid(
                "signing_secret",
                "only a token bound to source sentry checks a signature",
            ));
        }
        if new.sns_signature && source != Some(AlertFormat::CloudWatch) {
            return Err(AdminError::invalid(
                "sns_signature",
                "only a token bound to source cloudwatch checks SNS's signature",
            ));
        }
        Ok(CheckedToken {
            name,
            source,
            basic_auth: new.basic_auth,
            query_token: new.query_token,
            signing_secret,
            sns_signature: new.sns_signature,
        })
    }

    /// The token as the repository issues it.
    pub fn as_new(&self) -> RepoToken<'_> {
        RepoToken {
            name: &self.name,
            source: self.source,
            basic_auth: self.basic_auth,
            query_token: self.query_token,
            signing_secret: self.signing_secret.as_ref(),
            sns_signature: self.sns_signature,
        }
    }
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
        (status = 422, description = "`name`, `source`, `signing_secret` or `sns_signature` is invalid; `field` names it", body = schema::ErrorBody),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AdminState>,
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let new: NewToken = state.json(&req, payload).await?;
    let checked = CheckedToken::check(new)?;
    let mut conn = state.conn().await?;
    let (record, token) = store::issue_token(&mut conn, &actor, &checked.as_new()).await?;
    tracing::info!(token = %record.id, source = record.source.as_deref(), "inbound token issued");
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
    actor: Actor,
) -> Result<HttpResponse, AdminError> {
    let mut conn = state.conn().await?;
    store::revoke_token(&mut conn, &actor, *id)
        .await
        .or_not_found("token")?;
    tracing::info!(token = %*id, "inbound token revoked");
    Ok(HttpResponse::NoContent().finish())
}
