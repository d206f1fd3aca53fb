//! What the ingest tests share: the service started on port 0 against its own database and
//! AMQP prefix, with a token, and ways to post to it and watch what it published.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lapin::options::BasicGetOptions;
use reqwest::StatusCode;
use serde_json::Value;
use tocsin_broker::messages::EventMessage;
use tocsin_broker::Broker;
use tocsin_ingest::{Config, SnsHosts};
use tocsin_storage::tokens;
use tocsin_testkit::{amqp_url, wait_until, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;
use tocsin_web::ssrf::TargetPolicy;

pub const DEADLINE: Duration = Duration::from_secs(15);

pub fn fixture(name: &str) -> String {
    let path = format!(
        "{}/../domain/tests/fixtures/alerts/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub struct TestIngest {
    pub db: TestDb,
    pub prefix: TestPrefix,
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
    pub observer: Broker,
    pub stop: tokio_util::sync::CancellationToken,
    pub running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub struct Options {
    pub database_url: Option<String>,
    pub amqp_url: Option<String>,
    pub body_limit: usize,
    pub rate_limit: u32,
    /// `TOCSIN_SNS_HOSTS` (default: none).
    pub sns_hosts: String,
    /// `TOCSIN_ALLOWED_TARGETS` (default: none).
    pub allowed_targets: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            database_url: None,
            amqp_url: None,
            body_limit: 512 * 1024,
            rate_limit: 0,
            sns_hosts: String::new(),
            allowed_targets: String::new(),
        }
    }
}

impl TestIngest {
    pub async fn start() -> Self {
        Self::start_with(Options::default(), TestDb::new().await).await
    }

    pub async fn start_with(options: Options, db: TestDb) -> Self {
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(
            options.database_url.as_deref().unwrap_or(&db.url),
            options.amqp_url.as_deref().unwrap_or(&amqp_url()),
            &prefix.prefix,
        );
        common.db_pool_size = 20;
        common.shutdown_timeout = Duration::from_secs(3);
        let mut config = Config::for_tests(common);
        config.body_limit = options.body_limit;
        config.rate_limit = options.rate_limit;
        config.rate_burst = options.rate_limit;
        config.sns_hosts = Some(SnsHosts::parse(&options.sns_hosts).unwrap());
        config.allowed_targets = TargetPolicy::parse(&options.allowed_targets).unwrap();
        let app = tocsin_ingest::build(config).await.expect("building ingest");
        let base = format!("http://127.0.0.1:{}", app.port());
        let stop = app.stop_token();
        let running = tokio::spawn(app.run_until_stopped());
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        let (_, token) = tokens::create(&mut conn, "test").await.unwrap();
        // No webhook: every event is published to the events exchange whoever subscribes.
        let observer = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix).broker("observer");
        observer.check().await.unwrap();
        TestIngest {
            db,
            prefix,
            base,
            token: token.expose().to_owned(),
            client: reqwest::Client::new(),
            observer,
            stop,
            running,
        }
    }

    pub async fn post(&self, body: &str) -> (StatusCode, Value) {
        self.post_with(body, Some(&self.token), "application/json", "")
            .await
    }

    pub async fn post_with(
        &self,
        body: &str,
        token: Option<&str>,
        content_type: &str,
        query: &str,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .post(format!("{}/api/v1/webhooks/alerts{query}", self.base))
            .header("content-type", content_type)
            .body(body.to_owned());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("sending to ingest");
        let status = response.status();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url).await.unwrap()
    }

    pub async fn count(&self, table: &str) -> i64 {
        self.db.count(table).await
    }

    /// Events published to the events exchange so far (read from the fan-out queue), with
    /// their bodies from the events table.
    pub async fn published_events(&self) -> Vec<(String, Value)> {
        let channel = self.observer.channel().await.unwrap();
        let mut events = Vec::new();
        while let Some(message) = channel
            .basic_get(
                self.observer.topology().fanout_queue().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let message = EventMessage::from_bytes(&message.delivery.data).unwrap();
            #[derive(diesel::QueryableByName)]
            struct Event {
                #[diesel(sql_type = diesel::sql_types::Text)]
                kind: String,
                #[diesel(sql_type = diesel::sql_types::Text)]
                body: String,
            }
            let mut conn = self.conn().await;
            let event = diesel::sql_query("SELECT kind, body FROM events WHERE id = $1")
                .bind::<diesel::sql_types::Uuid, _>(message.event_id)
                .load::<Event>(&mut conn)
                .await
                .unwrap()
                .remove(0);
            assert_eq!(
                event.kind,
                message.event.as_str(),
                "the message names the event's kind"
            );
            events.push((event.kind, serde_json::from_str(&event.body).unwrap()));
        }
        events
    }

    /// Waits until `n` events were published (in all) and returns them.
    pub async fn wait_events(&self, n: usize) -> Vec<(String, Value)> {
        let seen = std::sync::Mutex::new(Vec::new());
        wait_until(&format!("{n} published events"), DEADLINE, || async {
            let more = self.published_events().await;
            let mut seen = seen.lock().unwrap();
            seen.extend(more);
            seen.len() >= n
        })
        .await;
        seen.into_inner().unwrap()
    }

    pub async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
        drop(self.prefix);
    }
}
