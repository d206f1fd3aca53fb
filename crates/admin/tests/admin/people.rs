//! Admin keys, roles and the audit log: a role matrix read from the OpenAPI document (every
//! operation with a key of every role, a revoked and an expired key; nothing changed by a
//! refused request), the pages and the CLI under roles, a secret's reveal in the audit log
//! without the secret, every surface's changes there with their actor, and the audit check
//! every test's admin makes when it stops finding what it must.

use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use reqwest::header::COOKIE;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{IncidentTitle, Role, Severity};
use tocsin_storage::outbox;
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::TestDb;
use uuid::Uuid;

use crate::api::{assert_error, id_of, rfc3339, seed_failed_delivery, TestAdmin};

/// A credential of the matrix and what it is expected to be.
struct Credential {
    label: &'static str,
    key: String,
    /// `None`: refused outright (401), whatever the operation.
    role: Option<Role>,
}

/// One operation of the document.
struct Operation {
    method: Method,
    template: String,
    role: Role,
}

impl TestAdmin {
    /// Issues a key through the API with the bootstrap token; (id, key).
    async fn issue_key(&self, name: &str, role: &str) -> (Uuid, String) {
        let (status, body) = self
            .post("/api/v1/admin-keys", &json!({"name": name, "role": role}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (id_of(&body), body["key"].as_str().unwrap().to_owned())
    }

    /// Everything a request could change, as text: every row of the tables admin writes
    /// (keys without the time of their last use, which every accepted credential updates;
    /// outbox rows without the time the relay published them).
    async fn snapshot(&self) -> String {
        #[derive(diesel::QueryableByName)]
        struct Dump {
            #[diesel(sql_type = Text)]
            dump: String,
        }
        let mut conn = self.conn().await;
        let tables = [
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM webhooks t",
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM deliveries t",
            "SELECT string_agg((id, topic, headers, payload)::text, ';' ORDER BY id) FROM outbox",
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM incidents t",
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM inbound_tokens t",
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM replays t",
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM audit_log t",
            "SELECT string_agg((id, name, role, revoked_at, expires_at)::text, ';' ORDER BY id) FROM admin_keys",
        ];
        let mut all = String::new();
        for query in tables {
            let dump: Vec<Dump> =
                diesel::sql_query(format!("SELECT COALESCE(({query}), '') AS dump"))
                    .load(&mut conn)
                    .await
                    .unwrap();
            all.push_str(&dump[0].dump);
            all.push('\n');
        }
        all
    }
}

/// Every admin operation of the served document, with the role it states.
async fn operations(admin: &TestAdmin) -> Vec<Operation> {
    let (status, document) = admin.get("/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(role) = operation["x-required-role"].as_str() else {
                continue;
            };
            let role: Role = role.parse().unwrap();
            assert_eq!(role, role_in_the_issue(method, path), "{method} {path}");
            let description = operation["description"].as_str().unwrap_or_default();
            assert!(
                description.contains(&format!("Needs the `{role}` role.")),
                "{method} {path}: {description}"
            );
            operations.push(Operation {
                method: method.to_uppercase().parse().unwrap(),
                template: path.clone(),
                role,
            });
        }
    }
    operations
}

/// The role issue 47 gives an operation: `viewer` reads (but not admin keys or the audit log),
/// `operator` also retries, replays, recovers, sends test events and changes incidents'
/// status, and everything else is `admin`'s.
fn role_in_the_issue(method: &str, path: &str) -> Role {
    let operator = [
        ("post", "/api/v1/deliveries/{id}/retry"),
        ("post", "/api/v1/webhooks/{id}/replay"),
        ("post", "/api/v1/webhooks/{id}/recover"),
        ("post", "/api/v1/webhooks/{id}/test"),
        ("patch", "/api/v1/incidents/{id}"),
    ];
    let admin_reads = ["/api/v1/admin-keys", "/api/v1/audit-log"];
    if method == "get" && !admin_reads.contains(&path) {
        Role::Viewer
    } else if operator.contains(&(method, path)) {
        Role::Operator
    } else {
        Role::Admin
    }
}

/// Fresh resources for one request, so that an allowed change finds what it changes.
struct Fixtures {
    webhook: Uuid,
    delivery: Uuid,
    incident: Uuid,
    token: Uuid,
    key: Uuid,
}

