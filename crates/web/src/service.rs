//! Running a service: its HTTP server and background tasks, stopped gracefully on SIGTERM or
//! SIGINT (or a stop token, in tests) — stop accepting, finish in-flight requests, cancel the
//! background tasks and wait for them within the shutdown bound, exit.

use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Background work of a service: tasks that stop when the token is cancelled.
#[derive(Default)]
pub struct Background {
    cancel: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Background {
    pub fn new() -> Self {
        Self::default()
    }

    /// The token background tasks watch.
    pub fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Spawns a named task.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.push((name, tokio::spawn(task)));
    }
}

/// A running service: an HTTP server on a port, plus its background tasks.
pub struct Service {
    name: &'static str,
    server: actix_web::dev::Server,
    port: u16,
    background: Background,
    stop: CancellationToken,
    shutdown_timeout: Duration,
}

impl Service {
    pub fn new(
        name: &'static str,
        server: actix_web::dev::Server,
        port: u16,
        background: Background,
        shutdown_timeout: Duration,
    ) -> Self {
        Service {
            name,
            server,
            port,
            background,
            stop: CancellationToken::new(),
            shutdown_timeout,
        }
    }

    /// The port the HTTP server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `task` in the background beside the service's own tasks; it is given the token
    /// cancelled when the service stops.
    pub fn spawn_background<F>(
        &mut self,
        name: &'static str,
        task: impl FnOnce(CancellationToken) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let token = self.background.token();
        self.background.spawn(name, task(token));
    }

    /// Cancel this token to stop the service as SIGTERM would.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Serves until SIGTERM, SIGINT or the stop token, then stops gracefully.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Service {
            name,
            server,
            port,
            background,
            stop,
            shutdown_timeout,
        } = self;
        let handle = server.handle();
        let mut server = tokio::spawn(server);
        tracing::info!(service = name, port, "serving");
        let mut finished_early = None;
        tokio::select! {
            result = &mut server => finished_early = Some(result),
            reason = shutdown_signal() => tracing::info!(service = name, %reason, "stopping"),
            _ = stop.cancelled() => tracing::info!(service = name, "stopping on request"),
        }
        // The HTTP server stops accepting and finishes in-flight requests first, so that what
        // they commit is still seen by background work (the outbox relay's last pass); then
        // background work stops taking new work and drains within the bound.
        if finished_early.is_none() {
            handle.stop(true).await;
            finished_early = Some(server.await);
        }
        background.cancel.cancel();
        let drained = tokio::time::timeout(shutdown_timeout + Duration::from_secs(2), async {
            for (task, join) in background.tasks {
                if let Err(error) = join.await {
                    tracing::error!(service = name, task, %error, "background task failed");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                service = name,
                "background tasks did not stop within the shutdown bound"
            );
        }
        tracing::info!(service = name, "stopped");
        match finished_early {
            Some(result) => result
                .context("the HTTP server task panicked")?
                .context("the HTTP server failed"),
            None => Ok(()),
        }
    }
}

async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}

/// Starts a Tocsin HTTP server on `listener`: every request is measured, `/healthz`,
/// `/readyz` and `/metrics` are served beside the routes `routes` adds, and unknown routes get
/// the common 404. Signals are the service's to handle (graceful stop), in-flight requests get
/// `shutdown_timeout` to finish, slow clients are cut off (a request's head must arrive within
/// `client_timeout`, `TOCSIN_CLIENT_TIMEOUT`, so slowloris clients cannot hold connections),
/// and `workers` threads serve (one per CPU when `None`).
pub fn serve<R>(
    listener: std::net::TcpListener,
    routes: R,
    http_metrics: crate::HttpMetrics,
    readiness: crate::Readiness,
    shutdown_timeout: Duration,
    workers: Option<usize>,
    client_timeout: Duration,
) -> std::io::Result<actix_web::dev::Server>
where
    R: Fn(&mut actix_web::web::ServiceConfig) + Send + Clone + 'static,
{
    let mut server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .wrap_fn(crate::metrics::middleware(http_metrics.clone()))
            .configure(|cfg| crate::health::configure(cfg, readiness.clone()))
            .configure(|cfg| crate::metrics::configure(cfg, http_metrics.clone()))
            .configure(routes.clone())
            .default_service(actix_web::web::to(crate::error::not_found))
    })
    .disable_signals()
    .shutdown_timeout(shutdown_timeout.as_secs())
    .client_request_timeout(client_timeout)
    .client_disconnect_timeout(Duration::from_secs(2));
    if let Some(workers) = workers {
        server = server.workers(workers.max(1));
    }
    Ok(server.listen(listener)?.run())
}

/// Binds a listener, failing with a line that names the setting.
pub fn bind(address: &str, setting: &str) -> anyhow::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(address)
        .with_context(|| format!("{setting}: cannot listen on {address}"))
}
