//! The delivery engine's invariants under concurrency, checked on the real thing: ingest, admin
//! and two dispatchers as separate processes on a database and AMQP prefix of their own, and a
//! loopback target that switches among 2xx, 5xx, a slow 2xx and hanging. Each run follows a
//! schedule drawn from its seed: bursts of alerts, operators pressing retry on the same delivery
//! at once, a dispatcher killed in the middle of its attempts (its messages redelivered, its
//! attempts under way left to the sweeper, which runs every 300 ms with a 1 s grace), and
//! webhooks disabled, enabled again and recovered, or deleted while their deliveries are under
//! way. Once the
//! run has settled, it checks:
//!
//! - no delivery has more automatic attempts than its webhook's `max_attempts`;
//! - every request the target received is in the attempt log exactly once, and every logged
//!   attempt the target did not receive was recorded as interrupted (its dispatcher was killed
//!   after claiming it, before the request went out), as not sent, or as a timeout that lasted
//!   the webhook's whole timeout (on a loaded machine the deadline can pass before the request
//!   reaches the target's handler);
//! - no delivery seen `succeeded` changed state afterwards;
//! - every event has exactly one delivery for the webhook that stayed subscribed throughout, at
//!   most one for the others, every delivery is listed in the delivery log (the admin API),
//!   and every one has finished: nothing is lost or left behind;
//! - the webhook with `ordering: incident` got every event once, and each incident's events in
//!   order (its automatic requests about one incident never go back to an earlier event), while
//!   replays of the run's window are asked for under way (they add nothing to what the events'
//!   fan-outs made).
//!
//! Each run prints its seed; `TOCSIN_INVARIANT_SEEDS=7,42` replays those seeds' schedules
//! (`TOCSIN_INVARIANT_RUNS=n` runs n seeds drawn from the clock; the default is a fixed list).
//! The services are the binaries beside the test (`cargo build --bins`), or those in
//! `TOCSIN_BIN_DIR`, so the same test can be run against another build.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{Bool, Int4, Nullable, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::{json, Value};
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_until, within, Behavior, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};
use tokio::time::Instant;
use uuid::Uuid;

const ADMIN_TOKEN: &str = "invariants-admin-token-0123456789";
/// The seeds CI runs: fixed, so that a failure names a seed that replays it.
const SEEDS: [u64; 8] = [1, 2, 3, 5, 8, 13, 21, 34];
/// How long a run's schedule lasts.
const WINDOW: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(90);
const SCHEDULE: &str = "0s,200ms,300ms,300ms,400ms";
/// Every webhook's timeout, in milliseconds.
const TIMEOUT_MS: i32 = 1000;

/// splitmix64: a small, reproducible generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One step of a run's schedule.
#[derive(Debug, Clone)]
enum Action {
    /// `n` alerts (new incidents, and resolves of earlier ones) from concurrent senders.
    Burst(usize),
    /// The target now answers this way.
    Target(Behavior),
    /// `n` operators press retry on one delivery at once (the newest, or an older one).
    Retries { pick: u64, n: usize },
    /// The target answers 500 after 0.4 s, and an operator presses retry on one delivery
    /// every 150 ms for two seconds.
    Pound { pick: u64 },
    /// SIGKILL one dispatcher, then start a new one `after` later.
    Kill { which: usize, after: Duration },
    /// Disable, then enable again after a while and recover, a webhook (the second, or the
    /// ordered fourth).
    Toggle { hook: usize, after: Duration },
    /// Delete a webhook (the third).
    Delete { hook: usize },
    /// Replay every event since the run began to a webhook (the stable one, or the ordered
    /// one), while the run goes on: it has deliveries of them all, or gets them once.
    Replay { hook: usize },
}

