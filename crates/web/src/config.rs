//! Settings every service reads, parsed once at start by clap from flags with
//! environment fallbacks:
//!
//! | variable | default |
//! |---|---|
//! | `DATABASE_URL` | `postgres://postgres@127.0.0.1:5432/tocsin` |
//! | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` |
//! | `TOCSIN_AMQP_PREFIX` | `tocsin` |
//! | `TOCSIN_AMQP_QUEUE_TYPE` | `quorum` |
//! | `TOCSIN_RETRY_DELAYS` | `0s,1m,5m,30m,2h` |
//! | `TOCSIN_DB_POOL_SIZE` | `16` |
//! | `TOCSIN_SHUTDOWN_TIMEOUT` | `20s` |
//! | `TOCSIN_CLIENT_TIMEOUT` | `10s` |
//! | `TOCSIN_LOG_FORMAT` | `text` |
//! | `RUST_LOG` | `info` |

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use tocsin_broker::{Broker, QueueType, Topology};
use tocsin_domain::redact_url;
use tocsin_domain::retry::{parse_duration, RetrySchedule};
use tocsin_storage::relay::OutboxRelay;
use tocsin_storage::DbPool;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/tocsin";
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub use crate::telemetry::LogFormat;

/// The settings shared by ingest, dispatcher and admin. `Debug` hides the URLs' passwords.
#[derive(Clone, clap::Args)]
pub struct CommonConfig {
    /// PostgreSQL connection URL; several hosts in the libpq multi-host form
    /// (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`).
    #[arg(long, env = "DATABASE_URL", value_name = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,

    /// RabbitMQ connection URL, or several (a cluster's nodes) separated by commas.
    #[arg(long, env = "AMQP_URL", value_name = "AMQP_URL", default_value = DEFAULT_AMQP_URL, hide_env_values = true)]
    pub amqp_url: String,

    /// Every exchange and queue name starts with this prefix.
    #[arg(long, env = "TOCSIN_AMQP_PREFIX", value_name = "TOCSIN_AMQP_PREFIX", default_value = "tocsin", value_parser = parse_prefix)]
    pub amqp_prefix: String,

    /// Queue type of the declared queues.
    #[arg(
        long,
        env = "TOCSIN_AMQP_QUEUE_TYPE",
        value_name = "TOCSIN_AMQP_QUEUE_TYPE",
        value_enum,
        default_value = "quorum"
    )]
    pub amqp_queue_type: QueueType,

    /// Delays before each automatic attempt; the default is exactly the specification's:
    /// 0s, 1m, 5m, 30m, 2h.
    #[arg(long, env = "TOCSIN_RETRY_DELAYS", value_name = "TOCSIN_RETRY_DELAYS", default_value = RetrySchedule::DEFAULT_TEXT)]
    pub retry_delays: RetrySchedule,

    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "TOCSIN_DB_POOL_SIZE", value_name = "TOCSIN_DB_POOL_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub db_pool_size: u16,

    /// How long a stop may take to finish in-flight work before it is returned.
    #[arg(long, env = "TOCSIN_SHUTDOWN_TIMEOUT", value_name = "TOCSIN_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = parse_duration_arg)]
    pub shutdown_timeout: Duration,

    /// How long a client may take to send a request's head (line and headers) before the
    /// connection is closed, so that slow clients (slowloris) cannot hold connections open.
    #[arg(long, env = "TOCSIN_CLIENT_TIMEOUT", value_name = "TOCSIN_CLIENT_TIMEOUT", default_value = "10s", value_parser = parse_client_timeout)]
    pub client_timeout: Duration,

    /// `text` or `json`.
    #[arg(
        long,
        env = "TOCSIN_LOG_FORMAT",
        value_name = "TOCSIN_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

impl CommonConfig {
    /// Defaults for the given database and prefix (tests and tools).
    pub fn new(database_url: &str, amqp_url: &str, amqp_prefix: &str) -> Self {
        CommonConfig {
            database_url: database_url.to_owned(),
            amqp_url: amqp_url.to_owned(),
            amqp_prefix: amqp_prefix.to_owned(),
            amqp_queue_type: QueueType::Quorum,
            retry_delays: RetrySchedule::default(),
            db_pool_size: 16,
            shutdown_timeout: Duration::from_secs(20),
            client_timeout: Duration::from_secs(10),
            log_format: LogFormat::Text,
        }
    }

    pub fn topology(&self) -> Topology {
        Topology::new(&self.amqp_prefix, &self.retry_delays, self.amqp_queue_type)
    }

    /// A broker handle named after the service.
    pub fn broker(&self, service: &str) -> Broker {
        Broker::new(
            &self.amqp_url,
            self.topology(),
            &format!("tocsin-{service}"),
        )
    }

