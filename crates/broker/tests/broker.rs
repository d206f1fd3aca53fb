//! RabbitMQ against the real broker: the topology as the broker reports it, retry queues that
//! dead-letter back, unroutable publishes, a consumer that survives losing its connection, a
//! list of brokers, and the parking queue. (The outbox relay, which publishes through a broker
//! handle, is tested with the storage: `crates/storage/tests/storage/relay.rs`.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions};
use tocsin_broker::messages::{DeliveryMessage, AUTO_ATTEMPTS_HEADER};
use tocsin_broker::topology::DELIVERY_ROUTING_KEY;
use tocsin_broker::{
    header_int, header_str, run_consumer, Broker, ConsumerOptions, Outgoing, QueueType, Topology,
};
use tocsin_domain::{EventKind, RetrySchedule};
use tocsin_testkit::{amqp_url, wait_for, wait_until, TcpProxy, TestPrefix};
use tokio_util::sync::CancellationToken;

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

#[tokio::test]
async fn the_broker_reports_the_declared_topology() {
    let prefix = TestPrefix::new();
    let broker = broker_for(&prefix, RetrySchedule::DEFAULT_TEXT, "test");
    broker.check().await.expect("declaring the topology");
    let p = &prefix.prefix;

    for (name, ttl) in [
        ("1m", 60_000),
        ("5m", 300_000),
        ("30m", 1_800_000),
        ("2h", 7_200_000),
    ] {
        let queue = format!("{p}.retry.{name}");
        let info = wait_for("the retry queue in the management API", DEADLINE, || {
            prefix.queue_info(&queue)
        })
        .await;
        let args = &info["arguments"];
        assert_eq!(args["x-message-ttl"], ttl, "{name}: {args}");
        assert_eq!(args["x-dead-letter-exchange"], format!("{p}.deliveries"));
        assert_eq!(args["x-dead-letter-routing-key"], DELIVERY_ROUTING_KEY);
        assert_eq!(args["x-queue-type"], "quorum");
        assert_eq!(args["x-dead-letter-strategy"], "at-least-once");
        assert_eq!(info["durable"], true);
    }
    for queue in [format!("{p}.deliveries"), format!("{p}.events.fanout")] {
        let info = prefix.queue_info(&queue).await.expect("work queue exists");
        assert_eq!(info["arguments"]["x-delivery-limit"], 20, "{queue}");
        assert_eq!(
            info["arguments"]["x-dead-letter-exchange"],
            format!("{p}.parking")
        );
    }
    assert!(prefix.queue_info(&format!("{p}.parking")).await.is_some());
    assert!(
        prefix.queue_info(&format!("{p}.deferred")).await.is_none(),
        "no deferral queue any more"
    );
}

#[tokio::test]
async fn a_retry_queue_dead_letters_back_to_the_delivery_queue_with_headers_intact() {
    let prefix = TestPrefix::new();
    let broker = broker_for(&prefix, "0s,300ms", "test");
    let topology = broker.topology().clone();
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        AUTO_ATTEMPTS_HEADER.into(),
        lapin::types::AMQPValue::LongLongInt(2),
    );
    let sent = Instant::now();
    broker
        .publish(Outgoing {
            exchange: String::new(),
            routing_key: topology.retry_queue(Duration::from_millis(300)),
            body: b"{\"delivery_id\":\"00000000-0000-0000-0000-000000000000\"}".to_vec(),
            headers,
        })
        .await
        .expect("publishing to the retry queue");
    let back = wait_for(
        "the message back in the delivery queue",
        DEADLINE,
        || async { drain_queue(&broker, &topology.delivery_queue()).await.pop() },
    )
    .await;
    assert!(
        sent.elapsed() >= Duration::from_millis(300),
        "held for its TTL"
    );
    assert_eq!(header_int(&back.properties, AUTO_ATTEMPTS_HEADER), Some(2));
}

#[tokio::test]
async fn changing_the_schedule_does_not_fail_on_existing_queues() {
    let prefix = TestPrefix::new();
    broker_for(&prefix, "0s,1s,2s", "a").check().await.unwrap();
    broker_for(&prefix, "0s,3s", "b").check().await.unwrap();
    let names = prefix.queue_names().await;
    for delay in ["1s", "2s", "3s"] {
        assert!(
            names.contains(&format!("{}.retry.{delay}", prefix.prefix)),
            "{names:?}"
        );
    }
}

