//! Arbitrary bodies sent to the running endpoint never get a 5xx while the servers are healthy,
//! and never get a 202 without an incident change or a notice (a sender's housekeeping, a body
//! that asks nothing) behind it; hostile bodies each get their own
//! 4xx (deep nesting, invalid UTF-8, numbers out of range, huge strings, header injection), and
//! the service answers normally afterwards.
//!
//! `PROPTEST_CASES` sets the number of arbitrary bodies (default 500) and `TOCSIN_FUZZ_TIME`
//! bounds the run (default 60 s); see `tocsin_testkit::fuzz`.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use proptest::prelude::*;
use serde_json::{json, Value};
use tocsin_ingest::Config;
use tocsin_storage::tokens;
use tocsin_testkit::fuzz::{self, Budget};
use tocsin_testkit::{amqp_url, TestDb, TestPrefix};
use tocsin_web::config::CommonConfig;

/// Fields the parsers read.
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
    "Type",
    "TopicArn",
    "Message",
    "SubscribeURL",
    "schemaId",
    "data",
    "essentials",
    "monitorCondition",
    "incident",
    "incident_id",
    "event",
    "issue",
    "metric_alert",
    "action",
    "aggreg_key",
    "transition",
    "priority",
    "id",
    "rule_id",
    "alert_id",
    "action_group",
    "event_id",
    "event_value",
    "heartbeat",
    "monitor",
    "msg",
    "alias",
];

/// Values the parsers give meaning to.
const WORDS: &[&str] = &[
    "firing",
    "resolved",
    "trigger",
    "acknowledge",
    "resolve",
    "alerting",
    "ok",
    "critical",
    "warning",
    "SEV1",
    "4",
    "1",
    "Notification",
    "SubscriptionConfirmation",
    "ALARM",
    "OK",
    "Fired",
    "Resolved",
    "open",
    "closed",
    "Recovered",
    "CLOSED",
    "recovered",
    "0",
];

/// Every format's name.
const FORMATS: [&str; 14] = [
    "alertmanager",
    "grafana",
    "pagerduty",
    "generic",
    "cloudwatch",
    "azure",
    "google",
    "sentry",
    "datadog",
    "newrelic",
    "kibana",
    "zabbix",
    "uptimekuma",
    "opsgenie",
];

