//! `POST /api/v1/webhooks/alerts`.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use tocsin_domain::alerts::{self, AlertAction, AlertError, AlertFormat};
use tocsin_domain::{AccessToken, EventKind, IncidentStatus};
use tocsin_storage::incidents::{AlertBody, Change, SignalOutcome};
use tocsin_storage::DbError;
use tocsin_web::auth::bearer_token;
use tocsin_web::body::{read_limited, BodyError};
use tocsin_web::telemetry::{self, RemoteParent};
use tocsin_web::{json, ApiError};
use tokio::sync::Notify;
use tracing::field::Empty;
use tracing::Instrument;
use uuid::Uuid;

use crate::batched::Batched;
use crate::metrics::IngestMetrics;
use crate::rate_limit::RateLimiter;

/// Seconds a sender should wait after a 503.
const RETRY_AFTER_UNAVAILABLE: u64 = 5;

/// What the handler shares.
pub struct IngestState {
    /// Token checks and alert writes, batched across concurrent requests.
    pub batched: Batched,
    pub relay: Arc<Notify>,
    pub limiter: RateLimiter,
    pub metrics: IngestMetrics,
    pub body_limit: usize,
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
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(error: IngestError) -> Self {
        match error {
            IngestError::Unauthorized => ApiError::unauthorized(),
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
                tracing::error!(%error, "an alert could not be stored; nothing of it was recorded");
                ApiError::new(
                    actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "alert_not_stored",
                    format!(
                        "the database refused this alert, and nothing of it was recorded: {error}"
                    ),
                )
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct FormatQuery {
    format: Option<String>,
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
    query: web::Query<FormatQuery>,
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
    receive(req, payload, query, state).instrument(span).await
}

async fn receive(
    req: HttpRequest,
    payload: web::Payload,
    query: web::Query<FormatQuery>,
    state: web::Data<IngestState>,
) -> Result<HttpResponse, ApiError> {
    let mut format_label = "unknown";
    let result = handle(&req, payload, &query, &state, &mut format_label).await;
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

async fn handle(
    req: &HttpRequest,
    payload: web::Payload,
    query: &FormatQuery,
    state: &IngestState,
    format_label: &mut &'static str,
) -> Result<HttpResponse, IngestError> {
    let token_id = authenticate(req, state).await?;
    state
        .limiter
        .check(token_id)
        .map_err(|wait| IngestError::RateLimited {
            retry_after_secs: wait.as_secs() + 1,
        })?;
    if !json::is_json(req) {
        return Err(IngestError::UnsupportedMediaType);
    }
    let format = query
        .format
        .as_deref()
        .map(str::parse::<AlertFormat>)
        .transpose()?;
    let body = read_limited(req, payload, state.body_limit)
        .await
        .map_err(|error| match error {
            BodyError::TooLarge { limit } => IngestError::TooLarge { limit },
            BodyError::Read(message) => IngestError::Read(message),
        })?;
    let parsed = alerts::parse(&body, format)?;
    *format_label = parsed.format.as_str();
    let reply_key = parsed.signals.iter().find_map(|s| s.reply_key.clone());
    let body = AlertBody {
        signals: parsed.signals,
        headers: telemetry::current_headers(),
    };
    let outcomes = state.batched.apply_alerts(body).await?;
    if outcomes.iter().any(|o| !o.events.is_empty()) {
        state.relay.notify_one();
    }
    Ok(HttpResponse::Accepted().json(Accepted {
        status: "accepted",
        format: parsed.format,
        dedup_key: reply_key,
        incidents: outcomes.into_iter().map(Touched::from).collect(),
    }))
}

/// The id of the request's live token. Every refusal looks the same to the client.
#[tracing::instrument(level = "debug", skip_all)]
async fn authenticate(req: &HttpRequest, state: &IngestState) -> Result<Uuid, IngestError> {
    let presented = bearer_token(req)
        .and_then(AccessToken::from_presented)
        .ok_or(IngestError::Unauthorized)?;
    state
        .batched
        .authenticate(presented)
        .await?
        .ok_or(IngestError::Unauthorized)
}
