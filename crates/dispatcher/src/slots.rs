//! Per-webhook limit on requests in flight, so that one slow or hanging target cannot take
//! every delivery slot of a dispatcher (DESIGN §2, isolation).
//!
//! An attempt whose webhook is at its limit waits for a slot when the webhook is quick
//! (deliveries arrive in bursts, and a quick target frees slots within milliseconds). When the
//! oldest request in flight to it has run for [`SLOW_AFTER`] already, the webhook is slow, and
//! the attempt is not made now: its message waits in the deferral queue and comes back, so it
//! holds no delivery slot meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;
use uuid::Uuid;

/// A webhook at its limit whose oldest request in flight is this old counts as slow.
pub(crate) const SLOW_AFTER: Duration = Duration::from_millis(250);
/// The longest an attempt waits for a slot of a webhook that is not slow.
pub(crate) const SLOT_WAIT: Duration = Duration::from_secs(1);

/// Requests in flight per webhook, up to a limit.
#[derive(Debug)]
pub(crate) struct WebhookSlots {
    limit: usize,
    webhooks: Mutex<HashMap<Uuid, Arc<Webhook>>>,
}

#[derive(Debug, Default)]
struct Webhook {
    /// Start of each request in flight, by a sequence number (the first is the oldest).
    in_flight: Mutex<InFlight>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct InFlight {
    started: BTreeMap<u64, Instant>,
    next: u64,
}

/// A taken slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Slot {
    webhook: Arc<Webhook>,
    number: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.webhook.in_flight).started.remove(&self.number);
        self.webhook.freed.notify_one();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl WebhookSlots {
    pub fn new(limit: usize) -> Self {
        WebhookSlots {
            limit: limit.max(1),
            webhooks: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `webhook` is at its limit and slow: an attempt for it now would be deferred.
    pub fn is_slow(&self, webhook: Uuid) -> bool {
        let Some(entry) = lock(&self.webhooks).get(&webhook).cloned() else {
            return false;
        };
        let in_flight = lock(&entry.in_flight);
        in_flight.started.len() >= self.limit
            && in_flight
                .started
                .values()
                .next()
                .is_some_and(|started| started.elapsed() >= SLOW_AFTER)
    }

    /// A slot for one request to `webhook`; `None` when the webhook is at its limit and slow,
    /// or no slot freed within `wait`.
    pub async fn take(&self, webhook: Uuid, wait: Duration) -> Option<Slot> {
        let entry = lock(&self.webhooks).entry(webhook).or_default().clone();
        let deadline = Instant::now() + wait;
        loop {
            {
                let mut in_flight = lock(&entry.in_flight);
                if in_flight.started.len() < self.limit {
                    let number = in_flight.next;
                    in_flight.next += 1;
                    in_flight.started.insert(number, Instant::now());
                    return Some(Slot {
                        webhook: entry.clone(),
                        number,
                    });
                }
                let oldest = in_flight.started.values().next().copied();
                if oldest.is_some_and(|started| started.elapsed() >= SLOW_AFTER) {
                    return None;
                }
            }
            // A slot freed since the check leaves a permit behind: no wake-up is lost.
            tokio::select! {
                _ = entry.freed.notified() => {}
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_quick_webhook_at_its_limit_waits_for_a_slot_and_others_are_unaffected() {
        let slots = Arc::new(WebhookSlots::new(1));
        let (busy, other) = (Uuid::now_v7(), Uuid::now_v7());
        let held = slots.take(busy, SLOT_WAIT).await.unwrap();
        assert!(!slots.is_slow(busy), "at its limit but quick");
        assert!(slots.take(other, SLOT_WAIT).await.is_some());
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take(busy, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        drop(held);
        let taken = waiter.await.unwrap();
        assert!(taken.is_some(), "the freed slot was taken");
        // While that slot is held and nothing frees, a short wait ends without one.
        assert!(slots.take(busy, Duration::from_millis(20)).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_webhook_at_its_limit_is_refused_at_once() {
        let slots = WebhookSlots::new(1);
        let slow = Uuid::now_v7();
        let _held = slots.take(slow, SLOT_WAIT).await.unwrap();
        // The clock is paused: the request in flight ages only when told to.
        tokio::time::advance(SLOW_AFTER).await;
        let asked = Instant::now();
        assert!(slots.is_slow(slow));
        assert!(
            !slots.is_slow(Uuid::now_v7()),
            "an unknown webhook is not slow"
        );
        assert!(slots.take(slow, Duration::from_secs(30)).await.is_none());
        assert_eq!(asked.elapsed(), Duration::ZERO, "refused without waiting");
    }
}
