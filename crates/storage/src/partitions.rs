//! The delivery log in day partitions: `events`, `deliveries` and `attempts` grow with traffic,
//! so each is partitioned by day, and retention removes a whole day at once instead of
//! deleting row by row ([`expire`]).
//!
//! - `events` by `id`, `deliveries` by `id`, `attempts` by `delivery_id`. Ids are UUIDv7s, whose
//!   first 48 bits are a millisecond time, so a day is a range of ids: `[day_floor(d),
//!   day_floor(d + 1))`. A delivery's id carries its event's time (`sql/fan_out.sql`), so an
//!   event, its deliveries and their attempts always share a day, and a lookup by id reads one
//!   partition.
//! - A delivery is unique per (event, webhook): every delivery of an event is in the event's day,
//!   so each day's partition enforces it with a unique index of its own (PostgreSQL allows a
//!   unique index on a partitioned table only if it holds the partition key).
//! - Partitions are named `<table>_<yyyymmdd>` and made [`DAYS_AHEAD`] days ahead, at every
//!   start ([`crate::migrate`]) and every retention pass. The history of a database reshaped
//!   while holding rows ([`reshape`]) stays in one partition, `<table>_before_<yyyymmdd>`, for
//!   every id before that day.
//! - Unfinished deliveries are never removed: when a day with some expires, they are kept with
//!   their attempts and events, and the rest of the day goes.

use std::time::Duration;

use diesel::sql_types::{BigInt, Bool, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::DbError;

/// How many days ahead of today partitions exist.
pub const DAYS_AHEAD: i64 = 7;

/// The partitioned tables, each with its partition key, in the order they are reshaped.
pub const TABLES: [(&str, &str); 3] = [
    ("events", "id"),
    ("deliveries", "id"),
    ("attempts", "delivery_id"),
];

/// How long retention (and the making of partitions ahead) waits for a lock before it gives up
/// and tries again, for its first [`SHORT_TRIES`] tries. While it waits, every statement of the
/// services on the same tables waits behind it, so this is the longest it holds them up each
/// day, however long the transaction it waits for lasts (a backup's, a slow report's). At
/// 500 ms, one retention pass in nine on 5 M aged deliveries held ingest's transaction up to
/// 333 ms, and the 20/s stream's p99 with it.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(50);
/// Tries at their first lock timeout; each later one waits twice as long as the one before, up
/// to [`LONGEST_LOCK_TIMEOUT`], so that a database whose tables are never free for 50 ms still
/// gets its retention.
const SHORT_TRIES: usize = 10;
/// The longest a try waits for a lock: below PostgreSQL's `deadlock_timeout` (1 s), so that
/// when a service's transaction and this one wait for each other, this one gives up before the
/// deadlock check could cancel the service's.
const LONGEST_LOCK_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a step that waits for a lock is tried before the reshape or expiry gives up: a
/// busy database may hold it off for a while (minutes).
const LOCK_TRIES: usize = 300;

/// How a step waits for its locks: the lock timeout of its first tries, and the pause after a
/// try that timed out, in which the services run freely.
#[derive(Debug, Clone, Copy)]
struct LockWait {
    first: Duration,
    pause: Duration,
}

/// Retention and the partitions ahead, every day beside the traffic: a lock that stays held
/// costs the services at most 50 ms a second.
const DAILY: LockWait = LockWait {
    first: LOCK_TIMEOUT,
    pause: Duration::from_secs(1),
};

/// The reshape, done once, each of its steps taking a lock: 500 ms from the first try, 200 ms
/// apart. A test writing without a pause beside it took 18-50 tries at 50 ms, 1-6 at 500; with
/// 1 s pauses, under the rest of the suite, it outlasted the test's 10 000 writes.
const RESHAPE: LockWait = LockWait {
    first: LONGEST_LOCK_TIMEOUT,
    pause: Duration::from_millis(200),
};

/// How long the `tries`-th try of a step waits for a lock.
fn lock_timeout(wait: LockWait, tries: usize) -> Duration {
    let doublings = tries.saturating_sub(SHORT_TRIES).min(4) as u32;
    (wait.first * 2u32.pow(doublings)).min(LONGEST_LOCK_TIMEOUT)
}

/// The first UUIDv7 of a day (UTC): its time in milliseconds, then zeros.
pub fn day_floor(day: Date) -> Uuid {
    time_floor((day.midnight().assume_utc().unix_timestamp_nanos() / 1_000_000) as u64)
}

/// The least UUID of a millisecond (a UUIDv7's time, then zeros).
pub fn time_floor(millis: u64) -> Uuid {
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.min(MAX_MILLIS).to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// The time a UUIDv7 holds, in milliseconds; `None` for another version.
pub fn v7_millis(id: Uuid) -> Option<u64> {
    let b = id.as_bytes();
    (id.get_version_num() == 7)
        .then(|| u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]]))
}

