//! Prometheus metrics: one registry per service instance, HTTP request metrics for every route,
//! and `GET /metrics` in the text exposition format.

use std::time::Instant;

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::{web, HttpResponse};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// Latency buckets in seconds, from 1 ms to 30 s (the longest webhook timeout).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0,
];

/// Buckets for lags, from 1 ms to 2 h (the last retry delay), so that a backlog shows.
pub const LAG_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 1800.0, 3600.0, 7200.0,
];

/// HTTP request metrics of a service.
#[derive(Clone)]
pub struct HttpMetrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
}

impl HttpMetrics {
    /// Registers the HTTP metrics in `registry`.
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "tocsin_http_requests_total",
                "HTTP requests answered, by route, method and status.",
            ),
            &["route", "method", "status"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "tocsin_http_request_duration_seconds",
                "Time to answer an HTTP request, by route.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(HttpMetrics {
            registry: registry.clone(),
            requests,
            duration,
        })
    }

    fn observe(&self, route: &str, method: &str, status: u16, started: Instant) {
        self.requests
            .with_label_values(&[route, method, &status.to_string()])
            .inc();
        self.duration
            .with_label_values(&[route])
            .observe(started.elapsed().as_secs_f64());
    }

    /// The registry's contents in the Prometheus text format.
    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

/// A registry's contents in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .expect("encoding metrics to memory cannot fail");
    String::from_utf8(buffer).expect("the text format is UTF-8")
}

/// Adds `/metrics`.
pub fn configure(cfg: &mut web::ServiceConfig, metrics: HttpMetrics) {
    cfg.app_data(web::Data::new(metrics)).service(
        web::resource("/metrics")
            .route(web::get().to(metrics_endpoint))
            .default_service(web::to(crate::error::get_only)),
    );
}

async fn metrics_endpoint(metrics: web::Data<HttpMetrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metrics.render())
}

/// Middleware recording every request under its route pattern (unmatched routes as `unmatched`).
pub fn middleware<S, B>(
    metrics: HttpMetrics,
) -> impl Fn(
    ServiceRequest,
    &S,
) -> futures::future::LocalBoxFuture<'static, Result<ServiceResponse<B>, actix_web::Error>>
       + Clone
where
    S: actix_web::dev::Service<
            ServiceRequest,
            Response = ServiceResponse<B>,
            Error = actix_web::Error,
        > + 'static,
    B: 'static,
{
    move |req: ServiceRequest, service: &S| {
        let started = Instant::now();
        let route = req
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        let method = req.method().to_string();
        let metrics = metrics.clone();
        let future = service.call(req);
        Box::pin(async move {
            let result = future.await;
            let status = match &result {
                Ok(response) => response.status().as_u16(),
                Err(error) => error.as_response_error().status_code().as_u16(),
            };
            metrics.observe(&route, &method, status, started);
            result
        })
    }
}
