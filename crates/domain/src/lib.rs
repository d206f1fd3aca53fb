//! Tocsin's domain: what ingest, dispatcher and admin share. Types that can only hold valid
//! values, Standard Webhooks signing, the retry schedule, the inbound alert parsers, the
//! delivery state machine, and the RabbitMQ topology. It knows nothing of HTTP frameworks; the
//! PostgreSQL storage is `tocsin-storage`'s.

pub mod alerts;
pub mod amqp;
pub mod delivery;
mod event;
mod incident;
mod redact;
pub mod retry;
mod secret;
mod severity;
pub mod signing;
mod token;
mod webhook;

pub use event::{rfc3339_utc, EventKind, EventPayload, IncidentData, InvalidEventKind};
pub use incident::{IncidentStatus, IncidentTitle, InvalidStatus, InvalidTitle, TransitionError};
pub use redact::redact_url;
pub use retry::RetrySchedule;
pub use secret::{InvalidSecret, WebhookSecret};
pub use severity::{InvalidSeverity, Severity};
pub use token::{constant_time_eq, AccessToken};
pub use webhook::{InvalidName, InvalidRetry, InvalidUrl, RetrySettings, TargetUrl, WebhookName};
