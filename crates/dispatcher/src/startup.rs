//! Building the dispatcher: its shared context, the two consumers, the sweeper, the release of
//! held deliveries and the health and metrics server.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use anyhow::Context as _;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use prometheus::Registry;
use tocsin_domain::amqp::messages::{
    DeliveryMessage, Trigger, ATTEMPT_HEADER, PARKED_REASON_HEADER, TRIGGER_HEADER,
};
use tocsin_domain::amqp::topology::{DEFER_DELAY, DELIVERY_ROUTING_KEY};
use tocsin_domain::amqp::{
    run_consumer, string_header, Broker, BrokerError, ConsumerOptions, Outgoing,
};
use tocsin_domain::db::deliveries::{self, AttemptRecord, FanOut, FannedOut, Waiting};
use tocsin_domain::db::{self, webhooks, DbBatcher, DbError, DbPool};
use tocsin_domain::RetrySchedule;
use tocsin_web::{Background, HttpMetrics, Readiness, Service};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::metrics::DispatcherMetrics;
use crate::slots::WebhookSlots;
use crate::ssrf::{GuardedResolver, TargetPolicy};

/// The running dispatcher.
pub type App = Service;

/// Evaluates `$attempt` (a `Result<T, DbError>` expression) until it succeeds, waiting out
/// transient database failures; evaluates to `Result<T, Outcome>`.
macro_rules! retry_db {
    ($ctx:expr, $attempt:expr) => {{
        let mut backoff = std::time::Duration::from_millis(100);
        loop {
            let result = $attempt;
            match $ctx.judge(result, &mut backoff).await {
                Ok(value) => break Ok(value),
                Err(Some(outcome)) => break Err(outcome),
                Err(None) => continue,
            }
        }
    }};
}
pub(crate) use retry_db;

/// What a handler decided about its message.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Processed: ack.
    Done,
    /// Not attempted now (its webhook is at its in-flight limit): wait in the deferral queue,
    /// then ack.
    Defer,
    /// Cannot be processed: move to the parking queue with this reason, then ack.
    Park(String),
    /// Not processed now (stopping, or the broker refused a follow-up): return to the queue.
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
    pub slots: WebhookSlots,
    /// Fan-outs of events received concurrently, written in shared transactions.
    pub fanouts: DbBatcher<FanOut, FannedOut>,
    /// Deliveries received concurrently, loaded in shared queries.
    pub jobs: DbBatcher<Uuid, Option<deliveries::DeliveryJob>>,
    /// Attempts finished concurrently, logged in shared transactions.
    pub attempt_log: DbBatcher<AttemptRecord, Option<deliveries::Delivery>>,
    /// Deliveries stopped concurrently (their webhook deleted or disabled), marked failed in
    /// shared statements.
    pub stopped: DbBatcher<Uuid, ()>,
}

/// How often a dispatcher renews a slow webhook's mark in PostgreSQL while it finds it slow.
const SLOW_MARK_EVERY: Duration = Duration::from_secs(1);

/// Largest batch of fan-outs or attempt rows written in one transaction.
const MAX_BATCH: usize = 64;
/// Transactions of each kind in flight at once (each holds a pooled connection meanwhile).
const BATCH_WORKERS: usize = 2;

impl Context {
    /// A message asking for automatic attempt `attempt` of a delivery, now.
    pub fn attempt_message(&self, delivery_id: Uuid, attempt: i32) -> Outgoing {
        Outgoing {
            exchange: self.broker.topology().deliveries_exchange(),
            routing_key: DELIVERY_ROUTING_KEY.to_owned(),
            body: DeliveryMessage { delivery_id }.to_bytes(),
            headers: attempt_headers(attempt),
        }
    }

