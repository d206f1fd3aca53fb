//! The whole of Tocsin in one test process: a database and AMQP prefix of its own, ingest,
//! dispatcher and admin on port 0, an inbound token and an admin token, and a real receiver.
//! Every change a test makes through admin is noted in an audit ledger, and [`System::stop`]
//! first holds admin's audit log to those changes (`tocsin_testkit::audit`).

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde_json::Value;
use tocsin_storage::tokens;
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;
use tokio_util::sync::CancellationToken;

/// The admin token of test systems.
pub const ADMIN_TOKEN: &str = "e2e-admin-token-0123456789";

/// A running system.
pub struct System {
    pub db: TestDb,
    pub prefix: TestPrefix,
    pub ingest: String,
    pub admin: String,
    pub dispatcher: String,
    /// An inbound token for the ingest endpoint.
    pub inbound_token: String,
    pub client: reqwest::Client,
    /// The changes made through [`System::api`] (and those noted with
    /// [`AuditLedger::expect`]), checked by [`System::stop`] against the audit log.
    pub ledger: AuditLedger,
    services: Vec<(
        CancellationToken,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl System {
    /// Starts ingest, dispatcher and admin with the given retry delays.
    pub async fn start(delays: &str) -> System {
        Self::start_with(delays, |_| {}).await
    }

    /// Like [`System::start`], with the dispatcher's settings adjusted first.
    pub async fn start_with(
        delays: &str,
        dispatcher: impl FnOnce(&mut tocsin_dispatcher::Config),
    ) -> System {
        let db = TestDb::new().await;
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
        common.retry_delays = delays.parse().expect("test delays");
        common.shutdown_timeout = Duration::from_secs(3);
        let ingest = tocsin_ingest::build(tocsin_ingest::Config::for_tests(common.clone()))
            .await
            .expect("ingest");
        let mut dispatcher_config = tocsin_dispatcher::Config::for_tests(common.clone());
        dispatcher(&mut dispatcher_config);
        let dispatcher = tocsin_dispatcher::build(dispatcher_config)
            .await
            .expect("dispatcher");
        let admin = tocsin_admin::build(tocsin_admin::Config::for_tests(common, ADMIN_TOKEN))
            .await
            .expect("admin");
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let (ingest_url, dispatcher_url, admin_url) = (
            url(ingest.port()),
            url(dispatcher.port()),
            url(admin.port()),
        );
        let mut services = Vec::new();
        for app in [ingest, dispatcher, admin] {
            let stop = app.stop_token();
            services.push((stop, tokio::spawn(app.run_until_stopped())));
        }
        let mut conn = AsyncPgConnection::establish(&db.url)
            .await
            .expect("database");
        let inbound_token = tokens::create(&mut conn, "e2e")
            .await
            .expect("token")
            .1
            .expose()
            .to_owned();
        System {
            ledger: AuditLedger::new(&db.url, ADMIN_TOKEN),
            db,
            prefix,
            ingest: ingest_url,
            admin: admin_url,
            dispatcher: dispatcher_url,
            inbound_token,
            client: reqwest::Client::new(),
            services,
        }
    }

    /// Calls the admin API; returns the status and the JSON body (`Null` when there is none).
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.admin))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let request = request.build().expect("a request");
        let answer = self.ledger.exchange(&self.client, request).await;
        (answer.status.as_u16(), answer.json())
    }

    /// A webhook's deliveries as the delivery log lists them (its first page), newest first.
    pub async fn deliveries_of(&self, webhook: &str) -> Vec<Value> {
        let (status, body) = self
            .api(
                reqwest::Method::GET,
                &format!("/api/v1/deliveries?webhook_id={webhook}"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["items"].as_array().cloned().unwrap_or_default()
    }

    /// Posts an alert body to ingest; returns the status and the JSON body.
    pub async fn alert(&self, body: &Value) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}/api/v1/webhooks/alerts", self.ingest))
            .bearer_auth(&self.inbound_token)
            .json(body)
            .send()
            .await
            .expect("calling ingest");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The `/metrics` text of a service base URL.
    pub async fn metrics(&self, base: &str) -> String {
        self.client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Holds admin's audit log to the changes the test made, then stops every service
    /// gracefully.
    pub async fn stop(self) {
        let entries = self.ledger.check(&self.client, &self.admin).await;
        eprintln!("the audit log holds the test's {entries} change(s) with their actors");
        for (stop, task) in self.services {
            stop.cancel();
            task.await
                .expect("service task")
                .expect("service stopped cleanly");
        }
    }
}
