//! Ingest's batched repository operations, each named at its call
//! (`state.batched.apply_alerts(signals)`): concurrent calls share statements, each caller
//! getting its own answer (see `tocsin_storage::batch`).

use std::sync::Arc;
use tocsin_domain::AccessToken;
use tocsin_storage::incidents::{self, AlertBody, Applied};

use tocsin_storage::outbox::Wake;
use tocsin_storage::relay::RelayWaker;
use tocsin_storage::tokens::LiveToken;
use tocsin_storage::{batcher, submit, tokens, DbBatcher, DbError, DbPool};

/// Most items of one operation in one statement or transaction.
const MAX_BATCH: usize = 64;
/// Statements of each kind in flight at once (each holds a pooled connection meanwhile).
const BATCH_WORKERS: usize = 4;

pub struct Batched {
    tokens: DbBatcher<AccessToken, Option<LiveToken>>,
    alerts: DbBatcher<AlertBody, Applied>,
}

impl Batched {
    /// `relay`: this process's relay, which the alerts' outbox rows are handed to.
    pub fn start(pool: &DbPool, relay: Arc<RelayWaker>) -> Batched {
        let wake = Wake::HandOver(relay);
        Batched {
            tokens: batcher(pool, MAX_BATCH, BATCH_WORKERS, |conn, presented| {
                Box::pin(tokens::authenticate_all(conn, presented))
            }),
            alerts: batcher(pool, MAX_BATCH, BATCH_WORKERS, move |conn, bodies| {
                Box::pin(incidents::apply_alerts(conn, bodies, wake.clone()))
            }),
        }
    }

    /// The live token presented, if any, with what it allows ([`tokens::authenticate_all`]).
    pub async fn authenticate(&self, presented: AccessToken) -> Result<Option<LiveToken>, DbError> {
        submit(&self.tokens, presented).await
    }

    /// Applies one alert body's signals and records their events in the outbox, with the
    /// body's headers, and hands the rows to the relay once committed; nothing of it when its
    /// token was revoked ([`incidents::apply_alerts`]).
    pub async fn apply_alerts(&self, body: AlertBody) -> Result<Applied, DbError> {
        submit(&self.alerts, body).await
    }
}
