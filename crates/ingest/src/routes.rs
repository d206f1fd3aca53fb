//! `POST /api/v1/webhooks/alerts`, and the Opsgenie-style Alert API under
//! `/api/v1/webhooks/alerts/opsgenie/v2/alerts` (create, `{alias}/close`,
//! `{alias}/acknowledge`).

use std::time::Instant;

use actix_web::http::header::{HeaderValue, CONTENT_TYPE, WWW_AUTHENTICATE};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use tocsin_domain::alerts::{
    self, AlertAction, AlertError, AlertFormat, Notice, OpsgenieAction, ParsedAlerts,
};
use tocsin_domain::{AccessToken, EventKind, IncidentStatus};
use tocsin_storage::incidents::{AlertBody, Change, SignalOutcome, TokenRevoked};
use tocsin_storage::tokens::LiveToken;
use tocsin_storage::DbError;
use tocsin_web::body::{read_limited, BodyError};
use tocsin_web::telemetry::{self, RemoteParent};
use tocsin_web::{json, ApiError};
use tracing::field::Empty;
use tracing::Instrument;
use uuid::Uuid;

use crate::batched::Batched;
use crate::credentials::{self, QueryToken};
use crate::metrics::{IngestMetrics, Stage};
use crate::rate_limit::RateLimiter;
use crate::sns::{ConfirmError, SignatureError, Sns};
use crate::token_cache::TokenCache;

/// Seconds a sender should wait after a 503.
const RETRY_AFTER_UNAVAILABLE: u64 = 5;

/// What the handler shares.
pub struct IngestState {
    /// Token checks and alert writes, batched across concurrent requests.
    pub batched: Batched,
    /// Live tokens seen lately.
    pub tokens: TokenCache,
    pub limiter: RateLimiter,
    pub metrics: IngestMetrics,
    pub body_limit: usize,
    /// Confirms SNS subscriptions and checks SNS signatures, with permitted hosts only.
    pub sns: Sns,
}

