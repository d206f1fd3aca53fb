//! A delivery's states and the names of what happens to it: the states a delivery of one event
//! to one webhook can be in, why it waits, who asked for an attempt, how an attempt failed, and
//! where a finished attempt takes it ([`Transition`]). Which act may move a delivery in which
//! standing, and where, is one table: [`rules`]. The repository carries out each act as one
//! guarded SQL statement, and a test holds every guard to the table.

pub mod rules;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::RetrySchedule;

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Waiting for its first attempt, due at `next_attempt_at`.
    Pending,
    /// Its next attempt is due, but its webhook has no room for it now (see [`WaitReason`]):
    /// it is made as soon as the webhook has a free slot.
    Waiting,
    /// An attempt failed; the next automatic attempt is due at `next_attempt_at`.
    Retrying,
    /// An attempt succeeded. Final: nothing moves a succeeded delivery again.
    Succeeded,
    /// Every automatic attempt allowed failed, or the webhook was disabled or deleted before
    /// they were all made. A manual attempt may still succeed it.
    Failed,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 5] = [
        DeliveryState::Pending,
        DeliveryState::Waiting,
        DeliveryState::Retrying,
        DeliveryState::Succeeded,
        DeliveryState::Failed,
    ];
    /// The states an automatic attempt may still be claimed from.
    pub const UNFINISHED: [DeliveryState; 3] = [
        DeliveryState::Pending,
        DeliveryState::Waiting,
        DeliveryState::Retrying,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Waiting => "waiting",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Succeeded => "succeeded",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, DeliveryState::Succeeded | DeliveryState::Failed)
    }
}

