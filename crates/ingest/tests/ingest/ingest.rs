//! The inbound endpoint against the real PostgreSQL and RabbitMQ, with bodies exactly as each
//! tool sends them (crates/domain/tests/fixtures/alerts).

use reqwest::StatusCode;
use serde_json::{json, Value};
use tocsin_storage::{outbox, tokens};
use tocsin_testkit::{wait_for, wait_until, TcpProxy, TestDb};

use crate::common::{fixture, Options, TestIngest, DEADLINE};

/// name, body, token, content type, query, expected status, expected field.
type Case = (
    &'static str,
    String,
    Option<String>,
    &'static str,
    &'static str,
    StatusCode,
    Option<&'static str>,
);

fn assert_spec_payload(body: &Value, event: &str, status: &str) {
    assert_eq!(body["event"], event);
    let timestamp = body["timestamp"].as_str().expect("timestamp is a string");
    assert!(
        timestamp.ends_with('Z') && timestamp.contains('T'),
        "{timestamp}"
    );
    uuid::Uuid::parse_str(body["data"]["id"].as_str().unwrap()).expect("data.id is a UUID");
    assert!(body["data"]["title"].is_string());
    let severity = body["data"]["severity"].as_str().unwrap();
    assert!(
        severity.len() == 4 && severity.starts_with("SEV"),
        "{severity}"
    );
    assert_eq!(body["data"]["status"], status);
}