/// Why an alert request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("missing, malformed, unknown or revoked token")]
    Unauthorized,
    #[error("rate limited")]
    RateLimited { retry_after_secs: u64 },
    #[error("not JSON")]
    UnsupportedMediaType,
    #[error("body over {limit} bytes")]
    TooLarge { limit: usize },
    #[error("body could not be read: {0}")]
    Read(String),
    #[error(transparent)]
    Alert(#[from] AlertError),
    #[error("storage unavailable")]
    Unavailable,
    #[error(transparent)]
    Storage(DbError),
    #[error("format: this token is bound to source {bound}")]
    BoundElsewhere { bound: AlertFormat },
    #[error(transparent)]
    Confirm(#[from] ConfirmError),
    #[error("{0}")]
    SnsCertificate(String),
}

impl From<DbError> for IngestError {
    fn from(error: DbError) -> Self {
        if error.is_transient() {
            IngestError::Unavailable
        } else {
            IngestError::Storage(error)
        }
    }
}

impl IngestError {
    fn outcome(&self) -> &'static str {
        match self {
            IngestError::Unauthorized => "unauthorized",
            IngestError::RateLimited { .. } => "rate_limited",
            IngestError::UnsupportedMediaType => "unsupported_media_type",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::Read(_) | IngestError::Alert(AlertError::Syntax(_)) => "bad_request",
            IngestError::Alert(AlertError::Invalid { .. }) => "invalid",
            IngestError::Unavailable => "unavailable",
            IngestError::Storage(_) => "error",
            IngestError::BoundElsewhere { .. }
            | IngestError::Confirm(ConfirmError::NotPermitted) => "invalid",
            IngestError::Confirm(ConfirmError::Failed(_)) => "confirmation_failed",
            IngestError::SnsCertificate(_) => "certificate_unavailable",
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(error: IngestError) -> Self {
        match error {
            // SNS sends user-info credentials only once challenged for them, with a realm.
            IngestError::Unauthorized => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid inbound token is required",
            )
            .with_header(
                WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="tocsin", Basic realm="tocsin""#),
            ),
            IngestError::RateLimited { retry_after_secs } => {
                ApiError::rate_limited(retry_after_secs)
            }
            IngestError::UnsupportedMediaType => ApiError::unsupported_media_type(),
            IngestError::TooLarge { limit } => ApiError::payload_too_large(limit),
            IngestError::Read(message) => ApiError::bad_request(message),
            IngestError::Alert(AlertError::Syntax(message)) => {
                ApiError::bad_request(format!("the body is not valid JSON: {message}"))
            }
            IngestError::Alert(AlertError::Invalid { field, message }) => {
                ApiError::invalid(field, message)
            }
            IngestError::Unavailable => ApiError::unavailable(RETRY_AFTER_UNAVAILABLE),
            IngestError::Storage(error) => {
                // This alert's own error (the database refused what it holds): trying it again
                // would fail again, so no `Retry-After`; the other alerts of its batch went on.
                tracing::error!(%error, "an alert could not be stored");
                ApiError::new(
                    actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "alert_not_stored",
                    format!(
                        "the database refused this alert: {error}. Of an alert with several instructions, the incidents it opens may be recorded before the refusal; sent again, nothing is applied twice"
                    ),
                )
            }
            IngestError::BoundElsewhere { bound } => ApiError::invalid(
                "format",
                format!("this token is bound to source {bound}; leave format out or send {bound}"),
            ),
            IngestError::Confirm(error @ ConfirmError::NotPermitted) => {
                ApiError::invalid("SubscribeURL", error.to_string())
            }
            IngestError::Confirm(error @ ConfirmError::Failed(_)) => {
                tracing::warn!(%error, "an SNS subscription could not be confirmed");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "confirmation_failed",
                    format!("the subscription was not confirmed: {error}; SNS will send its confirmation again"),
                )
            }
            IngestError::SnsCertificate(error) => {
                tracing::warn!(%error, "an SNS message's signature could not be checked");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "certificate_unavailable",
                    format!("the message's signature could not be checked: {error}; SNS will send it again"),
                )
            }
        }
    }
}

/// The query of `POST /api/v1/webhooks/alerts`. No `Debug`: it may hold a token.
#[derive(Deserialize)]
pub struct AlertsQuery {
    format: Option<String>,
    token: Option<QueryToken>,
}

/// The query of the Opsgenie-style routes. No `Debug`: it may hold a token.
#[derive(Deserialize)]
pub struct OpsgenieQuery {
    #[serde(rename = "identifierType")]
    identifier_type: Option<String>,
    token: Option<QueryToken>,
}

/// What a request asks, by its route.
enum Call {
    /// `POST /api/v1/webhooks/alerts[?format=]`.
    Alerts { format: Option<String> },
    /// Opsgenie's `POST /v2/alerts`.
    OpsgenieCreate,
    /// Opsgenie's `POST /v2/alerts/{identifier}/close` or `/acknowledge`.
    OpsgenieAction {
        identifier: String,
        identifier_type: Option<String>,
        action: OpsgenieAction,
    },
}

/// The 202 body: what happened to each incident the alert touched.
#[derive(Debug, Serialize)]
struct Accepted {
    status: &'static str,
    format: AlertFormat,
    incidents: Vec<Touched>,
    /// PagerDuty senders read the key back from here, as from PagerDuty's own API.
    #[serde(skip_serializing_if = "Option::is_none")]
    dedup_key: Option<String>,
    /// What was done besides incidents: `subscription_confirmed`, `unsubscribed`, `ignored`.
    #[serde(skip_serializing_if = "Option::is_none")]
    notice: Option<&'static str>,
    /// Why an `ignored` body changed nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct Touched {
    /// `None` when an acknowledge or resolve found no open incident.
    id: Option<Uuid>,
    dedup_key: String,
    action: AlertAction,
    #[serde(flatten)]
    change: Change,
    status: Option<IncidentStatus>,
    events: Vec<EventKind>,
}

