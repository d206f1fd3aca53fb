//! Building the ingest service: pool, broker, outbox relay, HTTP server.

use std::time::Duration;

use actix_web::{web, HttpServer};
use anyhow::Context;
use prometheus::Registry;
use tocsin_domain::db;
use tocsin_domain::relay::OutboxRelay;
use tocsin_web::{health, metrics, Background, HttpMetrics, Readiness, Service};

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
    db::migrate(&common.database_url)
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
        pool: pool.clone(),
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
    let mut server = HttpServer::new(move || {
        actix_web::App::new()
            .wrap_fn(metrics::middleware(http_metrics.clone()))
            .app_data(state.clone())
            .app_data(query_config.clone())
            .configure(|cfg| health::configure(cfg, readiness.clone()))
            .configure(|cfg| metrics::configure(cfg, http_metrics.clone()))
            .route("/api/v1/webhooks/alerts", web::post().to(receive_alerts))
            .default_service(web::to(tocsin_web::error::not_found))
    })
    .disable_signals()
    .shutdown_timeout(common.shutdown_timeout.as_secs())
    .client_request_timeout(Duration::from_secs(10))
    .client_disconnect_timeout(Duration::from_secs(2));
    if let Some(workers) = config.workers {
        server = server.workers(workers.max(1));
    }
    let server = server.listen(listener)?.run();

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
