//! A harness for dispatcher tests: a database and prefix of their own, an outbox relay, and
//! dispatchers started in process on port 0.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use prometheus::Registry;
use tocsin_dispatcher::Config;
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{
    EventKind, IncidentTitle, RetrySettings, Severity, TargetUrl, WebhookName, WebhookOrdering,
};
use tocsin_storage::deliveries::{self, Delivery, DeliveryDetail, DeliveryFilter, DeliveryState};
use tocsin_storage::relay::OutboxRelay;
use tocsin_storage::webhooks::{self, NewWebhook, Webhook, WebhookChanges};
use tocsin_storage::{outbox, Page};
use tocsin_testkit::{amqp_url, wait_for, wait_until, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Running {
    pub port: u16,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

pub struct Harness {
    pub db: TestDb,
    pub prefix: TestPrefix,
    pub common: CommonConfig,
    relay_stop: CancellationToken,
    relay: tokio::task::JoinHandle<()>,
    pub dispatchers: Vec<Running>,
}

impl Harness {
    /// A database, a prefix, a relay and one dispatcher with the given retry delays.
    pub async fn start(delays: &str) -> Harness {
        let mut harness = Self::without_dispatcher(delays).await;
        harness.add_dispatcher(|_| {}).await;
        harness
    }

    pub async fn without_dispatcher(delays: &str) -> Harness {
        let db = TestDb::new().await;
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
        common.retry_delays = delays.parse().expect("test delays");
        common.shutdown_timeout = Duration::from_secs(3);
        let broker = common.broker("test-relay");
        broker.check().await.expect("declaring the topology");
        let relay = OutboxRelay::new(
            db.pool(),
            broker,
            &db.url,
            Duration::from_millis(200),
            &Registry::new(),
        )
        .unwrap();
        let relay_stop = CancellationToken::new();
        let relay = tokio::spawn(relay.run(relay_stop.clone()));
        Harness {
            db,
            prefix,
            common,
            relay_stop,
            relay,
            dispatchers: Vec::new(),
        }
    }

    pub async fn add_dispatcher(&mut self, tweak: impl FnOnce(&mut Config)) -> u16 {
        let mut config = Config::for_tests(self.common.clone());
        tweak(&mut config);
        let app = tocsin_dispatcher::build(config)
            .await
            .expect("building the dispatcher");
        let port = app.port();
        let stop = app.stop_token();
        let task = tokio::spawn(app.run_until_stopped());
        self.dispatchers.push(Running { port, stop, task });
        port
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url).await.unwrap()
    }

    /// Waits until every outbox row is published and the delivery queue has no message left,
    /// ready or unacked: every attempt asked for so far has been handled.
    pub async fn wait_drained(&self) {
        wait_until("the outbox published", DEADLINE, || async {
            self.db.count("outbox WHERE published_at IS NULL").await == 0
        })
        .await;
        let queue = self.common.topology().delivery_queue();
        wait_until("the delivery queue drained", DEADLINE, || async {
            self.prefix
                .queue_info(&queue)
                .await
                .is_some_and(|q| q["messages"] == 0)
        })
        .await;
    }

    pub async fn webhook(
        &self,
        url: &str,
        events: &[EventKind],
        max_attempts: i64,
        timeout_ms: i64,
    ) -> Webhook {
        let mut conn = self.conn().await;
        webhooks::create(
            &mut conn,
            &NewWebhook {
                name: WebhookName::parse("test hook").unwrap(),
                url: TargetUrl::parse(url).unwrap(),
                events: events.iter().copied().collect::<BTreeSet<_>>(),
                retry: RetrySettings::new(max_attempts, timeout_ms).unwrap(),
                enabled: true,
                filters: Default::default(),
                headers: Default::default(),
                rate_limit: None,
                ordering: Default::default(),
            },
        )
        .await
        .unwrap()
    }

    /// Sets a webhook's `ordering`.
    pub async fn set_ordering(&self, id: Uuid, ordering: WebhookOrdering) {
        let mut conn = self.conn().await;
        webhooks::update(
            &mut conn,
            id,
            &WebhookChanges {
                ordering: Some(ordering),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }

    async fn signal(&self, key: &str, action: AlertAction) -> Option<Uuid> {
        let mut conn = self.conn().await;
        let signal = AlertSignal {
            dedup_key: key.into(),
            action,
            title: IncidentTitle::parse(&format!("incident {key}")).unwrap(),
            severity: Severity::SEV2,
            description: None,
            source: None,
            reply_key: None,
            labels: Default::default(),
        };
        tocsin_testkit::apply_signals(&mut conn, &[signal], outbox::Wake::Listeners)
            .await
            .unwrap()[0]
            .incident
            .as_ref()
            .map(|i| i.id)
    }

    /// Opens an incident (one `incidents.opened` event).
    pub async fn open(&self, key: &str) -> Uuid {
        self.signal(key, AlertAction::Trigger).await.unwrap()
    }

    /// Resolves it (`incidents.status_changed` and `incidents.resolved`).
    pub async fn resolve(&self, key: &str) {
        self.signal(key, AlertAction::Resolve).await;
    }

    pub async fn deliveries(&self, webhook_id: Uuid) -> Vec<Delivery> {
        let mut conn = self.conn().await;
        deliveries::list(
            &mut conn,
            &DeliveryFilter {
                webhook_id: Some(webhook_id),
                ..DeliveryFilter::default()
            },
            &Page {
                limit: 200,
                cursor: None,
            },
        )
        .await
        .unwrap()
        .0
    }

    /// Waits until the webhook has `n` deliveries, all in `state`.
    pub async fn wait_state(
        &self,
        webhook_id: Uuid,
        n: usize,
        state: DeliveryState,
    ) -> Vec<Delivery> {
        wait_for(&format!("{n} deliveries {state}"), DEADLINE, || async {
            let found = self.deliveries(webhook_id).await;
            (found.len() == n && found.iter().all(|d| d.state == state)).then_some(found)
        })
        .await
    }

    pub async fn detail(&self, delivery_id: Uuid) -> DeliveryDetail {
        let mut conn = self.conn().await;
        deliveries::get_detail(&mut conn, delivery_id)
            .await
            .unwrap()
    }

    pub async fn stop(self) {
        for dispatcher in self.dispatchers {
            dispatcher.stop().await;
        }
        self.relay_stop.cancel();
        self.relay.await.unwrap();
    }
}

/// The `/metrics` text of the dispatcher on `port`.
pub async fn metrics(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// An event's id and incident, as read back in tests.
#[derive(diesel::QueryableByName)]
pub struct EventRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub incident_id: Uuid,
}
