//! Test kit for Tocsin's integration tests: each test gets its own PostgreSQL database (cloned
//! from a migrated template) and its own AMQP prefix (its queues removed afterwards), real HTTP
//! receivers on loopback that record requests and answer as told (a raw one, [`raw_receiver`],
//! answering in bytes no HTTP server library would send), a TCP proxy that can cut a
//! test's connections to PostgreSQL or RabbitMQ, waiting on conditions with a deadline, the
//! service binaries as processes, and the strategies the fuzz tests share ([`fuzz`]).
//!
//! Settings: `TOCSIN_TEST_DATABASE_URL` (a server URL without database, default
//! `postgres://postgres@127.0.0.1:5432`), `TOCSIN_TEST_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), `TOCSIN_TEST_RABBITMQ_API` (default
//! `http://guest:guest@127.0.0.1:15672`).

pub mod audit;
mod broker;
mod database;
pub mod deliveries;
pub mod fuzz;
mod process;
mod proxy;
pub mod raw_receiver;
mod receiver;
pub mod servers;
mod wait;

pub use broker::{amqp_url, management_api, TestPrefix};
pub use database::{database_server_url, TestDb};
pub use process::{binary, free_port, wait_ready, ServiceProcess};
pub use proxy::TcpProxy;
pub use raw_receiver::{RawBehavior, RawReceiver, RawRequest};
pub use receiver::{Behavior, Received, Receiver};
pub use wait::{wait_for, wait_until, within};

/// A signal for `key` (a SEV2 "Disk full on db-1" from source `test`, no labels), as an alert
/// body would carry it.
pub fn signal(
    key: &str,
    action: tocsin_domain::alerts::AlertAction,
) -> tocsin_domain::alerts::AlertSignal {
    tocsin_domain::alerts::AlertSignal {
        dedup_key: key.to_owned(),
        action,
        title: tocsin_domain::IncidentTitle::parse("Disk full on db-1").expect("a title"),
        severity: tocsin_domain::Severity::SEV2,
        description: None,
        source: Some("test".into()),
        reply_key: None,
        labels: Default::default(),
    }
}

/// Applies the signals of one alert body as ingest does (see
/// `tocsin_storage::incidents::apply_alerts`), answering its outcomes.
pub async fn apply_signals(
    conn: &mut diesel_async::AsyncPgConnection,
    signals: &[tocsin_domain::alerts::AlertSignal],
    wake: tocsin_storage::outbox::Wake,
) -> Result<Vec<tocsin_storage::incidents::SignalOutcome>, tocsin_storage::DbError> {
    let mut outcomes =
        tocsin_storage::incidents::apply_alerts(conn, &[signals.to_vec().into()], wake).await?;
    // No token to check: never refused.
    Ok(outcomes.pop().and_then(Result::ok).unwrap_or_default())
}

/// A fast retry schedule for tests (five attempts, well under a second apart).
pub const FAST_RETRY_DELAYS: &str = "0s,200ms,300ms,400ms,500ms";
