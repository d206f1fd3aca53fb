//! The hostile-target suite: targets answering as no well-behaved server does (NUL bytes,
//! invalid UTF-8, a body far over the cap, a body or a status line dripped a byte a second, a
//! reset, a redirect, hundreds of headers, a chunked 2xx that never ends, a TLS handshake that
//! stalls or gets garbage), each served by testkit's raw receiver. For each, every delivery to
//! the hostile webhook finishes after one attempt, logged with its outcome within the webhook's
//! timeout, while a healthy webhook beside it receives every event. Then 300 NUL answers in a
//! row to a dispatcher process (no `database unavailable` line while PostgreSQL is up, the
//! healthy webhook served meanwhile), and arbitrary bytes as the body of a 200.

use crate::common;

use std::time::{Duration, Instant};

use common::{Harness, DEADLINE};
use tocsin_domain::alerts::{AlertAction, AlertSignal};
use tocsin_domain::{EventKind, IncidentTitle, Severity};
use tocsin_storage::deliveries::{Attempt, Delivery, DeliveryState};
use tocsin_storage::outbox;
use tocsin_testkit::fuzz::Budget;
use tocsin_testkit::raw_receiver::{arbitrary_bodies, head, response};
use tocsin_testkit::{
    free_port, within, Behavior, RawBehavior, RawReceiver, Receiver, ServiceProcess,
};

/// The hostile webhooks' timeout.
const TIMEOUT_MS: i64 = 1_500;
/// How much longer than its timeout an attempt may be recorded as lasting: the time to notice
/// the deadline and close the connection, on a busy machine.
const MARGIN_MS: i64 = 2_000;
/// The dispatchers' response body limit.
const BODY_LIMIT: usize = 64 * 1024;
/// Events sent to each pair of webhooks.
const EVENTS: usize = 3;

/// How a hostile webhook's deliveries end.
struct Expected {
    state: DeliveryState,
    status: Option<i32>,
    error: Option<&'static str>,
}

/// Succeeded with `200`.
const SUCCEEDED_200: Expected = Expected {
    state: DeliveryState::Succeeded,
    status: Some(200),
    error: None,
};

/// Failed with no answer, for `error`.
const fn failed(error: &'static str) -> Expected {
    Expected {
        state: DeliveryState::Failed,
        status: None,
        error: Some(error),
    }
}

/// An attempt's outcome in one line, its body cut short.
fn outcome(attempt: &Attempt) -> String {
    let body = attempt.response_body.as_deref().map(|b| {
        let start: String = b.chars().take(60).collect();
        format!("{} bytes, starting {start:?}", b.len())
    });
    format!(
        "success {:?}, status {:?}, error {:?} ({:?}), {:?} ms, body {body:?}, truncated {}",
        attempt.success,
        attempt.status_code,
        attempt.error,
        attempt.error_detail,
        attempt.duration_ms,
        attempt.response_truncated
    )
}

/// Waits until the webhook has [`EVENTS`] deliveries, all finished; panics after [`DEADLINE`]
/// saying how `whose` deliveries and their attempts are.
async fn settled(harness: &Harness, webhook_id: uuid::Uuid, whose: &str) -> Vec<Delivery> {
    let finished = within(DEADLINE, || async {
        let found = harness.deliveries(webhook_id).await;
        (found.len() == EVENTS && found.iter().all(|d| d.state.is_finished())).then_some(found)
    })
    .await;
    if let Some(finished) = finished {
        return finished;
    }
    let mut now = Vec::new();
    for delivery in harness.deliveries(webhook_id).await {
        let attempts: Vec<String> = harness
            .detail(delivery.id)
            .await
            .attempts
            .iter()
            .map(outcome)
            .collect();
        now.push(format!("{}: {attempts:?}", delivery.state));
    }
    panic!(
        "{whose} {EVENTS} deliveries did not all finish within {DEADLINE:?}; they are: {now:#?}"
    );
}

