//! Webhook health: how a webhook's target has been answering. Each dispatcher tallies the
//! outcomes it records ([`Tally`]) and writes the tallies once a second ([`record`]) into
//! `webhook_health` and the five-minute `webhook_outcomes` buckets, so that reading health never
//! scans the attempt log and recording an attempt never waits for another on a webhook's health
//! row. Auto-disable reads it too.

use std::collections::HashMap;
use std::time::Duration;

use diesel::sql_types::{BigInt, Double, Int4, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::deliveries::millis;
use crate::statement::Statement;
use crate::webhooks::set_enabled;
use crate::DbError;

type SqlUuid = diesel::sql_types::Uuid;

/// The windows of the success rates: the last hour and the last day, each made of the
/// five-minute buckets that began within it (so the last 55 to 60 minutes, and 23 h 55 min to
/// 24 h).
pub const RATE_WINDOWS: [time::Duration; 2] = [time::Duration::HOUR, time::Duration::DAY];

/// One dispatcher's tally of a webhook's attempt outcomes since its last [`record`], in the
/// order they were recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub successes: i32,
    pub failures: i32,
    /// Failures after the last success of the tally (all of them without one).
    pub trailing_failures: i32,
    pub last_success_at: Option<OffsetDateTime>,
    pub last_failure_at: Option<OffsetDateTime>,
    /// The first of the trailing failures.
    pub failing_since: Option<OffsetDateTime>,
    pub last_error: Option<String>,
}

impl Tally {
    /// Adds an outcome recorded at `at`; `error` describes a failure.
    pub fn add(&mut self, success: bool, error: Option<String>, at: OffsetDateTime) {
        if success {
            self.successes += 1;
            self.trailing_failures = 0;
            self.failing_since = None;
            self.last_success_at = Some(at);
        } else {
            self.failures += 1;
            self.trailing_failures += 1;
            self.failing_since.get_or_insert(at);
            self.last_failure_at = Some(at);
            self.last_error = error.or(self.last_error.take());
        }
    }
}

impl Tally {
    /// This tally followed by `newer` (outcomes recorded after it), as one.
    pub fn followed_by(mut self, newer: Option<Tally>) -> Tally {
        let Some(newer) = newer else {
            return self;
        };
        self.successes += newer.successes;
        self.failures += newer.failures;
        if newer.last_success_at.is_some() {
            self.trailing_failures = newer.trailing_failures;
            self.failing_since = newer.failing_since;
            self.last_success_at = newer.last_success_at;
        } else {
            self.trailing_failures += newer.trailing_failures;
            self.failing_since = self.failing_since.or(newer.failing_since);
        }
        self.last_failure_at = newer.last_failure_at.or(self.last_failure_at);
        self.last_error = newer.last_error.or(self.last_error);
        self
    }
}

/// Writes tallies of several webhooks (see `sql/record_health.sql`).
pub async fn record(
    conn: &mut AsyncPgConnection,
    tallies: &[(Uuid, Tally)],
) -> Result<(), DbError> {
    use diesel::sql_types::Array;
    if tallies.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&Tally) -> i32| -> Vec<i32> { tallies.iter().map(|(_, t)| f(t)).collect() };
    let times = |f: fn(&Tally) -> Option<OffsetDateTime>| -> Vec<Option<OffsetDateTime>> {
        tallies.iter().map(|(_, t)| f(t)).collect()
    };
    let ids: Vec<Uuid> = tallies.iter().map(|(id, _)| *id).collect();
    let errors: Vec<Option<&str>> = tallies
        .iter()
        .map(|(_, t)| t.last_error.as_deref())
        .collect();
    Statement::new(include_str!("sql/record_health.sql"))
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Int4>, _>(column(|t| t.successes))
        .bind::<Array<Int4>, _>(column(|t| t.failures))
        .bind::<Array<Int4>, _>(column(|t| t.trailing_failures))
        .bind::<Array<Nullable<Timestamptz>>, _>(times(|t| t.last_success_at))
        .bind::<Array<Nullable<Timestamptz>>, _>(times(|t| t.last_failure_at))
        .bind::<Array<Nullable<Timestamptz>>, _>(times(|t| t.failing_since))
        .bind::<Array<Nullable<Text>>, _>(&errors)
        .execute(conn)
        .await?;
    Ok(())
}

/// A webhook's health. Interrupted attempts (their dispatcher stopped) are not the target's
/// doing and do not count.
#[derive(Debug, Clone, Default, PartialEq, QueryableByName)]
pub struct WebhookHealth {
    /// Failed attempts since the last successful one.
    #[diesel(sql_type = Int4)]
    pub consecutive_failures: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_success_at: Option<OffsetDateTime>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_failure_at: Option<OffsetDateTime>,
    /// The last failure's error kind and detail (`http_status: the target answered 500`).
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    /// Successful attempts over all attempts in the last hour; `None` without any.
    #[diesel(sql_type = Nullable<Double>)]
    pub success_rate_1h: Option<f64>,
    /// The same over the last 24 hours.
    #[diesel(sql_type = Nullable<Double>)]
    pub success_rate_24h: Option<f64>,
}

#[derive(QueryableByName)]
struct HealthRow {
    #[diesel(sql_type = SqlUuid)]
    webhook_id: Uuid,
    #[diesel(embed)]
    health: WebhookHealth,
}

