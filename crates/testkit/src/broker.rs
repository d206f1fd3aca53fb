//! An AMQP prefix per test, and a look at the broker through its management API.

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};

/// The RabbitMQ tests use.
pub fn amqp_url() -> String {
    std::env::var("TOCSIN_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The management API base URL, with credentials.
pub fn management_api() -> String {
    std::env::var("TOCSIN_TEST_RABBITMQ_API")
        .unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15672".to_owned())
}

/// Checks once per process that the management API listens (see [`TestPrefix::new`]).
fn require_management_api() {
    static LISTENING: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    LISTENING.get_or_init(|| {
        let api = management_api();
        let address = reqwest::Url::parse(&api)
            .ok()
            .and_then(|url| url.socket_addrs(|| None).ok())
            .and_then(|addresses| addresses.into_iter().next());
        let listening = address.is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(5))
                .is_ok()
        });
        assert!(
            listening,
            "RabbitMQ's management API does not answer at {}: run the tests with \
             deploy/local/test, which enables it (or `rabbitmq-plugins enable \
             rabbitmq_management`); without it every test's retry queues are left behind",
            tocsin_domain::redact_url(&api)
        );
    });
}

/// A prefix of its own for one test. Its queues and exchanges are deleted on drop.
#[derive(Debug)]
pub struct TestPrefix {
    pub prefix: String,
}

impl TestPrefix {
    /// A new prefix. Panics when the management API does not answer: a test's retry queues are
    /// named after its schedule, so without the API they cannot be found to be deleted on drop,
    /// and the queues left behind by a whole run exhaust the broker's file handles.
    pub fn new() -> TestPrefix {
        require_management_api();
        TestPrefix {
            prefix: format!("test-{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// A queue's description from the management API (`arguments`, `messages`, ...).
    pub async fn queue_info(&self, name: &str) -> Option<serde_json::Value> {
        let url = format!("{}/api/queues/%2F/{}", management_api(), name);
        let response = reqwest::get(&url).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// Names of this prefix's queues that exist on the broker.
    pub async fn queue_names(&self) -> Vec<String> {
        let url = format!("{}/api/queues/%2F?columns=name", management_api());
        let Ok(response) = reqwest::get(&url).await else {
            return Vec::new();
        };
        let queues: Vec<serde_json::Value> = response.json().await.unwrap_or_default();
        queues
            .iter()
            .filter_map(|q| q["name"].as_str())
            .filter(|name| name.starts_with(&format!("{}.", self.prefix)))
            .map(str::to_owned)
            .collect()
    }
}

impl Default for TestPrefix {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestPrefix {
    fn drop(&mut self) {
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
                    .await
                    .ok()?;
                let probe = TestPrefix {
                    prefix: prefix.clone(),
                };
                let mut queues = probe.queue_names().await;
                std::mem::forget(probe);
                // Names we know even if the management API is not there.
                for suffix in ["events.fanout", "deliveries", "parking"] {
                    queues.push(format!("{prefix}.{suffix}"));
                }
                queues.sort();
                queues.dedup();
                for queue in queues {
                    // A failed delete closes the channel: use one per queue.
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                for exchange in ["events", "deliveries", "parking"] {
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .exchange_delete(
                                format!("{prefix}.{exchange}").as_str().into(),
                                ExchangeDeleteOptions::default(),
                            )
                            .await;
                    }
                }
                let _ = connection.close(200, "done".into()).await;
                Some(())
            })
        })
        .join();
    }
}
