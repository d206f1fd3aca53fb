//! The outbox relay: publishes committed outbox rows to RabbitMQ with publisher
//! confirms and marks them published. Ingest hands it its rows at commit, held from every
//! relay's claim (the hand-over, [`RelayWaker::hand_over`]: ingest's transactions do not
//! `NOTIFY`, as PostgreSQL serialises notifying commits, and the relay publishes them without
//! reading them back). Other rows it claims, woken as soon as a transaction commits: in process
//! through [`OutboxRelay::waker`], across processes by PostgreSQL `NOTIFY` (admin's writes),
//! and by a poll as a fallback. Several relays may run at once: rows are claimed with `FOR
//! UPDATE SKIP LOCKED`.
//! While RabbitMQ is down the rows wait, and are published once it is back.
//!
//! The relay works on a connection of its own with `synchronous_commit = off`: its only write
//! is the mark of rows already published and confirmed, and a mark lost in a PostgreSQL crash
//! means those rows are published again, which the fan-out absorbs (it creates nothing twice).
//! Not waiting for the WAL flush keeps the relay's pass short.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::StreamExt;
use prometheus::{HistogramVec, IntCounter, IntGauge, Registry};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub use crate::outbox::RelayWaker;
use crate::outbox::{self, OutboxRow, Topic, NOTIFY_CHANNEL};
use crate::{DbError, DbPool};
use tocsin_broker::messages::published_at_header;
use tocsin_broker::topology::{DELIVERY_ROUTING_KEY, EVENT_ROUTING_KEY};
use tocsin_broker::{headers_from_json, Broker, Outgoing};

/// Rows published per transaction.
const BATCH: i64 = 500;
/// Passes under way at once, each on its own connection: while one waits for RabbitMQ's
/// confirms, the next claims what was committed meanwhile (`FOR UPDATE SKIP LOCKED` keeps
/// their rows apart). Under load a pass waits tens of milliseconds for its confirms, and with
/// one pass at a time every row committed meanwhile waited as long before it was even claimed
/// (docs/performance.md, "Latency budget").
const PASSES: usize = 2;
/// Longest the relay waits to open its connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between attempts while PostgreSQL or RabbitMQ is failing.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Relay counters, exported on `/metrics`.
#[derive(Clone)]
struct RelayMetrics {
    published: IntCounter,
    failures: IntCounter,
    backlog: IntGauge,
    stages: HistogramVec,
}

impl RelayMetrics {
    fn new(registry: &Registry) -> anyhow::Result<Self> {
        let published = IntCounter::new(
            "tocsin_outbox_published_total",
            "Outbox rows published to RabbitMQ and confirmed.",
        )?;
        let failures = IntCounter::new(
            "tocsin_outbox_publish_failures_total",
            "Relay passes that failed (PostgreSQL or RabbitMQ unavailable); rows are retried.",
        )?;
        let backlog = IntGauge::new(
            "tocsin_outbox_backlog",
            "Outbox rows not yet published, as last counted by the relay.",
        )?;
        registry.register(Box::new(published.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(backlog.clone()))?;
        let stages = crate::stages::histogram(
            registry,
            prometheus::HistogramOpts::new(
                "tocsin_outbox_stage_seconds",
                "Time of the relay's stages of an alert's way, by stage: wake (from the commit that woke the relay to its claim of the rows), publish (publishing a pass's rows with confirms).",
            ),
        )?;
        Ok(RelayMetrics {
            published,
            failures,
            backlog,
            stages,
        })
    }
}

/// Publishes the outbox.
#[derive(Clone)]
pub struct OutboxRelay {
    pool: DbPool,
    broker: Broker,
    database_url: String,
    wake: Arc<RelayWaker>,
    poll_interval: Duration,
    metrics: RelayMetrics,
    /// The relay's own connection (asynchronous commit), opened on first use and again after
    /// a failure.
    conn: Arc<Mutex<Option<AsyncPgConnection>>>,
}

impl OutboxRelay {
    pub fn new(
        pool: DbPool,
        broker: Broker,
        database_url: &str,
        poll_interval: Duration,
        registry: &Registry,
    ) -> anyhow::Result<Self> {
        Ok(OutboxRelay {
            pool,
            broker,
            database_url: database_url.to_owned(),
            wake: Arc::new(RelayWaker::default()),
            poll_interval,
            metrics: RelayMetrics::new(registry)?,
            conn: Arc::new(Mutex::new(None)),
        })
    }

    /// Wake this after committing outbox rows to publish them at once.
    pub fn waker(&self) -> Arc<RelayWaker> {
        self.wake.clone()
    }

