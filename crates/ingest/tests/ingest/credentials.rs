//! Credentials other than `Authorization: Bearer`, each an opt-in of the token: basic
//! authentication with the token as password, the `token` query parameter, Sentry's signature;
//! and SNS's subscription confirmation, fetched only from permitted hosts and through the SSRF
//! rules.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::Value;
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::SigningSecret;
use tocsin_storage::schema::inbound_tokens;
use tocsin_storage::tokens::{self, NewToken};
use tocsin_testkit::{wait_for, RawBehavior, RawReceiver, Receiver};

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
async fn a_tokens_use_is_noted_after_its_request_once_a_minute_at_most() {
    let ingest = TestIngest::start().await;
    let mut conn = ingest.conn().await;
    let (record, token) = tokens::issue(&mut conn, &NewToken::named("noted"))
        .await
        .unwrap();
    let used = async |conn: &mut AsyncPgConnection| -> Option<OffsetDateTime> {
        inbound_tokens::table
            .find(record.id)
            .select(inbound_tokens::last_used_at)
            .first(conn)
            .await
            .unwrap()
    };
    assert_eq!(used(&mut conn).await, None, "not used yet");
    let (status, answer) = ingest
        .post_with(GENERIC, Some(token.expose()), JSON, "")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    // Written after the answer, in a task of its own.
    let noted = wait_for("the token's use noted", DEADLINE, || async {
        used(&mut ingest.conn().await).await
    })
    .await;
    tokens::note_use(&mut conn, &[record.id]).await.unwrap();
    assert_eq!(
        used(&mut conn).await,
        Some(noted),
        "a use noted less than a minute ago is not written again"
    );
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
        sns_hosts: format!("http://127.0.0.1:{}", sns.port()),
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
        sns_hosts: format!("http://127.0.0.1:{}", sns.port()),
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

/// The throw-away signing key and certificates of `sns-signing/` (its README says how made).
fn signing_file(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/ingest/sns-signing/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// `message` signed as SNS signs with `SignatureVersion` 2, naming `cert_url` as its
/// certificate.
fn sns_signed(mut message: Value, cert_url: &str) -> String {
    let fields: &[&str] = if message["Type"] == "Notification" {
        &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ]
    } else {
        &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ]
    };
    let text: String = fields
        .iter()
        .filter_map(|name| {
            message[*name]
                .as_str()
                .map(|value| format!("{name}\n{value}\n"))
        })
        .collect();
    let key = ring::signature::RsaKeyPair::from_pkcs8(&signing_file("key.pk8")).unwrap();
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        text.as_bytes(),
        &mut signature,
    )
    .unwrap();
    message["SignatureVersion"] = Value::from("2");
    message["Signature"] = Value::from(STANDARD.encode(signature));
    message["SigningCertURL"] = Value::from(cert_url);
    message.to_string()
}

