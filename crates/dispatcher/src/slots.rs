//! Per-webhook limit on requests in flight (`TOCSIN_WEBHOOK_CONCURRENCY`), so that one slow or
//! hanging target cannot take every attempt a dispatcher may make at once.
//!
//! An attempt takes one of its webhook's slots before it is claimed. When none is free, it waits
//! up to [`SLOT_WAIT`] for one, but only while the webhook is answering (one of its requests
//! finished within the last [`SLOT_WAIT`]) and fewer attempts than the limit already wait:
//! deliveries arrive in bursts, and a quick target frees slots within milliseconds. Otherwise
//! the webhook is busy and the delivery is `waiting` in the delivery log until a slot is free
//! (`crate::waiting`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use uuid::Uuid;

/// The longest an attempt waits for a slot of a webhook that is answering.
pub(crate) const SLOT_WAIT: Duration = Duration::from_millis(250);

/// Requests in flight per webhook, up to a limit.
#[derive(Debug)]
pub(crate) struct WebhookSlots {
    limit: usize,
    webhooks: Mutex<HashMap<Uuid, Entry>>,
}

#[derive(Debug)]
struct Entry {
    slots: Arc<Semaphore>,
    /// Attempts waiting for a slot.
    waiters: usize,
    /// When a request to the webhook last finished.
    last_freed: Option<Instant>,
}

/// One request's place; frees it when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    webhook: Uuid,
    owner: Arc<WebhookSlots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(entry) = self.owner.lock().get_mut(&self.webhook) {
            entry.last_freed = Some(Instant::now());
        }
    }
}

/// Counts a waiter while it waits, however the wait ends.
struct Waiter<'a> {
    slots: &'a WebhookSlots,
    webhook: Uuid,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(entry) = self.slots.lock().get_mut(&self.webhook) {
            entry.waiters -= 1;
        }
    }
}

impl WebhookSlots {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(WebhookSlots {
            limit: limit.max(1),
            webhooks: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Entry>> {
        self.webhooks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of `webhook`, at once or after a short wait (see the module's doc); `None` when
    /// the webhook is busy.
    pub async fn take(self: &Arc<Self>, webhook: Uuid) -> Option<Slot> {
        let slots = {
            let mut webhooks = self.lock();
            let entry = webhooks.entry(webhook).or_insert_with(|| Entry {
                slots: Arc::new(Semaphore::new(self.limit)),
                waiters: 0,
                last_freed: None,
            });
            if let Ok(permit) = entry.slots.clone().try_acquire_owned() {
                return Some(self.slot(permit, webhook));
            }
            let answering = entry.last_freed.is_some_and(|at| at.elapsed() < SLOT_WAIT);
            if !answering || entry.waiters >= self.limit {
                return None;
            }
            entry.waiters += 1;
            entry.slots.clone()
        };
        let _waiter = Waiter {
            slots: self,
            webhook,
        };
        match tokio::time::timeout(SLOT_WAIT, slots.acquire_owned()).await {
            Ok(Ok(permit)) => Some(self.slot(permit, webhook)),
            _ => None,
        }
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit, webhook: Uuid) -> Slot {
        Slot {
            _permit: permit,
            webhook,
            owner: self.clone(),
        }
    }

    /// Webhooks with no free slot now.
    pub fn busy(&self) -> Vec<Uuid> {
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.slots.available_permits() == 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The free slots of each webhook with any in use (any other has [`Self::limit`]).
    pub fn room(&self) -> Vec<(Uuid, i64)> {
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.slots.available_permits() < self.limit)
            .map(|(id, entry)| (*id, entry.slots.available_permits() as i64))
            .collect()
    }

    /// Slots per webhook.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_webhook_gets_its_limit_then_is_busy_until_it_answers() {
        let slots = WebhookSlots::new(2);
        let webhook = Uuid::now_v7();
        let first = slots.take(webhook).await.expect("a free slot");
        let _second = slots.take(webhook).await.expect("a free slot");
        assert_eq!(slots.busy(), vec![webhook]);
        assert_eq!(slots.room(), vec![(webhook, 0)]);
        // Nothing has finished yet: not answering, so no wait.
        assert!(slots.take(webhook).await.is_none());
        drop(first);
        assert_eq!(slots.room(), vec![(webhook, 1)]);
        let _third = slots.take(webhook).await.expect("the freed slot");
        // It has answered just now: an attempt waits for the next slot, and gets it when one
        // is freed within the wait.
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        tokio::task::yield_now().await;
        drop(_second);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_after_slot_wait_and_waiters_are_capped() {
        let slots = WebhookSlots::new(1);
        let webhook = Uuid::now_v7();
        drop(slots.take(webhook).await.expect("a free slot"));
        let _held = slots.take(webhook).await.expect("a free slot");
        let first = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        tokio::task::yield_now().await;
        // One waiter already: the limit of waiters is reached.
        assert!(slots.take(webhook).await.is_none());
        assert!(!first.await.unwrap(), "the wait ends without a slot");
        let other = Uuid::now_v7();
        assert!(slots.take(other).await.is_some(), "other webhooks are free");
    }
}
