//! Every alert source end to end, with a token bound to it: each source's fixtures open,
//! acknowledge where the source can, and resolve one incident with the documented title,
//! severity and labels; a repeated notification changes nothing; a bad body of each source
//! answers 422 naming the field. The Opsgenie-style Alert API on its own routes, with
//! `GenieKey` credentials and aliases that hold slashes.

use diesel::sql_types::{BigInt, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use reqwest::StatusCode;
use serde_json::Value;
use tocsin_domain::alerts::AlertFormat;
use tocsin_storage::tokens::{self, NewToken};

use crate::common::{fixture, TestIngest};

/// SNS posts its JSON as text.
const SNS: &str = "text/plain; charset=UTF-8";
const JSON: &str = "application/json";

/// One source's way through an incident: the fixtures in order, each with the incident's
/// status after it (the first is sent twice: the repeat changes nothing).
struct Flow {
    source: AlertFormat,
    content_type: &'static str,
    steps: &'static [(&'static str, &'static str)],
    title: &'static str,
    severity: &'static str,
    incident_source: Option<&'static str>,
    label: (&'static str, &'static str),
}

const FLOWS: &[Flow] = &[
    Flow {
        source: AlertFormat::CloudWatch,
        content_type: SNS,
        steps: &[
            ("cloudwatch-sns-alarm.json", "triggered"),
            ("cloudwatch-sns-ok.json", "resolved"),
        ],
        title: "checkout-api-5xx-rate",
        severity: "SEV1",
        incident_source: Some("AWS/ApplicationELB LoadBalancer=app/checkout-prod/50dc6c495c0c9188, TargetGroup=targetgroup/checkout-api/73e2d6bc24d8a067"),
        label: ("namespace", "AWS/ApplicationELB"),
    },
    Flow {
        source: AlertFormat::Azure,
        content_type: JSON,
        steps: &[
            ("azure-fired.json", "triggered"),
            ("azure-resolved.json", "resolved"),
        ],
        title: "checkout-vm-cpu-high (checkout-vm-1)",
        severity: "SEV2",
        incident_source: Some("checkout-vm-1"),
        label: ("team", "checkout"),
    },
    Flow {
        source: AlertFormat::Google,
        content_type: JSON,
        steps: &[
            ("google-open.json", "triggered"),
            ("google-closed.json", "resolved"),
        ],
        title: "Checkout DB CPU above 90%",
        severity: "SEV1",
        incident_source: Some("checkout-db-1"),
        label: ("team", "checkout"),
    },
    Flow {
        source: AlertFormat::Sentry,
        content_type: JSON,
        steps: &[
            ("sentry-issue-alert.json", "triggered"),
            ("sentry-issue-assigned.json", "acknowledged"),
            ("sentry-issue-resolved.json", "resolved"),
        ],
        title: "ReferenceError: heck is not defined",
        severity: "SEV2",
        incident_source: Some("https://sentry.io/organizations/example-org/issues/1117540176/events/e4874d664c3540c1a32eab185f12c5ab/"),
        label: ("environment", "production"),
    },
    Flow {
        source: AlertFormat::Sentry,
        content_type: JSON,
        steps: &[
            ("sentry-metric-alert-critical.json", "triggered"),
            ("sentry-metric-alert-resolved.json", "resolved"),
        ],
        title: "Too many checkout errors",
        severity: "SEV1",
        incident_source: Some("https://sentry.io/organizations/example-org/alerts/1/"),
        label: ("rule", "Too many checkout errors"),
    },
    Flow {
        source: AlertFormat::Datadog,
        content_type: JSON,
        steps: &[
            ("datadog-triggered.json", "triggered"),
            ("datadog-recovered.json", "resolved"),
        ],
        title: "Checkout API p95 latency above 2s on service:checkout-api",
        severity: "SEV2",
        incident_source: Some("checkout-api-7d9f"),
        label: ("team", "checkout"),
    },
    Flow {
        source: AlertFormat::NewRelic,
        content_type: JSON,
        steps: &[
            ("newrelic-activated.json", "triggered"),
            ("newrelic-acknowledged.json", "acknowledged"),
            ("newrelic-closed.json", "resolved"),
        ],
        title: "checkout-api query result is > 5.0 for 5 minutes on 'Checkout API error rate'",
        severity: "SEV1",
        incident_source: Some("checkout-api"),
        label: ("policy", "Checkout golden signals"),
    },
    Flow {
        source: AlertFormat::Kibana,
        content_type: JSON,
        steps: &[
            ("kibana-active.json", "triggered"),
            ("kibana-recovered.json", "resolved"),
        ],
        title: "Checkout error logs",
        severity: "SEV2",
        incident_source: Some("https://kibana.example.com/app/management/insightsAndAlerting/triggersActions/rule/6b8e7d10-4f2a-11ef-9c3b-2b7e5d1a0c44"),
        label: ("team", "checkout"),
    },
    Flow {
        source: AlertFormat::Zabbix,
        content_type: JSON,
        steps: &[
            ("zabbix-problem.json", "triggered"),
            ("zabbix-acknowledged.json", "acknowledged"),
            ("zabbix-resolved.json", "resolved"),
        ],
        title: "High CPU utilization (over 90% for 5m)",
        severity: "SEV2",
        incident_source: Some("checkout-db-2"),
        label: ("team", "checkout"),
    },
    Flow {
        source: AlertFormat::UptimeKuma,
        content_type: JSON,
        steps: &[
            ("uptimekuma-down.json", "triggered"),
            ("uptimekuma-up.json", "resolved"),
        ],
        title: "Checkout storefront is down",
        severity: "SEV1",
        incident_source: Some("https://shop.example.com/health"),
        label: ("team", "checkout"),
    },
];

#[derive(QueryableByName, Debug)]
struct IncidentRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    dedup_key: String,
    #[diesel(sql_type = Text)]
    title: String,
    #[diesel(sql_type = Text)]
    severity: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    source: Option<String>,
    #[diesel(sql_type = Jsonb)]
    labels: Value,
    #[diesel(sql_type = BigInt)]
    events: i64,
}

