//! Ingest's batched repository operations, each named at its call
//! (`state.batched.apply_alerts(signals)`): concurrent calls share statements, each caller
//! getting its own answer (see `tocsin_storage::batch`).

use std::sync::Arc;
use tocsin_domain::AccessToken;
use tocsin_storage::incidents::{self, AlertBody, Applied};
use uuid::Uuid;

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
            tokens: batcher(pool, MAX_BATCH, BATCH_WORKERS, {
                let pool = pool.clone();
                move |conn, presented| {
                    let pool = pool.clone();
                    Box::pin(async move {
                        let found = tokens::authenticate_all(conn, presented).await?;
                        note_use(pool, found.iter().flatten().map(|t| t.id).collect());
                        Ok(found)
                    })
                }
            }),
            alerts: batcher(pool, MAX_BATCH, BATCH_WORKERS, move |conn, bodies| {
                Box::pin(incidents::apply_alerts(conn, bodies, wake.clone()))
            }),
        }
    }

    /// The live token presented, if any, with what it allows ([`tokens::authenticate_all`]);
    /// its use is noted after the answer ([`note_use`]).
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

/// Notes the use of the live tokens `ids` ([`tokens::note_use`]) in a task of its own, so that
/// the write (at most once a minute a token) keeps off the request's way: it cost a token's
/// first request after a start 2 ms. A failure only leaves `last_used_at` older.
fn note_use(pool: DbPool, ids: Vec<Uuid>) {
    if ids.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let noted = match pool.get().await {
            Ok(mut conn) => tokens::note_use(&mut conn, &ids).await,
            Err(error) => Err(DbError::from(error)),
        };
        if let Err(error) = noted {
            tracing::warn!(error = %format!("{error:#}"), "noting a token's use failed");
        }
    });
}
