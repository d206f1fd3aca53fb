//! Dispatchers share the work (docs/operations/scale.md, "Scaling dispatchers"): one ingest, one admin
//! and two dispatchers run as processes from the built binaries, with a database and an AMQP
//! prefix of their own. A webhook is created and an inbound token issued through the admin API;
//! a few hundred alerts go to ingest; every delivery reaches the loopback receiver, and each
//! dispatcher's `/metrics` shows that both did part of it, adding up to exactly the deliveries
//! expected. `deploy/local/scale-demo` shows the same with the release binaries.
//!
//! The binaries are looked up beside the test (`target/<profile>/`): `cargo nextest run
//! --workspace` builds them; with `cargo test -p tocsin-e2e`, run `cargo build -p tocsin-ingest
//! -p tocsin-dispatcher -p tocsin-admin` first.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_until, Receiver, ServiceProcess, TestDb,
    TestPrefix, FAST_RETRY_DELAYS,
};

const ALERTS: usize = 300;
const SENDERS: usize = 6;
const DEADLINE: Duration = Duration::from_secs(120);
const ADMIN_TOKEN: &str = "scaling-admin-token-0123456789";

async fn ready(client: &reqwest::Client, port: u16) {
    wait_until(
        &format!("the service on {port} to be ready"),
        Duration::from_secs(60),
        || async move {
            client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
}

/// The sum of the samples of `name` (all label values) whose line contains `filter`.
fn metric(text: &str, name: &str, filter: &str) -> u64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|line| line.contains(filter))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What one dispatcher's `/metrics` says it did.
#[derive(Debug, Default, Clone, Copy)]
struct Work {
    /// Deliveries this dispatcher finished as succeeded.
    succeeded: u64,
    /// Successful attempts it made.
    attempts: u64,
    /// First attempts it made (deliveries it started).
    first: u64,
}

async fn work(client: &reqwest::Client, port: u16) -> Work {
    let text = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("scraping a dispatcher")
        .text()
        .await
        .expect("metrics text");
    Work {
        succeeded: metric(
            &text,
            "tocsin_dispatcher_deliveries_finished_total",
            "state=\"succeeded\"",
        ),
        attempts: metric(
            &text,
            "tocsin_dispatcher_attempts_total",
            "outcome=\"success\"",
        ),
        first: metric(&text, "tocsin_dispatcher_event_lag_seconds_count", ""),
    }
}

#[tokio::test]
async fn two_dispatchers_share_the_deliveries() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let receiver = Receiver::start().await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let common = vec![
        ("DATABASE_URL", db.url.clone()),
        ("AMQP_URL", amqp_url()),
        ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
        ("TOCSIN_RETRY_DELAYS", FAST_RETRY_DELAYS.to_owned()),
        ("TOCSIN_DB_POOL_SIZE", "8".to_owned()),
        ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".to_owned()),
        ("TOKIO_WORKER_THREADS", "2".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ];
    let with = |extra: &[(&'static str, String)]| {
        let mut env = common.clone();
        env.extend_from_slice(extra);
        env
    };

    let admin_port = free_port();
    let mut admin = ServiceProcess::spawn(
        &binary("tocsin-admin"),
        &with(&[
            ("TOCSIN_ADMIN_ADDR", format!("127.0.0.1:{admin_port}")),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
            ("TOCSIN_HTTP_WORKERS", "2".to_owned()),
        ]),
    );
    let ingest_port = free_port();
    let mut ingest = ServiceProcess::spawn(
        &binary("tocsin-ingest"),
        &with(&[
            ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{ingest_port}")),
            ("TOCSIN_INGEST_RATE_LIMIT", "0".to_owned()),
            ("TOCSIN_HTTP_WORKERS", "2".to_owned()),
        ]),
    );
    let dispatcher_ports = [free_port(), free_port()];
    let mut dispatchers: Vec<ServiceProcess> = dispatcher_ports
        .iter()
        .map(|port| {
            ServiceProcess::spawn(
                &binary("tocsin-dispatcher"),
                &with(&[
                    ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{port}")),
                    ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".to_owned()),
                    ("TOCSIN_DISPATCHER_CONCURRENCY", "32".to_owned()),
                    ("TOCSIN_FANOUT_PREFETCH", "16".to_owned()),
                ]),
            )
        })
        .collect();
    for port in [
        admin_port,
        ingest_port,
        dispatcher_ports[0],
        dispatcher_ports[1],
    ] {
        ready(&client, port).await;
    }
    // Both dispatchers consume both work queues before the first alert.
    for queue in ["deliveries", "events.fanout"] {
        let name = format!("{}.{queue}", prefix.prefix);
        wait_until(
            &format!("two consumers on {name}"),
            Duration::from_secs(60),
            || async {
                prefix
                    .queue_info(&name)
                    .await
                    .is_some_and(|info| info["consumers"].as_u64() == Some(2))
            },
        )
        .await;
    }

    // An inbound token and a webhook, through the admin API (held to its audit log below).
    let admin_base = format!("http://127.0.0.1:{admin_port}");
    let ledger = AuditLedger::new(&db.url, ADMIN_TOKEN);
    let admin_api = |path: &str, body: Value| {
        let request = client
            .post(format!("{admin_base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .build()
            .unwrap();
        ledger.exchange(&client, request)
    };
    let token = admin_api("/api/v1/tokens", json!({"name": "scaling"})).await;
    assert_eq!(token.status, 201);
    let token = token.json()["token"].as_str().unwrap().to_owned();
    let webhook = admin_api(
        "/api/v1/webhooks",
        json!({"name": "scaling", "url": receiver.url("/scale"), "events": ["incidents.opened"]}),
    )
    .await;
    assert_eq!(webhook.status, 201);

    // A few hundred alerts, each a new incident, from a few concurrent senders.
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..SENDERS {
        let (client, token) = (client.clone(), token.clone());
        senders.spawn(async move {
            let url = format!("http://127.0.0.1:{ingest_port}/api/v1/webhooks/alerts");
            for i in (sender..ALERTS).step_by(SENDERS) {
                let answer = client
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&json!({"title": format!("scaling {i}"), "dedup_key": format!("scaling-{i}")}))
                    .send()
                    .await
                    .expect("posting an alert");
                assert_eq!(answer.status(), 202, "alert {i}");
            }
        });
    }
    while let Some(sent) = senders.join_next().await {
        sent.expect("a sender");
    }

    // Every delivery reaches the receiver, and both dispatchers record theirs.
    let ids = wait_for("every delivery at the receiver", DEADLINE, || async {
        let ids: HashSet<String> = receiver
            .requests()
            .iter()
            .filter_map(|r| r.header("webhook-id").map(str::to_owned))
            .collect();
        (ids.len() >= ALERTS).then_some(ids)
    })
    .await;
    assert_eq!(ids.len(), ALERTS, "one delivery per alert, no other");
    let per_dispatcher = wait_for(
        "the dispatchers' metrics to count every delivery",
        DEADLINE,
        || async {
            let mut all = Vec::new();
            for port in dispatcher_ports {
                all.push(work(&client, port).await);
            }
            (all.iter().map(|w| w.succeeded).sum::<u64>() >= ALERTS as u64).then_some(all)
        },
    )
    .await;

    eprintln!("| dispatcher | deliveries succeeded | successful attempts | first attempts |");
    eprintln!("|---|---|---|---|");
    for (i, w) in per_dispatcher.iter().enumerate() {
        eprintln!(
            "| {i} (:{}) | {} | {} | {} |",
            dispatcher_ports[i], w.succeeded, w.attempts, w.first
        );
    }
    let sum = |f: fn(&Work) -> u64| per_dispatcher.iter().map(f).sum::<u64>();
    eprintln!(
        "| total | {} | {} | {} |",
        sum(|w| w.succeeded),
        sum(|w| w.attempts),
        sum(|w| w.first)
    );
    eprintln!(
        "receiver: {} requests, {} distinct deliveries",
        receiver.count(),
        ids.len()
    );
    for (i, w) in per_dispatcher.iter().enumerate() {
        assert!(
            w.succeeded > 0,
            "dispatcher {i} delivered nothing: {per_dispatcher:?}"
        );
    }
    assert_eq!(sum(|w| w.succeeded), ALERTS as u64, "{per_dispatcher:?}");
    assert_eq!(sum(|w| w.first), ALERTS as u64, "{per_dispatcher:?}");
    assert!(sum(|w| w.attempts) >= ALERTS as u64, "{per_dispatcher:?}");
    ledger.check(&client, &admin_base).await;

    // They all stop cleanly.
    for process in dispatchers.iter_mut().chain([&mut ingest, &mut admin]) {
        process.terminate();
        let status = process.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "{} stopped with {status}",
            process.name
        );
    }
}
