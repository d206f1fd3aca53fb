//! A dependency unreachable: `/readyz` answers 503 naming RabbitMQ or PostgreSQL (and 200 again
//! once it is back), and the API answers 503 while PostgreSQL is unreachable.

use reqwest::StatusCode;
use serde_json::Value;
use tocsin_testkit::{wait_for, wait_until, TcpProxy, TestDb};

use crate::api::{assert_error, read, TestAdmin, DEADLINE};

/// `GET /readyz`: the status and the JSON body.
async fn readiness(admin: &TestAdmin) -> (StatusCode, Value) {
    read(admin.client.get(admin.url("/readyz")).send().await.unwrap()).await
}

#[tokio::test]
async fn readyz_answers_503_naming_rabbitmq_when_the_broker_is_unreachable() {
    // A closed port; the password must not show in the answer.
    let admin = TestAdmin::start_with(TestDb::new().await, |config| {
        config.common.amqp_url = "amqp://guest:pw-never-shown@127.0.0.1:1/%2f".into();
    })
    .await;
    let (status, body) = readiness(&admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["checks"]["postgres"], "ok");
    assert!(
        body["checks"]["rabbitmq"]
            .as_str()
            .is_some_and(|e| e != "ok"),
        "{body}"
    );
    assert!(!body.to_string().contains("pw-never-shown"), "{body}");
    // Alive all the same, and the API that needs only PostgreSQL still answers.
    let alive = admin
        .client
        .get(admin.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status(), StatusCode::OK);
    assert_eq!(admin.get("/api/v1/webhooks").await.0, StatusCode::OK);
    admin.stop().await;
}

#[tokio::test]
async fn readyz_answers_503_naming_postgres_when_the_database_is_unreachable() {
    // Admin migrates at start, so it starts through a proxy that then refuses connections,
    // like a closed port (the shared server keeps running).
    let db = TestDb::new().await;
    let server = db
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(host, _)| host.to_owned())
        .expect("host:port in the test database URL");
    let proxy = TcpProxy::start(&server).await;
    let proxied = db
        .url
        .replacen(&server, &format!("127.0.0.1:{}", proxy.port()), 1);
    let admin = TestAdmin::start_with(db, |config| config.common.database_url = proxied).await;
    assert_eq!(readiness(&admin).await.0, StatusCode::OK);
    proxy.cut();
    let body = wait_for("readyz to answer 503", DEADLINE, || async {
        let (status, body) = readiness(&admin).await;
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "not_ready");
    assert!(
        body["checks"]["postgres"]
            .as_str()
            .is_some_and(|e| e != "ok"),
        "{body}"
    );
    assert_eq!(body["checks"]["rabbitmq"], "ok");
    proxy.restore();
    wait_until("readyz to answer 200 again", DEADLINE, || async {
        readiness(&admin).await.0 == StatusCode::OK
    })
    .await;
    admin.stop().await;
}

#[tokio::test]
async fn with_postgres_unreachable_it_answers_503() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let proxied = db
        .url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
    let admin = TestAdmin::start_with(db, |config| config.common.database_url = proxied).await;
    proxy.cut();
    let answer = admin.get("/api/v1/webhooks").await;
    assert_error(
        "storage down",
        &answer,
        StatusCode::SERVICE_UNAVAILABLE,
        None,
    );
    assert_eq!(answer.1["error"]["code"], "unavailable");
    proxy.restore();
    wait_for("admin to answer again", DEADLINE, || async {
        let (status, _) = admin.get("/api/v1/webhooks").await;
        (status == StatusCode::OK).then_some(())
    })
    .await;
    admin.stop().await;
}
