//! What users of webhook services ask for most, from outside through the API: subscription
//! filters and custom headers on what a webhook receives, a failing webhook's health, its
//! automatic disabling with a reason, the events that came meanwhile listed and recovered
//! once it is enabled again, and a rate limit that makes deliveries wait, none dropped.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_e2e::System;
use tocsin_testkit::{wait_for, wait_until, Behavior, Receiver, FAST_RETRY_DELAYS};

const DEADLINE: Duration = Duration::from_secs(30);

async fn create(system: &System, body: Value) -> String {
    let (status, created) = system
        .api(Method::POST, "/api/v1/webhooks", Some(body))
        .await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

async fn read(system: &System, id: &str) -> Value {
    let (status, webhook) = system
        .api(Method::GET, &format!("/api/v1/webhooks/{id}"), None)
        .await;
    assert_eq!(status, 200, "{webhook}");
    webhook
}

/// Sends an alert; returns the id of the incident it touched.
async fn alert(system: &System, key: &str, severity: &str) -> String {
    let (status, body) = system
        .alert(
            &json!({"title": format!("alert {key}"), "dedup_key": key, "severity": severity,
                       "labels": {"team": "db"}}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["incidents"][0]["id"].as_str().unwrap().to_owned()
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A header value that no id, signature or timestamp in the delivery log can hold by chance
/// (its letters are not hex digits, and base64 has no hyphen), so that finding it there means
/// it was not masked. A short one ("k1") turned up inside a random signature.
const TEAM_KEY: &str = "team-key-value-1";

#[tokio::test]
async fn a_filtered_webhook_gets_only_matching_events_with_its_headers() {
    let system = System::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start().await;
    let pager = create(
        &system,
        json!({"name": "SEV1 pager", "url": receiver.url("/sev1"), "events": ["incidents.opened"],
               "filters": {"severities": ["SEV1"]}, "headers": {"X-Team-Key": TEAM_KEY}}),
    )
    .await;
    let by_label = create(
        &system,
        json!({"name": "db team", "url": receiver.url("/db"), "events": ["incidents.opened"],
               "filters": {"labels": {"team": "db"}, "sources": ["generic"]}}),
    )
    .await;

    alert(&system, "sev4", "SEV4").await;
    alert(&system, "sev1", "SEV1").await;
    let got = receiver.wait_for_requests(3, DEADLINE).await;
    let to_pager: Vec<_> = got.iter().filter(|r| r.path == "/sev1").collect();
    assert_eq!(to_pager.len(), 1, "only the SEV1 alert's event");
    let event: Value = serde_json::from_slice(&to_pager[0].body).unwrap();
    assert_eq!(event["data"]["severity"], "SEV1");
    assert_eq!(to_pager[0].header("x-team-key"), Some(TEAM_KEY));
    assert_eq!(got.iter().filter(|r| r.path == "/db").count(), 2);
    assert!(got
        .iter()
        .filter(|r| r.path == "/db")
        .all(|r| r.header("x-team-key").is_none()));

    // Nothing more comes for the SEV4 alert; its event made no delivery to the pager.
    wait_until("every delivery succeeded", DEADLINE, || async {
        let pager = system.deliveries_of(&pager).await;
        let db = system.deliveries_of(&by_label).await;
        pager.len() == 1
            && db.len() == 2
            && pager.iter().chain(&db).all(|d| d["state"] == "succeeded")
    })
    .await;
    assert_eq!(receiver.count(), 3);
    let incident = event["data"]["id"].as_str().unwrap();
    let (_, opened) = system
        .api(Method::GET, &format!("/api/v1/incidents/{incident}"), None)
        .await;
    assert_eq!(opened["labels"], json!({"team": "db"}), "{opened}");

    // The header's value is masked in reads and in the delivery log.
    let webhook = read(&system, &pager).await;
    assert_eq!(webhook["headers"], json!({"x-team-key": "***"}));
    assert_eq!(webhook["filters"], json!({"severities": ["SEV1"]}));
    let delivery = system.deliveries_of(&pager).await.remove(0);
    let (_, detail) = system
        .api(
            Method::GET,
            &format!("/api/v1/deliveries/{}", delivery["id"].as_str().unwrap()),
            None,
        )
        .await;
    let headers = &detail["attempts"][0]["request_headers"];
    assert_eq!(headers["x-team-key"], "***", "{headers}");
    assert!(!detail.to_string().contains(TEAM_KEY), "{detail}");
    // Written back as read, the masked value keeps the stored one.
    let (status, _) = system
        .api(
            Method::PATCH,
            &format!("/api/v1/webhooks/{pager}"),
            Some(json!({"headers": webhook["headers"].clone()})),
        )
        .await;
    assert_eq!(status, 200);
    alert(&system, "sev1-again", "SEV1").await;
    let again = wait_for("the second SEV1 event", DEADLINE, || async {
        receiver
            .requests()
            .into_iter()
            .filter(|r| r.path == "/sev1")
            .nth(1)
    })
    .await;
    assert_eq!(again.header("x-team-key"), Some(TEAM_KEY));
    system.stop().await;
}

#[tokio::test]
async fn a_failing_webhook_shows_its_health_is_disabled_automatically_and_recovers() {
    let started = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let system = System::start_with(FAST_RETRY_DELAYS, |dispatcher| {
        dispatcher.auto_disable_after = Duration::from_secs(2);
        dispatcher.sweep_interval = Duration::from_millis(200);
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.set_path_behavior("/down", Behavior::Status(500));
    let id = create(
        &system,
        json!({"name": "down", "url": receiver.url("/down"), "events": ["incidents.opened"],
               "retry": {"max_attempts": 1}}),
    )
    .await;

    alert(&system, "first", "SEV2").await;
    let failing = wait_for("a failure in the webhook's health", DEADLINE, || async {
        let webhook = read(&system, &id).await;
        (webhook["health"]["consecutive_failures"].as_i64() >= Some(1)).then_some(webhook)
    })
    .await;
    let health = &failing["health"];
    assert_eq!(
        health["last_error"], "http_status: the target answered 500",
        "{health}"
    );
    assert!(health["last_failure_at"].is_string());
    assert_eq!(health["last_success_at"], Value::Null);
    assert_eq!(health["success_rate_1h"], 0.0);
    assert_eq!(failing["enabled"], true);

    // It keeps failing for longer than the (shortened) auto-disable period.
    let mut n = 0;
    let disabled = wait_for("the webhook disabled automatically", DEADLINE, || {
        n += 1;
        let key = format!("more-{n}");
        let system = &system;
        let id = id.clone();
        async move {
            let webhook = read(system, &id).await;
            if webhook["enabled"] == false {
                return Some(webhook);
            }
            alert(system, &key, "SEV2").await;
            None
        }
    })
    .await;
    let reason = disabled["disabled_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("disabled automatically: failing without a success since "),
        "{reason}"
    );
    assert!(disabled["disabled_at"].is_string());
    let metrics = system.metrics(&system.dispatcher).await;
    assert!(
        metrics.contains("tocsin_dispatcher_auto_disabled_total 1")
            && metrics.contains("tocsin_webhooks_auto_disabled_total 1"),
        "{metrics}"
    );
    wait_until("the health gauge of the webhook", DEADLINE, || async {
        system
            .metrics(&system.dispatcher)
            .await
            .contains(&format!("tocsin_webhook_enabled{{webhook_id=\"{id}\"}} 0"))
    })
    .await;

    // An event while it is disabled: listed, waiting, nothing sent.
    let sent_before = receiver.count();
    let incident = alert(&system, "while-disabled", "SEV2").await;
    let waiting = wait_for("the delivery listed as waiting", DEADLINE, || async {
        system
            .deliveries_of(&id)
            .await
            .into_iter()
            .find(|d| d["state"] == "waiting" && d["incident_id"] == incident.as_str())
    })
    .await;
    assert_eq!(waiting["wait_reason"], "webhook_disabled");
    assert_eq!(waiting["attempt_count"], 0);
    // The loop's last alert may have come after the disabling too: every waiting one counts.
    let waiting_ids: Vec<String> = system
        .deliveries_of(&id)
        .await
        .into_iter()
        .filter(|d| d["state"] == "waiting")
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();

    // The target is fixed; enabled again and recovered, the waiting event is sent.
    receiver.set_path_behavior("/down", Behavior::Status(200));
    let (status, enabled) = system
        .api(
            Method::PATCH,
            &format!("/api/v1/webhooks/{id}"),
            Some(json!({"enabled": true})),
        )
        .await;
    assert_eq!(status, 200, "{enabled}");
    assert_eq!(enabled["disabled_reason"], Value::Null);
    let (status, recovered) = system
        .api(
            Method::POST,
            &format!("/api/v1/webhooks/{id}/recover"),
            Some(json!({"since": rfc3339(started)})),
        )
        .await;
    assert_eq!(status, 202, "{recovered}");
    assert_eq!(
        recovered["sent_waiting"],
        waiting_ids.len(),
        "{recovered} {waiting_ids:?}"
    );
    wait_until("the waiting deliveries succeeded", DEADLINE, || async {
        let log = system.deliveries_of(&id).await;
        waiting_ids.iter().all(|waiting| {
            log.iter()
                .any(|d| d["id"] == waiting.as_str() && d["state"] == "succeeded")
        })
    })
    .await;
    assert!(receiver.count() > sent_before);
    // Health follows within a second (each dispatcher writes its tallies once a second).
    let healthy = wait_for("the success in the webhook's health", DEADLINE, || async {
        let webhook = read(&system, &id).await;
        (webhook["health"]["consecutive_failures"] == 0).then_some(webhook)
    })
    .await;
    assert!(healthy["health"]["last_success_at"].is_string());
    system.stop().await;
}

#[tokio::test]
async fn a_rate_limited_webhook_makes_deliveries_wait_and_drops_none() {
    let system = System::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start().await;
    let id = create(
        &system,
        json!({"name": "limited", "url": receiver.url("/slow-down"), "events": ["incidents.opened"],
               "rate_limit_per_second": 2}),
    )
    .await;
    assert_eq!(read(&system, &id).await["rate_limit_per_second"], 2);
    for n in 0..8 {
        alert(&system, &format!("burst-{n}"), "SEV3").await;
    }
    let saw_waiting = std::sync::atomic::AtomicBool::new(false);
    wait_until("all eight delivered", DEADLINE, || async {
        let deliveries = system.deliveries_of(&id).await;
        if deliveries
            .iter()
            .any(|d| d["state"] == "waiting" && d["wait_reason"] == "rate_limited")
        {
            saw_waiting.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        deliveries.len() == 8 && deliveries.iter().all(|d| d["state"] == "succeeded")
    })
    .await;
    assert!(
        saw_waiting.load(std::sync::atomic::Ordering::Relaxed),
        "deliveries over the limit wait, visibly"
    );
    assert_eq!(receiver.count(), 8, "none dropped, none twice");
    // The attempts started no faster than the limit allows: two at once, then one each
    // half second, so the eighth at least three seconds after the first (when the attempts
    // were claimed, as the log records them).
    let mut starts = Vec::new();
    for delivery in system.deliveries_of(&id).await {
        let (_, detail) = system
            .api(
                Method::GET,
                &format!("/api/v1/deliveries/{}", delivery["id"].as_str().unwrap()),
                None,
            )
            .await;
        let started = detail["attempts"][0]["started_at"].as_str().unwrap();
        starts.push(
            OffsetDateTime::parse(started, &time::format_description::well_known::Rfc3339).unwrap(),
        );
    }
    starts.sort();
    let span = starts[7] - starts[0];
    assert!(span >= time::Duration::milliseconds(2990), "{starts:?}");
    for (i, start) in starts.iter().enumerate() {
        let within = starts[i..]
            .iter()
            .take_while(|s| **s - *start < time::Duration::SECOND)
            .count();
        assert!(within <= 3, "at most 2 + 1 in any second: {starts:?}");
    }
    system.stop().await;
}
