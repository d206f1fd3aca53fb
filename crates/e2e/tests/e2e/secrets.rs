//! No secret leaks, with the three binaries as separate processes logging at debug level.
//!
//! The test creates webhooks through the admin API (their secrets come back), reveals one
//! secret and rotates another, issues inbound tokens through the API and the CLI, sends alerts
//! with them, resolves an incident, has the deliveries made to loopback receivers (one of them
//! failing first, so that a retry is logged), signs in to the settings pages, and makes failed
//! attempts with wrong admin and inbound tokens until the admin's limit answers 429. Then it
//! looks for every secret and token it handled — the full webhook secrets, their key part after
//! `whsec_` (standard and URL-safe base64), the admin token, the inbound tokens and their secret
//! part — in every process log (and the CLI's messages), every service's `/metrics`, every
//! error body, and every row of every table but `webhooks` (the attempt log stores the
//! signature header, never the secret). It also checks that a line break in a webhook's name is
//! refused and one in its URL never reaches a request line or header.
//!
//! The services stay up throughout, so this is not one of the serial fault tests. It needs the
//! binaries built (`cargo build --bins`, or `cargo nextest run --workspace`).

use std::path::PathBuf;
use std::time::Duration;

use diesel::sql_types::Text;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tocsin_domain::signing;
use tocsin_domain::{AccessToken, WebhookSecret};
use tocsin_testkit::audit::{Actor, AuditLedger, Change};
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_ready, Behavior, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};

const DEADLINE: Duration = Duration::from_secs(60);
/// Wrong admin tokens a minute before admin answers 429.
const AUTH_FAILURES: usize = 3;
/// Debug logs from everything, libraries included (PostgreSQL and RabbitMQ clients, HTTP),
/// as an operator chasing a problem might set it.
const RUST_LOG: &str = "debug";

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    text: String,
}

struct System {
    db: TestDb,
    _prefix: TestPrefix,
    logs: PathBuf,
    admin_token: String,
    ingest: u16,
    dispatcher: u16,
    admin: u16,
    _processes: Vec<ServiceProcess>,
    client: reqwest::Client,
    /// The changes made through admin, held to its audit log at the end.
    ledger: AuditLedger,
    /// Every answer of a refused request, for the secrets check.
    error_bodies: Vec<(String, String)>,
}