impl From<SignalOutcome> for Touched {
    fn from(outcome: SignalOutcome) -> Self {
        Touched {
            id: outcome.incident.as_ref().map(|i| i.id),
            status: outcome.incident.as_ref().map(|i| i.status),
            dedup_key: outcome.dedup_key,
            action: outcome.action,
            change: outcome.change,
            events: outcome.events.iter().map(|e| e.kind).collect(),
        }
    }
}

/// Receives one alert notification, in the `receive_alerts` span. The span joins the trace of a
/// sender that sent a `traceparent`, and the trace context goes with the events it records
/// (outbox headers).
pub async fn receive_alerts(
    req: HttpRequest,
    payload: web::Payload,
    query: web::Query<AlertsQuery>,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    let AlertsQuery { format, token } = query.into_inner();
    receive(req, payload, token, Call::Alerts { format }, state).await
}

/// Opsgenie's create alert, `POST .../opsgenie/v2/alerts`.
pub async fn opsgenie_create(
    req: HttpRequest,
    payload: web::Payload,
    query: web::Query<OpsgenieQuery>,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    let token = query.into_inner().token;
    receive(req, payload, token, Call::OpsgenieCreate, state).await
}

/// Opsgenie's close alert, `POST .../opsgenie/v2/alerts/{identifier}/close`.
pub async fn opsgenie_close(
    req: HttpRequest,
    payload: web::Payload,
    identifier: web::Path<String>,
    query: web::Query<OpsgenieQuery>,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    opsgenie_action(
        req,
        payload,
        identifier,
        query,
        state,
        OpsgenieAction::Close,
    )
    .await
}

/// Opsgenie's acknowledge alert, `POST .../opsgenie/v2/alerts/{identifier}/acknowledge`.
pub async fn opsgenie_acknowledge(
    req: HttpRequest,
    payload: web::Payload,
    identifier: web::Path<String>,
    query: web::Query<OpsgenieQuery>,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    opsgenie_action(
        req,
        payload,
        identifier,
        query,
        state,
        OpsgenieAction::Acknowledge,
    )
    .await
}

async fn opsgenie_action(
    req: HttpRequest,
    payload: web::Payload,
    identifier: web::Path<String>,
    query: web::Query<OpsgenieQuery>,
    state: web::Data<IngestState>,
    action: OpsgenieAction,
) -> Result<HttpResponse, ApiError> {
    let OpsgenieQuery {
        identifier_type,
        token,
    } = query.into_inner();
    let call = Call::OpsgenieAction {
        identifier: identifier.into_inner(),
        identifier_type,
        action,
    };
    receive(req, payload, token, call, state).await
}

async fn receive(
    req: HttpRequest,
    payload: web::Payload,
    token: Option<QueryToken>,
    call: Call,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    let span = tracing::debug_span!(
        "receive_alerts",
        otel.kind = "server",
        format = Empty,
        status = Empty
    );
    // Before the span is first entered.
    RemoteParent::from_headers(|name| Some(req.headers().get(name)?.to_str().ok()?.to_owned()))
        .adopt_by(&span);
    async move {
        let mut format_label = "unknown";
        let result = handle(
            &req,
            payload,
            token.as_ref(),
            call,
            &state,
            &mut format_label,
        )
        .await;
        let span = tracing::Span::current();
        span.record("format", format_label);
        match result {
            Ok(response) => {
                state.metrics.record(format_label, "accepted");
                span.record("status", response.status().as_u16());
                Ok(response)
            }
            Err(error) => {
                state.metrics.record(format_label, error.outcome());
                let error = ApiError::from(error);
                span.record("status", error.status().as_u16());
                Err(error)
            }
        }
    }
    .instrument(span)
    .await
}