/// The sample bodies of every format, as each tool sends them.
fn fixtures() -> Vec<Value> {
    let dir = format!(
        "{}/../domain/tests/fixtures/alerts",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut fixtures: Vec<Value> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
        .map(|entry| serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap())
        .collect();
    fixtures.sort_by_key(Value::to_string);
    assert!(fixtures.len() >= 4, "the fixtures of every format");
    fixtures
}

struct TestIngest {
    _db: TestDb,
    _prefix: TestPrefix,
    url: String,
    token: String,
    client: reqwest::Client,
    stop: tokio_util::sync::CancellationToken,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestIngest {
    async fn start() -> TestIngest {
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
        TestIngest {
            _db: db,
            _prefix: prefix,
            url,
            token,
            client: reqwest::Client::new(),
            stop,
            running,
        }
    }

    /// Posts `body` as JSON, with `?format=` when given; returns the status and JSON answer.
    async fn post(&self, body: Vec<u8>, format: Option<&str>) -> (u16, Value) {
        let target = match format {
            Some(format) => format!("{}?format={format}", self.url),
            None => self.url.clone(),
        };
        let response = self
            .client
            .post(target)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
    }
}

/// A 4xx answer carries the common error shape; a 2xx is a 202 naming its incidents or its
/// notice.
fn check_answer(status: u16, answer: &Value, what: &dyn std::fmt::Display) {
    fuzz::check_refusal(status, answer, what);
    if status < 400 {
        assert_eq!(status, 202, "{what}: {answer}");
        let incidents = answer["incidents"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        let notice = answer["notice"].is_string();
        assert!(incidents || notice, "{what}: {answer}");
    }
}

#[tokio::test]
async fn arbitrary_bodies_never_get_a_server_error() {
    let ingest = TestIngest::start().await;
    let strategy = (
        prop_oneof![
            2 => fuzz::body(FIELDS, WORDS),
            1 => prop::sample::select(fixtures())
                .prop_flat_map(|fixture| fuzz::mutated(fixture, FIELDS, WORDS))
                .prop_map(|value| serde_json::to_vec(&value).unwrap()),
        ],
        prop::option::of(prop::sample::select(FORMATS.to_vec())),
    );
    let mut samples = Budget::from_env(500).samples(strategy);
    let mut statuses = std::collections::BTreeMap::new();
    for (body, format) in samples.by_ref() {
        let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let (status, answer) = ingest.post(body, format).await;
        *statuses.entry(status).or_insert(0) += 1;
        check_answer(status, &answer, &format!("{format:?} {shown:?}"));
    }
    eprintln!("{}; statuses: {statuses:?}", samples.summary());
    // Still serving.
    let (status, answer) = ingest
        .post(
            br#"{"title":"after the fuzz","dedup_key":"after"}"#.to_vec(),
            None,
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    ingest.stop().await;
}

#[tokio::test]
async fn hostile_bodies_each_get_their_4xx() {
    let ingest = TestIngest::start().await;
    for (what, body) in fuzz::syntax_errors("title") {
        for format in std::iter::once(None).chain(FORMATS.into_iter().map(Some)) {
            let (status, answer) = ingest.post(body.clone(), format).await;
            check_answer(status, &answer, &format!("{what}, {format:?}"));
            assert_eq!(status, 400, "{what}, {format:?}: {answer}");
            assert_eq!(answer["error"]["code"], "bad_request", "{what}: {answer}");
        }
    }

    // Numbers in range for JSON but not for the field, and strings where numbers go.
    for number in fuzz::OUT_OF_RANGE_NUMBERS
        .iter()
        .filter(|n| !n.contains("e4"))
    {
        let body = format!(r#"{{"title":{number},"dedup_key":"n"}}"#).into_bytes();
        let (status, answer) = ingest.post(body, None).await;
        check_answer(status, &answer, number);
        assert_eq!(status, 422, "title {number}: {answer}");
        assert_eq!(answer["error"]["field"], "title", "{answer}");
    }

    // A body over the limit: 413 before it is parsed.
    let huge = json!({"title": "x".repeat(600 * 1024)})
        .to_string()
        .into_bytes();
    let (status, answer) = ingest.post(huge, None).await;
    check_answer(status, &answer, &"600 KiB");
    assert_eq!(status, 413, "{answer}");

    // Huge strings within the limit: text is cut to its bound and accepted; a key past its
    // bound is refused naming it.
    let long = json!({
        "title": "t".repeat(200_000),
        "dedup_key": "k",
        "description": "d".repeat(150_000),
        "source": "s".repeat(10_000),
    });
    let (status, answer) = ingest.post(long.to_string().into_bytes(), None).await;
    check_answer(status, &answer, &"huge strings");
    assert_eq!(status, 202, "{answer}");
    let long = json!({"title": "t", "dedup_key": "k".repeat(400_000)});
    let (status, answer) = ingest.post(long.to_string().into_bytes(), None).await;
    check_answer(status, &answer, &"a huge key");
    assert_eq!(
        (status, &answer["error"]["field"]),
        (422, &json!("dedup_key"))
    );
    let long = json!({"event_action": "trigger", "routing_key": "r", "dedup_key": "k".repeat(400_000),
        "payload": {"summary": "s", "source": "x", "severity": "critical"}});
    let (status, answer) = ingest.post(long.to_string().into_bytes(), None).await;
    check_answer(status, &answer, &"a huge PagerDuty key");

    // Header injection and control characters in every text field are stored without their
    // control characters in titles (the title is what is sent out), never refused with a 5xx.
    for nasty in fuzz::NASTY_STRINGS {
        let body = json!({"title": format!("t {nasty}"), "dedup_key": format!("k {nasty}"),
            "source": nasty, "description": nasty});
        let (status, answer) = ingest.post(body.to_string().into_bytes(), None).await;
        check_answer(status, &answer, &format!("{nasty:?}"));
    }
    let (status, answer) = ingest
        .post(br#"{"title":"\r\n"}"#.to_vec(), Some("generic"))
        .await;
    assert_eq!(status, 422, "a title of control characters only: {answer}");

    // Still serving.
    let (status, answer) = ingest
        .post(br#"{"title":"after","dedup_key":"after"}"#.to_vec(), None)
        .await;
    assert_eq!(status, 202, "{answer}");
    ingest.stop().await;
}
