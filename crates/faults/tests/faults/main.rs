//! The fault suite. Every scenario runs the services as separate processes (admin, ingest, two
//! dispatchers, their debug builds) with several webhooks under a steady stream of alerts (one
//! every 50 ms, each retried on 5xx and transport errors until accepted, as Alertmanager does),
//! injects one fault, streams on, and then checks:
//!
//! - 0 lost: every alert answered 202 reached every webhook's receiver;
//! - every delivery ended as its webhook must (succeeded, or failed after all its attempts);
//! - 0 unlogged requests: no receiver got more requests for a delivery than the delivery log
//!   shows attempts;
//! - no secret or token in any service's debug log or `/metrics`.
//!
//! Duplicates (a request answered 2xx again) are counted, not refused: delivery is at least
//! once. Recovery runs from the end of the fault (the killed process started again, the stopped
//! server accepting connections again; where nothing is brought back before the system must go
//! on, the kill itself) to the first delivery, at the healthy webhook, of an alert first sent
//! after that moment. Each scenario prints its row of the fault table and writes it
//! for `deploy/local/test`, which prints the whole table after the suite ([`tally::record`]).
//!
//! These tests stop and restart the shared PostgreSQL and RabbitMQ, or start a RabbitMQ cluster
//! and a PostgreSQL pair of their own: `deploy/local/test` runs them after every other test,
//! one at a time.

mod cluster;
mod stream;
mod system;
mod tally;

use std::time::{Duration, Instant};

use tocsin_testkit::{amqp_url, servers, wait_for, Behavior, Receiver, TestDb};

use cluster::{replicas, script, Servers};
use stream::{Stream, RECOVERY_DEADLINE};
use system::{standard_targets, System, TargetSpec};

/// Alerts accepted before the fault, and after recovery.
const ALERTS_BEFORE: usize = 40;
const ALERTS_AFTER: usize = 40;

/// Streams on after the fault, then settles, records the row, checks it and stops the system.
async fn finish(
    order: u8,
    scenario: &str,
    system: System,
    stream: Stream,
    recovery: Option<Duration>,
) {
    stream.wait_more(ALERTS_AFTER).await;
    let accepted = stream.finish().await;
    let tally = tally::settle(&system, &accepted).await;
    tally::record(order, scenario, &tally, recovery);
    tally::check(scenario, &tally);
    system.assert_no_secrets_leaked().await;
    system.stop();
}

