//! Errors classified by cause, against the real server: an outage (a lost connection, a server
//! stopping, a deadlock, a timeout) is transient and tried again; anything else is the item's
//! own error. And one poison item in a batch fails alone: the batchers of ingest (alerts),
//! claims, outcomes and the fan-out run each statement through `run_batch`, which gives every
//! other item of the batch its answer. The poison is what PostgreSQL really refuses: a NUL in a
//! text, or a row a trigger of the test's own database refuses.

use std::time::Duration;

use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tocsin_domain::alerts::AlertAction;
use tocsin_storage::attempts::{self, Claim, Trigger};
use tocsin_storage::incidents::{self, AlertBody};
use tocsin_storage::outbox::Wake;
use tocsin_storage::{fan_out, run_batch, DbError};
use tocsin_testkit::deliveries::{answered, claim_rules};
use tocsin_testkit::TestDb;

use crate::common::{
    claim_auto, completion, delivery_to, fan_out_request, open, signal, webhook_for_every_event,
    PENDING,
};

/// The error a statement gets from the server.
async fn error_of(conn: &mut AsyncPgConnection, sql: &str) -> DbError {
    diesel::sql_query(sql)
        .execute(conn)
        .await
        .map(|_| ())
        .map_err(DbError::from)
        .expect_err(sql)
}

#[tokio::test]
async fn the_items_own_errors_are_permanent() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    for sql in [
        "SELECT 1/0",
        "SELECT * FROM no_such_table",
        "DO $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$",
        "SELECT 'x'::int",
        "INSERT INTO webhooks (id) VALUES (NULL)",
    ] {
        let error = error_of(&mut conn, sql).await;
        assert!(!error.is_transient(), "{sql}: {error}");
    }
    // A NUL in a text parameter: what a receiver's body held before it was made storable.
    let error = diesel::sql_query("SELECT $1::text")
        .bind::<Text, _>("a\0b")
        .execute(&mut conn)
        .await
        .map_err(DbError::from)
        .unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("0x00"), "{error}");
}

#[tokio::test]
async fn outages_and_lost_races_are_transient() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    // A statement timeout (the statement waits for a lock another session holds), and a lock
    // not available.
    let mut holder = AsyncPgConnection::establish(&db.url).await.unwrap();
    holder
        .batch_execute("SELECT pg_advisory_lock(7), pg_advisory_lock(8)")
        .await
        .unwrap();
    conn.batch_execute("SET statement_timeout = 50")
        .await
        .unwrap();
    let error = error_of(&mut conn, "SELECT pg_advisory_lock(7)").await;
    assert!(error.to_string().contains("statement timeout"), "{error}");
    assert!(error.is_transient(), "{error}");
    conn.batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();
    holder
        .batch_execute("BEGIN; LOCK TABLE webhooks IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let error = DbError::from(
        conn.batch_execute("BEGIN; LOCK TABLE webhooks IN ACCESS SHARE MODE NOWAIT")
            .await
            .unwrap_err(),
    );
    assert!(error.is_transient(), "{error}");
    conn.batch_execute("ROLLBACK").await.unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();

    // A deadlock: two transactions each wait for the other's lock; the server ends one.
    let mut a = AsyncPgConnection::establish(&db.url).await.unwrap();
    let mut b = AsyncPgConnection::establish(&db.url).await.unwrap();
    a.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(1)")
        .await
        .unwrap();
    b.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(2)")
        .await
        .unwrap();
    let (first, second) = tokio::join!(
        a.batch_execute("SELECT pg_advisory_xact_lock(2)"),
        b.batch_execute("SELECT pg_advisory_xact_lock(1)"),
    );
    let error = DbError::from(first.err().or(second.err()).expect("one deadlocked"));
    assert!(error.to_string().contains("deadlock"), "{error}");
    assert!(error.is_transient(), "{error}");

    // The server ends the connection (a shutdown, an operator's pg_terminate_backend).
    let pid: i32 = diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>(
        "pg_backend_pid()",
    ))
    .get_result(&mut conn)
    .await
    .unwrap();
    // A statement that waits for the lock `holder` keeps, until the server ends its session.
    let waiting =
        tokio::spawn(async move { error_of(&mut conn, "SELECT pg_advisory_lock(8)").await });
    tocsin_testkit::wait_until("the statement waits", crate::common::DEADLINE, || async {
        db.count(&format!(
            "pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock'"
        ))
        .await
            == 1
    })
    .await;
    diesel::sql_query(format!("SELECT pg_terminate_backend({pid})"))
        .execute(&mut holder)
        .await
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(error.is_transient(), "{error}");
}

/// Makes the test's database refuse, with an error of its own, any row of `table` whose
/// `column` is `value`.
async fn poison(db: &TestDb, table: &str, column: &str, value: &str) {
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    conn.batch_execute(&format!(
        "CREATE FUNCTION poison_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'poisoned row' USING ERRCODE = '22023'; END $$;
         CREATE TRIGGER poison_{table} BEFORE INSERT OR UPDATE ON {table}
         FOR EACH ROW WHEN (NEW.{column}::text = '{value}') EXECUTE FUNCTION poison_{table}();"
    ))
    .await
    .unwrap();
}

