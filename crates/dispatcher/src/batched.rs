//! The dispatcher's batched repository operations, each named at its call
//! (`ctx.batched.claim(claim)`): concurrent calls of one operation share statements, each
//! caller getting its own answer (see `tocsin_storage::batch`).

use std::sync::Arc;

use diesel_async::AsyncPgConnection;
use futures::future::BoxFuture;
use tocsin_storage::attempts::{self, Claim, ClaimRules, Completed, Completion, Job};
use tocsin_storage::deliveries::{self, Due, WaitReason};
use tocsin_storage::fan_out::{self, FanOut, FanOutRules, FannedOut};
use tocsin_storage::{batcher, submit, DbBatcher, DbError, DbPool};
use uuid::Uuid;

/// Largest batch of one operation written by one statement.
const MAX_BATCH: usize = 64;
/// Statements of each kind in flight at once (each holds a pooled connection meanwhile).
const BATCH_WORKERS: usize = 2;

/// An event to fan out, with the room the dispatcher has for each webhook that is not
/// answering (see `crate::slots::WebhookSlots::limited_room`).
type FanOutRequest = (FanOut, Arc<[(Uuid, i64)]>);

pub(crate) struct Batched {
    fan_outs: DbBatcher<FanOutRequest, FannedOut>,
    claims: DbBatcher<Claim, Option<Job>>,
    completions: DbBatcher<Completion, Option<Completed>>,
    waits: DbBatcher<Due, bool>,
    stops: DbBatcher<Uuid, bool>,
}

impl Batched {
    pub fn start(pool: &DbPool, claim_rules: ClaimRules, schedule_attempts: u8) -> Batched {
        Batched {
            fan_outs: batcher(
                pool,
                MAX_BATCH,
                BATCH_WORKERS,
                move |conn: &mut AsyncPgConnection, items: &[FanOutRequest]| -> BoxFuture<'_, _> {
                    let rules = FanOutRules {
                        claim: true,
                        lease_margin: claim_rules.lease_margin,
                        replay_to: None,
                    };
                    Box::pin(fan_out_batch(conn, items, rules))
                },
            ),
            claims: batcher(
                pool,
                MAX_BATCH,
                BATCH_WORKERS,
                move |conn: &mut AsyncPgConnection, claims: &[Claim]| -> BoxFuture<'_, _> {
                    Box::pin(attempts::claim(conn, claims, claim_rules))
                },
            ),
            completions: batcher(pool, MAX_BATCH, BATCH_WORKERS, |conn, items| {
                Box::pin(attempts::complete(conn, items))
            }),
            waits: batcher(pool, MAX_BATCH, 1, |conn, items| {
                Box::pin(deliveries::wait(conn, items, WaitReason::WebhookBusy))
            }),
            stops: batcher(
                pool,
                MAX_BATCH,
                1,
                move |conn: &mut AsyncPgConnection, ids: &[Uuid]| -> BoxFuture<'_, _> {
                    Box::pin(async move {
                        let stopped = deliveries::stop(conn, ids, schedule_attempts).await?;
                        Ok(ids.iter().map(|id| stopped.contains(id)).collect())
                    })
                },
            ),
        }
    }

    /// Creates an event's deliveries, claiming their first attempts where `room` allows
    /// ([`fan_out::fan_out`]).
    pub async fn fan_out(
        &self,
        event: FanOut,
        room: Arc<[(Uuid, i64)]>,
    ) -> Result<FannedOut, DbError> {
        submit(&self.fan_outs, (event, room)).await
    }

    /// Claims an attempt; `None` when its guard refused it ([`attempts::claim`]).
    pub async fn claim(&self, claim: Claim) -> Result<Option<Job>, DbError> {
        submit(&self.claims, claim).await
    }

    /// Records an attempt's outcome and moves its delivery; `None` when it was recorded
    /// already ([`attempts::complete`]).
    pub async fn complete(&self, completion: Completion) -> Result<Option<Completed>, DbError> {
        submit(&self.completions, completion).await
    }

    /// Moves a delivery whose webhook has no room to `waiting`; whether it moved
    /// ([`deliveries::wait`]).
    pub async fn wait(&self, due: Due) -> Result<bool, DbError> {
        submit(&self.waits, due).await
    }

    /// Fails a delivery that can get no more automatic attempt; whether it did
    /// ([`deliveries::stop`]).
    pub async fn stop(&self, delivery_id: Uuid) -> Result<bool, DbError> {
        submit(&self.stops, delivery_id).await
    }
}

/// Fans out a batch of events with one statement, each first attempt claimed.
async fn fan_out_batch(
    conn: &mut AsyncPgConnection,
    items: &[FanOutRequest],
    rules: FanOutRules,
) -> Result<Vec<FannedOut>, DbError> {
    let events: Vec<FanOut> = items.iter().map(|(event, _)| event.clone()).collect();
    // The latest view of the webhooks' room among the batch's callers.
    let room = items.last().map(|(_, room)| room.clone());
    fan_out::fan_out(conn, &events, room.as_deref().unwrap_or_default(), rules).await
}
