//! The set-up every module of this binary shares: an admin on port 0 with a database and an
//! AMQP prefix of its own, a client that follows no redirect (the pages answer with them), and a
//! clean stop. Each module wraps it in a `TestAdmin` of its own, which derefs to it, and adds
//! the helpers it needs there (so that their names never collide across modules); the modules of
//! the API share the one of `api`.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_admin::Config;
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;

/// A running admin.
pub struct RunningAdmin {
    pub db: TestDb,
    pub prefix: TestPrefix,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub client: reqwest::Client,
    stop: tokio_util::sync::CancellationToken,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningAdmin {
    /// Starts admin on `db` with the admin token `token`, its settings changed by `adjust`.
    pub async fn start(db: TestDb, token: &str, adjust: impl FnOnce(&mut Config)) -> Self {
        let prefix = TestPrefix::new();
        let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
        common.shutdown_timeout = Duration::from_secs(3);
        let mut config = Config::for_tests(common, token);
        adjust(&mut config);
        let app = tocsin_admin::build(config).await.expect("building admin");
        let base = format!("http://127.0.0.1:{}", app.port());
        let stop = app.stop_token();
        let running = tokio::spawn(app.run_until_stopped());
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client");
        RunningAdmin {
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

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db.url).await.unwrap()
    }

    /// Signs in to the settings pages with `credential` (an admin key or the admin token):
    /// the session cookie (`name=value`) and the CSRF token its forms carry.
    pub async fn sign_in(&self, credential: &str) -> (String, String) {
        let response = self
            .client
            .post(self.url("/settings/sign-in"))
            .form(&[("token", credential)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 303, "signing in");
        let cookie = response
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("a session cookie")
            .to_owned();
        let page = self
            .client
            .get(self.url("/settings/"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let marker = "name=\"csrf\" value=\"";
        let start = page.find(marker).expect("a csrf field") + marker.len();
        let end = page[start..].find('"').unwrap() + start;
        (cookie, page[start..end].to_owned())
    }

    /// Stops it and waits until it has stopped.
    pub async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
        drop(self.prefix);
    }
}
