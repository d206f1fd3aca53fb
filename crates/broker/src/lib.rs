//! Tocsin's broker: everything that talks to RabbitMQ, through lapin. The topology under a
//! prefix ([`topology`]), the messages and headers passed through it ([`messages`]), the
//! parking queue ([`parking`]), a consumer loop that survives broker restarts, and the
//! [`Broker`] handle: it (re)connects on demand and declares the topology, publishes with
//! publisher confirms (a nack or an unroutable return is an error), and opens manual-ack
//! consumers with a prefetch. The values it carries are `tocsin-domain`'s; it knows nothing of
//! PostgreSQL (`tocsin-storage` depends on it, as the outbox relay publishes through it).
//!
//! `AMQP_URL` may list several brokers (the nodes of a cluster), comma-separated. The handle
//! connects to the first that answers, starting with the one it last used; when that
//! connection drops, it starts with the next one, so a dead node is skipped at once.

mod consumer;
pub mod messages;
pub mod parking;
pub mod topology;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use tokio::sync::Mutex;

pub use consumer::{run_consumer, ConsumerOptions};
pub use parking::{Parked, ParkedBody, Replayed};
pub use topology::{QueueType, Topology};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long declaring the topology on a new connection may take (a cluster electing queue
/// leaders answers late).
const SETUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a broker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot reach RabbitMQ: {0}")]
    Connect(String),
    #[error("RabbitMQ did not answer in time")]
    Timeout,
    #[error("RabbitMQ refused the message (nack)")]
    Nacked,
    #[error("RabbitMQ returned the message as unroutable: {0}")]
    Unroutable(String),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
}

/// A message to publish.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub headers: FieldTable,
}

#[derive(Clone)]
struct Live {
    connection: Arc<Connection>,
    publisher: Channel,
    /// Which of the addresses it is connected to.
    address: usize,
}

impl Live {
    fn healthy(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }
}

/// A shared handle on the broker. Cloning is cheap; clones share one connection.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The brokers' addresses, in the order `AMQP_URL` lists them.
    urls: Vec<String>,
    /// The address tried first on the next connect.
    preferred: AtomicUsize,
    name: String,
    topology: Topology,
    live: Mutex<Option<Live>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("urls", &self.redacted_urls())
            .field("prefix", &self.inner.topology.prefix())
            .finish()
    }
}

