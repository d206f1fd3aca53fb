//! Making an attempt of a delivery, in four stages: take a slot of the webhook (or leave the
//! delivery `waiting`), claim the attempt (logged before its request is sent, guarded so that
//! no duplicate or late message sends twice), send the signed `POST` (`request.rs`), and record
//! its outcome with the transition the domain gives; a failed automatic attempt with attempts
//! left is scheduled through the retry queue of the next delay. Every attempt is made here,
//! whoever asked for it: the fan-out (`make_claimed`), a delivery message, the waiting pass
//! (`spawn`, `make_due`), an operator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use time::OffsetDateTime;
use tocsin_broker::header_str;
use tocsin_broker::messages::{auto_attempts_of, DeliveryMessage, TRIGGER_HEADER};
use tocsin_domain::delivery::{AttemptError, DeliveryState, Transition, Trigger, WaitReason};
use tocsin_domain::WebhookOrdering;
use tocsin_storage::attempts::{AttemptResult, Claim, Completion, Job};
use tocsin_storage::deliveries::{self, Due};
use tocsin_web::telemetry::RemoteParent;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tracing::Instrument;

use crate::context::{Context, Settlement};
use crate::metrics::Stage;
use crate::slots::Slot;

/// Handles a message of the delivery queue: an automatic attempt (a retry, one the sweeper
/// found overdue, one handed over by a stopping dispatcher) or a manual one.
pub(crate) async fn handle_delivery(ctx: Arc<Context>, message: Delivery) {
    let trigger = header_str(&message.properties, TRIGGER_HEADER)
        .and_then(|t| Trigger::parse(&t))
        .unwrap_or(Trigger::Automatic);
    let auto_attempts = auto_attempts_of(&message.properties).unwrap_or(0);
    // A retry continues the trace of the attempt that scheduled it.
    let span = tracing::debug_span!(
        "delivery_message",
        trigger = trigger.as_str(),
        auto_attempts = (trigger == Trigger::Automatic).then_some(auto_attempts)
    );
    RemoteParent::from_headers(|name| header_str(&message.properties, name)).adopt_by(&span);
    let settlement = delivery_message(&ctx, &message, trigger, auto_attempts)
        .instrument(span)
        .await;
    ctx.settle(message, settlement, "deliveries").await;
}

async fn delivery_message(
    ctx: &Arc<Context>,
    message: &Delivery,
    trigger: Trigger,
    auto_attempts: i32,
) -> Settlement {
    match DeliveryMessage::from_bytes(&message.data) {
        Ok(parsed) => match trigger {
            Trigger::Manual => {
                let claim = Claim {
                    delivery_id: parsed.delivery_id,
                    trigger,
                    auto_attempts: 0,
                };
                make(ctx, claim, None, None).await
            }
            Trigger::Automatic => match due(ctx, &parsed, auto_attempts).await {
                Ok(due) => make_due(ctx, due, None).await,
                Err(settlement) => settlement,
            },
        },
        Err(error) => Settlement::Park(format!("unreadable delivery message: {error}")),
    }
}

/// The delivery a message asks the next automatic attempt of, after the `auto_attempts` its
/// sender saw made.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %message.delivery_id, auto_attempts))]
async fn due(
    ctx: &Arc<Context>,
    message: &DeliveryMessage,
    auto_attempts: i32,
) -> Result<Due, Settlement> {
    let webhook_id = match message.webhook_id {
        Some(webhook_id) => webhook_id,
        None => {
            let id = message.delivery_id;
            let loaded = ctx
                .retry_db(|| async {
                    let mut conn = ctx.pool.get().await?;
                    deliveries::get(&mut conn, id).await
                })
                .await;
            match loaded {
                Ok(delivery) => delivery.webhook_id,
                Err(Settlement::Park(reason)) => {
                    return Err(Settlement::Park(format!("delivery {id}: {reason}")))
                }
                Err(settlement) => return Err(settlement),
            }
        }
    };
    Ok(Due {
        delivery_id: message.delivery_id,
        webhook_id,
        auto_attempts,
    })
}

/// Starts the next automatic attempt of `due` in this dispatcher; the receiver resolves once
/// the attempt is claimed, the delivery is `waiting`, or the task ended without either (the
/// dispatcher is stopping).
pub(crate) fn spawn(ctx: &Arc<Context>, due: Due) -> oneshot::Receiver<()> {
    let (claimed, receiver) = oneshot::channel();
    let ctx = ctx.clone();
    ctx.tasks.clone().spawn(
        async move {
            if ctx.cancel.is_cancelled() {
                return;
            }
            make_due(&ctx, due, Some(claimed)).await;
        }
        .in_current_span(),
    );
    receiver
}

/// Tells whoever waits for it that an attempt is claimed (or will not be).
type Claimed = Option<oneshot::Sender<()>>;

