//! Per-webhook limit on requests in flight (`TOCSIN_WEBHOOK_CONCURRENCY`), so that one slow or
//! hanging target cannot take every attempt a dispatcher may make at once.
//!
//! An attempt takes one of its webhook's slots before it is claimed. When none is free, it
//! waits for one, in turn, for as long as the webhook is answering (one of its requests
//! finished within the last [`SLOT_WAIT`]): deliveries arrive in bursts, and a target that
//! answers frees slots within milliseconds. A webhook at its limit that is not answering is
//! busy: its delivery is `waiting` in the delivery log until a slot is free (`crate::waiting`),
//! and an attempt waiting here gives up as soon as the webhook stops answering.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use uuid::Uuid;

/// A webhook at its limit none of whose requests finished for this long is busy.
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
    /// When a request to the webhook last finished.
    last_freed: Option<Instant>,
}

impl Entry {
    fn answering(&self) -> bool {
        self.last_freed.is_some_and(|at| at.elapsed() < SLOT_WAIT)
    }
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

    /// A slot of `webhook`, at once or in turn while the webhook answers (see the module's
    /// doc); `None` when the webhook is busy.
    pub async fn take(self: &Arc<Self>, webhook: Uuid) -> Option<Slot> {
        let slots = {
            let mut webhooks = self.lock();
            let entry = webhooks.entry(webhook).or_insert_with(|| Entry {
                slots: Arc::new(Semaphore::new(self.limit)),
                last_freed: None,
            });
            if let Ok(permit) = entry.slots.clone().try_acquire_owned() {
                return Some(self.slot(permit, webhook));
            }
            if !entry.answering() {
                return None;
            }
            entry.slots.clone()
        };
        // One acquire, so that the attempt keeps its turn while it waits.
        let acquire = slots.acquire_owned();
        tokio::pin!(acquire);
        loop {
            match tokio::time::timeout(SLOT_WAIT, &mut acquire).await {
                Ok(Ok(permit)) => return Some(self.slot(permit, webhook)),
                Ok(Err(_closed)) => return None,
                Err(_) if !self.answering(webhook) => return None,
                Err(_) => {}
            }
        }
    }

    fn answering(&self, webhook: Uuid) -> bool {
        self.lock().get(&webhook).is_some_and(Entry::answering)
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit, webhook: Uuid) -> Slot {
        Slot {
            _permit: permit,
            webhook,
            owner: self.clone(),
        }
    }

    /// Webhooks busy now: no free slot, and not answering.
    pub fn busy(&self) -> Vec<Uuid> {
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.slots.available_permits() == 0 && !entry.answering())
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
        let second = slots.take(webhook).await.expect("a free slot");
        assert_eq!(slots.busy(), vec![webhook]);
        assert_eq!(slots.room(), vec![(webhook, 0)]);
        // Nothing has finished yet: not answering, so no wait.
        assert!(slots.take(webhook).await.is_none());
        drop(first);
        assert_eq!(slots.room(), vec![(webhook, 1)]);
        let _third = slots.take(webhook).await.expect("the freed slot");
        assert!(slots.busy().is_empty(), "it has just answered");
        // An attempt now waits for the next slot, and gets it when one is freed.
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        tokio::task::yield_now().await;
        drop(second);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_once_the_webhook_stops_answering() {
        let slots = WebhookSlots::new(1);
        let webhook = Uuid::now_v7();
        drop(slots.take(webhook).await.expect("a free slot"));
        let _held = slots.take(webhook).await.expect("a free slot");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        // Nothing finishes: SLOT_WAIT after the last answer, the waiter gives up, and the
        // webhook is busy.
        assert!(!waiter.await.unwrap(), "the wait ends without a slot");
        assert_eq!(slots.busy(), vec![webhook]);
        assert!(slots.take(webhook).await.is_none(), "busy: no wait");
        let other = Uuid::now_v7();
        assert!(slots.take(other).await.is_some(), "other webhooks are free");
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_webhook_answers_a_waiter_waits_past_slot_wait() {
        let slots = WebhookSlots::new(2);
        let webhook = Uuid::now_v7();
        let mut held = slots.take(webhook).await.expect("a free slot");
        let _other = slots.take(webhook).await.expect("a free slot");
        drop(slots.take(webhook).await); // none free and never answered: busy
                                         // The webhook answers every 200 ms for a second: a slot is freed and taken again at
                                         // once by the one ahead, so the waiter waits longer than SLOT_WAIT...
        drop(held);
        held = slots.take(webhook).await.expect("the slot just freed");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Some(entry) = slots.lock().get_mut(&webhook) {
                entry.last_freed = Some(Instant::now());
            }
        }
        // ...and gets its turn once one is free.
        drop(held);
        assert!(waiter.await.unwrap(), "the waiter got a slot");
    }
}
