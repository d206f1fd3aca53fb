//! Tocsin's storage: everything that touches PostgreSQL. The pool and its session settings, the
//! schema and its migrations (`migrations/`, compiled into the binaries), one repository per
//! table family (the long statements in `sql/`), the transactional outbox and its [`relay`] to
//! RabbitMQ, and the [`batch`]er that lets concurrent requests share one transaction. Handlers
//! call these functions; no SQL lives outside this crate.
//!
//! The values it stores, and the rules they follow, are `tocsin-domain`'s. It depends on
//! `tocsin-broker` too: outbox rows hold the broker's messages, and the relay publishes them
//! through a broker handle (domain ← broker ← storage; the broker knows nothing of PostgreSQL).

pub mod admin_keys;
pub mod attempts;
pub mod audit;
pub mod batch;
pub mod deliveries;
pub mod fan_out;
pub mod health;
pub mod incidents;
pub mod outbox;
pub mod partitions;
pub mod relay;
pub mod replays;
pub mod retention;
pub mod schema;
pub mod stages;
mod statement;
pub mod tokens;
pub mod webhooks;

use std::time::Duration;

use anyhow::Context;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::batch::Batcher;

/// Every migration, compiled into the binaries.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// How many migrations the binaries carry.
pub fn migration_count() -> usize {
    diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map(|migrations| migrations.len())
        .unwrap_or(0)
}

/// Key of the advisory lock held while migrating, so that services starting together migrate once.
const MIGRATION_LOCK: i64 = 0x746f_6373_696e_0001;

pub type DbPool = Pool<AsyncPgConnection>;
pub type DbConn = Object<AsyncPgConnection>;

/// Errors of the repositories: not found, a conflict the caller should explain, or storage.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("not found")]
    NotFound,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for DbError {
    fn from(error: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        DbError::Unavailable(error.to_string())
    }
}

/// Records loaded as they are stored convert without error.
impl From<std::convert::Infallible> for DbError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// The record of a row that must exist: `NotFound` when there is none.
pub(crate) fn found<Row, T>(row: Option<Row>) -> Result<T, DbError>
where
    T: TryFrom<Row>,
    DbError: From<T::Error>,
{
    Ok(T::try_from(row.ok_or(DbError::NotFound)?)?)
}

impl DbError {
    /// Whether this is an outage that trying again later may get past (retried with backoff,
    /// answered 503 with `Retry-After`, shown by `/readyz`), as opposed to an error of the item
    /// itself (bad data, a violated constraint, a statement's bug), which fails that item alone:
    /// tried again, it would fail again. See [`transient`] for the conditions.
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Unavailable(_) => true,
            DbError::NotFound | DbError::Corrupt(_) => false,
            DbError::Query(error) => transient(error),
        }
    }
}

/// Whether a query error is an outage: the connection could not be used (lost, closed, never
/// sent), the server is shutting down, starting or in recovery, out of connections, memory or
/// disk, or the statement lost a race it may win next time (serialization failure, deadlock,
/// lock or statement timeout, a read-only server after a failover). Everything else is the
/// item's own error.
///
/// diesel names the SQLSTATE of only a few kinds (`SerializationFailure` 40001,
/// `ReadOnlyTransaction` 25006, the constraint violations); the server's other errors reach
/// us as `Unknown` with their message, and no code (diesel 2.3 has no accessor for it). Those
/// are recognised by the server's message ([`TRANSIENT_MESSAGES`], each with its SQLSTATE).
pub fn transient(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as K, Error as E};
    match error {
        E::DatabaseError(kind, info) => match kind {
            K::ClosedConnection
            | K::UnableToSendCommand
            | K::SerializationFailure
            | K::ReadOnlyTransaction => true,
            K::UniqueViolation
            | K::ForeignKeyViolation
            | K::NotNullViolation
            | K::CheckViolation
            | K::RestrictViolation
            | K::ExclusionViolation => false,
            _ => transient_message(info.message()),
        },
        E::BrokenTransactionManager => true,
        E::RollbackErrorOnCommit { commit_error, .. } => transient(commit_error),
        _ => false,
    }
}