/// Makes the next automatic attempt of `due` if its webhook has room; otherwise the delivery
/// is `waiting` until it has. `claimed` is told once the attempt is claimed or the delivery
/// is waiting.
pub(crate) async fn make_due(ctx: &Arc<Context>, due: Due, claimed: Claimed) -> Settlement {
    let Some(slot) = ctx.slots.take(due.webhook_id).await else {
        let outcome = wait(ctx, due).await;
        tell(claimed);
        return outcome;
    };
    let claim = Claim {
        delivery_id: due.delivery_id,
        trigger: Trigger::Automatic,
        auto_attempts: due.auto_attempts,
    };
    make(ctx, claim, Some(slot), claimed).await
}

fn tell(claimed: Claimed) {
    if let Some(claimed) = claimed {
        let _ = claimed.send(());
    }
}

#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %due.delivery_id, webhook_id = %due.webhook_id))]
async fn wait(ctx: &Arc<Context>, due: Due) -> Settlement {
    match ctx.retry_db(|| ctx.batched.wait(due)).await {
        Ok(true) => {
            ctx.metrics.waited(WaitReason::WebhookBusy).inc();
            tracing::debug!("webhook busy; delivery waiting");
            Settlement::Done
        }
        // Moved on meanwhile (a duplicate message): nothing to wait for.
        Ok(false) => Settlement::Done,
        Err(settlement) => settlement,
    }
}

/// Claims, makes and records one attempt. A manual attempt takes no slot of its webhook: an
/// operator asked for it now.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %claim.delivery_id, trigger = claim.trigger.as_str(), attempt, webhook_id))]
async fn make(
    ctx: &Arc<Context>,
    claim: Claim,
    slot: Option<Slot>,
    claimed: Claimed,
) -> Settlement {
    let Ok(request) = ctx.requests.clone().acquire_owned().await else {
        return Settlement::Requeue;
    };
    let job = ctx.retry_db(|| ctx.batched.claim(claim)).await;
    tell(claimed);
    let job = match job {
        Ok(Some(job)) => job,
        Ok(None) => return refused(ctx, claim).await,
        Err(Settlement::Park(reason)) => {
            return Settlement::Park(format!("delivery {}: {reason}", claim.delivery_id))
        }
        Err(settlement) => return settlement,
    };
    send_and_record(ctx, job, Room::Taken { slot, request }).await
}

/// Makes a first attempt claimed with its delivery by the fan-out: takes a slot of its webhook
/// in turn (the fan-out claimed no more than the room of a webhook that is not answering) and a
/// request permit, tells `started`, and makes it. Its lease lasts twice the webhook's timeout
/// plus [`crate::context::LEASE_MARGIN`] from the claim: the wait for room may take one timeout of it, the
/// request the other. An attempt that has no room by then is recorded as not sent
/// ([`AttemptError::NotSent`]) and follows the schedule: no request goes out past its lease.
#[tracing::instrument(level = "debug", skip_all, fields(delivery_id = %job.delivery.id, attempt = job.number, webhook_id = %job.webhook.id))]
pub(crate) async fn make_claimed(ctx: &Arc<Context>, job: Job, started: Claimed) -> Settlement {
    let room = async {
        let slot = ctx.slots.take_in_turn(job.webhook.id).await;
        let request = ctx.requests.clone().acquire_owned().await.ok()?;
        Some(Room::Taken { slot, request })
    };
    let room = match tokio::time::timeout(job.webhook.retry.timeout(), room).await {
        Ok(Some(room)) => room,
        // The permits are closed: the dispatcher is stopping.
        Ok(None) => return Settlement::Requeue,
        Err(_) => Room::None,
    };
    tell(started);
    send_and_record(ctx, job, room).await
}

/// What an attempt was given to be made in.
enum Room {
    /// A request permit of the dispatcher, and a slot of the webhook (none for a manual
    /// attempt); the permit is given back as soon as the request ends.
    Taken {
        slot: Option<Slot>,
        request: OwnedSemaphorePermit,
    },
    /// None within the attempt's lease: no request is sent.
    None,
}

