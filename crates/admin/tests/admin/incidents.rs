//! Incidents through the API: listed, filtered and read; their status changed by the rules, each
//! change emitting its events through the outbox.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{IncidentTitle, Severity};
use tocsin_storage::outbox;
use tocsin_testkit::wait_until;
use uuid::Uuid;

use crate::api::{assert_error, id_of, keys, set, TestAdmin, DEADLINE};

#[tokio::test]
async fn incident_status_changes_follow_the_rules_and_emit_events() {
    let admin = TestAdmin::start().await;
    let mut conn = admin.conn().await;
    let opened = tocsin_testkit::apply_signals(
        &mut conn,
        &[signal("a"), signal("b")],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let id = opened[0].incident.as_ref().unwrap().id;
    let other = opened[1].incident.as_ref().unwrap().id;
    let events_before = admin.count("events").await;

    let (status, list) = admin.get("/api/v1/incidents").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let (status, incident) = admin.get(&format!("/api/v1/incidents/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        keys(&incident),
        set(&[
            "id",
            "dedup_key",
            "title",
            "severity",
            "status",
            "source",
            "description",
            "created_at",
            "updated_at",
            "resolved_at",
            "labels",
            "format"
        ])
    );
    assert_eq!(incident["labels"], json!({}));
    // Its key is in no source's namespace.
    assert_eq!(incident["format"], Value::Null);
    assert_eq!(incident["status"], "triggered");
    assert_eq!(incident["severity"], "SEV2");

    let path = format!("/api/v1/incidents/{id}");
    let (status, body) = admin.patch(&path, &json!({"status": "acknowledged"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "acknowledged");
    assert_eq!(body["events"], json!(["incidents.status_changed"]));
    assert_eq!(admin.count("events").await, events_before + 1);

    let (status, body) = admin.patch(&path, &json!({"status": "acknowledged"})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the same status again is harmless: {body}"
    );
    assert_eq!(body["events"], json!([]));
    assert_eq!(admin.count("events").await, events_before + 1);

    let (status, body) = admin.patch(&path, &json!({"status": "resolved"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["events"],
        json!(["incidents.status_changed", "incidents.resolved"])
    );
    assert!(body["resolved_at"].is_string());
    assert_eq!(admin.count("events").await, events_before + 3);
    wait_until("the relay to publish the events", DEADLINE, || async {
        admin.count("outbox WHERE published_at IS NULL").await == 0
    })
    .await;

    let answer = admin.patch(&path, &json!({"status": "triggered"})).await;
    assert_error("out of resolved", &answer, StatusCode::CONFLICT, None);
    let (status, body) = admin.patch(&path, &json!({"status": "resolved"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events"], json!([]));
    for (what, body) in [
        ("unknown status", json!({"status": "closed"})),
        ("capitalised", json!({"status": "Resolved"})),
        ("wrong type", json!({"status": 3})),
    ] {
        let answer = admin
            .patch(&format!("/api/v1/incidents/{other}"), &body)
            .await;
        assert_error(
            what,
            &answer,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("status"),
        );
    }
    let answer = admin
        .patch(
            &format!("/api/v1/incidents/{other}"),
            &json!({"status": "mitigated", "note": "x"}),
        )
        .await;
    assert_error(
        "unknown field",
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
    );
    assert_eq!(admin.count("events").await, events_before + 3);
    for path in [
        format!("/api/v1/incidents/{}", Uuid::now_v7()),
        "/api/v1/incidents/zzz".to_owned(),
    ] {
        let answer = admin.patch(&path, &json!({"status": "mitigated"})).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
        let answer = admin.get(&path).await;
        assert_error(&path, &answer, StatusCode::NOT_FOUND, None);
    }

    let ids = |page: &Value| -> Vec<Uuid> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect()
    };
    let (_, resolved) = admin.get("/api/v1/incidents?status=resolved").await;
    assert_eq!(ids(&resolved), [id]);
    let (_, triggered) = admin
        .get("/api/v1/incidents?status=triggered&severity=SEV2")
        .await;
    assert_eq!(ids(&triggered), [other]);
    let (_, none) = admin.get("/api/v1/incidents?severity=SEV1").await;
    assert_eq!(none["items"], json!([]));
    let (_, page) = admin.get("/api/v1/incidents?limit=1").await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, page) = admin
        .get(&format!("/api/v1/incidents?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    for (query, parameter) in [("status=closed", "status"), ("severity=SEV9", "severity")] {
        let answer = admin.get(&format!("/api/v1/incidents?{query}")).await;
        assert_error(query, &answer, StatusCode::BAD_REQUEST, Some(parameter));
    }
    admin.stop().await;
}

fn signal(key: &str) -> AlertSignal {
    AlertSignal {
        dedup_key: key.to_owned(),
        action: AlertAction::Trigger,
        title: IncidentTitle::parse("p99 latency above 2s").unwrap(),
        severity: Severity::SEV2,
        description: None,
        source: Some("test".into()),
        reply_key: None,
        labels: Default::default(),
    }
}