impl TestIngest {
    /// A token bound to `source`.
    async fn token_for(&self, source: AlertFormat) -> String {
        let mut conn = self.conn().await;
        let new = NewToken {
            source: Some(source),
            ..NewToken::named(source.as_str())
        };
        let (_, token) = tokens::issue(&mut conn, &new).await.unwrap();
        token.expose().to_owned()
    }

    /// The incidents whose dedup key is in `source`'s namespace, with their events.
    async fn incidents_of(&self, source: AlertFormat) -> Vec<IncidentRow> {
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT i.id::text AS id, i.dedup_key, i.title, i.severity, i.status, i.source, \
                    i.labels, (SELECT count(*) FROM events e \
                               WHERE (e.body::jsonb -> 'data' ->> 'id') = i.id::text) AS events \
             FROM incidents i WHERE i.dedup_key LIKE $1 ORDER BY i.created_at",
        )
        .bind::<Text, _>(format!("{}:%", source.as_str()))
        .load(&mut conn)
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn every_source_opens_acknowledges_and_resolves_one_incident() {
    let ingest = TestIngest::start().await;
    let mut seen_sentry = 0;
    for flow in FLOWS {
        let name = flow.source.as_str();
        let token = ingest.token_for(flow.source).await;
        let (first, _) = flow.steps[0];
        let mut steps: Vec<(&str, &str)> = vec![flow.steps[0], (first, "triggered")];
        steps.extend_from_slice(&flow.steps[1..]);
        for (i, (file, status)) in steps.iter().enumerate() {
            let (code, answer) = ingest
                .post_with(&fixture(file), Some(&token), flow.content_type, "")
                .await;
            assert_eq!(code, StatusCode::ACCEPTED, "{name} {file}: {answer}");
            assert_eq!(answer["format"], name, "{name} {file}");
            let incident = &answer["incidents"][0];
            assert_eq!(incident["status"], *status, "{name} {file}: {answer}");
            let expected_change = match i {
                0 => "opened",
                1 => "unchanged",
                _ => "status_changed",
            };
            assert_eq!(
                incident["change"], expected_change,
                "{name} {file}: {answer}"
            );
        }
        let incidents = ingest.incidents_of(flow.source).await;
        if flow.source == AlertFormat::Sentry {
            seen_sentry += 1;
            assert_eq!(incidents.len(), seen_sentry, "{name}: {incidents:?}");
        } else {
            assert_eq!(incidents.len(), 1, "{name}: {incidents:?}");
        }
        let incident = incidents.last().unwrap();
        assert!(incident.dedup_key.starts_with(&format!("{name}:")));
        assert_eq!(incident.title, flow.title, "{name}");
        assert_eq!(incident.severity, flow.severity, "{name}");
        assert_eq!(incident.status, "resolved", "{name}");
        assert_eq!(incident.source.as_deref(), flow.incident_source, "{name}");
        assert_eq!(
            incident.labels[flow.label.0], flow.label.1,
            "{name}: {incident:?}"
        );
        // opened, then status_changed for each change and resolved with the last.
        let changes = i64::try_from(flow.steps.len()).unwrap() - 1;
        assert_eq!(incident.events, 1 + changes + 1, "{name}: {incident:?}");
        assert!(!incident.id.is_empty());
    }
    ingest.stop().await;
}

#[tokio::test]
async fn a_bad_body_of_each_source_is_refused_naming_the_field() {
    let ingest = TestIngest::start().await;
    // (source, fixture, parent of the removed field as a JSON pointer, its name, the field named)
    let cases = [
        (
            AlertFormat::CloudWatch,
            "cloudwatch-sns-alarm.json",
            "",
            "TopicArn",
            "TopicArn",
        ),
        (
            AlertFormat::Azure,
            "azure-fired.json",
            "/data/essentials",
            "alertId",
            "data.essentials.alertId",
        ),
        (
            AlertFormat::Google,
            "google-open.json",
            "/incident",
            "incident_id",
            "incident.incident_id",
        ),
        (
            AlertFormat::Sentry,
            "sentry-issue-alert.json",
            "/data/event",
            "issue_id",
            "data.event.issue_id",
        ),
        (
            AlertFormat::Datadog,
            "datadog-triggered.json",
            "",
            "aggreg_key",
            "aggreg_key",
        ),
        (
            AlertFormat::NewRelic,
            "newrelic-activated.json",
            "",
            "state",
            "state",
        ),
        (
            AlertFormat::Kibana,
            "kibana-active.json",
            "",
            "rule_id",
            "rule_id",
        ),
        (
            AlertFormat::Zabbix,
            "zabbix-problem.json",
            "",
            "event_id",
            "event_id",
        ),
        (
            AlertFormat::UptimeKuma,
            "uptimekuma-down.json",
            "/monitor",
            "id",
            "monitor.id",
        ),
        (
            AlertFormat::Opsgenie,
            "opsgenie-create.json",
            "",
            "message",
            "message",
        ),
    ];
    for (source, file, parent, field, named) in cases {
        let token = ingest.token_for(source).await;
        let mut body: Value = serde_json::from_str(&fixture(file)).unwrap();
        body.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap()
            .remove(field);
        let (status, answer) = ingest
            .post_with(&body.to_string(), Some(&token), JSON, "")
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{source}: {answer}"
        );
        assert_eq!(answer["error"]["code"], "invalid", "{source}: {answer}");
        assert_eq!(answer["error"]["field"], named, "{source}: {answer}");
        // Not JSON at all: 400, as for every format.
        let (status, _) = ingest.post_with("{", Some(&token), JSON, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{source}");
    }
    assert_eq!(ingest.count("incidents").await, 0);
    ingest.stop().await;
}

#[tokio::test]
async fn a_bound_token_reads_its_source_and_refuses_another_format() {
    let ingest = TestIngest::start().await;
    let token = ingest.token_for(AlertFormat::Datadog).await;
    // Detection would call this body generic (and refuse it for lack of a title).
    let body = fixture("datadog-triggered.json");
    let (status, answer) = ingest.post_with(&body, Some(&ingest.token), JSON, "").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (status, answer) = ingest
        .post_with(&body, Some(&ingest.token), JSON, "?format=datadog")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let (status, answer) = ingest
        .post_with(&body, Some(&token), JSON, "?format=datadog")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["change"], "unchanged");
    let (status, answer) = ingest
        .post_with(&body, Some(&token), JSON, "?format=generic")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "format");
    // The existing formats are still detected for an unbound token.
    let (status, answer) = ingest
        .post_with(
            &fixture("alertmanager-0.25-firing.json"),
            Some(&ingest.token),
            JSON,
            "",
        )
        .await;
    assert_eq!(
        (status, &answer["format"]),
        (StatusCode::ACCEPTED, &Value::from("alertmanager"))
    );
    ingest.stop().await;
}

