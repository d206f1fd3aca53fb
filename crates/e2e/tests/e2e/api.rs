//! End to end through the public interfaces only: a webhook created through the admin API, an
//! alert posted to ingest, the delivery and its attempts read back from the delivery log, a
//! failing target, and a manual retry.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tocsin_e2e::System;
use tocsin_testkit::{wait_for, Behavior, Receiver, FAST_RETRY_DELAYS};

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn an_alert_reaches_the_target_and_the_log_tells_the_whole_story() {
    let system = System::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start().await;
    receiver.set_path_behavior("/fail", Behavior::Status(500));

    let (status, webhook) = system
        .api(
            Method::POST,
            "/api/v1/webhooks",
            Some(json!({"name": "ops", "url": receiver.url("/ok"), "events": ["incidents.opened", "incidents.resolved"]})),
        )
        .await;
    assert_eq!(status, 201, "{webhook}");
    let webhook_id = webhook["id"].as_str().unwrap().to_owned();
    assert!(webhook["secret"].as_str().unwrap().starts_with("whsec_"));

    let (status, accepted) = system
        .alert(
            &json!({"title": "Checkout latency", "dedup_key": "checkout", "severity": "critical"}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let incident_id = accepted["incidents"][0]["id"].as_str().unwrap().to_owned();

    // The delivery and its attempt, through the API.
    let delivery = wait_for("a succeeded delivery in the log", DEADLINE, || async {
        system
            .deliveries_of(&webhook_id)
            .await
            .into_iter()
            .find(|d| d["state"] == "succeeded")
    })
    .await;
    assert_eq!(delivery["event"], "incidents.opened");
    assert_eq!(delivery["incident_id"], incident_id.as_str());
    let (status, detail) = system
        .api(
            Method::GET,
            &format!("/api/v1/deliveries/{}", delivery["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let attempt = &detail["attempts"][0];
    assert_eq!(attempt["number"], 1);
    assert_eq!(attempt["success"], true);
    assert_eq!(attempt["status_code"], 200);
    assert_eq!(attempt["response_body"], "answer 200");
    let sent: Value = serde_json::from_str(attempt["request_body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["event"], "incidents.opened");
    assert_eq!(sent["data"]["id"], incident_id.as_str());
    assert!(attempt["started_at"].is_string());
    assert_eq!(receiver.count(), 1);

    // The target starts failing: attempts accumulate until the delivery is failed.
    let (status, _) = system
        .api(
            Method::PATCH,
            &format!("/api/v1/webhooks/{webhook_id}"),
            Some(json!({"url": receiver.url("/fail")})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = system
        .alert(&json!({"title": "Checkout latency", "dedup_key": "checkout", "status": "resolved"}))
        .await;
    assert_eq!(status, 202);
    let failed = wait_for("a failed delivery", DEADLINE, || async {
        system
            .deliveries_of(&webhook_id)
            .await
            .into_iter()
            .find(|d| d["state"] == "failed")
    })
    .await;
    assert_eq!(failed["event"], "incidents.resolved");
    assert_eq!(failed["attempt_count"], 5);
    let failed_id = failed["id"].as_str().unwrap().to_owned();
    let (_, detail) = system
        .api(
            Method::GET,
            &format!("/api/v1/deliveries/{failed_id}"),
            None,
        )
        .await;
    let attempts = detail["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 5);
    assert!(attempts
        .iter()
        .all(|a| a["status_code"] == 500 && a["success"] == false));

    // The target recovers; a manual retry from the log succeeds.
    receiver.set_path_behavior("/fail", Behavior::Status(200));
    let (status, body) = system
        .api(
            Method::POST,
            &format!("/api/v1/deliveries/{failed_id}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let detail = wait_for("the manual attempt", DEADLINE, || async {
        let (_, detail) = system
            .api(
                Method::GET,
                &format!("/api/v1/deliveries/{failed_id}"),
                None,
            )
            .await;
        (detail["state"] == "succeeded").then_some(detail)
    })
    .await;
    let sixth = &detail["attempts"][5];
    assert_eq!(sixth["number"], 6);
    assert_eq!(sixth["trigger"], "manual");
    assert_eq!(sixth["success"], true);
    system.stop().await;
}

#[tokio::test]
async fn an_admin_acknowledges_and_resolves_and_subscribers_hear_of_it() {
    let system = System::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start().await;
    let (status, _) = system
        .api(
            Method::POST,
            "/api/v1/webhooks",
            Some(json!({"name": "all", "url": receiver.url("/all"), "events": ["incidents.opened", "incidents.status_changed", "incidents.resolved"]})),
        )
        .await;
    assert_eq!(status, 201);
    let (_, accepted) = system
        .alert(&json!({"title": "Queue stuck", "dedup_key": "queue"}))
        .await;
    let id = accepted["incidents"][0]["id"].as_str().unwrap().to_owned();
    for status in ["acknowledged", "resolved"] {
        let (code, body) = system
            .api(
                Method::PATCH,
                &format!("/api/v1/incidents/{id}"),
                Some(json!({"status": status})),
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let requests = receiver.wait_for_requests(4, DEADLINE).await;
    let mut seen: Vec<(String, String)> = requests
        .iter()
        .map(|r| {
            let body = r.json();
            (
                body["event"].as_str().unwrap().to_owned(),
                body["data"]["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("incidents.opened".to_owned(), "triggered".to_owned()),
            ("incidents.resolved".to_owned(), "resolved".to_owned()),
            (
                "incidents.status_changed".to_owned(),
                "acknowledged".to_owned()
            ),
            ("incidents.status_changed".to_owned(), "resolved".to_owned()),
        ]
    );
    system.stop().await;
}

#[tokio::test]
async fn a_response_body_is_kept_up_to_the_cap_and_marked_when_truncated() {
    const CAP: usize = 1024;
    let system = System::start_with(FAST_RETRY_DELAYS, |dispatcher| {
        dispatcher.response_body_limit = CAP;
    })
    .await;
    let receiver = Receiver::start().await;
    for (path, size) in [("/exact", CAP), ("/over", CAP + 1), ("/huge", 1024 * 1024)] {
        receiver.set_path_behavior(path, Behavior::Body(200, size));
    }
    let mut webhooks = Vec::new();
    for path in ["/exact", "/over", "/huge"] {
        let (status, webhook) = system
            .api(
                Method::POST,
                "/api/v1/webhooks",
                Some(json!({"name": path, "url": receiver.url(path), "events": ["incidents.opened"]})),
            )
            .await;
        assert_eq!(status, 201, "{webhook}");
        webhooks.push((path, webhook["id"].as_str().unwrap().to_owned()));
    }
    let (status, _) = system
        .alert(&json!({"title": "Big answers", "dedup_key": "big"}))
        .await;
    assert_eq!(status, 202);
    for (path, webhook) in &webhooks {
        let delivery = wait_for("a succeeded delivery", DEADLINE, || async {
            system
                .deliveries_of(webhook)
                .await
                .into_iter()
                .find(|d| d["state"] == "succeeded")
        })
        .await;
        let (status, detail) = system
            .api(
                Method::GET,
                &format!("/api/v1/deliveries/{}", delivery["id"].as_str().unwrap()),
                None,
            )
            .await;
        assert_eq!(status, 200, "{detail}");
        let attempt = &detail["attempts"][0];
        let kept = attempt["response_body"].as_str().unwrap();
        assert_eq!(kept.len(), CAP, "{path}: the body is kept up to the cap");
        assert!(kept.bytes().all(|b| b == b'x'), "{path}");
        assert_eq!(
            attempt["response_truncated"],
            *path != "/exact",
            "{path}: marked truncated only when the target sent more"
        );
    }
    system.stop().await;
}
