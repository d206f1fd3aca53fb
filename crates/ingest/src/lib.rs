//! `tocsin-ingest`: the inbound alert endpoint, `POST /api/v1/webhooks/alerts`.
//! Monitoring tools post their alerts here with a bearer token; each body becomes incident
//! changes and their events, committed in one transaction with the outbox.

mod batched;
mod config;
mod metrics;
mod rate_limit;
mod routes;
mod startup;

pub use config::Config;
pub use startup::{build, App};
