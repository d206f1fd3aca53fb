//! The ingest binary as a real process: a bad setting stops it with one line naming it, and
//! SIGTERM exits 0 after finishing in-flight work.

use std::process::Command;
use std::time::Duration;

use tocsin_testkit::{amqp_url, free_port, wait_until, ServiceProcess, TestDb, TestPrefix};

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
