//! `tocsin-bench`: a load generator for a running Tocsin.
//!
//! It talks to the system through its public interfaces only: alerts go to ingest in the
//! generic format, webhooks are created and deleted through the admin API, and deliveries come
//! back to the bench's own receiver ([`receiver`]). Every alert carries a unique id as its
//! `title` and `dedup_key`; deliveries are matched to alerts by `data.title`.
//!
//! Each scenario is a function taking a [`Bench`] (the connection) and a config struct, and
//! returning a [`Report`]. `main` only parses flags and prints.

pub mod aged;
pub mod floor;
pub mod output;
pub mod procs;
pub mod receiver;
mod scenarios;
pub mod soak;
pub mod stages;

pub use scenarios::{
    backlog, e2e, fanout, ingest, latency, scale, slow_target, BacklogConfig, FanoutConfig,
    LatencyConfig, SlowTargetConfig,
};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};

use crate::procs::ProcessCost;
use crate::receiver::BenchReceiver;
use crate::stages::{Reading, StageFigures};

/// Longest the bench waits, after deleting its webhooks, for their first attempts to be done.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The stage that ends after a delivery's receipt, and how long a phase waits at most for it
/// to count every delivery received.
const OUTCOME_STAGE: &str = "dispatcher: outcome";
const OUTCOMES_WAIT: Duration = Duration::from_secs(2);

/// Where the system is and how to talk to it.
#[derive(Debug, Clone)]
pub struct Target {
    pub ingest_url: String,
    pub admin_url: String,
    pub admin_token: String,
    /// `None`: the bench creates one through the admin API.
    pub inbound_token: Option<String>,
    /// How long to wait for deliveries after the last alert was sent.
    pub drain_timeout: Duration,
    /// The `ordering` of the webhooks the bench creates: `none` or `incident`.
    pub ordering: String,
    /// The services' `/metrics` URLs, read before and after each phase for its latency
    /// budget ([`stages`]).
    pub metrics_urls: Vec<String>,
}

/// The admin token written by `deploy/local/up`: `.tocsin/admin-token` in this directory or
/// the nearest parent that has one.
pub fn default_admin_token() -> Option<String> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|dir| dir.join(".tocsin/admin-token"))
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty())
}

/// A connection to a running system, with the bench's receiver.
pub struct Bench {
    target: Target,
    inbound_token: String,
    client: reqwest::Client,
    receiver: BenchReceiver,
    webhooks: Mutex<Vec<String>>,
    run: String,
    phase: AtomicUsize,
}

/// One alert sent.
#[derive(Debug, Clone)]
struct Sent {
    id: String,
    at: Instant,
    took: Duration,
    error: Option<String>,
}

/// How alerts are sent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Load {
    /// `concurrency` senders, each sending its next alert when the last one is answered.
    Closed { concurrency: usize },
    /// Alerts started at a fixed rate per second, whatever the answers.
    Open { rate: f64 },
}

/// Alerts to send and how.
#[derive(Debug, Clone, Copy)]
pub struct LoadConfig {
    pub alerts: usize,
    pub load: Load,
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(mut values: Vec<f64>) -> Option<Percentiles> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            values[rank - 1]
        };
        Some(Percentiles {
            count: values.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: values[values.len() - 1],
        })
    }
}

/// One measured run: alerts sent, deliveries received.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    pub load: Load,
    pub alerts_sent: usize,
    pub alerts_accepted: usize,
    /// Alerts ingest did not accept (an answer other than 202, or no answer).
    pub errors: usize,
    /// Up to five error messages.
    pub error_samples: Vec<String>,
    pub send_seconds: f64,
    pub accepted_per_sec: f64,
    pub ingest_ms: Option<Percentiles>,
    /// Webhooks each accepted alert should reach (on the measured receiver paths).
    pub webhooks: usize,
    pub expected_deliveries: usize,
    pub received: usize,
    /// Deliveries that arrived again with a `webhook-id` already seen.
    pub duplicates: usize,
    /// Expected deliveries not received within the drain timeout.
    pub lost: usize,
    /// From the first send to the last receipt.
    pub end_to_end_seconds: f64,
    pub deliveries_per_sec: f64,
    /// From each alert's send to its delivery's receipt.
    pub latency_ms: Option<Percentiles>,
    /// The latency budget: each stage of the alerts' way over the phase, as the services
    /// measured it (empty when their `/metrics` could not be read).
    pub stages: Vec<StageFigures>,
    /// Send offset from the phase start (s) and latency (ms) of every delivery, for the chart.
    #[serde(skip)]
    pub series: Vec<(f64, f64)>,
}