fn schedule(seed: u64) -> Vec<(Duration, Action)> {
    let mut rng = Rng(seed);
    let mut actions = Vec::new();
    let ms = |rng: &mut Rng| Duration::from_millis(rng.below(WINDOW.as_millis() as u64));
    for _ in 0..(4 + rng.below(3)) {
        let n = 10 + rng.below(30) as usize;
        actions.push((ms(&mut rng), Action::Burst(n)));
    }
    let behaviors = [
        Behavior::Status(200),
        Behavior::Status(500),
        Behavior::Delay(Duration::from_millis(300), 200),
        Behavior::Hang,
    ];
    for _ in 0..(4 + rng.below(4)) {
        let behavior = behaviors[rng.below(behaviors.len() as u64) as usize].clone();
        actions.push((ms(&mut rng), Action::Target(behavior)));
    }
    for _ in 0..(3 + rng.below(4)) {
        let pick = rng.next();
        let n = 2 + rng.below(4) as usize;
        actions.push((ms(&mut rng), Action::Retries { pick, n }));
    }
    for _ in 0..(1 + rng.below(2)) {
        let pick = rng.next();
        actions.push((ms(&mut rng), Action::Pound { pick }));
    }
    for _ in 0..(1 + rng.below(2)) {
        let which = rng.below(2) as usize;
        let after = Duration::from_millis(200 + rng.below(800));
        actions.push((ms(&mut rng), Action::Kill { which, after }));
    }
    if rng.below(2) == 0 {
        let after = Duration::from_millis(300 + rng.below(1500));
        // The unordered webhook, or the ordered one (its order through disable and recover).
        let hook = if rng.below(2) == 0 { 1 } else { 3 };
        actions.push((ms(&mut rng), Action::Toggle { hook, after }));
    }
    if rng.below(3) == 0 {
        actions.push((ms(&mut rng), Action::Delete { hook: 2 }));
    }
    for _ in 0..(1 + rng.below(2)) {
        let hook = if rng.below(2) == 0 { 0 } else { 3 };
        actions.push((ms(&mut rng), Action::Replay { hook }));
    }
    actions.sort_by_key(|(at, _)| *at);
    actions
}

