//! Faults injected into the real servers while alerts stream in: RabbitMQ restarted, PostgreSQL
//! stopped. Every alert that got a 202 must reach the target at least once, and nothing may be
//! left unfinished. These tests stop shared servers: they run alone, after every other test.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_domain::config::CommonConfig;
use tocsin_domain::db::deliveries::{self, DeliveryFilter, DeliveryState};
use tocsin_domain::db::webhooks::{self, NewWebhook};
use tocsin_domain::db::{tokens, Page};
use tocsin_domain::{EventKind, RetrySettings, TargetUrl, WebhookName};
use tocsin_testkit::{amqp_url, servers, wait_for, Behavior, Receiver, TestDb, TestPrefix};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(90);

struct System {
    db: TestDb,
    _prefix: TestPrefix,
    ingest_url: String,
    token: String,
    receiver: Receiver,
    webhook: uuid::Uuid,
    stops: Vec<(
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl System {
    async fn start() -> System {
        let db = TestDb::new().await;
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
        common.retry_delays = "0s,500ms,1s,2s,2s".parse().unwrap();
        common.shutdown_timeout = Duration::from_secs(3);
        let ingest = tocsin_ingest::build(tocsin_ingest::Config::for_tests(common.clone()))
            .await
            .unwrap();
        let ingest_url = format!("http://127.0.0.1:{}/api/v1/webhooks/alerts", ingest.port());
        let dispatcher = tocsin_dispatcher::build(tocsin_dispatcher::Config::for_tests(common))
            .await
            .unwrap();
        let mut stops = Vec::new();
        for app in [ingest, dispatcher] {
            let stop = app.stop_token();
            stops.push((stop, tokio::spawn(app.run_until_stopped())));
        }
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let token = tokens::create(&mut conn, "faults")
            .await
            .unwrap()
            .1
            .expose()
            .to_owned();
        let receiver = Receiver::start_with(Behavior::Delay(Duration::from_millis(5), 200)).await;
        let webhook = webhooks::create(
            &mut conn,
            &NewWebhook {
                name: WebhookName::parse("faults").unwrap(),
                url: TargetUrl::parse(&receiver.url("/faults")).unwrap(),
                events: [EventKind::IncidentOpened]
                    .into_iter()
                    .collect::<BTreeSet<_>>(),
                retry: RetrySettings::new(5, 2_000).unwrap(),
                enabled: true,
            },
        )
        .await
        .unwrap()
        .id;
        System {
            db,
            _prefix: prefix,
            ingest_url,
            token,
            receiver,
            webhook,
            stops,
        }
    }

    /// Sends `n` alerts, one after another, each retried on 5xx or transport errors until
    /// accepted (as Alertmanager does). Returns how many answers were 503.
    async fn stream(
        &self,
        n: usize,
        accepted: Arc<Mutex<usize>>,
        refused: Arc<AtomicUsize>,
    ) -> usize {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut unavailable = 0;
        for i in 0..n {
            let body = format!(r#"{{"title":"fault {i}","dedup_key":"fault-{i}"}}"#);
            let started = Instant::now();
            loop {
                assert!(started.elapsed() < DEADLINE, "alert {i} never accepted");
                let answer = client
                    .post(&self.ingest_url)
                    .bearer_auth(&self.token)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                match answer.map(|r| r.status().as_u16()) {
                    Ok(202) => break,
                    Ok(503) | Err(_) => {
                        unavailable += 1;
                        refused.fetch_add(1, Ordering::SeqCst);
                        // The sender's own back-off before it retries, as Alertmanager's.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Ok(other) => panic!("alert {i}: unexpected {other}"),
                }
            }
            *accepted.lock().unwrap() += 1;
        }
        unavailable
    }

    /// Waits until every delivery succeeded and the receiver saw each of `n` deliveries;
    /// returns (requests seen, distinct deliveries).
    async fn settle(&self, n: usize) -> (usize, usize) {
        let pending = wait_for("every delivery to succeed", DEADLINE, || async {
            let Ok(mut conn) = AsyncPgConnection::establish(&self.db.url).await else {
                return None;
            };
            let (items, _) = deliveries::list(
                &mut conn,
                &DeliveryFilter {
                    webhook_id: Some(self.webhook),
                    ..DeliveryFilter::default()
                },
                &Page {
                    limit: 200,
                    cursor: None,
                },
            )
            .await
            .ok()?;
            (items.len() == n && items.iter().all(|d| d.state == DeliveryState::Succeeded))
                .then_some(items)
        })
        .await;
        assert_eq!(pending.len(), n);
        let ids: HashSet<String> = self
            .receiver
            .requests()
            .iter()
            .map(|r| r.header("webhook-id").unwrap().to_owned())
            .collect();
        (self.receiver.count(), ids.len())
    }

    async fn stop(self) {
        for (stop, task) in self.stops {
            stop.cancel();
            task.await.unwrap().unwrap();
        }
    }
}

fn report(scenario: &str, accepted: usize, delivered: usize, requests: usize, recovery: Duration) {
    eprintln!(
        "| {scenario} | {accepted} | {accepted} | {delivered} | {} | {} | {:.1} s |",
        requests - delivered,
        accepted - delivered,
        recovery.as_secs_f64()
    );
}

#[tokio::test]
async fn restarting_rabbitmq_in_the_middle_of_the_stream_loses_nothing() {
    let system = System::start().await;
    const ALERTS: usize = 120;
    let accepted = Arc::new(Mutex::new(0));
    let stream = system.stream(ALERTS, accepted.clone(), Arc::default());
    let fault = async {
        wait_for("a third of the stream", DEADLINE, || async {
            (*accepted.lock().unwrap() >= ALERTS / 3).then_some(())
        })
        .await;
        let started = Instant::now();
        servers::restart_rabbitmq().await;
        started
    };
    let (unavailable, fault_started) = tokio::join!(stream, fault);
    assert_eq!(unavailable, 0, "RabbitMQ being down never fails an alert");
    let (requests, delivered) = system.settle(ALERTS).await;
    assert_eq!(delivered, ALERTS, "every accepted alert reached the target");
    report(
        "restart RabbitMQ",
        ALERTS,
        delivered,
        requests,
        fault_started.elapsed(),
    );
    system.stop().await;
}

#[tokio::test]
async fn stopping_postgresql_in_the_middle_of_the_stream_loses_nothing() {
    let system = System::start().await;
    const ALERTS: usize = 120;
    let accepted = Arc::new(Mutex::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let stream = system.stream(ALERTS, accepted.clone(), refused.clone());
    let fault = async {
        wait_for("a third of the stream", DEADLINE, || async {
            (*accepted.lock().unwrap() >= ALERTS / 3).then_some(())
        })
        .await;
        let started = Instant::now();
        servers::stop_postgres().await;
        // Down until the sender has been refused for a while (about two seconds of retries).
        wait_for("twenty refused sends", DEADLINE, || async {
            (refused.load(Ordering::SeqCst) >= 20).then_some(())
        })
        .await;
        servers::start_postgres().await;
        started
    };
    let (unavailable, fault_started) = tokio::join!(stream, fault);
    assert!(
        unavailable > 0,
        "ingest answered 503 while PostgreSQL was down"
    );
    let (requests, delivered) = system.settle(ALERTS).await;
    assert_eq!(delivered, ALERTS);
    report(
        "stop PostgreSQL",
        ALERTS,
        delivered,
        requests,
        fault_started.elapsed(),
    );
    system.stop().await;
}
