//! Per-webhook limit on requests in flight, so that one slow or hanging target cannot take
//! every delivery slot of a dispatcher (DESIGN §2, isolation). An attempt that finds its webhook
//! at the limit is not made now: its message waits in the deferral queue and comes back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Requests in flight per webhook, up to a limit.
#[derive(Debug)]
pub(crate) struct WebhookSlots {
    limit: usize,
    in_flight: Mutex<HashMap<Uuid, usize>>,
}

/// A taken slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<WebhookSlots>,
    webhook: Uuid,
}

impl WebhookSlots {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(WebhookSlots {
            limit: limit.max(1),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one request to `webhook`, or `None` when it has `limit` in flight already.
    pub fn try_take(self: &Arc<Self>, webhook: Uuid) -> Option<Slot> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let count = in_flight.entry(webhook).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot {
            slots: self.clone(),
            webhook,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = self
            .slots
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = in_flight.get_mut(&self.webhook) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.webhook);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_at_its_limit_gets_no_slot_until_one_is_freed_and_others_are_unaffected() {
        let slots = WebhookSlots::new(2);
        let (slow, other) = (Uuid::now_v7(), Uuid::now_v7());
        let first = slots.try_take(slow).unwrap();
        let _second = slots.try_take(slow).unwrap();
        assert!(slots.try_take(slow).is_none());
        assert!(slots.try_take(other).is_some());
        drop(first);
        assert!(slots.try_take(slow).is_some());
    }
}
