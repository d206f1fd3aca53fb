//! The floor of the durable steps on an alert's way, measured on this machine: a PostgreSQL
//! commit (one row, `synchronous_commit = on`) and a RabbitMQ publish to a quorum queue, with
//! the time to its confirm and to its arrival at a consumer, each alone, one after the other.
//! An alert's first delivery waits for two commits (ingest's transaction, the fan-out) and one
//! publish's way to a consumer (the relay's to the dispatcher), so no build of Tocsin on this
//! machine delivers faster than their sum; the latency budget shows how far above it each
//! stage stands.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tocsin_domain::redact_url;

use crate::{Percentiles, Report};

/// Where the floor is measured, and how many times each step.
#[derive(Debug, Clone)]
pub struct FloorConfig {
    pub database_url: String,
    pub amqp_url: String,
    pub samples: usize,
    /// The pause before each sample (zero: back to back).
    pub interval: Duration,
}

/// Measures both steps; the report's figures are their p50 and p99 in milliseconds, and the
/// floor of the path (two commits and one publish's way to a consumer, at p50).
pub async fn floor(config: FloorConfig) -> anyhow::Result<Report> {
    let commit = commits(&config.database_url, config.samples, config.interval)
        .await
        .context("measuring commits")?;
    let (confirm, arrival) = publishes(&config.amqp_url, config.samples, config.interval)
        .await
        .context("measuring publishes")?;
    let mut report = Report::new("floor");
    for (name, figures) in [
        ("commit", &commit),
        ("publish to confirm", &confirm),
        ("publish to consumer", &arrival),
    ] {
        report.figures.insert(format!("{name} p50 ms"), figures.p50);
        report.figures.insert(format!("{name} p99 ms"), figures.p99);
    }
    report.figures.insert(
        "path floor p50 ms (2 commits + 1 publish to consumer)".into(),
        2.0 * commit.p50 + arrival.p50,
    );
    Ok(report)
}

async fn pause(interval: Duration) {
    if !interval.is_zero() {
        tokio::time::sleep(interval).await;
    }
}

fn percentiles(took: Vec<Duration>) -> anyhow::Result<Percentiles> {
    Percentiles::of(took.iter().map(|d| d.as_secs_f64() * 1000.0).collect())
        .context("no sample taken")
}

/// One-row inserts, each its own transaction, into a table made for it and dropped after.
async fn commits(
    database_url: &str,
    samples: usize,
    interval: Duration,
) -> anyhow::Result<Percentiles> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {}", redact_url(database_url)))?;
    let connection = tokio::spawn(connection);
    let table = format!("tocsin_bench_floor_{}", std::process::id());
    client
        .batch_execute(&format!(
            "SET synchronous_commit = on; CREATE TABLE {table} (n int)"
        ))
        .await?;
    let insert = client
        .prepare(&format!("INSERT INTO {table} VALUES ($1)"))
        .await?;
    let mut took = Vec::with_capacity(samples);
    let measured = async {
        for n in 0..samples {
            pause(interval).await;
            let at = Instant::now();
            client.execute(&insert, &[&(n as i32)]).await?;
            took.push(at.elapsed());
        }
        anyhow::Ok(())
    }
    .await;
    let dropped = client.batch_execute(&format!("DROP TABLE {table}")).await;
    drop(client);
    let _ = connection.await;
    measured?;
    dropped?;
    percentiles(took)
}

/// Persistent messages published one at a time to a quorum queue made for it and deleted
/// after, each waited for its confirm and for its arrival at a consumer on a connection of its
/// own: the times to the confirm and to the arrival.
async fn publishes(
    amqp_url: &str,
    samples: usize,
    interval: Duration,
) -> anyhow::Result<(Percentiles, Percentiles)> {
    let connect = || async {
        Connection::connect(amqp_url, ConnectionProperties::default())
            .await
            .with_context(|| format!("connecting to {}", redact_url(amqp_url)))
    };
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let queue = format!("tocsin-bench-floor-{}", std::process::id());
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await?;
    let consuming = connect().await?;
    let mut consumer = consuming
        .create_channel()
        .await?
        .basic_consume(
            queue.as_str().into(),
            "tocsin-bench-floor".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let mut confirmed = Vec::with_capacity(samples);
    let mut arrived = Vec::with_capacity(samples);
    let measured = async {
        for _ in 0..samples {
            pause(interval).await;
            let at = Instant::now();
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{}",
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?;
            let arrival = async {
                let delivery = consumer.next().await.context("the consumer ended")?;
                delivery?;
                anyhow::Ok(at.elapsed())
            };
            let confirm = async {
                confirm.await?;
                anyhow::Ok(at.elapsed())
            };
            let (confirm, arrival) = futures::try_join!(confirm, arrival)?;
            confirmed.push(confirm);
            arrived.push(arrival);
        }
        anyhow::Ok(())
    }
    .await;
    let _ = consuming.close(200, "done".into()).await;
    let deleted = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = connection.close(200, "done".into()).await;
    measured?;
    deleted?;
    Ok((percentiles(confirmed)?, percentiles(arrived)?))
}