/// The greatest time 48 bits hold.
const MAX_MILLIS: u64 = (1 << 48) - 1;

fn partition_name(table: &str, day: Date) -> String {
    format!(
        "{table}_{:04}{:02}{:02}",
        day.year(),
        u8::from(day.month()),
        day.day()
    )
}

fn before_name(table: &str, day: Date) -> String {
    partition_name(&format!("{table}_before"), day)
}

/// The day a partition's name ends with.
fn name_day(name: &str) -> Option<Date> {
    let digits = name.rsplit('_').next()?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: i32 = digits[..4].parse().ok()?;
    let month: u8 = digits[4..6].parse().ok()?;
    let day: u8 = digits[6..].parse().ok()?;
    Date::from_calendar_date(year, month.try_into().ok()?, day).ok()
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

/// The one boolean `sql` answers (as `flag`).
async fn flag(conn: &mut AsyncPgConnection, sql: &str) -> Result<bool, DbError> {
    let rows: Vec<Flag> = diesel::sql_query(sql).load(conn).await?;
    Ok(rows.into_iter().next().is_some_and(|row| row.flag))
}

/// The one number `sql` answers (as `count`).
async fn count(conn: &mut AsyncPgConnection, sql: &str) -> Result<i64, DbError> {
    let rows: Vec<Count> = diesel::sql_query(sql).load(conn).await?;
    Ok(rows.into_iter().next().map_or(0, |row| row.count))
}

/// Whether the delivery log is in day partitions.
pub async fn partitioned(conn: &mut AsyncPgConnection) -> Result<bool, DbError> {
    flag(
        conn,
        "SELECT count(*) = 3 AS flag FROM pg_class \
         WHERE relname IN ('events', 'deliveries', 'attempts') AND relkind = 'p' \
           AND relnamespace = current_schema()::regnamespace",
    )
    .await
}

/// Whether `events`, `deliveries` or `attempts` holds a row.
pub async fn holds_history(conn: &mut AsyncPgConnection) -> Result<bool, DbError> {
    flag(
        conn,
        "SELECT EXISTS (SELECT 1 FROM events) OR EXISTS (SELECT 1 FROM deliveries) \
             OR EXISTS (SELECT 1 FROM attempts) AS flag",
    )
    .await
}

/// The partitions of `table`, by name.
async fn partitions_of(conn: &mut AsyncPgConnection, table: &str) -> Result<Vec<String>, DbError> {
    let rows: Vec<Name> = diesel::sql_query(format!(
        "SELECT c.relname::text AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = '{table}'::regclass ORDER BY 1"
    ))
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|row| row.name).collect())
}