async fn handle(
    req: &HttpRequest,
    payload: web::Payload,
    query_token: Option<&QueryToken>,
    call: Call,
    state: &IngestState,
    format_label: &mut &'static str,
) -> Result<HttpResponse, IngestError> {
    let opsgenie = !matches!(call, Call::Alerts { .. });
    let authenticated = authenticate(req, query_token, opsgenie, state).await?;
    let answer = accept(req, payload, call, state, format_label, &authenticated).await;
    match (answer, authenticated.unconfirmed()) {
        // A refusal for any other reason is the token's first if it was revoked meanwhile.
        (Err(error), Some(presented)) if !matches!(error, IngestError::Unauthorized) => {
            confirm_live(presented, state).await?;
            Err(error)
        }
        (answer, _) => answer,
    }
}

/// Confirms with the database that a token from the token cache is still live.
async fn confirm_live(presented: &AccessToken, state: &IngestState) -> Result<(), IngestError> {
    if state
        .batched
        .authenticate(presented.clone())
        .await?
        .is_some()
    {
        Ok(())
    } else {
        state.tokens.forget(presented);
        Err(IngestError::Unauthorized)
    }
}

/// Answers an authenticated request.
async fn accept(
    req: &HttpRequest,
    payload: web::Payload,
    call: Call,
    state: &IngestState,
    format_label: &mut &'static str,
    authenticated: &Authenticated,
) -> Result<HttpResponse, IngestError> {
    let Authenticated {
        token, presented, ..
    } = authenticated;
    let unconfirmed = authenticated.unconfirmed();
    state
        .limiter
        .check(token.id)
        .map_err(|wait| IngestError::RateLimited {
            retry_after_secs: wait.as_secs() + 1,
        })?;
    let format = match &call {
        Call::Alerts { format } => {
            let asked = format
                .as_deref()
                .map(str::parse::<AlertFormat>)
                .transpose()?;
            match (token.source, asked) {
                (Some(bound), Some(asked)) if bound != asked => {
                    return Err(IngestError::BoundElsewhere { bound })
                }
                (bound, asked) => bound.or(asked),
            }
        }
        _ => match token.source {
            None | Some(AlertFormat::Opsgenie) => Some(AlertFormat::Opsgenie),
            Some(bound) => return Err(IngestError::BoundElsewhere { bound }),
        },
    };
    if !json::is_json(req) && !sns_text(req, format) {
        return Err(IngestError::UnsupportedMediaType);
    }
    let body = read_limited(req, payload, state.body_limit)
        .await
        .map_err(|error| match error {
            BodyError::TooLarge { limit } => IngestError::TooLarge { limit },
            BodyError::Read(message) => IngestError::Read(message),
        })?;
    credentials::signed(token, req, &body, &state.sns)
        .await
        .map_err(|error| match error {
            SignatureError::Refused(reason) => {
                tracing::warn!(%reason, "a body's signature was refused");
                IngestError::Unauthorized
            }
            unavailable @ SignatureError::Unavailable(_) => {
                IngestError::SnsCertificate(unavailable.to_string())
            }
        })?;
    let parsed = match call {
        Call::Alerts { .. } | Call::OpsgenieCreate => alerts::parse(&body, format)?,
        Call::OpsgenieAction {
            identifier,
            identifier_type,
            action,
        } => alerts::parse_opsgenie_action(&body, &identifier, identifier_type.as_deref(), action)?,
    };
    *format_label = parsed.format.as_str();
    let ParsedAlerts {
        format,
        signals,
        notice,
    } = parsed;
    if signals.is_empty() || notice.is_some() {
        // No write checks the token: the database does, unless it just did.
        if let Some(presented) = unconfirmed {
            confirm_live(presented, state).await?;
        }
    }
    let (notice, reason) = match notice {
        None => (None, None),
        Some(notice) => act_on(notice, state).await?,
    };
    let reply_key = signals.iter().find_map(|s| s.reply_key.clone());
    let outcomes = if signals.is_empty() {
        Vec::new()
    } else {
        let body = AlertBody {
            signals,
            headers: telemetry::current_headers(),
            token: Some(token.id),
        };
        let applying = Instant::now();
        let applied = state.batched.apply_alerts(body).await?;
        state.metrics.stage(Stage::Transaction, applying);
        match applied {
            Ok(outcomes) => outcomes,
            Err(TokenRevoked) => {
                state.tokens.forget(presented);
                return Err(IngestError::Unauthorized);
            }
        }
    };
    Ok(HttpResponse::Accepted().json(Accepted {
        status: "accepted",
        format,
        dedup_key: reply_key,
        incidents: outcomes.into_iter().map(Touched::from).collect(),
        notice,
        reason,
    }))
}

