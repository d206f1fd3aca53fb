//! The parking queue (`<prefix>.parking`): messages a dispatcher could not process, or that
//! went past a work queue's delivery limit. Nothing consumes it; an operator looks at it and
//! replays what can be processed again (`tocsin-admin parked list|replay`).

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::messages::{DeliveryMessage, EventMessage, PARKED_REASON_HEADER};
use crate::topology::{DELIVERY_ROUTING_KEY, EVENT_ROUTING_KEY};
use crate::{header_str, Broker, BrokerError, Outgoing};

/// What a parked message holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParkedBody {
    /// An event to fan out again.
    Event(EventMessage),
    /// A delivery attempt to make again.
    Delivery(DeliveryMessage),
    /// A body no Tocsin consumer reads; never replayed.
    Unreadable,
}

/// One parked message, as looked at.
#[derive(Debug, Clone)]
pub struct Parked {
    pub body: ParkedBody,
    /// Why it was parked: the dispatcher's `tocsin-parked-reason`, or the broker's dead-letter
    /// reason (`delivery_limit`, `rejected`, ...).
    pub reason: Option<String>,
    /// The queue it was dead-lettered from, when the broker parked it.
    pub from_queue: Option<String>,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    pub events: usize,
    pub deliveries: usize,
    /// Unreadable messages, left in the parking queue.
    pub left: usize,
}

impl Parked {
    fn read(delivery: &Delivery) -> Parked {
        let body = if let Ok(event) = EventMessage::from_bytes(&delivery.data) {
            ParkedBody::Event(event)
        } else if let Ok(message) = DeliveryMessage::from_bytes(&delivery.data) {
            ParkedBody::Delivery(message)
        } else {
            ParkedBody::Unreadable
        };
        let death = first_death(&delivery.properties);
        let death_field = |name: &str| match death.as_ref().and_then(|d| d.inner().get(name)) {
            Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into()),
            Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
            _ => None,
        };
        Parked {
            body,
            reason: header_str(&delivery.properties, PARKED_REASON_HEADER)
                .or_else(|| death_field("reason")),
            from_queue: death_field("queue"),
        }
    }
}

/// The most recent `x-death` entry the broker added when it dead-lettered the message.
fn first_death(properties: &lapin::BasicProperties) -> Option<FieldTable> {
    match properties.headers().as_ref()?.inner().get("x-death")? {
        AMQPValue::FieldArray(entries) => match entries.as_slice().first()? {
            AMQPValue::FieldTable(table) => Some(table.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The headers a replayed message keeps: Tocsin's own (attempt number, trigger, webhook), not
/// the parking reason nor the broker's `x-` bookkeeping.
fn replay_headers(properties: &lapin::BasicProperties) -> FieldTable {
    let mut kept = FieldTable::default();
    if let Some(headers) = properties.headers().as_ref() {
        for (name, value) in headers.inner() {
            if name.as_str().starts_with("tocsin-") && name.as_str() != PARKED_REASON_HEADER {
                kept.insert(name.clone(), value.clone());
            }
        }
    }
    kept
}

impl Broker {
    /// Takes up to `limit` messages from the parking queue on a channel of its own, unacked.
    async fn take_parked(
        &self,
        limit: usize,
    ) -> Result<(lapin::Channel, Vec<Delivery>), BrokerError> {
        let channel = self.channel().await?;
        let queue = self.topology().parking_queue();
        let mut taken = Vec::new();
        while taken.len() < limit {
            match channel
                .basic_get(
                    ShortString::from(queue.as_str()),
                    BasicGetOptions { no_ack: false },
                )
                .await?
            {
                Some(message) => taken.push(message.delivery),
                None => break,
            }
        }
        Ok((channel, taken))
    }

    /// Up to `limit` parked messages, oldest first, left where they are.
    pub async fn parked(&self, limit: usize) -> Result<Vec<Parked>, BrokerError> {
        let (channel, taken) = self.take_parked(limit).await?;
        let parked = taken.iter().map(Parked::read).collect();
        // Closing the channel returns every message it took to the queue.
        channel
            .close(200, ShortString::from("parked messages read"))
            .await?;
        Ok(parked)
    }

    /// Moves up to `limit` parked event and delivery messages back to their work queues (events
    /// to the fan-out, attempts to the delivery queue, with their attempt number and trigger),
    /// removing each from parking only once the broker confirmed its copy. Unreadable messages
    /// stay parked. A replayed event is fanned out again (fan-out is idempotent); a replayed
    /// automatic attempt of a finished delivery, or one already made, is dropped by the
    /// dispatcher.
    pub async fn replay_parked(&self, limit: usize) -> Result<Replayed, BrokerError> {
        let (channel, taken) = self.take_parked(limit).await?;
        let topology = self.topology();
        let mut replayed = Replayed::default();
        let mut outgoing = Vec::new();
        let mut done = Vec::new();
        for delivery in &taken {
            let (exchange, routing_key) = match Parked::read(delivery).body {
                ParkedBody::Event(_) => {
                    replayed.events += 1;
                    (topology.events_exchange(), EVENT_ROUTING_KEY)
                }
                ParkedBody::Delivery(_) => {
                    replayed.deliveries += 1;
                    (topology.deliveries_exchange(), DELIVERY_ROUTING_KEY)
                }
                ParkedBody::Unreadable => {
                    replayed.left += 1;
                    continue;
                }
            };
            outgoing.push(Outgoing {
                exchange,
                routing_key: routing_key.to_owned(),
                body: delivery.data.clone(),
                headers: replay_headers(&delivery.properties),
            });
            done.push(delivery);
        }
        if let Err(error) = self.publish_all(&outgoing).await {
            // Nothing acked: closing the channel leaves every message parked.
            let _ = channel.close(200, ShortString::from("replay failed")).await;
            return Err(error);
        }
        for delivery in done {
            delivery.ack(BasicAckOptions::default()).await?;
        }
        channel
            .close(200, ShortString::from("parked messages replayed"))
            .await?;
        Ok(replayed)
    }
}
