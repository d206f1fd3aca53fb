//! What the admin test modules share: admin built and run in process on a database and an AMQP
//! prefix of its own, reached over HTTP on a free port.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_admin::Config;
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;

/// The admin token every test admin runs with.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

pub struct TestAdmin {
    pub db: TestDb,
    pub prefix: TestPrefix,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// A client that does not follow redirects, so that tests see them.
    pub client: reqwest::Client,
    stop: tokio_util::sync::CancellationToken,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestAdmin {
    /// Admin on a new database with the test settings.
    pub async fn start() -> Self {
        Self::start_with(TestDb::new().await, |_| {}).await
    }

    /// Admin on `db`, its settings changed by `adjust`.
    pub async fn start_with(db: TestDb, adjust: impl FnOnce(&mut Config)) -> Self {
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
        common.shutdown_timeout = Duration::from_secs(3);
        let mut config = Config::for_tests(common, ADMIN_TOKEN);
        adjust(&mut config);
        let app = tocsin_admin::build(config).await.expect("building admin");
        let base = format!("http://127.0.0.1:{}", app.port());
        let stop = app.stop_token();
        let running = tokio::spawn(app.run_until_stopped());
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        TestAdmin {
            db,
            prefix,
            base,
            client,
            stop,
            running,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A connection to the admin's database.
    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url).await.unwrap()
    }

    /// Stops admin (it must stop cleanly), then drops its queues.
    pub async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
        drop(self.prefix);
    }
}
