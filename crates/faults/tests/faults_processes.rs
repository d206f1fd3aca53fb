//! The fault suite with the services as separate processes (their binaries, as deployed):
//! a steady stream of alerts, three webhooks, one fault per scenario. For each: every alert
//! that got a 202 reaches every subscribed target at least once (counted at the receivers by
//! `webhook-id`), the delivery log agrees with what the receivers saw, nothing is left
//! unfinished, and no secret or token appears in any log or in `/metrics`.
//!
//! The binary is named `faults_processes`; deploy/local/test runs it with the other fault tests,
//! after everything else, one test at a time.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_domain::db::deliveries::{self, DeliveryFilter, DeliveryState};
use tocsin_domain::db::webhooks::{self, NewWebhook};
use tocsin_domain::db::{tokens, Page};
use tocsin_domain::{EventKind, RetrySettings, TargetUrl, WebhookName};
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_until, Behavior, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};

const DEADLINE: Duration = Duration::from_secs(120);
const ALERTS: usize = 60;

struct Target {
    name: &'static str,
    receiver: Receiver,
    webhook: uuid::Uuid,
    secret: String,
}

struct Cluster {
    db: TestDb,
    prefix: TestPrefix,
    logs: PathBuf,
    ingest_port: u16,
    ingest: Option<ServiceProcess>,
    dispatchers: Vec<Option<ServiceProcess>>,
    dispatcher_ports: Vec<u16>,
    token: String,
    targets: Vec<Target>,
}

