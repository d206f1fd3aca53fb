//! The built `tocsin-admin` binary: each CLI subcommand (tokens, migrate, deliveries, prune,
//! parked messages), its refusal to serve without a good admin token, and a clean stop on
//! SIGTERM. Commands run through the harness (`RunningAdmin::cli`), so that their changes are
//! held to the audit log under the CLI's actor.

use std::process::{Command, Stdio};

use diesel::sql_types::Uuid as SqlUuid;
use diesel_async::RunQueryDsl;
use reqwest::StatusCode;
use serde_json::json;
use time::OffsetDateTime;
use tocsin_broker::messages::DeliveryMessage;
use tocsin_broker::Outgoing;
use tocsin_domain::{AccessToken, EventKind};
use tocsin_storage::tokens;
use tocsin_testkit::{amqp_url, wait_for, wait_until, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;
use uuid::Uuid;

use crate::api::{
    id_of, rfc3339, seed_delivery, seed_failed_delivery, TestAdmin, ADMIN_TOKEN, DEADLINE,
};

/// A spawned binary, killed if the test ends before it exits.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The command for the built binary, with only the given environment.
fn binary(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tocsin-admin"));
    command.env_clear();
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

#[tokio::test]
async fn the_token_cli_prints_a_token_that_ingest_accepts() {
    let admin = TestAdmin::start().await;
    let url = admin.db.url.clone();
    let env = [("DATABASE_URL", url.as_str())];
    let (ok, stdout, stderr) = admin.cli(&env, None, &["token", "create", "--name", "grafana"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the token on stdout: {stdout:?}"
    );
    let presented = AccessToken::from_presented(stdout.trim()).expect("a well-formed token");
    let mut conn = admin.conn().await;
    let id = tokens::authenticate(&mut conn, &presented)
        .await
        .unwrap()
        .expect("the token is accepted");

    let (ok, listing, _) = admin.cli(&env, None, &["token", "list"]);
    assert!(ok);
    assert!(
        listing.contains(&id.to_string()) && listing.contains("grafana"),
        "{listing}"
    );
    assert!(!listing.contains(&stdout.trim()[17..]), "no secret listed");

    let (ok, _, _) = admin.cli(&env, None, &["token", "revoke", &id.to_string()]);
    assert!(ok);
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        None
    );
    let (ok, _, _) = admin.cli(&env, None, &["token", "revoke", &id.to_string()]);
    assert!(!ok, "revoking twice fails");

    let (ok, stdout, _) = admin.cli(&env, None, &["token", "create", "--name", ""]);
    assert!(!ok);
    assert!(stdout.is_empty());

    // A token bound to a source, with basic authentication.
    let (ok, stdout, stderr) = admin.cli(
        &env,
        None,
        &[
            "token",
            "create",
            "--name",
            "sns",
            "--source",
            "cloudwatch",
            "--basic-auth",
        ],
    );
    assert!(ok, "{stderr}");
    let presented = AccessToken::from_presented(stdout.trim()).unwrap();
    let live = tokens::authenticate_all(&mut conn, &[presented])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        live.source,
        Some(tocsin_domain::alerts::AlertFormat::CloudWatch)
    );
    assert!(live.basic_auth && !live.query_token);
    let (ok, _, stderr) = admin.cli(
        &env,
        None,
        &["token", "create", "--name", "x", "--source", "nagios"],
    );
    assert!(!ok);
    assert!(stderr.contains("--source"), "{stderr}");
    admin.stop().await;
}

/// Messages waiting in the delivery queue.
async fn waiting(broker: &tocsin_broker::Broker) -> u32 {
    let queue = broker.topology().delivery_queue();
    broker
        .queue_depths()
        .await
        .unwrap()
        .into_iter()
        .find_map(|(name, n)| (name == queue).then_some(n))
        .unwrap()
}

/// Runs the CLI with `env`; (success, stdout, stderr).
pub(crate) fn cli(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let output = binary(env).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_migrate_subcommand_applies_every_migration_then_none() {
    // migrate: on an empty database it applies every migration, then none.
    let empty = TestDb::empty().await;
    let env = [("DATABASE_URL", empty.url.as_str())];
    let (ok, _, said) = cli(&env, &["migrate"]);
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!(
            "applied {} migration(s)",
            tocsin_storage::migration_count()
        )),
        "{said}"
    );
    let (ok, _, said) = cli(&env, &["migrate"]);
    assert!(ok && said.contains("applied 0 migration(s)"), "{said}");
    let (ok, _, said) = cli(
        &[(
            "DATABASE_URL",
            "postgres://postgres:pw-not-shown@127.0.0.1:1/x",
        )],
        &["migrate"],
    );
    assert!(
        !ok && said.contains("DATABASE_URL") && !said.contains("pw-not-shown"),
        "{said}"
    );
}

