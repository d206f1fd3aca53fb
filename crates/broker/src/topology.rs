//! The RabbitMQ topology under one prefix:
//!
//! ```text
//! <p>.events (direct) --event--> <p>.events.fanout          dispatcher fans out
//! <p>.deliveries (direct) --delivery--> <p>.deliveries      dispatcher attempts
//! <p>.retry.<delay>   TTL = delay, dead-letters to <p>.deliveries (one queue per delay)
//! <p>.parking (fanout) --> <p>.parking                      what cannot be processed
//! ```
//!
//! Queue names carry their delay, so a changed schedule declares new queues instead of failing
//! on old ones with another TTL.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use tocsin_domain::retry::{format_duration, RetrySchedule};

/// Routing key of events on the event exchange.
pub const EVENT_ROUTING_KEY: &str = "event";
/// Routing key of attempts on the delivery exchange.
pub const DELIVERY_ROUTING_KEY: &str = "delivery";

/// How many times a work-queue message may be delivered before it is parked.
pub const DELIVERY_LIMIT: i64 = 20;

/// Queue type of the declared queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueType {
    /// Replicated, durable; RabbitMQ 3.10+ (the default).
    Quorum,
    /// Classic durable queues, for brokers without quorum queues.
    Classic,
}

/// The names and arguments of every exchange and queue under one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    retry_delays: Vec<Duration>,
    queue_type: QueueType,
}

impl Topology {
    pub fn new(prefix: &str, schedule: &RetrySchedule, queue_type: QueueType) -> Self {
        let mut retry_delays: Vec<Duration> = schedule
            .delays()
            .iter()
            .copied()
            .filter(|d| !d.is_zero())
            .collect();
        retry_delays.sort();
        retry_delays.dedup();
        Topology {
            prefix: prefix.to_owned(),
            retry_delays,
            queue_type,
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }
    pub fn fanout_queue(&self) -> String {
        format!("{}.events.fanout", self.prefix)
    }
    pub fn deliveries_exchange(&self) -> String {
        format!("{}.deliveries", self.prefix)
    }
    pub fn delivery_queue(&self) -> String {
        format!("{}.deliveries", self.prefix)
    }
    pub fn parking_exchange(&self) -> String {
        format!("{}.parking", self.prefix)
    }
    pub fn parking_queue(&self) -> String {
        format!("{}.parking", self.prefix)
    }
    /// The retry queue holding messages for `delay` (`<p>.retry.1m`, `<p>.retry.2h`, ...).
    pub fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.retry.{}", self.prefix, format_duration(delay))
    }
    /// The distinct non-zero delays of the schedule, shortest first.
    pub fn retry_delays(&self) -> &[Duration] {
        &self.retry_delays
    }

    /// Every queue name, for inspection and clean-up.
    pub fn queues(&self) -> Vec<String> {
        let mut names = vec![
            self.fanout_queue(),
            self.delivery_queue(),
            self.parking_queue(),
        ];
        names.extend(self.retry_delays.iter().map(|d| self.retry_queue(*d)));
        names
    }

    /// Every exchange name.
    pub fn exchanges(&self) -> Vec<String> {
        vec![
            self.events_exchange(),
            self.deliveries_exchange(),
            self.parking_exchange(),
        ]
    }

    fn base_arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if self.queue_type == QueueType::Quorum {
            args.insert("x-queue-type".into(), long_string("quorum"));
        }
        args
    }

    /// Arguments of a work queue: poison messages go to parking after `DELIVERY_LIMIT` tries.
    fn work_queue_arguments(&self) -> FieldTable {
        let mut args = self.base_arguments();
        args.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.parking_exchange()),
        );
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(DELIVERY_LIMIT),
            );
            args.insert(
                "x-dead-letter-strategy".into(),
                long_string("at-least-once"),
            );
            args.insert("x-overflow".into(), long_string("reject-publish"));
        }
        args
    }

    /// Arguments of the retry queue for `delay`: TTL, then back to the delivery exchange.
    pub fn retry_queue_arguments(&self, delay: Duration) -> FieldTable {
        let mut args = self.base_arguments();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.deliveries_exchange()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            long_string(DELIVERY_ROUTING_KEY),
        );
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-dead-letter-strategy".into(),
                long_string("at-least-once"),
            );
            args.insert("x-overflow".into(), long_string("reject-publish"));
        }
        args
    }

    /// Declares everything (idempotent).
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        for (exchange, kind) in [
            (self.events_exchange(), ExchangeKind::Direct),
            (self.deliveries_exchange(), ExchangeKind::Direct),
            (self.parking_exchange(), ExchangeKind::Fanout),
        ] {
            channel
                .exchange_declare(
                    exchange.into(),
                    kind,
                    durable_exchange,
                    FieldTable::default(),
                )
                .await?;
        }
        channel
            .queue_declare(
                self.parking_queue().into(),
                durable_queue,
                self.base_arguments(),
            )
            .await?;
        self.bind(channel, &self.parking_queue(), &self.parking_exchange(), "")
            .await?;
        for (queue, exchange, key) in [
            (
                self.fanout_queue(),
                self.events_exchange(),
                EVENT_ROUTING_KEY,
            ),
            (
                self.delivery_queue(),
                self.deliveries_exchange(),
                DELIVERY_ROUTING_KEY,
            ),
        ] {
            channel
                .queue_declare(
                    queue.clone().into(),
                    durable_queue,
                    self.work_queue_arguments(),
                )
                .await?;
            self.bind(channel, &queue, &exchange, key).await?;
        }
        for delay in &self.retry_delays {
            channel
                .queue_declare(
                    self.retry_queue(*delay).into(),
                    durable_queue,
                    self.retry_queue_arguments(*delay),
                )
                .await?;
        }
        Ok(())
    }

    async fn bind(
        &self,
        channel: &Channel,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> lapin::Result<()> {
        channel
            .queue_bind(
                ShortString::from(queue),
                ShortString::from(exchange),
                ShortString::from(key),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
    }
}

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_the_delay() {
        let topology = Topology::new("tocsin", &RetrySchedule::default(), QueueType::Quorum);
        assert_eq!(topology.fanout_queue(), "tocsin.events.fanout");
        assert_eq!(topology.delivery_queue(), "tocsin.deliveries");
        let retry: Vec<String> = topology
            .retry_delays()
            .iter()
            .map(|d| topology.retry_queue(*d))
            .collect();
        assert_eq!(
            retry,
            [
                "tocsin.retry.1m",
                "tocsin.retry.5m",
                "tocsin.retry.30m",
                "tocsin.retry.2h"
            ]
        );
        let short: RetrySchedule = "0s,200ms,200ms,1s".parse().unwrap();
        let topology = Topology::new("t1", &short, QueueType::Quorum);
        assert_eq!(topology.queues().len(), 3 + 2);
        assert!(topology.queues().iter().all(|q| q.starts_with("t1.")));
    }
}