/// Sends [`EVENTS`] events to a webhook at `url` (a hostile target, one attempt allowed,
/// [`TIMEOUT_MS`]) and to a healthy webhook beside it. Checks that the healthy webhook received
/// every event, and that every hostile delivery ended as `expected` after one attempt, logged
/// with its outcome and lasting no longer than its timeout (and a margin). Returns the hostile
/// attempts for the scenario's own checks.
async fn beside_a_healthy_webhook(url: &str, expected: Expected) -> Vec<Attempt> {
    let mut harness = Harness::without_dispatcher("0s").await;
    harness
        .add_dispatcher(|config| config.response_body_limit = BODY_LIMIT)
        .await;
    let healthy = Receiver::start_with(Behavior::Status(204)).await;
    let hostile = harness
        .webhook(url, &[EventKind::IncidentOpened], 1, TIMEOUT_MS)
        .await;
    let good = harness
        .webhook(
            &healthy.url("/healthy"),
            &[EventKind::IncidentOpened],
            1,
            5_000,
        )
        .await;
    for i in 0..EVENTS {
        harness.open(&format!("hostile-{i}")).await;
    }
    healthy.wait_for_requests(EVENTS, DEADLINE).await;
    for delivery in settled(&harness, good.id, "the healthy webhook's").await {
        if delivery.state != DeliveryState::Succeeded {
            let detail = harness.detail(delivery.id).await;
            let attempts: Vec<String> = detail.attempts.iter().map(outcome).collect();
            panic!(
                "a delivery of the healthy webhook beside the hostile one {}: {attempts:?}",
                delivery.state
            );
        }
    }
    let finished = settled(&harness, hostile.id, "the hostile webhook's").await;
    let mut attempts = Vec::new();
    for delivery in finished {
        let mut detail = harness.detail(delivery.id).await;
        let all: Vec<String> = detail.attempts.iter().map(outcome).collect();
        assert_eq!(detail.attempts.len(), 1, "one attempt: {all:?}");
        let attempt = detail.attempts.remove(0);
        let described = outcome(&attempt);
        assert_eq!(
            (
                delivery.state,
                attempt.status_code,
                attempt.error.as_deref()
            ),
            (expected.state, expected.status, expected.error),
            "{described}"
        );
        assert_eq!(
            attempt.success,
            Some(expected.state == DeliveryState::Succeeded),
            "{described}"
        );
        let lasted = attempt
            .duration_ms
            .expect("a recorded attempt has a duration");
        assert!(
            i64::from(lasted) <= TIMEOUT_MS + MARGIN_MS,
            "the attempt outlasted its timeout of {TIMEOUT_MS} ms: {described}"
        );
        attempts.push(attempt);
    }
    harness.stop().await;
    attempts
}

#[tokio::test]
async fn a_200_with_nul_bytes_succeeds_with_its_body_stored_readable() {
    let hostile = RawReceiver::start(RawBehavior::ok_with_body(b"before\0after")).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/nul"), SUCCEEDED_200).await {
        assert_eq!(
            attempt.response_body.as_deref(),
            Some("before\u{FFFD}after")
        );
        assert!(!attempt.response_truncated);
    }
}

#[tokio::test]
async fn a_200_with_invalid_utf8_succeeds_with_its_body_stored_readable() {
    let hostile = RawReceiver::start(RawBehavior::ok_with_body(b"before\xffafter")).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/utf8"), SUCCEEDED_200).await {
        assert_eq!(
            attempt.response_body.as_deref(),
            Some("before\u{FFFD}after")
        );
        assert!(!attempt.response_truncated);
    }
}

#[tokio::test]
async fn a_body_far_over_the_cap_is_kept_up_to_the_cap() {
    let body = vec![b'x'; 128 * BODY_LIMIT];
    let hostile = RawReceiver::start(RawBehavior::ok_with_body(&body)).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/huge"), SUCCEEDED_200).await {
        let kept = attempt.response_body.as_deref().unwrap_or_default();
        assert_eq!(kept.len(), BODY_LIMIT);
        assert!(kept.bytes().all(|b| b == b'x'));
        assert!(attempt.response_truncated);
    }
}

/// The status and headers come at once, then a 30-byte body a byte a second: the status
/// decides, and the body is kept as read when the timeout ends the exchange.
#[tokio::test]
async fn a_body_dripped_a_byte_a_second_is_kept_as_read_at_the_timeout() {
    let body = b"dripping one byte every second".to_vec();
    let hostile = RawReceiver::start(RawBehavior::Drip {
        head: head("200 OK", [format!("content-length: {}", body.len())]),
        body: body.clone(),
        every: Duration::from_secs(1),
    })
    .await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/drip"), SUCCEEDED_200).await {
        let kept = attempt.response_body.clone().unwrap_or_default();
        assert!(
            kept.len() < body.len() && body.starts_with(kept.as_bytes()),
            "{}",
            outcome(&attempt)
        );
        assert!(attempt.response_truncated);
        let detail = attempt.error_detail.unwrap_or_default();
        assert!(detail.contains("still arriving"), "{detail}");
    }
}