#[tokio::test]
async fn a_token_with_sns_signature_takes_only_messages_sns_signed() {
    let certificate =
        RawReceiver::start(RawBehavior::ok_with_body(&signing_file("certificate.pem"))).await;
    let other = RawReceiver::start(RawBehavior::ok_with_body(&signing_file(
        "other-certificate.pem",
    )))
    .await;
    let down = RawReceiver::start(RawBehavior::answer("503 Service Unavailable", &[], b"")).await;
    let options = Options {
        sns_hosts: [&certificate, &other, &down]
            .map(|receiver| receiver.url(""))
            .join(","),
        allowed_targets: "127.0.0.0/8".into(),
        ..Options::default()
    };
    let ingest = TestIngest::start_with(options, tocsin_testkit::TestDb::new().await).await;
    let token = ingest
        .issue(NewToken {
            source: Some(AlertFormat::CloudWatch),
            basic_auth: true,
            sns_signature: true,
            ..NewToken::named("sns")
        })
        .await;
    let auth = basic("sns", &token);
    let mut notification = SNS_HEADERS;
    notification[1].1 = "Notification";
    let alarm: Value = serde_json::from_str(&fixture("cloudwatch-sns-alarm.json")).unwrap();
    let cert_url = certificate.url("/SimpleNotificationService-test.pem");

    // Signed with SignatureVersion 2 (SHA-256): opens the incident.
    let (status, answer) = ingest
        .post_raw(
            "",
            auth.clone(),
            &notification,
            &sns_signed(alarm.clone(), &cert_url),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["change"], "opened");

    // Every way of not being signed by the certificate is refused, and changes nothing.
    let mut tampered: Value = serde_json::from_str(&sns_signed(alarm.clone(), &cert_url)).unwrap();
    tampered["Message"] = Value::from(
        tampered["Message"]
            .as_str()
            .unwrap()
            .replace("\"ALARM\"", "\"OK\""),
    );
    let mut unsigned = alarm.clone();
    unsigned["SigningCertURL"] = Value::from(cert_url.clone());
    let mut bad_version: Value =
        serde_json::from_str(&sns_signed(alarm.clone(), &cert_url)).unwrap();
    bad_version["SignatureVersion"] = Value::from("3");
    let mut no_topic: Value = serde_json::from_str(&sns_signed(alarm.clone(), &cert_url)).unwrap();
    no_topic.as_object_mut().unwrap().remove("TopicArn");
    let refused = [
        ("the message changed after signing", tampered.to_string()),
        ("the fixture's made-up signature", unsigned.to_string()),
        ("SignatureVersion 3", bad_version.to_string()),
        ("no TopicArn", no_topic.to_string()),
        (
            "another certificate",
            sns_signed(
                alarm.clone(),
                &other.url("/SimpleNotificationService-other.pem"),
            ),
        ),
        (
            "a certificate on a host not permitted",
            sns_signed(
                alarm.clone(),
                "https://sns.eu-west-1.amazonaws.com.evil.example/SimpleNotificationService-x.pem",
            ),
        ),
    ];
    for (what, body) in refused {
        let (status, _) = ingest
            .post_raw("", auth.clone(), &notification, &body)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
    }
    assert_eq!(ingest.count("incidents").await, 1);

    // A certificate that cannot be fetched: 502, so that SNS sends the message again.
    let (status, answer) = ingest
        .post_raw(
            "",
            auth.clone(),
            &notification,
            &sns_signed(
                alarm.clone(),
                &down.url("/SimpleNotificationService-down.pem"),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert_eq!(answer["error"]["code"], "certificate_unavailable");

    // SignatureVersion 1 (SHA-1), made with openssl: resolves the incident.
    let mut ok: Value =
        serde_json::from_slice(&signing_file("cloudwatch-sns-ok-signed-v1.json")).unwrap();
    ok["SigningCertURL"] = Value::from(cert_url.clone());
    let (status, answer) = ingest
        .post_raw("", auth.clone(), &notification, &ok.to_string())
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["status"], "resolved", "{answer}");

    // A signed subscription confirmation is confirmed (its SubscribeURL on a permitted host).
    let mut confirmation: Value =
        serde_json::from_str(&fixture("cloudwatch-sns-subscription-confirmation.json")).unwrap();
    confirmation["SubscribeURL"] =
        Value::from(certificate.url("/?Action=ConfirmSubscription&Token=2336412f37fb"));
    let (status, answer) = ingest
        .post_raw(
            "",
            auth.clone(),
            &SNS_HEADERS,
            &sns_signed(confirmation.clone(), &cert_url),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["notice"], "subscription_confirmed");
    // Unsigned, it is refused before anything is fetched.
    let before = certificate.count();
    let (status, _) = ingest
        .post_raw("", auth, &SNS_HEADERS, &confirmation.to_string())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(certificate.count(), before);

    // The certificate was fetched once and kept: the rest were the confirmation's GET.
    let fetches = certificate
        .requests()
        .iter()
        .filter(|request| request.request_line().contains(".pem"))
        .count();
    assert_eq!(fetches, 1);
    assert_eq!(other.count(), 1);
    ingest.stop().await;
}