/// Makes the day partitions from today to [`DAYS_AHEAD`] days ahead that do not exist yet
/// (none before the `before` partition's end); returns how many tables it made. A day's
/// partitions of the three tables are made in one transaction, so that the services plan their
/// statements again once for the day (see [`expire`]). Does nothing while the delivery log is
/// not partitioned.
pub async fn create_ahead(conn: &mut AsyncPgConnection, today: Date) -> Result<usize, DbError> {
    if !partitioned(conn).await? {
        return Ok(0);
    }
    let mut wanted: Vec<(Date, Vec<&'static str>)> = Vec::new();
    for (table, _) in TABLES {
        let existing = partitions_of(conn, table).await?;
        let first = existing
            .iter()
            .filter(|name| name.starts_with(&format!("{table}_before_")))
            .filter_map(|name| name_day(name))
            .max()
            .map_or(today, |end| end.max(today));
        for offset in 0..=DAYS_AHEAD {
            let day = today + time::Duration::days(offset);
            if day < first || existing.contains(&partition_name(table, day)) {
                continue;
            }
            match wanted.iter_mut().find(|(d, _)| *d == day) {
                Some((_, tables)) => tables.push(table),
                None => wanted.push((day, vec![table])),
            }
        }
    }
    wanted.sort();
    let mut made = 0;
    for (day, tables) in wanted {
        with_lock_retries(conn, DAILY, |conn| {
            let tables = tables.clone();
            Box::pin(async move {
                conn.transaction::<_, DbError, _>(async |conn| {
                    for table in tables {
                        make_day(conn, table, day).await?;
                    }
                    Ok(())
                })
                .await
            })
        })
        .await?;
        made += tables.len();
    }
    Ok(made)
}

/// Makes one day's partition of `table`, unless it exists: a table of the same shape, attached
/// for the day's ids (attaching takes a weaker lock on the parent than `CREATE TABLE ...
/// PARTITION OF`). Fails when another partition holds ids of that day.
pub async fn make_day(conn: &mut AsyncPgConnection, table: &str, day: Date) -> Result<(), DbError> {
    let name = partition_name(table, day);
    let made = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass('{name}')) AS flag"
    );
    if flag(conn, &made).await? {
        return Ok(());
    }
    let (from, to) = (day_floor(day), day_floor(day + time::Duration::DAY));
    conn.transaction::<_, DbError, _>(async |conn| {
        // The parent's indexes, made before attaching under names that say the day and the
        // index (`deliveries_20261127_by_webhook`), so that plans read plainly.
        let mut indexes = String::new();
        for (index, definition, primary) in index_definitions(conn, table).await? {
            let own = format!("{name}_{}", index.trim_start_matches(&format!("{table}_")));
            let parent = format!(" ON ONLY public.{table} ");
            if primary || !definition.contains(&parent) {
                continue;
            }
            indexes.push_str(&format!(
                "{};\n",
                definition
                    .replacen(&format!(" {index} "), &format!(" {own} "), 1)
                    .replacen(&parent, &format!(" ON {name} "), 1)
            ));
        }
        if table == "deliveries" {
            indexes.push_str(&format!(
                "CREATE UNIQUE INDEX {name}_event_webhook ON {name} (event_id, webhook_id);"
            ));
        }
        conn.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {name}
                 (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
             {indexes}
             ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ('{from}') TO ('{to}');"
        ))
        .await?;
        Ok(())
    })
    .await
}

/// Runs `step` until it does not fail for want of a lock, at most [`LOCK_TRIES`] times, each
/// try with its session's `lock_timeout` set by [`lock_timeout`] (and reset after the last).
async fn with_lock_retries<T, F>(
    conn: &mut AsyncPgConnection,
    wait: LockWait,
    mut step: F,
) -> Result<T, DbError>
where
    F: for<'c> FnMut(
        &'c mut AsyncPgConnection,
    ) -> futures::future::BoxFuture<'c, Result<T, DbError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let timeout = lock_timeout(wait, tries);
        conn.batch_execute(&format!("SET lock_timeout = '{}ms'", timeout.as_millis()))
            .await?;
        match step(conn).await {
            Err(error) if tries < LOCK_TRIES && lock_timed_out(&error) => {
                tracing::info!(%error, tries, ?timeout, "waiting for a lock on the delivery log; trying again");
                tokio::time::sleep(wait.pause).await;
            }
            Ok(done) => {
                conn.batch_execute("RESET lock_timeout").await?;
                return Ok(done);
            }
            // The step's own error says more than a failure to reset, on a connection it may
            // have broken.
            Err(error) => {
                let _ = conn.batch_execute("RESET lock_timeout").await;
                return Err(error);
            }
        }
    }
}

