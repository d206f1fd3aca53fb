//! The outbox relay against the real PostgreSQL and RabbitMQ: each event row to the events
//! exchange and each manual attempt to the delivery queue, exactly once, woken on commit and
//! caught up after a broker outage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use lapin::options::BasicGetOptions;
use prometheus::Registry;
use tocsin_broker::messages::{DeliveryMessage, EventMessage, TRIGGER_HEADER};
use tocsin_broker::{header_str, Broker, QueueType, Topology};
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::delivery::Trigger;
use tocsin_domain::{EventKind, RetrySettings, TargetUrl, WebhookName};
use tocsin_storage::deliveries;
use tocsin_storage::incidents::{self, AlertBody};
use tocsin_storage::outbox::{self, NewEvent};
use tocsin_storage::relay::OutboxRelay;
use tocsin_storage::webhooks::{self, NewWebhook};
use tocsin_testkit::deliveries::create_delivery;
use tocsin_testkit::{amqp_url, wait_until, TcpProxy, TestDb, TestPrefix};
use tokio_util::sync::CancellationToken;

use crate::common::signal;

const DEADLINE: Duration = Duration::from_secs(15);
/// How long a reconnection after an outage may take.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(60);

/// A handle on the broker at `url` (one address or a list), with the test's prefix and the
/// given retry schedule, made as the services make theirs (connection named `tocsin-<name>`).
fn broker_at(url: &str, prefix: &TestPrefix, delays: &str, name: &str) -> Broker {
    let topology = Topology::new(&prefix.prefix, &delays.parse().unwrap(), QueueType::Quorum);
    Broker::new(url, topology, &format!("tocsin-{name}"))
}

/// A handle on the test broker.
fn broker_for(prefix: &TestPrefix, delays: &str, name: &str) -> Broker {
    broker_at(&amqp_url(), prefix, delays, name)
}

/// Opens an incident; returns its `incidents.opened` event.
async fn open_incident(db: &TestDb, key: &str) -> NewEvent {
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let signals = [signal(key, AlertAction::Trigger)];
    tocsin_testkit::apply_signals(&mut conn, &signals, outbox::Wake::Listeners)
        .await
        .unwrap()[0]
        .events[0]
        .clone()
}

/// A webhook for `incidents.opened`.
async fn subscribe(db: &TestDb) -> uuid::Uuid {
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let new = NewWebhook {
        name: WebhookName::parse("opened").unwrap(),
        url: TargetUrl::parse("https://example.com/").unwrap(),
        events: [EventKind::IncidentOpened].into_iter().collect(),
        retry: RetrySettings::default(),
        enabled: true,
        filters: Default::default(),
        headers: Default::default(),
        rate_limit: None,
        ordering: Default::default(),
    };
    webhooks::create(&mut conn, &new).await.unwrap().id
}

/// A broker handle and a relay over it, drained by hand (its fallback poll is not running).
fn broker_and_relay(db: &TestDb, prefix: &TestPrefix) -> (Broker, OutboxRelay) {
    let broker = broker_for(prefix, "0s", "test");
    let relay = OutboxRelay::new(
        db.pool(),
        broker.clone(),
        &db.url,
        Duration::from_secs(1),
        &Registry::new(),
    )
    .unwrap();
    (broker, relay)
}

/// Takes every message waiting in a queue.
async fn drain_queue(broker: &Broker, queue: &str) -> Vec<lapin::message::Delivery> {
    let channel = broker.channel().await.unwrap();
    let mut got = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        got.push(message.delivery);
    }
    got
}

/// An event's outbox row goes to the events exchange, whose fan-out queue receives its
/// [`EventMessage`], once; whether anyone subscribes is the dispatchers' business.
#[tokio::test]
async fn the_relay_publishes_an_event_row_to_the_events_exchange_exactly_once() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let (broker, relay) = broker_and_relay(&db, &prefix);
    let event = open_incident(&db, "once").await;

    assert_eq!(relay.drain().await.unwrap(), 1);
    assert_eq!(
        relay.drain().await.unwrap(),
        0,
        "a published row is not published again"
    );
    let topology = broker.topology();
    let messages = drain_queue(&broker, &topology.fanout_queue()).await;
    assert_eq!(messages.len(), 1);
    let message = EventMessage::from_bytes(&messages[0].data).unwrap();
    assert_eq!(message, event.message());
    assert_eq!(message.event, EventKind::IncidentOpened);
    assert_eq!(message.test_webhook_id, None);
    assert!(drain_queue(&broker, &topology.delivery_queue())
        .await
        .is_empty());
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);
}

