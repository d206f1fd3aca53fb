//! Plans: a statement that finds rows by key reads them by key, however few rows the partial
//! indexes on the same table hold live; one given delivery ids reads only the day partitions
//! between the least and the greatest of them, and the fan-out none before the floor of its reads. Each statement is planned as the services plan it
//! (once per connection, generically), after statistics that make those indexes look cheap; a
//! plan through one of them would visit every entry left since the index's last vacuum, on every
//! call (see `tocsin_storage::SESSION_SETTINGS`).

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tocsin_testkit::deliveries::answered;
use tocsin_testkit::TestDb;

use crate::common::{
    claim_auto, complete, completion, delivery_to, execute, webhook_for_every_event,
};

/// Each statement, its parameters before the bounds of its ids, whether it takes those bounds,
/// the partial index it must not read and its table's key (as each day's partition names them:
/// `attempts_20261127_under_way`, `attempts_20261127_pkey`).
const BY_KEY: [(&str, &str, usize, bool, &str, &str); 3] = [
    (
        "complete.sql",
        include_str!("../../src/sql/complete.sql"),
        13,
        true,
        "_under_way",
        "_pkey",
    ),
    (
        "wait.sql",
        include_str!("../../src/sql/wait.sql"),
        3,
        true,
        "_due",
        "_pkey",
    ),
    (
        "waits_for.sql",
        include_str!("../../src/sql/waits_for.sql"),
        1,
        false,
        "_waiting",
        "_pkey",
    ),
];

/// The statements given delivery ids, with their parameters before the bounds of those ids.
const BOUNDED: [(&str, &str, usize); 4] = [
    ("claim.sql", include_str!("../../src/sql/claim.sql"), 6),
    (
        "complete.sql",
        include_str!("../../src/sql/complete.sql"),
        13,
    ),
    ("wait.sql", include_str!("../../src/sql/wait.sql"), 3),
    ("stop.sql", include_str!("../../src/sql/stop.sql"), 2),
];

/// Arguments for `EXECUTE`: `parameters` NULLs, then, when `bounded`, bounds that hold only ids
/// of this instant (today's partition).
fn arguments(parameters: usize, bounded: bool) -> String {
    let mut arguments = vec!["NULL"; parameters];
    if bounded {
        arguments.extend(["uuid_v7(now())", "uuid_v7(now())"]);
    }
    arguments.join(", ")
}

/// Today's and tomorrow's partition suffixes (`20261127`).
fn days() -> (String, String) {
    let day = |d: time::Date| format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day());
    let today = time::OffsetDateTime::now_utc().date();
    (day(today), day(today.next_day().unwrap()))
}

#[tokio::test]
async fn statements_that_find_rows_by_key_read_them_by_key() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    // 40 deliveries: 34 succeeded, 4 with their first attempt under way, 2 due, none waiting.
    let webhook = webhook_for_every_event(&mut conn, "by key").await;
    for n in 0..40 {
        let id = delivery_to(&mut conn, &format!("by key {n}"), webhook.id).await;
        if n < 38 {
            let job = claim_auto(&mut conn, id, 0).await.unwrap();
            if n >= 4 {
                complete(&mut conn, completion(&job, answered(200)))
                    .await
                    .unwrap();
            }
        }
    }
    execute(&mut conn, "ANALYZE deliveries, attempts".into()).await;
    let (today, _) = days();
    for (file, sql, parameters, bounded, partial, key) in BY_KEY {
        let name = file.trim_end_matches(".sql");
        execute(&mut conn, format!("PREPARE {name} AS {sql}")).await;
        let arguments = arguments(parameters, bounded);
        let plan = explain(&mut conn, format!("EXPLAIN EXECUTE {name}({arguments})")).await;
        assert!(
            plan.contains(&format!("_{today}{key}")) && !plan.contains(partial),
            "{file} does not find its rows by key ({key}):\n{plan}"
        );
    }
}

#[tokio::test]
async fn statements_given_delivery_ids_read_only_the_days_between_them() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let (today, tomorrow) = days();
    for (file, sql, parameters) in BOUNDED {
        let name = file.trim_end_matches(".sql");
        execute(&mut conn, format!("PREPARE {name} AS {sql}")).await;
        let arguments = arguments(parameters, true);
        let plan = explain(&mut conn, format!("EXPLAIN EXECUTE {name}({arguments})")).await;
        // The other days' partitions are removed when the plan starts (an update still names
        // them as its targets); the claim's check for an unfinished earlier delivery of the
        // incident (ordered webhooks) reads every day.
        let kept = |table: &str| {
            plan.lines()
                .any(|line| line.contains("Scan") && line.contains(&format!("{table}_{tomorrow}")))
        };
        assert!(
            plan.contains(&format!("deliveries_{today}"))
                && plan.contains("Subplans Removed")
                && (file == "claim.sql"
                    || ["events", "deliveries", "attempts"]
                        .iter()
                        .all(|t| !kept(t))),
            "{file} reads other days than its ids':\n{plan}"
        );
    }
}

#[tokio::test]
async fn the_fan_out_reads_no_day_before_the_floor_of_its_reads() {
    use tocsin_storage::partitions;

    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let yesterday = time::OffsetDateTime::now_utc()
        .date()
        .previous_day()
        .unwrap();
    for (table, _) in partitions::TABLES {
        partitions::make_day(&mut conn, table, yesterday)
            .await
            .unwrap();
    }
    let sql = include_str!("../../src/sql/fan_out.sql");
    execute(&mut conn, format!("PREPARE fan_out AS {sql}")).await;
    let mut arguments = vec!["NULL"; 9];
    arguments.push("uuid_v7(now())");
    let plan = explain(
        &mut conn,
        format!("EXPLAIN EXECUTE fan_out({})", arguments.join(", ")),
    )
    .await;
    let (today, _) = days();
    let day = |d: time::Date| format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day());
    let before = day(yesterday);
    assert!(
        plan.contains(&format!("events_{today}"))
            && plan.contains(&format!("deliveries_{today}"))
            && plan.contains("Subplans Removed")
            && !plan
                .lines()
                .any(|line| line.contains("Scan") && line.contains(&format!("_{before}"))),
        "the fan-out reads a day before the floor of its reads:\n{plan}"
    );
}

#[tokio::test]
async fn the_relays_claim_starts_at_its_floor() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let sql = include_str!("../../src/sql/claim_and_mark.sql");
    execute(&mut conn, format!("PREPARE claim_and_mark AS {sql}")).await;
    let plan = explain(
        &mut conn,
        "EXPLAIN EXECUTE claim_and_mark(500, now(), 1000)".into(),
    )
    .await;
    // Where the index of unpublished rows starts, not a filter on what it read from the first.
    assert!(
        plan.lines().any(|line| line.contains("outbox_unpublished"))
            && plan
                .lines()
                .any(|line| line.contains("Index Cond: (id >= ")),
        "the claim reads the outbox from its first row:\n{plan}"
    );
}

async fn explain(conn: &mut AsyncPgConnection, statement: String) -> String {
    #[derive(diesel::QueryableByName)]
    struct PlanLine {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let lines: Vec<PlanLine> = diesel::sql_query(statement).load(conn).await.unwrap();
    lines.into_iter().map(|l| l.line + "\n").collect()
}
