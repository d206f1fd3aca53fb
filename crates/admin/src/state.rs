//! What the admin API's and the settings pages' handlers share: the connection pool, the relay's
//! wake-up, the bootstrap token, the refusal count, and how a JSON body is read.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest};
use prometheus::IntCounterVec;
use serde::de::DeserializeOwned;
use tocsin_storage::relay::RelayWaker;
use tocsin_storage::{DbConn, DbError, DbPool};
use tocsin_web::{json, ApiError};

use crate::actor::Surface;
use crate::config::AdminToken;
use crate::error::AdminError;

/// What the handlers share.
pub struct AdminState {
    pub pool: DbPool,
    /// Wakes the outbox relay after a commit that wrote outbox rows.
    pub relay: Arc<RelayWaker>,
    /// How long a rotated-out secret keeps signing.
    pub secret_grace: Duration,
    pub body_limit: usize,
    /// The bootstrap token, `TOCSIN_ADMIN_TOKEN`; `None` when it is turned off
    /// (`TOCSIN_ADMIN_TOKEN_DISABLED`).
    pub bootstrap: Option<AdminToken>,
    /// `tocsin_admin_auth_refusals_total`.
    pub refusals: IntCounterVec,
}

impl AdminState {
    /// A connection from the pool; 503 when PostgreSQL cannot be reached.
    pub async fn conn(&self) -> Result<DbConn, AdminError> {
        self.pool
            .get()
            .await
            .map_err(|error| DbError::from(error).into())
    }

    /// Reads a JSON body into `T`: 415 when not JSON, 413 over the limit, 400 when unparseable,
    /// 422 naming the field of a shape error.
    pub async fn json<T: DeserializeOwned>(
        &self,
        req: &HttpRequest,
        payload: web::Payload,
    ) -> Result<T, AdminError> {
        if !json::is_json(req) {
            return Err(ApiError::unsupported_media_type().into());
        }
        let body = tocsin_web::body::read_limited(req, payload, self.body_limit).await?;
        Ok(json::parse_bytes(&body)?)
    }

    /// Counts a failed sign-in or a refused request (401 or 403).
    pub fn refused(&self, surface: Surface, status: StatusCode) {
        self.refusals
            .with_label_values(&[surface.as_str(), status.as_str()])
            .inc();
    }

    /// Tells the relay that outbox rows were committed.
    pub fn wake_relay(&self) {
        self.relay.wake();
    }
}
