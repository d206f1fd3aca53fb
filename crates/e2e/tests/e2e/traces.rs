//! OpenTelemetry traces, with the binaries as processes (each installs its own tracer provider)
//! exporting to a small OTLP receiver on loopback (the test kit's recording receiver).
//!
//! With `http/json`, one alert makes one trace: ingest's request span, the dispatcher's
//! fan-out as its child (the trace context went through the outbox and RabbitMQ), and each
//! attempt's span, the retry's too (it came back through a retry queue), with webhook,
//! delivery, attempt number and status. By default the export is `http/protobuf`, and what is
//! queued when a service stops is flushed. An unknown protocol stops a binary at start.
//! Needs the binaries built (`cargo build --bins`, or `cargo nextest run --workspace`).

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde_json::{json, Value};
use tocsin_testkit::audit::AuditLedger;
use tocsin_testkit::{
    amqp_url, binary, free_port, wait_for, wait_ready, Behavior, Receiver, ServiceProcess, TestDb,
    TestPrefix,
};

const DEADLINE: Duration = Duration::from_secs(60);
const ADMIN_TOKEN: &str = "traces-admin-token-0123456789";

/// One exported span, as read from an OTLP/JSON request.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: Vec<(String, String)>,
}

impl Span {
    /// An attribute's value as text (`intValue` and `boolValue` included).
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The text of an OTLP `AnyValue`.
fn any_value(value: &Value) -> String {
    for key in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        match &value[key] {
            Value::Null => {}
            Value::String(s) => return s.clone(),
            other => return other.to_string(),
        }
    }
    value.to_string()
}

