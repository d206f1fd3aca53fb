//! The admin token check in front of every `/api/v1` route but the OpenAPI document.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use tocsin_web::auth::bearer_token;
use tocsin_web::ApiError;

use crate::config::AdminToken;

/// Refuses with 401 (and `WWW-Authenticate: Bearer`) a request without the admin token.
pub async fn require_admin_token(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let allowed = req
        .app_data::<web::Data<AdminToken>>()
        .zip(bearer_token(req.request()))
        .is_some_and(|(expected, presented)| expected.matches(presented));
    if !allowed {
        return Err(ApiError::unauthorized().into());
    }
    next.call(req).await
}
