//! The dispatcher binary as a real process: SIGTERM exits 0, SIGKILL in the middle of a batch
//! loses no delivery.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Harness, DEADLINE};
use tocsin_domain::EventKind;
use tocsin_storage::deliveries::DeliveryState;
use tocsin_testkit::{free_port, wait_until, Behavior, Receiver, ServiceProcess};

fn spawn_dispatcher(harness: &Harness, port: u16) -> ServiceProcess {
    spawn_dispatcher_with(harness, port, &[], None)
}

/// Like [`spawn_dispatcher`], with `extra` settings (later ones win) and the output in `log`.
fn spawn_dispatcher_with(
    harness: &Harness,
    port: u16,
    extra: &[(&'static str, String)],
    log: Option<&std::path::Path>,
) -> ServiceProcess {
    let mut env = vec![
        ("DATABASE_URL", harness.db.url.clone()),
        ("AMQP_URL", tocsin_testkit::amqp_url()),
        ("TOCSIN_AMQP_PREFIX", harness.prefix.prefix.clone()),
        ("TOCSIN_RETRY_DELAYS", "0s,200ms".into()),
        ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{port}")),
        ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
        ("TOCSIN_SWEEP_INTERVAL", "500ms".into()),
        ("TOCSIN_SWEEP_GRACE", "3s".into()),
        ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
        ("RUST_LOG", "warn".into()),
    ];
    env.extend_from_slice(extra);
    ServiceProcess::spawn_logged(env!("CARGO_BIN_EXE_tocsin-dispatcher"), &env, log)
}

async fn healthy(port: u16) -> bool {
    reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test]
async fn sigterm_stops_the_dispatcher_with_exit_code_zero() {
    let harness = Harness::without_dispatcher("0s").await;
    let port = free_port();
    let mut process = spawn_dispatcher(&harness, port);
    wait_until("the dispatcher to serve /healthz", DEADLINE, || {
        healthy(port)
    })
    .await;
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    process.terminate();
    let status = process.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "{status}");
    harness.stop().await;
}

#[tokio::test]
async fn a_dispatcher_killed_in_the_middle_of_a_batch_loses_nothing() {
    let harness = Harness::without_dispatcher("0s,200ms").await;
    let receiver = Receiver::start_with(Behavior::Delay(Duration::from_millis(30), 200)).await;
    let webhook = harness
        .webhook(
            &receiver.url("/crash"),
            &[EventKind::IncidentOpened],
            2,
            5_000,
        )
        .await;
    const EVENTS: usize = 80;
    for i in 0..EVENTS {
        harness.open(&format!("crash-{i}")).await;
    }
    let port = free_port();
    let first = spawn_dispatcher(&harness, port);
    wait_until("the first deliveries to arrive", DEADLINE, || async {
        receiver.count() >= 10
    })
    .await;
    first.kill();
    let delivered_before_restart = receiver.count();
    assert!(
        delivered_before_restart < EVENTS,
        "the kill came in the middle of the batch"
    );

    let second_port = free_port();
    let mut second = spawn_dispatcher(&harness, second_port);
    harness
        .wait_state(webhook.id, EVENTS, DeliveryState::Succeeded)
        .await;
    let ids: HashSet<String> = receiver
        .requests()
        .iter()
        .map(|r| r.header("webhook-id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), EVENTS, "every delivery reached the target");
    eprintln!(
        "killed after {delivered_before_restart} requests; {} requests in all, {} duplicates",
        receiver.count(),
        receiver.count() - ids.len()
    );
    second.terminate();
    assert_eq!(
        second.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0)
    );
    harness.stop().await;
}

#[tokio::test]
async fn losing_the_broker_connection_in_the_middle_of_a_batch_loses_nothing() {
    let proxy = tocsin_testkit::TcpProxy::start("127.0.0.1:5672").await;
    let mut harness = Harness::without_dispatcher("0s,200ms").await;
    let amqp = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    harness
        .add_dispatcher(|config| config.common.amqp_url = amqp)
        .await;
    let receiver = Receiver::start_with(Behavior::Delay(Duration::from_millis(20), 200)).await;
    let webhook = harness
        .webhook(
            &receiver.url("/flap"),
            &[EventKind::IncidentOpened],
            2,
            5_000,
        )
        .await;
    const EVENTS: usize = 60;
    for i in 0..EVENTS {
        harness.open(&format!("flap-{i}")).await;
    }
    wait_until("the first deliveries", DEADLINE, || async {
        receiver.count() >= 5
    })
    .await;
    // Every connection of the dispatcher drops mid-batch; unacked messages go back to the queue.
    proxy.cut();
    proxy.restore();
    harness
        .wait_state(webhook.id, EVENTS, DeliveryState::Succeeded)
        .await;
    let ids: HashSet<String> = receiver
        .requests()
        .iter()
        .map(|r| r.header("webhook-id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), EVENTS);
    harness.stop().await;
}

/// Each delivery stage runs in a span: with JSON logs, an attempt's log line carries the span
/// of the stage that made it and its fields (the first attempt from the fan-out, the retry
/// from the delivery queue), ready for a tracing exporter.
#[tokio::test]
async fn attempts_are_logged_inside_their_stage_spans() {
    let harness = Harness::without_dispatcher("0s,200ms").await;
    let receiver = Receiver::start().await;
    receiver.script([Behavior::Status(500)]);
    let webhook = harness
        .webhook(
            &receiver.url("/spans"),
            &[EventKind::IncidentOpened],
            2,
            5_000,
        )
        .await;
    let log = std::env::temp_dir().join(format!("tocsin-spans-{}.log", harness.prefix.prefix));
    let port = free_port();
    let mut process = spawn_dispatcher_with(
        &harness,
        port,
        &[
            ("TOCSIN_LOG_FORMAT", "json".into()),
            ("RUST_LOG", "tocsin_dispatcher=debug".into()),
        ],
        Some(&log),
    );
    harness.open("spans").await;
    let delivery = harness
        .wait_state(webhook.id, 1, DeliveryState::Succeeded)
        .await
        .remove(0);
    process.terminate();
    process.wait_exit(Duration::from_secs(15)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let attempts: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["message"] == "attempt made")
        .collect();
    assert_eq!(attempts.len(), 2, "two attempts logged: {text}");
    let id = delivery.id.to_string();
    let span = |line: &serde_json::Value| {
        (
            line["span"]["name"].as_str().unwrap_or_default().to_owned(),
            line["span"]["delivery_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            line["span"]["attempt"].as_i64(),
        )
    };
    assert_eq!(
        span(&attempts[0]),
        ("make_claimed".into(), id.clone(), Some(1))
    );
    assert_eq!(attempts[0]["success"], false);
    assert_eq!(span(&attempts[1]), ("make".into(), id, Some(2)));
    assert_eq!(attempts[1]["span"]["trigger"], "automatic");
    assert_eq!(attempts[1]["success"], true);
    harness.stop().await;
}