    /// Runs until `cancel` fires: listens for commits and publishes, with [`PASSES`] passes
    /// at most under way at once.
    pub async fn run(self, cancel: CancellationToken) {
        let listener = tokio::spawn(listen(
            self.database_url.clone(),
            self.wake.clone(),
            cancel.clone(),
        ));
        let passes = (0..PASSES).map(|_| {
            let relay = OutboxRelay {
                conn: Arc::new(Mutex::new(None)),
                ..self.clone()
            };
            relay.passes(cancel.clone())
        });
        futures::future::join_all(passes).await;
        let _ = listener.await;
    }

    /// One loop of passes: each wake-up publishes the rows handed over and, when woken to
    /// claim, at each poll and after a failure, claims and publishes everything else
    /// committed; then it waits for the next wake-up. After a failure it waits out its backoff
    /// whatever wakes it.
    async fn passes(self, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        // `None`: the first pass claims whatever was committed before the start.
        let mut last_claim: Option<Instant> = None;
        let mut failed = false;
        loop {
            let claim = failed
                || self.wake.claim_wanted()
                || last_claim.is_none_or(|at| at.elapsed() >= self.poll_interval);
            let pass = async {
                let handed = self.publish_handed().await?;
                let claimed = if claim { self.drain().await? } else { 0 };
                anyhow::Ok(handed + claimed)
            };
            let pause = match pass.await {
                Ok(_) => {
                    if claim {
                        last_claim = Some(Instant::now());
                    }
                    failed = false;
                    backoff = Duration::from_millis(100);
                    self.poll_interval
                }
                Err(error) => {
                    self.metrics.failures.inc();
                    self.count_backlog().await;
                    tracing::warn!(error = %format!("{error:#}"), "outbox relay pass failed; will retry");
                    failed = true;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    backoff
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.wake.notify.notified(), if !failed => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
        // One last pass so that what was committed before the stop goes out now.
        loop {
            match self.publish_handed().await {
                Ok(published) if published == BATCH as usize => continue,
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), "final publish of the rows handed over failed; they are claimed once their hold is over");
                    break;
                }
            }
        }
        if let Err(error) = self.drain().await {
            tracing::warn!(error = %format!("{error:#}"), "final outbox pass failed; rows stay for the next start");
        }
    }

    /// Updates the backlog gauge (while publishing fails, so that it shows the growth).
    async fn count_backlog(&self) {
        if let Ok(mut conn) = self.pool.get().await {
            if let Ok(backlog) = outbox::backlog(&mut conn).await {
                self.metrics.backlog.set(backlog);
            }
        }
    }

    /// Publishes every committed row; returns how many were published.
    pub async fn drain(&self) -> anyhow::Result<usize> {
        let mut total = 0;
        loop {
            let published = self.publish_batch().await?;
            total += published;
            if published < BATCH as usize {
                break;
            }
        }
        if total > 0 {
            tracing::debug!(published = total, "outbox rows published");
        }
        Ok(total)
    }

    /// Publishes the rows handed over (`outbox::Wake::HandOver`) and marks them published;
    /// returns how many. When the publish fails their hold is ended, so that the next claim,
    /// of this relay or another, takes them.
    pub async fn publish_handed(&self) -> anyhow::Result<usize> {
        let (rows, since) = self.wake.take_handed(BATCH as usize);
        if rows.is_empty() {
            return Ok(0);
        }
        if let Some(since) = since {
            self.stage("wake", since);
        }
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let publishing = Instant::now();
        let messages: Vec<Outgoing> = rows.iter().map(|row| self.outgoing(row)).collect();
        let published = self.broker.publish_all(&messages).await;
        let mut guard = self.conn.lock().await;
        let conn = self.connection(&mut guard).await?;
        let marked = match published {
            Ok(()) => {
                self.stage("publish", publishing);
                // Lost (PostgreSQL down, or a crash before the asynchronous commit is
                // flushed), the mark leaves the rows to be claimed and published again once
                // their hold is over; the fan-out creates nothing twice.
                outbox::mark_published(conn, &ids).await
            }
            Err(error) => {
                // Lost too, the release leaves the rows to be claimed once their hold is over.
                if outbox::release(conn, &ids).await.is_err() {
                    // The connection may be broken: a fresh one next time.
                    *guard = None;
                }
                return Err(error).context("publishing the outbox rows handed over");
            }
        };
        if let Err(error) = marked {
            *guard = None;
            return Err(error).context("marking the outbox rows handed over published");
        }
        self.metrics.published.inc_by(rows.len() as u64);
        Ok(rows.len())
    }

