//! Invalid webhooks: every validation rule, at creation and in a change, is refused naming the
//! field (a body that is no JSON object of the right size, with its own status), and nothing is
//! written.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tocsin_testkit::TestDb;

use crate::api::{assert_error, id_of, TestAdmin};

#[tokio::test]
async fn invalid_webhooks_are_refused_naming_the_field_and_nothing_is_written() {
    let admin = TestAdmin::start_with(TestDb::new().await, |config| config.body_limit = 4096).await;
    let valid = json!({
        "name": "ops",
        "url": "https://hooks.example.com/tocsin",
        "events": ["incidents.opened"],
        "retry": {"max_attempts": 3, "timeout_ms": 5000},
        "enabled": true,
    });
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        body
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        ("empty name", with("name", json!("")), "name"),
        ("blank name", with("name", json!("   ")), "name"),
        (
            "name too long",
            with("name", json!("n".repeat(101))),
            "name",
        ),
        ("name with a newline", with("name", json!("a\nb")), "name"),
        ("name of the wrong type", with("name", json!(42)), "name"),
        (
            "ftp url",
            with("url", json!("ftp://example.com/hook")),
            "url",
        ),
        ("relative url", with("url", json!("/hooks/tocsin")), "url"),
        ("not a url", with("url", json!("hooks dot example")), "url"),
        (
            "url with credentials",
            with("url", json!("https://user:pw@example.com/")),
            "url",
        ),
        (
            "url of the wrong type",
            with("url", json!(["https://a.b"])),
            "url",
        ),
        ("empty events", with("events", json!([])), "events"),
        (
            "unknown event kind",
            with("events", json!(["incidents.opened", "incident.closed"])),
            "events[1]",
        ),
        (
            "events not a list",
            with("events", json!("incidents.opened")),
            "events",
        ),
        (
            "event of the wrong type",
            with("events", json!([7])),
            "events[0]",
        ),
        (
            "max_attempts 0",
            with("retry", json!({"max_attempts": 0})),
            "retry.max_attempts",
        ),
        (
            "max_attempts 6",
            with("retry", json!({"max_attempts": 6})),
            "retry.max_attempts",
        ),
        (
            "max_attempts of the wrong type",
            with("retry", json!({"max_attempts": "5"})),
            "retry.max_attempts",
        ),
        (
            "max_attempts not whole",
            with("retry", json!({"max_attempts": 2.5})),
            "retry.max_attempts",
        ),
        (
            "timeout_ms too short",
            with("retry", json!({"timeout_ms": 999})),
            "retry.timeout_ms",
        ),
        (
            "timeout_ms too long",
            with("retry", json!({"timeout_ms": 30001})),
            "retry.timeout_ms",
        ),
        ("retry not an object", with("retry", json!(5)), "retry"),
        // serde's derive takes a struct from an array of its fields too: refused here.
        ("retry an empty array", with("retry", json!([])), "retry"),
        (
            "filters an array",
            with("filters", json!([null, null])),
            "filters",
        ),
        ("retry an array", with("retry", json!([3, 5000])), "retry"),
        (
            "enabled of the wrong type",
            with("enabled", json!("yes")),
            "enabled",
        ),
        (
            "unknown severity",
            with("filters", json!({"severities": ["SEV1", "SEV9"]})),
            "filters.severities[1]",
        ),
        (
            "empty severities",
            with("filters", json!({"severities": []})),
            "filters.severities",
        ),
        (
            "severities not a list",
            with("filters", json!({"severities": "SEV1"})),
            "filters.severities",
        ),
        (
            "blank source",
            with("filters", json!({"sources": [" "]})),
            "filters.sources[0]",
        ),
        (
            "label of the wrong type",
            with("filters", json!({"labels": {"team": 1}})),
            "filters.labels.team",
        ),
        (
            "unknown filter",
            with("filters", json!({"teams": ["db"]})),
            "filters.teams",
        ),
        (
            "reserved header",
            with("headers", json!({"Content-Type": "text/plain"})),
            "headers.Content-Type",
        ),
        (
            "reserved header prefix",
            with("headers", json!({"webhook-signature": "v1,forged"})),
            "headers.webhook-signature",
        ),
        (
            "tocsin header",
            with("headers", json!({"Tocsin-Event": "x"})),
            "headers.Tocsin-Event",
        ),
        (
            "header value with a newline",
            with("headers", json!({"x-key": "a\r\nx-injected: 1"})),
            "headers.x-key",
        ),
        (
            "header name with a space",
            with("headers", json!({"x key": "1"})),
            "headers.x key",
        ),
        (
            "masked header at creation",
            with("headers", json!({"x-key": "***"})),
            "headers.x-key",
        ),
        (
            "header value of the wrong type",
            with("headers", json!({"x-key": 1})),
            "headers.x-key",
        ),
        (
            "rate limit 0",
            with("rate_limit_per_second", json!(0)),
            "rate_limit_per_second",
        ),
        (
            "rate limit too high",
            with("rate_limit_per_second", json!(10001)),
            "rate_limit_per_second",
        ),
        (
            "rate limit of the wrong type",
            with("rate_limit_per_second", json!("2")),
            "rate_limit_per_second",
        ),
    ];
    for (what, body, field) in &cases {
        let answer = admin.post("/api/v1/webhooks", body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
        assert_eq!(answer.1["error"]["code"], "invalid", "{what}");
    }
    for (what, body, needle) in [
        (
            "unknown field",
            with("secret", json!("whsec_x")),
            "unknown field",
        ),
        (
            "unknown retry field",
            with("retry", json!({"attempts": 3})),
            "unknown field",
        ),
        (
            "missing name",
            json!({"url": "https://a.example", "events": ["incidents.opened"]}),
            "name",
        ),
        ("not an object", json!([1, 2]), ""),
    ] {
        let answer = admin.post("/api/v1/webhooks", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, None);
        let message = answer.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{what}: {message}");
    }
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "application/json",
            "{\"name\":".into(),
        )
        .await;
    assert_error("unparseable", &answer, StatusCode::BAD_REQUEST, None);
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "application/json",
            String::new(),
        )
        .await;
    assert_error("empty body", &answer, StatusCode::BAD_REQUEST, None);
    let answer = admin
        .send_raw(
            Method::POST,
            "/api/v1/webhooks",
            "text/plain",
            valid.to_string(),
        )
        .await;
    assert_error(
        "not JSON",
        &answer,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        None,
    );
    let mut large = valid.clone();
    large["name"] = json!("x".repeat(5000));
    let answer = admin.post("/api/v1/webhooks", &large).await;
    assert_error("too large", &answer, StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(admin.count("webhooks").await, 0, "nothing was written");

    // The same rules apply to a change, which leaves the webhook as it was.
    let created = admin.create_webhook("keep me").await;
    let path = format!("/api/v1/webhooks/{}", id_of(&created));
    let (_, before) = admin.get(&path).await;
    for (what, body, field) in &cases {
        let answer = admin.patch(&path, body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
    }
    for (what, body, field) in [
        ("null name", json!({"name": null}), "name"),
        ("null events", json!({"events": null}), "events"),
        (
            "null retry field",
            json!({"retry": {"max_attempts": null}}),
            "retry.max_attempts",
        ),
    ] {
        let answer = admin.patch(&path, &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, Some(field));
    }
    let answer = admin.patch(&path, &json!({"colour": "red"})).await;
    assert_error(
        "unknown field",
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
    );
    let answer = admin
        .send_raw(Method::PATCH, &path, "text/plain", "{}".into())
        .await;
    assert_error(
        "not JSON",
        &answer,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        None,
    );
    let (_, after) = admin.get(&path).await;
    assert_eq!(before, after, "refused changes change nothing");
    assert_eq!(admin.count("webhooks").await, 1);
    admin.stop().await;
}
