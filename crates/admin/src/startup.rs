//! Building the admin service: pool, broker, outbox relay, HTTP server (the API under
//! `/api/v1`, the settings pages under `/settings/`).

use actix_web::middleware::from_fn;
use actix_web::web;
use anyhow::Context;
use tocsin_web::Service;

use crate::api;
use crate::auth::require_admin_token;
use crate::config::Config;
use crate::openapi::{self, OpenApiJson};
use crate::pages::{self, PagesState};
use crate::state::AdminState;

/// The running admin service.
pub type App = Service;

/// Checks the admin token, migrates the database, then builds the service listening on
/// `config.addr`.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let token = config
        .admin_token
        .clone()
        .context("TOCSIN_ADMIN_TOKEN: the admin token is required to serve")?;
    token.check()?;
    let common = &config.common;
    let foundation = common.foundation("admin").await?;
    let relay = common.outbox_relay(&foundation, config.outbox_poll)?;
    let state = web::Data::new(AdminState {
        pool: foundation.pool.clone(),
        relay: relay.waker(),
        secret_grace: config.secret_grace,
        body_limit: config.body_limit,
    });
    let limiter = web::Data::new(crate::auth::FailedAuthLimiter::new(usize::from(
        config.auth_failures,
    )));
    let pages_state = web::Data::new(PagesState::new(
        &token,
        config.secure_cookies,
        common.retry_delays.clone(),
        config.body_limit,
        limiter.clone(),
    ));
    let token = web::Data::new(token);
    let document = web::Data::new(OpenApiJson(openapi::document()));

    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_ADMIN_ADDR")?;
    let query_config =
        web::QueryConfig::default().error_handler(tocsin_web::error::query_error_handler);
    let path_config =
        web::PathConfig::default().error_handler(tocsin_web::error::path_error_handler);
    let routes = move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone())
            .app_data(limiter.clone())
            .app_data(token.clone())
            .app_data(document.clone())
            .app_data(pages_state.clone())
            .app_data(query_config.clone())
            .app_data(path_config.clone())
            .route("/api/v1/openapi.json", web::get().to(openapi::openapi_json))
            .service(
                web::scope("/api/v1")
                    .wrap(from_fn(require_admin_token))
                    .configure(api::configure)
                    .default_service(web::to(tocsin_web::error::not_found)),
            )
            .configure(pages::configure);
    };
    foundation.serve_with_relay("admin", listener, routes, config.workers, relay, common)
}
