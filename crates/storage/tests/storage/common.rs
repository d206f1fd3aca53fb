//! The set-up every module of this binary shares, against the real PostgreSQL: the alert signal
//! and the webhooks of the tests, incidents opened and their events fanned out, claims and
//! completions as a dispatcher makes them, and the row changes (leases, due times) that put a
//! delivery where a test needs it.

use std::time::Duration;

use diesel::QueryDsl;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::delivery::{Transition, Trigger};
use tocsin_domain::{
    EventKind, EventPayload, IncidentData, IncidentStatus, RetrySchedule, RetrySettings, Severity,
    TargetUrl, WebhookName,
};
use tocsin_storage::attempts::{
    self, AttemptResult, Claim, ClaimRules, Completed, Completion, Job,
};
use tocsin_storage::deliveries::{self, Delivery};
use tocsin_storage::fan_out::{self, FanOut, FanOutRules, FannedOut};
use tocsin_storage::incidents::Change;
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::schema;
use tocsin_storage::webhooks::{self, NewWebhook, Webhook, WebhookChanges};
use tocsin_testkit::deliveries::claim_rules;
use tocsin_testkit::TestDb;
use uuid::Uuid;

pub(crate) const DEADLINE: Duration = Duration::from_secs(15);

pub(crate) use tocsin_testkit::signal;

/// A webhook subscribed to `events`, allowing `max_attempts` automatic attempts.
pub(crate) async fn webhook(
    conn: &mut AsyncPgConnection,
    name: &str,
    events: &[EventKind],
    max_attempts: i64,
) -> Webhook {
    webhooks::create(
        conn,
        &NewWebhook {
            name: WebhookName::parse(name).unwrap(),
            url: TargetUrl::parse("https://example.com/").unwrap(),
            events: events.iter().copied().collect(),
            retry: RetrySettings::new(max_attempts, i64::from(RetrySettings::DEFAULT_TIMEOUT_MS))
                .unwrap(),
            enabled: true,
            filters: Default::default(),
            headers: Default::default(),
            rate_limit: None,
            ordering: Default::default(),
        },
    )
    .await
    .unwrap()
}

/// A webhook subscribed to every event kind, with the default retry settings.
pub(crate) async fn webhook_for_every_event(conn: &mut AsyncPgConnection, name: &str) -> Webhook {
    webhook(conn, name, &EventKind::ALL, 5).await
}

pub(crate) fn disable() -> WebhookChanges {
    WebhookChanges {
        enabled: Some(false),
        ..Default::default()
    }
}