/// The system on the machine's PostgreSQL (a database of the test's own) and RabbitMQ.
async fn on_local_servers(scenario: &str, db: &TestDb, targets: Vec<TargetSpec>) -> System {
    let mut system = System::start(scenario, db.url.clone(), amqp_url(), targets).await;
    system.start_workers(None).await;
    system
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_a_dispatcher_then_restart_it() {
    let db = TestDb::new().await;
    let mut system = on_local_servers("kill-dispatcher", &db, standard_targets().await).await;
    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    let fault_at = Instant::now();
    system.kill_dispatcher(0);
    let recovery = stream.wait_recovered(&system, fault_at).await;
    // The other dispatcher works alone for a while; then the first comes back.
    stream.wait_more(ALERTS_AFTER).await;
    system.start_dispatcher(0).await;
    finish(
        1,
        "SIGKILL one of two dispatchers, then restart it",
        system,
        stream,
        Some(recovery),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_ingest_then_restart_it() {
    let db = TestDb::new().await;
    let mut system = on_local_servers("kill-ingest", &db, standard_targets().await).await;
    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    system.kill_ingest();
    // The sender retries through the outage while ingest comes back.
    stream.wait_refused(5).await;
    let restarted_at = Instant::now();
    system.start_ingest().await;
    let recovery = stream.wait_recovered(&system, restarted_at).await;
    finish(
        2,
        "SIGKILL ingest, then restart it",
        system,
        stream,
        Some(recovery),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rabbitmq() {
    let db = TestDb::new().await;
    let system = on_local_servers("restart-rabbitmq", &db, standard_targets().await).await;
    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    servers::restart_rabbitmq().await;
    // From RabbitMQ accepting connections again.
    let recovery = stream.wait_recovered(&system, Instant::now()).await;
    assert_eq!(
        stream.refused(),
        0,
        "ingest keeps accepting while RabbitMQ is down (the outbox holds the events)"
    );
    finish(
        3,
        "restart RabbitMQ (one node)",
        system,
        stream,
        Some(recovery),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_postgresql_then_start_it() {
    let db = TestDb::new().await;
    let system = on_local_servers("stop-postgresql", &db, standard_targets().await).await;
    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    servers::stop_postgres().await;
    // Down until the sender has been refused for a while (about two seconds of retries):
    // ingest answers 503 while it cannot record an alert.
    stream.wait_refused(20).await;
    servers::start_postgres().await;
    // From PostgreSQL accepting connections again.
    let recovery = stream.wait_recovered(&system, Instant::now()).await;
    finish(
        4,
        "stop PostgreSQL (one server) for about 2 s",
        system,
        stream,
        Some(recovery),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_hang_answer_500_and_close_connections_then_recover() {
    let db = TestDb::new().await;
    let hanging = Receiver::start().await;
    hanging.script(std::iter::repeat_n(Behavior::Hang, 8));
    let flaky = Receiver::start().await;
    flaky.script(std::iter::repeat_n(Behavior::Status(500), 10));
    let closing = Receiver::start().await;
    closing.script(std::iter::repeat_n(Behavior::Close, 10));
    // Each misbehaving receiver's script is over long before a delivery's fifth attempt, 2.2 s
    // after its first: every delivery succeeds.
    let targets = vec![
        TargetSpec::succeeding("healthy", Receiver::start().await, 2_000),
        TargetSpec::succeeding("hanging", hanging, 1_000),
        TargetSpec::succeeding("flaky", flaky, 2_000),
        TargetSpec::succeeding("closing", closing, 2_000),
    ];
    let system = on_local_servers("targets", &db, targets).await;
    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    finish(
        5,
        "targets hang, answer 500 and close connections, then recover",
        system,
        stream,
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_rabbitmq_node_leading_the_delivery_queue_then_bring_it_back() {
    let cluster = Servers::start("rabbitmq-cluster");
    let db = TestDb::new().await;
    let urls = script("rabbitmq-cluster", &["urls"]).await;
    let mut system = System::start(
        "mq-node",
        db.url.clone(),
        urls.clone(),
        standard_targets().await,
    )
    .await;
    let queue = format!("{}.deliveries", system.prefix.prefix);
    assert_eq!(
        replicas(&queue).await,
        (3, 3),
        "the delivery queue has a replica on each node, all online"
    );
    let leader = script("rabbitmq-cluster", &["leader", &queue]).await;
    // Ingest and both dispatchers list the leader's node first, so that every publisher and
    // consumer of theirs is on the node that dies: the hardest case.
    let mut nodes: Vec<&str> = urls.split(',').collect();
    nodes.rotate_left(leader.parse::<usize>().unwrap() - 1);
    system.start_workers(Some(&nodes.join(","))).await;

    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    let fault_at = Instant::now();
    script("rabbitmq-cluster", &["kill", &leader]).await;
    let recovery = stream.wait_recovered(&system, fault_at).await;
    let new_leader = script("rabbitmq-cluster", &["leader", &queue]).await;
    assert_ne!(new_leader, leader, "another node leads the queue");
    // The node comes back and rejoins while the stream goes on.
    script("rabbitmq-cluster", &["start-node", &leader]).await;
    wait_for(
        "the restarted node's replica back online",
        RECOVERY_DEADLINE,
        || async { (replicas(&queue).await == (3, 3)).then_some(()) },
    )
    .await;
    let connections = system.broker_connections();
    assert!(
        connections.iter().all(|(_, n)| *n >= 2),
        "every worker connected again, to another node: {connections:?}"
    );
    finish(
        6,
        "SIGKILL the RabbitMQ node leading the delivery queue (3-node cluster), then restart it",
        system,
        stream,
        Some(recovery),
    )
    .await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_the_postgresql_primary_and_promote_the_standby() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    let pair = Servers::start("pg-standby");
    let database = format!("tocsin_faults_{}", uuid::Uuid::new_v4().simple());
    let mut conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1:5441/postgres")
        .await
        .unwrap();
    diesel::sql_query(format!("CREATE DATABASE {database}"))
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let url = script("pg-standby", &["url", &database]).await;
    let mut system = System::start("pg-primary", url, amqp_url(), standard_targets().await).await;
    system.start_workers(None).await;

    let stream = Stream::start(&system);
    stream.wait_more(ALERTS_BEFORE).await;
    let fault_at = Instant::now();
    script("pg-standby", &["kill"]).await;
    // The operator (or the failover manager) promotes the standby.
    script("pg-standby", &["promote"]).await;
    let recovery = stream.wait_recovered(&system, fault_at).await;
    finish(
        7,
        "SIGKILL the PostgreSQL primary, promote the synchronous standby",
        system,
        stream,
        Some(recovery),
    )
    .await;
    drop(pair);
}