/// The server's messages (in English, as PostgreSQL words them) of the outages diesel does not
/// name, each with its SQLSTATE. A server whose `lc_messages` is not English words them
/// otherwise: there, these too count as the item's own error (the item fails with the
/// message instead of being tried again).
pub const TRANSIENT_MESSAGES: [(&str, &str); 17] = [
    ("40P01", "deadlock detected"),
    ("55P03", "could not obtain lock"),
    ("55P03", "canceling statement due to lock timeout"),
    ("57014", "canceling statement due to statement timeout"),
    ("57014", "canceling statement due to user request"),
    ("40001", "canceling statement due to conflict with recovery"),
    (
        "57P01",
        "terminating connection due to administrator command",
    ),
    (
        "57P02",
        "terminating connection because of crash of another server process",
    ),
    ("57P03", "the database system is "),
    (
        "25P03",
        "terminating connection due to idle-in-transaction timeout",
    ),
    ("53300", "too many clients already"),
    ("53300", "remaining connection slots are reserved"),
    ("53200", "out of memory"),
    ("53200", "out of shared memory"),
    ("53100", "could not extend file"),
    ("53100", "could not write to file"),
    ("53100", "could not create temporary file"),
];

fn transient_message(message: &str) -> bool {
    TRANSIENT_MESSAGES
        .iter()
        .any(|(_, start)| message.starts_with(start))
}

/// The future of a repository function over a batch of items, boxed so that [`run_batch`]
/// can take any such function: one answer per item, in order.
pub type BatchFuture<'a, R> = futures::future::BoxFuture<'a, Result<Vec<R>, DbError>>;

/// Runs `batch` over every item on one pooled connection and answers for each item. When the
/// batch fails for a reason of its own (a violated constraint, bad data), each item is run
/// alone so that only the bad one fails; when the database is unreachable, every item gets
/// that (transient) error, to be tried again.
pub async fn run_batch<T, R>(
    pool: &DbPool,
    items: &[T],
    batch: &(dyn for<'a> Fn(&'a mut AsyncPgConnection, &'a [T]) -> BatchFuture<'a, R> + Sync),
) -> Vec<Result<R, DbError>> {
    let all_unavailable = |error: &DbError| -> Vec<Result<R, DbError>> {
        items
            .iter()
            .map(|_| Err(DbError::Unavailable(error.to_string())))
            .collect()
    };
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(error) => return all_unavailable(&DbError::from(error)),
    };
    match batch(&mut conn, items).await {
        Ok(answers) => answers.into_iter().map(Ok).collect(),
        Err(error) if error.is_transient() => all_unavailable(&error),
        Err(error) if items.len() == 1 => vec![Err(error)],
        Err(error) => {
            tracing::debug!(%error, items = items.len(), "a batch failed; running its items one by one");
            let mut answers = Vec::with_capacity(items.len());
            for item in items.chunks(1) {
                answers.push(batch(&mut conn, item).await.and_then(|mut one| {
                    one.pop()
                        .ok_or_else(|| DbError::Corrupt("a batch of one gave no answer".into()))
                }));
            }
            answers
        }
    }
}

/// Work from concurrent callers written in shared transactions (see [`crate::batch`]); each
/// caller gets its own answer or error.
pub type DbBatcher<T, R> = Batcher<T, Result<R, DbError>>;

/// Starts a [`DbBatcher`] whose `workers` each run `batch` (through [`run_batch`]) over up to
/// `max_batch` items at a time, on connections from `pool`.
pub fn batcher<T, R, F>(
    pool: &DbPool,
    max_batch: usize,
    workers: usize,
    batch: F,
) -> DbBatcher<T, R>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
    F: for<'a> Fn(&'a mut AsyncPgConnection, &'a [T]) -> BatchFuture<'a, R> + Send + Sync + 'static,
{
    let pool = pool.clone();
    let batch = std::sync::Arc::new(batch);
    Batcher::start(max_batch, workers, move |items: Vec<T>| {
        let pool = pool.clone();
        let batch = batch.clone();
        async move { run_batch(&pool, &items, &*batch).await }
    })
}

/// Submits one item to a [`DbBatcher`]; a stopped batcher is a transient error.
pub async fn submit<T, R>(batcher: &DbBatcher<T, R>, item: T) -> Result<R, DbError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    batcher
        .call(item)
        .await
        .unwrap_or_else(|stopped| Err(DbError::Unavailable(stopped.to_string())))
}

/// A position in a newest-first list: the last item's creation time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub at: OffsetDateTime,
    pub id: Uuid,
}

impl Cursor {
    pub fn new(at: OffsetDateTime, id: Uuid) -> Cursor {
        Cursor { at, id }
    }