fn lock_timed_out(error: &DbError) -> bool {
    let text = error.to_string();
    text.contains("lock timeout")
        || text.contains("could not obtain lock")
        || text.contains("deadlock detected")
}

/// What a reshape did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reshaped {
    /// The tables moved into day partitions (none: they already were).
    pub tables: Vec<String>,
    /// Deliveries whose id was not a UUIDv7 of their time, given one (only the 2026-11-24
    /// migration made such ids).
    pub rekeyed: i64,
}

/// Moves `events`, `deliveries` and `attempts` into day partitions, online: the services keep
/// reading and writing them throughout. A table that holds rows keeps them in one partition,
/// `<table>_before_<day>`, for every id before `day` (the day after tomorrow), checked first by
/// a constraint validated without blocking writes; then, in one short transaction per table,
/// the table is renamed, the partitioned table made in its place, and the old one attached to
/// it. An empty table is simply replaced. Safe to run again: a partitioned table is left as it
/// is, and a step cut short is taken up where it stopped.
///
/// Every service of this version works on either shape. A service of an earlier version does
/// not work on the new one (its fan-out names the unique constraint of `deliveries`, which the
/// partitioned table does not have): upgrade every service before reshaping a database that
/// holds rows (`tocsin-admin reshape`); an empty one is reshaped by [`crate::migrate`].
pub async fn reshape(
    conn: &mut AsyncPgConnection,
    now: OffsetDateTime,
) -> Result<Reshaped, DbError> {
    let mut reshaped = Reshaped::default();
    let today = now.date();
    // A reshape taken up again keeps the day its first tables were cut at, while that is still
    // ahead.
    let mut cut_day = today + time::Duration::days(2);
    for (table, _) in TABLES {
        for name in partitions_of(conn, table).await? {
            if let Some(day) = name_day(&name).filter(|_| name.contains("_before_")) {
                if day > today {
                    cut_day = day;
                }
            }
        }
    }
    let cut = day_floor(cut_day);
    // Foreign keys between the partitioned tables would keep a day from being removed alone.
    for (table, constraint) in [
        ("deliveries", "deliveries_event_id_fkey"),
        ("attempts", "attempts_delivery_id_fkey"),
    ] {
        with_lock_retries(conn, RESHAPE, |conn| {
            Box::pin(async move {
                // Dropping a foreign key locks both of its tables: take them in the order every
                // other step does.
                conn.batch_execute(&format!(
                    "LOCK TABLE events, deliveries, attempts IN ACCESS EXCLUSIVE MODE;
                     ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {constraint};"
                ))
                .await?;
                Ok(())
            })
        })
        .await?;
    }
    for (table, key) in TABLES {
        if is_partitioned(conn, table).await? {
            continue;
        }
        let empty = flag(
            conn,
            &format!("SELECT NOT EXISTS (SELECT 1 FROM {table}) AS flag"),
        )
        .await?;
        if !empty {
            if table == "deliveries" {
                reshaped.rekeyed = rekey(conn, cut).await?;
            }
            let check = format!("{table}_before_reshape");
            with_lock_retries(conn, RESHAPE, |conn| {
                let check = check.clone();
                Box::pin(async move {
                    conn.batch_execute(&format!(
                        "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {check};
                         ALTER TABLE {table} ADD CONSTRAINT {check} CHECK ({key} < '{cut}') NOT VALID;"
                    ))
                    .await?;
                    Ok(())
                })
            })
            .await?;
            // Reads the whole table, without blocking its writes.
            conn.batch_execute(&format!("ALTER TABLE {table} VALIDATE CONSTRAINT {check}"))
                .await?;
        }
        with_lock_retries(conn, RESHAPE, |conn| {
            Box::pin(async move { swap(conn, table, key, empty, cut_day, today).await })
        })
        .await?;
        reshaped.tables.push(table.to_owned());
    }
    create_ahead(conn, today).await?;
    Ok(reshaped)
}

