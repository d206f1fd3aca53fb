//! What the dispatcher's handlers share: connections, limits, batched writers, metrics, and
//! how a handler settles its message. Built by `startup`, used by every handler.

use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::ShortString;
use tocsin_broker::messages::{attempt_headers, DeliveryMessage, PARKED_REASON_HEADER};
use tocsin_broker::topology::DELIVERY_ROUTING_KEY;
use tocsin_broker::{headers_from_json, string_header, Broker, Outgoing};
use tocsin_domain::delivery::Trigger;
use tocsin_domain::RetrySchedule;
use tocsin_storage::deliveries::Due;
use tocsin_storage::{DbError, DbPool};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batched::Batched;
use crate::metrics::DispatcherMetrics;
use crate::slots::WebhookSlots;
use tocsin_web::ssrf::TargetPolicy;

/// The margin of every lease beyond the request's own time, for recording the outcome: an
/// automatic attempt's lease is its webhook's timeout plus this (twice the timeout plus this
/// for a first attempt the fan-out claims), and a manual attempt is taken for interrupted this
/// long after the longest timeout. An attempt whose dispatcher has not recorded it by then is
/// recorded as interrupted by the sweeper.
pub(crate) const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// How a handler settles its message with the broker: ack, park or requeue.
#[derive(Debug)]
pub(crate) enum Settlement {
    /// Processed: ack.
    Done,
    /// Cannot be processed: move to the parking queue with this reason, then ack.
    Park(String),
    /// Not processed now (stopping, or the database is unreachable): return to the queue.
    Requeue,
}

/// What every handler shares.
pub(crate) struct Context {
    pub pool: DbPool,
    pub broker: Broker,
    pub schedule: RetrySchedule,
    pub client: reqwest::Client,
    pub policy: Arc<TargetPolicy>,
    pub metrics: DispatcherMetrics,
    pub response_limit: usize,
    pub cancel: CancellationToken,
    /// Requests in flight per webhook.
    pub slots: Arc<WebhookSlots>,
    /// Requests in flight in all (`TOCSIN_DISPATCHER_CONCURRENCY`).
    pub requests: Arc<Semaphore>,
    /// The two consumers and the attempts this dispatcher started itself (first attempts
    /// after a fan-out, waiting deliveries taken), drained on stop: the last health write
    /// waits for them all, retries and manual attempts (made in the consumer's drain) included.
    pub tasks: TaskTracker,
    /// The repository operations whose concurrent calls share statements.
    pub batched: Batched,
    /// Attempt outcomes by webhook, written as their health once a second.
    pub health: Arc<crate::health::HealthTally>,
}

impl Context {
    /// A message asking for the next automatic attempt of a delivery, through the retry queue
    /// of `delay` (or the delivery queue at once for a zero delay). When traces are exported,
    /// it carries the current span's trace context: the attempt it asks for joins the trace.
    pub fn attempt_message(&self, due: &Due, delay: Duration) -> Outgoing {
        let topology = self.broker.topology();
        let (exchange, routing_key) = if delay.is_zero() {
            (
                topology.deliveries_exchange(),
                DELIVERY_ROUTING_KEY.to_owned(),
            )
        } else {
            (String::new(), topology.retry_queue(delay))
        };
        let mut headers = headers_from_json(&attempt_headers(
            Trigger::Automatic,
            Some(due.auto_attempts),
        ));
        tocsin_web::telemetry::inject_current(|name, value| {
            headers.insert(name.into(), string_header(&value));
        });
        Outgoing {
            exchange,
            routing_key,
            body: DeliveryMessage {
                delivery_id: due.delivery_id,
                webhook_id: Some(due.webhook_id),
            }
            .to_bytes(),
            headers,
        }
    }

    /// Runs a database operation until it succeeds, waiting out transient failures (PostgreSQL
    /// restarting, a failover) with a backoff of 100 ms doubling to 5 s. A permanent failure is
    /// the message's own: `Park`; a stop while waiting: `Requeue`.
    pub async fn retry_db<T, F, Fut>(&self, mut operation: F) -> Result<T, Settlement>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DbError>>,
    {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.judge(operation().await, &mut backoff).await {
                Ok(value) => return Ok(value),
                Err(Some(settlement)) => return Err(settlement),
                Err(None) => {}
            }
        }
    }

    /// Judges one try of [`Context::retry_db`]: a value, a permanent failure (`Park`), a stop
    /// while waiting (`Requeue`), or `None` to try again after the backoff.
    async fn judge<T>(
        &self,
        result: Result<T, DbError>,
        backoff: &mut Duration,
    ) -> Result<T, Option<Settlement>> {
        match result {
            Ok(value) => Ok(value),
            Err(DbError::NotFound) => {
                Err(Some(Settlement::Park("not found in the database".into())))
            }
            Err(error) if !error.is_transient() => {
                self.metrics
                    .database_errors
                    .with_label_values(&["permanent"])
                    .inc();
                Err(Some(Settlement::Park(error.to_string())))
            }
            Err(error) => {
                self.metrics
                    .database_errors
                    .with_label_values(&["transient"])
                    .inc();
                tracing::warn!(%error, "database unavailable; waiting");
                tokio::select! {
                    _ = self.cancel.cancelled() => return Err(Some(Settlement::Requeue)),
                    _ = tokio::time::sleep(*backoff) => {}
                }
                *backoff = (*backoff * 2).min(Duration::from_secs(5));
                Err(None)
            }
        }
    }

    /// Acks, parks or requeues a message.
    pub async fn settle(&self, message: Delivery, settlement: Settlement, queue: &'static str) {
        let settled = match settlement {
            Settlement::Done => message.ack(BasicAckOptions::default()).await.map(|_| ()),
            Settlement::Park(reason) => {
                self.park(&message, &reason, queue).await;
                Ok(())
            }
            Settlement::Requeue => requeue(&message).await,
        };
        if let Err(error) = settled {
            // The channel is gone: the broker redelivers the message on its own.
            tracing::debug!(%error, "could not settle a message; the broker will redeliver it");
        }
    }

    /// Publishes a copy of `message` to the parking exchange with `reason`, confirmed, then
    /// acks the original; if the publish fails, returns the original to its queue.
    async fn park(&self, message: &Delivery, reason: &str, queue: &'static str) {
        tracing::error!(queue, %reason, "parking a message that cannot be processed");
        let mut headers = message.properties.headers().clone().unwrap_or_default();
        headers.insert(
            ShortString::from(PARKED_REASON_HEADER),
            string_header(reason),
        );
        let published = self
            .broker
            .publish(Outgoing {
                exchange: self.broker.topology().parking_exchange(),
                routing_key: String::new(),
                body: message.data.clone(),
                headers,
            })
            .await;
        let settled = match published {
            Ok(()) => {
                self.metrics.parked.with_label_values(&[queue]).inc();
                message.ack(BasicAckOptions::default()).await.map(|_| ())
            }
            Err(error) => {
                tracing::warn!(%error, "could not park a message; returning it to its queue");
                requeue(message).await
            }
        };
        if let Err(error) = settled {
            tracing::debug!(%error, "could not settle a message; the broker will redeliver it");
        }
    }
}

/// Returns a message to its queue.
async fn requeue(message: &Delivery) -> lapin::Result<()> {
    message
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .map(|_| ())
}