impl Broker {
    /// A handle that connects on first use. `url` is one AMQP URL or several, comma-separated
    /// (see [`addresses`]). `name` shows in the broker's connection list.
    pub fn new(url: &str, topology: Topology, name: &str) -> Self {
        Broker {
            inner: Arc::new(Inner {
                urls: addresses(url),
                preferred: AtomicUsize::new(0),
                name: name.to_owned(),
                topology,
                live: Mutex::new(None),
            }),
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// The addresses, passwords hidden, for logs.
    fn redacted_urls(&self) -> Vec<String> {
        self.inner
            .urls
            .iter()
            .map(|url| tocsin_domain::redact_url(url))
            .collect()
    }

    /// The live connection, connecting and declaring the topology when there is none. Tries
    /// each address once, from the preferred one on.
    async fn live(&self) -> Result<Live, BrokerError> {
        let mut guard = self.inner.live.lock().await;
        if let Some(live) = guard.as_ref() {
            if live.healthy() {
                return Ok(live.clone());
            }
            // The connection dropped: start with another node.
            self.move_past(live.address);
        }
        *guard = None;
        let count = self.inner.urls.len();
        let first = self.inner.preferred.load(Ordering::Relaxed) % count;
        let mut failures = Vec::new();
        for address in (first..count).chain(0..first) {
            match self.connect(address).await {
                Ok(live) => {
                    self.inner.preferred.store(address, Ordering::Relaxed);
                    *guard = Some(live.clone());
                    return Ok(live);
                }
                Err(error) => {
                    let url = tocsin_domain::redact_url(&self.inner.urls[address]);
                    if count > 1 {
                        tracing::warn!(broker = %url, %error, "cannot connect to this RabbitMQ; trying the next address");
                    }
                    failures.push((url, error));
                }
            }
        }
        match failures.len() {
            1 => Err(failures.remove(0).1),
            _ => Err(BrokerError::Connect(
                failures
                    .iter()
                    .map(|(url, error)| format!("{url}: {error}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
        }
    }

    /// Makes `address + 1` the first address tried next, unless another caller already moved on.
    fn move_past(&self, address: usize) {
        let next = (address + 1) % self.inner.urls.len();
        let _ = self.inner.preferred.compare_exchange(
            address,
            next,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Connects to one address, declares the topology and opens the confirming publisher.
    async fn connect(&self, address: usize) -> Result<Live, BrokerError> {
        let url = &self.inner.urls[address];
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.inner.name.as_str()));
        let connection =
            tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, properties))
                .await
                .map_err(|_| BrokerError::Timeout)?
                .map_err(|e| BrokerError::Connect(e.to_string()))?;
        let declared = async {
            let publisher = connection.create_channel().await?;
            self.inner.topology.declare(&publisher).await?;
            publisher
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            lapin::Result::Ok(publisher)
        };
        let publisher = match tokio::time::timeout(SETUP_TIMEOUT, declared).await {
            Ok(Ok(publisher)) => publisher,
            failed => {
                let _ = connection
                    .close(200, ShortString::from("setup failed"))
                    .await;
                return Err(match failed {
                    Ok(Err(error)) => error.into(),
                    _ => BrokerError::Timeout,
                });
            }
        };
        tracing::info!(
            broker = %tocsin_domain::redact_url(url),
            prefix = self.inner.topology.prefix(),
            "connected to RabbitMQ and declared the topology"
        );
        Ok(Live {
            connection: Arc::new(connection),
            publisher,
            address,
        })
    }

    /// Forgets a connection that failed, so the next call reconnects.
    async fn invalidate(&self, failed: &Live) {
        let mut guard = self.inner.live.lock().await;
        if guard
            .as_ref()
            .is_some_and(|live| Arc::ptr_eq(&live.connection, &failed.connection))
        {
            *guard = None;
            self.move_past(failed.address);
        }
    }

    /// Readiness: proves the broker answers with a round trip (opening and closing a channel),
    /// reconnecting once if the connection it had turns out to be dead.
    pub async fn check(&self) -> Result<(), BrokerError> {
        let live = self.live().await?;
        let round_trip = async {
            let channel = live.connection.create_channel().await?;
            channel.close(200, ShortString::from("readiness")).await
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, round_trip).await {
            Ok(Ok(())) => Ok(()),
            _ => {
                self.invalidate(&live).await;
                self.live().await.map(|_| ())
            }
        }
    }

    /// Publishes one message and waits for its confirm.
    pub async fn publish(&self, message: Outgoing) -> Result<(), BrokerError> {
        self.publish_all(std::slice::from_ref(&message)).await
    }

    /// Publishes messages pipelined on one channel, then waits for every confirm. Succeeds only
    /// when the broker acked all of them and routed each to a queue.
    pub async fn publish_all(&self, messages: &[Outgoing]) -> Result<(), BrokerError> {
        if messages.is_empty() {
            return Ok(());
        }
        let live = self.live().await?;
        let result = Self::publish_on(&live.publisher, messages).await;
        if result.is_err() && !live.healthy() {
            self.invalidate(&live).await;
        }
        result
    }

    async fn publish_on(channel: &Channel, messages: &[Outgoing]) -> Result<(), BrokerError> {
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type(ShortString::from("application/json"))
                .with_headers(message.headers.clone());
            let confirm = channel
                .basic_publish(
                    ShortString::from(message.exchange.as_str()),
                    ShortString::from(message.routing_key.as_str()),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.body,
                    properties,
                )
                .await?;
            confirms.push(confirm);
        }
        let outcomes = tokio::time::timeout(CONFIRM_TIMEOUT, futures::future::join_all(confirms))
            .await
            .map_err(|_| BrokerError::Timeout)?;
        for outcome in outcomes {
            match outcome? {
                Confirmation::Ack(None) => {}
                Confirmation::Ack(Some(returned)) => {
                    return Err(BrokerError::Unroutable(format!(
                        "{} {}",
                        returned.reply_code, returned.reply_text
                    )))
                }
                Confirmation::Nack(_) | Confirmation::NotRequested => {
                    return Err(BrokerError::Nacked)
                }
            }
        }
        Ok(())
    }

    /// Opens a manual-ack consumer on its own channel with the given prefetch.
    pub async fn consume(
        &self,
        queue: &str,
        prefetch: u16,
        tag: &str,
    ) -> Result<(Channel, Consumer), BrokerError> {
        let live = self.live().await?;
        let opened = async {
            let channel = live.connection.create_channel().await?;
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    ShortString::from(queue),
                    ShortString::from(tag),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            lapin::Result::Ok((channel, consumer))
        }
        .await;
        if opened.is_err() && !live.healthy() {
            self.invalidate(&live).await;
        }
        Ok(opened?)
    }

    /// Messages waiting in each of the topology's queues (ready, not yet delivered to a
    /// consumer), read with passive declares. A queue that cannot be read is left out.
    pub async fn queue_depths(&self) -> Result<Vec<(String, u32)>, BrokerError> {
        let live = self.live().await?;
        let mut depths = Vec::new();
        for queue in self.inner.topology.queues() {
            // A failed passive declare closes its channel: one channel per queue.
            let channel = live.connection.create_channel().await?;
            let declared = channel
                .queue_declare(
                    ShortString::from(queue.as_str()),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..lapin::options::QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            if let Ok(declared) = declared {
                depths.push((queue, declared.message_count()));
                let _ = channel.close(200, ShortString::from("depth read")).await;
            }
        }
        Ok(depths)
    }

    /// A fresh channel on the live connection (for tests and tools).
    pub async fn channel(&self) -> Result<Channel, BrokerError> {
        let live = self.live().await?;
        Ok(live.connection.create_channel().await?)
    }

    /// Closes the connection, if any.
    pub async fn close(&self) {
        if let Some(live) = self.inner.live.lock().await.take() {
            let _ = live.connection.close(200, ShortString::from("bye")).await;
        }
    }
}

/// The broker addresses of an `AMQP_URL`: one URL, or several separated by commas (spaces
/// around them allowed). A comma inside a password must be percent-encoded (`%2C`). An empty
/// list yields the one empty address, which fails to connect with lapin's own message.
pub fn addresses(url: &str) -> Vec<String> {
    let list: Vec<String> = url
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(str::to_owned)
        .collect();
    if list.is_empty() {
        vec![url.to_owned()]
    } else {
        list
    }
}

/// A string header.
pub fn string_header(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Reads a header as text, whatever string type it was sent as.
pub fn header_str(properties: &BasicProperties, name: &str) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Reads a header as an integer, whatever integer type it was sent as.
pub fn header_int(properties: &BasicProperties, name: &str) -> Option<i64> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).parse().ok(),
        _ => None,
    }
}

/// Converts a JSON object of strings and integers (as stored in the outbox) to AMQP headers.
pub fn headers_from_json(value: &serde_json::Value) -> FieldTable {
    let mut table = FieldTable::default();
    if let Some(object) = value.as_object() {
        for (key, value) in object {
            let converted = match value {
                serde_json::Value::String(s) => string_header(s),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => AMQPValue::LongLongInt(i),
                    None => continue,
                },
                serde_json::Value::Bool(b) => AMQPValue::Boolean(*b),
                _ => continue,
            };
            table.insert(ShortString::from(key.as_str()), converted);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amqp_url_lists_split_on_commas() {
        assert_eq!(
            addresses("amqp://guest:guest@127.0.0.1:5672/%2f"),
            vec!["amqp://guest:guest@127.0.0.1:5672/%2f"]
        );
        assert_eq!(
            addresses("amqp://a@h1:5672/%2f, amqp://a@h2:5673/%2f,,"),
            vec!["amqp://a@h1:5672/%2f", "amqp://a@h2:5673/%2f"]
        );
        assert_eq!(addresses(""), vec![""]);
    }

    #[test]
    fn headers_convert_from_json_and_read_back() {
        let table = headers_from_json(&serde_json::json!({"a": "x", "n": 3, "skip": [1]}));
        let properties = BasicProperties::default().with_headers(table);
        assert_eq!(header_str(&properties, "a").as_deref(), Some("x"));
        assert_eq!(header_int(&properties, "n"), Some(3));
        assert_eq!(header_str(&properties, "skip"), None);
        assert_eq!(header_int(&properties, "missing"), None);
    }
}
