//! Fan-out: an incident event from the events exchange becomes one delivery per enabled webhook
//! subscribed to its kind, created idempotently (a redelivered event creates none twice), and
//! this dispatcher makes their first attempts at once, itself: no message per delivery. The
//! event message is acked once every first attempt is claimed (logged, its request about to go
//! out) or its delivery is `waiting`; a dispatcher that stops or dies before then leaves the
//! event to be redelivered, and the redelivered event gives its deliveries still without an
//! attempt to the dispatcher that takes it.

use std::sync::Arc;

use lapin::message::Delivery;
use tocsin_domain::amqp::messages::EventMessage;
use tocsin_domain::db;
use tocsin_domain::db::deliveries::{Due, FanOut, FannedOut};
use tokio::sync::oneshot;

use crate::context::{retry_db, Context, Outcome};

pub(crate) async fn handle_event(ctx: Arc<Context>, message: Delivery) {
    let outcome = match EventMessage::from_bytes(&message.data) {
        Ok(event) => fan_out(&ctx, &event, message.redelivered).await,
        Err(error) => Outcome::Park(format!("unreadable event message: {error}")),
    };
    ctx.finish(message, outcome, "fanout").await;
}

#[tracing::instrument(skip_all, fields(event_id = %event.event_id, event = %event.event))]
async fn fan_out(ctx: &Arc<Context>, event: &EventMessage, redelivered: bool) -> Outcome {
    let request = FanOut {
        event_id: event.event_id,
        kind: event.event,
        incident_id: event.incident_id,
        test_webhook_id: event.test_webhook_id,
        redelivered,
    };
    // Webhooks with no free slot here get their deliveries `waiting` from the start.
    let busy: Arc<[uuid::Uuid]> = ctx.slots.busy().into();
    let FannedOut { pending, waiting } = match retry_db!(
        ctx,
        db::submit(&ctx.fanouts, (request.clone(), busy.clone())).await
    ) {
        Ok(fanned) => fanned,
        Err(outcome) => return outcome,
    };
    ctx.metrics
        .deliveries_created
        .inc_by((pending.len() + waiting) as u64);
    ctx.metrics.waited.inc_by(waiting as u64);
    tracing::debug!(deliveries = pending.len() + waiting, waiting, "fanned out");
    let started: Vec<_> = pending.into_iter().map(|due| start(ctx, due)).collect();
    tokio::select! {
        _ = futures::future::join_all(started) => Outcome::Done,
        // Redelivered later: its deliveries not yet attempted are attempted then.
        _ = ctx.cancel.cancelled() => Outcome::Requeue,
    }
}

/// Starts the next automatic attempt of `due` in this dispatcher; the receiver resolves once
/// the attempt is claimed, the delivery is `waiting`, or the task ended without either (the
/// dispatcher is stopping).
pub(crate) fn start(ctx: &Arc<Context>, due: Due) -> oneshot::Receiver<()> {
    let (claimed, receiver) = oneshot::channel();
    let ctx = ctx.clone();
    ctx.tasks.clone().spawn(async move {
        if ctx.cancel.is_cancelled() {
            return;
        }
        crate::deliver::attempt_due(&ctx, due, Some(claimed)).await;
    });
    receiver
}