/// Sends a claimed attempt (unless it has no room), records its outcome, and schedules the
/// next one.
async fn send_and_record(ctx: &Arc<Context>, job: Job, room: Room) -> Settlement {
    tracing::Span::current()
        .record("attempt", job.number)
        .record("webhook_id", tracing::field::display(job.webhook.id));
    let started = OffsetDateTime::now_utc();
    let sending = Instant::now();
    let result = match room {
        Room::Taken { slot, request } => {
            ctx.metrics.in_flight.inc();
            let result = crate::request::send(ctx, &job, started).await;
            ctx.metrics.in_flight.dec();
            if let (Some(slot), Some(_)) = (&slot, result.status_code) {
                slot.answered();
            }
            // The request is over: its slot and permit go to the next attempt now, not after
            // the outcome is recorded.
            drop((slot, request));
            result
        }
        Room::None => AttemptResult::not_sent(job.webhook.retry.timeout_ms()),
    };
    // A request never sent says nothing of the target: no health of it (nor lag or duration).
    let sent = result.error != Some(AttemptError::NotSent);
    observe(ctx, &job, &result, started, sending.elapsed());
    tracing::debug!(
        status = result.status_code,
        success = result.success,
        "attempt made"
    );

    let auto_attempts = (job.trigger == Trigger::Automatic).then_some(job.delivery.auto_attempts);
    let transition = Transition::after_attempt(
        job.trigger,
        job.delivery.auto_attempts,
        result.success,
        job.webhook.retry.max_attempts(),
        &ctx.schedule,
    );
    let completion = Completion {
        delivery_id: job.delivery.id,
        number: job.number,
        auto_attempts,
        result,
        transition,
    };
    let recording = Instant::now();
    let completed = ctx
        .retry_db(|| ctx.batched.complete(completion.clone()))
        .await;
    ctx.metrics.stage(Stage::Outcome, recording.elapsed());
    let completed = match completed {
        Ok(Some(completed)) => completed,
        // Recorded as interrupted meanwhile (this dispatcher outlived its lease).
        Ok(None) => return Settlement::Done,
        Err(Settlement::Park(reason)) => {
            // This outcome's own error: it fails alone. The attempt stays under way until its
            // lease ends, and the sweeper records it as interrupted.
            tracing::error!(
                delivery_id = %job.delivery.id,
                attempt = job.number,
                %reason,
                "the attempt's outcome could not be recorded; the sweeper will record it as interrupted"
            );
            return Settlement::Done;
        }
        Err(settlement) => return settlement,
    };
    if sent {
        ctx.health.add(job.webhook.id, &completion.result);
    }
    if !completed.moved {
        return Settlement::Done;
    }
    if let Some(state) = completed.state.filter(|s| s.is_finished()) {
        ctx.metrics
            .deliveries_finished
            .with_label_values(&[state.as_str()])
            .inc();
        if job.webhook.ordering == WebhookOrdering::Incident {
            start_next_in_order(ctx, job.delivery.id).await;
        }
    }
    if let (Transition::Retry { delay }, Some(DeliveryState::Retrying)) =
        (transition, completed.state)
    {
        let next = Due {
            delivery_id: job.delivery.id,
            webhook_id: job.webhook.id,
            auto_attempts: job.delivery.auto_attempts,
        };
        if let Err(error) = ctx.broker.publish(ctx.attempt_message(&next, delay)).await {
            // The delivery is `retrying` with its next attempt time: once that is overdue, the
            // sweeper sends it.
            tracing::warn!(
                delivery_id = %job.delivery.id,
                %error,
                "could not schedule the retry; the sweeper will send it"
            );
        }
    }
    Settlement::Done
}

/// Starts the delivery that comes next in its incident's order now that `finished` has
/// finished, if one waits for it. Should this fail, the waiting pass starts it within a second.
async fn start_next_in_order(ctx: &Arc<Context>, finished: uuid::Uuid) {
    let next = async {
        let mut conn = ctx.pool.get().await?;
        deliveries::next_in_order(&mut conn, finished).await
    };
    match next.await {
        Ok(Some(due)) => drop(spawn(ctx, due)),
        Ok(None) => {}
        Err(error) => tracing::warn!(
            delivery_id = %finished,
            %error,
            "could not start the next delivery in its incident's order; the waiting pass will"
        ),
    }
}

/// A claim its guard refused: a duplicate or late message, or a delivery that can get no more
/// automatic attempt, which is failed now (its webhook disabled or deleted, its schedule used
/// up). Its log lines name the delivery themselves: the stage spans are `debug` ones.
async fn refused(ctx: &Arc<Context>, claim: Claim) -> Settlement {
    if claim.trigger == Trigger::Manual {
        tracing::info!(
            delivery_id = %claim.delivery_id,
            "manual attempt refused: the delivery succeeded, or its webhook is disabled or deleted"
        );
        return Settlement::Done;
    }
    match ctx.retry_db(|| ctx.batched.stop(claim.delivery_id)).await {
        Ok(stopped) => {
            if stopped {
                tracing::info!(
                    delivery_id = %claim.delivery_id,
                    "no further attempt allowed; delivery failed"
                );
                ctx.metrics
                    .deliveries_finished
                    .with_label_values(&[DeliveryState::Failed.as_str()])
                    .inc();
            }
            Settlement::Done
        }
        Err(settlement) => settlement,
    }
}

/// Counts an attempt; the lag of a first attempt and the duration (`took`) only of one that was
/// sent.
fn observe(
    ctx: &Context,
    job: &Job,
    result: &AttemptResult,
    started: OffsetDateTime,
    took: Duration,
) {
    let sent = result.error != Some(AttemptError::NotSent);
    if sent && job.number == 1 {
        let lag = (started - job.occurred_at).as_seconds_f64().max(0.0);
        ctx.metrics.lag.observe(lag);
    }
    let outcome = if result.success { "success" } else { "failure" };
    ctx.metrics
        .attempts
        .with_label_values(&[
            outcome,
            result.error.map_or("none", AttemptError::as_str),
            job.trigger.as_str(),
        ])
        .inc();
    if sent {
        ctx.metrics
            .attempt_duration
            .with_label_values(&[outcome])
            .observe(took.as_secs_f64());
    }
}