pub(crate) async fn set_max_attempts(
    conn: &mut AsyncPgConnection,
    webhook_id: Uuid,
    max_attempts: i64,
) {
    let retry =
        RetrySettings::new(max_attempts, i64::from(RetrySettings::DEFAULT_TIMEOUT_MS)).unwrap();
    webhooks::update(
        conn,
        webhook_id,
        &WebhookChanges {
            retry: Some(retry),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Opens an incident; returns its `incidents.opened` event.
pub(crate) async fn open(conn: &mut AsyncPgConnection, key: &str) -> NewEvent {
    let outcome = tocsin_testkit::apply_signals(
        conn,
        &[signal(key, AlertAction::Trigger)],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(outcome[0].change, Change::Opened, "{key}");
    outcome[0].events[0].clone()
}

/// Records a test event for one webhook, as the admin's "send test event" does.
pub(crate) async fn record_test_event(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> NewEvent {
    let payload = EventPayload {
        event: EventKind::IncidentOpened,
        timestamp: OffsetDateTime::now_utc(),
        data: IncidentData {
            id: Uuid::now_v7(),
            title: "Test event".into(),
            severity: Severity::SEV5,
            status: IncidentStatus::Triggered,
            previous_status: None,
        },
    };
    let event = NewEvent::new(&payload, Some(webhook_id));
    conn.transaction::<_, tocsin_storage::DbError, _>(async |conn| {
        outbox::record_events(conn, std::slice::from_ref(&event), &outbox::Wake::Listeners).await
    })
    .await
    .unwrap();
    event
}

/// Fan-out rules that leave new deliveries `pending` (no first attempt claimed with them).
pub(crate) const PENDING: FanOutRules = FanOutRules {
    claim: false,
    lease_margin: Duration::from_secs(5),
    replay_to: None,
};

pub(crate) fn fan_out_request(event: &NewEvent, redelivered: bool) -> FanOut {
    FanOut {
        event_id: event.id,
        kind: event.kind,
        incident_id: event.incident_id,
        test_webhook_id: event.test_webhook_id,
        redelivered,
    }
}

/// Fans out one event, as a dispatcher with no room for the webhooks in `busy` does.
pub(crate) async fn fan_out(
    conn: &mut AsyncPgConnection,
    event: &NewEvent,
    busy: &[Uuid],
) -> FannedOut {
    let room: Vec<(Uuid, i64)> = busy.iter().map(|id| (*id, 0)).collect();
    fan_out::fan_out(conn, &[fan_out_request(event, false)], &room, PENDING)
        .await
        .unwrap()
        .pop()
        .unwrap()
}

/// Opens an incident and fans out its event; returns its delivery to `webhook_id`.
pub(crate) async fn delivery_to(conn: &mut AsyncPgConnection, key: &str, webhook_id: Uuid) -> Uuid {
    let event = open(conn, key).await;
    fan_out(conn, &event, &[])
        .await
        .pending
        .iter()
        .find(|d| d.webhook_id == webhook_id)
        .expect("a delivery to the webhook")
        .delivery_id
}

/// A webhook's deliveries, newest first.
pub(crate) async fn deliveries_of(conn: &mut AsyncPgConnection, webhook_id: Uuid) -> Vec<Delivery> {
    let filter = deliveries::DeliveryFilter {
        webhook_id: Some(webhook_id),
        ..Default::default()
    };
    let page = tocsin_storage::Page {
        limit: tocsin_storage::Page::MAX_LIMIT,
        cursor: None,
    };
    deliveries::list(conn, &filter, &page).await.unwrap().0
}

pub(crate) async fn claim(
    conn: &mut AsyncPgConnection,
    delivery_id: Uuid,
    trigger: Trigger,
    auto_attempts: i32,
    rules: ClaimRules,
) -> Option<Job> {
    attempts::claim(
        conn,
        &[Claim {
            delivery_id,
            trigger,
            auto_attempts,
        }],
        rules,
    )
    .await
    .unwrap()
    .pop()
    .unwrap()
}

/// Claims the automatic attempt after the `expected` ones (the rules allow it a day early).
pub(crate) async fn claim_auto(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    expected: i32,
) -> Option<Job> {
    claim(conn, id, Trigger::Automatic, expected, claim_rules()).await
}

/// Asks for one manual attempt of a delivery and claims it.
pub(crate) async fn claim_manual(conn: &mut AsyncPgConnection, id: Uuid) -> Option<Job> {
    request_manual(conn, &[id]).await;
    claim(conn, id, Trigger::Manual, 0, claim_rules()).await
}

/// Marks deliveries as having a manual attempt asked for, as a retry's request does (without
/// its outbox row).
pub(crate) async fn request_manual(conn: &mut AsyncPgConnection, ids: &[Uuid]) {
    for id in ids {
        diesel::sql_query(format!(
            "UPDATE deliveries SET manual_requested = true WHERE id = '{id}'"
        ))
        .execute(conn)
        .await
        .unwrap();
    }
}

/// The completion of a claimed attempt with `result`, moving the delivery as the state machine
/// says for the specification's schedule.
pub(crate) fn completion(job: &Job, result: AttemptResult) -> Completion {
    let automatic = job.trigger == Trigger::Automatic;
    Completion {
        delivery_id: job.delivery.id,
        number: job.number,
        auto_attempts: automatic.then_some(job.delivery.auto_attempts),
        transition: Transition::after_attempt(
            job.trigger,
            job.delivery.auto_attempts,
            result.success,
            job.webhook.retry.max_attempts(),
            &RetrySchedule::specification(),
        ),
        result,
    }
}

pub(crate) async fn complete(
    conn: &mut AsyncPgConnection,
    completion: Completion,
) -> Option<Completed> {
    attempts::complete(conn, &[completion])
        .await
        .unwrap()
        .pop()
        .unwrap()
}

/// The lease of the automatic attempt under way, if any.
pub(crate) async fn lease(conn: &mut AsyncPgConnection, id: Uuid) -> Option<OffsetDateTime> {
    use schema::deliveries::dsl;
    dsl::deliveries
        .find(id)
        .select(dsl::attempting_until)
        .first(conn)
        .await
        .unwrap()
}

/// Ends the lease of the automatic attempt under way `ago` ago, as if its dispatcher had
/// stopped that long before.
pub(crate) async fn end_lease(conn: &mut AsyncPgConnection, id: Uuid, ago: &str) {
    diesel::sql_query(format!(
        "UPDATE deliveries SET attempting_until = now() - interval '{ago}', \
         next_attempt_at = now() - interval '{ago}' WHERE id = '{id}'"
    ))
    .execute(conn)
    .await
    .unwrap();
}

/// Runs SQL of the test's own (set-up, plans), which must succeed.
pub(crate) async fn execute(conn: &mut AsyncPgConnection, sql: String) {
    diesel::sql_query(sql).execute(conn).await.unwrap();
}

/// Logged attempts of a delivery.
pub(crate) async fn attempt_rows(db: &TestDb, id: Uuid) -> i64 {
    db.count(&format!("attempts WHERE delivery_id = '{id}'"))
        .await
}

/// `at` lies between two instants the test measured (give or take a clock tick).
pub(crate) fn assert_between(
    at: OffsetDateTime,
    from: OffsetDateTime,
    to: OffsetDateTime,
    what: &str,
) {
    let tick = time::Duration::milliseconds(1);
    assert!(
        at >= from - tick && at <= to + tick,
        "{what}: {at}, expected between {from} and {to}"
    );
}