/// What a scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub label: Option<String>,
    pub phases: Vec<Phase>,
    /// CPU and memory of each Tocsin process found on this machine during the scenario.
    pub processes: Vec<ProcessCost>,
    /// Scenario-specific figures (fan-out time, healthy share, RSS range...).
    pub figures: BTreeMap<String, f64>,
    pub notes: Vec<String>,
}

impl Report {
    fn new(scenario: &str) -> Report {
        Report {
            scenario: scenario.to_owned(),
            label: None,
            phases: Vec::new(),
            processes: Vec::new(),
            figures: BTreeMap::new(),
            notes: Vec::new(),
        }
    }

    /// Lost deliveries over all phases.
    pub fn lost(&self) -> usize {
        self.phases.iter().map(|p| p.lost).sum()
    }

    pub fn duplicates(&self) -> usize {
        self.phases.iter().map(|p| p.duplicates).sum()
    }

    pub fn errors(&self) -> usize {
        self.phases.iter().map(|p| p.errors).sum()
    }

    fn finish_processes(&mut self, processes: Vec<ProcessCost>) {
        if processes.is_empty() {
            self.notes.push(
                "no tocsin-ingest/dispatcher/admin process found on this machine: CPU and RSS not measured"
                    .into(),
            );
        }
        self.processes = processes;
    }
}

/// Which receiver paths a phase measures and how many webhooks point at them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measure<'a> {
    class: &'a str,
    webhooks: usize,
}

impl<'a> Measure<'a> {
    /// The `webhooks` pointing at the receiver paths of `class` (`ok`, `fail`, `hang`).
    pub(crate) fn new(class: &'a str, webhooks: usize) -> Self {
        Measure { class, webhooks }
    }
}

