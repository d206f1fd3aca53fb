//! The admin token: every API call needs it and the open endpoints (`/healthz`, `/readyz`,
//! `/metrics`, the OpenAPI document) do not; unknown routes and methods answer the common error
//! shape; wrong tokens are limited per client address, and the right one always passes.

use reqwest::{Method, StatusCode};
use serde_json::json;
use tocsin_testkit::TestDb;

use crate::api::{assert_error, read, TestAdmin, ADMIN_TOKEN};

#[tokio::test]
async fn every_api_call_needs_the_admin_token_but_the_open_endpoints_do_not() {
    // Many wrong tokens from one address on purpose: lift the per-address limit here.
    let admin = TestAdmin::start_with(TestDb::new().await, |c| c.auth_failures = 100).await;
    for (token, what) in [
        (None, "no token"),
        (Some("wrong-token-0123456789"), "wrong token"),
        (
            Some(&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]),
            "a prefix of the token",
        ),
    ] {
        for path in [
            "/api/v1/webhooks",
            "/api/v1/deliveries",
            "/api/v1/incidents",
            "/api/v1/tokens",
            "/api/v1/no-such-route",
        ] {
            let mut request = admin.client.get(admin.url(path));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response
                    .headers()
                    .get("www-authenticate")
                    .map(|v| v.to_str().unwrap()),
                Some("Bearer"),
                "{what} {path}"
            );
            let answer = read(response).await;
            assert_error(
                &format!("{what} {path}"),
                &answer,
                StatusCode::UNAUTHORIZED,
                None,
            );
            assert_eq!(answer.1["error"]["code"], "unauthorized");
        }
    }
    let response = admin
        .client
        .post(admin.url("/api/v1/webhooks"))
        .header("authorization", format!("Basic {ADMIN_TOKEN}"))
        .json(&json!({"name": "x", "url": "https://example.com", "events": ["incidents.opened"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(admin.count("webhooks").await, 0);

    let (status, body) = admin.get("/api/v1/webhooks").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for path in ["/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"] {
        let response = admin.client.get(admin.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let (status, body) = admin.get("/api/v1/no-such-route").await;
    assert_error(
        "unknown route",
        &(status, body),
        StatusCode::NOT_FOUND,
        None,
    );
    let answer = admin.send(Method::PUT, "/api/v1/webhooks", None).await;
    assert_error(
        "wrong method",
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        None,
    );
    admin.stop().await;
}

#[tokio::test]
async fn wrong_admin_tokens_are_limited_per_address_but_the_right_one_always_passes() {
    let admin = TestAdmin::start().await;
    let client = reqwest::Client::new();
    let call = |token: &'static str| {
        client
            .get(format!("{}/api/v1/webhooks", admin.base))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..5 {
        assert_eq!(call("wrong-token-wrong-token").await.unwrap().status(), 401);
    }
    // Twelve wrong tokens in all from this address: the sixth on are refused with 429.
    for _ in 5..12 {
        let limited = call("wrong-token-wrong-token").await.unwrap();
        assert_eq!(limited.status(), 429);
        let retry_after: u64 = limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=61).contains(&retry_after), "{retry_after}");
        let body: serde_json::Value = limited.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limited");
    }
    // The right token from the same address is never refused: behind an ingress every admin
    // shares that address, and a guesser must not lock them out.
    assert_eq!(call(ADMIN_TOKEN).await.unwrap().status(), 200);
    // A request without any token is not a guess: 401, not 429.
    let bare = client
        .get(format!("{}/api/v1/webhooks", admin.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 401);
    assert_eq!(call("wrong-token-wrong-token").await.unwrap().status(), 429);
    admin.stop().await;
}
