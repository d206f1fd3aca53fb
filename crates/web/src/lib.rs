//! What Tocsin's three services share at start and over actix-web: the settings every service
//! reads ([`config`]: the pool, the broker handle, logging), the one JSON error shape, strict
//! JSON body parsing that names the offending field, bearer tokens, `/healthz` `/readyz`
//! `/metrics`, a service runner that stops gracefully on SIGTERM, and the export of traces
//! over OpenTelemetry when an OTLP endpoint is set ([`telemetry`]).

pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod health;
pub mod json;
pub mod metrics;
pub mod service;
pub mod ssrf;
pub mod telemetry;

pub use error::{ApiError, ErrorBody};
pub use health::Readiness;
pub use metrics::HttpMetrics;
pub use service::{Background, Service};