    /// The opaque text handed to clients.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}:{}", self.at.unix_timestamp_nanos(), self.id))
    }

    /// The rows of `table` that come after this cursor in a newest-first list,
    /// `(created_at, id) < (at, id)`: every listed table names its columns so, and the row
    /// comparison is answered by a `(created_at DESC, id DESC)` index where the table has one.
    pub(crate) fn before<QS>(
        &self,
        table: &str,
    ) -> Box<dyn diesel::BoxableExpression<QS, diesel::pg::Pg, SqlType = diesel::sql_types::Bool>>
    {
        use diesel::sql_types::{Bool, Timestamptz, Uuid as SqlUuid};
        let row = format!("({table}.created_at, {table}.id) < (");
        Box::new(
            diesel::dsl::sql::<Bool>(&row)
                .bind::<Timestamptz, _>(self.at)
                .sql(", ")
                .bind::<SqlUuid, _>(self.id)
                .sql(")"),
        )
    }

    /// Reads a cursor given back by a client; `None` if it is not one of ours.
    pub fn decode(text: &str) -> Option<Cursor> {
        let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(text).ok()?).ok()?;
        let (nanos, id) = raw.split_once(':')?;
        Some(Cursor {
            at: OffsetDateTime::from_unix_timestamp_nanos(nanos.parse().ok()?).ok()?,
            id: id.parse().ok()?,
        })
    }
}

/// A record listed newest first, by creation time and then id.
pub trait Listed {
    fn cursor(&self) -> Cursor;
}

/// A page request: how many items and where to continue.
#[derive(Debug, Clone)]
pub struct Page {
    pub limit: i64,
    pub cursor: Option<Cursor>,
}

impl Page {
    pub const DEFAULT_LIMIT: i64 = 50;
    pub const MAX_LIMIT: i64 = 200;

    /// Splits `limit + 1` fetched items into the page and the cursor of the next one.
    pub fn split<T>(
        &self,
        mut items: Vec<T>,
        cursor_of: impl Fn(&T) -> Cursor,
    ) -> (Vec<T>, Option<Cursor>) {
        let limit = usize::try_from(self.limit).unwrap_or(0);
        if items.len() > limit {
            items.truncate(limit);
            let next = items.last().map(cursor_of);
            (items, next)
        } else {
            (items, None)
        }
    }

    /// The records of `limit + 1` fetched rows, split into the page and the cursor of the next.
    pub(crate) fn finish<Row, T>(&self, rows: Vec<Row>) -> Result<(Vec<T>, Option<Cursor>), DbError>
    where
        T: TryFrom<Row> + Listed,
        DbError: From<T::Error>,
    {
        let items = rows
            .into_iter()
            .map(T::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.split(items, T::cursor))
    }
}

/// Builds the pool. Connections are made lazily; a pool over an unreachable database is built
/// all the same and fails on use, so services start and report not-ready instead of crashing.
///
/// A connection taken from the pool is not pinged first (`RecyclingMethod::Fast`): that
/// `SELECT 1` was a round trip on every checkout, as many as the queries themselves on the hot
/// paths. A connection whose socket closed (PostgreSQL restarted) is still discarded on
/// checkout; one that breaks unnoticed fails its query with a transient error, which every
/// caller already retries or answers with 503.
///
/// Each connection plans its prepared statements once and for index scans ([`SESSION_SETTINGS`]).
///
/// The connection returned last is handed out first (`QueueMode::Lifo`): at a low rate the same
/// few connections serve one statement after another, their PostgreSQL backends awake and
/// their statements prepared, while the rest of the pool stays idle until the load needs it.
///
/// A connection is replaced once it is [`CONNECTION_MAX_AGE`] old, when it is next taken.
pub fn pool(database_url: &str, max_size: usize) -> anyhow::Result<DbPool> {
    pool_with_max_age(database_url, max_size, CONNECTION_MAX_AGE)
}

/// How long a pooled connection serves before it is closed and a new one opened in its stead,
/// at its next checkout. A connection keeps every statement it prepared, and the fan-out's text
/// changes with the day of its read floor (`fan_out.rs`): each day's plan held about 1 MB in
/// the connection's PostgreSQL backend (`pg_backend_memory_contexts`, 37 partitions). A new
/// connection costs a connect and its first plans, once an hour.
pub const CONNECTION_MAX_AGE: Duration = Duration::from_secs(3600);

/// [`pool`], its connections replaced once they are `max_age` old.
pub fn pool_with_max_age(
    database_url: &str,
    max_size: usize,
    max_age: Duration,
) -> anyhow::Result<DbPool> {
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = Box::new(|url| Box::pin(connect_for_pool(url.to_owned())));
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(database_url, config);
    Pool::builder(manager)
        .max_size(max_size)
        .queue_mode(deadpool::managed::QueueMode::Lifo)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool::Runtime::Tokio1)
        .pre_recycle(deadpool::managed::Hook::sync_fn(move |_, metrics| {
            if metrics.age() >= max_age {
                Err(deadpool::managed::HookError::Message(
                    "the connection is past its age".into(),
                ))
            } else {
                Ok(())
            }
        }))
        .build()
        .context("building the PostgreSQL pool")
}