#[tokio::test]
async fn a_status_line_dripped_a_byte_a_second_times_out() {
    let hostile = RawReceiver::start(RawBehavior::Drip {
        head: Vec::new(),
        body: response("200 OK", &[], b"ok"),
        every: Duration::from_secs(1),
    })
    .await;
    beside_a_healthy_webhook(&hostile.url("/drip-head"), failed("timeout")).await;
}

#[tokio::test]
async fn a_connection_reset_after_the_request_fails_as_connect() {
    let hostile = RawReceiver::start(RawBehavior::Reset).await;
    beside_a_healthy_webhook(&hostile.url("/reset"), failed("connect")).await;
    assert_eq!(hostile.count(), EVENTS, "each request was read, then reset");
}

#[tokio::test]
async fn a_redirect_is_logged_with_its_status_and_not_followed() {
    // Its answer names the receiver itself, so it is set once the receiver has its port.
    let hostile = RawReceiver::start(RawBehavior::Silent).await;
    hostile.set_behavior(RawBehavior::answer(
        "301 Moved Permanently",
        &[format!("location: {}", hostile.url("/elsewhere"))],
        b"moved",
    ));
    let redirected = Expected {
        state: DeliveryState::Failed,
        status: Some(301),
        error: Some("redirect"),
    };
    for attempt in beside_a_healthy_webhook(&hostile.url("/moved"), redirected).await {
        assert_eq!(attempt.response_body.as_deref(), Some("moved"));
    }
    let lines: Vec<String> = hostile
        .requests()
        .iter()
        .map(|r| r.request_line().to_owned())
        .collect();
    assert_eq!(lines, vec!["POST /moved HTTP/1.1".to_owned(); EVENTS]);
}

/// As many headers as the HTTP client reads (hyper's limit is 100, and reqwest has no setting
/// for it): the answer is read.
#[tokio::test]
async fn a_200_with_ninety_headers_succeeds() {
    let headers: Vec<String> = (0..90)
        .map(|i| format!("x-hostile-{i}: value {i}"))
        .collect();
    let hostile = RawReceiver::start(RawBehavior::answer("200 OK", &headers, b"ok")).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/headers"), SUCCEEDED_200).await {
        assert_eq!(attempt.response_body.as_deref(), Some("ok"));
    }
}

/// More headers than the HTTP client reads: the answer cannot be read, and the attempt fails
/// at once. Its kind is `other`: the connection neither was refused nor broke (`connect`), the
/// target answered something that is not an HTTP answer the client accepts.
#[tokio::test]
async fn a_200_with_hundreds_of_headers_fails_as_unreadable() {
    let headers: Vec<String> = (0..300)
        .map(|i| format!("x-hostile-{i}: value {i}"))
        .collect();
    let hostile = RawReceiver::start(RawBehavior::answer("200 OK", &headers, b"ok")).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/headers"), failed("other")).await {
        let detail = attempt.error_detail.unwrap_or_default();
        assert!(detail.contains("message head is too large"), "{detail}");
    }
}

#[tokio::test]
async fn a_chunked_200_that_never_ends_is_kept_as_read_at_the_timeout() {
    let hostile = RawReceiver::start(RawBehavior::NeverEndingChunked).await;
    for attempt in beside_a_healthy_webhook(&hostile.url("/chunked"), SUCCEEDED_200).await {
        let kept = attempt.response_body.clone().unwrap_or_default();
        assert!(kept.starts_with("chunk "), "{}", outcome(&attempt));
        assert!(attempt.response_truncated);
        let detail = attempt.error_detail.unwrap_or_default();
        assert!(detail.contains("still arriving"), "{detail}");
    }
}

#[tokio::test]
async fn a_tls_handshake_that_stalls_times_out() {
    let hostile = RawReceiver::start(RawBehavior::Silent).await;
    beside_a_healthy_webhook(&hostile.https_url("/stall"), failed("timeout")).await;
    assert!(hostile.connections() > 0, "the handshakes were started");
    assert_eq!(hostile.count(), 0, "no request got through");
}