    async fn publish_batch(&self) -> anyhow::Result<usize> {
        let mut guard = self.conn.lock().await;
        let conn = self.connection(&mut guard).await?;
        let result = self.publish_on(conn).await;
        if result.is_err() {
            // The connection may be broken or mid-transaction: open a fresh one next time.
            *guard = None;
        }
        let published = result?;
        self.metrics.published.inc_by(published as u64);
        Ok(published)
    }

    /// The relay's connection in `slot`, opened when there is none.
    async fn connection<'a>(
        &self,
        slot: &'a mut Option<AsyncPgConnection>,
    ) -> anyhow::Result<&'a mut AsyncPgConnection> {
        let conn = match slot.take() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        Ok(slot.insert(conn))
    }

    /// Opens the relay's connection: asynchronous commit for its marks (see the module doc).
    async fn connect(&self) -> anyhow::Result<AsyncPgConnection> {
        // Bounded like the pool's connects, so an unreachable server fails the pass instead of
        // stalling the relay.
        let mut conn = tokio::time::timeout(
            CONNECT_TIMEOUT,
            AsyncPgConnection::establish(&self.database_url),
        )
        .await
        .map_err(|_| DbError::Unavailable("connecting timed out".into()))
        .and_then(|connected| connected.map_err(|e| DbError::Unavailable(e.to_string())))
        .context("connecting the outbox relay")?;
        conn.batch_execute(&format!(
            "{}; SET synchronous_commit = off",
            crate::SESSION_SETTINGS
        ))
        .await
        .map_err(DbError::from)?;
        Ok(conn)
    }

    /// One pass: claims the rows in a transaction, publishes them, and commits the mark. An
    /// error leaves the transaction open: the caller drops the connection, which rolls it back.
    async fn publish_on(&self, conn: &mut AsyncPgConnection) -> anyhow::Result<usize> {
        // `BEGIN` and the claim go out together (pipelined), one round trip instead of two.
        // `BEGIN` can fail only with the connection, and then the claim fails too.
        let shared: &AsyncPgConnection = conn;
        let (mut beginning, mut claiming) = (shared, shared);
        let (begun, claimed) = futures::join!(
            beginning.batch_execute("BEGIN"),
            outbox::claim_and_mark(&mut claiming, BATCH)
        );
        begun.map_err(DbError::from)?;
        let rows = claimed?;
        // The wake is answered, whether this pass found the rows or another relay did.
        let woken = self.wake.take_since();
        if rows.is_empty() {
            self.metrics.backlog.set(0);
        } else {
            if let Some(since) = woken {
                self.stage("wake", since);
            }
            let publishing = Instant::now();
            let messages: Vec<Outgoing> = rows.iter().map(|row| self.outgoing(row)).collect();
            self.broker
                .publish_all(&messages)
                .await
                .context("publishing outbox rows")?;
            self.stage("publish", publishing);
        }
        conn.batch_execute("COMMIT").await.map_err(DbError::from)?;
        Ok(rows.len())
    }

    fn stage(&self, stage: &str, since: Instant) {
        self.metrics
            .stages
            .with_label_values(&[stage])
            .observe(since.elapsed().as_secs_f64());
    }

    fn outgoing(&self, row: &OutboxRow) -> Outgoing {
        let topology = self.broker.topology();
        let (exchange, routing_key) = match row.topic() {
            Some(Topic::Delivery) => (
                topology.deliveries_exchange(),
                DELIVERY_ROUTING_KEY.to_owned(),
            ),
            // The table's CHECK admits only these topics.
            Some(Topic::Event) | None => (topology.events_exchange(), EVENT_ROUTING_KEY.to_owned()),
        };
        let mut headers = headers_from_json(&row.headers);
        let (name, value) = published_at_header();
        headers.insert(name, value);
        Outgoing {
            exchange,
            routing_key,
            body: row.payload.clone(),
            headers,
        }
    }
}

/// Keeps a `LISTEN` connection open and turns notifications into wake-ups; reconnects when the
/// connection drops.
async fn listen(database_url: String, wake: Arc<RelayWaker>, cancel: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let session = async {
            let mut conn = AsyncPgConnection::establish(&database_url)
                .await
                .context("connecting for LISTEN")?;
            diesel::sql_query(format!("LISTEN {NOTIFY_CHANNEL}"))
                .execute(&mut conn)
                .await
                .context("LISTEN")?;
            // Rows committed while we were not listening.
            wake.wake();
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            while let Some(notification) = notifications.next().await {
                notification.context("reading notifications")?;
                wake.wake();
            }
            anyhow::Ok(())
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            result = session => {
                if let Err(error) = result {
                    tracing::debug!(error = %format!("{error:#}"), "outbox listener lost its connection");
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
