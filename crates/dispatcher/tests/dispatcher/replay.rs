//! Replays (`tocsin_storage::replays`): a webhook given the past events of a window gets each
//! of them once, marked replayed; replaying the window again, or while the events' own fan-out
//! is still under way, at the test limits or at the dispatcher's default ones, to a webhook in
//! incident order or not, sends nothing twice, as a real receiver counts requests by
//! `webhook-id`, and every request it got is one attempt in the attempt log.

use std::collections::BTreeMap;

use futures::StreamExt;
use time::OffsetDateTime;
use tocsin_domain::{EventKind, WebhookOrdering};
use tocsin_storage::replays::{self, NewReplay};
use tocsin_testkit::{Behavior, Received, Receiver, FAST_RETRY_DELAYS};
use uuid::Uuid;

use crate::common::{self, Harness, DEADLINE};

/// How long a replay of hundreds of events may take to be delivered: longer than the shared
/// deadline, for a loaded CI machine.
const REPLAY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

/// Incidents made per round, each opened, changed and resolved (three events).
const INCIDENTS: usize = 200;
/// Incidents made at once.
const AT_ONCE: usize = 16;
/// Every event kind.
const ALL: [EventKind; 3] = [
    EventKind::IncidentOpened,
    EventKind::IncidentStatusChanged,
    EventKind::IncidentResolved,
];

/// Makes `INCIDENTS` incidents named `{round}-{i}`, `AT_ONCE` at a time.
async fn incidents(harness: &Harness, round: &str) {
    futures::stream::iter(0..INCIDENTS)
        .for_each_concurrent(AT_ONCE, |i| async move {
            let key = format!("{round}-{i}");
            harness.open(&key).await;
            harness.resolve(&key).await;
        })
        .await;
}

async fn replay(harness: &Harness, webhook_id: Uuid, since: OffsetDateTime) -> Uuid {
    let replay = NewReplay {
        webhook_id,
        since,
        until: None,
        kinds: None,
    };
    replays::create(&mut harness.conn().await, &replay)
        .await
        .unwrap()
        .id
}

async fn wait_finished(harness: &Harness, id: Uuid) {
    tocsin_testkit::wait_until("the replay finished", REPLAY_DEADLINE, || async {
        replays::get(&mut harness.conn().await, id)
            .await
            .unwrap()
            .finished_at
            .is_some()
    })
    .await;
}

/// Waits until the webhook has `n` deliveries, all succeeded, with no attempt under way and
/// no attempt asked for left in the outbox or the queue: nothing more can be sent.
async fn wait_settled(harness: &Harness, webhook_id: Uuid, n: i64) {
    let succeeded = format!("deliveries WHERE webhook_id = '{webhook_id}' AND state = 'succeeded'");
    tocsin_testkit::wait_until(
        &format!("{n} deliveries succeeded"),
        REPLAY_DEADLINE,
        || async {
            harness.db.count(&succeeded).await == n
                && harness.db.count("attempts WHERE success IS NULL").await == 0
        },
    )
    .await;
    harness.wait_drained().await;
}

/// The receiver's requests counted by `webhook-id`: (requests, distinct ids, the ids that came
/// more than once with their counts).
fn by_webhook_id(requests: &[Received]) -> (usize, usize, BTreeMap<String, usize>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for request in requests {
        let id = request.header("webhook-id").expect("a webhook-id header");
        *counts.entry(id.to_owned()).or_default() += 1;
    }
    let distinct = counts.len();
    counts.retain(|_, n| *n > 1);
    (requests.len(), distinct, counts)
}

/// Asserts that the receiver got exactly `events` requests, each `webhook-id` once, and that
/// the attempt log of `webhook_id` holds one attempt per request, printing its counts (and the
/// attempt log of any delivery sent more than once).
async fn assert_once_each(
    harness: &Harness,
    receiver: &Receiver,
    webhook_id: Uuid,
    events: usize,
    phase: &str,
) {
    let (requests, distinct, twice) = by_webhook_id(&receiver.requests());
    let logged = harness
        .db
        .count(&format!(
            "attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.webhook_id = '{webhook_id}'"
        ))
        .await;
    println!(
        "{phase}: {requests} requests, {distinct} webhook-ids, {logged} attempts logged, sent more than once: {twice:?}"
    );
    for id in twice.keys() {
        let detail = harness.detail(id.parse().unwrap()).await;
        let attempts: Vec<_> = detail
            .attempts
            .iter()
            .map(|a| (a.number, &a.trigger, a.success, a.status_code, &a.error))
            .collect();
        println!(
            "  {id}: {} {:?} replayed {}, attempts {attempts:?}",
            detail.delivery.event, detail.delivery.state, detail.delivery.replayed
        );
    }
    assert!(
        twice.is_empty(),
        "{phase}: webhook-ids sent more than once: {twice:?}"
    );
    assert_eq!(requests, events, "{phase}: one request per event");
    assert_eq!(
        logged, events as i64,
        "{phase}: one attempt logged per request"
    );
}

