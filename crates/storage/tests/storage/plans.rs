//! Plans: every statement reads the tables that grow by index, in an empty database and a large
//! one; a statement that finds rows by key reads them by key, however few rows the partial
//! indexes on the same table hold live; one given delivery ids reads only the day partitions
//! between the least and the greatest of them, and the fan-out none before the floor of its
//! reads. Each statement is planned as the services plan it
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
    // Around them, thousands of finished ones, as a log holds: the partial indexes stay small.
    fill(&mut conn, webhook.id).await;
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
    // As the dispatcher sends it, with today as the floor of its reads.
    let today_date = yesterday.next_day().unwrap();
    let sql = tocsin_storage::fan_out::statement_from(partitions::day_floor(today_date));
    execute(&mut conn, format!("PREPARE fan_out AS {sql}")).await;
    let arguments = ["NULL"; 9];
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
            && !plan.contains(&format!("_{before}")),
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

#[derive(diesel::QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
    line: String,
}

async fn explain(conn: &mut AsyncPgConnection, statement: String) -> String {
    let lines: Vec<PlanLine> = diesel::sql_query(statement).load(conn).await.unwrap();
    lines.into_iter().map(|l| l.line + "\n").collect()
}

/// Tables that grow with traffic: a plan that reads one of them whole would cost more every day.
const GROWING: [&str; 7] = [
    "incidents",
    "events",
    "deliveries",
    "attempts",
    "outbox",
    "webhook_outcomes",
    "audit_log",
];

/// The service statements the storage crate runs, each once on `conn`: its own SQL files
/// prepared by name, and the rest (built with diesel) run through the functions that use them.
async fn prepare_every_statement(conn: &mut AsyncPgConnection) {
    use std::time::Duration;
    use time::OffsetDateTime;
    use tocsin_storage::{
        audit, deliveries, health, incidents, outbox, replays, tokens, webhooks, Page,
    };

    for (file, sql) in SQL_FILES {
        let name = format!("file_{}", file.trim_end_matches(".sql"));
        execute(conn, format!("PREPARE {name} AS {sql}")).await;
    }
    let webhook = webhook_for_every_event(conn, "every statement").await;
    let id = delivery_to(conn, "every statement", webhook.id).await;
    let job = claim_auto(conn, id, 0).await.unwrap();
    complete(conn, completion(&job, answered(500)))
        .await
        .unwrap();
    let delivery = deliveries::get(conn, id).await.unwrap();
    let page = Page {
        limit: 50,
        cursor: None,
    };
    let next = Page {
        limit: 50,
        cursor: Some(tocsin_storage::Cursor {
            at: delivery.created_at,
            id,
        }),
    };
    let filters = [
        deliveries::DeliveryFilter::default(),
        deliveries::DeliveryFilter {
            webhook_id: Some(webhook.id),
            ..Default::default()
        },
        deliveries::DeliveryFilter {
            incident_id: Some(delivery.incident_id),
            ..Default::default()
        },
        deliveries::DeliveryFilter {
            state: Some(delivery.state),
            ..Default::default()
        },
    ];
    for filter in &filters {
        for page in [&page, &next] {
            deliveries::list(conn, filter, page).await.unwrap();
        }
    }
    deliveries::get_detail(conn, id).await.unwrap();
    let cursor = tocsin_storage::Cursor {
        at: OffsetDateTime::UNIX_EPOCH,
        id: uuid::Uuid::nil(),
    };
    deliveries::failed_page(conn, webhook.id, cursor, 50)
        .await
        .unwrap();
    deliveries::recover_disabled(conn, webhook.id, OffsetDateTime::UNIX_EPOCH, 50)
        .await
        .unwrap();
    deliveries::latest_for_webhooks(conn, &[webhook.id])
        .await
        .unwrap();
    deliveries::count_unfinished(conn).await.unwrap();
    deliveries::count_waiting(conn).await.unwrap();
    deliveries::claim_overdue(conn, Duration::from_secs(60), 50)
        .await
        .unwrap();
    incidents::get(conn, delivery.incident_id).await.unwrap();
    incidents::list(conn, &incidents::IncidentFilter::default(), &page)
        .await
        .unwrap();
    health::for_webhooks(conn, &[webhook.id]).await.unwrap();
    health::all(conn).await.unwrap();
    health::auto_disable(conn, Duration::from_secs(3600))
        .await
        .unwrap();
    audit::list(conn, &audit::AuditFilter::default(), &page)
        .await
        .unwrap();
    webhooks::list(conn, &page).await.unwrap();
    tokens::list(conn, &page).await.unwrap();
    outbox::backlog(conn).await.unwrap();
    outbox::last_id(conn).await.unwrap();
    outbox::mark_published(conn, &[1]).await.unwrap();
    outbox::release(conn, &[1]).await.unwrap();
    outbox::enqueue_attempt(conn, &[id], tocsin_domain::delivery::Trigger::Manual)
        .await
        .unwrap();
    incidents::change_status(
        conn,
        delivery.incident_id,
        tocsin_domain::IncidentStatus::Acknowledged,
    )
    .await
    .unwrap();
    let replay = replays::NewReplay {
        webhook_id: webhook.id,
        since: OffsetDateTime::UNIX_EPOCH,
        until: None,
        kinds: None,
    };
    replays::create(conn, &replay).await.unwrap();
    replays::advance(conn, 1000, Duration::from_secs(1))
        .await
        .unwrap();
}

