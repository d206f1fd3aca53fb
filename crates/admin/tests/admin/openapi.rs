//! The OpenAPI document: every route of the contract, with its security and answers, and the
//! schemas clients generate their types from.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::api::TestAdmin;

#[tokio::test]
async fn the_openapi_document_describes_the_whole_contract() {
    let admin = TestAdmin::start().await;
    let response = admin
        .client
        .get(admin.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let document: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let contract = [
        ("/api/v1/webhooks", vec!["get", "post"]),
        ("/api/v1/webhooks/{id}", vec!["get", "patch", "delete"]),
        ("/api/v1/webhooks/{id}/reveal-secret", vec!["post"]),
        ("/api/v1/webhooks/{id}/rotate-secret", vec!["post"]),
        ("/api/v1/webhooks/{id}/test", vec!["post"]),
        ("/api/v1/webhooks/{id}/recover", vec!["post"]),
        ("/api/v1/deliveries", vec!["get"]),
        ("/api/v1/deliveries/{id}", vec!["get"]),
        ("/api/v1/deliveries/{id}/retry", vec!["post"]),
        ("/api/v1/incidents", vec!["get"]),
        ("/api/v1/incidents/{id}", vec!["get", "patch"]),
        ("/api/v1/tokens", vec!["get", "post"]),
        ("/api/v1/tokens/{id}", vec!["delete"]),
    ];
    let paths = &document["paths"];
    for (path, methods) in &contract {
        for method in methods {
            let operation = &paths[path][method];
            assert!(operation.is_object(), "{method} {path} is documented");
            assert_eq!(
                operation["security"],
                json!([{"admin_token": []}]),
                "{method} {path} needs the admin token"
            );
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("401"), "{method} {path}");
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}"
            );
        }
    }
    assert!(
        paths["/api/v1/webhooks/alerts"]["post"].is_object(),
        "ingest"
    );
    assert!(paths["/api/v1/openapi.json"]["get"].is_object());
    assert!(paths["/api/v1/openapi.json"]["get"]["security"].is_null());
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(schemes["admin_token"]["type"], "http");
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    assert_eq!(schemes["inbound_token"]["scheme"], "bearer");
    let schemas = &document["components"]["schemas"];
    for name in [
        "Webhook",
        "WebhookWithSecret",
        "NewWebhook",
        "WebhookChange",
        "Delivery",
        "DeliveryDetail",
        "Attempt",
        "Incident",
        "TokenCreated",
        "ErrorBody",
        "EventKind",
    ] {
        assert!(schemas[name].is_object(), "schema {name}");
    }
    assert_eq!(
        schemas["EventKind"]["enum"],
        json!([
            "incidents.opened",
            "incidents.status_changed",
            "incidents.resolved"
        ])
    );
    let create = &paths["/api/v1/webhooks"]["post"];
    assert!(create["responses"]["422"].is_object());
    assert!(create["requestBody"].is_object());
    admin.stop().await;
}