    pub fn pool(&self) -> anyhow::Result<DbPool> {
        tocsin_storage::pool(&self.database_url, usize::from(self.db_pool_size))
    }

    /// The start every service shares: warns when the retry schedule is shortened, migrates
    /// the database, then opens the pool, a broker handle named after the service and a metrics
    /// registry holding the HTTP series.
    pub async fn foundation(&self, service: &str) -> anyhow::Result<Foundation> {
        self.warn_if_schedule_shortened();
        tocsin_storage::migrate(&self.database_url)
            .await
            .context("DATABASE_URL: migrating the database")?;
        let registry = prometheus::Registry::new();
        Ok(Foundation {
            pool: self.pool()?,
            broker: self.broker(service),
            http_metrics: crate::HttpMetrics::new(&registry)?,
            registry,
        })
    }

    /// The outbox relay of a service that writes events (ingest and admin), polling every
    /// `poll` besides being woken.
    pub fn outbox_relay(
        &self,
        foundation: &Foundation,
        poll: Duration,
    ) -> anyhow::Result<OutboxRelay> {
        OutboxRelay::new(
            foundation.pool.clone(),
            foundation.broker.clone(),
            &self.database_url,
            poll,
            &foundation.registry,
        )
    }

    /// Warns loudly when the retry schedule is not the specification's.
    fn warn_if_schedule_shortened(&self) {
        if !self.retry_delays.is_specification() {
            tracing::warn!(
                schedule = %self.retry_delays,
                specification = RetrySchedule::DEFAULT_TEXT,
                "TOCSIN_RETRY_DELAYS departs from the specification's retry schedule; use this only for tests and demos"
            );
        }
    }
}

/// What [`CommonConfig::foundation`] opens for a service.
pub struct Foundation {
    pub pool: DbPool,
    pub broker: Broker,
    pub registry: prometheus::Registry,
    pub http_metrics: crate::HttpMetrics,
}

impl Foundation {
    /// Serves a service that writes events (ingest, admin): `routes` beside health and metrics
    /// on `listener` with `workers` threads, and its outbox `relay` in the background.
    pub fn serve_with_relay<R>(
        self,
        name: &'static str,
        listener: std::net::TcpListener,
        routes: R,
        workers: Option<usize>,
        relay: OutboxRelay,
        common: &CommonConfig,
    ) -> anyhow::Result<crate::Service>
    where
        R: Fn(&mut actix_web::web::ServiceConfig) + Send + Clone + 'static,
    {
        let port = listener.local_addr()?.port();
        let readiness = crate::Readiness {
            pool: self.pool,
            broker: self.broker,
        };
        let server = crate::service::serve(
            listener,
            routes,
            self.http_metrics,
            readiness,
            common.shutdown_timeout,
            workers,
            common.client_timeout,
        )?;
        let mut background = crate::Background::new();
        background.spawn("outbox-relay", relay.run(background.token()));
        Ok(crate::Service::new(
            name,
            server,
            port,
            background,
            common.shutdown_timeout,
        ))
    }
}

/// Every setting, with the passwords `DATABASE_URL` and `AMQP_URL` may hold replaced by `***`
/// (the derived `Debug` printed them wherever a service's settings were logged).
impl fmt::Debug for CommonConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Taken apart so that a new field cannot be left out unnoticed.
        let CommonConfig {
            database_url,
            amqp_url,
            amqp_prefix,
            amqp_queue_type,
            retry_delays,
            db_pool_size,
            shutdown_timeout,
            client_timeout,
            log_format,
        } = self;
        f.debug_struct("CommonConfig")
            .field("database_url", &redact_url(database_url))
            .field("amqp_url", &redact_url(amqp_url))
            .field("amqp_prefix", amqp_prefix)
            .field("amqp_queue_type", amqp_queue_type)
            .field("retry_delays", retry_delays)
            .field("db_pool_size", db_pool_size)
            .field("shutdown_timeout", shutdown_timeout)
            .field("client_timeout", client_timeout)
            .field("log_format", log_format)
            .finish()
    }
}

fn parse_prefix(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 100
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then(|| text.to_owned())
        .ok_or_else(|| "use 1 to 100 letters, digits, '-', '_' or '.'".to_owned())
}

/// Parses `500ms`, `30s`, `5m`, `2h` for clap.
pub fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

/// Parses `TOCSIN_CLIENT_TIMEOUT`: a duration from 1 ms to 1 h (`0s` would turn the
/// protection off).
fn parse_client_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration_arg(text)?;
    if timeout.is_zero() || timeout > Duration::from_secs(3600) {
        return Err("must be between 1ms and 1h".to_owned());
    }
    Ok(timeout)
}