/// Each named SQL file of the storage crate, as `(name, text)`.
macro_rules! sql_files {
    ($($file:literal),* $(,)?) => {
        [$(($file, include_str!(concat!("../../src/sql/", $file)))),*]
    };
}

/// Every SQL file of the storage crate.
const SQL_FILES: [(&str, &str); 20] = sql_files![
    "claim.sql",
    "claim_and_mark.sql",
    "claim_overdue.sql",
    "complete.sql",
    "failing_webhooks.sql",
    "fan_out.sql",
    "health.sql",
    "interrupted.sql",
    "next_in_order.sql",
    "open_all.sql",
    "prune_deliveries.sql",
    "prune_events.sql",
    "prune_outbox.sql",
    "prune_outcome_buckets.sql",
    "record_health.sql",
    "recover_disabled.sql",
    "stop.sql",
    "take_waiting.sql",
    "wait.sql",
    "waits_for.sql",
];

/// The plans of every statement prepared on `conn`, each planned generically (NULL for every
/// parameter), as `(statement, plan)`.
async fn plans_of_prepared(conn: &mut AsyncPgConnection) -> Vec<(String, String)> {
    #[derive(diesel::QueryableByName)]
    struct Prepared {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        statement: String,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        parameters: i32,
    }
    let prepared: Vec<Prepared> = diesel::sql_query(
        "SELECT name, statement, cardinality(parameter_types) AS parameters \
         FROM pg_prepared_statements ORDER BY name",
    )
    .load(conn)
    .await
    .unwrap();
    let mut plans = Vec::new();
    for p in prepared {
        let arguments = vec!["NULL"; p.parameters as usize].join(", ");
        let call = if arguments.is_empty() {
            p.name.clone()
        } else {
            format!("{}({arguments})", p.name)
        };
        let lines: Result<Vec<PlanLine>, _> = diesel::sql_query(format!("EXPLAIN EXECUTE {call}"))
            .load(conn)
            .await;
        match lines {
            Ok(lines) => {
                let plan = lines.into_iter().map(|l| l.line + "\n").collect();
                plans.push((p.statement, plan));
            }
            // A statement diesel does not keep is closed once the next one runs.
            Err(error) if error.to_string().contains("does not exist") => {}
            Err(error) => panic!("planning {}: {error}", p.statement),
        }
    }
    plans
}

/// The growing tables a plan reads whole.
fn full_scans(plan: &str) -> Vec<String> {
    plan.lines()
        .filter_map(|line| line.split("Seq Scan on ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|table| {
            GROWING
                .iter()
                .any(|g| *table == *g || table.starts_with(&format!("{g}_")))
        })
        .map(str::to_owned)
        .collect()
}

