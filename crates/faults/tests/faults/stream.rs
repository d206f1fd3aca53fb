//! The steady stream of alerts every scenario runs its fault under, and the wait for the first
//! delivery after the fault.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tocsin_testkit::{wait_for, Received};
use tokio_util::sync::CancellationToken;

use crate::system::System;

/// How long the system may take to accept or deliver again after a fault.
pub const RECOVERY_DEADLINE: Duration = Duration::from_secs(120);
/// One alert every this long, while the stream runs.
const ALERT_EVERY: Duration = Duration::from_millis(50);
/// How long the sender waits before sending a refused alert again (Alertmanager backs off
/// before it retries too). This is the sender's behaviour, not a wait for the system.
const SENDER_BACKOFF: Duration = Duration::from_millis(100);

pub struct Stream {
    stop: CancellationToken,
    /// Alerts answered 202, with when they were first sent.
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
    /// Answers other than 202 (5xx or no answer), each followed by the sender's retry.
    refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// Starts sending alerts to the system's ingest in the background.
    pub fn start(system: &System) -> Stream {
        let stop = CancellationToken::new();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(send_alerts(
            system.client.clone(),
            system.ingest_url(),
            system.token.clone(),
            stop.clone(),
            accepted.clone(),
            refused.clone(),
        ));
        Stream {
            stop,
            accepted,
            refused,
            task,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// Waits until `n` more alerts were accepted.
    pub async fn wait_more(&self, n: usize) {
        let target = self.accepted() + n;
        wait_for("more alerts accepted", RECOVERY_DEADLINE, || async {
            (self.accepted() >= target).then_some(())
        })
        .await;
    }

    /// Waits until the sender has been refused `n` more times.
    pub async fn wait_refused(&self, n: usize) {
        let target = self.refused() + n;
        wait_for("refused sends", RECOVERY_DEADLINE, || async {
            (self.refused() >= target).then_some(())
        })
        .await;
    }

    /// From `since` until the system's first (healthy) webhook got an alert first sent after
    /// that moment.
    pub async fn wait_recovered(&self, system: &System, since: Instant) -> Duration {
        let healthy = &system.targets[0].receiver;
        wait_for(
            "a delivery of an alert first sent after the fault",
            RECOVERY_DEADLINE,
            || async {
                let after: HashSet<usize> = self
                    .accepted
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, sent)| *sent > since)
                    .map(|(i, _)| *i)
                    .collect();
                healthy
                    .requests()
                    .iter()
                    .filter(|r| alert_index(r).is_some_and(|i| after.contains(&i)))
                    .map(|r| r.at.duration_since(since))
                    .min()
            },
        )
        .await
    }

    /// Stops the stream; the indices of the accepted alerts.
    pub async fn finish(self) -> Vec<usize> {
        self.stop.cancel();
        self.task.await.unwrap();
        let accepted = self.accepted.lock().unwrap();
        accepted.iter().map(|(i, _)| *i).collect()
    }
}

/// Sends alerts one after another, one every [`ALERT_EVERY`], each retried on 5xx and
/// transport errors until accepted (as Alertmanager does, after its own back-off), until `stop`.
async fn send_alerts(
    client: reqwest::Client,
    url: String,
    token: String,
    stop: CancellationToken,
    accepted: Arc<Mutex<Vec<(usize, Instant)>>>,
    refused: Arc<AtomicUsize>,
) {
    let mut pace = tokio::time::interval(ALERT_EVERY);
    for i in 0.. {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pace.tick() => {}
        }
        let body = format!(r#"{{"title":"stream {i}","dedup_key":"stream-{i}"}}"#);
        let started = Instant::now();
        // The first tick is at once; each retry comes a back-off after the send before it.
        let mut sends = tokio::time::interval(SENDER_BACKOFF);
        sends.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            sends.tick().await;
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
                _ => {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        accepted.lock().unwrap().push((i, started));
    }
}

/// The alert a delivered request carries (its title is `stream <i>`).
pub fn alert_index(request: &Received) -> Option<usize> {
    let body: Value = serde_json::from_slice(&request.body).ok()?;
    body["data"]["title"]
        .as_str()?
        .strip_prefix("stream ")?
        .parse()
        .ok()
}
