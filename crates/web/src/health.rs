//! `GET /healthz` (the process is alive) and `GET /readyz` (PostgreSQL and RabbitMQ answer).

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde_json::json;
use tocsin_broker::Broker;
use tocsin_storage::DbPool;

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// What `/readyz` checks.
#[derive(Clone)]
pub struct Readiness {
    pub pool: DbPool,
    pub broker: Broker,
}

impl Readiness {
    /// Checks both servers at once; `Err` carries a description of what is down.
    pub async fn check(&self) -> (Result<(), String>, Result<(), String>) {
        let postgres = async {
            tocsin_storage::ping(&self.pool, CHECK_TIMEOUT)
                .await
                .map_err(|e| e.to_string())
        };
        let rabbitmq = async {
            match tokio::time::timeout(CHECK_TIMEOUT, self.broker.check()).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err("timed out".to_owned()),
            }
        };
        tokio::join!(postgres, rabbitmq)
    }
}

/// Adds `/healthz` and `/readyz`.
pub fn configure(cfg: &mut web::ServiceConfig, readiness: Readiness) {
    cfg.app_data(web::Data::new(readiness))
        .service(
            web::resource("/healthz")
                .route(web::get().to(healthz))
                .default_service(web::to(crate::error::get_only)),
        )
        .service(
            web::resource("/readyz")
                .route(web::get().to(readyz))
                .default_service(web::to(crate::error::get_only)),
        );
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

async fn readyz(readiness: web::Data<Readiness>) -> HttpResponse {
    let (postgres, rabbitmq) = readiness.check().await;
    let describe = |r: &Result<(), String>| match r {
        Ok(()) => json!("ok"),
        Err(e) => json!(e),
    };
    let body = json!({
        "status": if postgres.is_ok() && rabbitmq.is_ok() { "ready" } else { "not_ready" },
        "checks": { "postgres": describe(&postgres), "rabbitmq": describe(&rabbitmq) },
    });
    if postgres.is_ok() && rabbitmq.is_ok() {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
