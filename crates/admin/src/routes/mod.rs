//! The admin API's handlers, grouped by resource, and what they share: the state, strict JSON
//! bodies, pagination parameters and the route table.

pub mod deliveries;
pub mod incidents;
pub mod tokens;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpRequest};
use serde::de::DeserializeOwned;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tocsin_storage::{Cursor, DbConn, DbError, DbPool, Page};
use tocsin_web::{json, ApiError};
use tokio::sync::Notify;

use crate::error::AdminError;

/// What the handlers share.
pub struct AdminState {
    pub pool: DbPool,
    /// Wakes the outbox relay after a commit that wrote outbox rows.
    pub relay: Arc<Notify>,
    /// How long a rotated-out secret keeps signing.
    pub secret_grace: Duration,
    pub body_limit: usize,
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

    /// Tells the relay that outbox rows were committed.
    pub fn wake_relay(&self) {
        self.relay.notify_one();
    }
}

/// Reads `limit` (1 to 200, default 50) and `cursor` (as handed out in `next_cursor`).
pub fn page(limit: Option<&str>, cursor: Option<&str>) -> Result<Page, AdminError> {
    let limit = match limit {
        None => Page::DEFAULT_LIMIT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=Page::MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                AdminError::bad_parameter(
                    "limit",
                    format!("must be a whole number from 1 to {}", Page::MAX_LIMIT),
                )
            })?,
    };
    let cursor = cursor
        .map(|text| {
            Cursor::decode(text).ok_or_else(|| {
                AdminError::bad_parameter("cursor", "not a cursor this API handed out")
            })
        })
        .transpose()?;
    Ok(Page { limit, cursor })
}

/// Parses an optional query parameter with `parse`, naming the parameter when it fails.
pub fn param<T, E: std::fmt::Display>(
    name: &'static str,
    value: Option<&str>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, AdminError> {
    value
        .map(|text| parse(text).map_err(|e| AdminError::bad_parameter(name, e)))
        .transpose()
}

/// Parses an RFC 3339 time.
pub fn rfc3339(text: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| "must be an RFC 3339 time such as 2026-11-22T01:32:00Z".to_owned())
}

/// Mounts every `/api/v1` route (the caller adds the prefix and the admin token check).
pub fn configure(cfg: &mut web::ServiceConfig) {
    let resource = |path: &str, allow: &'static str| {
        web::resource(path).default_service(web::to(move || async move {
            tocsin_web::error::method_not_allowed(allow)
        }))
    };
    cfg.service(
        resource("/webhooks", "GET, POST")
            .route(web::get().to(webhooks::list))
            .route(web::post().to(webhooks::create)),
    )
    .service(
        resource("/webhooks/{id}", "GET, PATCH, DELETE")
            .route(web::get().to(webhooks::get))
            .route(web::patch().to(webhooks::update))
            .route(web::delete().to(webhooks::delete)),
    )
    .service(
        resource("/webhooks/{id}/reveal-secret", "POST")
            .route(web::post().to(webhooks::reveal_secret)),
    )
    .service(
        resource("/webhooks/{id}/rotate-secret", "POST")
            .route(web::post().to(webhooks::rotate_secret)),
    )
    .service(
        resource("/webhooks/{id}/test", "POST").route(web::post().to(webhooks::send_test_event)),
    )
    .service(resource("/webhooks/{id}/recover", "POST").route(web::post().to(webhooks::recover)))
    .service(resource("/deliveries", "GET").route(web::get().to(deliveries::list)))
    .service(resource("/deliveries/{id}", "GET").route(web::get().to(deliveries::get)))
    .service(resource("/deliveries/{id}/retry", "POST").route(web::post().to(deliveries::retry)))
    .service(resource("/incidents", "GET").route(web::get().to(incidents::list)))
    .service(
        resource("/incidents/{id}", "GET, PATCH")
            .route(web::get().to(incidents::get))
            .route(web::patch().to(incidents::update)),
    )
    .service(
        resource("/tokens", "GET, POST")
            .route(web::get().to(tokens::list))
            .route(web::post().to(tokens::create)),
    )
    .service(resource("/tokens/{id}", "DELETE").route(web::delete().to(tokens::revoke)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_bounded_and_cursors_checked() {
        assert_eq!(page(None, None).unwrap().limit, Page::DEFAULT_LIMIT);
        assert_eq!(page(Some("200"), None).unwrap().limit, 200);
        for bad in ["0", "201", "-1", "x", ""] {
            let error = page(Some(bad), None).unwrap_err();
            assert!(
                matches!(
                    error,
                    AdminError::BadParameter {
                        parameter: "limit",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        let error = page(None, Some("garbage")).unwrap_err();
        assert!(matches!(
            error,
            AdminError::BadParameter {
                parameter: "cursor",
                ..
            }
        ));
        let cursor = Cursor {
            at: OffsetDateTime::now_utc(),
            id: uuid::Uuid::now_v7(),
        };
        assert_eq!(
            page(None, Some(&cursor.encode())).unwrap().cursor,
            Some(cursor)
        );
    }

    #[test]
    fn times_must_be_rfc3339() {
        assert!(rfc3339("2026-11-22T01:32:00Z").is_ok());
        assert!(rfc3339("2026-11-22T01:32:00.5+02:00").is_ok());
        assert!(rfc3339("yesterday").is_err());
        assert!(rfc3339("2026-11-22").is_err());
    }
}