#[tokio::test]
async fn a_tls_handshake_answered_in_plain_http_fails_as_tls() {
    let answer = response("200 OK", &[], b"ok");
    let hostile = RawReceiver::start(RawBehavior::OnConnect(answer)).await;
    beside_a_healthy_webhook(&hostile.https_url("/plain"), failed("tls")).await;
}

/// A dispatcher process on the harness's database and prefix, with 8 attempts in flight, its
/// log (JSON) in `log`.
fn spawn_dispatcher(harness: &Harness, port: u16, log: &std::path::Path) -> ServiceProcess {
    let env = [
        ("DATABASE_URL", harness.db.url.clone()),
        ("AMQP_URL", tocsin_testkit::amqp_url()),
        ("TOCSIN_AMQP_PREFIX", harness.prefix.prefix.clone()),
        ("TOCSIN_RETRY_DELAYS", "0s".into()),
        ("TOCSIN_DISPATCHER_ADDR", format!("127.0.0.1:{port}")),
        ("TOCSIN_ALLOWED_TARGETS", "127.0.0.0/8".into()),
        ("TOCSIN_DISPATCHER_CONCURRENCY", "8".into()),
        ("TOCSIN_SHUTDOWN_TIMEOUT", "5s".into()),
        ("TOCSIN_LOG_FORMAT", "json".into()),
        ("RUST_LOG", "warn".into()),
    ];
    ServiceProcess::spawn_logged(env!("CARGO_BIN_EXE_tocsin-dispatcher"), &env, Some(log))
}

/// Opens one incident per key in one transaction: their events come in a row.
async fn open_all(harness: &Harness, keys: &[String]) {
    let signals: Vec<AlertSignal> = keys
        .iter()
        .map(|key| AlertSignal {
            dedup_key: key.clone(),
            action: AlertAction::Trigger,
            title: IncidentTitle::parse(&format!("incident {key}")).unwrap(),
            severity: Severity::SEV2,
            description: None,
            source: None,
            reply_key: None,
            labels: Default::default(),
        })
        .collect();
    let mut conn = harness.conn().await;
    tocsin_testkit::apply_signals(&mut conn, &signals, outbox::Wake::Listeners)
        .await
        .unwrap();
}

