//! Per-webhook limit on requests in flight, so that one slow or hanging target cannot take
//! every delivery slot of a dispatcher (DESIGN §2, isolation).
//!
//! An attempt whose webhook is at its limit waits for a slot when the webhook is quick
//! (deliveries arrive in bursts, and a quick target frees slots within milliseconds). A webhook
//! at its limit is slow when the oldest request in flight to it has run for [`SLOW_AFTER`]
//! already, or when its last finished request took that long; an attempt for a slow webhook is
//! not made now: its message waits in the deferral queue and comes back, so it holds no
//! delivery slot meanwhile. A waiting attempt gives up as soon as its webhook turns slow. At most
//! as many attempts wait for one webhook as it may have in flight, so the waiters of a webhook
//! that just stopped answering hold no more than their share of the dispatcher's slots; while
//! its requests are finishing (one finished within [`SLOW_AFTER`]), as many as can expect a
//! slot within [`SLOW_AFTER`] at its recent request time, so that a deep queue of deliveries to
//! a quick target waits for its slots instead of going round the deferral queue.
//!
//! The writers hold a webhook's new deliveries (see `crate::held`) while it is slow, and also
//! once it has stalled: at its limit, every waiting place taken, nothing finished for
//! [`STALLED_AFTER`] (or twice its recent request time). A target that stops answering under load stalls long before it is slow,
//! and until it is marked, each delivery to it beyond its waiters costs a deferral.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;
use uuid::Uuid;

/// A webhook at its limit whose oldest request in flight is this old, or whose last finished
/// request took this long, counts as slow.
pub(crate) const SLOW_AFTER: Duration = Duration::from_millis(250);
/// The longest an attempt waits for a slot of a webhook that is not slow.
pub(crate) const SLOT_WAIT: Duration = Duration::from_secs(1);
/// A webhook at its limit, every waiting place taken, none of whose requests has finished for
/// this long, or twice its recent request time if that is longer (and the oldest in flight
/// that old), has stalled: it is marked at once, before it counts as slow.
pub(crate) const STALLED_AFTER: Duration = Duration::from_millis(50);

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
    /// Attempts waiting for a slot.
    waiting: usize,
    /// The last request to finish took [`SLOW_AFTER`] or longer.
    last_was_slow: bool,
    /// When the last request finished.
    last_finished: Option<Instant>,
    /// Recent request time: a moving average of the finished requests' durations.
    recent: Option<Duration>,
    /// When this dispatcher last told the writers that the webhook is slow.
    marked: Option<Instant>,
}

impl InFlight {
    /// When the oldest request in flight turns (or turned) [`SLOW_AFTER`] old.
    fn slow_at(&self) -> Option<Instant> {
        self.started
            .values()
            .next()
            .map(|started| *started + SLOW_AFTER)
    }

    /// How many attempts may wait for a slot: the limit; or, while requests are finishing (one
    /// finished within [`SLOW_AFTER`]), as many as can expect a slot within [`SLOW_AFTER`] at
    /// the recent request time, if that is more.
    fn waiting_places(&self, limit: usize) -> usize {
        let answering = self
            .last_finished
            .is_some_and(|at| at + SLOW_AFTER > Instant::now());
        match self.recent {
            Some(recent) if answering => {
                let turns = SLOW_AFTER.as_secs_f64() / recent.as_secs_f64().max(1e-6);
                // Saturating: a quick webhook gets as many places as there are attempts.
                limit.max((limit as f64 * turns) as usize)
            }
            _ => limit,
        }
    }

    /// At `limit`, every waiting place taken, and nothing finished for [`STALLED_AFTER`] (or
    /// twice the recent request time, so that a webhook whose requests take 100 ms and finish
    /// in clusters is not taken for stalled between them) while the oldest request in flight
    /// has run that long.
    fn is_stalled(&self, limit: usize) -> bool {
        let now = Instant::now();
        let quiet = self
            .recent
            .map_or(STALLED_AFTER, |recent| STALLED_AFTER.max(recent * 2));
        let quiet_since = |at: Instant| at + quiet <= now;
        self.started.len() >= limit
            && self.waiting >= self.waiting_places(limit)
            && self.last_finished.is_none_or(quiet_since)
            && self
                .started
                .values()
                .next()
                .copied()
                .is_some_and(quiet_since)
    }

    /// At `limit` and slow: an attempt now would be deferred.
    fn is_slow(&self, limit: usize) -> bool {
        self.started.len() >= limit
            && (self.last_was_slow || self.slow_at().is_some_and(|at| at <= Instant::now()))
    }
}

