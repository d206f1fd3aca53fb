//! Building the ingest service: pool, broker, outbox relay, HTTP server.

use actix_web::web;
use tocsin_web::Service;

use crate::batched::Batched;
use crate::config::Config;
use crate::metrics::IngestMetrics;
use crate::rate_limit::RateLimiter;
use crate::routes::{
    opsgenie_acknowledge, opsgenie_close, opsgenie_create, receive_alerts, IngestState,
};
use crate::sns::Sns;
use crate::token_cache::{self, TokenCache};

/// Opsgenie's `/v2/alerts` under the base URL Opsgenie-style senders are given
/// (`.../api/v1/webhooks/alerts/opsgenie/`).
const OPSGENIE_ALERTS: &str = "/api/v1/webhooks/alerts/opsgenie/v2/alerts";

/// The running ingest service.
pub type App = Service;

/// Migrates the database, then builds the service listening on `config.addr`.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let common = &config.common;
    let foundation = common.foundation("ingest").await?;
    let relay = common.outbox_relay(&foundation, config.outbox_poll)?;
    // Connections open, and the statements that look a token up and open incidents planned,
    // before the first alert.
    tocsin_storage::warm(&foundation.pool, |conn| {
        Box::pin(async move {
            tocsin_storage::tokens::authenticate_all(conn, &[]).await?;
            tocsin_storage::incidents::prepare(conn).await
        })
    })
    .await;
    let state = web::Data::new(IngestState {
        batched: Batched::start(&foundation.pool, relay.waker()),
        tokens: TokenCache::new(token_cache::FRESH_FOR),
        limiter: RateLimiter::new(config.rate_limit, config.rate_burst),
        metrics: IngestMetrics::new(&foundation.registry)?,
        body_limit: config.body_limit,
        sns: Sns::new(config.sns_hosts()?, config.allowed_targets.clone())?,
    });

    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_INGEST_ADDR")?;
    let query_config =
        web::QueryConfig::default().error_handler(tocsin_web::error::query_error_handler);
    let routes = move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone())
            .app_data(query_config.clone())
            .route("/api/v1/webhooks/alerts", web::post().to(receive_alerts))
            .route(OPSGENIE_ALERTS, web::post().to(opsgenie_create))
            .route(
                &format!("{OPSGENIE_ALERTS}/{{identifier}}/close"),
                web::post().to(opsgenie_close),
            )
            .route(
                &format!("{OPSGENIE_ALERTS}/{{identifier}}/acknowledge"),
                web::post().to(opsgenie_acknowledge),
            );
    };
    foundation.serve_with_relay("ingest", listener, routes, config.workers, relay, common)
}