async fn is_partitioned(conn: &mut AsyncPgConnection, table: &str) -> Result<bool, DbError> {
    flag(
        conn,
        &format!("SELECT relkind = 'p' AS flag FROM pg_class WHERE oid = '{table}'::regclass"),
    )
    .await
}

/// Gives every delivery whose id is at or past `cut` (a random, not a time-ordered, id) a
/// UUIDv7 of its event's time, and moves its attempts with it.
async fn rekey(conn: &mut AsyncPgConnection, cut: Uuid) -> Result<i64, DbError> {
    count(
        conn,
        &format!(
            "WITH moved AS (
             SELECT id AS old, {new} AS new FROM deliveries WHERE id >= '{cut}'
         ), attempts_moved AS (
             UPDATE attempts a SET delivery_id = m.new FROM moved m WHERE a.delivery_id = m.old
         ), deliveries_moved AS (
             UPDATE deliveries d SET id = m.new FROM moved m WHERE d.id = m.old RETURNING 1
         )
         SELECT count(*) AS count FROM deliveries_moved",
            new = "uuid_v7_sharing_time(event_id)",
        ),
    )
    .await
}

/// The indexes of `table` as `CREATE INDEX` statements, with `table` as written.
async fn index_definitions(
    conn: &mut AsyncPgConnection,
    table: &str,
) -> Result<Vec<(String, String, bool)>, DbError> {
    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        definition: String,
        #[diesel(sql_type = Bool)]
        primary: bool,
    }
    let rows: Vec<Index> = diesel::sql_query(format!(
        "SELECT c.relname::text AS name, pg_get_indexdef(i.indexrelid) AS definition, \
             i.indisprimary AS primary \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = '{table}'::regclass ORDER BY 1"
    ))
    .load(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.name, row.definition, row.primary))
        .collect())
}

/// The one transaction that puts the partitioned table in `table`'s place.
async fn swap(
    conn: &mut AsyncPgConnection,
    table: &'static str,
    key: &'static str,
    empty: bool,
    cut_day: Date,
    today: Date,
) -> Result<(), DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        conn.batch_execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .await?;
        let indexes = index_definitions(conn, table).await?;
        let old = if empty {
            format!("{table}_replaced")
        } else {
            before_name(table, cut_day)
        };
        let mut sql = format!("ALTER TABLE {table} RENAME TO {old};\n");
        for (name, _, _) in &indexes {
            sql.push_str(&format!("ALTER INDEX {name} RENAME TO {old}_{name};\n"));
        }
        sql.push_str(&format!(
            "CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
                 PARTITION BY RANGE ({key});
             ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_before_reshape;\n"
        ));
        for (name, definition, primary) in &indexes {
            let on_old = format!(" ON public.{table} ");
            if *primary {
                // The partition key is the primary key, or its first column.
                let columns = definition
                    .split_once(" USING btree (")
                    .map(|(_, rest)| rest.trim_end_matches(')'))
                    .unwrap_or(key);
                sql.push_str(&format!(
                    "ALTER TABLE {table} ADD CONSTRAINT {name} PRIMARY KEY ({columns});\n"
                ));
            } else if definition.starts_with("CREATE UNIQUE INDEX") {
                // Unique without the partition key: each day's partition has its own.
                continue;
            } else if definition.contains(&on_old) {
                sql.push_str(&format!("{};\n", definition.replacen(&on_old, &format!(" ON {table} "), 1)));
            }
        }
        if table == "deliveries" {
            sql.push_str(
                "ALTER TABLE deliveries ADD CONSTRAINT deliveries_webhook_id_fkey
                     FOREIGN KEY (webhook_id) REFERENCES webhooks (id);\n",
            );
        }
        if table == "events" {
            sql.push_str("ALTER SEQUENCE events_seq OWNED BY events.seq;\n");
        }
        if empty {
            sql.push_str(&format!("DROP TABLE {old};\n"));
        } else {
            sql.push_str(&format!(
                "ALTER TABLE {table} ATTACH PARTITION {old} FOR VALUES FROM (MINVALUE) TO ('{}');\n",
                day_floor(cut_day)
            ));
        }
        conn.batch_execute(&sql).await?;
        let first = if empty { today } else { cut_day };
        let mut day = first;
        while day <= today + time::Duration::days(DAYS_AHEAD) {
            make_day(conn, table, day).await?;
            day += time::Duration::DAY;
        }
        Ok(())
    })
    .await
}