#[tokio::test]
async fn unroutable_publishes_are_errors() {
    let prefix = TestPrefix::new();
    let broker = broker_for(&prefix, "0s", "test");
    let error = broker
        .publish(Outgoing {
            exchange: broker.topology().events_exchange(),
            routing_key: "nowhere".into(),
            body: b"{}".to_vec(),
            headers: Default::default(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, tocsin_broker::BrokerError::Unroutable(_)),
        "{error}"
    );
}

#[tokio::test]
async fn a_consumer_keeps_working_after_losing_its_connection() {
    let prefix = TestPrefix::new();
    let proxy = TcpProxy::start("127.0.0.1:5672").await;
    let proxied = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    let consumer_broker = broker_at(&proxied, &prefix, "0s", "consumer");
    let direct = broker_for(&prefix, "0s", "producer");
    direct.check().await.unwrap();
    let received = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let cancel = CancellationToken::new();
    let options = ConsumerOptions {
        queue: direct.topology().delivery_queue(),
        prefetch: 4,
        tag: "test".into(),
        drain_timeout: Duration::from_secs(2),
    };
    let sink = received.clone();
    let consuming = tokio::spawn(run_consumer(
        consumer_broker,
        options,
        cancel.clone(),
        move |delivery| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(delivery.data.clone());
                let _ = delivery.ack(BasicAckOptions::default()).await;
            }
        },
    ));
    let send = |body: &'static str| {
        let direct = direct.clone();
        async move {
            direct
                .publish(Outgoing {
                    exchange: direct.topology().deliveries_exchange(),
                    routing_key: DELIVERY_ROUTING_KEY.into(),
                    body: body.as_bytes().to_vec(),
                    headers: Default::default(),
                })
                .await
                .unwrap()
        }
    };
    send("before").await;
    wait_until("the first message consumed", DEADLINE, || async {
        received.lock().unwrap().len() == 1
    })
    .await;

    proxy.cut();
    send("during").await;
    proxy.restore();
    send("after").await;
    wait_until(
        "both later messages consumed after reconnecting",
        DEADLINE,
        || async {
            let got = received.lock().unwrap();
            got.iter().any(|m| m == b"during") && got.iter().any(|m| m == b"after")
        },
    )
    .await;
    cancel.cancel();
    consuming.await.unwrap();
}

#[tokio::test]
async fn a_broker_list_skips_unreachable_addresses_and_moves_on_when_a_connection_drops() {
    let prefix = TestPrefix::new();
    let (one, two) = (
        TcpProxy::start("127.0.0.1:5672").await,
        TcpProxy::start("127.0.0.1:5672").await,
    );
    let list = format!(
        "amqp://guest:secret-never-printed@127.0.0.1:1/%2f, amqp://guest:guest@127.0.0.1:{}/%2f,amqp://guest:guest@127.0.0.1:{}/%2f",
        one.port(),
        two.port()
    );
    let broker = broker_at(&list, &prefix, "0s", "list");
    assert!(!format!("{broker:?}").contains("secret-never-printed"));
    broker.check().await.expect("the second address answers");
    // The node it uses goes away: the next call connects to another address of the list.
    one.cut();
    wait_until(
        "the broker reconnects through the third address",
        RECOVERY_DEADLINE,
        || {
            let broker = broker.clone();
            async move { broker.check().await.is_ok() }
        },
    )
    .await;
    // And round again, past the first (still unreachable) address.
    one.restore();
    two.cut();
    wait_until(
        "the broker reconnects through the second address",
        RECOVERY_DEADLINE,
        || {
            let broker = broker.clone();
            async move { broker.check().await.is_ok() }
        },
    )
    .await;
    broker.close().await;
}

