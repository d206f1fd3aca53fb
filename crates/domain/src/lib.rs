//! Tocsin's domain: the pure rules that ingest, dispatcher and admin share, with no I/O. Types
//! that can only hold valid values, the inbound alert parsers, Standard Webhooks signing, the
//! retry schedule, the event payload, the delivery state machine ([`delivery`]), and the
//! redaction of connection strings for logs. It knows nothing of HTTP, PostgreSQL or RabbitMQ:
//! `tocsin-storage` stores these values and `tocsin-broker` carries them, both building on this
//! crate (domain ← broker ← storage).

pub mod alerts;
pub mod delivery;
mod event;
mod incident;
mod redact;
pub mod retry;
mod role;
mod secret;
mod severity;
pub mod signing;
mod subscription;
pub mod text;
mod token;
mod webhook;

pub use event::{rfc3339_utc, EventKind, EventPayload, IncidentData, InvalidEventKind};
pub use incident::{IncidentStatus, IncidentTitle, InvalidStatus, InvalidTitle, TransitionError};
pub use redact::redact_url;
pub use retry::RetrySchedule;
pub use role::{InvalidRole, Role};
pub use secret::{InvalidSecret, WebhookSecret};
pub use severity::{InvalidSeverity, Severity};
pub use subscription::{
    InvalidSetting, RateLimit, WebhookFilters, WebhookHeaders, WebhookOrdering,
};
pub use token::{constant_time_eq, AccessToken, InvalidSigningSecret, SigningSecret};
pub use webhook::{InvalidName, InvalidRetry, InvalidUrl, RetrySettings, TargetUrl, WebhookName};