impl Cluster {
    async fn start(scenario: &str, targets: Vec<(&'static str, Receiver)>) -> Cluster {
        let db = TestDb::new().await;
        let prefix = TestPrefix::new();
        let logs = std::env::temp_dir().join(format!("tocsin-faults-{scenario}-{}", prefix.prefix));
        std::fs::create_dir_all(&logs).unwrap();
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let token = tokens::create(&mut conn, "faults")
            .await
            .unwrap()
            .1
            .expose()
            .to_owned();
        let mut registered = Vec::new();
        for (name, receiver) in targets {
            let webhook = webhooks::create(
                &mut conn,
                &NewWebhook {
                    name: WebhookName::parse(name).unwrap(),
                    url: TargetUrl::parse(&receiver.url(&format!("/{name}"))).unwrap(),
                    events: [EventKind::IncidentOpened]
                        .into_iter()
                        .collect::<BTreeSet<_>>(),
                    retry: RetrySettings::new(5, 1_000).unwrap(),
                    enabled: true,
                },
            )
            .await
            .unwrap();
            registered.push(Target {
                name,
                receiver,
                webhook: webhook.id,
                secret: webhook.secret.expose().to_owned(),
            });
        }
        let mut cluster = Cluster {
            db,
            prefix,
            logs,
            ingest_port: free_port(),
            ingest: None,
            dispatchers: vec![None, None],
            dispatcher_ports: vec![free_port(), free_port()],
            token,
            targets: registered,
        };
        cluster.start_ingest().await;
        cluster.start_dispatcher(0).await;
        cluster.start_dispatcher(1).await;
        cluster
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("DATABASE_URL", self.db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", self.prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", "0s,300ms,600ms,1s,1s".into()),
            ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
            ("TOCSIN_SWEEP_INTERVAL", "500ms".into()),
            ("TOCSIN_SWEEP_GRACE", "5s".into()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
            ("TOCSIN_INGEST_RATE_LIMIT", "0".into()),
            // Debug logs, so that the secrets check reads everything the services can say.
            ("RUST_LOG", "debug,h2=info,hyper=info,rustls=info,tokio_postgres=info,lapin=info,amq_protocol=info".into()),
        ]
    }

    async fn start_ingest(&mut self) {
        let mut env = self.env();
        env.push((
            "TOCSIN_INGEST_ADDR",
            format!("127.0.0.1:{}", self.ingest_port),
        ));
        self.ingest = Some(ServiceProcess::spawn_logged(
            &binary("tocsin-ingest"),
            &env,
            Some(&self.logs.join("ingest.log")),
        ));
        ready(self.ingest_port).await;
    }

    async fn start_dispatcher(&mut self, i: usize) {
        let mut env = self.env();
        env.push((
            "TOCSIN_DISPATCHER_ADDR",
            format!("127.0.0.1:{}", self.dispatcher_ports[i]),
        ));
        self.dispatchers[i] = Some(ServiceProcess::spawn_logged(
            &binary("tocsin-dispatcher"),
            &env,
            Some(&self.logs.join(format!("dispatcher-{i}.log"))),
        ));
        ready(self.dispatcher_ports[i]).await;
    }

    /// Sends alerts `range` one after another, each retried on 5xx and transport errors until
    /// accepted, as Alertmanager does; returns how many were accepted.
    async fn stream(&self, range: std::ops::Range<usize>) -> usize {
        send_alerts(self.ingest_port, self.token.clone(), range).await
    }

    /// Waits until every target's deliveries succeeded; checks the log against the receivers and
    /// returns (deliveries expected, delivered, duplicates).
    async fn settle(&self) -> (usize, usize, usize) {
        let (mut expected, mut delivered, mut duplicates) = (0, 0, 0);
        for target in &self.targets {
            let items = wait_for(
                &format!("{}: every delivery succeeded", target.name),
                DEADLINE,
                || async {
                    let mut conn = AsyncPgConnection::establish(&self.db.url).await.ok()?;
                    let filter = DeliveryFilter {
                        webhook_id: Some(target.webhook),
                        ..DeliveryFilter::default()
                    };
                    let (items, _) = deliveries::list(
                        &mut conn,
                        &filter,
                        &Page {
                            limit: 200,
                            cursor: None,
                        },
                    )
                    .await
                    .ok()?;
                    (items.len() == ALERTS
                        && items.iter().all(|d| d.state == DeliveryState::Succeeded))
                    .then_some(items)
                },
            )
            .await;
            let logged: HashSet<String> = items.iter().map(|d| d.id.to_string()).collect();
            let requests = target.receiver.requests();
            let id = |r: &tocsin_testkit::Received| r.header("webhook-id").unwrap().to_owned();
            let seen: HashSet<String> = requests.iter().map(id).collect();
            assert_eq!(
                seen, logged,
                "{}: the receiver saw every delivery of the log, and no other",
                target.name
            );
            let ok: Vec<String> = requests
                .iter()
                .filter(|r| r.answered.is_some_and(|s| (200..300).contains(&s)))
                .map(id)
                .collect();
            let ok_unique: HashSet<&String> = ok.iter().collect();
            assert_eq!(
                ok_unique.len(),
                ALERTS,
                "{}: every delivery answered 2xx at least once",
                target.name
            );
            expected += ALERTS;
            delivered += ok_unique.len();
            duplicates += ok.len() - ok_unique.len();
        }
        (expected, delivered, duplicates)
    }

    /// No secret, token or signing key in any log file or `/metrics`.
    async fn assert_no_secrets_leaked(&self) {
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(&self.logs).unwrap().flatten() {
            texts.push((
                entry.path().display().to_string(),
                std::fs::read_to_string(entry.path()).unwrap_or_default(),
            ));
        }
        for port in [
            self.ingest_port,
            self.dispatcher_ports[0],
            self.dispatcher_ports[1],
        ] {
            if let Ok(response) = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
                texts.push((
                    format!("/metrics on {port}"),
                    response.text().await.unwrap_or_default(),
                ));
            }
        }
        assert!(
            texts
                .iter()
                .any(|(_, t)| t.contains("DEBUG") || t.contains("debug")),
            "debug logs were captured"
        );
        let mut secrets: Vec<String> = self.targets.iter().map(|t| t.secret.clone()).collect();
        // The key part of each secret too, in case it were printed without its prefix.
        secrets.extend(
            self.targets
                .iter()
                .map(|t| t.secret.trim_start_matches("whsec_").to_owned()),
        );
        secrets.push(self.token.clone());
        secrets.push(self.token[4..].to_owned());
        for (source, text) in &texts {
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "a secret appears in {source}"
                );
            }
        }
    }

    fn stop(mut self) {
        for process in self
            .dispatchers
            .iter_mut()
            .chain(std::iter::once(&mut self.ingest))
        {
            if let Some(process) = process.take() {
                process.kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

/// Sends alerts `range` one after another to ingest on `port`, each retried on 5xx and transport
/// errors until accepted, as Alertmanager does; returns how many were accepted.
async fn send_alerts(port: u16, token: String, range: std::ops::Range<usize>) -> usize {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{}/api/v1/webhooks/alerts", port);
    let mut accepted = 0;
    for i in range {
        let body = format!(r#"{{"title":"stream {i}","dedup_key":"stream-{i}"}}"#);
        let started = Instant::now();
        loop {
            assert!(started.elapsed() < DEADLINE, "alert {i} never accepted");
            let answer = client
                .post(&url)
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match answer.map(|r| r.status().as_u16()) {
                Ok(202) => break,
                Ok(status) if status < 500 => panic!("alert {i}: unexpected {status}"),
                // The sender's own back-off before it retries.
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        accepted += 1;
    }
    accepted
}

async fn ready(port: u16) {
    wait_until(
        &format!("the service on {port} to be ready"),
        Duration::from_secs(30),
        || async move {
            reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
}

fn report(
    scenario: &str,
    accepted: usize,
    expected: usize,
    delivered: usize,
    duplicates: usize,
    recovery: Duration,
) {
    eprintln!(
        "| {scenario} | {accepted} | {expected} | {delivered} | {duplicates} | {} | {:.1} s |",
        expected - delivered,
        recovery.as_secs_f64()
    );
}

async fn healthy_targets() -> Vec<(&'static str, Receiver)> {
    vec![
        ("alpha", Receiver::start().await),
        (
            "beta",
            Receiver::start_with(Behavior::Delay(Duration::from_millis(5), 200)).await,
        ),
        ("gamma", Receiver::start().await),
    ]
}

/// Settles, reports the row of the table, checks for leaked secrets, stops.
async fn finish(scenario: &str, cluster: Cluster, accepted: usize, fault_at: Instant) {
    let (expected, delivered, duplicates) = cluster.settle().await;
    assert_eq!(expected, accepted * cluster.targets.len());
    assert_eq!(delivered, expected, "{scenario}: lost deliveries");
    report(
        scenario,
        accepted,
        expected,
        delivered,
        duplicates,
        fault_at.elapsed(),
    );
    cluster.assert_no_secrets_leaked().await;
    cluster.stop();
}

#[tokio::test]
async fn sigkill_a_dispatcher_in_the_middle_of_the_stream() {
    let mut cluster = Cluster::start("kill-dispatcher", healthy_targets().await).await;
    let mut accepted = cluster.stream(0..ALERTS / 3).await;
    let fault_at = Instant::now();
    if let Some(dispatcher) = cluster.dispatchers[0].take() {
        dispatcher.kill();
    }
    // The other dispatcher keeps working while the stream goes on; then the first comes back.
    accepted += cluster.stream(ALERTS / 3..2 * ALERTS / 3).await;
    cluster.start_dispatcher(0).await;
    accepted += cluster.stream(2 * ALERTS / 3..ALERTS).await;
    finish("SIGKILL a dispatcher", cluster, accepted, fault_at).await;
}

#[tokio::test]
async fn sigkill_ingest_between_accepting_requests() {
    let mut cluster = Cluster::start("kill-ingest", healthy_targets().await).await;
    let mut accepted = cluster.stream(0..ALERTS / 2).await;
    let fault_at = Instant::now();
    if let Some(ingest) = cluster.ingest.take() {
        ingest.kill();
    }
    // The sender retries through the outage, as Alertmanager does, while ingest comes back.
    let sender = tokio::spawn(send_alerts(
        cluster.ingest_port,
        cluster.token.clone(),
        ALERTS / 2..ALERTS,
    ));
    cluster.start_ingest().await;
    accepted += sender.await.unwrap();
    finish("SIGKILL ingest", cluster, accepted, fault_at).await;
}

#[tokio::test]
async fn targets_that_hang_fail_then_recover_or_close_connections() {
    let hanging = Receiver::start().await;
    hanging.script(std::iter::repeat_n(Behavior::Hang, 8));
    let flaky = Receiver::start().await;
    flaky.script(std::iter::repeat_n(Behavior::Status(500), 15));
    let closing = Receiver::start().await;
    closing.script(std::iter::repeat_n(Behavior::Close, 15));
    let cluster = Cluster::start(
        "targets",
        vec![("hanging", hanging), ("flaky", flaky), ("closing", closing)],
    )
    .await;
    let fault_at = Instant::now();
    let accepted = cluster.stream(0..ALERTS).await;
    finish(
        "targets hang, answer 500, close",
        cluster,
        accepted,
        fault_at,
    )
    .await;
}