async fn fixtures(admin: &TestAdmin, conn: &mut AsyncPgConnection, n: usize) -> Fixtures {
    let webhook = id_of(&admin.create_webhook(&format!("matrix {n}")).await);
    let delivery = seed_failed_delivery(conn, webhook).await;
    let opened = tocsin_testkit::apply_signals(
        conn,
        &[AlertSignal {
            dedup_key: format!("matrix-{n}"),
            action: AlertAction::Trigger,
            title: IncidentTitle::parse("matrix incident").unwrap(),
            severity: Severity::SEV3,
            description: None,
            source: Some("test".into()),
            reply_key: None,
            labels: Default::default(),
        }],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let incident = opened[0].incident.as_ref().unwrap().id;
    let (status, token) = admin
        .post("/api/v1/tokens", &json!({"name": format!("matrix {n}")}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let (key, _) = admin.issue_key(&format!("matrix {n}"), "viewer").await;
    Fixtures {
        webhook,
        delivery,
        incident,
        token: id_of(&token),
        key,
    }
}

/// The operation's path with its resource's id, and a body it accepts.
fn request_of(operation: &Operation, f: &Fixtures) -> (String, Option<Value>) {
    let id = match operation.template.split('/').nth(3) {
        Some("webhooks") => f.webhook,
        Some("deliveries") => f.delivery,
        Some("incidents") => f.incident,
        Some("tokens") => f.token,
        Some("admin-keys") => f.key,
        Some("audit-log") => Uuid::nil(),
        other => panic!("no fixture for {other:?}"),
    };
    let path = operation.template.replace("{id}", &id.to_string());
    let an_hour_ago = rfc3339(OffsetDateTime::now_utc() - time::Duration::HOUR);
    let body = match (operation.method.as_str(), operation.template.as_str()) {
        ("POST", "/api/v1/webhooks") => Some(json!({
            "name": "made by the matrix",
            "url": "https://hooks.example.com/matrix",
            "events": ["incidents.opened"],
        })),
        ("PATCH", "/api/v1/webhooks/{id}") => Some(json!({"name": "renamed by the matrix"})),
        ("POST", "/api/v1/webhooks/{id}/recover" | "/api/v1/webhooks/{id}/replay") => {
            Some(json!({"since": an_hour_ago}))
        }
        ("PATCH", "/api/v1/incidents/{id}") => Some(json!({"status": "acknowledged"})),
        ("POST", "/api/v1/tokens") => Some(json!({"name": "made by the matrix"})),
        ("POST", "/api/v1/admin-keys") => {
            Some(json!({"name": "made by the matrix", "role": "admin"}))
        }
        _ => None,
    };
    (path, body)
}

#[tokio::test]
async fn every_operation_allows_exactly_its_role_and_a_refusal_changes_nothing() {
    // Revoked and expired keys are wrong credentials, limited per address: lift the limit.
    let admin = TestAdmin::start_with(TestDb::new().await, |c| c.auth_failures = 1000).await;
    let mut conn = admin.conn().await;
    let operations = operations(&admin).await;
    assert!(operations.len() >= 23, "{} operations", operations.len());
    let mut credentials = Vec::new();
    for role in Role::ALL {
        let (_, key) = admin.issue_key(&format!("a {role}"), role.as_str()).await;
        credentials.push(Credential {
            label: role.as_str(),
            key,
            role: Some(role),
        });
    }
    let (revoked_id, revoked) = admin.issue_key("revoked", "admin").await;
    let (status, _) = admin
        .delete(&format!("/api/v1/admin-keys/{revoked_id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    credentials.push(Credential {
        label: "revoked",
        key: revoked,
        role: None,
    });
    let soon = rfc3339(OffsetDateTime::now_utc() + time::Duration::HOUR);
    let (status, expiring) = admin
        .post(
            "/api/v1/admin-keys",
            &json!({"name": "expired", "role": "admin", "expires_at": soon}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{expiring}");
    diesel::sql_query(
        "UPDATE admin_keys SET expires_at = now() - interval '1 minute' WHERE id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(id_of(&expiring))
    .execute(&mut conn)
    .await
    .unwrap();
    credentials.push(Credential {
        label: "expired",
        key: expiring["key"].as_str().unwrap().to_owned(),
        role: None,
    });

    let mut n = 0;
    for operation in &operations {
        for credential in &credentials {
            n += 1;
            let f = fixtures(&admin, &mut conn, n).await;
            let (path, body) = request_of(operation, &f);
            let what = format!(
                "{} {} ({}) with a {} key",
                operation.method, operation.template, operation.role, credential.label
            );
            let before = admin.snapshot().await;
            let answer = admin
                .send_with(
                    &credential.key,
                    operation.method.clone(),
                    &path,
                    body.as_ref(),
                )
                .await;
            match credential.role {
                Some(role) if role.allows(operation.role) => {
                    assert!(answer.0.is_success(), "{what}: {answer:?}");
                }
                Some(_) => {
                    assert_error(&what, &answer, StatusCode::FORBIDDEN, None);
                    let message = answer.1["error"]["message"].as_str().unwrap();
                    assert!(
                        message.contains(&format!("the {} role", operation.role)),
                        "{what}: {message}"
                    );
                    assert_eq!(admin.snapshot().await, before, "{what} changed something");
                }
                None => {
                    assert_error(&what, &answer, StatusCode::UNAUTHORIZED, None);
                    assert_eq!(admin.snapshot().await, before, "{what} changed something");
                }
            }
        }
    }
    admin.stop().await;
}

#[tokio::test]
async fn a_revealed_secret_is_in_the_audit_log_as_a_reveal_never_as_the_secret() {
    let admin = TestAdmin::start().await;
    let (_, key) = admin.issue_key("secret keeper", "admin").await;
    let webhook = admin.create_webhook("revealed").await;
    let id = id_of(&webhook);
    let (status, revealed) = admin
        .send_with(
            &key,
            Method::POST,
            &format!("/api/v1/webhooks/{id}/reveal-secret"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revealed}");
    let secret = revealed["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"));

    let (status, log) = admin
        .get(&format!(
            "/api/v1/audit-log?resource_type=webhook&resource_id={id}&action=webhook.reveal_secret"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let items = log["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{log}");
    assert_eq!(items[0]["actor"]["kind"], "key");
    assert_eq!(items[0]["actor"]["name"], "secret keeper");
    assert_eq!(items[0]["surface"], "api");
    assert_eq!(items[0]["address"], "127.0.0.1");

    // Not anywhere in the log, nor in the table under it: the secret, or the key.
    let (_, everything) = admin.get("/api/v1/audit-log?limit=200").await;
    let text = everything.to_string();
    assert!(!text.contains(secret), "{text}");
    assert!(!text.contains(&key), "{text}");
    let mut conn = admin.conn().await;
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let found: Vec<Count> = diesel::sql_query(
        "SELECT count(*) AS n FROM audit_log WHERE audit_log::text LIKE '%' || $1 || '%'",
    )
    .bind::<Text, _>(&secret[6..])
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(found[0].n, 0);
    admin.stop().await;
}

/// Every test's admin holds the audit log to the test's changes when it stops (see
/// `tocsin_testkit::audit`); that check finds a change without its entry, an entry without a
/// change, and a secret in an entry.
#[tokio::test]
async fn the_audit_check_of_the_tests_finds_a_missing_entry_a_stray_one_and_a_secret() {
    let admin = TestAdmin::start().await;
    let ledger = AuditLedger::new(&admin.db.url, crate::api::ADMIN_TOKEN);
    let request = admin
        .client
        .post(admin.url("/api/v1/webhooks"))
        .bearer_auth(crate::api::ADMIN_TOKEN)
        .json(&json!({
            "name": "checked",
            "url": "https://hooks.example.com/checked",
            "events": ["incidents.opened"],
        }))
        .build()
        .unwrap();
    let created = ledger.exchange(&admin.client, request).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let secret = created.json()["secret"].as_str().unwrap().to_owned();
    assert_eq!(ledger.verify(&admin.client, &admin.base).await, Ok(1));

    let mut conn = admin.conn().await;
    let rewrite = |sql: &'static str| diesel::sql_query(sql);
    rewrite("UPDATE audit_log SET action = 'webhook.update'")
        .execute(&mut conn)
        .await
        .unwrap();
    let problems = ledger.verify(&admin.client, &admin.base).await.unwrap_err();
    assert!(
        problems.contains("no audit entry for Change { action: \"webhook.create\"")
            && problems.contains("an audit entry for no change the test made"),
        "{problems}"
    );
    rewrite("UPDATE audit_log SET action = 'webhook.create', after = jsonb_build_object('secret', $1::text)")
        .bind::<Text, _>(&secret)
        .execute(&mut conn)
        .await
        .unwrap();
    let problems = ledger.verify(&admin.client, &admin.base).await.unwrap_err();
    assert!(
        problems.contains("a secret is in the audit log"),
        "{problems}"
    );
    assert!(!problems.contains(&secret), "the report does not show it");

    // The admin's own ledger noted no change: leave it an empty log to check.
    rewrite("DELETE FROM audit_log")
        .execute(&mut conn)
        .await
        .unwrap();
    admin.stop().await;
}

/// Signs in to the pages with `credential`; the session cookie and the CSRF token.
async fn sign_in(admin: &TestAdmin, credential: &str) -> (String, String) {
    admin.sign_in(credential).await
}

async fn page(admin: &TestAdmin, cookie: &str, path: &str) -> (StatusCode, String) {
    let answer = admin
        .exchange(admin.client.get(admin.url(path)).header(COOKIE, cookie))
        .await;
    (answer.status, answer.text)
}

async fn form(
    admin: &TestAdmin,
    (cookie, csrf): &(String, String),
    path: &str,
    fields: &[(&str, &str)],
) -> StatusCode {
    let mut fields = fields.to_vec();
    fields.push(("csrf", csrf));
    admin
        .exchange(
            admin
                .client
                .post(admin.url(path))
                .header(COOKIE, cookie)
                .form(&fields),
        )
        .await
        .status
}

#[tokio::test]
async fn the_pages_show_and_allow_only_what_the_role_allows_and_revocation_ends_the_session() {
    let admin = TestAdmin::start().await;
    let mut conn = admin.conn().await;
    let webhook = id_of(&admin.create_webhook("paged").await);
    let delivery = seed_failed_delivery(&mut conn, webhook).await;
    let (viewer_id, viewer_key) = admin.issue_key("a viewer", "viewer").await;
    let (_, operator_key) = admin.issue_key("an operator", "operator").await;

    let viewer = sign_in(&admin, &viewer_key).await;
    let (status, html) = page(
        &admin,
        &viewer.0,
        &format!("/settings/deliveries/{delivery}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !html.contains("data-retry"),
        "a viewer sees no Retry button"
    );
    let (_, html) = page(&admin, &viewer.0, &format!("/settings/webhooks/{webhook}")).await;
    for action in [
        "/disable\"",
        "/rotate-secret\"",
        "/delete\"",
        "/recover\"",
        "/test\"",
    ] {
        assert!(!html.contains(action), "a viewer sees no {action} form");
    }
    let (status, _) = page(&admin, &viewer.0, "/settings/admin-keys").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let retry = format!("/settings/deliveries/{delivery}/retry");
    assert_eq!(
        form(&admin, &viewer, &retry, &[]).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(admin.manual_retry_outbox_rows().await.len(), 0);

    let operator = sign_in(&admin, &operator_key).await;
    let (_, html) = page(
        &admin,
        &operator.0,
        &format!("/settings/deliveries/{delivery}"),
    )
    .await;
    assert!(
        html.contains("data-retry"),
        "an operator sees the Retry button"
    );
    assert_eq!(
        form(&admin, &operator, &retry, &[]).await,
        StatusCode::SEE_OTHER
    );
    assert_eq!(admin.manual_retry_outbox_rows().await.len(), 1);
    let disable = format!("/settings/webhooks/{webhook}/disable");
    assert_eq!(
        form(&admin, &operator, &disable, &[]).await,
        StatusCode::FORBIDDEN
    );

    // Revoking the viewer's key ends its session at once.
    let (status, _) = admin
        .delete(&format!("/api/v1/admin-keys/{viewer_id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = page(&admin, &viewer.0, "/settings/").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "sent to sign in");

    let (_, log) = admin
        .get(&format!(
            "/api/v1/audit-log?action=delivery.retry&resource_id={delivery}"
        ))
        .await;
    let items = log["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{log}");
    assert_eq!(items[0]["actor"]["name"], "an operator");
    assert_eq!(items[0]["surface"], "pages");
    admin.stop().await;
}

/// Runs the built binary with only `DATABASE_URL` and `USER`; (success, stdout, stderr).
fn cli(admin: &TestAdmin, args: &[&str]) -> (bool, String, String) {
    admin.cli(&[("DATABASE_URL", &admin.db.url)], Some("ops-person"), args)
}

#[tokio::test]
async fn changes_through_the_api_the_pages_and_the_cli_are_in_the_audit_log_with_their_actor() {
    let admin = TestAdmin::start().await;
    let (key_id, key) = admin.issue_key("automation", "admin").await;

    // The API, with a key: a change with its fields before and after.
    let webhook = id_of(&admin.create_webhook("audited").await);
    let (status, _) = admin
        .send_with(
            &key,
            Method::PATCH,
            &format!("/api/v1/webhooks/{webhook}"),
            Some(&json!({"url": "https://elsewhere.example.com/hook"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // The pages, with the bootstrap token.
    let session = sign_in(&admin, crate::api::ADMIN_TOKEN).await;
    let disable = format!("/settings/webhooks/{webhook}/disable");
    assert_eq!(
        form(&admin, &session, &disable, &[]).await,
        StatusCode::SEE_OTHER
    );

    // The CLI: a key issued, then revoked.
    let (ok, stdout, stderr) = cli(
        &admin,
        &[
            "key",
            "create",
            "--name",
            "from the shell",
            "--role",
            "operator",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.trim().starts_with("tak_"), "{stdout}");
    let (ok, listed, stderr) = cli(&admin, &["key", "list"]);
    assert!(ok, "{stderr}");
    let cli_key: Uuid = listed
        .lines()
        .find(|line| line.contains("from the shell"))
        .and_then(|line| line.split('\t').next())
        .unwrap()
        .parse()
        .unwrap();
    let (ok, _, stderr) = cli(&admin, &["key", "revoke", &cli_key.to_string()]);
    assert!(ok, "{stderr}");

    let (status, log) = admin.get("/api/v1/audit-log?limit=200").await;
    assert_eq!(status, StatusCode::OK, "{log}");
    let items = log["items"].as_array().unwrap();
    let find = |action: &str, surface: &str| -> &Value {
        items
            .iter()
            .find(|e| e["action"] == action && e["surface"] == surface)
            .unwrap_or_else(|| panic!("no {action} through {surface} in {log}"))
    };
    let created = find("webhook.create", "api");
    assert_eq!(created["actor"]["kind"], "bootstrap");
    assert_eq!(
        created["actor"]["name"],
        "bootstrap token (TOCSIN_ADMIN_TOKEN)"
    );
    let changed = find("webhook.update", "api");
    assert_eq!(changed["actor"]["id"], key_id.to_string());
    assert_eq!(changed["actor"]["name"], "automation");
    assert_eq!(changed["before"]["url"], "https://hooks.example.com/tocsin");
    assert_eq!(
        changed["after"]["url"],
        "https://elsewhere.example.com/hook"
    );
    assert_eq!(changed["user_agent"], "tocsin-admin-tests");
    let disabled = find("webhook.update", "pages");
    assert_eq!(disabled["actor"]["kind"], "bootstrap");
    assert_eq!(disabled["before"]["enabled"], true);
    assert_eq!(disabled["after"]["enabled"], false);
    for action in ["admin_key.create", "admin_key.revoke"] {
        let entry = find(action, "cli");
        assert_eq!(entry["actor"]["kind"], "cli");
        assert_eq!(entry["actor"]["name"], "cli:ops-person");
        assert_eq!(entry["resource_id"], cli_key.to_string());
        assert!(entry["address"].is_null());
        assert!(entry["user_agent"].as_str().unwrap().ends_with(" cli"));
    }
    assert!(
        !log.to_string().contains(stdout.trim()),
        "the key is never logged"
    );

    // Filters and keyset paging.
    let (_, mine) = admin
        .get(&format!("/api/v1/audit-log?actor={key_id}"))
        .await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 1, "{mine}");
    let (_, first) = admin.get("/api/v1/audit-log?limit=2").await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = admin
        .get(&format!("/api/v1/audit-log?limit=2&cursor={cursor}"))
        .await;
    let ids = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = ids(&log);
    assert_eq!([ids(&first), ids(&second)].concat(), all[..4].to_vec());
    let future = rfc3339(OffsetDateTime::now_utc() + time::Duration::HOUR);
    let (_, none) = admin
        .get(&format!("/api/v1/audit-log?since={future}"))
        .await;
    assert_eq!(none["items"], json!([]));
    let (status, bad) = admin.get("/api/v1/audit-log?since=yesterday").await;
    assert_error(
        "a bad time",
        &(status, bad),
        StatusCode::BAD_REQUEST,
        Some("since"),
    );
    // A NUL character, which PostgreSQL cannot compare, is the filter's error, not the server's.
    for name in ["actor", "resource_type", "resource_id", "action"] {
        let answer = admin.get(&format!("/api/v1/audit-log?{name}=a%00b")).await;
        assert_error(
            "a NUL character",
            &answer,
            StatusCode::BAD_REQUEST,
            Some(name),
        );
    }

    // Nothing in the API changes or deletes the log.
    for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        let (status, _) = admin.send(method.clone(), "/api/v1/audit-log", None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
    }

    // The audit page shows it to an admin.
    let (status, html) = page(
        &admin,
        &session.0,
        "/settings/audit-log?action=webhook.update",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("automation") && html.contains("elsewhere.example.com"),
        "{html}"
    );
    admin.stop().await;
}

#[tokio::test]
async fn with_the_bootstrap_token_off_admin_needs_a_live_admin_key_and_refuses_the_token() {
    let admin = TestAdmin::start().await;
    let token_off = || {
        let common = tocsin_web::config::CommonConfig::new(
            &admin.db.url,
            &tocsin_testkit::amqp_url(),
            &admin.prefix.prefix,
        );
        let mut config = tocsin_admin::Config::for_tests(common, crate::api::ADMIN_TOKEN);
        config.admin_token_disabled = true;
        config
    };
    let (_, viewer) = admin.issue_key("only a viewer", "viewer").await;
    let error = match tocsin_admin::build(token_off()).await {
        Ok(_) => panic!("admin started with the token off and no admin key"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("TOCSIN_ADMIN_TOKEN_DISABLED"), "{error}");
    assert!(error.contains("no live admin key"), "{error}");

    let (_, key) = admin.issue_key("the first admin", "admin").await;
    let off = tocsin_admin::build(token_off()).await.expect("starting");
    let base = format!("http://127.0.0.1:{}", off.port());
    let stop = off.stop_token();
    let running = tokio::spawn(off.run_until_stopped());
    let call = |credential: &str| {
        admin
            .client
            .get(format!("{base}/api/v1/webhooks"))
            .bearer_auth(credential)
            .send()
    };
    assert_eq!(call(crate::api::ADMIN_TOKEN).await.unwrap().status(), 401);
    assert_eq!(call(&key).await.unwrap().status(), 200);
    assert_eq!(call(&viewer).await.unwrap().status(), 200);
    let sign_in = admin
        .client
        .post(format!("{base}/settings/sign-in"))
        .form(&[("token", crate::api::ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(sign_in.status(), StatusCode::UNPROCESSABLE_ENTITY);
    stop.cancel();
    running.await.unwrap().unwrap();
    admin.stop().await;
}

#[tokio::test]
async fn refusals_are_counted_in_the_metric() {
    let admin = TestAdmin::start().await;
    let (_, viewer) = admin.issue_key("counted", "viewer").await;
    let (status, _) = admin
        .send_with("tak_not-a-key", Method::GET, "/api/v1/webhooks", None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = admin
        .send_with(
            &viewer,
            Method::POST,
            "/api/v1/tokens",
            Some(&json!({"name": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let metrics = admin
        .client
        .get(admin.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "tocsin_admin_auth_refusals_total{status=\"401\",surface=\"api\"} 1",
        "tocsin_admin_auth_refusals_total{status=\"403\",surface=\"api\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    admin.stop().await;
}