#[tokio::test]
async fn parked_messages_are_listed_in_place_and_replayed_to_their_work_queues() {
    use tocsin_broker::messages::{EventMessage, PARKED_REASON_HEADER, TRIGGER_HEADER};
    use tocsin_broker::{ParkedBody, Replayed};
    let prefix = TestPrefix::new();
    let broker = broker_for(&prefix, "0s", "parking");
    let topology = broker.topology().clone();
    let event = EventMessage {
        event_id: uuid::Uuid::now_v7(),
        event: EventKind::IncidentOpened,
        incident_id: uuid::Uuid::now_v7(),
        test_webhook_id: None,
    };
    let delivery = DeliveryMessage {
        delivery_id: uuid::Uuid::now_v7(),
        webhook_id: None,
    };
    let mut delivery_headers = tocsin_broker::headers_from_json(&serde_json::json!({
        AUTO_ATTEMPTS_HEADER: 2,
        TRIGGER_HEADER: "manual",
        PARKED_REASON_HEADER: "not found in the database",
    }));
    delivery_headers.insert(
        "x-first-death-reason".into(),
        tocsin_broker::string_header("rejected"),
    );
    for (body, headers) in [
        (event.to_bytes(), Default::default()),
        (delivery.to_bytes(), delivery_headers),
        (b"not json".to_vec(), Default::default()),
    ] {
        broker
            .publish(Outgoing {
                exchange: topology.parking_exchange(),
                routing_key: String::new(),
                body,
                headers,
            })
            .await
            .unwrap();
    }

    let parked = broker.parked(10).await.unwrap();
    assert_eq!(parked.len(), 3);
    assert_eq!(parked[0].body, ParkedBody::Event(event.clone()));
    assert_eq!(parked[1].body, ParkedBody::Delivery(delivery.clone()));
    assert_eq!(
        parked[1].reason.as_deref(),
        Some("not found in the database")
    );
    assert_eq!(parked[2].body, ParkedBody::Unreadable);
    assert_eq!(
        broker.parked(10).await.unwrap().len(),
        3,
        "listing removes nothing"
    );

    assert_eq!(
        broker.replay_parked(10).await.unwrap(),
        Replayed {
            events: 1,
            deliveries: 1,
            left: 1
        }
    );
    let fanned = drain_queue(&broker, &topology.fanout_queue()).await;
    assert_eq!(fanned.len(), 1);
    assert_eq!(EventMessage::from_bytes(&fanned[0].data).unwrap(), event);
    let attempts = drain_queue(&broker, &topology.delivery_queue()).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        DeliveryMessage::from_bytes(&attempts[0].data).unwrap(),
        delivery
    );
    let properties = &attempts[0].properties;
    assert_eq!(header_int(properties, AUTO_ATTEMPTS_HEADER), Some(2));
    assert_eq!(
        header_str(properties, TRIGGER_HEADER).as_deref(),
        Some("manual")
    );
    assert_eq!(header_str(properties, PARKED_REASON_HEADER), None);
    assert_eq!(header_str(properties, "x-first-death-reason"), None);
    let left = broker.parked(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body, ParkedBody::Unreadable);
    broker.close().await;
}

#[tokio::test]
async fn a_message_returned_past_the_delivery_limit_is_parked_with_the_brokers_reason() {
    use tocsin_broker::topology::DELIVERY_LIMIT;
    let prefix = TestPrefix::new();
    let broker = broker_for(&prefix, "0s", "limit");
    let topology = broker.topology().clone();
    let delivery = DeliveryMessage {
        delivery_id: uuid::Uuid::now_v7(),
        webhook_id: None,
    };
    broker
        .publish(Outgoing {
            exchange: topology.deliveries_exchange(),
            routing_key: DELIVERY_ROUTING_KEY.into(),
            body: delivery.to_bytes(),
            headers: Default::default(),
        })
        .await
        .unwrap();
    // A consumer that crashes on it every time: taken and returned, again and again.
    let channel = broker.channel().await.unwrap();
    let mut returned = 0;
    while let Some(message) = channel
        .basic_get(
            topology.delivery_queue().as_str().into(),
            BasicGetOptions { no_ack: false },
        )
        .await
        .unwrap()
    {
        message
            .delivery
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
            .unwrap();
        returned += 1;
        assert!(returned <= DELIVERY_LIMIT + 1, "never parked");
    }
    assert_eq!(
        returned,
        DELIVERY_LIMIT + 1,
        "delivered {DELIVERY_LIMIT} times, then parked"
    );
    let parked = wait_for("the message in parking", DEADLINE, || async {
        let parked = broker.parked(10).await.unwrap();
        (!parked.is_empty()).then_some(parked)
    })
    .await;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].body,
        tocsin_broker::ParkedBody::Delivery(delivery)
    );
    assert_eq!(parked[0].reason.as_deref(), Some("delivery_limit"));
    assert_eq!(
        parked[0].from_queue.as_deref(),
        Some(topology.delivery_queue().as_str())
    );
    broker.close().await;
}

#[tokio::test]
async fn publishing_to_an_unreachable_broker_fails_quickly() {
    let prefix = TestPrefix::new();
    let broker = broker_at(
        "amqp://guest:guest@127.0.0.1:1/%2f",
        &prefix,
        "0s",
        "nowhere",
    );
    let started = Instant::now();
    assert!(broker.check().await.is_err());
    assert!(started.elapsed() < Duration::from_secs(6));
}
