//! Losing a node of a replicated RabbitMQ or PostgreSQL, with every service a separate process
//! (ingest, two dispatchers, admin) and three webhooks (healthy, failing, slow) under a steady
//! stream of alerts:
//!
//! - the RabbitMQ node that leads the delivery queue of a three-node cluster
//!   (deploy/local/rabbitmq-cluster) is SIGKILLed, then started again;
//! - the primary of a PostgreSQL pair with a synchronous standby (deploy/local/pg-standby) is
//!   SIGKILLed and the standby promoted.
//!
//! The services get every address (`AMQP_URL` lists the three nodes, `DATABASE_URL` both
//! servers with `target_session_attrs=read-write`) and no restart. Each scenario checks that
//! every alert answered 202 was delivered to every webhook (0 lost: each healthy and slow
//! delivery succeeded, each failing one made all its attempts, and each receiver saw its
//! request), counts duplicate requests and requests the delivery log does not show, measures
//! the recovery (from the fault to the first delivery of an alert accepted after it), and
//! prints one row of the table in docs/reliability.md.
//!
//! The binary is named `faults_cluster`: deploy/local/test runs it with the other fault tests,
//! after everything else, one test at a time. It starts its own servers on their own ports and
//! stops them again; the machine's PostgreSQL and RabbitMQ only serve their usual role (test
//! database, broker of the PostgreSQL scenario).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde_json::{json, Value};
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, Behavior, Received, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};
use tokio_util::sync::CancellationToken;

/// How long a scenario may take to settle after the stream stopped.
const SETTLE_DEADLINE: Duration = Duration::from_secs(240);
/// How long the system may take to deliver again after a fault.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(120);
/// One alert every this long, while the stream runs.
const ALERT_EVERY: Duration = Duration::from_millis(50);
/// Alerts sent before the fault and after recovery.
const ALERTS_BEFORE: usize = 40;
const ALERTS_AFTER: usize = 40;
const ADMIN_TOKEN: &str = "faults-cluster-admin-token-0123456789";
/// Attempts of the failing webhook's deliveries (all fail).
const FAILING_ATTEMPTS: u64 = 3;

/// Runs a deploy/local script off the test's runtime (the receivers run on it and must keep
/// answering meanwhile: a node takes seconds to start); its standard output.
async fn script(name: &'static str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run_script(name, &args))
        .await
        .expect("the script's thread")
}

fn run_script(name: &str, args: &[String]) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../deploy/local/{name}"));
    let output = Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Stops the servers a scenario started, even when it panics.
struct Servers(&'static str);

impl Servers {
    fn start(name: &'static str) -> Servers {
        // Left over from an interrupted run: stop it first.
        let _ = Command::new("bash")
            .arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../../deploy/local/{name}")),
            )
            .arg("stop")
            .output();
        run_script(name, &["start".to_owned()]);
        Servers(name)
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../../deploy/local/{}", self.0)),
            )
            .arg("stop")
            .output();
    }
}

/// What a webhook's receiver does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Healthy,
    Failing,
    Slow,
}

struct Target {
    kind: Kind,
    name: &'static str,
    receiver: Receiver,
    webhook: String,
}

