//! Plans: a statement that finds rows by key reads them by key, however few rows the partial
//! indexes on the same table hold live. Each statement is planned as the services plan it (once
//! per connection, generically), after statistics that make those indexes look cheap; a plan
//! through one of them would visit every entry left since the index's last vacuum, on every
//! call (see `tocsin_storage::SESSION_SETTINGS`).

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tocsin_testkit::deliveries::answered;
use tocsin_testkit::TestDb;

use crate::common::{
    claim_auto, complete, completion, delivery_to, execute, webhook_for_every_event,
};

/// Each statement, its parameters, the partial index it must not read and its table's key (as
/// each day's partition names them: `attempts_20261127_under_way`, `attempts_20261127_pkey`).
const BY_KEY: [(&str, &str, usize, &str, &str); 3] = [
    (
        "complete.sql",
        include_str!("../../src/sql/complete.sql"),
        13,
        "_under_way",
        "_pkey",
    ),
    (
        "wait.sql",
        include_str!("../../src/sql/wait.sql"),
        3,
        "_due",
        "_pkey",
    ),
    (
        "waits_for.sql",
        include_str!("../../src/sql/waits_for.sql"),
        1,
        "_waiting",
        "_pkey",
    ),
];

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
    let today = time::OffsetDateTime::now_utc().date();
    let today = format!(
        "{:04}{:02}{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    for (file, sql, parameters, partial, key) in BY_KEY {
        let name = file.trim_end_matches(".sql");
        execute(&mut conn, format!("PREPARE {name} AS {sql}")).await;
        let nulls = vec!["NULL"; parameters].join(", ");
        let plan = explain(&mut conn, format!("EXPLAIN EXECUTE {name}({nulls})")).await;
        assert!(
            plan.contains(&format!("_{today}{key}")) && !plan.contains(partial),
            "{file} does not find its rows by key ({key}):\n{plan}"
        );
    }
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
