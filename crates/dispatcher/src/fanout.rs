//! Fan-out: one delivery per enabled webhook subscribed to the event's kind, recorded in
//! PostgreSQL (a redelivered event creates none twice) and enqueued for its first attempt.

use std::sync::Arc;

use lapin::message::Delivery;
use tocsin_domain::amqp::messages::EventMessage;
use tocsin_domain::db::{deliveries, webhooks, DbError};
use uuid::Uuid;

use crate::startup::{with_db, Context, Outcome};

pub(crate) async fn handle_event(ctx: Arc<Context>, message: Delivery) {
    let outcome = match EventMessage::from_bytes(&message.data) {
        Ok(event) => fan_out(&ctx, &event, message.redelivered).await,
        Err(error) => Outcome::Park(format!("unreadable event message: {error}")),
    };
    ctx.finish(message, outcome, "fanout").await;
}

async fn fan_out(ctx: &Context, event: &EventMessage, redelivered: bool) -> Outcome {
    let created = with_db!(ctx, |conn| async {
        let targets: Vec<Uuid> = match event.test_webhook_id {
            Some(id) => match webhooks::get(conn, id).await {
                Ok(webhook) => vec![webhook.id],
                Err(DbError::NotFound) => Vec::new(),
                Err(error) => return Err(error),
            },
            None => webhooks::subscribed_to(conn, event.event).await?,
        };
        let created = deliveries::create_for_event(
            conn,
            event.event_id,
            event.event,
            event.incident_id,
            &targets,
        )
        .await?;
        if redelivered {
            // The previous try may have committed its deliveries and died before enqueueing
            // them: enqueue every one still waiting for its first attempt.
            return Ok((
                created.len(),
                deliveries::waiting_for_first_attempt(conn, event.event_id).await?,
            ));
        }
        Ok((created.len(), created))
    });
    let (created, to_enqueue) = match created {
        Ok(ids) => ids,
        Err(outcome) => return outcome,
    };
    let messages: Vec<_> = to_enqueue
        .iter()
        .map(|id| ctx.attempt_message(*id, 1))
        .collect();
    if let Err(error) = ctx.broker.publish_all(&messages).await {
        tracing::warn!(%error, event_id = %event.event_id, "could not enqueue deliveries; the event will be redelivered");
        return Outcome::Requeue;
    }
    ctx.metrics.deliveries_created.inc_by(created as u64);
    tracing::debug!(event_id = %event.event_id, event = %event.event, deliveries = created, "fanned out");
    Outcome::Done
}
