//! A dispatcher stopped with SIGTERM while attempts are in flight, from outside: admin, ingest
//! and the dispatcher run as their binaries. The attempts in flight finish within
//! `TOCSIN_SHUTDOWN_TIMEOUT` and are logged, the process exits 0, and a second dispatcher
//! delivers the rest: none lost, and no request reached the target that the delivery log does
//! not show. Needs the binaries built (`cargo build --bins`, or `cargo nextest run --workspace`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_ready, Behavior, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};

const DEADLINE: Duration = Duration::from_secs(90);
const ADMIN_TOKEN: &str = "shutdown-admin-token-0123456789";
const ALERTS: usize = 8;

struct Services {
    env: Vec<(&'static str, String)>,
    logs: PathBuf,
    admin: u16,
    ingest: u16,
    client: reqwest::Client,
    /// The changes made through [`Services::api`], held to admin's audit log at the end.
    ledger: AuditLedger,
    _processes: Vec<ServiceProcess>,
}

impl Services {
    fn spawn(&self, name: &str, log: &str, variable: &'static str, port: u16) -> ServiceProcess {
        let mut env = self.env.clone();
        env.push((variable, format!("127.0.0.1:{port}")));
        ServiceProcess::spawn_logged(&binary(name), &env, Some(&self.logs.join(log)))
    }

    async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .client
            .request(method, format!("http://127.0.0.1:{}{path}", self.admin))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = self
            .ledger
            .exchange(&self.client, request.build().unwrap())
            .await;
        assert!(answer.status.is_success(), "{path}: {}", answer.status);
        answer.json()
    }

    /// Delivery id → (state, attempts logged).
    async fn deliveries(&self, webhook: &str) -> HashMap<String, (String, u64)> {
        let page = self
            .api(
                reqwest::Method::GET,
                &format!("/api/v1/deliveries?webhook_id={webhook}&limit=200"),
                None,
            )
            .await;
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["id"].as_str().unwrap().to_owned(),
                    (
                        d["state"].as_str().unwrap().to_owned(),
                        d["attempt_count"].as_u64().unwrap(),
                    ),
                )
            })
            .collect()
    }
}

/// Requests the receiver got per `webhook-id`.
fn requests_by_delivery(receiver: &Receiver) -> HashMap<String, usize> {
    let mut by_id = HashMap::new();
    for request in receiver.requests() {
        *by_id
            .entry(request.header("webhook-id").unwrap_or_default().to_owned())
            .or_insert(0) += 1;
    }
    by_id
}

#[tokio::test]
async fn sigterm_finishes_and_logs_the_attempts_in_flight_and_loses_nothing() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let logs = std::env::temp_dir().join(format!("tocsin-shutdown-{}", prefix.prefix));
    std::fs::create_dir_all(&logs).unwrap();
    let mut services = Services {
        env: vec![
            ("DATABASE_URL", db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", "0s,500ms".into()),
            ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.into()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "10s".into()),
            ("RUST_LOG", "info".into()),
        ],
        logs: logs.clone(),
        admin: free_port(),
        ingest: free_port(),
        client: reqwest::Client::new(),
        ledger: AuditLedger::new(&db.url, ADMIN_TOKEN),
        _processes: Vec::new(),
    };
    let admin = services.spawn(
        "tocsin-admin",
        "admin.log",
        "TOCSIN_ADMIN_ADDR",
        services.admin,
    );
    wait_ready(services.admin, DEADLINE).await;
    let ingest = services.spawn(
        "tocsin-ingest",
        "ingest.log",
        "TOCSIN_INGEST_ADDR",
        services.ingest,
    );
    wait_ready(services.ingest, DEADLINE).await;
    services._processes.extend([admin, ingest]);

    // Each answer takes 2 s: attempts are in flight when the stop comes.
    let receiver = Receiver::start_with(Behavior::Delay(Duration::from_secs(2), 200)).await;
    let webhook = services
        .api(
            reqwest::Method::POST,
            "/api/v1/webhooks",
            Some(json!({
                "name": "slow",
                "url": receiver.url("/slow"),
                "events": ["incidents.opened"],
                "retry": {"max_attempts": 2, "timeout_ms": 5000},
            })),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let token = services
        .api(
            reqwest::Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "shutdown"})),
        )
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();

    let first_port = free_port();
    let mut first = services.spawn(
        "tocsin-dispatcher",
        "dispatcher-1.log",
        "TOCSIN_DISPATCHER_ADDR",
        first_port,
    );
    wait_ready(first_port, DEADLINE).await;
    for i in 0..ALERTS {
        let response = services
            .client
            .post(format!(
                "http://127.0.0.1:{}/api/v1/webhooks/alerts",
                services.ingest
            ))
            .bearer_auth(&token)
            .json(&json!({"title": format!("shutdown {i}"), "dedup_key": format!("shutdown-{i}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    wait_for("attempts in flight at the target", DEADLINE, || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    let in_flight = receiver.count();
    first.terminate();
    let status = first.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{status}");

    // Every request the target got so far is in the log, with its answer.
    let requests = requests_by_delivery(&receiver);
    let log = services.deliveries(&webhook).await;
    for (id, sent) in &requests {
        let logged = log.get(id).map_or(0, |(_, attempts)| *attempts as usize);
        assert!(
            logged >= *sent,
            "delivery {id}: {sent} request(s) sent before the stop, {logged} logged"
        );
    }

    let second_port = free_port();
    let second = services.spawn(
        "tocsin-dispatcher",
        "dispatcher-2.log",
        "TOCSIN_DISPATCHER_ADDR",
        second_port,
    );
    let log = wait_for("every delivery succeeded", DEADLINE, || async {
        let log = services.deliveries(&webhook).await;
        (log.len() == ALERTS && log.values().all(|(state, _)| state == "succeeded")).then_some(log)
    })
    .await;
    let requests = requests_by_delivery(&receiver);
    let unlogged: usize = requests
        .iter()
        .map(|(id, sent)| sent.saturating_sub(log.get(id).map_or(0, |(_, n)| *n as usize)))
        .sum();
    eprintln!(
        "{in_flight} request(s) at the target when SIGTERM came; {} requests in all for {ALERTS} deliveries; {unlogged} unlogged",
        receiver.count()
    );
    assert_eq!(requests.len(), ALERTS, "every delivery reached the target");
    assert_eq!(unlogged, 0, "every request is in the log");
    let base = format!("http://127.0.0.1:{}", services.admin);
    services.ledger.check(&services.client, &base).await;
    drop(second);
    let _ = std::fs::remove_dir_all(&logs);
}