/// The answers of a batch with one poison item: that one fails with a permanent error, every
/// other has its answer.
fn one_poisoned<R: std::fmt::Debug>(answers: &[Result<R, DbError>], poisoned: usize) {
    for (i, answer) in answers.iter().enumerate() {
        if i == poisoned {
            let error = answer.as_ref().expect_err("the poison item fails");
            assert!(!error.is_transient(), "a permanent error: {error}");
        } else {
            assert!(answer.is_ok(), "item {i} goes on: {answer:?}");
        }
    }
}

#[tokio::test]
async fn a_poison_alert_fails_alone_in_its_batch() {
    let db = TestDb::new().await;
    poison(&db, "incidents", "dedup_key", "poison").await;
    let bodies: Vec<AlertBody> = ["a", "poison", "b"]
        .iter()
        .map(|key| vec![signal(key, AlertAction::Trigger)].into())
        .collect();
    let answers = run_batch(&db.pool(), &bodies, &|conn, bodies| {
        Box::pin(incidents::apply_alerts(conn, bodies, Wake::Listeners))
    })
    .await;
    one_poisoned(&answers, 1);
    assert_eq!(db.count("incidents").await, 2);
    assert_eq!(db.count("incidents WHERE dedup_key = 'poison'").await, 0);
}

#[tokio::test]
async fn a_poison_claim_fails_alone_in_its_batch() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "claims").await;
    let mut ids = Vec::new();
    for key in ["a", "poison", "b"] {
        ids.push(delivery_to(&mut conn, key, webhook.id).await);
    }
    poison(&db, "attempts", "delivery_id", &ids[1].to_string()).await;
    let claims: Vec<Claim> = ids
        .iter()
        .map(|&delivery_id| Claim {
            delivery_id,
            trigger: Trigger::Automatic,
            auto_attempts: 0,
        })
        .collect();
    let answers = run_batch(&db.pool(), &claims, &|conn, claims| {
        Box::pin(attempts::claim(conn, claims, claim_rules()))
    })
    .await;
    one_poisoned(&answers, 1);
    assert!(answers[0].as_ref().unwrap().is_some());
    assert!(answers[2].as_ref().unwrap().is_some());
    assert_eq!(db.count("attempts").await, 2);
}

#[tokio::test]
async fn a_poison_outcome_fails_alone_in_its_batch() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "outcomes").await;
    let mut completions = Vec::new();
    for key in ["a", "poison", "b"] {
        let id = delivery_to(&mut conn, key, webhook.id).await;
        let job = claim_auto(&mut conn, id, 0).await.unwrap();
        completions.push(completion(&job, answered(200)));
    }
    // A body PostgreSQL refuses: a NUL, as a receiver may send (the dispatcher makes bodies
    // storable first; the batch must not depend on it).
    completions[1].result.response_body = Some("bad\0body".into());
    let answers = run_batch(&db.pool(), &completions, &|conn, completions| {
        Box::pin(attempts::complete(conn, completions))
    })
    .await;
    one_poisoned(&answers, 1);
    assert_eq!(db.count("deliveries WHERE state = 'succeeded'").await, 2);
}

#[tokio::test]
async fn a_poison_event_fails_alone_in_its_fan_out_batch() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    webhook_for_every_event(&mut conn, "fan-out").await;
    let mut events = Vec::new();
    for key in ["a", "poison", "b"] {
        events.push(fan_out_request(&open(&mut conn, key).await, false));
    }
    poison(
        &db,
        "deliveries",
        "event_id",
        &events[1].event_id.to_string(),
    )
    .await;
    let answers = run_batch(&db.pool(), &events, &|conn, events| {
        Box::pin(fan_out::fan_out(conn, events, &[], PENDING))
    })
    .await;
    one_poisoned(&answers, 1);
    assert_eq!(db.count("deliveries").await, 2);
}

/// Every kind of failed attempt the domain names can be recorded: the table's CHECK admits each
/// (a kind it refused would be a permanent error, and the attempt would be left to the sweeper).
#[tokio::test]
async fn every_attempt_error_kind_of_the_domain_is_storable() {
    use tocsin_domain::delivery::AttemptError;
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = webhook_for_every_event(&mut conn, "kinds").await;
    for kind in AttemptError::ALL {
        let id = delivery_to(&mut conn, kind.as_str(), webhook.id).await;
        let job = claim_auto(&mut conn, id, 0).await.unwrap();
        let mut failed = completion(&job, answered(500));
        failed.result.error = Some(kind);
        attempts::complete(&mut conn, &[failed])
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", kind.as_str()));
    }
    assert_eq!(
        db.count("attempts WHERE error IS NOT NULL").await,
        AttemptError::ALL.len() as i64
    );
}