struct System {
    _prefix: TestPrefix,
    logs: PathBuf,
    env: Vec<(&'static str, String)>,
    ingest_port: u16,
    admin_port: u16,
    processes: Vec<ServiceProcess>,
    token: String,
    targets: Vec<Target>,
    client: reqwest::Client,
}

impl System {
    async fn start(scenario: &str, database_url: String, amqp: String) -> System {
        let prefix = TestPrefix::new();
        let logs = std::env::temp_dir().join(format!("tocsin-faults-{scenario}-{}", prefix.prefix));
        std::fs::create_dir_all(&logs).unwrap();
        let env = vec![
            ("DATABASE_URL", database_url),
            ("AMQP_URL", amqp),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", "0s,300ms,600ms,1s,1s".into()),
            ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
            ("TOCSIN_SWEEP_INTERVAL", "1s".into()),
            ("TOCSIN_SWEEP_GRACE", "10s".into()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
            ("TOCSIN_INGEST_RATE_LIMIT", "0".into()),
            ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.into()),
            ("TOCSIN_DB_POOL_SIZE", "8".into()),
            ("RUST_LOG", "info".into()),
        ];
        let mut system = System {
            _prefix: prefix,
            logs,
            env,
            ingest_port: free_port(),
            admin_port: free_port(),
            processes: Vec::new(),
            token: String::new(),
            targets: Vec::new(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        // Admin first: it migrates the database and declares the topology; ingest and the
        // dispatchers start with `start_workers`.
        let admin_port = system.admin_port;
        system
            .spawn("tocsin-admin", "admin", ("TOCSIN_ADMIN_ADDR", admin_port))
            .await;
        system.token = system
            .admin(
                reqwest::Method::POST,
                "/api/v1/tokens",
                Some(json!({"name": "faults"})),
            )
            .await["token"]
            .as_str()
            .unwrap()
            .to_owned();
        for (kind, name, receiver, timeout_ms, attempts) in [
            (Kind::Healthy, "healthy", Receiver::start().await, 2_000, 5),
            (
                Kind::Failing,
                "failing",
                Receiver::start_with(Behavior::Status(500)).await,
                2_000,
                FAILING_ATTEMPTS,
            ),
            (
                Kind::Slow,
                "slow",
                Receiver::start_with(Behavior::Delay(Duration::from_millis(400), 200)).await,
                5_000,
                5,
            ),
        ] {
            let created = system
                .admin(
                    reqwest::Method::POST,
                    "/api/v1/webhooks",
                    Some(json!({
                        "name": name,
                        "url": receiver.url(&format!("/{name}")),
                        "events": ["incidents.opened"],
                        "retry": {"max_attempts": attempts, "timeout_ms": timeout_ms},
                    })),
                )
                .await;
            system.targets.push(Target {
                kind,
                name,
                receiver,
                webhook: created["id"].as_str().unwrap().to_owned(),
            });
        }
        system
    }

    /// Starts ingest and two dispatchers, with `amqp` as their `AMQP_URL`.
    async fn start_workers(&mut self, amqp: &str) {
        self.env.retain(|(name, _)| *name != "AMQP_URL");
        self.env.push(("AMQP_URL", amqp.to_owned()));
        let ingest_port = self.ingest_port;
        self.spawn(
            "tocsin-ingest",
            "ingest",
            ("TOCSIN_INGEST_ADDR", ingest_port),
        )
        .await;
        for i in 0..2 {
            let port = free_port();
            self.spawn(
                "tocsin-dispatcher",
                &format!("dispatcher-{i}"),
                ("TOCSIN_DISPATCHER_ADDR", port),
            )
            .await;
        }
    }

    async fn spawn(&mut self, binary_name: &str, log: &str, (variable, port): (&'static str, u16)) {
        let mut env = self.env.clone();
        env.push((variable, format!("127.0.0.1:{port}")));
        self.processes.push(ServiceProcess::spawn_logged(
            &binary(binary_name),
            &env,
            Some(&self.logs.join(format!("{log}.log"))),
        ));
        tocsin_testkit::wait_ready(port, Duration::from_secs(60)).await;
    }

    /// An admin API call that must succeed; its JSON answer.
    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .client
            .request(
                method,
                format!("http://127.0.0.1:{}{path}", self.admin_port),
            )
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Every delivery of a webhook from the delivery log: id → (state, attempt_count). `None`
    /// while admin cannot answer (its database failing over).
    async fn deliveries(&self, webhook: &str) -> Option<HashMap<String, (String, u64)>> {
        let mut all = HashMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "http://127.0.0.1:{}/api/v1/deliveries?webhook_id={webhook}&limit=200",
                self.admin_port
            );
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let response = self
                .client
                .get(url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            let page: Value = response.json().await.ok()?;
            for item in page["items"].as_array()? {
                all.insert(
                    item["id"].as_str()?.to_owned(),
                    (
                        item["state"].as_str()?.to_owned(),
                        item["attempt_count"].as_u64()?,
                    ),
                );
            }
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Some(all),
            }
        }
    }

    /// Starts the steady stream of alerts in the background.
    fn stream(&self) -> Stream {
        let stop = CancellationToken::new();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let url = format!(
            "http://127.0.0.1:{}/api/v1/webhooks/alerts",
            self.ingest_port
        );
        let task = tokio::spawn(send_alerts(
            self.client.clone(),
            url,
            self.token.clone(),
            stop.clone(),
            accepted.clone(),
        ));
        Stream {
            stop,
            accepted,
            task,
        }
    }

    /// From `fault_at` until the healthy receiver got an alert first sent after the fault.
    async fn wait_recovered(&self, stream: &Stream, fault_at: Instant) -> Duration {
        let healthy = &self.targets[0].receiver;
        wait_for(
            "a delivery of an alert accepted after the fault",
            RECOVERY_DEADLINE,
            || async {
                let after: HashSet<usize> = stream
                    .accepted
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, sent)| *sent > fault_at)
                    .map(|(i, _)| *i)
                    .collect();
                healthy
                    .requests()
                    .iter()
                    .filter(|r| alert_index(r).is_some_and(|i| after.contains(&i)))
                    .map(|r| r.at.duration_since(fault_at))
                    .min()
            },
        )
        .await
    }