/// What ingest does about a sender's housekeeping: confirms an SNS subscription (for a
/// permitted host), logs an unsubscription; the notice's name and reason for the answer.
async fn act_on(
    notice: Notice,
    state: &IngestState,
) -> Result<(Option<&'static str>, Option<String>), IngestError> {
    Ok(match notice {
        Notice::ConfirmSubscription {
            topic_arn,
            subscribe_url,
        } => {
            state.sns.confirm(&subscribe_url).await?;
            tracing::info!(topic_arn, "SNS subscription confirmed");
            (Some("subscription_confirmed"), None)
        }
        Notice::Unsubscribed { topic_arn } => {
            tracing::warn!(
                topic_arn,
                "SNS unsubscribed this endpoint from the topic: no more alarms come from it until it is subscribed again"
            );
            (Some("unsubscribed"), None)
        }
        Notice::Ignored(reason) => {
            tracing::debug!(reason, "an alert body changed no incident");
            (Some("ignored"), Some(reason))
        }
    })
}

/// Whether a `text/plain` body may be read as JSON: SNS posts its JSON envelope as
/// `text/plain`, and marks its requests with `x-amz-sns-message-type`.
fn sns_text(req: &HttpRequest, format: Option<AlertFormat>) -> bool {
    let plain = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("text/plain"));
    let sns = format == Some(AlertFormat::CloudWatch)
        || (format.is_none() && req.headers().contains_key("x-amz-sns-message-type"));
    plain && sns
}

/// A request's live token.
struct Authenticated {
    token: LiveToken,
    /// The token as presented.
    presented: AccessToken,
    /// It came from the token cache: not yet confirmed live by the database for this request
    /// (the write that applies the body confirms it).
    cached: bool,
}

impl Authenticated {
    /// The token as presented while it is not yet confirmed live for this request.
    fn unconfirmed(&self) -> Option<&AccessToken> {
        self.cached.then_some(&self.presented)
    }
}

/// The request's live token, if it presented one the way the token accepts: from the token
/// cache, or else the database. Every refusal looks the same to the client.
#[tracing::instrument(level = "debug", skip_all)]
async fn authenticate(
    req: &HttpRequest,
    query_token: Option<&QueryToken>,
    genie_key: bool,
    state: &IngestState,
) -> Result<Authenticated, IngestError> {
    let (presented, via) =
        credentials::presented(req, query_token, genie_key).ok_or(IngestError::Unauthorized)?;
    let looking_up = Instant::now();
    let authenticated = match state.tokens.get(&presented) {
        Some(token) => Authenticated {
            token,
            presented,
            cached: true,
        },
        None => {
            let token = state.batched.authenticate(presented.clone()).await?;
            let token = token.ok_or(IngestError::Unauthorized)?;
            state.tokens.insert(&presented, token.clone());
            Authenticated {
                token,
                presented,
                cached: false,
            }
        }
    };
    state.metrics.stage(Stage::Authenticate, looking_up);
    if credentials::accepts(&authenticated.token, via) {
        Ok(authenticated)
    } else {
        Err(IngestError::Unauthorized)
    }
}