/// The seeds to run.
fn seeds() -> Vec<u64> {
    if let Ok(list) = std::env::var("TOCSIN_INVARIANT_SEEDS") {
        return list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    if let Some(n) = std::env::var("TOCSIN_INVARIANT_RUNS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        return (0..n)
            .map(|i| base.wrapping_mul(31).wrapping_add(i))
            .collect();
    }
    SEEDS.to_vec()
}

fn service_binary(name: &str) -> String {
    match std::env::var("TOCSIN_BIN_DIR") {
        Ok(dir) => format!("{dir}/{name}"),
        Err(_) => binary(name),
    }
}

/// A system of its own: processes, database, prefix, target.
struct System {
    db: TestDb,
    _prefix: TestPrefix,
    env: Vec<(&'static str, String)>,
    client: reqwest::Client,
    /// The changes made through admin, held to its audit log when the system stops.
    ledger: Arc<AuditLedger>,
    admin_port: u16,
    ingest_port: u16,
    token: String,
    dispatchers: Vec<Option<(ServiceProcess, u16)>>,
    others: Vec<ServiceProcess>,
    target: Receiver,
    /// Webhook ids; the first stays subscribed throughout.
    hooks: Vec<Uuid>,
    /// Each webhook's max_attempts.
    max_attempts: HashMap<Uuid, i32>,
}

impl System {
    async fn start(seed: u64) -> System {
        // Another build migrates a database of its own with its own migrations.
        let db = if std::env::var("TOCSIN_BIN_DIR").is_ok() {
            TestDb::empty().await
        } else {
            TestDb::new().await
        };
        let prefix = TestPrefix::new();
        let target = Receiver::start().await;
        // Idle connections are dropped before the services' 5 s keep-alive ends: a request sent
        // on a connection the server is closing at that moment fails with `IncompleteMessage`
        // (hyperium/hyper#2136), as it once did here on a replay.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let env = vec![
            ("DATABASE_URL", db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", SCHEDULE.to_owned()),
            ("TOCSIN_DB_POOL_SIZE", "6".to_owned()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "3s".to_owned()),
            ("TOKIO_WORKER_THREADS", "2".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ];
        let admin_port = free_port();
        let ingest_port = free_port();
        let mut system = System {
            ledger: Arc::new(AuditLedger::new(&db.url, ADMIN_TOKEN)),
            db,
            _prefix: prefix,
            env,
            client,
            admin_port,
            ingest_port,
            token: String::new(),
            dispatchers: Vec::new(),
            others: Vec::new(),
            target,
            hooks: Vec::new(),
            max_attempts: HashMap::new(),
        };
        let admin = system.spawn(
            "tocsin-admin",
            &[
                ("TOCSIN_ADMIN_ADDR", format!("127.0.0.1:{admin_port}")),
                ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
                ("TOCSIN_HTTP_WORKERS", "2".to_owned()),
            ],
        );
        let ingest = system.spawn(
            "tocsin-ingest",
            &[
                ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{ingest_port}")),
                ("TOCSIN_INGEST_RATE_LIMIT", "0".to_owned()),
                ("TOCSIN_HTTP_WORKERS", "2".to_owned()),
            ],
        );
        system.others = vec![admin, ingest];
        for _ in 0..2 {
            let dispatcher = system.spawn_dispatcher().await;
            system.dispatchers.push(Some(dispatcher));
        }
        for port in [admin_port, ingest_port] {
            tocsin_testkit::wait_ready(port, Duration::from_secs(60)).await;
        }
        let token = system
            .admin(
                "POST",
                "/api/v1/tokens",
                Some(json!({"name": "invariants"})),
            )
            .await;
        system.token = token["token"].as_str().expect("a token").to_owned();
        let mut rng = Rng(seed ^ 0x5EED);
        for (i, path) in ["/stable", "/toggled", "/deleted", "/ordered"]
            .iter()
            .enumerate()
        {
            let max_attempts = 2 + rng.below(4) as i32;
            let ordering = if *path == "/ordered" {
                "incident"
            } else {
                "none"
            };
            let created = system
                .admin(
                    "POST",
                    "/api/v1/webhooks",
                    Some(json!({
                        "name": format!("invariants {i}"),
                        "url": system.target.url(path),
                        "events": ["incidents.opened", "incidents.status_changed", "incidents.resolved"],
                        "retry": {"max_attempts": max_attempts, "timeout_ms": TIMEOUT_MS},
                        "ordering": ordering,
                    })),
                )
                .await;
            let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
            system.hooks.push(id);
            system.max_attempts.insert(id, max_attempts);
        }
        system
    }

    fn spawn(&self, name: &str, extra: &[(&'static str, String)]) -> ServiceProcess {
        let mut env = self.env.clone();
        env.extend_from_slice(extra);
        ServiceProcess::spawn(&service_binary(name), &env)
    }

    async fn spawn_dispatcher(&self) -> (ServiceProcess, u16) {
        let port = free_port();
        let process = self.spawn(
            "tocsin-dispatcher",
            &[
                ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{port}")),
                ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".to_owned()),
                ("TOCSIN_DISPATCHER_CONCURRENCY", "32".to_owned()),
                ("TOCSIN_WEBHOOK_CONCURRENCY", "4".to_owned()),
                ("TOCSIN_FANOUT_PREFETCH", "16".to_owned()),
                ("TOCSIN_SWEEP_INTERVAL", "300ms".to_owned()),
                ("TOCSIN_SWEEP_GRACE", "1s".to_owned()),
            ],
        );
        tocsin_testkit::wait_ready(port, Duration::from_secs(60)).await;
        (process, port)
    }

    async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("http://127.0.0.1:{}{path}", self.admin_port);
        let request = match method {
            "POST" => self.client.post(url),
            "PATCH" => self.client.patch(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.get(url),
        }
        .bearer_auth(ADMIN_TOKEN);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        let answer = self
            .ledger
            .exchange(&self.client, request.build().unwrap())
            .await;
        assert!(
            answer.status.is_success() || answer.status.as_u16() == 409,
            "{method} {path}: {} {}",
            answer.status,
            answer.text
        );
        answer.json()
    }

    /// Enables or disables a webhook through the admin API. Enabled again, it is recovered:
    /// the deliveries that waited while it was disabled are sent, and its failed ones retried.
    async fn set_enabled(&self, hook: Uuid, enabled: bool) {
        self.admin(
            "PATCH",
            &format!("/api/v1/webhooks/{hook}"),
            Some(json!({"enabled": enabled})),
        )
        .await;
        if enabled {
            self.admin(
                "POST",
                &format!("/api/v1/webhooks/{hook}/recover"),
                Some(json!({"since": "2000-01-01T00:00:00Z"})),
            )
            .await;
        }
    }

    /// One of the `newest` deliveries of the log, chosen by `pick`.
    async fn pick_delivery(&self, pick: u64, newest: usize) -> Option<String> {
        let log = self
            .admin("GET", &format!("/api/v1/deliveries?limit={newest}"), None)
            .await;
        let items = log["items"].as_array().cloned().unwrap_or_default();
        let item = items.get((pick % items.len().max(1) as u64) as usize)?;
        Some(item["id"].as_str()?.to_owned())
    }

    /// An operator pressing retry on delivery `id`: accepted, or refused as the delivery or its
    /// webhook no longer allows it.
    fn retry(&self, id: String) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (client, port, ledger) = (self.client.clone(), self.admin_port, self.ledger.clone());
        async move {
            let request = client
                .post(format!(
                    "http://127.0.0.1:{port}/api/v1/deliveries/{id}/retry"
                ))
                .bearer_auth(ADMIN_TOKEN)
                .build()
                .unwrap();
            let status = ledger.exchange(&client, request).await.status.as_u16();
            assert!(status == 202 || status == 409, "retry answered {status}");
        }
    }

    /// Sends `n` alerts from four senders: mostly new incidents, some resolving earlier ones.
    async fn burst(&self, n: usize, rng: &mut Rng, next_key: &mut usize) -> usize {
        let mut bodies = Vec::with_capacity(n);
        for _ in 0..n {
            if *next_key > 0 && rng.below(4) == 0 {
                let key = rng.below(*next_key as u64);
                bodies.push(json!({"status": "resolved", "dedup_key": format!("k{key}"), "title": format!("alert {key}")}));
            } else {
                bodies.push(json!({"status": "firing", "dedup_key": format!("k{next_key}"), "title": format!("alert {next_key}")}));
                *next_key += 1;
            }
        }
        let url = format!(
            "http://127.0.0.1:{}/api/v1/webhooks/alerts",
            self.ingest_port
        );
        let mut senders = tokio::task::JoinSet::new();
        for chunk in bodies.chunks(n.div_ceil(4).max(1)) {
            let (client, url, token, chunk) = (
                self.client.clone(),
                url.clone(),
                self.token.clone(),
                chunk.to_vec(),
            );
            senders.spawn(async move {
                let mut accepted = 0;
                for body in chunk {
                    let answer = client
                        .post(&url)
                        .bearer_auth(&token)
                        .json(&body)
                        .send()
                        .await
                        .expect("ingest answers");
                    assert_eq!(answer.status(), 202, "every alert is accepted");
                    accepted += 1;
                }
                accepted
            });
        }
        let mut accepted = 0;
        while let Some(sent) = senders.join_next().await {
            accepted += sent.expect("a sender");
        }
        accepted
    }

    async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url).await.unwrap()
    }

    /// Holds admin's audit log to the run's changes (unless the services are another build's,
    /// `TOCSIN_BIN_DIR`), then stops every process.
    async fn stop(mut self) {
        if std::env::var("TOCSIN_BIN_DIR").is_err() {
            let base = format!("http://127.0.0.1:{}", self.admin_port);
            self.ledger.check(&self.client, &base).await;
        }
        for (process, _) in self.dispatchers.iter_mut().flatten() {
            process.terminate();
        }
        for (process, _) in self.dispatchers.iter_mut().flatten() {
            process.wait_exit(Duration::from_secs(30)).await;
        }
        for process in &mut self.others {
            process.terminate();
            process.wait_exit(Duration::from_secs(30)).await;
        }
    }
}

#[derive(QueryableByName, Debug)]
struct AttemptRow {
    #[diesel(sql_type = SqlUuid)]
    delivery_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    webhook_id: Uuid,
    #[diesel(sql_type = Int4)]
    number: i32,
    #[diesel(sql_type = Text)]
    trigger: String,
    #[diesel(sql_type = Nullable<Bool>)]
    success: Option<bool>,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
    #[diesel(sql_type = Nullable<Int4>)]
    duration_ms: Option<i32>,
}

#[derive(QueryableByName, Debug)]
struct DeliveryRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    webhook_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
    #[diesel(sql_type = Text)]
    state: String,
}

#[derive(QueryableByName, Debug)]
struct IdRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

async fn deliveries(conn: &mut AsyncPgConnection) -> Vec<DeliveryRow> {
    diesel::sql_query("SELECT id, webhook_id, event_id, state FROM deliveries")
        .load(conn)
        .await
        .unwrap()
}

/// Runs one seed's schedule and returns what broke, if anything.
async fn run(seed: u64) -> Vec<String> {
    let began = Instant::now();
    let mut system = System::start(seed).await;
    eprintln!("invariant seed {seed}: started in {:?}", began.elapsed());
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut next_key = 0usize;
    let mut accepted = 0usize;
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let mut enable_again: Vec<(Instant, Uuid)> = Vec::new();
    let mut retries = tokio::task::JoinSet::new();
    // Deliveries seen succeeded while the run goes on: none may change state afterwards.
    let seen_succeeded = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::<Uuid>::new()));
    let watcher = {
        let url = system.db.url.clone();
        let seen = seen_succeeded.clone();
        tokio::spawn(async move {
            let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
            let mut sample = tokio::time::interval(Duration::from_millis(150));
            loop {
                sample.tick().await;
                let rows: Vec<IdRow> =
                    diesel::sql_query("SELECT id FROM deliveries WHERE state = 'succeeded'")
                        .load(&mut conn)
                        .await
                        .unwrap_or_default();
                seen.lock().unwrap().extend(rows.into_iter().map(|r| r.id));
            }
        })
    };
    let start = Instant::now();
    for (at, action) in schedule(seed) {
        // Restarts and re-enables due before this action come first.
        let until = start + at;
        for (when, which) in std::mem::take(&mut restarts) {
            if when <= until {
                tokio::time::sleep_until(when).await;
                let restarted = system.spawn_dispatcher().await;
                system.dispatchers[which] = Some(restarted);
            } else {
                restarts.push((when, which));
            }
        }
        for (when, hook) in std::mem::take(&mut enable_again) {
            if when <= until {
                tokio::time::sleep_until(when).await;
                system.set_enabled(hook, true).await;
            } else {
                enable_again.push((when, hook));
            }
        }
        tokio::time::sleep_until(until).await;
        match action {
            Action::Burst(n) => accepted += system.burst(n, &mut rng, &mut next_key).await,
            Action::Target(behavior) => system.target.set_behavior(behavior),
            Action::Retries { pick, n } => {
                if let Some(id) = system.pick_delivery(pick, 50).await {
                    for _ in 0..n {
                        retries.spawn(system.retry(id.clone()));
                    }
                }
            }
            Action::Pound { pick } => {
                // The target of the report of a sixth automatic attempt: 500 after 0.4 s.
                system
                    .target
                    .set_behavior(Behavior::Delay(Duration::from_millis(400), 500));
                if let Some(id) = system.pick_delivery(pick, 20).await {
                    let presses: Vec<_> = (0..14).map(|_| system.retry(id.clone())).collect();
                    retries.spawn(async move {
                        // One press every 150 ms at most, each after the previous answered.
                        let mut pace = tokio::time::interval(Duration::from_millis(150));
                        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        for press in presses {
                            pace.tick().await;
                            press.await;
                        }
                    });
                }
            }
            Action::Kill { which, after } => {
                if let Some((process, _)) = system.dispatchers[which].take() {
                    process.kill();
                    restarts.push((Instant::now() + after, which));
                }
            }
            Action::Toggle { hook, after } => {
                let id = system.hooks[hook];
                system.set_enabled(id, false).await;
                enable_again.push((Instant::now() + after, id));
            }
            Action::Delete { hook } => {
                let id = system.hooks[hook];
                system
                    .admin("DELETE", &format!("/api/v1/webhooks/{id}"), None)
                    .await;
            }
            Action::Replay { hook } => {
                let id = system.hooks[hook];
                let since = (time::OffsetDateTime::now_utc() - time::Duration::minutes(10))
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap();
                system
                    .admin(
                        "POST",
                        &format!("/api/v1/webhooks/{id}/replay"),
                        Some(json!({"since": since})),
                    )
                    .await;
            }
        }
    }
    for (when, which) in restarts {
        tokio::time::sleep_until(when).await;
        system.dispatchers[which] = Some(system.spawn_dispatcher().await);
    }
    for (when, hook) in enable_again {
        tokio::time::sleep_until(when).await;
        system.set_enabled(hook, true).await;
    }
    while let Some(done) = retries.join_next().await {
        done.expect("a retry");
    }
    // Let everything finish: the target answers, and every delivery ends.
    system.target.set_behavior(Behavior::Status(200));
    let mut conn = system.conn().await;
    let unsettled = [
        "deliveries WHERE state = 'waiting' AND wait_reason = 'webhook_disabled'",
        "deliveries WHERE state = 'waiting' AND wait_reason IS DISTINCT FROM 'webhook_disabled'",
        "deliveries WHERE state NOT IN ('succeeded', 'failed', 'waiting')",
        "attempts WHERE success IS NULL",
        "outbox WHERE published_at IS NULL",
    ];
    let counts = std::sync::Mutex::new(Vec::new());
    let settled = within(SETTLE, || async {
        let mut now = Vec::new();
        for rows in unsettled {
            now.push(system.db.count(rows).await);
        }
        let done = now.iter().all(|&n| n == 0);
        *counts.lock().unwrap() = now;
        done.then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "seed {seed}: not every delivery finished within {SETTLE:?}; still {:?}",
        unsettled
            .iter()
            .zip(counts.lock().unwrap().iter())
            .collect::<Vec<_>>()
    );
    // Manual retries enqueued last have been made (or refused) once the queues are empty.
    let queue = format!("{}.deliveries", system._prefix.prefix);
    wait_until("the delivery queue drained", SETTLE, || async {
        system
            ._prefix
            .queue_info(&queue)
            .await
            .is_some_and(|q| q["messages"] == 0)
    })
    .await;
    watcher.abort();
    eprintln!("invariant seed {seed}: settled after {:?}", began.elapsed());

    let mut broken = Vec::new();
    let attempts: Vec<AttemptRow> = diesel::sql_query(
        "SELECT a.delivery_id, d.webhook_id, a.number, a.trigger, a.success, a.error,
                a.duration_ms
         FROM attempts a JOIN deliveries d ON d.id = a.delivery_id",
    )
    .load(&mut conn)
    .await
    .unwrap();
    let all = deliveries(&mut conn).await;

    // 1. Automatic attempts within max_attempts.
    let mut automatic: HashMap<Uuid, (Uuid, i32)> = HashMap::new();
    for a in attempts.iter().filter(|a| a.trigger == "automatic") {
        automatic
            .entry(a.delivery_id)
            .or_insert((a.webhook_id, 0))
            .1 += 1;
    }
    for (delivery, (webhook, n)) in &automatic {
        let max = system.max_attempts[webhook];
        if *n > max {
            broken.push(format!(
                "delivery {delivery}: {n} automatic attempts, max_attempts {max}"
            ));
        }
    }

    // 2. Requests received = attempts logged (but for attempts interrupted before sending).
    let mut received: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for request in system.target.requests() {
        let id = request.header("webhook-id").unwrap_or_default().to_owned();
        let number = request
            .header("tocsin-attempt")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        *received.entry((id, number)).or_default() += 1;
    }
    let logged: BTreeMap<(String, i32), &AttemptRow> = attempts
        .iter()
        .map(|a| ((a.delivery_id.to_string(), a.number), a))
        .collect();
    let mut unlogged = 0;
    for (key, count) in &received {
        if *count > 1 {
            broken.push(format!("attempt {key:?} was sent {count} times"));
        }
        if !logged.contains_key(key) {
            unlogged += 1;
            broken.push(format!(
                "request {key:?} reached the target but is not logged"
            ));
        }
    }
    let mut not_sent = 0;
    let mut timed_out_unseen = 0;
    for (key, attempt) in &logged {
        if !received.contains_key(key) {
            not_sent += 1;
            // Interrupted before its request went out, given no room within its lease, or
            // timed out before the target's handler got the request (the test shares two cores
            // with the services and the rest of the suite): a timeout lasts the whole timeout.
            let timed_out = attempt.error.as_deref() == Some("timeout")
                && attempt.duration_ms.is_some_and(|ms| ms >= TIMEOUT_MS);
            timed_out_unseen += usize::from(timed_out);
            if !timed_out && !matches!(attempt.error.as_deref(), Some("interrupted" | "not_sent")) {
                broken.push(format!(
                    "attempt {key:?} is logged ({:?}, {:?}) but the target never got it",
                    attempt.success, attempt.error
                ));
            }
        }
    }

    // 3. Succeeded stays succeeded.
    let states: HashMap<Uuid, &str> = all.iter().map(|d| (d.id, d.state.as_str())).collect();
    for id in seen_succeeded.lock().unwrap().iter() {
        if states.get(id) != Some(&"succeeded") {
            broken.push(format!(
                "delivery {id} was succeeded, now {:?}",
                states.get(id)
            ));
        }
    }
    for a in attempts.iter().filter(|a| a.success == Some(true)) {
        if states.get(&a.delivery_id) != Some(&"succeeded") {
            broken.push(format!(
                "delivery {} had a successful attempt but is {:?}",
                a.delivery_id,
                states.get(&a.delivery_id)
            ));
        }
    }

    // 4. One delivery per event for the stable webhook, at most one for the others, all
    //    listed in the delivery log and finished.
    let events: Vec<IdRow> = diesel::sql_query("SELECT id FROM events")
        .load(&mut conn)
        .await
        .unwrap();
    let mut per_pair: HashMap<(Uuid, Uuid), usize> = HashMap::new();
    for d in &all {
        *per_pair.entry((d.event_id, d.webhook_id)).or_default() += 1;
    }
    for (name, hook) in [("stable", system.hooks[0]), ("ordered", system.hooks[3])] {
        for event in &events {
            let n = per_pair.get(&(event.id, hook)).copied().unwrap_or(0);
            if n != 1 {
                broken.push(format!(
                    "event {} has {n} deliveries for the {name} webhook",
                    event.id
                ));
            }
        }
    }

    // 5. The ordered webhook got each incident's events in order: its automatic requests
    //    about one incident never go back to an earlier event (a manual retry is made at
    //    once, whatever the order).
    let rank = |kind: &str| match kind {
        "incidents.opened" => 0,
        "incidents.status_changed" => 1,
        _ => 2,
    };
    let mut last_rank: HashMap<String, u8> = HashMap::new();
    for request in system.target.requests() {
        if request.path != "/ordered" {
            continue;
        }
        let key = (
            request.header("webhook-id").unwrap_or_default().to_owned(),
            request
                .header("tocsin-attempt")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        );
        if logged.get(&key).is_none_or(|a| a.trigger != "automatic") {
            continue;
        }
        let body = request.json();
        let incident = body["data"]["id"].as_str().unwrap_or_default().to_owned();
        let this = rank(body["event"].as_str().unwrap_or_default());
        let before = last_rank.entry(incident.clone()).or_insert(this);
        if this < *before {
            broken.push(format!(
                "ordered webhook: incident {incident} got {} after a later event",
                body["event"]
            ));
        }
        *before = (*before).max(this);
    }
    for ((event, webhook), n) in &per_pair {
        if *n > 1 {
            broken.push(format!("event {event} has {n} deliveries for {webhook}"));
        }
    }
    for hook in &system.hooks {
        let mut listed = 0;
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/api/v1/deliveries?webhook_id={hook}&limit=200");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = system.admin("GET", &path, None).await;
            listed += page["items"].as_array().map_or(0, Vec::len);
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        let stored = all.iter().filter(|d| d.webhook_id == *hook).count();
        if listed != stored {
            broken.push(format!(
                "webhook {hook}: {stored} deliveries, {listed} in the log"
            ));
        }
    }
    let incidents = system.db.count("incidents").await as usize;
    if incidents > next_key || events.is_empty() {
        broken.push(format!(
            "{incidents} incidents from {next_key} keys and {} events",
            events.len()
        ));
    }

    eprintln!(
        "invariant seed {seed}: {accepted} alerts accepted, {} events, {} deliveries, {} attempts \
         ({} automatic), {} requests received, {unlogged} unlogged, {not_sent} logged but not \
         received (interrupted, not sent, or timed out: {timed_out_unseen}), {} problems",
        events.len(),
        all.len(),
        attempts.len(),
        automatic.values().map(|(_, n)| *n as usize).sum::<usize>(),
        received.values().sum::<usize>(),
        broken.len()
    );
    system.stop().await;
    eprintln!("invariant seed {seed}: stopped after {:?}", began.elapsed());
    broken
}