impl System {
    async fn start() -> System {
        let db = TestDb::new().await;
        let prefix = TestPrefix::new();
        let logs = std::env::temp_dir().join(format!("tocsin-secrets-{}", prefix.prefix));
        std::fs::create_dir_all(&logs).unwrap();
        // Random, so that finding it anywhere means it leaked.
        let admin_token = format!("admin-{}", AccessToken::generate().expose());
        let (ingest, dispatcher, admin) = (free_port(), free_port(), free_port());
        let common = vec![
            ("DATABASE_URL", db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_RETRY_DELAYS", "0s,300ms,600ms".to_owned()),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "3s".to_owned()),
            ("RUST_LOG", RUST_LOG.to_owned()),
        ];
        let with = |extra: Vec<(&'static str, String)>| {
            let mut env = common.clone();
            env.extend(extra);
            env
        };
        let processes = vec![
            ServiceProcess::spawn_logged(
                &binary("tocsin-admin"),
                &with(vec![
                    ("TOCSIN_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
                    ("TOCSIN_ADMIN_TOKEN", admin_token.clone()),
                    ("TOCSIN_ADMIN_AUTH_FAILURES", AUTH_FAILURES.to_string()),
                    ("TOCSIN_OUTBOX_POLL", "200ms".to_owned()),
                ]),
                Some(&logs.join("admin.log")),
            ),
            ServiceProcess::spawn_logged(
                &binary("tocsin-dispatcher"),
                &with(vec![
                    ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{dispatcher}")),
                    ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".to_owned()),
                    // JSON lines here, text in the others: both formats are checked.
                    ("TOCSIN_LOG_FORMAT", "json".to_owned()),
                ]),
                Some(&logs.join("dispatcher.log")),
            ),
            ServiceProcess::spawn_logged(
                &binary("tocsin-ingest"),
                &with(vec![
                    ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{ingest}")),
                    ("TOCSIN_OUTBOX_POLL", "200ms".to_owned()),
                ]),
                Some(&logs.join("ingest.log")),
            ),
        ];
        for port in [admin, dispatcher, ingest] {
            wait_ready(port, DEADLINE).await;
        }
        System {
            ledger: AuditLedger::new(&db.url, &admin_token),
            db,
            _prefix: prefix,
            logs,
            admin_token,
            ingest,
            dispatcher,
            admin,
            _processes: processes,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            error_bodies: Vec::new(),
        }
    }

    /// Sends `request`; keeps the body of a refusal; returns the status and the body text.
    /// Requests to admin go through the audit ledger.
    async fn send(&mut self, what: &str, request: reqwest::RequestBuilder) -> (StatusCode, String) {
        let request = request.build().expect("a request");
        let (status, headers, text) = if request.url().port() == Some(self.admin) {
            let answer = self.ledger.exchange(&self.client, request).await;
            (answer.status, format!("{:?}", answer.headers), answer.text)
        } else {
            let response = reqwest::Client::execute(&self.client, request)
                .await
                .expect("calling a service");
            let status = response.status();
            let headers = format!("{:?}", response.headers());
            (status, headers, response.text().await.unwrap_or_default())
        };
        if status.is_client_error() || status.is_server_error() {
            self.error_bodies.push((
                format!("the {status} answer to {what}"),
                format!("{headers}\n{text}"),
            ));
        }
        (status, text)
    }

    /// An admin API call with the admin token; returns the status and the JSON answer.
    async fn api(
        &mut self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(
                method.clone(),
                format!("http://127.0.0.1:{}{path}", self.admin),
            )
            .bearer_auth(&self.admin_token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (status, text) = self.send(&format!("{method} {path}"), request).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn alert(&mut self, token: &str, body: Value) -> (StatusCode, Value) {
        let request = self
            .client
            .post(format!(
                "http://127.0.0.1:{}/api/v1/webhooks/alerts",
                self.ingest
            ))
            .bearer_auth(token)
            .json(&body);
        let (status, text) = self.send("an alert", request).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn create_webhook(&mut self, name: &str, url: &str, events: &[&str]) -> (String, String) {
        let (status, created) = self
            .api(
                reqwest::Method::POST,
                "/api/v1/webhooks",
                Some(json!({"name": name, "url": url, "events": events,
                    "retry": {"max_attempts": 3, "timeout_ms": 2000}})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        (
            created["id"].as_str().unwrap().to_owned(),
            created["secret"].as_str().unwrap().to_owned(),
        )
    }
}

/// Every form of a secret worth looking for.
fn forms_of_webhook_secret(secret: &str) -> Vec<String> {
    let key = secret.strip_prefix("whsec_").expect("a whsec_ secret");
    let url_safe = key.replace('+', "-").replace('/', "_");
    vec![
        secret.to_owned(),
        key.to_owned(),
        url_safe.trim_end_matches('=').to_owned(),
    ]
}

fn forms_of_inbound_token(token: &str) -> Vec<String> {
    // tsn_<12-character lookup>_<secret>: the lookup is public (it is stored and shown).
    let secret = &token["tsn_".len() + 13..];
    vec![
        token.to_owned(),
        token["tsn_".len()..].to_owned(),
        secret.to_owned(),
    ]
}

#[tokio::test]
async fn no_secret_or_token_appears_in_logs_metrics_error_bodies_or_the_database() {
    let mut system = System::start().await;
    let alpha = Receiver::start().await;
    let beta = Receiver::start().await;
    // beta fails its first request, so that a failed attempt and a retry are logged.
    beta.script([Behavior::Status(500)]);
    let injected = Receiver::start().await;
    let mut secrets: Vec<(String, String)> = Vec::new();

    // Webhooks: the secrets come back from create, reveal and rotate.
    let (alpha_id, alpha_created) = system
        .create_webhook(
            "alpha",
            &alpha.url("/hook"),
            &[
                "incidents.opened",
                "incidents.status_changed",
                "incidents.resolved",
            ],
        )
        .await;
    let (beta_id, beta_secret) = system
        .create_webhook("beta", &beta.url("/hook"), &["incidents.opened"])
        .await;
    let (status, revealed) = system
        .api(
            reqwest::Method::POST,
            &format!("/api/v1/webhooks/{beta_id}/reveal-secret"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revealed}");
    assert_eq!(revealed["secret"], beta_secret.as_str());
    let (status, rotated) = system
        .api(
            reqwest::Method::POST,
            &format!("/api/v1/webhooks/{alpha_id}/rotate-secret"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let alpha_rotated = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(alpha_rotated, alpha_created);
    for (owner, secret) in [
        ("alpha's first secret", &alpha_created),
        ("alpha's rotated secret", &alpha_rotated),
        ("beta's secret", &beta_secret),
    ] {
        for form in forms_of_webhook_secret(secret) {
            secrets.push((owner.to_owned(), form));
        }
    }

    // Header injection: a line break in a name is refused; in a URL it never reaches the
    // request (the URL parser drops tabs and line breaks).
    let (status, refused) = system
        .api(
            reqwest::Method::POST,
            "/api/v1/webhooks",
            Some(
                json!({"name": "inj\r\nX-Injected: 1", "url": injected.url("/hook"),
                "events": ["incidents.opened"]}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["field"], "name");
    let (injected_id, injected_secret) = system
        .create_webhook(
            "injected",
            &format!("{}\r\nX-Injected: 1", injected.url("/hook")),
            &["incidents.opened"],
        )
        .await;
    for form in forms_of_webhook_secret(&injected_secret) {
        secrets.push(("the injected webhook's secret".to_owned(), form));
    }

    // Inbound tokens: one through the API, one through the CLI.
    let (status, issued) = system
        .api(
            reqwest::Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "through the API"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let api_token = issued["token"].as_str().unwrap().to_owned();
    let cli = std::process::Command::new(binary("tocsin-admin"))
        .args(["token", "create", "--name", "through the CLI"])
        .env_clear()
        .env("DATABASE_URL", &system.db.url)
        .env("RUST_LOG", RUST_LOG)
        .output()
        .expect("running tocsin-admin token create");
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let cli_token = String::from_utf8(cli.stdout).unwrap().trim().to_owned();
    assert!(
        AccessToken::from_presented(&cli_token).is_some(),
        "{cli_token:?}"
    );
    std::fs::write(system.logs.join("admin-token-cli.stderr"), &cli.stderr).unwrap();
    system
        .ledger
        .expect(Change::new("token.create", None, "cli", Actor::cli(None)));
    system.ledger.secret(&cli_token);
    for (owner, token) in [
        ("the API's inbound token", &api_token),
        ("the CLI's inbound token", &cli_token),
    ] {
        for form in forms_of_inbound_token(token) {
            secrets.push((owner.to_owned(), form));
        }
    }
    secrets.push(("the admin token".to_owned(), system.admin_token.clone()));

    // Alerts with both tokens, then a resolution through the admin API.
    let mut incidents = Vec::new();
    for (i, token) in [&api_token, &cli_token, &api_token, &cli_token]
        .into_iter()
        .enumerate()
    {
        let (status, answer) = system
            .alert(
                token,
                json!({"title": format!("secrets {i}"), "dedup_key": format!("secrets-{i}")}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
        incidents.push(answer["incidents"][0]["id"].as_str().unwrap().to_owned());
    }
    let (status, changed) = system
        .api(
            reqwest::Method::PATCH,
            &format!("/api/v1/incidents/{}", incidents[0]),
            Some(json!({"status": "resolved"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");

    // Deliveries: alpha gets 4 opened + status_changed + resolved, signed with both of its
    // secrets (the rotated one's grace period runs); beta 4 (one retried); injected 4.
    let alpha_requests = alpha.wait_for_requests(6, DEADLINE).await;
    let beta_requests = beta.wait_for_requests(5, DEADLINE).await;
    let injected_requests = injected.wait_for_requests(4, DEADLINE).await;
    let verify = |request: &tocsin_testkit::Received, secret: &str| {
        let secret = WebhookSecret::parse(secret).unwrap();
        signing::verify(
            &secret,
            request.header("webhook-id").unwrap(),
            request
                .header("webhook-timestamp")
                .unwrap()
                .parse()
                .unwrap(),
            &request.body,
            request.header("webhook-signature").unwrap(),
        )
    };
    for request in &alpha_requests {
        assert!(verify(request, &alpha_rotated) && verify(request, &alpha_created));
    }
    for request in &beta_requests {
        assert!(verify(request, &beta_secret));
    }
    for request in &injected_requests {
        assert!(verify(request, &injected_secret));
        assert!(
            request.header("x-injected").is_none(),
            "{:?}",
            request.headers
        );
        assert!(!request.path.contains(['\r', '\n']), "{:?}", request.path);
        for (name, value) in &request.headers {
            assert!(!value.contains("X-Injected"), "{name}: {value}");
        }
    }
    // Every delivery finished, so the attempt log is complete.
    for webhook in [&alpha_id, &beta_id, &injected_id] {
        let path = format!("/api/v1/deliveries?webhook_id={webhook}&limit=100");
        wait_for(
            &format!("{webhook}'s deliveries to succeed"),
            DEADLINE,
            || {
                let client = system.client.clone();
                let url = format!("http://127.0.0.1:{}{path}", system.admin);
                let token = system.admin_token.clone();
                async move {
                    let list: Value = client
                        .get(url)
                        .bearer_auth(token)
                        .send()
                        .await
                        .ok()?
                        .json()
                        .await
                        .ok()?;
                    let items = list["items"].as_array()?.clone();
                    (!items.is_empty() && items.iter().all(|d| d["state"] == "succeeded"))
                        .then_some(())
                }
            },
        )
        .await;
    }

    // A settings-page session, signed in with the right token.
    let (status, _) = system
        .send(
            "a sign-in",
            system
                .client
                .post(format!(
                    "http://127.0.0.1:{}/settings/sign-in",
                    system.admin
                ))
                .form(&[("token", system.admin_token.as_str())]),
        )
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);

    // Failed attempts: wrong inbound tokens (one that starts with a real one), then wrong admin
    // tokens (one that starts with the real one) on the API and the sign-in form, past the
    // limit.
    for wrong in [
        format!("{api_token}x"),
        "tsn_not_a_token".to_owned(),
        cli_token[..cli_token.len() - 1].to_owned(),
    ] {
        let (status, answer) = system.alert(&wrong, json!({"title": "wrong token"})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    }
    let wrong_admin = [
        format!("{}x", system.admin_token),
        system.admin_token[..system.admin_token.len() - 1].to_owned(),
        format!("{}\r\nX-Injected: 1", system.admin_token).replace("\r\n", " "),
    ];
    for (i, wrong) in wrong_admin.iter().enumerate() {
        let request = system
            .client
            .get(format!("http://127.0.0.1:{}/api/v1/webhooks", system.admin))
            .bearer_auth(wrong);
        let (status, _) = system.send("a wrong admin token", request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "wrong token {i}");
    }
    let request = system
        .client
        .post(format!(
            "http://127.0.0.1:{}/settings/sign-in",
            system.admin
        ))
        .form(&[("token", format!("{}-wrong", system.admin_token))]);
    let (status, _) = system.send("a wrong sign-in", request).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "past {AUTH_FAILURES} failures"
    );
    let request = system
        .client
        .get(format!("http://127.0.0.1:{}/api/v1/webhooks", system.admin))
        .bearer_auth(&system.admin_token);
    let (status, _) = system
        .send("the right token, past the limit", request)
        .await;
    // The right token is never refused (no lockout behind a shared address); wrong ones still
    // are.
    assert_eq!(status, StatusCode::OK);
    let request = system
        .client
        .get(format!("http://127.0.0.1:{}/api/v1/webhooks", system.admin))
        .bearer_auth(&wrong_admin[0]);
    let (status, _) = system
        .send("a wrong admin token, past the limit", request)
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let body = format!("{{\"token\":\"{}\"}}", system.admin_token);
    let request = system
        .client
        .post(format!(
            "http://127.0.0.1:{}/api/v1/webhooks/alerts",
            system.ingest
        ))
        .bearer_auth(&system.admin_token)
        .header("content-type", "application/json")
        .body(body);
    let (status, _) = system.send("the admin token sent to ingest", request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Where secrets must not be: every log, every /metrics, every error body, every table but
    // `webhooks`.
    let mut places: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(&system.logs).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        places.push((entry.path().display().to_string(), text));
    }
    for (service, port) in [
        ("ingest", system.ingest),
        ("dispatcher", system.dispatcher),
        ("admin", system.admin),
    ] {
        let log = &places
            .iter()
            .find(|(path, _)| path.ends_with(&format!("{service}.log")))
            .unwrap()
            .1;
        assert!(log.contains("serving"), "{service}'s log was captured");
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(metrics.contains("# TYPE"), "{service} /metrics");
        places.push((format!("{service} /metrics"), metrics));
    }
    let debug_lines = places
        .iter()
        .map(|(_, text)| text.lines().filter(|l| l.contains("DEBUG")).count())
        .sum::<usize>();
    assert!(debug_lines > 0, "debug logs were captured");
    assert!(system.error_bodies.len() >= 10, "refusals were collected");
    places.extend(system.error_bodies.iter().cloned());

    let mut conn = AsyncPgConnection::establish(&system.db.url).await.unwrap();
    let tables: Vec<Row> = diesel::sql_query(
        "SELECT table_name::text AS text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name <> 'webhooks'",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert!(
        tables.iter().any(|t| t.text == "attempts"),
        "the attempt log is scanned"
    );
    for table in &tables {
        let rows: Vec<Row> = diesel::sql_query(format!(
            "SELECT t::text AS text FROM \"{}\" t",
            table.text.replace('"', "\"\"")
        ))
        .load(&mut conn)
        .await
        .unwrap();
        places.push((
            format!("table {}", table.text),
            rows.into_iter()
                .map(|r| r.text)
                .collect::<Vec<_>>()
                .join("\n"),
        ));
    }
    // The scan does find a secret where one is stored (the `webhooks` table, left out above).
    let stored: Vec<Row> = diesel::sql_query("SELECT t::text AS text FROM webhooks t")
        .load(&mut conn)
        .await
        .unwrap();
    let stored = stored
        .into_iter()
        .map(|r| r.text)
        .collect::<Vec<_>>()
        .join("\n");
    for secret in [
        &alpha_created,
        &alpha_rotated,
        &beta_secret,
        &injected_secret,
    ] {
        assert!(
            stored.contains(secret.as_str()),
            "the scan reads stored secrets"
        );
    }
    // The attempt log stores each attempt's signature header, not the secret that made it.
    let headers: Vec<Row> =
        diesel::sql_query("SELECT request_headers::text AS text FROM attempts ORDER BY started_at")
            .load(&mut conn)
            .await
            .unwrap();
    assert_eq!(headers.len(), 6 + 5 + 4, "every attempt is logged");
    for row in &headers {
        let headers: Value = serde_json::from_str(&row.text).unwrap();
        let signature = headers["webhook-signature"].as_str().unwrap_or_default();
        assert!(signature.starts_with("v1,"), "{headers}");
    }

    let mut leaks = Vec::new();
    for (place, text) in &places {
        for (owner, secret) in &secrets {
            if text.contains(secret.as_str()) {
                leaks.push(format!("{owner} appears in {place}"));
            }
        }
    }
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    eprintln!(
        "checked {} secret forms in {} places ({} error bodies, {} tables, {debug_lines} debug log lines)",
        secrets.len(),
        places.len(),
        system.error_bodies.len(),
        tables.len()
    );
    let base = format!("http://127.0.0.1:{}", system.admin);
    system.ledger.check(&system.client, &base).await;
    let _ = std::fs::remove_dir_all(&system.logs);
}