#[tokio::test]
async fn the_deliveries_subcommands_list_retry_and_recover_failed_deliveries() {
    // deliveries failed | retry | recover, against the delivery log of a running admin.
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let failed = seed_failed_delivery(&mut conn, webhook).await;
    let (pending, _) = seed_delivery(
        &mut conn,
        webhook,
        EventKind::IncidentOpened,
        Uuid::now_v7(),
    )
    .await;
    let url = admin.db.url.clone();
    let env = [("DATABASE_URL", url.as_str())];
    let (ok, listing, said) = admin.cli(
        &env,
        None,
        &["deliveries", "failed", "--webhook", &webhook.to_string()],
    );
    assert!(ok, "{said}");
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines[0], "ID\tWEBHOOK\tEVENT\tINCIDENT\tATTEMPTS\tUPDATED");
    assert_eq!(lines.len(), 2, "only the failed delivery: {listing}");
    assert!(
        lines[1].starts_with(&format!("{failed}\t{webhook}\tincidents.opened\t")),
        "{listing}"
    );
    assert!(!listing.contains(&pending.to_string()));

    let (ok, _, said) = admin.cli(&env, None, &["deliveries", "retry", &failed.to_string()]);
    assert!(
        ok && said.contains(&format!("enqueued a manual attempt of delivery {failed}")),
        "{said}"
    );
    let rows = admin.manual_retry_outbox_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1["delivery_id"], failed.to_string());
    let (ok, _, said) = admin.cli(
        &env,
        None,
        &["deliveries", "retry", &Uuid::now_v7().to_string()],
    );
    assert!(!ok && said.contains("no delivery"), "{said}");
    // A succeeded delivery is final: the CLI refuses, as the API does.
    tocsin_testkit::deliveries::record_attempt(
        &mut conn,
        pending,
        tocsin_testkit::deliveries::answered(200),
    )
    .await;
    let (ok, _, said) = admin.cli(&env, None, &["deliveries", "retry", &pending.to_string()]);
    assert!(!ok && said.contains("succeeded already"), "{said}");
    assert_eq!(
        admin.manual_retry_outbox_rows().await.len(),
        1,
        "nothing enqueued"
    );

    let since = rfc3339(OffsetDateTime::now_utc() - time::Duration::hours(1));
    let (ok, count, said) = admin.cli(
        &env,
        None,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            &since,
        ],
    );
    assert!(ok, "{said}");
    assert_eq!(count.trim(), "1", "the one failed delivery: {said}");
    assert_eq!(admin.manual_retry_outbox_rows().await.len(), 2);
    let (ok, _, said) = admin.cli(
        &env,
        None,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &Uuid::now_v7().to_string(),
            "--since",
            &since,
        ],
    );
    assert!(!ok && said.contains("no webhook"), "{said}");
    let (ok, _, said) = admin.cli(
        &env,
        None,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            "yesterday",
        ],
    );
    assert!(!ok && said.contains("RFC 3339"), "{said}");
    let (status, _) = admin
        .patch(
            &format!("/api/v1/webhooks/{webhook}"),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (ok, _, said) = admin.cli(
        &env,
        None,
        &[
            "deliveries",
            "recover",
            "--webhook",
            &webhook.to_string(),
            "--since",
            &since,
        ],
    );
    assert!(!ok && said.contains("the webhook is disabled"), "{said}");
    let (ok, _, said) = admin.cli(&env, None, &["deliveries", "retry", &failed.to_string()]);
    assert!(!ok && said.contains("the webhook is disabled"), "{said}");
    assert_eq!(
        admin.manual_retry_outbox_rows().await.len(),
        2,
        "nothing enqueued for a disabled webhook"
    );
    admin.stop().await;
}