    /// Tells the writers that `webhook` is slow (in the background, at most once a second):
    /// for [`DEFER_DELAY`] its new deliveries are held in PostgreSQL (see [`crate::held`]). A
    /// failure only means they come through the delivery queue meanwhile.
    pub fn note_slow(&self, webhook: Uuid) {
        if !self.slots.mark_due(webhook, SLOW_MARK_EVERY) {
            return;
        }
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let marked = match pool.get().await {
                Ok(mut conn) => webhooks::mark_slow(&mut conn, webhook, DEFER_DELAY)
                    .await
                    .map_err(|e| e.to_string()),
                Err(error) => Err(error.to_string()),
            };
            if let Err(error) = marked {
                tracing::debug!(%webhook, %error, "could not mark a slow webhook");
            }
        });
    }

    /// Publishes the first attempts of `waiting` deliveries, confirmed: to the deferral queue
    /// for a webhook this dispatcher finds slow (where it would only be deferred), else to the
    /// delivery queue.
    pub async fn enqueue_first_attempts(&self, waiting: &[Waiting]) -> Result<(), BrokerError> {
        let mut deferred = 0;
        let messages: Vec<_> = waiting
            .iter()
            .map(|waiting| {
                if self.slots.is_slow(waiting.webhook_id) {
                    deferred += 1;
                    self.deferred_message(waiting.delivery_id, 1)
                } else {
                    self.attempt_message(waiting.delivery_id, 1)
                }
            })
            .collect();
        self.broker.publish_all(&messages).await?;
        // Counted once confirmed, as the consumers' deferrals are.
        self.metrics.deferred.inc_by(deferred);
        Ok(())
    }

    /// A message asking for automatic attempt `attempt` once it has waited in the deferral
    /// queue.
    pub fn deferred_message(&self, delivery_id: Uuid, attempt: i32) -> Outgoing {
        Outgoing {
            exchange: String::new(),
            routing_key: self.broker.topology().deferred_queue(),
            ..self.attempt_message(delivery_id, attempt)
        }
    }

    /// A message asking for automatic attempt `attempt` after `delay`, through the retry queue
    /// of that delay (or at once for a zero delay).
    pub fn retry_message(&self, delivery_id: Uuid, attempt: i32, delay: Duration) -> Outgoing {
        if delay.is_zero() {
            return self.attempt_message(delivery_id, attempt);
        }
        Outgoing {
            exchange: String::new(),
            routing_key: self.broker.topology().retry_queue(delay),
            body: DeliveryMessage { delivery_id }.to_bytes(),
            headers: attempt_headers(attempt),
        }
    }

    /// Judges the result of a database operation run by [`retry_db!`]: a value, a permanent
    /// failure (`Park`), a stop while waiting (`Requeue`), or `None` to try again after a
    /// backoff (PostgreSQL restarting).
    pub async fn judge<T>(
        &self,
        result: Result<T, DbError>,
        backoff: &mut Duration,
    ) -> Result<T, Option<Outcome>> {
        match result {
            Ok(value) => Ok(value),
            Err(DbError::NotFound) => Err(Some(Outcome::Park("not found in the database".into()))),
            Err(error) if !error.is_transient() => Err(Some(Outcome::Park(error.to_string()))),
            Err(error) => {
                tracing::warn!(%error, "database unavailable; waiting");
                tokio::select! {
                    _ = self.cancel.cancelled() => return Err(Some(Outcome::Requeue)),
                    _ = tokio::time::sleep(*backoff) => {}
                }
                *backoff = (*backoff * 2).min(Duration::from_secs(5));
                Err(None)
            }
        }
    }

    /// Acks, defers, parks or requeues a message.
    pub async fn finish(&self, message: Delivery, outcome: Outcome, queue: &'static str) {
        let topology = self.broker.topology();
        let settled = match outcome {
            Outcome::Done => message.ack(BasicAckOptions::default()).await.map(|_| ()),
            Outcome::Defer => {
                let headers = message.properties.headers().clone().unwrap_or_default();
                let deferral = (String::new(), topology.deferred_queue(), headers);
                let moved = self.move_then_ack(&message, deferral, "defer").await;
                if moved {
                    self.metrics.deferred.inc();
                }
                Ok(())
            }
            Outcome::Park(reason) => {
                tracing::error!(queue, %reason, "parking a message that cannot be processed");
                let mut headers = message.properties.headers().clone().unwrap_or_default();
                headers.insert(
                    ShortString::from(PARKED_REASON_HEADER),
                    string_header(&reason),
                );
                let parking = (topology.parking_exchange(), String::new(), headers);
                if self.move_then_ack(&message, parking, "park").await {
                    self.metrics.parked.with_label_values(&[queue]).inc();
                }
                Ok(())
            }
            Outcome::Requeue => requeue(&message).await,
        };
        if let Err(error) = settled {
            // The channel is gone: the broker redelivers the message on its own.
            tracing::debug!(%error, "could not settle a message; the broker will redeliver it");
        }
    }

    /// Publishes a copy of `message` to `(exchange, routing key, headers)`, confirmed, then
    /// acks the original; if the publish fails, returns the original to its queue. Returns
    /// whether the message moved.
    async fn move_then_ack(
        &self,
        message: &Delivery,
        (exchange, routing_key, headers): (String, String, FieldTable),
        what: &str,
    ) -> bool {
        let published = self
            .broker
            .publish(Outgoing {
                exchange,
                routing_key,
                body: message.data.clone(),
                headers,
            })
            .await;
        let moved = published.is_ok();
        let settled = match published {
            Ok(()) => message.ack(BasicAckOptions::default()).await.map(|_| ()),
            Err(error) => {
                tracing::warn!(%error, "could not {what} a message; returning it to its queue");
                requeue(message).await
            }
        };
        if let Err(error) = settled {
            tracing::debug!(%error, "could not settle a message; the broker will redeliver it");
        }
        moved
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

fn attempt_headers(attempt: i32) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(
        ATTEMPT_HEADER.into(),
        AMQPValue::LongLongInt(i64::from(attempt)),
    );
    headers.insert(
        TRIGGER_HEADER.into(),
        string_header(Trigger::Automatic.as_str()),
    );
    headers
}