/// What an expiry removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Expired {
    /// Days whose partitions were dropped whole.
    pub dropped: usize,
    /// Days emptied but for their unfinished deliveries (with their attempts and events).
    pub emptied: usize,
    /// Unfinished deliveries kept in expired days.
    pub kept: i64,
}

/// Removes every day that ended before `cutoff`, each in one transaction: a day without
/// unfinished deliveries loses its three partitions; a day with some keeps them, their attempts
/// and their events, and loses everything else. Either takes time by the day's unfinished
/// deliveries, not by its size. Does nothing while the delivery log is not partitioned.
///
/// One transaction a day, because every change to a partitioned table's partitions makes each
/// connection plan its statements on that table again, and a generic plan over a month of
/// partitions takes tens of milliseconds to make (`sql/fan_out.sql` took 32.5 ms at 37 before
/// it planned only the days from its floor): done once a day, not once a table and step, it
/// costs the services' traffic one plan per connection.
pub async fn expire(
    conn: &mut AsyncPgConnection,
    cutoff: OffsetDateTime,
) -> Result<Expired, DbError> {
    let mut expired = Expired::default();
    if !partitioned(conn).await? {
        return Ok(expired);
    }
    // Each day's three partitions share a name's end (`_20261127`); the `before` ones may end
    // on different days (a reshape resumed on a later day), and go together once all have.
    let mut days: Vec<Vec<String>> = Vec::new();
    let mut befores = Vec::new();
    let mut suffixes = std::collections::BTreeSet::new();
    for (table, _) in TABLES {
        for name in partitions_of(conn, table).await? {
            let Some(day) = name_day(&name) else { continue };
            if !name.contains("_before_")
                && (day + time::Duration::DAY).midnight().assume_utc() <= cutoff
            {
                suffixes.insert(name.trim_start_matches(table).to_owned());
            }
        }
    }
    for suffix in suffixes {
        days.push(TABLES.iter().map(|(t, _)| format!("{t}{suffix}")).collect());
    }
    for (table, _) in TABLES {
        let before = partitions_of(conn, table)
            .await?
            .into_iter()
            .find(|name| name.starts_with(&format!("{table}_before_")));
        befores.extend(before);
    }
    let befores_ended = befores
        .iter()
        .all(|name| name_day(name).is_some_and(|day| day.midnight().assume_utc() <= cutoff));
    if befores.len() == TABLES.len() && befores_ended {
        days.push(befores);
    }
    for names in days {
        let mut present = Vec::new();
        for name in &names {
            let exists = format!("SELECT to_regclass('{name}') IS NOT NULL AS flag");
            present.push(flag(conn, &exists).await?);
        }
        if !present.iter().all(|p| *p) {
            // A day without some of its partitions: a drop by an earlier version, cut short.
            drop_remains(conn, &names).await?;
            expired.dropped += 1;
            continue;
        }
        match expire_day(conn, names).await? {
            DayExpired::Dropped => expired.dropped += 1,
            DayExpired::Emptied(kept) => {
                expired.emptied += 1;
                expired.kept += kept;
            }
            DayExpired::Unchanged => {}
        }
    }
    Ok(expired)
}

