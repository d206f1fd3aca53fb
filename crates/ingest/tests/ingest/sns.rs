//! The whole SNS path against a real SNS emulator, moto's (PyPI `moto[server]`, installed by
//! `deploy/local/lib.sh`): moto serves SNS on loopback, the test subscribes ingest's URL with
//! the token as basic-auth credentials in it, ingest confirms the subscription by fetching the
//! `SubscribeURL` from moto (a permitted host, through the SSRF rules), and the alarm's `ALARM`
//! and `OK` notifications, which moto posts as SNS does (`text/plain`, the URL's credentials),
//! open and resolve one incident. The token requires SNS's signature: every message is checked
//! with the certificate moto serves. The driver is `sns_emulator.py` beside this file; moto does
//! not post the `SubscriptionConfirmation` AWS posts, so the driver posts it in AWS's format,
//! signed as moto signs (the driver's docstring lists where it makes moto behave as AWS does).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tocsin_domain::alerts::AlertFormat;
use tocsin_storage::tokens::{self, NewToken};
use tocsin_testkit::{free_port, TestDb};

use crate::common::{fixture, Options, TestIngest};

/// How long the driver may take (moto's start, the confirmation, two notifications).
const DRIVER_DEADLINE: Duration = Duration::from_secs(120);

/// The `Message` (the CloudWatch alarm, as JSON text) of an SNS fixture.
fn alarm_message(name: &str) -> String {
    let envelope: Value = serde_json::from_str(&fixture(name)).unwrap();
    envelope["Message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn moto_sns_confirms_the_subscription_and_its_alarm_opens_and_resolves_one_incident() {
    let moto_port = free_port();
    let options = Options {
        sns_hosts: format!("http://127.0.0.1:{moto_port}"),
        allowed_targets: "127.0.0.0/8".into(),
        ..Options::default()
    };
    let ingest = TestIngest::start_with(options, TestDb::new().await).await;
    let mut conn = ingest.conn().await;
    let new = NewToken {
        source: Some(AlertFormat::CloudWatch),
        basic_auth: true,
        sns_signature: true,
        ..NewToken::named("sns")
    };
    let (_, token) = tokens::issue(&mut conn, &new).await.unwrap();
    let endpoint = format!(
        "http://sns:{}@{}/api/v1/webhooks/alerts",
        token.expose(),
        ingest.base.trim_start_matches("http://")
    );
    let script = format!(
        "{}/tests/ingest/sns_emulator.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let driver = tokio::process::Command::new("python3")
        .arg(&script)
        .env("MOTO_PORT", moto_port.to_string())
        .env("ENDPOINT", &endpoint)
        .env("ALARM", alarm_message("cloudwatch-sns-alarm.json"))
        .env("OK", alarm_message("cloudwatch-sns-ok.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DRIVER_DEADLINE, driver)
        .await
        .expect("the SNS driver finished in time")
        .expect("running python3 (with moto[server]: deploy/local/lib.sh installs it)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let steps: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let confirmation = steps
        .iter()
        .find(|step| step["step"] == "confirmation")
        .expect("the confirmation step");
    assert_eq!(
        confirmation["answer"]["notice"], "subscription_confirmed",
        "{confirmation}"
    );
    // moto's requests carried the credentials; what moto logs of them is its own business,
    // but ingest's answers never echo them.
    assert!(!stdout.contains(&token.expose()[17..]), "{stdout}");

    // moto posts each notification before `publish` returns: both are in.
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        title: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        severity: String,
    }
    use diesel_async::RunQueryDsl;
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT status, title, severity FROM incidents WHERE dedup_key LIKE 'cloudwatch:%'",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "one incident for the alarm");
    assert_eq!(
        (
            rows[0].status.as_str(),
            rows[0].title.as_str(),
            rows[0].severity.as_str()
        ),
        ("resolved", "checkout-api-5xx-rate", "SEV1")
    );
    assert_eq!(
        ingest.count("events").await,
        3,
        "opened, status_changed, resolved"
    );
    ingest.stop().await;
}