/// The HTTP client of every attempt: no redirects, no proxy, the SSRF-guarded resolver,
/// pooled keep-alive connections per target.
fn http_client(policy: Arc<TargetPolicy>) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("Tocsin/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(policy)))
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

/// Migrates the database, then builds the dispatcher.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let common = &config.common;
    common.warn_if_schedule_shortened();
    db::migrate(&common.database_url)
        .await
        .context("DATABASE_URL: migrating the database")?;
    let pool = common.pool()?;
    let broker = common.broker("dispatcher");
    let registry = Registry::new();
    let http_metrics = HttpMetrics::new(&registry)?;
    let policy = Arc::new(config.allowed_targets.clone());
    let mut background = Background::new();
    let context = Arc::new(Context {
        pool: pool.clone(),
        broker: broker.clone(),
        schedule: common.retry_delays.clone(),
        client: http_client(policy.clone())?,
        policy,
        metrics: DispatcherMetrics::new(&registry)?,
        response_limit: config.response_body_limit,
        cancel: background.token(),
        slots: WebhookSlots::new(usize::from(config.webhook_concurrency)),
        fanouts: db::batcher(&pool, MAX_BATCH, BATCH_WORKERS, |conn, events| {
            Box::pin(deliveries::fan_out(conn, events))
        }),
        jobs: db::batcher(&pool, MAX_BATCH, BATCH_WORKERS, |conn, ids| {
            Box::pin(deliveries::load_jobs(conn, ids))
        }),
        attempt_log: db::batcher(&pool, MAX_BATCH, BATCH_WORKERS, |conn, records| {
            Box::pin(deliveries::record_attempts(conn, records))
        }),
        stopped: db::batcher(&pool, MAX_BATCH, 1, |conn, ids| {
            Box::pin(deliveries::mark_failed_all(conn, ids))
        }),
    });

    let readiness = Readiness {
        pool,
        broker: broker.clone(),
    };
    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_DISPATCHER_ADDR")?;
    let port = listener.local_addr()?.port();
    // Health and metrics only: one worker is plenty.
    let server = tocsin_web::service::serve(
        listener,
        |_: &mut web::ServiceConfig| {},
        http_metrics,
        readiness,
        Duration::from_secs(2),
        Some(1),
        common.client_timeout,
    )?;

    let instance = format!("{}-{}", std::process::id(), Uuid::now_v7().simple());
    let topology = broker.topology().clone();
    {
        let ctx = context.clone();
        background.spawn(
            "fanout-consumer",
            run_consumer(
                broker.clone(),
                ConsumerOptions {
                    queue: topology.fanout_queue(),
                    prefetch: config.fanout_prefetch,
                    tag: format!("tocsin-dispatcher-fanout-{instance}"),
                    drain_timeout: common.shutdown_timeout,
                },
                background.token(),
                move |message| crate::fanout::handle_event(ctx.clone(), message),
            ),
        );
    }
    {
        let ctx = context.clone();
        background.spawn(
            "delivery-consumer",
            run_consumer(
                broker.clone(),
                ConsumerOptions {
                    queue: topology.delivery_queue(),
                    prefetch: config.concurrency,
                    tag: format!("tocsin-dispatcher-deliveries-{instance}"),
                    drain_timeout: common.shutdown_timeout,
                },
                background.token(),
                move |message| crate::deliver::handle_delivery(ctx.clone(), message),
            ),
        );
    }
    background.spawn(
        "gauges",
        crate::metrics::refresh_gauges(
            context.clone(),
            Duration::from_secs(15),
            background.token(),
        ),
    );
    background.spawn(
        "prune",
        crate::sweeper::prune(
            context.clone(),
            config.prune_interval,
            config.retention,
            background.token(),
        ),
    );
    background.spawn(
        "held",
        crate::held::run(context.clone(), background.token()),
    );
    background.spawn(
        "sweeper",
        crate::sweeper::run(
            context,
            config.sweep_interval,
            config.sweep_grace,
            background.token(),
        ),
    );
    Ok(Service::new(
        "dispatcher",
        server,
        port,
        background,
        common.shutdown_timeout,
    ))
}