#[tokio::test]
async fn alertmanager_opens_and_resolves_an_incident() {
    let ingest = TestIngest::start().await;
    let (status, body) = ingest.post(&fixture("alertmanager-0.25-firing.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["format"], "alertmanager");
    assert_eq!(body["incidents"][0]["change"], "opened");
    assert_eq!(body["incidents"][0]["status"], "triggered");
    assert_eq!(body["incidents"][0]["events"], json!(["incidents.opened"]));
    let id = body["incidents"][0]["id"].as_str().unwrap().to_owned();

    let events = ingest.wait_events(1).await;
    assert_eq!(events[0].0, "incidents.opened");
    assert_spec_payload(&events[0].1, "incidents.opened", "triggered");
    assert_eq!(events[0].1["data"]["id"], id);
    assert_eq!(events[0].1["data"]["title"], "p99 latency above 2s");
    assert_eq!(events[0].1["data"]["severity"], "SEV1");

    // Alertmanager repeats firing notifications: nothing new.
    let (status, body) = ingest.post(&fixture("alertmanager-0.25-firing.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["incidents"][0]["change"], "unchanged");
    assert_eq!(body["incidents"][0]["events"], json!([]));

    let (status, body) = ingest
        .post(&fixture("alertmanager-0.25-resolved.json"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["id"], id);
    assert_eq!(body["incidents"][0]["status"], "resolved");
    let events = ingest.wait_events(2).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["incidents.status_changed", "incidents.resolved"]);
    assert_spec_payload(&events[0].1, "incidents.status_changed", "resolved");
    assert_eq!(events[0].1["data"]["previous_status"], "triggered");
    assert_spec_payload(&events[1].1, "incidents.resolved", "resolved");
    assert_eq!(ingest.count("incidents").await, 1);
    ingest.stop().await;
}

#[tokio::test]
async fn grafana_opens_and_resolves_an_incident() {
    let ingest = TestIngest::start().await;
    let (status, body) = ingest.post(&fixture("grafana-firing.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["format"], "grafana");
    assert_eq!(body["incidents"][0]["change"], "opened");
    let (status, _) = ingest.post(&fixture("grafana-firing.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = ingest.post(&fixture("grafana-resolved.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["status"], "resolved");
    let kinds: Vec<String> = ingest
        .wait_events(3)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        kinds,
        [
            "incidents.opened",
            "incidents.status_changed",
            "incidents.resolved"
        ]
    );
    assert_eq!(ingest.count("incidents").await, 1);
    ingest.stop().await;
}

#[tokio::test]
async fn pagerduty_triggers_acknowledges_and_resolves() {
    let ingest = TestIngest::start().await;
    let (status, body) = ingest.post(&fixture("pagerduty-trigger.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["format"], "pagerduty");
    assert!(
        body["dedup_key"].is_string(),
        "PagerDuty senders get their key back: {body}"
    );
    let (status, body) = ingest.post(&fixture("pagerduty-acknowledge.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["status"], "acknowledged");
    let (status, body) = ingest.post(&fixture("pagerduty-resolve.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["status"], "resolved");
    let events = ingest.wait_events(4).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "incidents.opened",
            "incidents.status_changed",
            "incidents.status_changed",
            "incidents.resolved"
        ]
    );
    assert_eq!(events[1].1["data"]["status"], "acknowledged");

    // A trigger without a dedup_key gets one generated and returned.
    let (status, body) = ingest
        .post(r#"{"routing_key":"r","event_action":"trigger","payload":{"summary":"s","source":"h","severity":"info"}}"#)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let generated = body["dedup_key"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(generated).is_ok(), "{generated}");
    ingest.stop().await;
}

#[tokio::test]
async fn generic_format_opens_acknowledges_and_resolves() {
    let ingest = TestIngest::start().await;
    let (status, body) = ingest.post(&fixture("generic-firing.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["format"], "generic");
    let key: Value = serde_json::from_str(&fixture("generic-firing.json")).unwrap();
    let ack =
        json!({"title": key["title"], "dedup_key": key["dedup_key"], "status": "acknowledged"});
    let (status, body) = ingest.post(&ack.to_string()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["status"], "acknowledged");
    let (status, body) = ingest.post(&fixture("generic-resolved.json")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["incidents"][0]["status"], "resolved");
    assert_eq!(ingest.wait_events(4).await.len(), 4);

    // Resolve or acknowledge with no open incident: accepted, nothing done.
    let (status, body) = ingest
        .post(r#"{"title":"x","dedup_key":"never-opened","status":"resolved"}"#)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["incidents"][0]["change"], "no_open_incident");
    assert_eq!(body["incidents"][0]["id"], Value::Null);
    ingest.stop().await;
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_new_key_open_one_incident() {
    let ingest = TestIngest::start().await;
    let body = r#"{"title":"flood","dedup_key":"same-key","severity":"critical"}"#;
    let answers = futures::future::join_all((0..50).map(|_| ingest.post(body))).await;
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::ACCEPTED),
        "{answers:?}"
    );
    let opened = answers
        .iter()
        .filter(|(_, b)| b["incidents"][0]["change"] == "opened")
        .count();
    assert_eq!(opened, 1);
    assert_eq!(ingest.count("incidents").await, 1);
    assert_eq!(ingest.count("events").await, 1);
    ingest.stop().await;
}

/// One alert the database refuses (here, a trigger of the test's own database refuses its
/// key) in a burst of 64 concurrent alerts, which ingest writes in shared batches: the 63 others
/// are accepted and recorded; the poison one gets a 500 that names the problem and no
/// `Retry-After` (trying it again would fail again), and nothing of it is recorded. On a
/// classification that takes every query error for an outage, its whole batch got 503.
#[tokio::test]
async fn a_poison_alert_fails_alone_and_the_rest_of_its_burst_is_accepted() {
    let ingest = TestIngest::start().await;
    let mut conn = ingest.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'poisoned alert' USING ERRCODE = '22023'; END $$;
         CREATE TRIGGER poison BEFORE INSERT ON incidents
         FOR EACH ROW WHEN (NEW.dedup_key LIKE '%poison%') EXECUTE FUNCTION poison();",
    )
    .await
    .unwrap();
    let bodies: Vec<String> = (0..64)
        .map(|i| {
            let key = if i == 17 {
                "poison".to_owned()
            } else {
                format!("key-{i}")
            };
            json!({"title": format!("alert {i}"), "dedup_key": key}).to_string()
        })
        .collect();
    let answers: Vec<(StatusCode, Option<String>, Value)> =
        futures::future::join_all(bodies.iter().map(|body| async {
            let response = ingest
                .client
                .post(format!("{}/api/v1/webhooks/alerts", ingest.base))
                .header("content-type", "application/json")
                .bearer_auth(&ingest.token)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (
                response.status(),
                retry_after,
                response.json().await.unwrap(),
            )
        }))
        .await;
    for (i, (status, retry_after, body)) in answers.iter().enumerate() {
        if i == 17 {
            assert_eq!(*status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
            assert_eq!(*retry_after, None);
            assert_eq!(body["error"]["code"], "alert_not_stored", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("poisoned alert"),
                "{body}"
            );
        } else {
            assert_eq!(*status, StatusCode::ACCEPTED, "alert {i}: {body}");
        }
    }
    assert_eq!(ingest.count("incidents").await, 63);
    assert_eq!(
        ingest
            .count("incidents WHERE dedup_key LIKE '%poison%'")
            .await,
        0
    );
    ingest.stop().await;
}

#[tokio::test]
async fn every_refusal_answers_its_status_and_writes_nothing() {
    let ingest = TestIngest::start_with(
        Options {
            body_limit: 4096,
            ..Options::default()
        },
        TestDb::new().await,
    )
    .await;
    let good = r#"{"title":"t","dedup_key":"k"}"#;
    let cases: Vec<Case> = vec![
        (
            "no token",
            good.into(),
            None,
            "application/json",
            "",
            StatusCode::UNAUTHORIZED,
            None,
        ),
        (
            "malformed token",
            good.into(),
            Some("nope".into()),
            "application/json",
            "",
            StatusCode::UNAUTHORIZED,
            None,
        ),
        (
            "unknown token",
            good.into(),
            Some(tocsin_domain::AccessToken::generate().expose().to_owned()),
            "application/json",
            "",
            StatusCode::UNAUTHORIZED,
            None,
        ),
        (
            "not JSON",
            good.into(),
            Some(ingest.token.clone()),
            "text/plain",
            "",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
        ),
        (
            "unparseable",
            "{\"title\":".into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "missing title",
            r#"{"dedup_key":"k"}"#.into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("title"),
        ),
        (
            "unknown status",
            r#"{"title":"t","dedup_key":"k","status":"exploded"}"#.into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("status"),
        ),
        (
            "bad severity",
            r#"{"title":"t","dedup_key":"k","severity":"purple"}"#.into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("severity"),
        ),
        (
            "wrong type",
            r#"{"title":42,"dedup_key":"k"}"#.into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("title"),
        ),
        (
            "not an object",
            "[1,2]".into(),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("body"),
        ),
        (
            "unknown format",
            good.into(),
            Some(ingest.token.clone()),
            "application/json",
            "?format=nagios",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("format"),
        ),
        (
            "too large",
            format!(
                r#"{{"title":"t","dedup_key":"k","description":"{}"}}"#,
                "x".repeat(5000)
            ),
            Some(ingest.token.clone()),
            "application/json",
            "",
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
    ];
    for (name, body, token, content_type, query, expected, field) in cases {
        let (status, answer) = ingest
            .post_with(&body, token.as_deref(), content_type, query)
            .await;
        assert_eq!(status, expected, "{name}: {answer}");
        assert!(
            answer["error"]["code"].is_string(),
            "{name}: common error shape: {answer}"
        );
        assert!(answer["error"]["message"].is_string(), "{name}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{name}: {answer}");
        }
    }
    let response = ingest
        .client
        .post(format!("{}/api/v1/webhooks/alerts", ingest.base))
        .body(good)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()["www-authenticate"],
        r#"Bearer realm="tocsin", Basic realm="tocsin""#
    );
    assert_eq!(ingest.count("incidents").await, 0);
    assert_eq!(ingest.count("events").await, 0);
    assert_eq!(ingest.count("outbox").await, 0);

    // A revoked token is refused like an unknown one.
    let mut conn = ingest.conn().await;
    let (record, token) = tokens::create(&mut conn, "to revoke").await.unwrap();
    let (status, _) = ingest
        .post_with(good, Some(token.expose()), "application/json", "")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    tokens::revoke(&mut conn, record.id).await.unwrap();
    // The token was seen a moment ago, so ingest remembers it (the token cache); every kind
    // of request with it is refused all the same, and changes nothing.
    let refused = [
        (
            "a trigger for an open incident",
            good,
            "application/json",
            "",
        ),
        (
            "a trigger for a new key",
            r#"{"title":"t","dedup_key":"new"}"#,
            "application/json",
            "",
        ),
        (
            "a resolve",
            r#"{"title":"t","dedup_key":"k","action":"resolve"}"#,
            "application/json",
            "",
        ),
        (
            "a body that changes nothing",
            r#"{"action":"created","data":{"installation":{"uuid":"u"}}}"#,
            "application/json",
            "?format=sentry",
        ),
        ("malformed JSON", "{", "application/json", ""),
        ("not JSON", good, "text/plain", ""),
    ];
    for (name, body, content_type, query) in refused {
        let (status, body) = ingest
            .post_with(body, Some(token.expose()), content_type, query)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}: {body}");
        assert_eq!(
            body["error"]["message"], "a valid inbound token is required",
            "{name}"
        );
    }
    assert_eq!(ingest.count("incidents").await, 1);
    assert_eq!(
        ingest.count("incidents WHERE status = 'triggered'").await,
        1
    );
    assert_eq!(ingest.count("events").await, 1);
    ingest.stop().await;
}

#[tokio::test]
async fn a_token_over_its_rate_is_told_when_to_retry() {
    let ingest = TestIngest::start_with(
        Options {
            rate_limit: 3,
            ..Options::default()
        },
        TestDb::new().await,
    )
    .await;
    let mut limited = None;
    for i in 0..10 {
        let response = ingest
            .client
            .post(format!("{}/api/v1/webhooks/alerts", ingest.base))
            .bearer_auth(&ingest.token)
            .header("content-type", "application/json")
            .body(format!(r#"{{"title":"t","dedup_key":"k{i}"}}"#))
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(response);
            break;
        }
    }
    let limited = limited.expect("the limit applies within 10 quick requests");
    let retry_after: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    ingest.stop().await;
}

#[tokio::test]
async fn with_postgres_unreachable_it_answers_503_and_recovers_by_itself() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let proxied_url = db
        .url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
    let ingest = TestIngest::start_with(
        Options {
            database_url: Some(proxied_url),
            ..Options::default()
        },
        db,
    )
    .await;
    let alert = r#"{"title":"db down","dedup_key":"pg"}"#;
    proxy.cut();
    let (status, body) = ingest.post(alert).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
    let ready = ingest
        .client
        .get(format!("{}/readyz", ingest.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ingest.count("incidents").await, 0, "no 202, nothing stored");

    proxy.restore();
    let answer = wait_for("ingest to accept again", DEADLINE, || async {
        let (status, body) = ingest.post(alert).await;
        (status == StatusCode::ACCEPTED).then_some(body)
    })
    .await;
    assert_eq!(answer["incidents"][0]["change"], "opened");
    assert_eq!(ingest.count("incidents").await, 1);
    ingest.stop().await;
}

#[tokio::test]
async fn with_rabbitmq_unreachable_alerts_are_accepted_and_published_when_it_returns() {
    let proxy = TcpProxy::start("127.0.0.1:5672").await;
    let ingest = TestIngest::start_with(
        Options {
            amqp_url: Some(format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port())),
            ..Options::default()
        },
        TestDb::new().await,
    )
    .await;
    proxy.cut();
    let (status, body) = ingest
        .post(r#"{"title":"broker down","dedup_key":"mq"}"#)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let ready = ingest
        .client
        .get(format!("{}/readyz", ingest.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let mut conn = ingest.conn().await;
    assert_eq!(
        outbox::backlog(&mut conn).await.unwrap(),
        1,
        "the event waits in the outbox"
    );
    proxy.restore();
    let events = ingest.wait_events(1).await;
    assert_eq!(events[0].0, "incidents.opened");
    wait_until("the outbox to empty", DEADLINE, || async {
        let mut conn = ingest.conn().await;
        outbox::backlog(&mut conn).await.unwrap() == 0
    })
    .await;
    let ready = ingest
        .client
        .get(format!("{}/readyz", ingest.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    ingest.stop().await;
}

#[tokio::test]
async fn health_ready_and_metrics_answer() {
    let ingest = TestIngest::start().await;
    let health = ingest
        .client
        .get(format!("{}/healthz", ingest.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready: Value = ingest
        .client
        .get(format!("{}/readyz", ingest.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ready");
    let (status, _) = ingest.post(r#"{"title":"m","dedup_key":"m"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let metrics = ingest
        .client
        .get(format!("{}/metrics", ingest.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"tocsin_ingest_alerts_total{format="generic",outcome="accepted"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("tocsin_http_request_duration_seconds_bucket"));
    assert!(metrics.contains("tocsin_outbox_published_total"));
    let missing = ingest
        .client
        .get(format!("{}/nope", ingest.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    ingest.stop().await;
}
