//! Arbitrary request bodies and ids sent to the running admin API and settings pages: never a
//! 5xx, always the common error shape for a refusal of the API, and never a half-written row or
//! a control character (header injection) stored for a refused body. Hostile bodies each get
//! their own 4xx.
//!
//! `PROPTEST_CASES` sets the number of requests of each fuzz test (default 500) and
//! `TOCSIN_FUZZ_TIME` bounds each run (default 60 s); see `tocsin_testkit::fuzz`.

use proptest::prelude::*;
use reqwest::Method;
use serde_json::{json, Value};
use tocsin_admin::Config;
use tocsin_testkit::fuzz::{self, Budget};
use tocsin_testkit::TestDb;

use crate::common::RunningAdmin;

const TOKEN: &str = "fuzz-admin-token-0123456789";
const NIL: &str = "00000000-0000-0000-0000-000000000000";

/// The fields of every admin request body.
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

/// Values the admin API gives meaning to.
const WORDS: &[&str] = &[
    "https://example.com/hook",
    "http://127.0.0.1:9/x",
    "https://example.com/a\r\nX-Injected: 1",
    "https://user:pass@example.com/",
    "ftp://example.com/",
    "incidents.opened",
    "incidents.resolved",
    "incidents.status_changed",
    "resolved",
    "acknowledged",
    "2026-11-22T00:00:00Z",
    "2026-13-40T99:00:00Z",
];

/// The fields of the settings pages' forms.
const FORM_FIELDS: &[&str] = &[
    "name",
    "url",
    "events",
    "max_attempts",
    "timeout_ms",
    "since",
    "status",
    "confirmed",
    "token",
    "csrf",
];

/// The admin under test, with the helpers of this module.
struct TestAdmin(RunningAdmin);

impl std::ops::Deref for TestAdmin {
    type Target = RunningAdmin;
    fn deref(&self) -> &RunningAdmin {
        &self.0
    }
}

impl TestAdmin {
    /// Admin with wrong-token attempts limited only after `auth_failures` a minute.
    async fn start(auth_failures: u16) -> TestAdmin {
        let adjust = |config: &mut Config| config.auth_failures = auth_failures;
        TestAdmin(RunningAdmin::start(TestDb::new().await, TOKEN, adjust).await)
    }

