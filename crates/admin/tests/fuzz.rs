//! Arbitrary request bodies and ids sent to the running admin API: never a 5xx, always the
//! common error shape for a refusal, and never a half-written row for a refused body.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use reqwest::Method;
use serde_json::Value;
use tocsin_admin::Config;
use tocsin_domain::config::CommonConfig;
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};

const TOKEN: &str = "fuzz-admin-token-0123456789";
const FIELDS: &[&str] = &[
    "name",
    "url",
    "events",
    "retry",
    "max_attempts",
    "timeout_ms",
    "enabled",
    "status",
    "since",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            "[a-zA-Z0-9 _:./-]{0,30}".boxed(),
            Just("https://example.com/hook".to_owned()).boxed(),
            Just("incidents.opened".to_owned()).boxed(),
            Just("resolved".to_owned()).boxed(),
            Just("2026-11-22T00:00:00Z".to_owned()).boxed(),
            Just("a\r\nX-Injected: 1".to_owned()).boxed(),
            ".{0,20}".boxed(),
            "x{100,400}".boxed(),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..7).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        prop::collection::vec(any::<u8>(), 0..120),
        (100usize..300)
            .prop_map(|d| format!("{}{}", "{\"a\":".repeat(d), "}".repeat(d)).into_bytes()),
    ]
}

#[tokio::test]
async fn arbitrary_bodies_never_get_a_server_error() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
    common.shutdown_timeout = Duration::from_secs(3);
    let app = tocsin_admin::build(Config::for_tests(common, TOKEN))
        .await
        .unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    let stop = app.stop_token();
    let running = tokio::spawn(app.run_until_stopped());
    let client = reqwest::Client::new();

    // One real webhook and incident-free ids, so that id routes are exercised both ways.
    let created: Value = client
        .post(format!("{base}/api/v1/webhooks"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"name": "fuzz", "url": "https://example.com/", "events": ["incidents.opened"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let webhook = created["id"].as_str().unwrap().to_owned();
    let targets = [
        (Method::POST, "/api/v1/webhooks".to_owned()),
        (Method::PATCH, format!("/api/v1/webhooks/{webhook}")),
        (Method::POST, format!("/api/v1/webhooks/{webhook}/recover")),
        (Method::POST, "/api/v1/tokens".to_owned()),
        (
            Method::PATCH,
            "/api/v1/incidents/00000000-0000-0000-0000-000000000000".to_owned(),
        ),
        (Method::PATCH, "/api/v1/webhooks/not-a-uuid".to_owned()),
    ];
    let mut runner = TestRunner::new(ProptestConfig::default());
    let strategy = (body(), 0..targets.len());
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..400 {
        let (body, target) = strategy.new_tree(&mut runner).unwrap().current();
        let (method, path) = &targets[target];
        let response = client
            .request(method.clone(), format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        *statuses
            .entry((path.split('/').nth(3).unwrap_or("").to_owned(), status))
            .or_insert(0) += 1;
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        assert!(
            status < 500,
            "{status} for {method} {path} {:?}: {answer}",
            String::from_utf8_lossy(&body)
        );
        if status >= 400 {
            assert!(
                answer["error"]["code"].is_string(),
                "common error shape: {answer}"
            );
        }
        if let Some(name) = answer["name"].as_str() {
            assert!(
                !name.chars().any(char::is_control),
                "no control characters stored: {name:?}"
            );
        }
    }
    eprintln!("statuses: {statuses:?}");
    stop.cancel();
    running.await.unwrap().unwrap();
}
