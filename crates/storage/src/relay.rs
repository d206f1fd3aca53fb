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
//!
//! A claim reads the outbox's index of unpublished rows from its floor ([`ClaimFloor`]), not
//! from its first row: a row marked published leaves its entry in that index until a vacuum,
//! and a claim visits every entry it reads (PostgreSQL did not mark them dead for the claims to
//! skip). With autovacuum off, after half an hour at 300 alerts/s a claim from the first row
//! took 239 ms, and the relays' claims at each poll took the p99 from 65 to 420 ms
//! (docs/performance.md, "A steady hour").

use std::collections::VecDeque;
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
/// How long after the outbox handed out an id the relay takes its row to be committed (or
/// never to be) and its hold over: the floor of its claims passes the row only then.
const SETTLED_AFTER: Duration = Duration::from_secs(15);
/// How often a claim reads the outbox from its first row, for the rows of a transaction that
/// took longer than [`SETTLED_AFTER`] to commit (they wait for it), and after a failure.
const FULL_CLAIM_EVERY: Duration = Duration::from_secs(60);

/// Where the relay's claims start reading the outbox. Each drain notes the last id handed out
/// (`outbox_id_seq`); once [`SETTLED_AFTER`] has passed, every row up to that id is committed
/// and its hold over, or it never will be, so a drain that starts then and claims everything
/// it can moves the floor past it. A row below the floor still unpublished (its transaction
/// took longer, or another relay's pass failed with it) is claimed by the next full claim, from
/// the first row, every [`FULL_CLAIM_EVERY`]. A failure of this relay (PostgreSQL or RabbitMQ,
/// a hand-over not published) starts over from the first row.
#[derive(Debug, Default)]
struct ClaimFloor {
    /// The last id handed out at the start of recent drains, oldest first, a second apart.
    marks: VecDeque<(Instant, i64)>,
    /// Claims start here.
    floor: i64,
    /// When the last full claim started; `None`: the next drain claims from the first row.
    full_at: Option<Instant>,
    /// Failures so far: a drain that started before one moves nothing when it finishes.
    failures: u64,
}

/// A drain's claims: where they start, and what the floor passes once they have all succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Drain {
    from: i64,
    settled: Option<i64>,
    full_at: Option<Instant>,
    failures: u64,
}

impl ClaimFloor {
    /// Whether a drain starting `now` notes the last id handed out: a second after the last
    /// noted, so that most drains read nothing more than their claims.
    fn wants_mark(&self, now: Instant) -> bool {
        self.marks
            .back()
            .is_none_or(|&(at, _)| now.saturating_duration_since(at) >= Duration::from_secs(1))
    }

    /// A drain starting `now`, with the last id handed out when [`Self::wants_mark`].
    fn start(&mut self, now: Instant, last_id: Option<i64>) -> Drain {
        let mut settled = None;
        while let Some(&(at, id)) = self.marks.front() {
            if now.saturating_duration_since(at) < SETTLED_AFTER {
                break;
            }
            settled = Some(id);
            self.marks.pop_front();
        }
        if let Some(last_id) = last_id.filter(|_| self.wants_mark(now)) {
            self.marks.push_back((now, last_id));
        }
        let full = self
            .full_at
            .is_none_or(|at| now.saturating_duration_since(at) >= FULL_CLAIM_EVERY);
        Drain {
            from: if full { 0 } else { self.floor },
            settled,
            full_at: full.then_some(now),
            failures: self.failures,
        }
    }

    /// Every claim of `drain` succeeded.
    fn finished(&mut self, drain: Drain) {
        if drain.failures != self.failures {
            return;
        }
        if let Some(settled) = drain.settled {
            self.floor = self.floor.max(settled + 1);
        }
        if drain.full_at.is_some() {
            self.full_at = drain.full_at;
        }
    }