/// Connections a service opens and prepares before it reports ready ([`warm`]): as many as the
/// hot path uses at a low rate.
pub const WARM_CONNECTIONS: usize = 4;

/// Opens up to [`WARM_CONNECTIONS`] of the pool's connections (fewer when the pool is smaller)
/// and runs `prepare` on each, which executes the service's hot statements with empty input: the
/// first alerts after a start then find connections open and their statements planned, instead
/// of paying a connection and a plan (up to 11 ms for the fan-out) on their way. A failure is
/// logged and the start goes on: the pool opens connections on demand all the same.
pub async fn warm<F>(pool: &DbPool, prepare: F)
where
    F: for<'c> Fn(&'c mut AsyncPgConnection) -> futures::future::BoxFuture<'c, Result<(), DbError>>,
{
    let count = WARM_CONNECTIONS.min(pool.status().max_size);
    let mut held = Vec::with_capacity(count);
    // Held until all are open, so that each is a connection of its own.
    for _ in 0..count {
        match pool.get().await {
            Ok(conn) => held.push(conn),
            Err(error) => {
                tracing::warn!(error = %error, "warming the pool: no connection");
                return;
            }
        }
    }
    for conn in &mut held {
        if let Err(error) = prepare(conn).await {
            tracing::warn!(error = %format!("{error:#}"), "warming the pool: a statement failed");
            return;
        }
    }
}

/// How the services' connections plan their statements.
///
/// - `plan_cache_mode = force_generic_plan`: a prepared statement is planned once per
///   connection. The hot paths' statements take arrays, whose length made PostgreSQL's default
///   mode plan them again on every call: a third of its time under load.
/// - Sequential scans are left to the planner. Each statement reads the growing tables through
///   an index whether it is planned on an empty log or a large one
///   (`plans::every_statement_reads_growing_tables_by_index_empty_or_large`): batches taken in
///   index order, keys looked up through `LATERAL ... LIMIT`, states written as literals. A plan
///   is made again when autovacuum analyzes a table it reads, and on a new connection (each is
///   replaced after [`CONNECTION_MAX_AGE`]).
///
/// - `jit = off`: every query here reads or writes a few rows. Costed above `jit_above_cost`
///   (as every query was while `enable_seqscan = off` made any scan of a table look costly),
///   PostgreSQL compiled the query with LLVM on every call: a statement run every second took 0.4-2.2 s
///   each time under load instead of 0.3 ms.
///
/// Queries that depend on a literal to pick a partial index carry that literal in their text.
///
/// A statement that finds rows by key and tests a partial index's predicate on them writes the
/// test as `(predicate) IS TRUE`, which PostgreSQL does not take to imply the predicate.
/// Written bare, the test let the planner read the whole partial index instead of one key: it
/// estimates such an index from its live rows (few: the attempts under way, the deliveries
/// due), but a scan of it visits every entry left since its last vacuum. Under load the outcome
/// statement (`sql/complete.sql`) visited a median of 2 500 entries of `attempts_under_way` a
/// call that way.
pub const SESSION_SETTINGS: &str = "SET plan_cache_mode = force_generic_plan; SET jit = off";

async fn connect_for_pool(url: String) -> diesel::ConnectionResult<AsyncPgConnection> {
    let mut conn = AsyncPgConnection::establish(&url).await?;
    conn.batch_execute(SESSION_SETTINGS)
        .await
        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// Applies pending migrations under an advisory lock; returns how many were applied. Then puts
/// a delivery log that holds nothing yet in day partitions (one that holds rows is reshaped by
/// `tocsin-admin reshape`, [`partitions::reshape`]), and makes the partitions of the days ahead.
pub async fn migrate(database_url: &str) -> anyhow::Result<usize> {
    let mut conn = AsyncPgConnection::establish(database_url)
        .await
        .with_context(|| {
            format!(
                "connecting to PostgreSQL at {}",
                tocsin_domain::redact_url(database_url)
            )
        })?;
    diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))
        .execute(&mut conn)
        .await
        .context("taking the migration lock")?;
    let mut wrapper: AsyncConnectionWrapper<AsyncPgConnection> = AsyncConnectionWrapper::from(conn);
    let (wrapper, applied) = tokio::task::spawn_blocking(move || {
        let applied = wrapper
            .run_pending_migrations(MIGRATIONS)
            .map(|versions| versions.len())
            .map_err(|e| anyhow::anyhow!("applying migrations: {e}"));
        (wrapper, applied)
    })
    .await
    .context("the migration task panicked")?;
    let mut conn: AsyncPgConnection = wrapper.into_inner();
    let partitioned = async {
        applied.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        let now = OffsetDateTime::now_utc();
        if !partitions::partitioned(&mut conn).await?
            && !partitions::holds_history(&mut conn).await?
        {
            partitions::reshape(&mut conn, now)
                .await
                .context("putting the delivery log in day partitions")?;
        }
        partitions::create_ahead(&mut conn, now.date())
            .await
            .context("putting the delivery log in day partitions")
    }
    .await;
    diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"))
        .execute(&mut conn)
        .await
        .context("releasing the migration lock")?;
    let applied = applied?;
    partitioned?;
    Ok(applied)
}