/// What expiring one day did.
enum DayExpired {
    /// Nothing was to be kept: its partitions are dropped.
    Dropped,
    /// Emptied but for this many unfinished deliveries.
    Emptied(i64),
    /// It holds only what is kept.
    Unchanged,
}

/// In one transaction, with the three tables locked (nothing reads or writes them until it
/// commits, so no delivery can be made in the day after it looked), sets aside the day's
/// unfinished deliveries, their attempts and their events, and any event an unpublished outbox
/// row still announces; drops the day's partitions (`names`: events, deliveries, attempts) when
/// there is none, or else truncates them and writes back what was set aside.
async fn expire_day(
    conn: &mut AsyncPgConnection,
    names: Vec<String>,
) -> Result<DayExpired, DbError> {
    with_lock_retries(conn, DAILY, |conn| {
        let names = names.clone();
        Box::pin(async move {
            let (events, deliveries, attempts) = (&names[0], &names[1], &names[2]);
            conn.transaction::<_, DbError, _>(async |conn| {
                // The parents first, as the services' statements take them; dropping a
                // partition locks its parent too.
                conn.batch_execute(&format!(
                    "LOCK TABLE events, deliveries, attempts IN ACCESS EXCLUSIVE MODE;
                     CREATE TEMP TABLE kept_deliveries ON COMMIT DROP AS
                         SELECT * FROM {deliveries} d WHERE {UNFINISHED};
                     CREATE TEMP TABLE kept_events ON COMMIT DROP AS
                         SELECT * FROM {events} e WHERE e.id = ANY (ARRAY(
                             SELECT event_id FROM kept_deliveries UNION {ANNOUNCED}));"
                ))
                .await?;
                let kept = count(
                    conn,
                    "SELECT (SELECT count(*) FROM kept_deliveries)
                         + (SELECT count(*) FROM kept_events) AS count",
                )
                .await?;
                if kept == 0 {
                    conn.batch_execute(&format!("DROP TABLE {events}, {deliveries}, {attempts}"))
                        .await?;
                    return Ok(DayExpired::Dropped);
                }
                // Something besides what is kept: a finished delivery, or an event without one.
                let more = flag(conn, &format!(
                    "SELECT EXISTS (SELECT 1 FROM {deliveries} WHERE state = 'succeeded')
                         OR EXISTS (SELECT 1 FROM {deliveries} WHERE state = 'failed')
                         OR EXISTS (SELECT 1 FROM {events} e
                             WHERE e.id NOT IN (SELECT k.id FROM kept_events k))
                         AS flag"
                ))
                .await?;
                if !more {
                    return Ok(DayExpired::Unchanged);
                }
                conn.batch_execute(&format!(
                    "CREATE TEMP TABLE kept_attempts ON COMMIT DROP AS
                         SELECT * FROM {attempts} WHERE delivery_id IN (SELECT id FROM kept_deliveries);
                     TRUNCATE {events}, {deliveries}, {attempts};
                     INSERT INTO {events} SELECT * FROM kept_events;
                     INSERT INTO {deliveries} SELECT * FROM kept_deliveries;
                     INSERT INTO {attempts} SELECT * FROM kept_attempts;"
                ))
                .await?;
                let kept =
                    count(conn, &format!("SELECT count(*) AS count FROM {deliveries}")).await?;
                Ok(DayExpired::Emptied(kept))
            })
            .await
        })
    })
    .await
}

