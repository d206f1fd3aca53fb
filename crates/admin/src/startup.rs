//! Building the admin service: pool, broker, outbox relay, HTTP server (the API under
//! `/api/v1`, the settings pages under `/settings/`), and the audit log's retention.

use std::time::Duration;

use actix_web::middleware::from_fn;
use actix_web::web;
use anyhow::Context;
use tocsin_web::Service;

use crate::api;
use crate::auth::authenticate;
use crate::config::Config;
use crate::openapi::{self, OpenApiJson};
use crate::pages::{self, PagesState};
use crate::state::AdminState;

/// The running admin service.
pub type App = Service;

/// How often admin deletes audit log entries past their retention.
const AUDIT_PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);

/// Checks the admin token, migrates the database, then builds the service listening on
/// `config.addr`. With the bootstrap token turned off, refuses to start unless a live `admin`
/// key exists (nobody could manage the service otherwise).
pub async fn build(config: Config) -> anyhow::Result<App> {
    let token = config
        .admin_token
        .clone()
        .context("TOCSIN_ADMIN_TOKEN: the admin token is required to serve")?;
    token.check()?;
    let common = &config.common;
    let foundation = common.foundation("admin").await?;
    if config.admin_token_disabled {
        let mut conn = foundation
            .pool
            .get()
            .await
            .context("DATABASE_URL: looking for a live admin key")?;
        let any = tocsin_storage::admin_keys::any_live_admin(&mut conn)
            .await
            .context("looking for a live admin key")?;
        if !any {
            anyhow::bail!(
                "TOCSIN_ADMIN_TOKEN_DISABLED: the bootstrap token is turned off but no live admin \
                 key exists, so nobody could manage Tocsin; issue one first \
                 (`tocsin-admin key create --name NAME --role admin`) or leave the token on"
            );
        }
    }
    let relay = common.outbox_relay(&foundation, config.outbox_poll)?;
    let refusals = crate::auth::refusals_metric(&foundation.registry)?;
    let state = web::Data::new(AdminState {
        pool: foundation.pool.clone(),
        relay: relay.waker(),
        secret_grace: config.secret_grace,
        body_limit: config.body_limit,
        bootstrap: (!config.admin_token_disabled).then(|| token.clone()),
        refusals,
    });
    let limiter = web::Data::new(crate::auth::FailedAuthLimiter::new(usize::from(
        config.auth_failures,
    )));
    let oidc = config.oidc()?.map(crate::oidc::Oidc::new).transpose()?;
    let pages_state = web::Data::new(PagesState::new(
        &token,
        config.secure_cookies,
        common.retry_delays.clone(),
        config.body_limit,
        limiter.clone(),
        oidc,
    ));
    let document = web::Data::new(OpenApiJson(openapi::document()));

    let listener = tocsin_web::service::bind(&config.addr, "TOCSIN_ADMIN_ADDR")?;
    let query_config =
        web::QueryConfig::default().error_handler(tocsin_web::error::query_error_handler);
    let path_config =
        web::PathConfig::default().error_handler(tocsin_web::error::path_error_handler);
    let pool = foundation.pool.clone();
    let routes = move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone())
            .app_data(limiter.clone())
            .app_data(document.clone())
            .app_data(pages_state.clone())
            .app_data(query_config.clone())
            .app_data(path_config.clone())
            .route("/api/v1/openapi.json", web::get().to(openapi::openapi_json))
            .service(
                web::scope("/api/v1")
                    .wrap(from_fn(authenticate))
                    .configure(api::configure)
                    .default_service(web::to(tocsin_web::error::not_found)),
            )
            .configure(pages::configure);
    };
    let mut service =
        foundation.serve_with_relay("admin", listener, routes, config.workers, relay, common)?;
    let retention = config.audit_retention;
    service.spawn_background("audit-retention", move |stop| async move {
        loop {
            if let Err(error) = prune_audit_log(&pool, retention).await {
                tracing::warn!(error = %format!("{error:#}"), "pruning the audit log failed; trying again later");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(AUDIT_PRUNE_EVERY) => {}
            }
        }
    });
    Ok(service)
}

/// Deletes the audit log entries older than `retention`.
async fn prune_audit_log(pool: &tocsin_storage::DbPool, retention: Duration) -> anyhow::Result<()> {
    let keep = time::Duration::try_from(retention).context("TOCSIN_AUDIT_RETENTION: too long")?;
    let mut conn = pool.get().await?;
    let pruned =
        tocsin_storage::audit::prune(&mut conn, time::OffsetDateTime::now_utc() - keep).await?;
    if pruned > 0 {
        tracing::info!(pruned, "audit log entries past their retention deleted");
    }
    Ok(())
}
