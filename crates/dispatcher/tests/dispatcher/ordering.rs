//! Ordered delivery per incident (`ordering: incident`): each incident's events reach the
//! webhook in the order of the incident's changes, whatever the dispatchers, retries and fan-out
//! order; other incidents and other webhooks never wait for each other; `ordering: none` is
//! unchanged.

use std::collections::HashMap;

use futures::StreamExt;
use tocsin_domain::{EventKind, WebhookOrdering};
use tocsin_storage::deliveries::DeliveryState;
use tocsin_testkit::{Behavior, Received, Receiver, FAST_RETRY_DELAYS};

use crate::common::{Harness, DEADLINE};

const INCIDENTS: usize = 200;

/// The rank of an event kind in one change's order.
fn rank(kind: &str) -> u8 {
    match kind {
        "incidents.opened" => 0,
        "incidents.status_changed" => 1,
        "incidents.resolved" => 2,
        other => panic!("unexpected event {other}"),
    }
}

/// The incidents whose events arrived out of order: each incident's requests, in arrival order,
/// must never go back to an earlier kind (a retry of the same event is allowed).
fn out_of_order(requests: &[Received]) -> Vec<String> {
    let mut by_incident: HashMap<String, Vec<(String, Option<u16>)>> = HashMap::new();
    for request in requests {
        let body = request.json();
        by_incident
            .entry(body["data"]["id"].as_str().unwrap().to_owned())
            .or_default()
            .push((body["event"].as_str().unwrap().to_owned(), request.answered));
    }
    let mut wrong = Vec::new();
    for (incident, seen) in &by_incident {
        let ranks: Vec<u8> = seen.iter().map(|(kind, _)| rank(kind)).collect();
        let accepted: Vec<&str> = seen
            .iter()
            .filter(|(_, status)| status.is_some_and(|s| (200..300).contains(&s)))
            .map(|(kind, _)| kind.as_str())
            .collect();
        if ranks.windows(2).any(|w| w[1] < w[0])
            || accepted
                != [
                    "incidents.opened",
                    "incidents.status_changed",
                    "incidents.resolved",
                ]
        {
            wrong.push(format!("{incident}: {seen:?}"));
        }
    }
    wrong
}

/// 200 incidents, each opened and resolved back to back by 16 senders, through two
/// dispatchers, to an ordered webhook whose receiver answers at once, to an ordered one whose
/// receiver fails each incident's first request once, and to an unordered one: both ordered
/// receivers get every incident's events in order, each accepted once; the unordered one gets
/// every event.
#[tokio::test]
async fn ordered_webhooks_get_each_incidents_events_in_order() {
    let mut harness = Harness::without_dispatcher(FAST_RETRY_DELAYS).await;
    harness.add_dispatcher(|_| {}).await;
    harness.add_dispatcher(|_| {}).await;
    let healthy = Receiver::start_with(Behavior::Status(204)).await;
    let flaky = Receiver::start_with(Behavior::FirstOfEachIncident(500)).await;
    let unordered = Receiver::start_with(Behavior::Status(204)).await;
    let ordered = harness
        .webhook(&healthy.url("/ordered"), &EventKind::ALL, 5, 5_000)
        .await;
    harness
        .set_ordering(ordered.id, WebhookOrdering::Incident)
        .await;
    let ordered_flaky = harness
        .webhook(&flaky.url("/flaky"), &EventKind::ALL, 5, 5_000)
        .await;
    harness
        .set_ordering(ordered_flaky.id, WebhookOrdering::Incident)
        .await;
    harness
        .webhook(&unordered.url("/none"), &EventKind::ALL, 5, 5_000)
        .await;

    futures::stream::iter(0..INCIDENTS)
        .map(|i| {
            let harness = &harness;
            async move {
                let key = format!("ordered-{i}");
                harness.open(&key).await;
                harness.resolve(&key).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    let events = INCIDENTS * 3;
    let got = healthy.wait_for_requests(events, DEADLINE).await;
    assert_eq!(out_of_order(&got), Vec::<String>::new());
    // Each incident's first request failed once, and was retried.
    let got = flaky.wait_for_requests(events + INCIDENTS, DEADLINE).await;
    assert_eq!(out_of_order(&got), Vec::<String>::new());
    unordered.wait_for_requests(events, DEADLINE).await;
    for webhook in [ordered.id, ordered_flaky.id] {
        tocsin_testkit::wait_until("every ordered delivery succeeded", DEADLINE, || async {
            harness
                .db
                .count(&format!(
                    "deliveries WHERE webhook_id = '{webhook}' AND state = 'succeeded'"
                ))
                .await
                == events as i64
        })
        .await;
    }
    harness.wait_drained().await;
    assert_eq!(healthy.count(), events, "none sent twice");
    assert_eq!(flaky.count(), events + INCIDENTS, "none sent twice");
    harness.stop().await;
}

/// While an incident's earlier delivery is unfinished, a later one is listed `waiting`
/// (`ordering`); another incident's deliveries to the same webhook do not wait; once the
/// earlier one has finished (here, its retry succeeded), the later ones are sent, in order.
#[tokio::test]
async fn a_later_delivery_waits_visibly_for_the_earlier_one_to_finish() {
    let harness = Harness::start(FAST_RETRY_DELAYS).await;
    let receiver = Receiver::start_with(Behavior::Status(204)).await;
    let webhook = harness
        .webhook(&receiver.url("/hook"), &EventKind::ALL, 2, 1_000)
        .await;
    harness
        .set_ordering(webhook.id, WebhookOrdering::Incident)
        .await;
    // The first event's requests hang until their timeout; the rest answer at once.
    receiver.script([Behavior::Hang]);
    harness.open("slow").await;
    receiver.wait_for_requests(1, DEADLINE).await;
    harness.resolve("slow").await;
    harness.open("other").await;
    // The other incident is not held up.
    receiver.wait_for_requests(2, DEADLINE).await;
    let waiting = tocsin_testkit::wait_for(
        "two deliveries waiting for their order",
        DEADLINE,
        || async {
            let waiting: Vec<_> = harness
                .deliveries(webhook.id)
                .await
                .into_iter()
                .filter(|d| {
                    d.state == DeliveryState::Waiting
                        && d.wait_reason == Some(tocsin_domain::delivery::WaitReason::Ordering)
                })
                .collect();
            (waiting.len() == 2).then_some(waiting)
        },
    )
    .await;
    assert!(waiting.iter().all(|d| d.event != EventKind::IncidentOpened));
    // The hanging first attempt times out; its retry succeeds; then the waiting ones are sent,
    // in order.
    let got = receiver.wait_for_requests(2 + 1 + 2, DEADLINE).await;
    let kinds: Vec<String> = got
        .iter()
        .filter(|r| r.json()["data"]["title"] == "incident slow")
        .map(|r| r.json()["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "incidents.opened",
            "incidents.opened",
            "incidents.status_changed",
            "incidents.resolved"
        ]
    );
    harness.stop().await;
}