/// A taken slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Slot {
    webhook: Arc<Webhook>,
    number: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.webhook.in_flight);
        if let Some(started) = in_flight.started.remove(&self.number) {
            let took = started.elapsed();
            in_flight.last_was_slow = took >= SLOW_AFTER;
            in_flight.last_finished = Some(Instant::now());
            in_flight.recent = Some(match in_flight.recent {
                Some(recent) => recent.mul_f64(0.8) + took.mul_f64(0.2),
                None => took,
            });
        }
        drop(in_flight);
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

    /// `check` of `webhook`'s requests in flight; false for a webhook never seen.
    fn check(&self, webhook: Uuid, check: impl FnOnce(&InFlight) -> bool) -> bool {
        let Some(entry) = lock(&self.webhooks).get(&webhook).cloned() else {
            return false;
        };
        let in_flight = lock(&entry.in_flight);
        check(&in_flight)
    }

    /// Whether `webhook` is at its limit and slow: an attempt for it now would be deferred.
    pub fn is_slow(&self, webhook: Uuid) -> bool {
        self.check(webhook, |in_flight| in_flight.is_slow(self.limit))
    }

    /// How many requests may be in flight to one webhook.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `webhook` answers slowly, at its limit or not: its last finished request took
    /// [`SLOW_AFTER`] or longer, or its oldest request in flight has run that long already.
    pub fn answers_slowly(&self, webhook: Uuid) -> bool {
        self.check(webhook, |in_flight| {
            in_flight.last_was_slow || in_flight.slow_at().is_some_and(|at| at <= Instant::now())
        })
    }

    /// Whether the writers should hold `webhook`'s new deliveries: it is slow, or it has
    /// stalled (at its limit, every waiting place taken, nothing finished for
    /// [`STALLED_AFTER`] or twice its recent request time). A webhook that stops answering under
    /// load stalls well before it is slow; until it is marked, every attempt beyond its waiters
    /// is deferred.
    pub fn should_hold(&self, webhook: Uuid) -> bool {
        self.check(webhook, |in_flight| {
            in_flight.is_slow(self.limit) || in_flight.is_stalled(self.limit)
        })
    }

    /// The webhooks at their limit and slow now.
    pub fn slow_webhooks(&self) -> Vec<Uuid> {
        let webhooks: Vec<(Uuid, Arc<Webhook>)> = lock(&self.webhooks)
            .iter()
            .map(|(id, entry)| (*id, entry.clone()))
            .collect();
        webhooks
            .into_iter()
            .filter(|(_, entry)| lock(&entry.in_flight).is_slow(self.limit))
            .map(|(id, _)| id)
            .collect()
    }

    /// Whether to tell the writers now that `webhook` is slow: true at most once per `every`.
    pub fn mark_due(&self, webhook: Uuid, every: Duration) -> bool {
        let entry = lock(&self.webhooks).entry(webhook).or_default().clone();
        let mut in_flight = lock(&entry.in_flight);
        let now = Instant::now();
        if in_flight.marked.is_some_and(|at| at + every > now) {
            return false;
        }
        in_flight.marked = Some(now);
        true
    }

    /// A slot for one request to `webhook`; `None` when the webhook is at its limit and slow
    /// (now or while waiting), when its waiting places are taken, or when no slot freed within
    /// `wait`.
    pub async fn take(&self, webhook: Uuid, wait: Duration) -> Option<Slot> {
        let entry = lock(&self.webhooks).entry(webhook).or_default().clone();
        let deadline = Instant::now() + wait;
        // Counted among the waiters from the first wait on, until this call ends (or is dropped).
        let mut waiting: Option<Waiter> = None;
        loop {
            let wake_at = {
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
                if in_flight.is_slow(self.limit) {
                    return None;
                }
                if waiting.is_none() {
                    if in_flight.waiting >= in_flight.waiting_places(self.limit) {
                        return None;
                    }
                    in_flight.waiting += 1;
                    waiting = Some(Waiter(entry.clone()));
                }
                // Check again when the oldest request turns slow.
                in_flight.slow_at().map_or(deadline, |at| at.min(deadline))
            };
            if Instant::now() >= deadline {
                return None;
            }
            // A slot freed since the check leaves a permit behind: no wake-up is lost.
            tokio::select! {
                _ = entry.freed.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }
}

/// One attempt counted among a webhook's waiters; dropping it uncounts it.
struct Waiter(Arc<Webhook>);

impl Drop for Waiter {
    fn drop(&mut self) {
        lock(&self.0.in_flight).waiting -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks for a slot in a task of its own, so that the test can go on while it waits.
    fn spawn_take(
        slots: &Arc<WebhookSlots>,
        webhook: Uuid,
        wait: Duration,
    ) -> tokio::task::JoinHandle<Option<Slot>> {
        let slots = slots.clone();
        tokio::spawn(async move { slots.take(webhook, wait).await })
    }

    /// Lets spawned takers run until they wait (a paused clock does not move meanwhile).
    async fn let_takers_run() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// How many attempts wait for a slot of `webhook`.
    fn waiting(slots: &WebhookSlots, webhook: Uuid) -> usize {
        let entry = lock(&slots.webhooks)[&webhook].clone();
        let waiting = lock(&entry.in_flight).waiting;
        waiting
    }

    #[tokio::test]
    async fn a_quick_webhook_at_its_limit_waits_for_a_slot_and_others_are_unaffected() {
        let slots = Arc::new(WebhookSlots::new(1));
        let (busy, other) = (Uuid::now_v7(), Uuid::now_v7());
        let held = slots.take(busy, SLOT_WAIT).await.unwrap();
        assert!(!slots.is_slow(busy), "at its limit but quick");
        assert!(slots.take(other, SLOT_WAIT).await.is_some());
        let waiter = spawn_take(&slots, busy, Duration::from_secs(10));
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
        assert!(slots.slow_webhooks().is_empty());
        // The clock is paused: the request in flight ages only when told to.
        tokio::time::advance(SLOW_AFTER).await;
        let asked = Instant::now();
        assert!(slots.is_slow(slow));
        assert_eq!(slots.slow_webhooks(), [slow]);
        assert!(
            !slots.is_slow(Uuid::now_v7()),
            "an unknown webhook is not slow"
        );
        assert!(slots.take(slow, Duration::from_secs(30)).await.is_none());
        assert_eq!(asked.elapsed(), Duration::ZERO, "refused without waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn a_webhook_that_stops_answering_with_its_waiters_full_is_held_before_it_is_slow() {
        let slots = Arc::new(WebhookSlots::new(1));
        let webhook = Uuid::now_v7();
        let _held = slots.take(webhook, SLOT_WAIT).await.unwrap();
        let _waiter = spawn_take(&slots, webhook, Duration::from_secs(30));
        let_takers_run().await;
        assert_eq!(waiting(&slots, webhook), 1);
        assert!(
            slots.take(webhook, SLOT_WAIT).await.is_none(),
            "its one waiting place is taken"
        );
        assert!(
            !slots.should_hold(webhook),
            "its request has only just started"
        );
        tokio::time::advance(STALLED_AFTER).await;
        assert!(slots.should_hold(webhook), "stalled");
        assert!(!slots.is_slow(webhook), "not slow yet");
        tokio::time::advance(SLOW_AFTER).await;
        assert!(slots.should_hold(webhook) && slots.is_slow(webhook));

        // A webhook whose requests are finishing gets more waiting places, and does not stall.
        let quick = Uuid::now_v7();
        drop(slots.take(quick, SLOT_WAIT).await.unwrap());
        let _in_flight = slots.take(quick, SLOT_WAIT).await.unwrap();
        let _waiter = spawn_take(&slots, quick, Duration::from_secs(30));
        let_takers_run().await;
        tokio::time::advance(STALLED_AFTER).await;
        assert_eq!(waiting(&slots, quick), 1);
        assert!(!slots.should_hold(quick));

        // A webhook whose requests take 100 ms has stalled only after twice that.
        let steady = Uuid::now_v7();
        let first = slots.take(steady, SLOT_WAIT).await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(first);
        let _in_flight = slots.take(steady, SLOT_WAIT).await.unwrap();
        // While its requests are finishing it has 250 ms / 100 ms = 2 waiting places.
        let _waiters = [
            spawn_take(&slots, steady, Duration::from_secs(30)),
            spawn_take(&slots, steady, Duration::from_secs(30)),
        ];
        let_takers_run().await;
        assert_eq!(waiting(&slots, steady), 2);
        tokio::time::advance(STALLED_AFTER).await;
        assert!(!slots.should_hold(steady), "quiet for 50 ms only");
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(slots.should_hold(steady), "quiet for 200 ms");
        assert!(!slots.is_slow(steady), "its oldest request is 200 ms old");
    }

    #[tokio::test(start_paused = true)]
    async fn a_webhook_answers_slowly_below_its_limit_by_its_oldest_or_last_request() {
        let slots = WebhookSlots::new(4);
        let webhook = Uuid::now_v7();
        assert!(!slots.answers_slowly(webhook), "unknown");
        let first = slots.take(webhook, SLOT_WAIT).await.unwrap();
        assert!(!slots.answers_slowly(webhook), "in flight, not old yet");
        tokio::time::advance(SLOW_AFTER).await;
        assert!(slots.answers_slowly(webhook), "its oldest request is old");
        assert!(!slots.is_slow(webhook), "below its limit it is not slow");
        drop(first);
        assert!(slots.answers_slowly(webhook), "its last request was slow");
        drop(slots.take(webhook, SLOT_WAIT).await.unwrap());
        assert!(!slots.answers_slowly(webhook), "a quick request clears it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_attempt_gives_up_when_the_webhook_turns_slow() {
        let slots = Arc::new(WebhookSlots::new(1));
        let webhook = Uuid::now_v7();
        let _held = slots.take(webhook, SLOT_WAIT).await.unwrap();
        let asked = Instant::now();
        let waiter = spawn_take(&slots, webhook, Duration::from_secs(30));
        // The paused clock jumps to the next timer: the moment the held request turns slow.
        assert!(waiter.await.unwrap().is_none());
        assert_eq!(
            asked.elapsed(),
            SLOW_AFTER,
            "gave up when the webhook turned slow"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_webhook_whose_last_request_was_slow_is_slow_at_its_limit_until_one_is_quick() {
        let slots = WebhookSlots::new(1);
        let webhook = Uuid::now_v7();
        let held = slots.take(webhook, SLOT_WAIT).await.unwrap();
        tokio::time::advance(SLOW_AFTER).await;
        drop(held);
        assert!(!slots.is_slow(webhook), "below its limit it is never slow");
        let fresh = slots.take(webhook, SLOT_WAIT).await.unwrap();
        assert!(
            slots.is_slow(webhook),
            "at its limit, slow by its last request although the one in flight is new"
        );
        assert!(slots.take(webhook, SLOT_WAIT).await.is_none());
        drop(fresh);
        let _quick = slots.take(webhook, SLOT_WAIT).await.unwrap();
        assert!(
            !slots.is_slow(webhook),
            "the quick request that just finished clears it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn more_attempts_than_its_limit_wait_for_a_webhook_that_answers_quickly() {
        let slots = Arc::new(WebhookSlots::new(1));
        let webhook = Uuid::now_v7();
        // A request that took no time at all finished just now.
        drop(slots.take(webhook, SLOT_WAIT).await.unwrap());
        let _held = slots.take(webhook, SLOT_WAIT).await.unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| spawn_take(&slots, webhook, SLOT_WAIT))
            .collect();
        let_takers_run().await;
        assert_eq!(waiting(&slots, webhook), 3, "all three wait");
        assert!(waiters.iter().all(|w| !w.is_finished()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_webhook_answering_in_200_ms_gets_the_places_that_can_expect_a_slot_in_250() {
        let slots = Arc::new(WebhookSlots::new(4));
        let webhook = Uuid::now_v7();
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(slots.take(webhook, SLOT_WAIT).await.unwrap());
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        held.clear();
        for _ in 0..4 {
            held.push(slots.take(webhook, SLOT_WAIT).await.unwrap());
        }
        // 4 in flight at 200 ms each free a slot every 50 ms: 5 can expect one within 250 ms.
        let waiters: Vec<_> = (0..6)
            .map(|_| spawn_take(&slots, webhook, SLOT_WAIT))
            .collect();
        let_takers_run().await;
        assert_eq!(waiting(&slots, webhook), 5);
        assert_eq!(
            waiters.iter().filter(|w| w.is_finished()).count(),
            1,
            "the sixth was refused at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_webhook_is_marked_at_most_once_per_period() {
        let slots = WebhookSlots::new(1);
        let (one, other) = (Uuid::now_v7(), Uuid::now_v7());
        let every = Duration::from_secs(1);
        assert!(slots.mark_due(one, every));
        assert!(!slots.mark_due(one, every), "marked just now");
        assert!(slots.mark_due(other, every), "each webhook on its own");
        tokio::time::advance(every).await;
        assert!(slots.mark_due(one, every));
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_attempts_wait_for_a_webhook_than_its_limit() {
        let slots = Arc::new(WebhookSlots::new(2));
        let webhook = Uuid::now_v7();
        let _held = (
            slots.take(webhook, SLOT_WAIT).await.unwrap(),
            slots.take(webhook, SLOT_WAIT).await.unwrap(),
        );
        let waiters: Vec<_> = (0..2)
            .map(|_| spawn_take(&slots, webhook, SLOT_WAIT))
            .collect();
        let_takers_run().await;
        let asked = Instant::now();
        assert!(slots.take(webhook, SLOT_WAIT).await.is_none());
        assert_eq!(
            asked.elapsed(),
            Duration::ZERO,
            "a third waiter is refused at once"
        );
        for waiter in waiters {
            assert!(waiter.await.unwrap().is_none());
        }
        assert_eq!(waiting(&slots, webhook), 0, "their places are free again");
    }
}