/// The health of each given webhook (one without any attempt yet has the default).
pub async fn for_webhooks(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, WebhookHealth>, DbError> {
    let rows: Vec<HealthRow> = Statement::new(include_str!("sql/health.sql"))
        .bind::<diesel::sql_types::Array<SqlUuid>, _>(ids)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| (r.webhook_id, r.health)).collect())
}

/// The health of every webhook not deleted, for the metrics: id, enabled, health.
pub async fn all(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<(Uuid, bool, WebhookHealth)>, DbError> {
    use crate::schema::webhooks::dsl;
    use diesel::{ExpressionMethods, QueryDsl};
    let webhooks: Vec<(Uuid, bool)> = dsl::webhooks
        .filter(dsl::deleted_at.is_null())
        .select((dsl::id, dsl::enabled))
        .load(conn)
        .await?;
    let ids: Vec<Uuid> = webhooks.iter().map(|(id, _)| *id).collect();
    let mut health = for_webhooks(conn, &ids).await?;
    Ok(webhooks
        .into_iter()
        .map(|(id, enabled)| (id, enabled, health.remove(&id).unwrap_or_default()))
        .collect())
}

/// A webhook auto-disable disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoDisabled {
    pub webhook_id: Uuid,
    pub reason: String,
}

#[derive(QueryableByName)]
struct FailingRow {
    #[diesel(sql_type = SqlUuid)]
    webhook_id: Uuid,
    #[diesel(sql_type = Int4)]
    consecutive_failures: i32,
    #[diesel(sql_type = Timestamptz)]
    failing_since: OffsetDateTime,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
}

/// Disables every enabled webhook that has failed without a single success for `after` or
/// longer: its failures span at least `after`, from the first failure after its last success
/// (or its enabling) to the latest one. Each is disabled as an operator's change disables it
/// (its unfinished deliveries stop), with a reason that gives the figures.
pub async fn auto_disable(
    conn: &mut AsyncPgConnection,
    after: Duration,
) -> Result<Vec<AutoDisabled>, DbError> {
    let failing: Vec<FailingRow> = Statement::new(include_str!("sql/failing_webhooks.sql"))
        .bind::<BigInt, _>(millis(after))
        .load(conn)
        .await?;
    let mut disabled = Vec::new();
    for row in failing {
        let since = row
            .failing_since
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut reason = format!(
            "disabled automatically: failing without a success since {since} ({} consecutive failures)",
            row.consecutive_failures
        );
        if let Some(error) = &row.last_error {
            reason.push_str("; last error: ");
            reason.push_str(error);
        }
        let now = OffsetDateTime::now_utc();
        let done = conn
            .transaction::<_, DbError, _>(async |conn| {
                // Locks the webhook first, then its deliveries (as an operator's disabling
                // does): never the health row, which recording an outcome locks after the
                // delivery's, so that the two cannot wait for each other.
                match set_enabled(conn, row.webhook_id, false, &reason, now).await {
                    Ok((_, true)) => {}
                    // Disabled already (by an operator, or by another dispatcher's pass that
                    // read the same row), or deleted meanwhile.
                    Ok((_, false)) | Err(DbError::NotFound) => return Ok(false),
                    Err(error) => return Err(error),
                }
                // A success recorded meanwhile clears `failing_since`: then it stays enabled.
                use crate::schema::webhook_health::dsl;
                use diesel::{ExpressionMethods, QueryDsl};
                let still: i64 = dsl::webhook_health
                    .filter(dsl::webhook_id.eq(row.webhook_id))
                    .filter(dsl::failing_since.eq(row.failing_since))
                    .count()
                    .get_result(conn)
                    .await?;
                if still == 0 {
                    // Rolls the disabling back.
                    return Err(DbError::Query(diesel::result::Error::RollbackTransaction));
                }
                Ok(true)
            })
            .await;
        let done = match done {
            Ok(done) => done,
            Err(DbError::Query(diesel::result::Error::RollbackTransaction)) => false,
            Err(error) => return Err(error),
        };
        if done {
            disabled.push(AutoDisabled {
                webhook_id: row.webhook_id,
                reason,
            });
        }
    }
    Ok(disabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(seconds)
    }

    #[test]
    fn a_tally_counts_the_failures_after_its_last_success() {
        let mut tally = Tally::default();
        tally.add(false, Some("timeout".into()), at(1));
        tally.add(true, None, at(2));
        tally.add(false, Some("connect".into()), at(3));
        tally.add(false, None, at(4));
        assert_eq!(
            (tally.successes, tally.failures, tally.trailing_failures),
            (1, 3, 2)
        );
        assert_eq!(tally.failing_since, Some(at(3)));
        assert_eq!(tally.last_success_at, Some(at(2)));
        assert_eq!(tally.last_failure_at, Some(at(4)));
        assert_eq!(tally.last_error.as_deref(), Some("connect"));
    }

    #[test]
    fn a_tally_put_back_before_newer_outcomes_reads_as_one() {
        let mut older = Tally::default();
        older.add(false, Some("timeout".into()), at(1));
        let mut failing = Tally::default();
        failing.add(false, Some("connect".into()), at(2));
        let joined = older.clone().followed_by(Some(failing));
        assert_eq!((joined.failures, joined.trailing_failures), (2, 2));
        assert_eq!(joined.failing_since, Some(at(1)));
        assert_eq!(joined.last_error.as_deref(), Some("connect"));
        let mut recovered = Tally::default();
        recovered.add(true, None, at(3));
        let joined = older.clone().followed_by(Some(recovered));
        assert_eq!((joined.trailing_failures, joined.failing_since), (0, None));
        assert_eq!(older.clone().followed_by(None), older);
    }
}