/// Fills the growing tables to tens of thousands of rows each, today's partitions among them,
/// with `tocsin-bench aged`'s generator, and gives them statistics.
async fn fill(conn: &mut AsyncPgConnection, webhook: uuid::Uuid) {
    use tocsin_storage::partitions;
    let today = time::OffsetDateTime::now_utc().date();
    for ago in 0..3 {
        let day = today - time::Duration::days(ago);
        for (table, _) in partitions::TABLES {
            partitions::make_day(conn, table, day).await.unwrap();
        }
        // Through today's end for today: ids (and partitions) of today only.
        let start = day.midnight().assume_utc();
        execute(
            conn,
            include_str!("../../../bench/src/aged_fill.sql")
                .replace("$1", &format!("'{start}'::timestamptz"))
                .replace("$2", "10000")
                .replace("$3", &format!("ARRAY['{webhook}']::uuid[]"))
                .replace("$4", "0.05"),
        )
        .await;
    }
    for sql in [
        "INSERT INTO outbox (topic, headers, payload, created_at, published_at) \
         SELECT 'event', '{}', '\\x', now() - n * interval '1 s', now() - n * interval '1 s' \
         FROM generate_series(1, 50000) n"
            .to_owned(),
        format!(
            "INSERT INTO webhook_outcomes (webhook_id, bucket, successes, failures) \
             SELECT '{webhook}', now() - n * interval '1 minute', 1, 0 \
             FROM generate_series(1, 20000) n"
        ),
        "INSERT INTO audit_log (id, created_at, actor_kind, actor_name, surface, action, \
         resource_type) SELECT gen_random_uuid(), now() - n * interval '1 s', 'cli', 'cli', \
         'cli', 'webhook.update', 'webhook' FROM generate_series(1, 20000) n"
            .to_owned(),
    ] {
        execute(conn, sql).await;
    }
    // Statistics as autovacuum gives them: to the tables (and partitions) that hold rows. It
    // never vacuums an empty partition ahead, whose size the planner then takes as that of a
    // table never vacuumed (ten pages) until rows come and autovacuum analyzes it.
    #[derive(diesel::QueryableByName)]
    struct Named {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    #[derive(diesel::QueryableByName)]
    struct Filled {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        filled: bool,
    }
    let tables: Vec<Named> = diesel::sql_query(
        "SELECT relname::text AS name FROM pg_class \
         WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace",
    )
    .load(conn)
    .await
    .unwrap();
    for Named { name } in tables {
        let Filled { filled } =
            diesel::sql_query(format!("SELECT EXISTS (SELECT FROM {name}) AS filled"))
                .get_result(conn)
                .await
                .unwrap();
        if filled {
            execute(conn, format!("VACUUM ANALYZE {name}")).await;
        }
    }
}

/// Every statement, planned as the services plan it, reads the growing tables by index both in
/// a new database (tables and partitions empty, never vacuumed) and in one whose tables hold
/// tens of thousands of rows with statistics (and whose partitions ahead are empty), without
/// forcing it: `SESSION_SETTINGS` leaves sequential scans on.
#[tokio::test]
async fn every_statement_reads_growing_tables_by_index_empty_or_large() {
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/sql"))
        .unwrap()
        .count();
    assert_eq!(
        files,
        SQL_FILES.len(),
        "an SQL file is missing from SQL_FILES"
    );
    let db = TestDb::new().await;
    // One connection, so that every statement is prepared in the session whose plans are read.
    let pool = tocsin_storage::pool(&db.url, 1).unwrap();
    let mut conn = pool.get().await.unwrap();
    prepare_every_statement(&mut conn).await;
    let mut scans = Vec::new();
    let empty = plans_of_prepared(&mut conn).await;
    let webhook = webhook_for_every_event(&mut conn, "large").await;
    fill(&mut conn, webhook.id).await;
    // ANALYZE made every plan stale: each is made again, on the large tables.
    let large = plans_of_prepared(&mut conn).await;
    assert!(empty.len() > SQL_FILES.len() && large.len() >= empty.len());
    for (size, plans) in [("empty", empty), ("large", large)] {
        // These two prune a delivery log not yet reshaped into day partitions, never this one.
        let legacy = |statement: &str| {
            statement.contains("file_prune_deliveries") || statement.contains("file_prune_events")
        };
        for (statement, plan) in plans.into_iter().filter(|(s, _)| !legacy(s)) {
            let tables = full_scans(&plan);
            if !tables.is_empty() {
                scans.push(format!(
                    "{size}: reads {tables:?} whole:\n{statement}\n{plan}"
                ));
            }
        }
    }
    assert!(scans.is_empty(), "{}", scans.join("\n-----\n"));
}