    /// An API call with a raw JSON body; returns the status and the JSON answer.
    async fn call(&self, method: Method, path: &str, body: Vec<u8>) -> (u16, Value) {
        let request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body);
        let answer = self.exchange(request).await;
        (answer.status.as_u16(), answer.json())
    }

    /// A webhook created through the API; returns its id.
    async fn create_webhook(&self) -> String {
        let body =
            json!({"name": "fuzz", "url": "https://example.com/", "events": ["incidents.opened"]});
        let (status, created) = self
            .call(
                Method::POST,
                "/api/v1/webhooks",
                body.to_string().into_bytes(),
            )
            .await;
        assert_eq!(status, 201, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    /// Every webhook's name and URL hold no control character: nothing a client sent can
    /// reach a header line or a log line unescaped.
    async fn assert_no_control_characters_stored(&self) {
        let (status, list) = self
            .call(Method::GET, "/api/v1/webhooks?limit=200", Vec::new())
            .await;
        assert_eq!(status, 200, "{list}");
        for webhook in list["items"].as_array().unwrap() {
            for field in ["name", "url"] {
                let text = webhook[field].as_str().unwrap();
                assert!(
                    !text.chars().any(char::is_control),
                    "a control character stored in {field}: {text:?}"
                );
            }
        }
        let (status, list) = self
            .call(Method::GET, "/api/v1/tokens?limit=200", Vec::new())
            .await;
        assert_eq!(status, 200, "{list}");
        for token in list["items"].as_array().unwrap() {
            let name = token["name"].as_str().unwrap();
            assert!(!name.chars().any(char::is_control), "{name:?}");
        }
    }

    async fn stop(self) {
        self.0.stop().await;
    }
}

/// An API answer: never a 5xx, the common error shape for a refusal, no control characters in
/// a name answered.
fn check_answer(status: u16, answer: &Value, what: &dyn std::fmt::Display) {
    fuzz::check_refusal(status, answer, what);
    if let Some(name) = answer["name"].as_str() {
        assert!(
            !name.chars().any(char::is_control),
            "no control characters stored: {name:?}"
        );
    }
}

/// The routes that take a body (and the retry, which takes none and must ignore one), with a
/// real webhook and unknown or malformed ids.
fn api_targets(webhook: &str) -> Vec<(Method, String)> {
    vec![
        (Method::POST, "/api/v1/webhooks".to_owned()),
        (Method::PATCH, format!("/api/v1/webhooks/{webhook}")),
        (Method::POST, format!("/api/v1/webhooks/{webhook}/recover")),
        (Method::POST, "/api/v1/tokens".to_owned()),
        (Method::PATCH, format!("/api/v1/incidents/{NIL}")),
        (Method::POST, format!("/api/v1/deliveries/{NIL}/retry")),
        (
            Method::POST,
            "/api/v1/deliveries/not-a-uuid/retry".to_owned(),
        ),
        (Method::PATCH, "/api/v1/webhooks/not-a-uuid".to_owned()),
        (Method::POST, format!("/api/v1/webhooks/{NIL}/recover")),
    ]
}

#[tokio::test]
async fn arbitrary_bodies_never_get_a_server_error() {
    let admin = TestAdmin::start(5).await;
    let webhook = admin.create_webhook().await;
    let targets = api_targets(&webhook);
    // Valid bodies of every route, bent out of shape, besides arbitrary ones.
    let valid = vec![
        json!({"name": "n", "url": "https://example.com/hook", "events": ["incidents.opened"],
            "retry": {"max_attempts": 3, "timeout_ms": 5000}, "enabled": true}),
        json!({"since": "2026-11-22T00:00:00Z"}),
        json!({"name": "a token"}),
        json!({"status": "acknowledged"}),
    ];
    let strategy = (
        prop_oneof![
            2 => fuzz::body(FIELDS, WORDS),
            1 => prop::sample::select(valid)
                .prop_flat_map(|base| fuzz::mutated(base, FIELDS, WORDS))
                .prop_map(|value| serde_json::to_vec(&value).unwrap()),
        ],
        0..targets.len(),
    );
    let mut samples = Budget::from_env(500).samples(strategy);
    let mut statuses = std::collections::BTreeMap::new();
    for (body, target) in samples.by_ref() {
        let (method, path) = &targets[target];
        let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let (status, answer) = admin.call(method.clone(), path, body).await;
        *statuses
            .entry((path.split('/').nth(3).unwrap_or("").to_owned(), status))
            .or_insert(0) += 1;
        check_answer(status, &answer, &format!("{method} {path} {shown:?}"));
    }
    eprintln!("{}; statuses: {statuses:?}", samples.summary());
    admin.assert_no_control_characters_stored().await;
    admin.stop().await;
}

#[tokio::test]
async fn hostile_bodies_each_get_their_4xx() {
    let admin = TestAdmin::start(5).await;
    let webhook = admin.create_webhook().await;
    let with_body: Vec<(Method, String, &str)> = vec![
        (Method::POST, "/api/v1/webhooks".to_owned(), "name"),
        (Method::PATCH, format!("/api/v1/webhooks/{webhook}"), "name"),
        (
            Method::POST,
            format!("/api/v1/webhooks/{webhook}/recover"),
            "since",
        ),
        (Method::POST, "/api/v1/tokens".to_owned(), "name"),
        (Method::PATCH, format!("/api/v1/incidents/{NIL}"), "status"),
    ];
    for (method, path, key) in &with_body {
        for (what, body) in fuzz::syntax_errors(key) {
            let (status, answer) = admin.call(method.clone(), path, body).await;
            check_answer(status, &answer, &format!("{what}: {method} {path}"));
            // Objects nested under a known field fail on that field's type first (422); every
            // other hostile body is not JSON at all (400).
            let expected: &[u16] = if what.contains("nested objects") {
                &[400, 422]
            } else {
                &[400]
            };
            assert!(
                expected.contains(&status),
                "{what}: {method} {path}: {status} {answer}"
            );
        }
    }

    // Numbers out of range for the retry settings: 422 naming the field.
    for number in fuzz::OUT_OF_RANGE_NUMBERS
        .iter()
        .filter(|n| !n.contains("e4"))
    {
        for field in ["max_attempts", "timeout_ms"] {
            let body = format!(
                r#"{{"name":"n","url":"https://example.com/","events":["incidents.opened"],"retry":{{"{field}":{number}}}}}"#
            );
            let (status, answer) = admin
                .call(Method::POST, "/api/v1/webhooks", body.into_bytes())
                .await;
            check_answer(status, &answer, &format!("{field} {number}"));
            assert_eq!(status, 422, "{field} {number}: {answer}");
            assert_eq!(
                answer["error"]["field"],
                format!("retry.{field}"),
                "{answer}"
            );
        }
    }

    // Header injection: a name with a line break is refused; a URL with one is refused or
    // stored without it (the URL parser drops tabs and line breaks), never with it.
    for nasty in fuzz::NASTY_STRINGS
        .iter()
        .filter(|s| s.chars().any(char::is_control))
    {
        let body = json!({"name": format!("n{nasty}n"), "url": "https://example.com/", "events": ["incidents.opened"]});
        let (status, answer) = admin
            .call(
                Method::POST,
                "/api/v1/webhooks",
                body.to_string().into_bytes(),
            )
            .await;
        assert_eq!(status, 422, "name {nasty:?}: {answer}");
        assert_eq!(answer["error"]["field"], "name", "{answer}");
        let (status, answer) = admin
            .call(
                Method::POST,
                "/api/v1/tokens",
                json!({"name": format!("n{nasty}n")})
                    .to_string()
                    .into_bytes(),
            )
            .await;
        assert_eq!(status, 422, "token name {nasty:?}: {answer}");

        let body = json!({"name": "n", "url": format!("https://example.com/a{nasty}b"), "events": ["incidents.opened"]});
        let (status, answer) = admin
            .call(
                Method::POST,
                "/api/v1/webhooks",
                body.to_string().into_bytes(),
            )
            .await;
        check_answer(status, &answer, &format!("url {nasty:?}"));
        if status == 201 {
            let url = answer["url"].as_str().unwrap();
            assert!(!url.chars().any(char::is_control), "{url:?}");
        } else {
            assert_eq!(status, 422, "url {nasty:?}: {answer}");
        }
    }

    // Huge strings: over the body limit 413, within it 422 naming the field.
    let huge = json!({"name": "x".repeat(2 * 1024 * 1024)})
        .to_string()
        .into_bytes();
    let (status, answer) = admin.call(Method::POST, "/api/v1/tokens", huge).await;
    check_answer(status, &answer, &"2 MiB");
    assert_eq!(status, 413, "{answer}");
    let long = json!({"name": "x".repeat(500_000), "url": "https://example.com/", "events": ["incidents.opened"]});
    let (status, answer) = admin
        .call(
            Method::POST,
            "/api/v1/webhooks",
            long.to_string().into_bytes(),
        )
        .await;
    assert_eq!((status, &answer["error"]["field"]), (422, &json!("name")));
    let long = json!({"name": "n", "url": format!("https://example.com/{}", "x".repeat(500_000)), "events": ["incidents.opened"]});
    let (status, answer) = admin
        .call(
            Method::POST,
            "/api/v1/webhooks",
            long.to_string().into_bytes(),
        )
        .await;
    assert_eq!((status, &answer["error"]["field"]), (422, &json!("url")));

    admin.assert_no_control_characters_stored().await;
    admin.stop().await;
}

/// A signed-in browser: its session cookie and the CSRF token of its forms.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn sign_in(admin: &TestAdmin) -> Browser {
    let (cookie, csrf) = admin.0.sign_in(TOKEN).await;
    Browser { cookie, csrf }
}

