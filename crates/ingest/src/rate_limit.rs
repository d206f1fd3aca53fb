//! A token bucket per inbound token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Per-token token buckets: `rate` requests per second, up to `burst` at once.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// `rate` 0 turns the limiter off.
    pub fn new(rate: u32, burst: u32) -> Self {
        RateLimiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(rate).max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// `Ok` if `key` may make a request now, else how long until it may.
    pub fn check(&self, key: Uuid) -> Result<(), Duration> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_the_burst_then_refuses_with_a_wait() {
        let limiter = RateLimiter::new(1, 3);
        let key = Uuid::now_v7();
        for _ in 0..3 {
            assert!(limiter.check(key).is_ok());
        }
        let wait = limiter.check(key).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        assert!(
            limiter.check(Uuid::now_v7()).is_ok(),
            "buckets are per token"
        );
    }

    #[test]
    fn zero_rate_is_no_limit() {
        let limiter = RateLimiter::new(0, 0);
        let key = Uuid::now_v7();
        assert!((0..10_000).all(|_| limiter.check(key).is_ok()));
    }
}