/// A replay since a time before the webhook existed delivers each matching event once, marked
/// replayed; a second replay of the same window delivers nothing new.
#[tokio::test]
async fn a_replay_delivers_each_past_event_once() {
    let harness = Harness::start(FAST_RETRY_DELAYS).await;
    let since = OffsetDateTime::now_utc() - time::Duration::minutes(1);
    for i in 0..5 {
        harness.open(&format!("past-{i}")).await;
    }
    harness.resolve("past-0").await;
    let receiver = Receiver::start_with(Behavior::Status(204)).await;
    let webhook = harness
        .webhook(
            &receiver.url("/late"),
            &[EventKind::IncidentOpened],
            5,
            5_000,
        )
        .await;
    let first = replay(&harness, webhook.id, since).await;
    let got = receiver.wait_for_requests(5, DEADLINE).await;
    let mut incidents: Vec<String> = got
        .iter()
        .map(|r| r.json()["data"]["title"].as_str().unwrap().to_owned())
        .collect();
    incidents.sort();
    incidents.dedup();
    assert_eq!(incidents.len(), 5, "each opened event once");
    wait_finished(&harness, first).await;
    // The events' own fan-out may still have been running when the webhook was created: what
    // it made, the replay did not make again; what the replay made is marked.
    let made = replays::get(&mut harness.conn().await, first)
        .await
        .unwrap()
        .created;
    let mine = harness.deliveries(webhook.id).await;
    assert_eq!(mine.len(), 5);
    assert_eq!(mine.iter().filter(|d| d.replayed).count() as i64, made);
    let second = replay(&harness, webhook.id, since).await;
    wait_finished(&harness, second).await;
    let second = replays::get(&mut harness.conn().await, second)
        .await
        .unwrap();
    assert_eq!(second.created, 0, "nothing new");
    harness.wait_drained().await;
    assert_eq!(receiver.count(), 5, "nothing new");
    harness.stop().await;
}

/// 600 events recorded before their webhook exists, and that webhook with its receiver.
struct Late {
    since: OffsetDateTime,
    events: usize,
    receiver: Receiver,
    webhook_id: Uuid,
}

/// Records `INCIDENTS` incidents' events (three each), then creates a webhook subscribed to
/// every kind, with a receiver answering 204.
async fn past_events_and_a_new_webhook(harness: &Harness) -> Late {
    let since = OffsetDateTime::now_utc() - time::Duration::minutes(1);
    incidents(harness, "past").await;
    let receiver = Receiver::start_with(Behavior::Status(204)).await;
    let webhook = harness
        .webhook(&receiver.url("/late"), &ALL, 5, 10_000)
        .await;
    Late {
        since,
        events: 3 * INCIDENTS,
        receiver,
        webhook_id: webhook.id,
    }
}

/// Waits until replay `id` finished and everything is sent, then asserts that the receiver
/// got `events` requests in all, each `webhook-id` once.
async fn settled_once_each(harness: &Harness, late: &Late, id: Uuid, events: usize, phase: &str) {
    wait_finished(harness, id).await;
    wait_settled(harness, late.webhook_id, events as i64).await;
    assert_once_each(harness, &late.receiver, late.webhook_id, events, phase).await;
}

/// 600 past events (200 incidents, each opened, changed and resolved, 16 at a time) replayed
/// to a new webhook reach its receiver once each by `webhook-id`; replaying the window again
/// sends nothing; replays asked for while 600 more events are being fanned out to the webhook
/// send nothing twice either.
#[tokio::test]
async fn a_replay_sends_each_event_once_however_often_it_is_asked_for() {
    let harness = Harness::start(FAST_RETRY_DELAYS).await;
    let late = past_events_and_a_new_webhook(&harness).await;
    let (since, events) = (late.since, late.events);
    let first = replay(&harness, late.webhook_id, since).await;
    settled_once_each(&harness, &late, first, events, "the first replay").await;
    let second = replay(&harness, late.webhook_id, since).await;
    settled_once_each(&harness, &late, second, events, "the same window again").await;

    // Replays, one after another, while the next events are recorded and fanned out: each
    // window ends when it is asked for, so it holds events whose own fan-out is under way.
    let mut asked = 0;
    let last = {
        let live = incidents(&harness, "live");
        tokio::pin!(live);
        loop {
            let id = replay(&harness, late.webhook_id, since).await;
            asked += 1;
            tokio::select! {
                () = &mut live => break id,
                () = wait_finished(&harness, id) => {}
            }
        }
    };
    println!("replays asked for while live events were fanned out: {asked}");
    settled_once_each(
        &harness,
        &late,
        last,
        2 * events,
        "replays during live fan-out",
    )
    .await;
    harness.stop().await;
}