/// How the CSRF field of a generated form is filled.
#[derive(Debug, Clone)]
enum Csrf {
    Valid,
    Missing,
    Wrong(String),
}

/// A form body: fields in order, each value a generated string (percent-encoded when written);
/// or raw bytes (invalid UTF-8 percent escapes, bare `%`, arbitrary bytes).
#[derive(Debug, Clone)]
enum FormBody {
    Fields(Vec<(String, String)>, Csrf),
    Raw(Vec<u8>, Csrf),
}

fn form_body() -> impl Strategy<Value = FormBody> {
    let value = prop_oneof![
        4 => fuzz::json_value(FIELDS, WORDS).prop_map(|v| match v {
            Value::String(s) => s,
            other => other.to_string(),
        }),
        1 => prop::sample::select(fuzz::NASTY_STRINGS).prop_map(str::to_owned),
        1 => prop::sample::select(fuzz::OUT_OF_RANGE_NUMBERS).prop_map(str::to_owned),
    ];
    let key = prop_oneof![
        6 => prop::sample::select(FORM_FIELDS).prop_map(str::to_owned),
        1 => "[a-z_%&=]{0,6}",
    ];
    let csrf = prop_oneof![
        8 => Just(Csrf::Valid),
        1 => Just(Csrf::Missing),
        1 => "[a-zA-Z0-9_-]{0,50}".prop_map(Csrf::Wrong),
    ];
    let raw = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        Just(b"name=%FF%FE&url=%C0%AF&events=%ED%A0%80".to_vec()),
        Just(b"name=a%0D%0AX-Injected:%201&url=https://example.com/%0D%0A".to_vec()),
        Just(b"name=%&url=%%%&events=%zz".to_vec()),
        Just(b"&&&===&".to_vec()),
    ];
    prop_oneof![
        4 => (prop::collection::vec((key, value), 0..8), csrf.clone())
            .prop_map(|(fields, csrf)| FormBody::Fields(fields, csrf)),
        1 => (raw, csrf).prop_map(|(raw, csrf)| FormBody::Raw(raw, csrf)),
    ]
}