impl FromStr for DeliveryState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeliveryState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "state must be one of pending, waiting, retrying, succeeded, failed (got {s:?})"
                )
            })
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a delivery is [`DeliveryState::Waiting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The webhook has as many requests in flight as it may (`TOCSIN_WEBHOOK_CONCURRENCY` per
    /// dispatcher), usually because its target answers slowly or hangs.
    WebhookBusy,
    /// The event came while the webhook was disabled: nothing is sent until an operator
    /// enables it and asks to recover its deliveries since a time.
    WebhookDisabled,
    /// The webhook's `rate_limit_per_second` is spent for now: the attempt is made at
    /// `next_attempt_at`.
    RateLimited,
    /// The webhook receives each incident's events in order (`ordering: incident`), and the
    /// delivery of the incident's previous event to it has not finished: the attempt is made
    /// as soon as it has.
    Ordering,
}

impl WaitReason {
    pub const ALL: [WaitReason; 4] = [
        WaitReason::WebhookBusy,
        WaitReason::WebhookDisabled,
        WaitReason::RateLimited,
        WaitReason::Ordering,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::WebhookBusy => "webhook_busy",
            WaitReason::WebhookDisabled => "webhook_disabled",
            WaitReason::RateLimited => "rate_limited",
            WaitReason::Ordering => "ordering",
        }
    }

    pub fn parse(text: &str) -> Option<WaitReason> {
        WaitReason::ALL.into_iter().find(|r| r.as_str() == text)
    }

    /// What the delivery log says about it.
    pub fn describe(self) -> &'static str {
        match self {
            WaitReason::WebhookBusy => {
                "the webhook has as many requests in flight as it may; the attempt is made as soon as one finishes"
            }
            WaitReason::WebhookDisabled => {
                "the webhook was disabled when the event came; enable it and recover its deliveries since a time to send it"
            }
            WaitReason::RateLimited => {
                "the webhook's rate limit is spent for now; the attempt is made when it allows"
            }
            WaitReason::Ordering => {
                "the webhook receives each incident's events in order, and the delivery of this incident's previous event has not finished; the attempt is made as soon as it has"
            }
        }
    }
}

/// Who asked for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The retry schedule.
    Automatic,
    /// An operator, from the delivery log.
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Automatic => "automatic",
            Trigger::Manual => "manual",
        }
    }

    pub fn parse(text: &str) -> Option<Trigger> {
        match text {
            "automatic" => Some(Trigger::Automatic),
            "manual" => Some(Trigger::Manual),
            _ => None,
        }
    }
}

/// The kind of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptError {
    /// No answer (status line and headers) within the webhook's timeout.
    Timeout,
    /// The connection was refused or broke before an answer.
    Connect,
    /// The host name did not resolve.
    Dns,
    /// The TLS handshake failed.
    Tls,
    /// The target resolves to an address the SSRF rules refuse.
    Blocked,
    /// The target answered with a status other than 2xx.
    HttpStatus,
    /// The target answered with a redirect, which is never followed.
    Redirect,
    /// The dispatcher making the attempt stopped before it could record the answer: the
    /// request may or may not have reached the target.
    Interrupted,
    /// No request was sent: the dispatcher that claimed the attempt had no free slot of the
    /// webhook, or no request permit, before the attempt's lease would have ended (a request
    /// never goes out past its lease). It counts as a failed attempt and follows the schedule.
    NotSent,
    Other,
}

impl AttemptError {
    pub const ALL: [AttemptError; 10] = [
        AttemptError::Timeout,
        AttemptError::Connect,
        AttemptError::Dns,
        AttemptError::Tls,
        AttemptError::Blocked,
        AttemptError::HttpStatus,
        AttemptError::Redirect,
        AttemptError::Interrupted,
        AttemptError::NotSent,
        AttemptError::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptError::Timeout => "timeout",
            AttemptError::Connect => "connect",
            AttemptError::Dns => "dns",
            AttemptError::Tls => "tls",
            AttemptError::Blocked => "blocked",
            AttemptError::HttpStatus => "http_status",
            AttemptError::Redirect => "redirect",
            AttemptError::Interrupted => "interrupted",
            AttemptError::NotSent => "not_sent",
            AttemptError::Other => "other",
        }
    }

    pub fn parse(text: &str) -> Option<AttemptError> {
        AttemptError::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

/// Where a finished attempt takes its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// To `succeeded`, from any state but `succeeded`.
    Succeed,
    /// A failed automatic attempt with attempts left: to `retrying`, the next automatic attempt
    /// due after `delay`.
    Retry { delay: Duration },
    /// A failed last automatic attempt: to `failed`.
    Fail,
    /// A failed manual attempt: the state and schedule stay as they are.
    Keep,
}

impl Transition {
    /// The move after attempt `number` (its automatic number for an automatic attempt) with
    /// `trigger` ended, `success` or not, for a webhook allowing `max_attempts` automatic
    /// attempts (cut to the schedule's length).
    pub fn after_attempt(
        trigger: Trigger,
        number: i32,
        success: bool,
        max_attempts: u8,
        schedule: &RetrySchedule,
    ) -> Transition {
        if success {
            return Transition::Succeed;
        }
        if trigger == Trigger::Manual {
            return Transition::Keep;
        }
        let allowed = i32::from(allowed_attempts(max_attempts, schedule));
        if number >= allowed {
            return Transition::Fail;
        }
        let next = u8::try_from(number + 1).unwrap_or(u8::MAX);
        Transition::Retry {
            delay: schedule.delay_before(next).unwrap_or_default(),
        }
    }

    /// The state it moves to, if it moves.
    pub fn state(self) -> Option<DeliveryState> {
        match self {
            Transition::Succeed => Some(DeliveryState::Succeeded),
            Transition::Retry { .. } => Some(DeliveryState::Retrying),
            Transition::Fail => Some(DeliveryState::Failed),
            Transition::Keep => None,
        }
    }
}

/// How many automatic attempts a webhook's deliveries get: its `max_attempts`, at most the
/// schedule's length.
fn allowed_attempts(max_attempts: u8, schedule: &RetrySchedule) -> u8 {
    max_attempts.min(schedule.attempts())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(number: i32, trigger: Trigger, success: bool, max: u8) -> Transition {
        Transition::after_attempt(trigger, number, success, max, &RetrySchedule::default())
    }

    #[test]
    fn failed_automatic_attempts_follow_the_schedule_then_fail() {
        let expected = [60, 300, 1800, 7200].map(Duration::from_secs);
        for (number, delay) in (1..=4).zip(expected) {
            assert_eq!(
                after(number, Trigger::Automatic, false, 5),
                Transition::Retry { delay },
                "after attempt {number}"
            );
        }
        assert_eq!(after(5, Trigger::Automatic, false, 5), Transition::Fail);
        // Past the schedule (a claim never allows it, but the rule still ends it).
        assert_eq!(after(6, Trigger::Automatic, false, 5), Transition::Fail);
    }

    #[test]
    fn max_attempts_cuts_the_schedule_short() {
        assert_eq!(after(2, Trigger::Automatic, false, 2), Transition::Fail);
        assert_eq!(after(1, Trigger::Automatic, false, 1), Transition::Fail);
        let short: RetrySchedule = "0s,1s".parse().unwrap();
        assert_eq!(allowed_attempts(5, &short), 2);
        assert_eq!(
            Transition::after_attempt(Trigger::Automatic, 2, false, 5, &short),
            Transition::Fail
        );
    }

    #[test]
    fn success_always_succeeds() {
        for trigger in [Trigger::Automatic, Trigger::Manual] {
            assert_eq!(after(5, trigger, true, 5), Transition::Succeed);
        }
    }

    #[test]
    fn a_failed_manual_attempt_keeps_the_schedule() {
        for number in 0..=5 {
            assert_eq!(after(number, Trigger::Manual, false, 5), Transition::Keep);
        }
        assert_eq!(Transition::Keep.state(), None);
    }

    #[test]
    fn states_and_reasons_round_trip_their_names() {
        for state in DeliveryState::ALL {
            assert_eq!(state.as_str().parse::<DeliveryState>(), Ok(state));
        }
        assert!("held".parse::<DeliveryState>().is_err());
        for error in AttemptError::ALL {
            assert_eq!(AttemptError::parse(error.as_str()), Some(error));
        }
        assert_eq!(
            WaitReason::parse("webhook_busy"),
            Some(WaitReason::WebhookBusy)
        );
        assert_eq!(Trigger::parse("manual"), Some(Trigger::Manual));
        assert_eq!(Trigger::parse("other"), None);
    }
}