/// The events' own fan-out and a replay race for the same deliveries: the events are recorded
/// while no dispatcher runs, the webhook is created and the replay asked for, and only then
/// does a dispatcher start, fanning out the backlog of events while its replay pass works
/// through the same window. Each event reaches the receiver once, whichever made its delivery.
#[tokio::test]
async fn a_replay_racing_the_events_own_fan_out_sends_each_event_once() {
    let mut harness = Harness::without_dispatcher(FAST_RETRY_DELAYS).await;
    let late = past_events_and_a_new_webhook(&harness).await;
    let (since, events) = (late.since, late.events);
    let first = replay(&harness, late.webhook_id, since).await;
    harness.add_dispatcher(|_| {}).await;
    settled_once_each(
        &harness,
        &late,
        first,
        events,
        "a replay racing the fan-out",
    )
    .await;
    let replayed = harness
        .db
        .count(&format!(
            "deliveries WHERE webhook_id = '{}' AND replayed",
            late.webhook_id
        ))
        .await;
    println!(
        "deliveries made by the replay: {replayed}, by the fan-out: {}",
        events as i64 - replayed
    );
    let second = replay(&harness, late.webhook_id, since).await;
    settled_once_each(&harness, &late, second, events, "the same window again").await;
    harness.stop().await;
}

/// The dispatcher's default limits (`TOCSIN_DISPATCHER_CONCURRENCY`,
/// `TOCSIN_WEBHOOK_CONCURRENCY`): more of a replay's first attempts arrive at once than the
/// webhook has slots, unlike at the test limits (32 and 32).
const DEFAULT_CONCURRENCY: u16 = 256;
const DEFAULT_WEBHOOK_CONCURRENCY: u16 = 64;

/// How long the receiver takes to answer in the test at the default limits: longer than
/// `slots::SLOT_WAIT` (250 ms), so that the webhook is not answering while its first requests
/// are under way, and the attempts that find no slot then wait (`webhook_busy`) for the
/// waiting pass instead of waiting for a slot in turn.
const SLOW_ANSWER: std::time::Duration = std::time::Duration::from_millis(300);

/// At the dispatcher's default limits, where a replay's first attempts outnumber the webhook's
/// slots, to a receiver slower than the slot wait (attempts that find no slot wait,
/// `webhook_busy`, for the waiting pass), and to a webhook that receives each incident's events
/// in order (each incident's later deliveries wait, `ordering`, and are started as the earlier
/// ones finish): 600 past events reach the receiver once each, one attempt each in the log;
/// replaying the window again sends nothing.
#[tokio::test]
async fn a_replay_to_an_ordered_webhook_at_the_default_limits_sends_each_event_once() {
    let mut harness = Harness::without_dispatcher(FAST_RETRY_DELAYS).await;
    let port = harness
        .add_dispatcher(|config| {
            config.concurrency = DEFAULT_CONCURRENCY;
            config.webhook_concurrency = DEFAULT_WEBHOOK_CONCURRENCY;
        })
        .await;
    let late = past_events_and_a_new_webhook(&harness).await;
    harness
        .set_ordering(late.webhook_id, WebhookOrdering::Incident)
        .await;
    late.receiver
        .set_behavior(Behavior::Delay(SLOW_ANSWER, 204));
    let (since, events) = (late.since, late.events);
    let first = replay(&harness, late.webhook_id, since).await;
    settled_once_each(&harness, &late, first, events, "the first replay").await;
    let waited: Vec<String> = common::metrics(port)
        .await
        .lines()
        .filter(|line| line.starts_with("tocsin_dispatcher_waited_total"))
        .map(str::to_owned)
        .collect();
    println!("waits: {waited:?}");
    let second = replay(&harness, late.webhook_id, since).await;
    settled_once_each(&harness, &late, second, events, "the same window again").await;
    harness.stop().await;
}
