//! Signing in to the settings pages through a real OpenID Connect provider: `oidc-provider`
//! (npm) serves on a free port, admin starts with it as its issuer (role claim `groups`,
//! `oncall=operator`), and `oidc.mjs` drives Debian's headless Chromium through the
//! authorization code flow with PKCE: an operator signs in, sees only what an operator may and
//! acknowledges an incident (recorded in the audit log under the identity), signs in again
//! after the provider rotated its signing key (admin fetches the keys again), an identity whose
//! groups map to no role is refused, and a callback without the sign-in's `state` is refused.
//!
//! Needs what the browser test needs (`node`, `/usr/bin/chromium`, `npm ci` in
//! `crates/e2e/tests/browser`).

use std::process::Stdio;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_domain::alerts::AlertAction;
use tocsin_testkit::audit::{Actor, AuditLedger, Change};
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::browser::{require_browser_tools, workspace_root, CHROMIUM};

/// How long the provider may take to start, and the whole story to run.
const DEADLINE: Duration = Duration::from_secs(120);
const CLIENT_SECRET: &str = "tocsin-oidc-test-client-secret";

#[tokio::test]
async fn the_pages_sign_in_through_an_openid_connect_provider_and_refuse_an_identity_without_a_role(
) {
    let root = workspace_root();
    require_browser_tools(&root);
    let mut node = tokio::process::Command::new("node")
        .current_dir(&root)
        .arg("crates/e2e/tests/browser/oidc.mjs")
        .env("OIDC_CLIENT_SECRET", CLIENT_SECRET)
        .env("CHROMIUM", CHROMIUM)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running node");
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("the provider did not start in time")
        .unwrap()
        .expect("the provider's address");
    let issuer = first
        .strip_prefix("ISSUER ")
        .unwrap_or_else(|| panic!("not the issuer: {first}"))
        .to_owned();

    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let mut config = tocsin_admin::Config::for_tests(
        CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix),
        tocsin_e2e::ADMIN_TOKEN,
    );
    config.oidc_issuer = Some(issuer);
    config.oidc_client_id = Some("tocsin".into());
    config.oidc_client_secret = Some(tocsin_admin::SecretSetting::new(CLIENT_SECRET));
    config.oidc_roles = Some("oncall=operator,tocsin-admins=admin".into());
    let admin = tocsin_admin::build(config).await.expect("starting admin");
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let signal = tocsin_testkit::signal("oidc-disk", AlertAction::Trigger);
    let opened = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal],
        tocsin_storage::outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let incident = opened[0].incident.as_ref().unwrap().id;
    let admin_url = format!("http://127.0.0.1:{}", admin.port());
    let stop = admin.stop_token();
    let running = tokio::spawn(admin.run_until_stopped());

    let mut stdin = node.stdin.take().unwrap();
    stdin
        .write_all(format!("{admin_url}\n").as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let mut said = Vec::new();
    let story = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("{line}");
            said.push(line);
        }
        node.wait().await.unwrap()
    };
    let status = tokio::time::timeout(DEADLINE, story)
        .await
        .expect("the sign-in story did not finish in time");
    assert!(status.success(), "oidc.mjs failed; its output is above");
    assert_eq!(
        said.iter().filter(|line| line.starts_with("ok ")).count(),
        4,
        "{said:?}"
    );

    // The one change of the story, the acknowledgement, is the whole audit log, under the
    // identity; the client secret is not in it.
    let ledger = AuditLedger::new(&db.url, tocsin_e2e::ADMIN_TOKEN);
    let olga = Actor {
        kind: "oidc".into(),
        name: "Olga Oncall (olga)".into(),
        id: None,
    };
    ledger.expect(Change::new(
        "incident.change_status",
        Some(incident.to_string()),
        "pages",
        olga,
    ));
    ledger.secret(CLIENT_SECRET);
    assert_eq!(ledger.check(&reqwest::Client::new(), &admin_url).await, 1);
    stop.cancel();
    running.await.unwrap().unwrap();
}
