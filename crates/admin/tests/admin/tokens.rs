//! Inbound tokens through the API: issued, listed without their secrets, revoked; bound to a
//! source, and opted in to other credentials.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tocsin_domain::AccessToken;
use tocsin_storage::tokens;
use uuid::Uuid;

use crate::api::{assert_error, id_of, keys, set, TestAdmin};

#[tokio::test]
async fn inbound_tokens_are_issued_listed_and_revoked() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post("/api/v1/tokens", &json!({"name": "alertmanager-prod"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for field in ["id", "name", "prefix", "created_at", "token"] {
        assert!(!created[field].is_null(), "{field}: {created}");
    }
    let token = created["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with(&format!("tsn_{}_", created["prefix"].as_str().unwrap())));
    let id = id_of(&created);
    let presented = AccessToken::from_presented(&token).expect("well-formed");
    let mut conn = admin.conn().await;
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        Some(id)
    );

    let (status, list) = admin.get("/api/v1/tokens").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let listed = &list["items"][0];
    assert_eq!(
        keys(listed),
        set(&[
            "id",
            "name",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
            "source",
            "basic_auth",
            "query_token",
            "signed",
            "sns_signature"
        ])
    );
    assert_eq!(
        (
            &listed["source"],
            &listed["basic_auth"],
            &listed["query_token"],
            &listed["signed"],
            &listed["sns_signature"]
        ),
        (
            &Value::Null,
            &json!(false),
            &json!(false),
            &json!(false),
            &json!(false)
        ),
        "a token is bound to no source and takes the bearer header only, by default"
    );
    assert!(
        !list.to_string().contains(&token[17..]),
        "no secrets listed"
    );
    assert!(listed["last_used_at"].is_string(), "the use was noted");

    let (status, body) = admin.delete(&format!("/api/v1/tokens/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(
        tokens::authenticate(&mut conn, &presented).await.unwrap(),
        None
    );
    let (_, list) = admin.get("/api/v1/tokens").await;
    assert!(list["items"][0]["revoked_at"].is_string());
    for path in [
        format!("/api/v1/tokens/{id}"),
        format!("/api/v1/tokens/{}", Uuid::now_v7()),
        "/api/v1/tokens/abc".to_owned(),
    ] {
        let answer = admin.delete(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }

    for (what, body, field) in [
        ("empty name", json!({"name": ""}), Some("name")),
        (
            "name too long",
            json!({"name": "t".repeat(101)}),
            Some("name"),
        ),
        (
            "name of the wrong type",
            json!({"name": false}),
            Some("name"),
        ),
        ("unknown field", json!({"name": "x", "scope": "all"}), None),
        ("missing name", json!({}), None),
    ] {
        let answer = admin.post("/api/v1/tokens", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, field);
    }
    assert_eq!(admin.count("inbound_tokens").await, 1);
    admin.stop().await;
}

#[tokio::test]
async fn a_token_binds_a_source_and_opts_in_to_other_credentials() {
    let admin = TestAdmin::start().await;
    let (status, created) = admin
        .post(
            "/api/v1/tokens",
            &json!({"name": "sentry", "source": "sentry", "basic_auth": true,
                    "signing_secret": "sentry-client-secret"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["source"], "sentry");
    assert_eq!(created["basic_auth"], true);
    assert_eq!(created["query_token"], false);
    assert_eq!(created["signed"], true);
    assert_eq!(created["sns_signature"], false);
    assert!(!created.to_string().contains("sentry-client-secret"));
    let (status, created) = admin
        .post(
            "/api/v1/tokens",
            &json!({"name": "sns", "source": "cloudwatch", "basic_auth": true,
                    "sns_signature": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (&created["signed"], &created["sns_signature"]),
        (&json!(true), &json!(true))
    );
    let (status, created) = admin
        .post(
            "/api/v1/tokens",
            &json!({"name": "azure", "source": "azure", "query_token": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, list) = admin.get("/api/v1/tokens").await;
    assert!(!list.to_string().contains("sentry-client-secret"));
    let sources: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["source"])
        .collect();
    assert_eq!(
        sources,
        [&json!("azure"), &json!("cloudwatch"), &json!("sentry")]
    );
    let presented = AccessToken::from_presented(created["token"].as_str().unwrap()).unwrap();
    let mut conn = admin.conn().await;
    let live = tokens::authenticate_all(&mut conn, &[presented])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(live.source, Some(tocsin_domain::alerts::AlertFormat::Azure));
    assert!(live.query_token && !live.basic_auth);

    for (what, body, field) in [
        (
            "unknown source",
            json!({"name": "x", "source": "nagios"}),
            Some("source"),
        ),
        (
            "source of the wrong type",
            json!({"name": "x", "source": 1}),
            Some("source"),
        ),
        (
            "a secret without sentry",
            json!({"name": "x", "source": "cloudwatch", "signing_secret": "s"}),
            Some("signing_secret"),
        ),
        (
            "a secret without a source",
            json!({"name": "x", "signing_secret": "s"}),
            Some("signing_secret"),
        ),
        (
            "an empty secret",
            json!({"name": "x", "source": "sentry", "signing_secret": " "}),
            Some("signing_secret"),
        ),
        (
            "SNS's signature without cloudwatch",
            json!({"name": "x", "source": "sentry", "sns_signature": true}),
            Some("sns_signature"),
        ),
        (
            "SNS's signature without a source",
            json!({"name": "x", "sns_signature": true}),
            Some("sns_signature"),
        ),
        (
            "sns_signature not a boolean",
            json!({"name": "x", "source": "cloudwatch", "sns_signature": "yes"}),
            Some("sns_signature"),
        ),
        (
            "basic_auth not a boolean",
            json!({"name": "x", "basic_auth": "yes"}),
            Some("basic_auth"),
        ),
    ] {
        let answer = admin.post("/api/v1/tokens", &body).await;
        assert_error(what, &answer, StatusCode::UNPROCESSABLE_ENTITY, field);
    }
    assert_eq!(admin.count("inbound_tokens").await, 3);
    admin.stop().await;
}