/// From outside: a dispatcher process with 8 attempts in flight gets 300 events in a row for a
/// webhook answering `200` with a NUL byte in its body, and meanwhile events for a healthy
/// webhook. Every hostile delivery succeeds, the healthy webhook receives its events (their
/// delay is printed, not asserted), and the log has no `database unavailable` line.
#[tokio::test]
async fn three_hundred_nul_answers_in_a_row_leave_another_webhook_served() {
    const HOSTILE: usize = 300;
    const HEALTHY: usize = 10;
    let harness = Harness::without_dispatcher("0s").await;
    let hostile = RawReceiver::start(RawBehavior::ok_with_body(b"\0")).await;
    let healthy = Receiver::start_with(Behavior::Status(204)).await;
    let nul = harness
        .webhook(&hostile.url("/nul"), &[EventKind::IncidentOpened], 1, 2_000)
        .await;
    harness
        .webhook(
            &healthy.url("/healthy"),
            &[EventKind::IncidentResolved],
            1,
            5_000,
        )
        .await;
    let log = std::env::temp_dir().join(format!("tocsin-hostile-{}.log", harness.prefix.prefix));
    let mut process = spawn_dispatcher(&harness, free_port(), &log);

    let keys: Vec<String> = (0..HOSTILE).map(|i| format!("nul-{i}")).collect();
    open_all(&harness, &keys).await;
    let mut problems = Vec::new();
    if within(DEADLINE, || async { (hostile.count() >= 20).then_some(()) })
        .await
        .is_none()
    {
        problems.push(format!(
            "the NUL answers stalled: {} requests in {DEADLINE:?}",
            hostile.count()
        ));
    }
    // The healthy webhook's events, sent while the NUL answers are being recorded; each one's
    // delay runs from its resolve to its arrival (matched by the incident's title).
    let mut sent = std::collections::HashMap::new();
    for key in keys.iter().take(HEALTHY) {
        sent.insert(format!("incident {key}"), (Instant::now(), hostile.count()));
        harness.resolve(key).await;
    }
    match within(DEADLINE, || async {
        let requests = healthy.requests();
        (requests.len() >= HEALTHY).then_some(requests)
    })
    .await
    {
        Some(requests) => {
            for request in requests {
                let title = request.json()["data"]["title"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let (at, answered) = sent[&title];
                eprintln!(
                    "healthy event arrived in {:?} ({answered} NUL answers were in when it was sent)",
                    request.at.saturating_duration_since(at)
                );
            }
        }
        None => problems.push(format!(
            "the healthy webhook got {} of {HEALTHY} events; the NUL one had {} requests",
            healthy.count(),
            hostile.count()
        )),
    }
    let states = || async {
        let mut states = std::collections::BTreeMap::<String, i64>::new();
        for state in [DeliveryState::Succeeded, DeliveryState::Failed] {
            let n = harness
                .db
                .count(&format!(
                    "deliveries WHERE webhook_id = '{}' AND state = '{state}'",
                    nul.id
                ))
                .await;
            states.insert(state.to_string(), n);
        }
        let all = harness
            .db
            .count(&format!("deliveries WHERE webhook_id = '{}'", nul.id))
            .await;
        states.insert("all".into(), all);
        states
    };
    let succeeded = within(Duration::from_secs(60), || async {
        (states().await["succeeded"] == HOSTILE as i64).then_some(())
    })
    .await;
    if succeeded.is_none() {
        problems.push(format!(
            "the NUL webhook's {HOSTILE} deliveries did not all succeed: {:?}; {} requests",
            states().await,
            hostile.count()
        ));
    }
    process.terminate();
    process.wait_exit(Duration::from_secs(15)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let unavailable: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("database unavailable"))
        .collect();
    if !unavailable.is_empty() {
        problems.push(format!(
            "{} `database unavailable` lines while PostgreSQL was up, the first: {}",
            unavailable.len(),
            unavailable[0]
        ));
    }
    harness.stop().await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Arbitrary bytes (NUL, invalid UTF-8, text) as the body of a `200` go the whole way, from the
/// raw receiver through the dispatcher into the delivery log: each attempt succeeds and is
/// recorded with its body as readable text, U+FFFD where the bytes were NUL or not UTF-8.
/// `PROPTEST_CASES` sets the number of cases (default 24).
#[tokio::test]
async fn arbitrary_response_bodies_are_recorded() {
    let mut harness = Harness::without_dispatcher("0s").await;
    harness
        .add_dispatcher(|config| config.response_body_limit = BODY_LIMIT)
        .await;
    let hostile = RawReceiver::start(RawBehavior::Silent).await;
    let webhook = harness
        .webhook(
            &hostile.url("/bytes"),
            &[EventKind::IncidentOpened],
            1,
            TIMEOUT_MS,
        )
        .await;
    let mut samples = Budget::from_env(24).samples(arbitrary_bodies());
    let mut case = 0;
    for body in samples.by_ref() {
        hostile.set_behavior(RawBehavior::ok_with_body(&body));
        harness.open(&format!("bytes-{case}")).await;
        case += 1;
        let request = hostile
            .wait_for_requests(case, DEADLINE)
            .await
            .remove(case - 1);
        let id: uuid::Uuid = request
            .header("webhook-id")
            .and_then(|id| id.parse().ok())
            .expect("the request names its delivery");
        let finished = within(DEADLINE, || async {
            let detail = harness.detail(id).await;
            detail.delivery.state.is_finished().then_some(detail)
        })
        .await;
        let shown = format!(
            "case {case}, a body of {} bytes starting b\"{}\"",
            body.len(),
            body[..body.len().min(120)].escape_ascii()
        );
        let Some(mut detail) = finished else {
            panic!("{shown}: the delivery did not finish within {DEADLINE:?}");
        };
        assert_eq!(detail.delivery.webhook_id, webhook.id);
        assert_eq!(detail.attempts.len(), 1, "case {case}: one attempt");
        let attempt = detail.attempts.remove(0);
        let expected = String::from_utf8_lossy(&body).replace('\0', "\u{FFFD}");
        assert_eq!(
            (
                detail.delivery.state,
                attempt.success,
                attempt.error.as_deref()
            ),
            (DeliveryState::Succeeded, Some(true), None),
            "{shown}: {}",
            outcome(&attempt)
        );
        assert_eq!(
            attempt.response_body.as_deref(),
            Some(expected.as_str()),
            "{shown}"
        );
        assert!(!attempt.response_truncated, "{shown}");
    }
    eprintln!("{}", samples.summary());
    harness.stop().await;
}