fn encode(body: FormBody, csrf: &str) -> Vec<u8> {
    let (mut bytes, choice) = match body {
        FormBody::Fields(fields, choice) => {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            for (key, value) in &fields {
                form.append_pair(key, value);
            }
            (form.finish().into_bytes(), choice)
        }
        FormBody::Raw(raw, choice) => (raw, choice),
    };
    let presented = match choice {
        Csrf::Valid => Some(csrf.to_owned()),
        Csrf::Missing => None,
        Csrf::Wrong(wrong) => Some(wrong),
    };
    if let Some(presented) = presented {
        bytes.extend_from_slice(b"&csrf=");
        bytes.extend(
            url::form_urlencoded::byte_serialize(presented.as_bytes()).flat_map(str::bytes),
        );
    }
    bytes
}

#[tokio::test]
async fn arbitrary_form_posts_to_the_settings_pages_never_get_a_server_error() {
    // Wrong sign-in tokens are part of the input: the limit is lifted so that they do not turn
    // every later request into a 429.
    let admin = TestAdmin::start(u16::MAX).await;
    let webhook = admin.create_webhook().await;
    let browser = sign_in(&admin).await;
    let targets: Vec<String> = vec![
        "/settings/webhooks/new".to_owned(),
        format!("/settings/webhooks/{webhook}/edit"),
        format!("/settings/webhooks/{webhook}/recover"),
        format!("/settings/webhooks/{webhook}/test"),
        format!("/settings/webhooks/{webhook}/enable"),
        format!("/settings/webhooks/{webhook}/disable"),
        format!("/settings/webhooks/{webhook}/rotate-secret"),
        format!("/settings/deliveries/{NIL}/retry"),
        format!("/settings/incidents/{NIL}/status"),
        format!("/settings/webhooks/{NIL}/edit"),
        "/settings/webhooks/not-a-uuid/edit".to_owned(),
        "/settings/sign-in".to_owned(),
    ];
    let strategy = (form_body(), 0..targets.len(), any::<bool>());
    let mut samples = Budget::from_env(500).samples(strategy);
    let mut statuses = std::collections::BTreeMap::new();
    for (body, target, signed_in) in samples.by_ref() {
        let path = &targets[target];
        let bytes = encode(body, &browser.csrf);
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
        let mut request = admin
            .client
            .post(format!("{}{path}", admin.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(bytes);
        // Mostly signed in, so that the forms are read; sometimes not.
        if signed_in || target % 2 == 0 {
            request = request.header("cookie", &browser.cookie);
        }
        let answer = admin.exchange(request).await;
        let status = answer.status.as_u16();
        let html = answer
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/html"));
        let text = answer.text;
        *statuses
            .entry((path.rsplit('/').next().unwrap_or("").to_owned(), status))
            .or_insert(0) += 1;
        assert!(status < 500, "{status} for {path} {shown:?}: {text}");
        if status >= 400 {
            assert!(html, "a refusal is a page: {status} for {path}: {text}");
        }
    }
    eprintln!("{}; statuses: {statuses:?}", samples.summary());
    admin.assert_no_control_characters_stored().await;
    admin.stop().await;
}