/// Posts `body` to an Opsgenie-style route with `Authorization: GenieKey <token>`.
async fn opsgenie(ingest: &TestIngest, path: &str, token: &str, body: &str) -> (StatusCode, Value) {
    let response = ingest
        .client
        .post(format!(
            "{}/api/v1/webhooks/alerts/opsgenie/v2/alerts{path}",
            ingest.base
        ))
        .header("authorization", format!("GenieKey {token}"))
        .header("content-type", JSON)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn opsgenie_style_senders_create_acknowledge_and_close_by_alias() {
    let ingest = TestIngest::start().await;
    let token = ingest.token.clone();
    let create = fixture("opsgenie-create.json");
    let (status, answer) = opsgenie(&ingest, "", &token, &create).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["format"], "opsgenie");
    assert_eq!(answer["incidents"][0]["change"], "opened");
    let (_, answer) = opsgenie(&ingest, "", &token, &create).await;
    assert_eq!(answer["incidents"][0]["change"], "unchanged", "{answer}");
    // Alertmanager path-escapes the alias.
    let alias = "checkout-db-1%2Fdisk%2Fvar-lib-postgresql";
    let (status, answer) = opsgenie(
        &ingest,
        &format!("/{alias}/acknowledge?identifierType=alias"),
        &token,
        &fixture("opsgenie-acknowledge.json"),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["status"], "acknowledged", "{answer}");
    let (status, answer) = opsgenie(
        &ingest,
        &format!("/{alias}/close?identifierType=id"),
        &token,
        "{}",
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "identifierType");
    let (status, answer) = opsgenie(
        &ingest,
        &format!("/{alias}/close?identifierType=alias"),
        &token,
        &fixture("opsgenie-close.json"),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["incidents"][0]["status"], "resolved", "{answer}");
    let incidents = ingest.incidents_of(AlertFormat::Opsgenie).await;
    assert_eq!(incidents.len(), 1);
    let incident = &incidents[0];
    assert_eq!(
        incident.dedup_key,
        "opsgenie:checkout-db-1/disk/var-lib-postgresql"
    );
    assert_eq!(incident.title, "Disk almost full on checkout-db-1");
    assert_eq!(incident.severity, "SEV2");
    assert_eq!(incident.labels["team"], "checkout");
    // A token bound to another source is not an Opsgenie sender.
    let datadog = ingest.token_for(AlertFormat::Datadog).await;
    let (status, answer) = opsgenie(&ingest, "", &datadog, &create).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    // GenieKey is a header of these routes only.
    let (status, _) = ingest
        .post_with(&create, None, JSON, "?format=opsgenie")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let response = ingest
        .client
        .post(format!(
            "{}/api/v1/webhooks/alerts?format=opsgenie",
            ingest.base
        ))
        .header("authorization", format!("GenieKey {token}"))
        .header("content-type", JSON)
        .body(create)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    ingest.stop().await;
}
