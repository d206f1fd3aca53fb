//! The admin API's handlers, grouped by resource, and the route table.

pub mod admin_keys;
pub mod audit_log;
pub mod deliveries;
pub mod incidents;
pub mod tokens;
mod webhook_views;
pub mod webhooks;

use actix_web::middleware::from_fn;
use actix_web::web;

/// Mounts every `/api/v1` route (the caller adds the prefix and the authentication); each
/// resource checks the role its operations need (`crate::roles::API`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    let resource = |path: &str, allow: &'static str| {
        web::resource(path)
            .wrap(from_fn(crate::auth::authorize))
            .default_service(web::to(move || async move {
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
    .service(resource("/webhooks/{id}/replay", "POST").route(web::post().to(webhooks::replay)))
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
    .service(resource("/tokens/{id}", "DELETE").route(web::delete().to(tokens::revoke)))
    .service(
        resource("/admin-keys", "GET, POST")
            .route(web::get().to(admin_keys::list))
            .route(web::post().to(admin_keys::create)),
    )
    .service(resource("/admin-keys/{id}", "DELETE").route(web::delete().to(admin_keys::revoke)))
    .service(resource("/audit-log", "GET").route(web::get().to(audit_log::list)));
}