/// Checks that a connection can be had and answers, within `timeout`.
pub async fn ping(pool: &DbPool, timeout: Duration) -> Result<(), DbError> {
    let check = async {
        let mut conn = pool.get().await?;
        diesel::sql_query("SELECT 1").execute(&mut conn).await?;
        Ok::<_, DbError>(())
    };
    tokio::time::timeout(timeout, check)
        .await
        .map_err(|_| DbError::Unavailable("timed out".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements spell delivery states, triggers, wait reasons and orderings as SQL literals: each
    /// must be a value of the domain's enums, spelled as they spell it (a typo would make a
    /// guard that never matches).
    #[test]
    fn the_sql_names_only_values_of_the_domain() {
        use crate::outbox::Topic;
        use tocsin_domain::delivery::{DeliveryState, Trigger, WaitReason};
        let statements = [
            ("claim.sql", include_str!("sql/claim.sql")),
            ("claim_overdue.sql", include_str!("sql/claim_overdue.sql")),
            ("complete.sql", include_str!("sql/complete.sql")),
            ("fan_out.sql", include_str!("sql/fan_out.sql")),
            ("interrupted.sql", include_str!("sql/interrupted.sql")),
            ("next_in_order.sql", include_str!("sql/next_in_order.sql")),
            ("stop.sql", include_str!("sql/stop.sql")),
            ("take_waiting.sql", include_str!("sql/take_waiting.sql")),
            ("waits_for.sql", include_str!("sql/waits_for.sql")),
            ("deliveries.rs", include_str!("deliveries.rs")),
            (
                "prune_deliveries.sql",
                include_str!("sql/prune_deliveries.sql"),
            ),
            ("prune_events.sql", include_str!("sql/prune_events.sql")),
            ("prune_outbox.sql", include_str!("sql/prune_outbox.sql")),
        ];
        let mut states = 0;
        for (file, source) in statements {
            // The SQL: a whole .sql file, or the string literals of a Rust file.
            let sql: String = if file.ends_with(".rs") {
                source
                    .split('"')
                    .skip(1)
                    .step_by(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                source.to_owned()
            };
            // Every single-quoted word: 'pending', 'automatic', ...
            for literal in sql.split('\'').skip(1).step_by(2) {
                if literal.is_empty()
                    || !literal.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                {
                    continue;
                }
                let state = literal.parse::<DeliveryState>().is_ok();
                states += usize::from(state);
                let known = state
                    || Trigger::parse(literal).is_some()
                    || WaitReason::parse(literal).is_some()
                    || tocsin_domain::WebhookOrdering::parse(literal).is_ok()
                    || [Topic::Event, Topic::Delivery].iter().any(|t| t.as_str() == literal)
                    // encode(..., 'hex'), and the event id's key in an outbox payload
                    || ["hex", "event_id"].contains(&literal);
                assert!(
                    known,
                    "{file}: '{literal}' is no delivery state, trigger, wait reason or ordering"
                );
            }
        }
        assert!(states > 20, "the statements' states were read ({states})");
    }

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let cursor = Cursor {
            at: OffsetDateTime::from_unix_timestamp_nanos(1_763_775_120_226_037_496).unwrap(),
            id: Uuid::now_v7(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        assert_eq!(Cursor::decode("not-a-cursor"), None);
        assert_eq!(Cursor::decode(""), None);
    }

    #[test]
    fn pages_split_off_the_extra_item() {
        let page = Page {
            limit: 2,
            cursor: None,
        };
        let c = |n: &i64| Cursor {
            at: OffsetDateTime::UNIX_EPOCH,
            id: Uuid::from_u128(*n as u128),
        };
        let (items, next) = page.split(vec![1, 2, 3], c);
        assert_eq!(items, vec![1, 2]);
        assert_eq!(next.unwrap().id, Uuid::from_u128(2));
        let (items, next) = page.split(vec![1, 2], c);
        assert_eq!(items, vec![1, 2]);
        assert!(next.is_none());
    }
}
