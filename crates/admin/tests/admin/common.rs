//! The set-up every module of this binary shares: an admin on port 0 with a database and an
//! AMQP prefix of its own, a client that follows no redirect (the pages answer with them), an
//! audit ledger that notes every change a request or a CLI run makes, and a stop that first holds
//! the audit log to those changes (`tocsin_testkit::audit`). Each module wraps it in a
//! `TestAdmin` of its own, which derefs to it, and adds the helpers it needs there (so that their
//! names never collide across modules); the modules of the API share the one of `api`. Requests
//! go through [`RunningAdmin::exchange`], CLI runs through [`RunningAdmin::cli`].

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_admin::Config;
use tocsin_testkit::audit::{Actor, Answer, AuditLedger, Change};
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;

/// A running admin.
pub struct RunningAdmin {
    pub db: TestDb,
    pub prefix: TestPrefix,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub client: reqwest::Client,
    /// Every change made through [`Self::exchange`] (and [`Self::cli`]), checked by
    /// [`Self::stop`] against the audit log.
    pub ledger: AuditLedger,
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
        let ledger = AuditLedger::new(&db.url, token);
        RunningAdmin {
            ledger,
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

    /// Sends `request` (made with [`Self::client`]), noting in the ledger what it changed.
    pub async fn exchange(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = request.build().expect("a request");
        self.ledger.exchange(&self.client, request).await
    }

    /// Runs the built `tocsin-admin` with only `env` (and `USER` when `user` is given), noting
    /// the change a successful command makes; (success, stdout, stderr).
    pub fn cli(
        &self,
        env: &[(&str, &str)],
        user: Option<&str>,
        args: &[&str],
    ) -> (bool, String, String) {
        let mut env = env.to_vec();
        if let Some(user) = user {
            env.push(("USER", user));
        }
        let (ok, stdout, stderr) = crate::binary::cli(&env, args);
        if ok {
            if let Some((action, id)) = cli_change(args) {
                self.ledger
                    .expect(Change::new(action, id, "cli", Actor::cli(user)));
            }
            for secret in stdout
                .split_whitespace()
                .filter(|s| s.starts_with("tak_") || s.starts_with("tsn_"))
            {
                self.ledger.secret(secret);
            }
        }
        (ok, stdout, stderr)
    }

    /// Signs in to the settings pages with `credential` (an admin key or the admin token):
    /// the session cookie (`name=value`) and the CSRF token its forms carry.
    pub async fn sign_in(&self, credential: &str) -> (String, String) {
        let response = self
            .exchange(
                self.client
                    .post(self.url("/settings/sign-in"))
                    .form(&[("token", credential)]),
            )
            .await;
        assert_eq!(response.status.as_u16(), 303, "signing in");
        let cookie = response
            .headers
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

    /// Holds the audit log to the changes the test made (see `tocsin_testkit::audit`), then
    /// stops admin and waits until it has stopped.
    pub async fn stop(self) {
        let entries = self.ledger.check(&self.client, &self.base).await;
        eprintln!("the audit log holds the test's {entries} change(s) with their actors");
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
        drop(self.prefix);
    }
}

/// What a successful CLI command changes: its audit action and, when the command names it, the
/// resource's id. `None` for the commands the audit log does not record: lists, `audit`,
/// `migrate` and `reshape` (the schema's upkeep) and `parked` (which needs no database).
fn cli_change(args: &[&str]) -> Option<(&'static str, Option<String>)> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| *a == name)
            .and_then(|at| args.get(at + 1))
            .map(|id| (*id).to_owned())
    };
    match args {
        ["token", "create", ..] => Some(("token.create", None)),
        ["token", "revoke", id] => Some(("token.revoke", Some((*id).to_owned()))),
        ["key", "create", ..] => Some(("admin_key.create", None)),
        ["key", "revoke", id] => Some(("admin_key.revoke", Some((*id).to_owned()))),
        ["deliveries", "retry", id] => Some(("delivery.retry", Some((*id).to_owned()))),
        ["deliveries", "recover", ..] => Some(("webhook.recover", flag("--webhook"))),
        ["deliveries", "replay", ..] => Some(("webhook.replay", flag("--webhook"))),
        ["prune", ..] => Some(("delivery.prune", None)),
        _ => None,
    }
}
