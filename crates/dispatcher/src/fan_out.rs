//! Fan-out: an incident event from the events exchange becomes one delivery per enabled webhook
//! subscribed to its kind, created idempotently (a redelivered event creates none twice), each
//! with its first attempt claimed in the same statement (or `waiting`, when its webhook is
//! busy here), and this dispatcher makes those first attempts at once, itself: no message per
//! delivery. The event message is acked once every first attempt has its slots; a dispatcher
//! that dies before making them leaves claimed attempts that the sweeper records as interrupted
//! once their lease ends, and they are retried on the schedule.

use std::sync::Arc;
use std::time::Instant;

use lapin::message::Delivery;
use tocsin_broker::header_str;
use tocsin_broker::messages::{since_published, EventMessage};
use tocsin_domain::delivery::WaitReason;
use tocsin_storage::attempts::Job;
use tocsin_storage::fan_out::{FanOut, FannedOut};
use tocsin_web::telemetry::RemoteParent;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::context::{Context, Settlement};
use crate::metrics::Stage;

pub(crate) async fn handle_event(ctx: Arc<Context>, message: Delivery) {
    let settlement = match EventMessage::from_bytes(&message.data) {
        Ok(event) => {
            let span = tracing::debug_span!(
                "fan_out",
                event_id = %event.event_id,
                event = %event.event
            );
            // The trace of the request that caused the event, when traces are exported; set
            // before the span is first entered.
            RemoteParent::from_headers(|name| header_str(&message.properties, name))
                .adopt_by(&span);
            if let Some(took) = since_published(&message.properties) {
                ctx.metrics.stage(Stage::Broker, took);
            }
            fan_out(&ctx, &event, message.redelivered)
                .instrument(span)
                .await
        }
        Err(error) => Settlement::Park(format!("unreadable event message: {error}")),
    };
    ctx.settle(message, settlement, "fanout").await;
}

/// Fans an event out and makes the first attempts, in the `fan_out` span: their spans are its
/// children.
async fn fan_out(ctx: &Arc<Context>, event: &EventMessage, redelivered: bool) -> Settlement {
    let request = FanOut {
        event_id: event.event_id,
        kind: event.event,
        incident_id: event.incident_id,
        test_webhook_id: event.test_webhook_id,
        redelivered,
    };
    // Deliveries beyond the room of a webhook that is not answering here start `waiting`.
    let room: Arc<[(uuid::Uuid, i64)]> = ctx.slots.limited_room().into();
    let fanning_out = Instant::now();
    let FannedOut {
        claimed,
        pending,
        waiting,
        disabled,
        ordering,
    } = match ctx
        .retry_db(|| ctx.batched.fan_out(request.clone(), room.clone()))
        .await
    {
        Ok(fanned) => fanned,
        Err(settlement) => return settlement,
    };
    ctx.metrics.stage(Stage::FanOut, fanning_out.elapsed());
    let created = claimed.len() + pending.len() + waiting + disabled + ordering;
    ctx.metrics.deliveries_created.inc_by(created as u64);
    for (reason, count) in [
        (WaitReason::WebhookBusy, waiting),
        (WaitReason::WebhookDisabled, disabled),
        (WaitReason::Ordering, ordering),
    ] {
        ctx.metrics.waited(reason).inc_by(count as u64);
    }
    tracing::debug!(
        deliveries = created,
        waiting,
        disabled,
        ordering,
        "fanned out"
    );
    let mut started: Vec<_> = claimed
        .into_iter()
        .map(|job| spawn_claimed(ctx, job))
        .collect();
    started.extend(
        pending
            .into_iter()
            .map(|due| crate::attempt::spawn(ctx, due)),
    );
    // Acked once every attempt has its slots (its claim is committed already), so that the
    // events in flight bound the attempts waiting in this dispatcher.
    tokio::select! {
        _ = futures::future::join_all(started) => Settlement::Done,
        // Redelivered later: its deliveries not yet attempted are attempted then, and those
        // claimed but not made are recorded as interrupted once their lease ends.
        _ = ctx.cancel.cancelled() => Settlement::Requeue,
    }
}

/// Makes a first attempt claimed by the fan-out, in this dispatcher; the receiver resolves once
/// it has its slots.
fn spawn_claimed(ctx: &Arc<Context>, job: Job) -> oneshot::Receiver<()> {
    let (started, receiver) = oneshot::channel();
    let ctx = ctx.clone();
    ctx.tasks.clone().spawn(
        async move {
            crate::attempt::make_claimed(&ctx, job, Some(started)).await;
        }
        .in_current_span(),
    );
    receiver
}