impl Bench {
    /// Connects: checks the admin token, creates an inbound token when none was given, and
    /// starts the receiver.
    pub async fn connect(target: Target) -> anyhow::Result<Bench> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(30))
            .build()?;
        let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let inbound_token = match &target.inbound_token {
            Some(token) => token.clone(),
            None => {
                let response = client
                    .post(format!("{}/api/v1/tokens", target.admin_url))
                    .bearer_auth(&target.admin_token)
                    .json(&json!({"name": format!("tocsin-bench {run}")}))
                    .send()
                    .await
                    .with_context(|| format!("calling admin at {}", target.admin_url))?;
                let status = response.status();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status.as_u16() != 201 {
                    bail!("creating an inbound token: admin answered {status}: {body}");
                }
                body["token"]
                    .as_str()
                    .context("no token in the admin answer")?
                    .to_owned()
            }
        };
        Ok(Bench {
            target,
            inbound_token,
            client,
            receiver: BenchReceiver::start().await?,
            webhooks: Mutex::new(Vec::new()),
            run,
            phase: AtomicUsize::new(0),
        })
    }

    /// Creates a webhook for `incidents.opened` pointing at `path` on the bench's receiver.
    async fn create_webhook(
        &self,
        path: &str,
        max_attempts: u32,
        timeout_ms: u32,
    ) -> anyhow::Result<String> {
        let mut body = json!({
            "name": format!("tocsin-bench {} {path}", self.run),
            "url": self.receiver.url(path),
            "events": ["incidents.opened"],
            "retry": {"max_attempts": max_attempts, "timeout_ms": timeout_ms},
        });
        // Left out when it is the default, so that the bench drives a build that has no such
        // setting (an A/B against an earlier release).
        if self.target.ordering != "none" {
            body["ordering"] = Value::from(self.target.ordering.as_str());
        }
        let response = self
            .client
            .post(format!("{}/api/v1/webhooks", self.target.admin_url))
            .bearer_auth(&self.target.admin_token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if status.as_u16() != 201 {
            bail!("creating a webhook: admin answered {status}: {answer}");
        }
        let id = answer["id"]
            .as_str()
            .context("no id in the webhook answer")?
            .to_owned();
        self.webhooks.lock().expect("webhooks").push(id.clone());
        Ok(id)
    }

    /// Creates `n` webhooks at `{prefix}/0` .. `{prefix}/{n-1}`, 16 at a time.
    async fn create_webhooks(
        &self,
        prefix: &str,
        n: usize,
        max_attempts: u32,
        timeout_ms: u32,
    ) -> anyhow::Result<()> {
        use futures::StreamExt as _;
        let paths: Vec<String> = (0..n).map(|i| format!("{prefix}/{i}")).collect();
        let mut stream = futures::stream::iter(paths.iter())
            .map(|path| self.create_webhook(path, max_attempts, timeout_ms))
            .buffer_unordered(16);
        while let Some(result) = stream.next().await {
            result?;
        }
        Ok(())
    }

    /// Deletes every webhook the bench created.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        let ids = std::mem::take(&mut *self.webhooks.lock().expect("webhooks"));
        let mut failures = Vec::new();
        for chunk in ids.chunks(16) {
            let calls = chunk.iter().map(|id| async move {
                let response = self
                    .client
                    .delete(format!("{}/api/v1/webhooks/{id}", self.target.admin_url))
                    .bearer_auth(&self.target.admin_token)
                    .send()
                    .await;
                match response {
                    Ok(r) if r.status().as_u16() == 204 || r.status().as_u16() == 404 => None,
                    Ok(r) => Some(format!("{id}: {}", r.status())),
                    Err(e) => Some(format!("{id}: {e}")),
                }
            });
            failures.extend(futures::future::join_all(calls).await.into_iter().flatten());
        }
        if !failures.is_empty() {
            bail!("deleting webhooks failed: {}", failures.join(", "));
        }
        self.settle(ids).await;
        Ok(())
    }

    /// Waits (up to [`SETTLE_TIMEOUT`]) until no deleted webhook of the bench has a delivery
    /// waiting for its first attempt: Tocsin stops those of a deleted webhook as they come up,
    /// and that work would otherwise fall into the next run's measurement. Deliveries waiting
    /// for a retry are not waited for (the retry delays are minutes).
    async fn settle(&self, mut ids: Vec<String>) {
        use futures::StreamExt as _;
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !ids.is_empty() && Instant::now() < deadline {
            let pending: Vec<String> = futures::stream::iter(ids)
                .map(|id| async move {
                    let url = format!(
                        "{}/api/v1/deliveries?webhook_id={id}&state=pending&limit=1",
                        self.target.admin_url
                    );
                    let answer = self
                        .client
                        .get(url)
                        .bearer_auth(&self.target.admin_token)
                        .send()
                        .await;
                    let page: Option<Value> = match answer {
                        Ok(r) if r.status().is_success() => r.json().await.ok(),
                        _ => None,
                    };
                    let settled = page.is_some_and(|p| {
                        p["items"].as_array().is_some_and(|items| items.is_empty())
                    });
                    (!settled).then_some(id)
                })
                .buffer_unordered(16)
                .filter_map(|id| async move { id })
                .collect()
                .await;
            ids = pending;
            if !ids.is_empty() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        if !ids.is_empty() {
            eprintln!(
                "note: {} deleted webhook(s) still had pending deliveries after {SETTLE_TIMEOUT:?}",
                ids.len()
            );
        }
    }

    fn next_prefix(&self) -> String {
        let n = self.phase.fetch_add(1, Ordering::Relaxed);
        format!("bench-{}-{n}-", self.run)
    }

    async fn send_one(&self, id: String) -> Sent {
        let body = json!({"title": id, "dedup_key": id, "severity": "warning"});
        let at = Instant::now();
        let result = self
            .client
            .post(format!("{}/api/v1/webhooks/alerts", self.target.ingest_url))
            .bearer_auth(&self.inbound_token)
            .json(&body)
            .send()
            .await;
        let error = match result {
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                (status.as_u16() != 202).then(|| format!("{status}: {text}"))
            }
            Err(e) => Some(e.to_string()),
        };
        Sent {
            id,
            at,
            took: at.elapsed(),
            error,
        }
    }

    /// Sends `alerts` alerts with ids `{prefix}{i}`.
    async fn send_load(self: &Arc<Self>, prefix: &str, config: LoadConfig) -> Vec<Sent> {
        let sent = Arc::new(Mutex::new(Vec::with_capacity(config.alerts)));
        match config.load {
            Load::Closed { concurrency } => {
                let next = Arc::new(AtomicUsize::new(0));
                let mut senders = Vec::new();
                for _ in 0..concurrency.max(1) {
                    let (bench, next, sent) = (self.clone(), next.clone(), sent.clone());
                    let prefix = prefix.to_owned();
                    senders.push(tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= config.alerts {
                                break;
                            }
                            let one = bench.send_one(format!("{prefix}{i}")).await;
                            sent.lock().expect("sent").push(one);
                        }
                    }));
                }
                for sender in senders {
                    let _ = sender.await;
                }
            }
            Load::Open { rate } => {
                let start = tokio::time::Instant::now();
                let mut tasks = Vec::with_capacity(config.alerts);
                for i in 0..config.alerts {
                    let due = start + Duration::from_secs_f64(i as f64 / rate.max(0.001));
                    tokio::time::sleep_until(due).await;
                    let (bench, sent) = (self.clone(), sent.clone());
                    let id = format!("{prefix}{i}");
                    tasks.push(tokio::spawn(async move {
                        let one = bench.send_one(id).await;
                        sent.lock().expect("sent").push(one);
                    }));
                }
                for task in tasks {
                    let _ = task.await;
                }
            }
        }
        let mut sent = std::mem::take(&mut *sent.lock().expect("sent"));
        sent.sort_by_key(|s| s.at);
        sent
    }

    /// Sends the load, waits for the deliveries on the measured paths, and analyses them.
    async fn phase(
        self: &Arc<Self>,
        name: &str,
        config: LoadConfig,
        measure: Option<Measure<'_>>,
    ) -> Phase {
        let prefix = self.next_prefix();
        self.receiver.begin(&prefix);
        let stages_before = Reading::take(&self.client, &self.target.metrics_urls).await;
        let started = Instant::now();
        let sent = self.send_load(&prefix, config).await;
        let send_seconds = started.elapsed().as_secs_f64();
        let accepted: Vec<&Sent> = sent.iter().filter(|s| s.error.is_none()).collect();
        let (class, webhooks) = measure
            .as_ref()
            .map(|m| (m.class, m.webhooks))
            .unwrap_or(("ok", 0));
        let expected = accepted.len() * webhooks;
        if expected > 0 {
            let deadline = Instant::now() + self.target.drain_timeout;
            self.receiver.wait_for(class, expected, deadline).await;
        }
        let seen = self.receiver.seen();
        // The outcome stage ends after the receipt: the last deliveries' outcomes may still be
        // committing. Read again, for a moment at most, until each is counted.
        let outcomes_deadline = Instant::now() + OUTCOMES_WAIT;
        let mut reading = Reading::take(&self.client, &self.target.metrics_urls).await;
        while reading.counted_since(&stages_before, OUTCOME_STAGE) < expected as u64
            && Instant::now() < outcomes_deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            reading = Reading::take(&self.client, &self.target.metrics_urls).await;
        }
        let stages = reading.since(&stages_before);
        let sent_at: HashMap<&str, Instant> =
            accepted.iter().map(|s| (s.id.as_str(), s.at)).collect();
        let first = sent.first().map(|s| s.at).unwrap_or(started);
        let mut series = Vec::new();
        let mut last = None::<Instant>;
        let mut received = 0;
        for arrival in seen.arrivals.iter().filter(|a| a.class == class) {
            let Some(at) = sent_at.get(arrival.title.as_str()) else {
                continue;
            };
            received += 1;
            last = Some(last.map_or(arrival.at, |l| l.max(arrival.at)));
            series.push((
                at.duration_since(first).as_secs_f64(),
                arrival.at.saturating_duration_since(*at).as_secs_f64() * 1000.0,
            ));
        }
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
        let end_to_end = last
            .map(|l| l.duration_since(first).as_secs_f64())
            .unwrap_or(0.0);
        let errors: Vec<&String> = sent.iter().filter_map(|s| s.error.as_ref()).collect();
        Phase {
            name: name.to_owned(),
            load: config.load,
            alerts_sent: sent.len(),
            alerts_accepted: accepted.len(),
            errors: errors.len(),
            error_samples: errors.iter().take(5).map(|e| e.to_string()).collect(),
            send_seconds,
            accepted_per_sec: rate(accepted.len(), send_seconds),
            ingest_ms: Percentiles::of(
                sent.iter().map(|s| s.took.as_secs_f64() * 1000.0).collect(),
            ),
            webhooks,
            expected_deliveries: expected,
            received,
            duplicates: seen.duplicates,
            lost: expected.saturating_sub(received),
            end_to_end_seconds: end_to_end,
            deliveries_per_sec: rate(received, end_to_end),
            latency_ms: Percentiles::of(series.iter().map(|(_, l)| *l).collect()),
            stages,
            series,
        }
    }
}

fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// Writes the report as JSON.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A path given on the command line, made absolute for messages.
pub fn display_path(path: &Path) -> PathBuf {
    std::env::current_dir()
        .map(|d| d.join(path))
        .unwrap_or_else(|_| path.to_owned())
}
