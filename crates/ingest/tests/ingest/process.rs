//! The ingest binary as a real process: a bad setting stops it with one line naming it,
//! SIGTERM exits 0 after finishing in-flight work, and no credential a sender presents (a
//! bearer, basic or query token, a Sentry secret, an SNS confirmation token) appears in its
//! debug log or its metrics.

use std::process::Command;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde_json::Value;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::SigningSecret;
use tocsin_storage::tokens::{self, NewToken};
use tocsin_testkit::{
    amqp_url, free_port, wait_ready, wait_until, Receiver, ServiceProcess, TestDb, TestPrefix,
};

use crate::common::fixture;

const BINARY: &str = env!("CARGO_BIN_EXE_tocsin-ingest");

#[tokio::test]
async fn sigterm_stops_ingest_with_exit_code_zero() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let port = free_port();
    let mut process = ServiceProcess::spawn(
        BINARY,
        &[
            ("DATABASE_URL", db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{port}")),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
        ],
    );
    wait_until("ingest to be ready", Duration::from_secs(20), || async {
        reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    process.terminate();
    let status = process.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn an_invalid_setting_stops_it_with_a_line_naming_the_setting() {
    let output = Command::new(BINARY)
        .env("TOCSIN_RETRY_DELAYS", "1m,5m")
        .output()
        .expect("running tocsin-ingest");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
    assert!(stderr.contains("TOCSIN_RETRY_DELAYS"), "{stderr}");

    let output = Command::new(BINARY)
        .env("TOCSIN_INGEST_ADDR", "not-an-address")
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .output()
        .expect("running tocsin-ingest");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one clear line: {stderr}");
    assert!(stderr.contains("DATABASE_URL"), "{stderr}");
}

#[tokio::test]
async fn no_credential_reaches_the_log_or_the_metrics() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let port = free_port();
    let sns = Receiver::start().await;
    let log = std::env::temp_dir().join(format!("tocsin-ingest-credentials-{port}.log"));
    let _ = std::fs::remove_file(&log);
    let mut process = ServiceProcess::spawn_logged(
        BINARY,
        &[
            ("DATABASE_URL", db.url.clone()),
            ("AMQP_URL", amqp_url()),
            ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
            ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{port}")),
            ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
            // The setting's former name, still read for one release (the confirmation below
            // fetches through it).
            (
                "TOCSIN_SNS_CONFIRM_HOSTS",
                format!("http://127.0.0.1:{}", sns.port()),
            ),
            ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
            ("RUST_LOG", "debug".into()),
        ],
        Some(&log),
    );
    wait_ready(port, Duration::from_secs(20)).await;

    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let secret = SigningSecret::parse("sentry-client-secret-7f3a").unwrap();
    let mut issued = Vec::new();
    for new in [
        NewToken {
            basic_auth: true,
            query_token: true,
            ..NewToken::named("everything")
        },
        NewToken {
            source: Some(AlertFormat::Sentry),
            signing_secret: Some(&secret),
            ..NewToken::named("sentry")
        },
    ] {
        let (_, token) = tokens::issue(&mut conn, &new).await.unwrap();
        issued.push(token.expose().to_owned());
    }
    let (open, sentry) = (&issued[0], &issued[1]);
    let url = format!("http://127.0.0.1:{port}/api/v1/webhooks/alerts");
    let client = reqwest::Client::new();
    let generic = r#"{"title":"Disk full","dedup_key":"disk"}"#;
    let basic = STANDARD.encode(format!("sns:{open}"));
    let wrong = format!("{}Q", &open[..open.len() - 1]);
    let confirmation_token = "c0nf1rm4t10n70k3n";
    let mut confirmation: Value =
        serde_json::from_str(&fixture("cloudwatch-sns-subscription-confirmation.json")).unwrap();
    confirmation["SubscribeURL"] = Value::from(sns.url(&format!(
        "/?Action=ConfirmSubscription&Token={confirmation_token}"
    )));
    let requests = [
        (
            format!("{url}?token={open}"),
            None,
            "application/json",
            generic.to_owned(),
        ),
        (
            format!("{url}?token={wrong}"),
            None,
            "application/json",
            generic.to_owned(),
        ),
        (
            url.clone(),
            Some(format!("Basic {basic}")),
            "application/json",
            generic.to_owned(),
        ),
        (
            url.clone(),
            Some(format!("Bearer {wrong}")),
            "application/json",
            generic.to_owned(),
        ),
        (
            url.clone(),
            Some(format!("Bearer {sentry}")),
            "application/json",
            fixture("sentry-issue-alert.json"),
        ),
        (
            url.clone(),
            Some(format!("Basic {basic}")),
            "text/plain; charset=UTF-8",
            confirmation.to_string(),
        ),
    ];
    let mut answers = String::new();
    for (target, authorization, content_type, body) in requests {
        let mut request = client
            .post(&target)
            .header("content-type", content_type)
            .header("x-amz-sns-message-type", "SubscriptionConfirmation")
            .body(body);
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let response = request.send().await.unwrap();
        answers.push_str(&format!("{} ", response.status()));
        answers.push_str(&response.text().await.unwrap());
    }
    assert!(answers.contains("subscription_confirmed"), "{answers}");
    assert_eq!(sns.count(), 1);
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("tocsin_ingest_alerts_total"), "{metrics}");
    process.terminate();
    let status = process.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "{status}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("SNS subscription confirmed"), "{logged}");
    let mut secrets: Vec<String> = vec![
        basic,
        secret.expose().to_owned(),
        confirmation_token.to_owned(),
    ];
    for token in [open, sentry, &wrong] {
        secrets.push(token.clone());
        // The secret part alone, after `tsn_<lookup>_`.
        secrets.push(token[17..].to_owned());
    }
    for secret in &secrets {
        for (what, text) in [
            ("log", &logged),
            ("metrics", &metrics),
            ("answers", &answers),
        ] {
            assert!(!text.contains(secret.as_str()), "{what} shows {secret}");
        }
    }
    let _ = std::fs::remove_file(&log);
}