/// The invariant a problem breaks, from its text.
fn kind_of(problem: &str) -> &'static str {
    [
        (
            "automatic attempts, max_attempts",
            "more automatic attempts than max_attempts",
        ),
        (
            "not logged",
            "a request the target got is not in the attempt log",
        ),
        (
            "was sent",
            "one logged attempt reached the target more than once",
        ),
        (
            "never got it",
            "a logged attempt (not interrupted, not `not_sent`, not a whole timeout) never reached the target",
        ),
        ("succeeded, now", "a succeeded delivery changed state"),
        (
            "had a successful attempt",
            "a delivery with a successful attempt is not succeeded",
        ),
        (
            "for the stable webhook",
            "an event without its delivery to a subscribed webhook",
        ),
        (
            "for the ordered webhook",
            "an event without its delivery to the ordered webhook",
        ),
        (
            "after a later event",
            "an ordered webhook got an incident's events out of order",
        ),
        (
            "deliveries for",
            "an event with two deliveries to one webhook",
        ),
        ("in the log", "a delivery missing from the delivery log"),
    ]
    .into_iter()
    .find(|(needle, _)| problem.contains(needle))
    .map_or("other", |(_, kind)| kind)
}

#[tokio::test]
async fn no_interleaving_breaks_the_delivery_engines_invariants() {
    let mut failed = Vec::new();
    // Two seeds at a time, each on a system of its own: a run mostly waits on timers.
    let mut results = Vec::new();
    for pair in seeds().chunks(2) {
        let mut runs = tokio::task::JoinSet::new();
        for &seed in pair {
            runs.spawn(async move { (seed, run(seed).await) });
        }
        while let Some(done) = runs.join_next().await {
            results.push(done.expect("a seed's run"));
        }
    }
    results.sort_by_key(|(seed, _)| *seed);
    for (seed, broken) in results {
        if !broken.is_empty() {
            // Each kind of problem counted, with a few examples.
            let mut kinds: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
            for problem in &broken {
                kinds.entry(kind_of(problem)).or_default().push(problem);
            }
            for (kind, problems) in kinds {
                eprintln!("invariant seed {seed}: {} × {kind}", problems.len());
                for problem in problems.iter().take(3) {
                    eprintln!("invariant seed {seed}:     {problem}");
                }
            }
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "seeds that broke an invariant (replay with TOCSIN_INVARIANT_SEEDS={}): {failed:?}",
        failed
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
}