fn attributes(list: &Value) -> Vec<(String, String)> {
    list.as_array()
        .map(|items| {
            items
                .iter()
                .map(|kv| {
                    (
                        kv["key"].as_str().unwrap_or_default().to_owned(),
                        any_value(&kv["value"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every span of every `ExportTraceServiceRequest` the receiver got (JSON bodies).
fn spans(receiver: &Receiver) -> Vec<Span> {
    let mut spans = Vec::new();
    for request in receiver.requests() {
        let body: Value = serde_json::from_slice(&request.body).expect("an OTLP/JSON body");
        for resource_spans in body["resourceSpans"].as_array().into_iter().flatten() {
            let resource = attributes(&resource_spans["resource"]["attributes"]);
            let service = resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            for scope in resource_spans["scopeSpans"]
                .as_array()
                .into_iter()
                .flatten()
            {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                    spans.push(Span {
                        service: service.clone(),
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent_span_id: text("parentSpanId"),
                        name: text("name"),
                        attributes: attributes(&span["attributes"]),
                    });
                }
            }
        }
    }
    spans
}

/// The settings every service of a test gets.
fn common_env(db: &TestDb, prefix: &TestPrefix, otlp: &Receiver) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("AMQP_URL", amqp_url()),
        ("TOCSIN_AMQP_PREFIX", prefix.prefix.clone()),
        ("TOCSIN_RETRY_DELAYS", "0s,300ms".to_owned()),
        ("TOCSIN_SHUTDOWN_TIMEOUT", "3s".to_owned()),
        // The base URL: the services append /v1/traces.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url("")),
    ]
}

fn with(
    common: &[(&'static str, String)],
    extra: Vec<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let mut env = common.to_vec();
    env.extend(extra);
    env
}

async fn inbound_token(db: &TestDb) -> String {
    let mut conn = AsyncPgConnection::establish(&db.url)
        .await
        .expect("database");
    tocsin_storage::tokens::create(&mut conn, "traces")
        .await
        .expect("token")
        .1
        .expose()
        .to_owned()
}

#[tokio::test]
async fn one_trace_runs_from_the_ingest_request_to_every_delivery_attempt() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let otlp = Receiver::start().await;
    let target = Receiver::start().await;
    // The first attempt fails: the second comes back through the retry queue.
    target.script([Behavior::Status(500)]);
    let (ingest, dispatcher, admin) = (free_port(), free_port(), free_port());
    let common = with(
        &common_env(&db, &prefix, &otlp),
        vec![
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".to_owned()),
            // Milliseconds: spans go out a moment after they end.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
    );
    let _processes = [
        ServiceProcess::spawn(
            &binary("tocsin-admin"),
            &with(
                &common,
                vec![
                    ("TOCSIN_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
                    ("TOCSIN_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
                ],
            ),
        ),
        ServiceProcess::spawn(
            &binary("tocsin-dispatcher"),
            &with(
                &common,
                vec![
                    ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{dispatcher}")),
                    ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".to_owned()),
                ],
            ),
        ),
        ServiceProcess::spawn(
            &binary("tocsin-ingest"),
            &with(
                &common,
                vec![
                    ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{ingest}")),
                    ("TOCSIN_OUTBOX_POLL", "200ms".to_owned()),
                ],
            ),
        ),
    ];
    for port in [admin, dispatcher, ingest] {
        wait_ready(port, DEADLINE).await;
    }
    let client = reqwest::Client::new();
    let admin_base = format!("http://127.0.0.1:{admin}");
    let ledger = AuditLedger::new(&db.url, ADMIN_TOKEN);
    let request = client
        .post(format!("{admin_base}/api/v1/webhooks"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "traced", "url": target.url("/hook"),
            "events": ["incidents.opened"], "retry": {"max_attempts": 2, "timeout_ms": 2000}}))
        .build()
        .unwrap();
    let created = ledger.exchange(&client, request).await.json();
    let webhook_id = created["id"].as_str().expect("a webhook id").to_owned();

    let accepted = client
        .post(format!("http://127.0.0.1:{ingest}/api/v1/webhooks/alerts"))
        .bearer_auth(inbound_token(&db).await)
        .json(&json!({"title": "traced alert", "dedup_key": "traced-1"}))
        .send()
        .await
        .expect("sending the alert");
    assert_eq!(accepted.status().as_u16(), 202);

    let sent = target.wait_for_requests(2, DEADLINE).await;
    let delivery_id = sent[0]
        .header("webhook-id")
        .expect("the delivery id")
        .to_owned();
    assert_eq!(sent[1].header("webhook-id"), Some(delivery_id.as_str()));

    // Until ingest's request span and both attempts' spans have arrived.
    let attempt_span = |spans: &[Span], number: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "send"
                    && s.attribute("delivery_id") == Some(delivery_id.as_str())
                    && s.attribute("attempt") == Some(number)
            })
            .cloned()
    };
    // The retry's message span ends (and is exported) after its attempt's span: wait for it
    // too, or the check below races the exporter's next batch.
    let (spans, request, first, second) = wait_for(
        "the spans of the request, of both attempts and of the retry's message",
        DEADLINE,
        || {
            let spans = spans(&otlp);
            let request = spans
                .iter()
                .find(|s| s.service == "tocsin-ingest" && s.name == "receive_alerts")
                .cloned();
            let first = attempt_span(&spans, "1");
            let second = attempt_span(&spans, "2");
            let retry_message = request.as_ref().and_then(|request| {
                spans
                    .iter()
                    .find(|s| s.name == "delivery_message" && s.trace_id == request.trace_id)
                    .map(|_| ())
            });
            async move {
                retry_message?;
                Some((spans, request?, first?, second?))
            }
        },
    )
    .await;

    for received in otlp.requests() {
        assert_eq!(
            (received.method.as_str(), received.path.as_str()),
            ("POST", "/v1/traces")
        );
        assert_eq!(received.header("content-type"), Some("application/json"));
    }
    // One trace from the request to both attempts.
    let trace = request.trace_id.clone();
    assert_eq!(trace.len(), 32, "{request:?}");
    assert_eq!(request.attribute("status"), Some("202"), "{request:?}");
    for attempt in [&first, &second] {
        assert_eq!(attempt.service, "tocsin-dispatcher", "{attempt:?}");
        assert_eq!(attempt.trace_id, trace, "{attempt:?} is not in {request:?}");
        assert_eq!(attempt.attribute("webhook_id"), Some(webhook_id.as_str()));
        assert_eq!(attempt.attribute("trigger"), Some("automatic"));
    }
    assert_eq!(first.attribute("status"), Some("500"), "{first:?}");
    assert_eq!(first.attribute("success"), Some("false"), "{first:?}");
    assert_eq!(first.attribute("error"), Some("http_status"), "{first:?}");
    assert_eq!(second.attribute("status"), Some("200"), "{second:?}");
    assert_eq!(second.attribute("success"), Some("true"), "{second:?}");
    // The dispatcher's fan-out is the request span's child.
    let fan_out = spans
        .iter()
        .find(|s| s.name == "fan_out" && s.trace_id == trace)
        .unwrap_or_else(|| panic!("no fan_out span in trace {trace}"));
    assert_eq!(fan_out.service, "tocsin-dispatcher");
    assert_eq!(fan_out.parent_span_id, request.span_id, "{fan_out:?}");
    // The retry's handling hangs under the first attempt (through the retry message).
    let retry = spans
        .iter()
        .find(|s| s.name == "delivery_message" && s.trace_id == trace)
        .unwrap_or_else(|| panic!("no delivery_message span in trace {trace}"));
    // It asks for the attempt after the one automatic attempt made.
    assert_eq!(retry.attribute("auto_attempts"), Some("1"), "{retry:?}");
    // Every service names itself; admin's handler spans are traces of their own.
    let admin_span = spans
        .iter()
        .find(|s| s.service == "tocsin-admin")
        .expect("an admin span");
    assert_ne!(admin_span.trace_id, trace);
    for span in &spans {
        assert!(
            ["tocsin-ingest", "tocsin-dispatcher", "tocsin-admin"].contains(&span.service.as_str()),
            "{span:?}"
        );
        assert!(
            !["take_once", "sweep_once", "record_interrupted"].contains(&span.name.as_str()),
            "periodic passes are not exported: {span:?}"
        );
    }
    ledger.check(&client, &admin_base).await;
}

/// `http/protobuf` by default; the spans still queued when a service stops go out then.
#[tokio::test]
async fn traces_are_protobuf_by_default_and_flushed_when_a_service_stops() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let otlp = Receiver::start().await;
    let ingest = free_port();
    let mut process = ServiceProcess::spawn(
        &binary("tocsin-ingest"),
        &with(
            &common_env(&db, &prefix, &otlp),
            vec![
                ("TOCSIN_INGEST_ADDR", format!("127.0.0.1:{ingest}")),
                // No export on the timer during the test: only the stop flushes.
                ("OTEL_BSP_SCHEDULE_DELAY", "600000".to_owned()),
            ],
        ),
    );
    wait_ready(ingest, DEADLINE).await;
    // Refused (no token), but its request span exists all the same.
    let refused = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{ingest}/api/v1/webhooks/alerts"))
        .json(&json!({"title": "untraced"}))
        .send()
        .await
        .expect("calling ingest");
    assert_eq!(refused.status().as_u16(), 401);
    assert_eq!(otlp.count(), 0, "exported before the stop");

    process.terminate();
    assert!(process.wait_exit(DEADLINE).await.success());
    let received = otlp.wait_for_requests(1, DEADLINE).await;
    let export = &received[0];
    assert_eq!(
        (export.method.as_str(), export.path.as_str()),
        ("POST", "/v1/traces")
    );
    assert_eq!(
        export.header("content-type"),
        Some("application/x-protobuf")
    );
    // Protobuf strings are their UTF-8 bytes.
    for expected in [&b"tocsin-ingest"[..], b"receive_alerts"] {
        assert!(
            export.body.windows(expected.len()).any(|w| w == expected),
            "{} not in the export",
            String::from_utf8_lossy(expected)
        );
    }
}

/// A protocol other than the two HTTP ones stops the binary at start, naming the variable.
#[tokio::test]
async fn an_unsupported_otlp_protocol_stops_a_service_at_start() {
    let log = std::env::temp_dir().join(format!("tocsin-traces-{}.log", uuid::Uuid::new_v4()));
    let mut process = ServiceProcess::spawn_logged(
        &binary("tocsin-dispatcher"),
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:9".to_owned(),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
        ],
        Some(&log),
    );
    let status = process.wait_exit(DEADLINE).await;
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output
            .contains("tocsin-dispatcher: OTEL_EXPORTER_OTLP_PROTOCOL: \"grpc\" is not supported"),
        "{output}"
    );
}