/// An unfinished delivery (`d`): kept when its day expires.
const UNFINISHED: &str = "d.state IN ('pending', 'retrying', 'waiting')";
/// The events that an outbox row still to publish announces: kept for the relay. The events
/// kept are looked up by id among these and the unfinished deliveries' (`id = ANY (ARRAY(..))`,
/// an index lookup). Written as `id IN (..) OR id IN (..)`, PostgreSQL read the day's events
/// whole with the delivery log locked: 78 ms for 55 000 events, 4.5 ms by id. Beside a 200/s
/// load (pgbench, 5 M aged deliveries), a day's removal then held a statement up to 108-231 ms
/// (five passes); by id, 24 and 27.5 ms.
const ANNOUNCED: &str = "SELECT (convert_from(o.payload, 'UTF8')::jsonb ->> 'event_id')::uuid \
     FROM outbox o WHERE o.published_at IS NULL AND o.topic = 'event'";

/// Drops what is left of a day an earlier version began to drop partition by partition
/// (detaching each without blocking) and did not finish: a detach under way is finished first.
async fn drop_remains(conn: &mut AsyncPgConnection, names: &[String]) -> Result<(), DbError> {
    for ((table, _), name) in TABLES.iter().zip(names) {
        let pending: Vec<Flag> = diesel::sql_query(format!(
            "SELECT i.inhdetachpending AS flag FROM pg_inherits i \
             WHERE i.inhrelid = to_regclass('{name}') AND i.inhparent = '{table}'::regclass"
        ))
        .load(conn)
        .await?;
        if pending.into_iter().next().is_some_and(|row| row.flag) {
            conn.batch_execute(&format!(
                "ALTER TABLE {table} DETACH PARTITION {name} FINALIZE"
            ))
            .await?;
        }
        let drop = format!("DROP TABLE IF EXISTS {name}");
        with_lock_retries(conn, DAILY, |conn| {
            let drop = drop.clone();
            Box::pin(async move {
                conn.transaction::<_, DbError, _>(async |conn| {
                    conn.batch_execute(&drop).await?;
                    Ok(())
                })
                .await
            })
        })
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::Time;

    #[test]
    fn a_day_is_the_range_of_its_uuidv7s() {
        let day = time::macros::date!(2026 - 11 - 27);
        let noon = day
            .with_time(Time::from_hms(12, 0, 0).unwrap())
            .assume_utc();
        let millis = (noon.unix_timestamp_nanos() / 1_000_000) as u64;
        let id = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            millis / 1000,
            ((millis % 1000) * 1_000_000) as u32,
        ));
        assert!(day_floor(day) <= id);
        assert!(id < day_floor(day + time::Duration::DAY));
        assert_eq!(
            day_floor(day).to_string(),
            "01a21a4d-4000-0000-0000-000000000000"
        );
    }

    #[test]
    fn retention_waits_50_ms_for_ten_tries_then_doubles_to_half_a_second_and_the_reshape_500() {
        let millis = |wait, tries| lock_timeout(wait, tries).as_millis();
        let daily: Vec<u128> = (1..=16).map(|tries| millis(DAILY, tries)).collect();
        assert_eq!(
            daily,
            [50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 100, 200, 400, 500, 500, 500]
        );
        assert_eq!(millis(DAILY, LOCK_TRIES), 500);
        for tries in [1, 11, 14, LOCK_TRIES] {
            assert_eq!(millis(RESHAPE, tries), 500);
        }
        assert!(
            LONGEST_LOCK_TIMEOUT < Duration::from_secs(1),
            "below deadlock_timeout"
        );
    }

    #[test]
    fn partition_names_carry_their_day() {
        let day = time::macros::date!(2026 - 01 - 05);
        assert_eq!(partition_name("events", day), "events_20260105");
        assert_eq!(before_name("deliveries", day), "deliveries_before_20260105");
        assert_eq!(name_day("deliveries_before_20260105"), Some(day));
        assert_eq!(name_day("attempts_20260105"), Some(day));
        assert_eq!(name_day("attempts_legacy"), None);
    }
}