/// `prune` removes the days of the delivery log past the retention, but for their unfinished
/// deliveries, and keeps recent days whole.
#[tokio::test]
async fn the_prune_subcommand_removes_old_days_but_their_unfinished_deliveries() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let recent = seed_failed_delivery(&mut conn, webhook).await;
    // A day 40 days ago, with a failed delivery and a waiting one, each of an event of its own.
    let old_day = OffsetDateTime::now_utc().date() - time::Duration::days(40);
    for table in ["events", "deliveries", "attempts"] {
        tocsin_storage::partitions::make_day(&mut conn, table, old_day)
            .await
            .unwrap();
    }
    diesel::sql_query(
        "WITH e AS (
            INSERT INTO events (id, kind, incident_id, occurred_at, body)
            SELECT uuid_v7(occurred_at - interval '40 days'), kind, incident_id,
                occurred_at - interval '40 days', body
            FROM events, generate_series(1, 2)
            WHERE id = (SELECT event_id FROM deliveries WHERE id = $1)
            RETURNING id),
         d AS (
            INSERT INTO deliveries (id, webhook_id, event_id, event, incident_id, state,
                wait_reason, attempt_count, auto_attempts, created_at, updated_at)
            SELECT uuid_v7_sharing_time(e.id), d.webhook_id, e.id, d.event, d.incident_id,
                CASE WHEN row_number() OVER () = 1 THEN 'failed' ELSE 'waiting' END,
                CASE WHEN row_number() OVER () = 1 THEN NULL ELSE 'webhook_disabled' END,
                1, 1, now(), now()
            FROM e, deliveries d WHERE d.id = $1
            RETURNING id)
         INSERT INTO attempts (delivery_id, number, trigger, started_at, success, status_code,
             duration_ms, request_headers)
         SELECT id, 1, 'automatic', now(), false, 500, 12, '{}' FROM d",
    )
    .bind::<SqlUuid, _>(recent)
    .execute(&mut conn)
    .await
    .unwrap();
    let url = admin.db.url.clone();
    let env = [("DATABASE_URL", url.as_str())];
    let old = |state: &str| format!("deliveries WHERE state = '{state}' AND id < '{recent}'");
    assert_eq!(admin.count(&old("failed")).await, 1);

    let (ok, _, said) = admin.cli(&env, None, &["prune", "--retention", "30d"]);
    assert!(
        ok && said.contains(
            "pruned 0 days of the delivery log (1 more emptied but for 1 unfinished deliveries)"
        ),
        "{said}"
    );
    assert_eq!(
        admin.count(&old("failed")).await,
        0,
        "the old failed one goes"
    );
    assert_eq!(
        admin.count(&old("waiting")).await,
        1,
        "the old waiting one stays"
    );
    assert_eq!(
        admin
            .count(&format!("deliveries WHERE id = '{recent}'"))
            .await,
        1,
        "today is kept"
    );
    // Recorded in the audit log with what it removed.
    let (status, log) = admin.get("/api/v1/audit-log?action=delivery.prune").await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let after = &log["items"][0]["after"];
    assert_eq!(
        (&after["days_emptied"], &after["unfinished_kept"]),
        (&json!(1), &json!(1)),
        "{log}"
    );
    assert_eq!(log["items"][0]["actor"]["kind"], "cli", "{log}");
    admin.stop().await;
}