/// The headers of an alert body (the trace context of the request that brought it) travel with
/// its events: stored on their outbox rows, by the one-statement opening and by the
/// transaction alike, and published as the messages' headers; a body without headers gives
/// messages without them.
#[tokio::test]
async fn an_alert_bodys_headers_travel_on_its_event_messages() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let (broker, relay) = broker_and_relay(&db, &prefix);
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let traced = |n: u8| {
        serde_json::json!({
            "traceparent": format!("00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01"),
        })
    };
    let body = |signals, headers| AlertBody {
        signals,
        headers,
        token: None,
    };
    // Triggers for new keys: opened by the one statement.
    let opened = incidents::apply_alerts(
        &mut conn,
        &[
            body(
                vec![signal("traced", AlertAction::Trigger)],
                Some(traced(1)),
            ),
            body(vec![signal("plain", AlertAction::Trigger)], None),
        ],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    let opened: Vec<_> = opened.into_iter().map(Result::unwrap).collect();
    assert_eq!(opened[0][0].events[0].headers, Some(traced(1)));
    assert_eq!(opened[1][0].events[0].headers, None);
    // An acknowledge: applied in a transaction.
    let acknowledged = incidents::apply_alerts(
        &mut conn,
        &[body(
            vec![signal("traced", AlertAction::Acknowledge)],
            Some(traced(2)),
        )],
        outbox::Wake::Listeners,
    )
    .await
    .unwrap();
    assert_eq!(
        acknowledged[0].as_ref().unwrap()[0].events[0].headers,
        Some(traced(2))
    );

    assert_eq!(relay.drain().await.unwrap(), 3);
    let messages = drain_queue(&broker, &broker.topology().fanout_queue()).await;
    let traceparents: Vec<Option<String>> = messages
        .iter()
        .map(|m| header_str(&m.properties, "traceparent"))
        .collect();
    let expected = |n: u8| traced(n)["traceparent"].as_str().map(str::to_owned);
    assert_eq!(traceparents, [expected(1), None, expected(2)]);
}

/// A manual attempt's outbox row goes to the delivery queue with its trigger header, not to the
/// events exchange.
#[tokio::test]
async fn the_relay_publishes_a_delivery_row_to_the_delivery_queue() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let (broker, relay) = broker_and_relay(&db, &prefix);
    let webhook = subscribe(&db).await;
    let event = open_incident(&db, "manual").await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let delivery_id =
        create_delivery(&mut conn, event.id, event.kind, event.incident_id, webhook).await;
    assert_eq!(relay.drain().await.unwrap(), 1, "the event");
    let topology = broker.topology();
    assert_eq!(
        drain_queue(&broker, &topology.fanout_queue()).await.len(),
        1
    );

    outbox::enqueue_attempt(&mut conn, &[delivery_id], Trigger::Manual)
        .await
        .unwrap();
    assert_eq!(relay.drain().await.unwrap(), 1, "the manual attempt");
    let messages = drain_queue(&broker, &topology.delivery_queue()).await;
    assert_eq!(messages.len(), 1);
    let message = DeliveryMessage::from_bytes(&messages[0].data).unwrap();
    assert_eq!(message.delivery_id, delivery_id);
    assert_eq!(
        header_str(&messages[0].properties, TRIGGER_HEADER).as_deref(),
        Some("manual")
    );
    assert!(drain_queue(&broker, &topology.fanout_queue())
        .await
        .is_empty());
    let delivery = deliveries::get(&mut conn, delivery_id).await.unwrap();
    assert_eq!(delivery.webhook_id, webhook);
    assert_eq!(outbox::backlog(&mut conn).await.unwrap(), 0);
}

