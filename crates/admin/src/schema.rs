//! OpenAPI schemas of the string enums the API uses, with their values taken from the domain
//! types so the document cannot drift from them, and of the common error body. The domain crate
//! knows nothing of utoipa: these stand in for its types in `#[schema(value_type = ...)]`.

use std::borrow::Cow;

use serde_json::Value;
use tocsin_domain::delivery::Trigger;
use tocsin_storage::deliveries::{AttemptError as DomainAttemptError, DeliveryState as State};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;

macro_rules! string_enum {
    ($(#[doc = $doc:literal])+ $name:ident => $values:expr) => {
        $(#[doc = $doc])+
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                let values: Vec<Value> = $values.into_iter().map(Value::from).collect();
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some(concat!($($doc),+).trim()))
                    .enum_values(Some(values))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

string_enum! {
    /// An event kind.
    EventKind => tocsin_domain::EventKind::ALL.map(|k| k.as_str())
}

string_enum! {
    /// An incident status. New incidents are `triggered`; any unresolved status may move to any
    /// other; `resolved` is final.
    IncidentStatus => tocsin_domain::IncidentStatus::ALL.map(|s| s.as_str())
}

string_enum! {
    /// An incident severity, `SEV1` (most severe) to `SEV5`.
    Severity => tocsin_domain::Severity::ALL.map(|s| s.as_str())
}

string_enum! {
    /// An alert source: the format ingest reads a body as, and the namespace of the incident's
    /// dedup key (docs/ingest.md).
    AlertSource => tocsin_domain::alerts::AlertFormat::ALL.map(|f| f.as_str())
}

string_enum! {
    /// Where a delivery stands: `pending` (waiting for its first attempt), `waiting` (its next
    /// attempt is due but its webhook has no room for it now: see `wait_reason`), `retrying`
    /// (failed, next automatic attempt at `next_attempt_at`), `succeeded`, `failed` (every
    /// allowed attempt failed, or its webhook was disabled or deleted).
    DeliveryState => State::ALL.map(State::as_str)
}

string_enum! {
    /// Why a delivery is `waiting`: `webhook_busy` (the webhook has as many requests in flight
    /// as a dispatcher allows one webhook; the attempt is made as soon as one finishes),
    /// `webhook_disabled` (the event came while the webhook was disabled; sent once it is
    /// enabled and recovered), `rate_limited` (the webhook's rate limit is spent; the attempt
    /// is made at `next_attempt_at`), `ordering` (the webhook receives each incident's events in
    /// order, and the delivery of the incident's previous event, `waits_for`, has not finished).
    WaitReason => tocsin_domain::delivery::WaitReason::ALL.map(|r| r.as_str())
}

string_enum! {
    /// In what order a webhook receives an incident's events: `none` (every first attempt at
    /// once; an incident's events may arrive in any order) or `incident` (in the order of the
    /// incident's changes: a delivery waits, `ordering`, until the previous one has finished).
    Ordering => tocsin_domain::WebhookOrdering::ALL.map(|o| o.as_str())
}

string_enum! {
    /// An admin key's role: `viewer` (reads webhooks without their secrets, the delivery log,
    /// incidents, tokens' names), `operator` (also retries, replays, recovers, sends test events
    /// and changes incidents' status) or `admin` (everything, secrets and keys included).
    Role => tocsin_domain::Role::ALL.map(|r| r.as_str())
}

string_enum! {
    /// Who asked for an attempt: the retry schedule (`automatic`) or an operator (`manual`).
    AttemptTrigger => [Trigger::Automatic, Trigger::Manual].map(Trigger::as_str)
}

string_enum! {
    /// Why an attempt failed: no answer in time, connection refused or broken, name not
    /// resolved, TLS failure, target refused by the SSRF rules, a non-2xx status, a redirect
    /// (never followed), interrupted (the dispatcher making it stopped before recording the
    /// answer), not sent (no room within the attempt's lease: no request was made), or
    /// something else.
    AttemptError => DomainAttemptError::ALL.map(DomainAttemptError::as_str)
}

/// The error body of every refusal (`tocsin_web::ErrorBody`).
#[derive(utoipa::ToSchema)]
#[schema(example = json!({"error": {"code": "invalid", "message": "url: scheme must be http or https", "field": "url"}}))]
#[allow(dead_code)] // describes tocsin_web::ErrorBody for the document; never built
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The refusals of every endpoint that reads a JSON body, before it looks at the content.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes responses for the document; never built
pub enum JsonBodyErrors {
    #[response(status = 400, description = "The body is not JSON")]
    NotJson(ErrorBody),
    #[response(status = 413, description = "The body is over the limit")]
    TooLarge(ErrorBody),
    #[response(status = 415, description = "Content-Type is not JSON")]
    NotJsonContentType(ErrorBody),
}

/// What went wrong.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // describes tocsin_web::ErrorDetail for the document; never built
pub struct ErrorDetail {
    /// A stable machine-readable word: `bad_request`, `invalid`, `unauthorized`, `not_found`,
    /// `conflict`, `method_not_allowed`, `payload_too_large`, `unsupported_media_type`,
    /// `rate_limited`, `unavailable`, `internal`.
    pub code: String,
    /// For people; names the field first when there is one.
    pub message: String,
    /// The offending request field (`retry.max_attempts`, `events[1]`) or query parameter.
    pub field: Option<String>,
}
