//! Who a request is: the bootstrap token (`TOCSIN_ADMIN_TOKEN`, unless turned off) or an admin
//! key, looked up in the database on every request so that a revocation holds at once on every
//! admin instance; what its role allows (`crate::roles`); the limit on failed attempts per
//! client address it shares with the settings pages' sign-in; and the count of refusals.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};
use prometheus::{IntCounterVec, Opts, Registry};
use tocsin_domain::{AccessToken, Role};
use tocsin_storage::admin_keys;
use tocsin_web::auth::bearer_token;
use tocsin_web::ApiError;

use crate::actor::{client_address, Actor, Surface, Who};
use crate::error::AdminError;
use crate::state::AdminState;

/// The window failed attempts are counted over.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at most; past this, the oldest records are dropped first.
const TRACKED_ADDRESSES: usize = 10_000;

/// Who presented `credential`, and with which role: the bootstrap token when it is on and
/// matches, else a live admin key; `None` for anything else (unknown, revoked, expired).
pub async fn identify(
    state: &AdminState,
    credential: &str,
) -> Result<Option<(Who, Role)>, AdminError> {
    if state
        .bootstrap
        .as_ref()
        .is_some_and(|token| token.matches(credential))
    {
        return Ok(Some((Who::Bootstrap, Role::Admin)));
    }
    let Some(presented) = AccessToken::admin_key_from_presented(credential) else {
        return Ok(None);
    };
    let mut conn = state.conn().await?;
    Ok(admin_keys::authenticate(&mut conn, &presented)
        .await?
        .map(|key| {
            (
                Who::Key {
                    id: key.id,
                    name: key.name,
                },
                key.role,
            )
        }))
}

/// In front of every `/api/v1` route but the OpenAPI document: lets a request with the
/// bootstrap token or a live admin key through, with its [`Actor`] attached. Refuses one
/// without with 401 (and `WWW-Authenticate: Bearer`), or with 429 (and `Retry-After`) when its
/// address presented too many wrong credentials lately.
///
/// The credential is checked before the limiter: behind an ingress every admin shares one
/// address, so a limit that also refused the right credential would let anyone lock every
/// admin out. The limit only makes an address's wrong guesses cheaper to answer; the
/// credentials' length is what defeats guessing.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<AdminState>>()
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "not configured",
            )
        })?;
    let presented = bearer_token(req.request()).map(str::to_owned);
    let identified = match &presented {
        Some(credential) => identify(&state, credential).await?,
        None => None,
    };
    if let Some((who, role)) = identified {
        let actor = Actor::of_request(req.request(), who, role, Surface::Api);
        req.extensions_mut().insert(actor);
        return next.call(req).await;
    }
    state.refused(Surface::Api, StatusCode::UNAUTHORIZED);
    // A presented wrong credential is a guess; a request with none at all is not.
    let limiter = req.app_data::<web::Data<FailedAuthLimiter>>().cloned();
    if let (Some(limiter), Some(_)) = (&limiter, presented) {
        let address = client_address(req.request());
        let now = Instant::now();
        if let Err(wait) = limiter.check(address, now) {
            return Err(ApiError::rate_limited(wait.as_secs() + 1).into());
        }
        limiter.record_failure(address, now);
    }
    Err(ApiError::unauthorized().into())
}

/// In front of each `/api/v1` resource, after [`authenticate`]: refuses with 403, naming the
/// role needed, a request its actor's role does not allow (`crate::roles::API`).
pub async fn authorize(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let needed = crate::roles::needed(
        crate::roles::API,
        req.method().as_str(),
        req.match_pattern().as_deref(),
    );
    let role = req.extensions().get::<Actor>().map(|actor| actor.role);
    match role {
        Some(role) if role.allows(needed) => next.call(req).await,
        Some(role) => {
            if let Some(state) = req.app_data::<web::Data<AdminState>>() {
                state.refused(Surface::Api, StatusCode::FORBIDDEN);
            }
            Err(forbidden(needed, role).into())
        }
        None => Err(ApiError::unauthorized().into()),
    }
}

/// The 403 of a request beyond its role, naming the role it needs.
pub fn forbidden(needed: Role, held: Role) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("this needs the {needed} role; the credential used has the {held} role"),
    )
}

/// `tocsin_admin_auth_refusals_total`: failed sign-ins and refused requests, by surface
/// (`api`, `pages`) and status (`401` no or a wrong credential, `403` beyond its role).
pub fn refusals_metric(registry: &Registry) -> anyhow::Result<IntCounterVec> {
    let counter = IntCounterVec::new(
        Opts::new(
            "tocsin_admin_auth_refusals_total",
            "Failed sign-ins and refused admin requests, by surface and status (401, 403).",
        ),
        &["surface", "status"],
    )?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
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
