//! Fan-out: one delivery per enabled webhook subscribed to the event's kind, recorded in
//! PostgreSQL (a redelivered event creates none twice) and enqueued for its first attempt. A
//! delivery to a webhook that this dispatcher finds slow and at its in-flight limit goes
//! straight to the deferral queue: taken now, it would only be deferred there after a load.

use std::sync::Arc;

use lapin::message::Delivery;
use tocsin_domain::amqp::messages::EventMessage;
use tocsin_domain::db;
use tocsin_domain::db::deliveries::{FanOut, FannedOut};

use crate::startup::{retry_db, Context, Outcome};

pub(crate) async fn handle_event(ctx: Arc<Context>, message: Delivery) {
    let outcome = match EventMessage::from_bytes(&message.data) {
        Ok(event) => fan_out(&ctx, &event, message.redelivered).await,
        Err(error) => Outcome::Park(format!("unreadable event message: {error}")),
    };
    ctx.finish(message, outcome, "fanout").await;
}

async fn fan_out(ctx: &Context, event: &EventMessage, redelivered: bool) -> Outcome {
    let request = FanOut {
        event_id: event.event_id,
        kind: event.event,
        incident_id: event.incident_id,
        test_webhook_id: event.test_webhook_id,
        redelivered,
    };
    let FannedOut {
        created,
        held,
        to_enqueue,
    } = match retry_db!(ctx, db::submit(&ctx.fanouts, request.clone()).await) {
        Ok(fanned) => fanned,
        Err(outcome) => return outcome,
    };
    if let Err(error) = ctx.enqueue_first_attempts(&to_enqueue).await {
        tracing::warn!(%error, event_id = %event.event_id, "could not enqueue deliveries; the event will be redelivered");
        return Outcome::Requeue;
    }
    ctx.metrics.deliveries_created.inc_by(created as u64);
    tracing::debug!(event_id = %event.event_id, event = %event.event, deliveries = created, held, "fanned out");
    Outcome::Done
}
