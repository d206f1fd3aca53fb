//! A consumer loop that survives broker restarts: it (re)opens its consumer whenever the
//! connection is lost, hands each message to a handler as its own task (at most `prefetch` at a
//! time, as the broker sends no more unacked messages), and on stop cancels the consumer, lets
//! in-flight handlers finish within a bound, and closes the channel so the broker requeues
//! whatever was not acked.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::BasicCancelOptions;
use lapin::types::ShortString;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Broker;

/// What to consume and how.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub queue: String,
    pub prefetch: u16,
    /// Consumer tag, shown in the broker's management UI.
    pub tag: String,
    /// How long in-flight handlers may run after a stop before their messages are returned.
    pub drain_timeout: Duration,
}

/// Consumes `options.queue` until `cancel` fires. The handler must ack or reject each message.
pub async fn run_consumer<H, Fut>(
    broker: Broker,
    options: ConsumerOptions,
    cancel: CancellationToken,
    handler: H,
) where
    H: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut in_flight: JoinSet<()> = JoinSet::new();
    let mut backoff = Duration::from_millis(100);
    let mut current_channel = None;
    'session: loop {
        let opened = tokio::select! {
            _ = cancel.cancelled() => break 'session,
            opened = broker.consume(&options.queue, options.prefetch, &options.tag) => opened,
        };
        let (channel, mut consumer) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(queue = %options.queue, %error, "cannot consume; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => break 'session,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        tracing::info!(queue = %options.queue, prefetch = options.prefetch, "consuming");
        current_channel = Some(channel);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break 'session,
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        let handler = handler.clone();
                        in_flight.spawn(async move { handler(delivery).await });
                    }
                    Some(Err(error)) => {
                        tracing::warn!(queue = %options.queue, %error, "consumer lost its connection; reconnecting");
                        break;
                    }
                    None => {
                        tracing::warn!(queue = %options.queue, "consumer was cancelled by the broker; reconnecting");
                        break;
                    }
                },
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            }
        }
        current_channel = None;
    }
    // Stop: take no new messages, let in-flight handlers finish, return the rest.
    if let Some(channel) = &current_channel {
        let _ = channel
            .basic_cancel(
                ShortString::from(options.tag.as_str()),
                BasicCancelOptions::default(),
            )
            .await;
    }
    let drained = tokio::time::timeout(options.drain_timeout, async {
        while in_flight.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            queue = %options.queue,
            unfinished = in_flight.len(),
            "in-flight work did not finish within the drain bound; returning it to the broker"
        );
        in_flight.abort_all();
    }
    if let Some(channel) = current_channel {
        let _ = channel.close(200, ShortString::from("stopping")).await;
    }
}
