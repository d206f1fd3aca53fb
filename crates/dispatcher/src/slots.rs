//! Per-webhook limit on requests in flight (`TOCSIN_WEBHOOK_CONCURRENCY`), so that one slow or
//! hanging target cannot take every attempt a dispatcher may make at once.
//!
//! An attempt takes one of its webhook's slots before it is claimed. When none is free, it
//! waits for one, in turn, for as long as the webhook is answering (one of its requests got an
//! answer within the last [`SLOT_WAIT`]; a timeout or a broken connection is no answer):
//! deliveries arrive in bursts, and a target that answers frees slots within milliseconds. A
//! webhook at its limit that is not answering is busy: its delivery is `waiting` in the
//! delivery log until a slot is free (`crate::waiting`), and an attempt waiting here gives up as
//! soon as the webhook stops answering. The fan-out claims first attempts only for the room a
//! webhook that is not answering has ([`WebhookSlots::limited_room`]); an attempt claimed so
//! waits for its slot in turn, however long.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use uuid::Uuid;

/// A webhook at its limit none of whose requests got an answer for this long is busy.
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
    /// When a request to the webhook last got an answer.
    last_answer: Option<Instant>,
}

impl Entry {
    fn answering(&self) -> bool {
        self.last_answer.is_some_and(|at| at.elapsed() < SLOT_WAIT)
    }
}

/// One request's place; frees it when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    webhook: Uuid,
    owner: Arc<WebhookSlots>,
}

impl Slot {
    /// The request made in this slot got an answer (a status line, whatever the status).
    pub fn answered(&self) {
        if let Some(entry) = self.owner.lock().get_mut(&self.webhook) {
            entry.last_answer = Some(Instant::now());
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
            let entry = self.entry(&mut webhooks, webhook);
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

    /// A slot of `webhook` for an attempt claimed already: in turn, however long it takes (the
    /// requests in flight end within their timeout).
    pub async fn take_in_turn(self: &Arc<Self>, webhook: Uuid) -> Option<Slot> {
        let slots = {
            let mut webhooks = self.lock();
            self.entry(&mut webhooks, webhook).slots.clone()
        };
        let permit = slots.acquire_owned().await.ok()?;
        Some(self.slot(permit, webhook))
    }

    fn entry<'a>(&self, webhooks: &'a mut HashMap<Uuid, Entry>, webhook: Uuid) -> &'a mut Entry {
        webhooks.entry(webhook).or_insert_with(|| Entry {
            slots: Arc::new(Semaphore::new(self.limit)),
            last_answer: None,
        })
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

    /// The free slots of each webhook that is not answering (a webhook that answers gets its
    /// attempts in turn, however many; one not listed has no limit): how many first attempts
    /// a fan-out may claim for it now.
    pub fn limited_room(&self) -> Vec<(Uuid, i64)> {
        self.lock()
            .iter()
            .filter(|(_, entry)| !entry.answering())
            .map(|(id, entry)| (*id, entry.slots.available_permits() as i64))
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
        assert_eq!(slots.limited_room(), vec![(webhook, 0)]);
        assert_eq!(slots.room(), vec![(webhook, 0)]);
        // Nothing has answered yet: busy, so no wait.
        assert!(slots.take(webhook).await.is_none());
        // A request that ends without an answer (a timeout) frees its slot but does not make
        // the webhook answering.
        drop(first);
        assert_eq!(slots.limited_room(), vec![(webhook, 1)]);
        let third = slots.take(webhook).await.expect("the freed slot");
        assert!(slots.take(webhook).await.is_none(), "still busy");
        // One answers: the webhook is answering, its room unlimited, and an attempt waits for
        // the next slot and gets it when one is freed.
        third.answered();
        assert!(slots.limited_room().is_empty());
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        tokio::task::yield_now().await;
        drop(third);
        assert!(waiting.await.unwrap());
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_once_the_webhook_stops_answering() {
        let slots = WebhookSlots::new(1);
        let webhook = Uuid::now_v7();
        let answered = slots.take(webhook).await.expect("a free slot");
        answered.answered();
        drop(answered);
        let _held = slots.take(webhook).await.expect("a free slot");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(webhook).await.is_some() })
        };
        // Nothing answers: SLOT_WAIT after the last answer, the waiter gives up, and the
        // webhook is busy.
        assert!(!waiter.await.unwrap(), "the wait ends without a slot");
        assert_eq!(slots.limited_room(), vec![(webhook, 0)]);
        assert!(slots.take(webhook).await.is_none(), "busy: no wait");
        let other = Uuid::now_v7();
        assert!(slots.take(other).await.is_some(), "other webhooks are free");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_attempt_waits_for_its_slot_in_turn() {
        let slots = WebhookSlots::new(1);
        let webhook = Uuid::now_v7();
        let held = slots.take(webhook).await.expect("a free slot");
        let claimed = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take_in_turn(webhook).await.is_some() })
        };
        // Busy, not answering, for ten seconds: a claimed attempt still waits for its turn.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!claimed.is_finished());
        drop(held);
        assert!(claimed.await.unwrap(), "it gets the slot once freed");
    }
}
