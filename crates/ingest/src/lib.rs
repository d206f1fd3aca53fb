//! `tocsin-ingest`: the inbound alert endpoint, `POST /api/v1/webhooks/alerts`, and the
//! Opsgenie-style Alert API under `/api/v1/webhooks/alerts/opsgenie/`.
//! Monitoring tools post their alerts here with an inbound token; each body becomes incident
//! changes and their events, committed with their outbox rows before the answer (a batch that
//! only opens incidents in one statement, any other in one transaction).

mod batched;
mod config;
mod credentials;
mod metrics;
mod rate_limit;
mod routes;
mod sns;
mod startup;
mod token_cache;

pub use config::Config;
pub use sns::SnsHosts;
pub use startup::{build, App};