/// A service's `main`: parses its settings (see [`parse_or_exit`]), starts logging in the
/// format they ask for and, when an OTLP endpoint is set, the export of traces named after the
/// binary ([`crate::telemetry`]), then runs `serve` with them and flushes the traces still
/// queued. An error (unusable OpenTelemetry settings included) is printed after the binary's
/// name, with its causes, and exits with status 1.
pub async fn run_service<C, F, Fut>(
    binary: &str,
    log_format: fn(&C) -> LogFormat,
    serve: F,
) -> std::process::ExitCode
where
    C: clap::Parser,
    F: FnOnce(C) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let config: C = parse_or_exit(binary);
    let telemetry = match crate::telemetry::init(log_format(&config), binary) {
        Ok(telemetry) => telemetry,
        Err(error) => return exit_code(binary, Err(error)),
    };
    let result = serve(config).await;
    telemetry.shutdown().await;
    exit_code(binary, result)
}

/// The exit status of a binary whose work ended with `result`: 0, or 1 after printing the error
/// and its causes after the binary's name.
pub fn exit_code(binary: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{binary}: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Parses a binary's settings from flags and the environment. A missing or invalid setting
/// stops the process with one line naming it (exit status 2); `--help` and `--version` print
/// as usual.
pub fn parse_or_exit<T: clap::Parser>(binary: &str) -> T {
    match T::try_parse() {
        Ok(config) => config,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                error.exit();
            }
            let rendered = error.to_string();
            let line = rendered
                .lines()
                .map(str::trim)
                .filter(|l| {
                    !l.is_empty()
                        && !l.starts_with("For more information")
                        && !l.starts_with("Usage:")
                })
                .collect::<Vec<_>>()
                .join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            eprintln!("{binary}: {line}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonConfig,
    }

    #[test]
    fn defaults_match_the_interface_contract() {
        let cli = Cli::try_parse_from(["test"]).unwrap();
        let c = cli.common;
        assert_eq!(c.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(c.amqp_url, DEFAULT_AMQP_URL);
        assert_eq!(c.amqp_prefix, "tocsin");
        assert!(c.retry_delays.is_specification());
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.client_timeout, Duration::from_secs(10));
        let new = CommonConfig::new(DEFAULT_DATABASE_URL, DEFAULT_AMQP_URL, "tocsin");
        assert_eq!(new.client_timeout, c.client_timeout);
    }

    #[test]
    fn client_timeout_must_be_positive_and_bounded() {
        let cli = Cli::try_parse_from(["test", "--client-timeout", "750ms"]).unwrap();
        assert_eq!(cli.common.client_timeout, Duration::from_millis(750));
        for bad in ["0s", "2h", "ten"] {
            let error = Cli::try_parse_from(["test", "--client-timeout", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("TOCSIN_CLIENT_TIMEOUT"), "{bad}: {error}");
        }
    }

    #[test]
    fn invalid_settings_name_the_variable() {
        let error = Cli::try_parse_from(["test", "--retry-delays", "5s"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("TOCSIN_RETRY_DELAYS"), "{error}");
        let error = Cli::try_parse_from(["test", "--amqp-prefix", "a b"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("TOCSIN_AMQP_PREFIX"), "{error}");
    }

    #[test]
    fn debug_output_hides_the_urls_passwords() {
        let cli = Cli::try_parse_from([
            "test",
            "--database-url",
            "postgres://app:pg-s3cret@h1:5432,h2:5432/tocsin?target_session_attrs=read-write",
            "--amqp-url",
            "amqp://tocsin:mq-s3cret@h1:5672/%2f,amqp://tocsin:mq-other@h2:5672/%2f",
        ])
        .unwrap();
        let keyword = CommonConfig::new(
            "host=h1 user=app password=kw-s3cret dbname=tocsin",
            DEFAULT_AMQP_URL,
            "tocsin",
        );
        for (config, secrets) in [
            (&cli.common, &["pg-s3cret", "mq-s3cret", "mq-other"][..]),
            (&keyword, &["kw-s3cret", ":guest@"][..]),
        ] {
            for printed in [format!("{config:?}"), format!("{config:#?}")] {
                for secret in secrets {
                    assert!(!printed.contains(secret), "{secret} in {printed}");
                }
                assert!(printed.contains("***"), "{printed}");
            }
        }
        let printed = format!("{:?}", cli.common);
        assert!(
            printed.contains("postgres://app:***@h1:5432,h2:5432/tocsin"),
            "{printed}"
        );
        assert!(
            printed.contains("amqp://tocsin:***@h2:5672/%2f"),
            "{printed}"
        );
        assert!(printed.contains("amqp_prefix: \"tocsin\""), "{printed}");
    }
}
