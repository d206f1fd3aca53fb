//! Building the ingest service: pool, broker, outbox relay, HTTP server.

use actix_web::web;
use anyhow::Context;
use prometheus::Registry;
use tocsin_storage::relay::OutboxRelay;
use tocsin_web::{Background, HttpMetrics, Readiness, Service};

use crate::batched::Batched;
use crate::config::Config;
use crate::metrics::IngestMetrics;
use crate::rate_limit::RateLimiter;
use crate::routes::{receive_alerts, IngestState};

/// The running ingest service.
pub type App = Service;

/// Migrates the database, then builds the service listening on `config.addr`.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let common = &config.common;
    common.warn_if_schedule_shortened();
    tocsin_storage::migrate(&common.database_url)
        .await
        .context("DATABASE_URL: migrating the database")?;
    let pool = common.pool()?;
    let broker = common.broker("ingest");
    let registry = Registry::new();
    let http_metrics = HttpMetrics::new(&registry)?;
    let relay = OutboxRelay::new(
        pool.clone(),
        broker.clone(),
        &common.database_url,
        config.outbox_poll,
        &registry,
    )?;
    let state = web::Data::new(IngestState {
        batched: Batched::start(&pool),
        relay: relay.waker(),
        limiter: RateLimiter::new(config.rate_limit, config.rate_burst),
        metrics: IngestMetrics::new(&registry)?,
        body_limit: config.body_limit,
    });
    let readiness = Readiness { pool, broker };

    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_INGEST_ADDR")?;
    let port = listener.local_addr()?.port();
    let query_config =
        web::QueryConfig::default().error_handler(tocsin_web::error::query_error_handler);
    let routes = move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone())
            .app_data(query_config.clone())
            .route("/api/v1/webhooks/alerts", web::post().to(receive_alerts));
    };
    let server = tocsin_web::service::serve(
        listener,
        routes,
        http_metrics,
        readiness,
        common.shutdown_timeout,
        config.workers,
        common.client_timeout,
    )?;

    let mut background = Background::new();
    background.spawn("outbox-relay", relay.run(background.token()));
    Ok(Service::new(
        "ingest",
        server,
        port,
        background,
        common.shutdown_timeout,
    ))
}