    /// Waits until every accepted alert reached every receiver and every delivery is final (or
    /// the deadline passed), then counts.
    async fn settle(&self, accepted: &[usize]) -> Outcome {
        let started = Instant::now();
        loop {
            let outcome = self.count(accepted).await;
            if let Some(outcome) = &outcome {
                if outcome.lost == 0 && outcome.unfinished == 0 {
                    return outcome.clone();
                }
            }
            if started.elapsed() > SETTLE_DEADLINE {
                return outcome.expect("admin answers the delivery log");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn count(&self, accepted: &[usize]) -> Option<Outcome> {
        let mut outcome = Outcome {
            accepted: accepted.len(),
            ..Outcome::default()
        };
        for target in &self.targets {
            let log = self.deliveries(&target.webhook).await?;
            let requests = target.receiver.requests();
            let mut by_id: HashMap<String, Vec<&Received>> = HashMap::new();
            for request in &requests {
                let id = request.header("webhook-id").unwrap_or_default().to_owned();
                by_id.entry(id).or_default().push(request);
            }
            let seen: HashSet<usize> = requests.iter().filter_map(alert_index).collect();
            let final_state = match target.kind {
                Kind::Healthy | Kind::Slow => "succeeded",
                Kind::Failing => "failed",
            };
            outcome.unfinished += log
                .values()
                .filter(|(state, _)| state != final_state)
                .count();
            let missing = accepted.iter().filter(|i| !seen.contains(i)).count();
            outcome.lost += missing;
            outcome.delivered += accepted.len() - missing;
            for (id, requests) in &by_id {
                let logged = log.get(id).map_or(0, |(_, attempts)| *attempts as usize);
                outcome.unlogged += requests.len().saturating_sub(logged);
                if target.kind != Kind::Failing {
                    let ok = requests
                        .iter()
                        .filter(|r| r.answered.is_some_and(|s| (200..300).contains(&s)))
                        .count();
                    outcome.duplicates += ok.saturating_sub(1);
                }
            }
            let short: Vec<&String> = log
                .iter()
                .filter(|(id, (_, attempts))| {
                    by_id.get(*id).map_or(0, Vec::len) < *attempts as usize
                })
                .map(|(id, _)| id)
                .collect();
            if let Some(id) = short.first() {
                let detail = self
                    .admin(
                        reqwest::Method::GET,
                        &format!("/api/v1/deliveries/{id}"),
                        None,
                    )
                    .await;
                let errors: Vec<String> = detail["attempts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| format!("{} {} {}", a["number"], a["status_code"], a["error"]))
                    .collect();
                outcome.notes.push(format!(
                    "{}: {} deliveries with fewer requests received than attempts logged, e.g. {errors:?}",
                    target.name,
                    short.len()
                ));
            }
            if target.kind == Kind::Failing {
                // Every failing delivery made all its attempts.
                outcome.unfinished += log
                    .values()
                    .filter(|(_, attempts)| *attempts != FAILING_ATTEMPTS)
                    .count();
            }
            outcome.notes.push(format!(
                "{}: {} deliveries logged, {} requests, {} alerts missing",
                target.name,
                log.len(),
                requests.len(),
                missing
            ));
        }
        Some(outcome)
    }

    /// How many times each process connected to RabbitMQ, from its log.
    fn broker_connections(&self) -> Vec<(String, usize)> {
        let mut counts = Vec::new();
        for name in ["ingest", "dispatcher-0", "dispatcher-1"] {
            let log =
                std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default();
            counts.push((
                name.to_owned(),
                log.matches("connected to RabbitMQ and declared the topology")
                    .count(),
            ));
        }
        counts
    }

    fn stop(self) {
        for process in self.processes {
            process.kill();
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    accepted: usize,
    delivered: usize,
    lost: usize,
    duplicates: usize,
    unlogged: usize,
    unfinished: usize,
    /// Per webhook: what was logged and received.
    notes: Vec<String>,
}

struct Stream {
    stop: CancellationToken,
    /// Alerts answered 202, with when they were first sent.
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    /// Waits until `n` more alerts were accepted.
    async fn wait_more(&self, n: usize) {
        let target = self.count() + n;
        wait_for("more alerts accepted", RECOVERY_DEADLINE, || async {
            (self.count() >= target).then_some(())
        })
        .await;
    }

    /// Stops the stream; the indices of the accepted alerts.
    async fn finish(self) -> Vec<usize> {
        self.stop.cancel();
        self.task.await.unwrap();
        let accepted = self.accepted.lock().unwrap();
        accepted.iter().map(|(i, _)| *i).collect()
    }
}

/// Sends alerts one after another, one every [`ALERT_EVERY`], each retried on 5xx and
/// transport errors until accepted (as Alertmanager does), until `stop`.
async fn send_alerts(
    client: reqwest::Client,
    url: String,
    token: String,
    stop: CancellationToken,
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
) {
    let mut pace = tokio::time::interval(ALERT_EVERY);
    for i in 0.. {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pace.tick() => {}
        }
        let body = format!(r#"{{"title":"stream {i}","dedup_key":"stream-{i}"}}"#);
        let started = Instant::now();
        loop {
            assert!(
                started.elapsed() < RECOVERY_DEADLINE,
                "alert {i} never accepted"
            );
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
        accepted.lock().unwrap().push((i, started));
    }
}

/// The alert a delivered request carries (its title is `stream <i>`).
fn alert_index(request: &Received) -> Option<usize> {
    let body: Value = serde_json::from_slice(&request.body).ok()?;
    body["data"]["title"]
        .as_str()?
        .strip_prefix("stream ")?
        .parse()
        .ok()
}

fn report(scenario: &str, outcome: &Outcome, recovery: Duration) {
    eprintln!(
        "| scenario | accepted | delivered | lost | duplicates | unlogged requests | recovery s |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    eprintln!(
        "| {scenario} | {} | {} | {} | {} | {} | {:.1} |",
        outcome.accepted,
        outcome.delivered,
        outcome.lost,
        outcome.duplicates,
        outcome.unlogged,
        recovery.as_secs_f64()
    );
    eprintln!(
        "(accepted: alerts answered 202; delivered and lost: deliveries to the 3 webhooks)\n{}",
        outcome.notes.join("\n")
    );
}

fn check(scenario: &str, outcome: &Outcome) {
    assert_eq!(outcome.lost, 0, "{scenario}: lost deliveries: {outcome:?}");
    assert_eq!(
        outcome.unfinished, 0,
        "{scenario}: unfinished deliveries: {outcome:?}"
    );
}

/// A quorum queue of the local cluster: (replicas online, members).
async fn replicas(queue: &str) -> (usize, usize) {
    let status = script("rabbitmq-cluster", &["status"]).await;
    // name, type, leader, online, members
    let Some(line) = status
        .lines()
        .find(|l| l.starts_with(&format!("{queue}\t")))
    else {
        return (0, 0);
    };
    let columns: Vec<&str> = line.split('\t').collect();
    let nodes = |i: usize| {
        columns
            .get(i)
            .map_or(0, |c| c.matches("tocsin-mq-").count())
    };
    (nodes(3), nodes(4))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_rabbitmq_node_leading_the_delivery_queue_then_bring_it_back() {
    let cluster = Servers::start("rabbitmq-cluster");
    let db = TestDb::new().await;
    let urls = script("rabbitmq-cluster", &["urls"]).await;
    let mut system = System::start("mq-node", db.url.clone(), urls.clone()).await;
    let queue = format!("{}.deliveries", system._prefix.prefix);
    assert_eq!(
        replicas(&queue).await,
        (3, 3),
        "the delivery queue has a replica on each node, all online"
    );
    let leader = script("rabbitmq-cluster", &["leader", &queue]).await;
    // Ingest and both dispatchers list the leader's node first, so that every publisher and
    // consumer of theirs is on the node that dies: the hardest case.
    let mut nodes: Vec<&str> = urls.split(',').collect();
    nodes.rotate_left(leader.parse::<usize>().unwrap() - 1);
    system.start_workers(&nodes.join(",")).await;

    let stream = system.stream();
    stream.wait_more(ALERTS_BEFORE).await;
    let fault_at = Instant::now();
    script("rabbitmq-cluster", &["kill", &leader]).await;
    let recovery = system.wait_recovered(&stream, fault_at).await;
    let new_leader = script("rabbitmq-cluster", &["leader", &queue]).await;
    assert_ne!(new_leader, leader, "another node leads the queue");
    // The node comes back and rejoins while the stream goes on.
    script("rabbitmq-cluster", &["start-node", &leader]).await;
    wait_for(
        "the restarted node's replica back online",
        RECOVERY_DEADLINE,
        || async { (replicas(&queue).await == (3, 3)).then_some(()) },
    )
    .await;
    stream.wait_more(ALERTS_AFTER).await;
    let accepted = stream.finish().await;
    let outcome = system.settle(&accepted).await;
    let scenario = format!(
        "SIGKILL the RabbitMQ node leading the delivery queue (node {leader}), then restart it"
    );
    report(&scenario, &outcome, recovery);
    let connections = system.broker_connections();
    eprintln!("connections to RabbitMQ per process: {connections:?}");
    assert!(
        connections.iter().all(|(_, n)| *n >= 2),
        "every process reconnected to another node: {connections:?}"
    );
    check(&scenario, &outcome);
    system.stop();
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_postgresql_primary_and_promote_the_standby() {
    use diesel_async::RunQueryDsl;
    let pair = Servers::start("pg-standby");
    let database = format!("tocsin_faults_{}", uuid::Uuid::new_v4().simple());
    let mut conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1:5441/postgres")
        .await
        .unwrap();
    diesel::sql_query(format!("CREATE DATABASE {database}"))
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let url = script("pg-standby", &["url", &database]).await;
    let mut system = System::start("pg-primary", url, amqp_url()).await;
    system.start_workers(&amqp_url()).await;

    let stream = system.stream();
    stream.wait_more(ALERTS_BEFORE).await;
    let fault_at = Instant::now();
    script("pg-standby", &["kill"]).await;
    // The operator (or the failover manager) promotes the standby.
    script("pg-standby", &["promote"]).await;
    let recovery = system.wait_recovered(&stream, fault_at).await;
    stream.wait_more(ALERTS_AFTER).await;
    let accepted = stream.finish().await;
    let outcome = system.settle(&accepted).await;
    let scenario = "SIGKILL the PostgreSQL primary, promote the synchronous standby";
    report(scenario, &outcome, recovery);
    check(scenario, &outcome);
    system.stop();
    drop(pair);
}