    /// A pass failed: rows below the floor may be unpublished, and after a failover the new
    /// primary may hand out ids below it (the ones its predecessor had not replicated). The
    /// claims start from the first row again until the ids noted from now on have settled.
    fn failed(&mut self) {
        *self = ClaimFloor {
            failures: self.failures + 1,
            ..ClaimFloor::default()
        };
    }
}

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
    /// Shared by the relay's passes.
    floor: Arc<std::sync::Mutex<ClaimFloor>>,
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
            floor: Arc::default(),
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
                    self.floor().failed();
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

    fn floor(&self) -> std::sync::MutexGuard<'_, ClaimFloor> {
        self.floor.lock().expect("the relay's claim floor")
    }

    /// Publishes every committed row from the claims' floor on (every committed row, when a
    /// full claim is due); returns how many were published.
    pub async fn drain(&self) -> anyhow::Result<usize> {
        let now = Instant::now();
        let wants_mark = self.floor().wants_mark(now);
        let last_id = if wants_mark {
            let mut guard = self.conn.lock().await;
            let conn = self.connection(&mut guard).await?;
            let last_id = outbox::last_id(conn).await;
            if last_id.is_err() {
                *guard = None;
            }
            Some(last_id?)
        } else {
            None
        };
        let drain = self.floor().start(now, last_id);
        let mut total = 0;
        loop {
            let published = self.publish_batch(drain.from).await?;
            total += published;
            if published < BATCH as usize {
                break;
            }
        }
        self.floor().finished(drain);
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

    async fn publish_batch(&self, from: i64) -> anyhow::Result<usize> {
        let mut guard = self.conn.lock().await;
        let conn = self.connection(&mut guard).await?;
        let result = self.publish_on(conn, from).await;
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
    async fn publish_on(&self, conn: &mut AsyncPgConnection, from: i64) -> anyhow::Result<usize> {
        // `BEGIN` and the claim go out together (pipelined), one round trip instead of two.
        // `BEGIN` can fail only with the connection, and then the claim fails too.
        let shared: &AsyncPgConnection = conn;
        let (mut beginning, mut claiming) = (shared, shared);
        let (begun, claimed) = futures::join!(
            beginning.batch_execute("BEGIN"),
            outbox::claim_and_mark(&mut claiming, BATCH, from)
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_floor_passes_an_id_only_after_a_drain_that_started_once_it_settled() {
        let mut floor = ClaimFloor::default();
        let t0 = Instant::now();
        // The first drain claims from the first row.
        let first = floor.start(t0, Some(100));
        assert_eq!((first.from, first.settled), (0, None));
        floor.finished(first);
        // Before id 100 has settled, drains start at 0 still, and note their ids a second apart.
        assert!(!floor.wants_mark(t0 + SECOND / 2), "a second apart");
        let early = floor.start(t0 + SECOND / 2, None);
        assert_eq!((early.from, early.settled), (0, None));
        floor.finished(early);
        let later = floor.start(t0 + SECOND * 2, Some(200));
        floor.finished(later);
        assert_eq!(
            floor.marks.iter().map(|m| m.1).collect::<Vec<_>>(),
            [100, 200]
        );
        // Settled, 100 is passed by the drain that started then, once it has finished.
        let settling = floor.start(t0 + SETTLED_AFTER, Some(300));
        assert_eq!((settling.from, settling.settled), (0, Some(100)));
        floor.finished(settling);
        let next = floor.start(t0 + SETTLED_AFTER + SECOND * 3, Some(400));
        assert_eq!((next.from, next.settled), (101, Some(200)));
        // A drain that fails moves nothing; the next starts at the same floor.
        let failing = floor.start(t0 + SETTLED_AFTER * 2, Some(500));
        assert_eq!(failing.from, 101);
        let after = floor.start(t0 + SETTLED_AFTER * 2 + SECOND, Some(500));
        assert_eq!(after.from, 101);
        floor.finished(next);
        floor.finished(after);
        assert_eq!(floor.floor, 201);
    }

    #[test]
    fn a_full_claim_comes_every_minute_and_a_failure_starts_over() {
        let mut floor = ClaimFloor::default();
        let t0 = Instant::now();
        for (at, last_id) in [(t0, 10), (t0 + SETTLED_AFTER, 20)] {
            let drain = floor.start(at, Some(last_id));
            floor.finished(drain);
        }
        let partial = floor.start(t0 + SETTLED_AFTER + SECOND, Some(30));
        assert_eq!((partial.from, partial.full_at), (11, None));
        floor.finished(partial);
        let full = floor.start(t0 + FULL_CLAIM_EVERY, Some(40));
        assert_eq!(full.from, 0);
        floor.finished(full);
        assert_eq!(floor.floor, 31);
        let t1 = t0 + FULL_CLAIM_EVERY + SETTLED_AFTER;
        let cut_short = floor.start(t1, Some(50));
        assert_eq!((cut_short.from, cut_short.settled), (31, Some(40)));
        floor.failed();
        floor.finished(cut_short);
        assert_eq!(
            floor.floor, 0,
            "a drain that started before the failure moves nothing"
        );
        // From the first row, and the ids noted before the failure count no more.
        let after = floor.start(t1 + SECOND, Some(5));
        assert_eq!((after.from, after.settled), (0, None));
        assert!(after.full_at.is_some());
        floor.finished(after);
        let settled = floor.start(t1 + SECOND + SETTLED_AFTER, Some(6));
        assert_eq!((settled.from, settled.settled), (0, Some(5)));
        floor.finished(settled);
        assert_eq!(floor.floor, 6);
    }
}
