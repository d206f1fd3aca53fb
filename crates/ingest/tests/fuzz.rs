//! Arbitrary bodies sent to the running endpoint never get a 5xx while the servers are healthy,
//! and never get a 202 without an incident change behind it.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{json, Value};
use tocsin_domain::config::CommonConfig;
use tocsin_domain::db::tokens;
use tocsin_ingest::Config;
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};

const FIELDS: &[&str] = &[
    "title",
    "status",
    "dedup_key",
    "severity",
    "description",
    "source",
    "labels",
    "alerts",
    "groupKey",
    "receiver",
    "version",
    "commonLabels",
    "commonAnnotations",
    "groupLabels",
    "orgId",
    "state",
    "message",
    "event_action",
    "routing_key",
    "payload",
    "summary",
    "annotations",
    "startsAt",
    "endsAt",
    "fingerprint",
    "values",
    "custom_details",
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
            "[a-zA-Z0-9 _:./-]{0,40}".boxed(),
            Just("firing".to_owned()).boxed(),
            Just("resolved".to_owned()).boxed(),
            Just("trigger".to_owned()).boxed(),
            Just("critical".to_owned()).boxed(),
            Just("4".to_owned()).boxed(),
            ".{0,20}".boxed(),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..8).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        prop::collection::vec(any::<u8>(), 0..200),
        // Deep nesting past serde_json's recursion limit.
        (100usize..300)
            .prop_map(|depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()),
        Just(
            json!({"title": "x".repeat(600), "dedup_key": "\u{0000}k"})
                .to_string()
                .into_bytes()
        ),
    ]
}

#[tokio::test]
async fn arbitrary_bodies_never_get_a_server_error() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let mut common = CommonConfig::new(&db.url, &amqp_url(), &prefix.prefix);
    common.shutdown_timeout = Duration::from_secs(3);
    let app = tocsin_ingest::build(Config::for_tests(common))
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}/api/v1/webhooks/alerts", app.port());
    let stop = app.stop_token();
    let running = tokio::spawn(app.run_until_stopped());
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let token = tokens::create(&mut conn, "fuzz")
        .await
        .unwrap()
        .1
        .expose()
        .to_owned();
    let client = reqwest::Client::new();

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 300,
        ..ProptestConfig::default()
    });
    let strategy = (
        body(),
        prop::option::of(prop::sample::select(vec![
            "alertmanager",
            "grafana",
            "pagerduty",
            "generic",
        ])),
    );
    let mut cases = Vec::new();
    for _ in 0..300 {
        let tree = strategy.new_tree(&mut runner).unwrap();
        cases.push(tree.current());
    }
    let mut statuses = std::collections::BTreeMap::new();
    for (body, format) in cases {
        let target = match format {
            Some(format) => format!("{url}?format={format}"),
            None => url.clone(),
        };
        let response = client
            .post(target)
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        *statuses.entry(status).or_insert(0) += 1;
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        assert!(
            status < 500,
            "{status} for {:?}: {answer}",
            String::from_utf8_lossy(&body)
        );
        if status >= 400 {
            assert!(
                answer["error"]["code"].is_string(),
                "common error shape for {status}: {answer}"
            );
        } else {
            assert_eq!(status, 202);
            assert!(
                answer["incidents"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty()),
                "{answer}"
            );
        }
    }
    eprintln!("statuses over 300 arbitrary bodies: {statuses:?}");
    stop.cancel();
    running.await.unwrap().unwrap();
}