#[tokio::test]
async fn the_relay_wakes_on_commit_and_catches_up_after_a_broker_outage() {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let proxy = TcpProxy::start("127.0.0.1:5672").await;
    let proxied = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    let direct = broker_for(&prefix, "0s", "observer");
    direct.check().await.unwrap();
    let relay = OutboxRelay::new(
        db.pool(),
        broker_at(&proxied, &prefix, "0s", "relay"),
        &db.url,
        Duration::from_secs(60),
        &Registry::new(),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.clone().run(cancel.clone()));

    // Woken by NOTIFY from another connection, with the fallback poll a minute away.
    open_incident(&db, "first").await;
    let queue = direct.topology().fanout_queue();
    let seen = AtomicUsize::new(0);
    wait_until("the first event published", DEADLINE, || async {
        let n = drain_queue(&direct, &queue).await.len();
        seen.fetch_add(n, Ordering::SeqCst) + n == 1
    })
    .await;

    // The broker goes away; an incident is committed meanwhile.
    proxy.cut();
    open_incident(&db, "during-outage").await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    wait_until("the relay to try and fail", DEADLINE, || async {
        relay_failed(&relay).await
    })
    .await;
    assert_eq!(
        outbox::backlog(&mut conn).await.unwrap(),
        1,
        "the row waits"
    );

    proxy.restore();
    let after = AtomicUsize::new(0);
    // Reconnecting takes the relay's and the broker handle's back-offs (up to 5 s each), longer
    // on a loaded machine.
    wait_until(
        "the event published after the outage",
        RECOVERY_DEADLINE,
        || async {
            let n = drain_queue(&direct, &queue).await.len();
            after.fetch_add(n, Ordering::SeqCst) + n >= 1
        },
    )
    .await;
    // The relay marks the row in the transaction that published it, which commits just after
    // the broker confirmed the message.
    wait_until("the row marked published", DEADLINE, || async {
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        outbox::backlog(&mut conn).await.unwrap() == 0
    })
    .await;
    cancel.cancel();
    running.await.unwrap();
    assert_eq!(
        drain_queue(&direct, &queue).await.len(),
        0,
        "nothing published twice"
    );
    assert_eq!(after.load(Ordering::SeqCst), 1);
}

async fn relay_failed(relay: &OutboxRelay) -> bool {
    relay.drain().await.is_err()
}

/// Rows handed over at commit (ingest's way, `Wake::HandOver`) are published by the relay they
/// were handed to, without a claim, and marked published, from either way an alert is written
/// (the statement that opens new keys, the transaction); while held, no claim takes them, and
/// once the hold is over any relay does (their process stopped before publishing them).
#[tokio::test]
async fn rows_handed_over_go_out_through_their_relay_and_a_lost_hand_over_is_claimed_once_its_hold_is_over(
) {
    let db = TestDb::new().await;
    let prefix = TestPrefix::new();
    let (broker, relay) = broker_and_relay(&db, &prefix);
    let queue = broker.topology().fanout_queue();
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let handed = outbox::Wake::HandOver(relay.waker());
    let mut sent = Vec::new();
    for action in [AlertAction::Trigger, AlertAction::Acknowledge] {
        let outcomes =
            tocsin_testkit::apply_signals(&mut conn, &[signal("handed", action)], handed.clone())
                .await
                .unwrap();
        sent.push(outcomes[0].events[0].id);
        assert_eq!(relay.drain().await.unwrap(), 0, "held from claims");
        assert_eq!(relay.publish_handed().await.unwrap(), 1);
    }
    let got: Vec<uuid::Uuid> = drain_queue(&broker, &queue)
        .await
        .iter()
        .map(|m| EventMessage::from_bytes(&m.data).unwrap().event_id)
        .collect();
    assert_eq!(got, sent);
    assert_eq!(
        db.count("outbox WHERE published_at IS NOT NULL AND held_until IS NULL")
            .await,
        2
    );

    // Handed to a relay that never takes them: held, then claimed by any relay.
    let lost = outbox::Wake::HandOver(Default::default());
    tocsin_testkit::apply_signals(&mut conn, &[signal("lost", AlertAction::Trigger)], lost)
        .await
        .unwrap();
    assert_eq!(relay.drain().await.unwrap(), 0, "held from claims");
    assert_eq!(relay.publish_handed().await.unwrap(), 0, "handed elsewhere");
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE outbox SET held_until = now() - interval '1 second' WHERE held_until IS NOT NULL",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    assert_eq!(
        relay.drain().await.unwrap(),
        1,
        "claimed once the hold is over"
    );
    assert_eq!(drain_queue(&broker, &queue).await.len(), 1);
}
