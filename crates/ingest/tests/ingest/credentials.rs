//! Credentials other than `Authorization: Bearer`, each an opt-in of the token: basic
//! authentication with the token as password, the `token` query parameter, Sentry's signature;
//! and SNS's subscription confirmation, fetched only from permitted hosts and through the SSRF
//! rules.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use reqwest::StatusCode;
use serde_json::Value;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::SigningSecret;
use tocsin_storage::tokens::{self, NewToken};
use tocsin_testkit::Receiver;

use crate::common::{fixture, Options, TestIngest, DEADLINE};

const JSON: &str = "application/json";
const GENERIC: &str = r#"{"title":"Disk full","dedup_key":"disk"}"#;

impl TestIngest {
    async fn issue(&self, new: NewToken<'_>) -> String {
        let mut conn = self.conn().await;
        let (_, token) = tokens::issue(&mut conn, &new).await.unwrap();
        token.expose().to_owned()
    }

    /// Posts `body` with an `Authorization` header of its own (or none) and extra headers.
    async fn post_raw(
        &self,
        query: &str,
        authorization: Option<String>,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .post(format!("{}/api/v1/webhooks/alerts{query}", self.base))
            .body(body.to_owned());
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

fn basic(user: &str, password: &str) -> Option<String> {
    Some(format!(
        "Basic {}",
        STANDARD.encode(format!("{user}:{password}"))
    ))
}

#[tokio::test]
async fn basic_authentication_is_an_opt_in_of_the_token() {
    let ingest = TestIngest::start().await;
    let opted = ingest
        .issue(NewToken {
            basic_auth: true,
            ..NewToken::named("basic")
        })
        .await;
    let json = [("content-type", JSON)];
    let (status, answer) = ingest
        .post_raw("", basic("tocsin", &opted), &json, GENERIC)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    // The user name is not checked: SNS and others need one in the URL, any will do.
    let (status, _) = ingest.post_raw("", basic("", &opted), &json, GENERIC).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Bearer still works for it.
    let (status, _) = ingest
        .post_raw("", Some(format!("Bearer {opted}")), &json, GENERIC)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    // The default token refuses basic authentication, and a wrong password is refused.
    for authorization in [
        basic("tocsin", &ingest.token),
        basic("tocsin", &format!("{}x", &opted[..opted.len() - 1])),
        basic(&opted, "x"),
    ] {
        let (status, answer) = ingest.post_raw("", authorization, &json, GENERIC).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
        assert_eq!(answer["error"]["code"], "unauthorized");
    }
    // The challenge SNS needs before it sends user-info credentials.
    let response = ingest
        .client
        .post(format!("{}/api/v1/webhooks/alerts", ingest.base))
        .header("content-type", JSON)
        .body(GENERIC)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.contains(r#"Basic realm="tocsin""#), "{challenge}");
    assert_eq!(ingest.count("incidents").await, 1);
    ingest.stop().await;
}

#[tokio::test]
async fn a_query_token_is_an_opt_in_of_the_token() {
    let ingest = TestIngest::start().await;
    let opted = ingest
        .issue(NewToken {
            query_token: true,
            ..NewToken::named("query")
        })
        .await;
    let json = [("content-type", JSON)];
    let (status, answer) = ingest
        .post_raw(&format!("?token={opted}"), None, &json, GENERIC)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let (status, _) = ingest
        .post_raw(&format!("?token={}", ingest.token), None, &json, GENERIC)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // With basic authentication not opted in, user-info credentials are refused.
    let (status, _) = ingest
        .post_raw("", basic("x", &opted), &json, GENERIC)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    ingest.stop().await;
}

#[tokio::test]
async fn a_sentry_token_with_a_secret_needs_the_signature() {
    let ingest = TestIngest::start().await;
    let secret = SigningSecret::parse("sentry-client-secret").unwrap();
    let token = ingest
        .issue(NewToken {
            source: Some(AlertFormat::Sentry),
            signing_secret: Some(&secret),
            ..NewToken::named("sentry")
        })
        .await;
    let body = fixture("sentry-issue-alert.json");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.expose().as_bytes());
    let signature: String = ring::hmac::sign(&key, body.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let bearer = Some(format!("Bearer {token}"));
    let unsigned = [("content-type", JSON)];
    let (status, _) = ingest.post_raw("", bearer.clone(), &unsigned, &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let forged = "0".repeat(64);
    let (status, _) = ingest
        .post_raw(
            "",
            bearer.clone(),
            &[("content-type", JSON), ("sentry-hook-signature", &forged)],
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let signed = [
        ("content-type", JSON),
        ("sentry-hook-signature", &signature),
    ];
    let (status, answer) = ingest.post_raw("", bearer.clone(), &signed, &body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    // The signature is of the body as sent: another body with it is refused.
    let (status, _) = ingest
        .post_raw("", bearer, &signed, &fixture("sentry-issue-resolved.json"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(ingest.count("incidents").await, 1);
    ingest.stop().await;
}

/// SNS's subscription confirmation for a `SubscribeURL` on `receiver`.
fn confirmation(subscribe_url: &str) -> String {
    let mut body: Value =
        serde_json::from_str(&fixture("cloudwatch-sns-subscription-confirmation.json")).unwrap();
    body["SubscribeURL"] = Value::from(subscribe_url);
    body.to_string()
}

const SNS_HEADERS: [(&str, &str); 2] = [
    ("content-type", "text/plain; charset=UTF-8"),
    ("x-amz-sns-message-type", "SubscriptionConfirmation"),
];

#[tokio::test]
async fn an_sns_subscription_is_confirmed_only_for_permitted_hosts() {
    let sns = Receiver::start().await;
    let options = Options {
        sns_confirm_hosts: format!("http://127.0.0.1:{}", sns.port()),
        allowed_targets: "127.0.0.0/8".into(),
        ..Options::default()
    };
    let ingest = TestIngest::start_with(options, tocsin_testkit::TestDb::new().await).await;
    let token = ingest
        .issue(NewToken {
            basic_auth: true,
            ..NewToken::named("sns")
        })
        .await;
    let auth = basic("sns", &token);

    let permitted = sns.url("/?Action=ConfirmSubscription&Token=2336412f37fb");
    let (status, answer) = ingest
        .post_raw("", auth.clone(), &SNS_HEADERS, &confirmation(&permitted))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["format"], "cloudwatch");
    assert_eq!(answer["notice"], "subscription_confirmed");
    let requests = sns.wait_for_requests(1, DEADLINE).await;
    assert_eq!(requests[0].method, "GET");
    assert!(requests[0].header("authorization").is_none());

    // Another port of the same host, another host: not fetched.
    for refused in [
        "http://127.0.0.1:1/?Action=ConfirmSubscription".to_owned(),
        "https://sns.eu-west-1.amazonaws.com.evil.example/?Action=ConfirmSubscription".to_owned(),
        "not a url".to_owned(),
    ] {
        let (status, answer) = ingest
            .post_raw("", auth.clone(), &SNS_HEADERS, &confirmation(&refused))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{refused}: {answer}"
        );
        assert_eq!(answer["error"]["field"], "SubscribeURL");
    }
    assert_eq!(sns.count(), 1);

    // SNS retries a failed confirmation: it is answered 502.
    sns.set_behavior(tocsin_testkit::Behavior::Status(500));
    let (status, answer) = ingest
        .post_raw("", auth.clone(), &SNS_HEADERS, &confirmation(&permitted))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert!(!answer.to_string().contains("2336412f37fb"), "{answer}");

    // An unsubscription is accepted and logged.
    let mut unsubscribed = SNS_HEADERS;
    unsubscribed[1].1 = "UnsubscribeConfirmation";
    let (status, answer) = ingest
        .post_raw(
            "",
            auth.clone(),
            &unsubscribed,
            &fixture("cloudwatch-sns-unsubscribe-confirmation.json"),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["notice"], "unsubscribed");

    // A notification as SNS sends it (text/plain), detected from the envelope.
    let mut notification = SNS_HEADERS;
    notification[1].1 = "Notification";
    let (status, answer) = ingest
        .post_raw(
            "",
            auth,
            &notification,
            &fixture("cloudwatch-sns-alarm.json"),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["change"], "opened");
    // Text that does not come from SNS is still refused.
    let (status, _) = ingest
        .post_raw(
            "",
            Some(format!("Bearer {}", ingest.token)),
            &[("content-type", "text/plain")],
            GENERIC,
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    ingest.stop().await;
}

#[tokio::test]
async fn a_permitted_host_is_still_bound_by_the_ssrf_rules() {
    let sns = Receiver::start().await;
    let options = Options {
        sns_confirm_hosts: format!("http://127.0.0.1:{}", sns.port()),
        // No CIDR allowlisted: loopback is refused where the request would connect.
        allowed_targets: String::new(),
        ..Options::default()
    };
    let ingest = TestIngest::start_with(options, tocsin_testkit::TestDb::new().await).await;
    let (status, answer) = ingest
        .post_raw(
            "",
            Some(format!("Bearer {}", ingest.token)),
            &SNS_HEADERS,
            &confirmation(&sns.url("/?Action=ConfirmSubscription&Token=x")),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("not allowed"), "{message}");
    assert_eq!(sns.count(), 0);
    ingest.stop().await;
}
