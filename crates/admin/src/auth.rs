//! The admin token check in front of every `/api/v1` route but the OpenAPI document, and the
//! limit on failed attempts per client address it shares with the settings pages' sign-in.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::HttpRequest;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use tocsin_web::auth::bearer_token;
use tocsin_web::ApiError;

use crate::config::AdminToken;

/// The window failed attempts are counted over.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at most; past this, the oldest records are dropped first.
const TRACKED_ADDRESSES: usize = 10_000;

/// Lets a request with the admin token through, always. Refuses a request without it with 401
/// (and `WWW-Authenticate: Bearer`), or with 429 (and `Retry-After`) when its address presented
/// too many wrong tokens lately.
///
/// The token is checked before the limiter: behind an ingress every admin shares one address,
/// so a limit that also refused the right token would let anyone lock every admin out. The
/// limit only makes an address's wrong guesses cheaper to answer; the admin token's length
/// (at least 16 characters, random in practice) is what defeats guessing.
pub async fn require_admin_token(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let allowed = req
        .app_data::<web::Data<AdminToken>>()
        .zip(bearer_token(req.request()))
        .is_some_and(|(expected, presented)| expected.matches(presented));
    if allowed {
        return next.call(req).await;
    }
    // A presented wrong token is a guess; a request with no token at all is not.
    let limiter = req.app_data::<web::Data<FailedAuthLimiter>>().cloned();
    if let (Some(limiter), Some(_)) = (&limiter, bearer_token(req.request())) {
        let address = client_address(req.request());
        let now = Instant::now();
        if let Err(wait) = limiter.check(address, now) {
            return Err(ApiError::rate_limited(wait.as_secs() + 1).into());
        }
        limiter.record_failure(address, now);
    }
    Err(ApiError::unauthorized().into())
}

/// Failed admin-token attempts (API calls and sign-ins) per client address over the last
/// minute: past five, the address's wrong tokens are answered 429 until the window passes.
/// The right token is never refused.
pub struct FailedAuthLimiter {
    allowed: usize,
    failures: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
}

impl FailedAuthLimiter {
    /// Allows `allowed` failures per address per minute (`TOCSIN_ADMIN_AUTH_FAILURES`).
    pub fn new(allowed: usize) -> Self {
        FailedAuthLimiter {
            allowed: allowed.max(1),
            failures: Mutex::default(),
        }
    }

    /// `Err(wait)` when the address used up its failures: how long until it may try again.
    pub fn check(&self, address: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let Some(times) = failures.get_mut(&address) else {
            return Ok(());
        };
        times.retain(|at| now.duration_since(*at) < FAILURE_WINDOW);
        if times.len() < self.allowed {
            return Ok(());
        }
        let oldest = times.front().copied().unwrap_or(now);
        Err(FAILURE_WINDOW.saturating_sub(now.duration_since(oldest)))
    }

    pub fn record_failure(&self, address: IpAddr, now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= TRACKED_ADDRESSES && !failures.contains_key(&address) {
            failures.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|at| now.duration_since(*at) < FAILURE_WINDOW)
            });
        }
        if failures.len() < TRACKED_ADDRESSES || failures.contains_key(&address) {
            failures.entry(address).or_default().push_back(now);
        }
    }

    pub fn clear(&self, address: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(&address);
    }
}

/// The address failed attempts are counted against: the TCP peer (not a forwarded-for header,
/// which a client could set to anything).
pub fn client_address(req: &HttpRequest) -> IpAddr {
    req.peer_addr()
        .map(|addr| addr.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_a_minute_then_a_wait() {
        let limiter = FailedAuthLimiter::new(5);
        let address = IpAddr::from([192, 0, 2, 1]);
        let start = Instant::now();
        for i in 0..5 {
            assert!(limiter.check(address, start).is_ok(), "failure {i}");
            limiter.record_failure(address, start);
        }
        let wait = limiter.check(address, start).unwrap_err();
        assert_eq!(wait, FAILURE_WINDOW);
        assert!(limiter.check(IpAddr::from([192, 0, 2, 2]), start).is_ok());
        assert!(limiter.check(address, start + FAILURE_WINDOW).is_ok());
    }
}