#[tokio::test]
async fn the_parked_subcommands_list_and_replay_the_parking_queue() {
    let admin = TestAdmin::start().await;
    let webhook = id_of(&admin.create_webhook("ops").await);
    let mut conn = admin.conn().await;
    let (pending, _) = seed_delivery(
        &mut conn,
        webhook,
        EventKind::IncidentOpened,
        Uuid::now_v7(),
    )
    .await;
    let url = admin.db.url.clone();

    // parked list | replay, on this admin's prefix.
    let amqp = amqp_url();
    let prefix = admin.prefix.prefix.clone();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("AMQP_URL", amqp.as_str()),
        ("TOCSIN_AMQP_PREFIX", prefix.as_str()),
    ];
    let broker = CommonConfig::new(&url, &amqp, &prefix).broker("test");
    let parked = DeliveryMessage {
        delivery_id: pending,
        webhook_id: None,
    };
    for body in [parked.to_bytes(), b"garbage".to_vec()] {
        broker
            .publish(Outgoing {
                exchange: broker.topology().parking_exchange(),
                routing_key: String::new(),
                body,
                headers: tocsin_broker::headers_from_json(&json!({"tocsin-parked-reason": "test"})),
            })
            .await
            .unwrap();
    }
    let (ok, listing, said) = admin.cli(&env, None, &["parked", "list"]);
    assert!(ok, "{said}");
    assert_eq!(
        listing,
        format!("KIND\tID\tREASON\tFROM\ndelivery\t{pending}\ttest\t-\nunreadable\t-\ttest\t-\n")
    );
    // The relay published what this test recorded (none of it an attempt); then one attempt
    // more, from parking.
    wait_until("the relay to publish every retry", DEADLINE, || async {
        admin.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;
    let before = waiting(&broker).await;
    let (ok, count, said) = admin.cli(&env, None, &["parked", "replay"]);
    assert!(ok, "{said}");
    assert_eq!(count.trim(), "1", "{said}");
    assert!(said.contains("1 unreadable message(s) left"), "{said}");
    let (_, listing, _) = admin.cli(&env, None, &["parked", "list"]);
    assert_eq!(
        listing.lines().count(),
        2,
        "only the unreadable one is left: {listing}"
    );
    let after = waiting(&broker).await;
    assert_eq!(
        after,
        before + 1,
        "the attempt is back in the delivery queue"
    );
    broker.close().await;
    admin.stop().await;
}

#[tokio::test]
async fn it_refuses_to_serve_without_a_good_admin_token() {
    let db = TestDb::new().await;
    let output = binary(&[
        ("DATABASE_URL", &db.url),
        ("TOCSIN_ADMIN_ADDR", "127.0.0.1:0"),
    ])
    .output()
    .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TOCSIN_ADMIN_TOKEN"));
    let output = binary(&[
        ("DATABASE_URL", &db.url),
        ("TOCSIN_ADMIN_ADDR", "127.0.0.1:0"),
        ("TOCSIN_ADMIN_TOKEN", "too-short"),
    ])
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TOCSIN_ADMIN_TOKEN"), "{stderr}");
    assert!(
        !stderr.contains("too-short"),
        "the token is not printed: {stderr}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_binary_cleanly() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let amqp = amqp_url();
    let mut child = Running(
        binary(&[
            ("DATABASE_URL", &db.url),
            ("AMQP_URL", &amqp),
            ("TOCSIN_AMQP_PREFIX", &prefix.prefix),
            ("TOCSIN_ADMIN_ADDR", &addr),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "3s"),
            ("TOCSIN_HTTP_WORKERS", "1"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let client = reqwest::Client::new();
    let healthz = format!("http://{addr}/healthz");
    wait_until("the binary to serve /healthz", DEADLINE, || async {
        client
            .get(&healthz)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_for("the binary to exit", DEADLINE, || {
        let exited = child.0.try_wait().unwrap();
        async move { exited }
    })
    .await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}
