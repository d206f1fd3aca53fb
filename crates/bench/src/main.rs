//! `tocsin-bench`: see the crate documentation and `tocsin-bench --help`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tocsin_bench::floor::FloorConfig;
use tocsin_bench::{
    BacklogConfig, Bench, FanoutConfig, LatencyConfig, Load, LoadConfig, SlowTargetConfig, Target,
};

/// Load generator for a running Tocsin.
///
/// It creates its own inbound token (unless given one) and its own webhooks pointing at an
/// in-process receiver on 127.0.0.1, sends alerts to ingest, matches every delivery to its
/// alert, deletes its webhooks at the end, and reports throughput, latency, errors, duplicates,
/// lost deliveries, and the CPU seconds and peak RSS of the tocsin-* processes on this machine.
/// The dispatcher must allow loopback targets (TOCSIN_ALLOWED_TARGETS=127.0.0.0/8, which
/// deploy/local/up sets). For runs above 1 000 alerts/s, start ingest with
/// TOCSIN_INGEST_RATE_LIMIT=0 (the default limit is 1 000 requests/s per token).
#[derive(Debug, Parser)]
#[command(name = "tocsin-bench", version, verbatim_doc_comment)]
struct Cli {
    /// Base URL of tocsin-ingest.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    ingest_url: String,

    /// Base URL of tocsin-admin.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8081")]
    admin_url: String,

    /// Admin API token (default: the contents of .tocsin/admin-token, written by deploy/local/up).
    #[arg(
        long,
        global = true,
        env = "TOCSIN_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,

    /// Inbound token for ingest (default: a new one created through the admin API).
    #[arg(
        long,
        global = true,
        env = "TOCSIN_INBOUND_TOKEN",
        hide_env_values = true
    )]
    inbound_token: Option<String>,

    /// How long to wait for deliveries after the last alert was sent (e.g. 30s, 500ms, 2m).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,

    /// The `ordering` of the webhooks the bench creates: `none` (the default) or `incident`
    /// (each incident's events in order).
    #[arg(
        long,
        global = true,
        env = "TOCSIN_BENCH_ORDERING",
        default_value = "none"
    )]
    ordering: String,

    /// The services' /metrics URLs (comma-separated), read before and after each phase for the
    /// latency budget: the time of each stage of the alerts' way.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080/metrics,http://127.0.0.1:8081/metrics,http://127.0.0.1:8082/metrics"
    )]
    metrics_url: Vec<String>,

    /// Also write the report as JSON to this file.
    #[arg(long, global = true)]
    json: Option<PathBuf>,

    /// Also write an SVG chart of latency over time to this file.
    #[arg(long, global = true)]
    svg: Option<PathBuf>,

    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Args, Clone, Copy)]
struct LoadArgs {
    /// Alerts to send.
    #[arg(long, default_value_t = 10_000)]
    alerts: usize,

    /// Senders in a closed loop (each sends its next alert when the last one is answered).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,

    /// Open loop instead: alerts started per second, whatever the answers.
    #[arg(long)]
    rate: Option<f64>,
}

impl LoadArgs {
    fn config(self) -> LoadConfig {
        LoadConfig {
            alerts: self.alerts,
            load: match self.rate {
                Some(rate) => Load::Open { rate },
                None => Load::Closed {
                    concurrency: self.concurrency,
                },
            },
        }
    }
}

/// The database of the system under test, for scenarios that read it or write to it directly.
#[derive(Debug, Args)]
struct SystemDatabase {
    /// The database the system under test uses.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/tocsin"
    )]
    database_url: String,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Ingest alone (no webhook of the bench subscribed): alerts accepted/s and response times.
    Ingest(LoadArgs),
    /// Alerts to one webhook: deliveries/s end to end, latency, lost, duplicates.
    E2e(LoadArgs),
    /// Open loop at fixed rates, one webhook: latency at each rate.
    Latency {
        /// Alerts per second of each step, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "100,500,1000")]
        rates: Vec<f64>,
        /// How long each step sends.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
    },
    /// One event to many webhooks: time from the send to the last receipt.
    Fanout {
        /// Webhooks subscribed.
        #[arg(long, default_value_t = 1000)]
        webhooks: usize,
        /// Alerts, sent one after the other.
        #[arg(long, default_value_t = 1)]
        alerts: usize,
    },
    /// A healthy webhook alone, then beside one whose receiver hangs until its timeout: the
    /// healthy webhook's throughput and latency in both.
    SlowTarget {
        #[command(flatten)]
        load: LoadArgs,
        /// The hanging webhook's timeout_ms (1000 to 30000).
        #[arg(long, default_value_t = 1000)]
        slow_timeout_ms: u32,
    },
    /// e2e, labelled with the number of dispatchers running; it measures whatever dispatchers
    /// run. Run it twice and compare:
    ///
    ///   one dispatcher:  deploy/local/up, then `tocsin-bench scale --dispatcher-count 1`
    ///   two dispatchers: start a second dispatcher beside the first, with the same settings
    ///                    and another health address, e.g.
    ///                    `TOCSIN_DISPATCHER_ADDR=127.0.0.1:8083 DATABASE_URL=... AMQP_URL=...
    ///                     TOCSIN_ALLOWED_TARGETS=127.0.0.0/8 target/release/tocsin-dispatcher &`
    ///                    then `tocsin-bench scale --dispatcher-count 2`
    ///
    /// The report also counts the tocsin-dispatcher processes it finds in /proc.
    #[command(verbatim_doc_comment)]
    Scale {
        #[command(flatten)]
        load: LoadArgs,
        /// How many dispatchers the operator started (a label only).
        #[arg(long)]
        dispatcher_count: Option<usize>,
    },
    /// The floor of the durable steps on an alert's way, on this machine: a PostgreSQL commit
    /// and a RabbitMQ publish confirm (quorum queue), each alone, in a table and a queue of its
    /// own made and removed; no Tocsin service is needed.
    Floor {
        /// The PostgreSQL server (the table is made in this database).
        #[arg(
            long,
            env = "DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        database_url: String,
        /// The RabbitMQ server.
        #[arg(
            long,
            env = "AMQP_URL",
            default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
        )]
        amqp_url: String,
        /// Commits and publishes measured, each.
        #[arg(long, default_value_t = 500)]
        samples: usize,
        /// The pause before each sample (e.g. 50ms, the gap between alerts at 20/s): at a low
        /// rate the processes on the way wait idle between alerts, and an idle machine answers
        /// slower than a busy one. 0: back to back.
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        interval: Duration,
    },
    /// The system with months of history: fills the database to `--deliveries` deliveries
    /// spread over the past `--days` days (through the real schema: incidents, events,
    /// deliveries, attempts; `--failed-share` of deliveries failed after five attempts), then
    /// measures e2e, the delivery log's reads through the admin API (first page; by webhook,
    /// incident and state; the 20th page by cursor; one old delivery with its attempts) and a
    /// retention pass removing the oldest day, with a 20/s stream before it, again before it
    /// (the control) and during it. A database holding the deliveries already is not filled
    /// again.
    Aged {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        database: SystemDatabase,
        /// Deliveries the database holds before the measures.
        #[arg(long, default_value_t = 5_000_000)]
        deliveries: i64,
        /// Past days the deliveries are spread over.
        #[arg(long, default_value_t = 30)]
        days: i64,
        /// Webhooks the aged deliveries go to.
        #[arg(long, default_value_t = 3)]
        webhooks: usize,
        /// Share of aged deliveries that failed after five attempts.
        #[arg(long, default_value_t = 0.05)]
        failed_share: f64,
        /// Times each read is made.
        #[arg(long, default_value_t = 200)]
        reads: usize,
        /// Retention passes, each removing the next oldest day under its own 20/s stream, after
        /// two with no pass (before, and again: the control); the streams' latencies are also
        /// pooled over all passes.
        #[arg(long, default_value_t = 1)]
        retention_passes: i64,
    },
    /// A steady open loop to one webhook for a long time, with the retention the dispatcher
    /// runs: window by window, deliveries/s, latency p50 and p99, the dispatcher's RSS and the
    /// size of each table that grows with traffic; then the first ten windows against the last
    /// ten.
    Soak {
        /// The tables' sizes are read there.
        #[command(flatten)]
        database: SystemDatabase,
        /// Alerts per second.
        #[arg(long, default_value_t = 300.0)]
        rate: f64,
        /// How long the stream runs.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        duration: Duration,
        /// The length of each window the figures are taken over.
        #[arg(long, default_value = "1m", value_parser = parse_duration)]
        window: Duration,
    },
    /// Deliveries to a failing receiver path, so that they sit in the retry queue; samples the
    /// dispatcher's RSS every second and reports its min and max.
    Backlog {
        #[command(flatten)]
        load: LoadArgs,
        /// How long to keep the backlog and go on sampling after the first attempts arrived.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        hold: Duration,
    },
}

/// `500ms`, `10s`, `2m`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (try 500ms, 10s, 2m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit in {s:?} (ms, s, m, h)")),
    };
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!("not a duration: {s:?}"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let report = match &cli.scenario {
        Scenario::Floor {
            database_url,
            amqp_url,
            samples,
            interval,
        } => {
            tocsin_bench::floor::floor(FloorConfig {
                database_url: database_url.clone(),
                amqp_url: amqp_url.clone(),
                samples: *samples,
                interval: *interval,
            })
            .await?
        }
        scenario => run(&cli, scenario).await?,
    };
    finish(&cli, &report)
}

/// Runs a scenario against the running system.
async fn run(cli: &Cli, scenario: &Scenario) -> anyhow::Result<tocsin_bench::Report> {
    let admin_token = cli
        .admin_token
        .clone()
        .or_else(tocsin_bench::default_admin_token)
        .context("no admin token: pass --admin-token, set TOCSIN_ADMIN_TOKEN, or run deploy/local/up (it writes .tocsin/admin-token)")?;
    let bench = Arc::new(
        Bench::connect(Target {
            ingest_url: cli.ingest_url.trim_end_matches('/').to_owned(),
            admin_url: cli.admin_url.trim_end_matches('/').to_owned(),
            admin_token,
            inbound_token: cli.inbound_token.clone(),
            drain_timeout: cli.drain_timeout,
            ordering: cli.ordering.clone(),
            metrics_urls: cli.metrics_url.clone(),
        })
        .await?,
    );
    Ok(match *scenario {
        Scenario::Ingest(load) => tocsin_bench::ingest(&bench, load.config()).await?,
        Scenario::E2e(load) => tocsin_bench::e2e(&bench, load.config()).await?,
        Scenario::Latency {
            ref rates,
            duration,
        } => {
            let rates = rates.clone();
            tocsin_bench::latency(&bench, LatencyConfig { rates, duration }).await?
        }
        Scenario::Fanout { webhooks, alerts } => {
            tocsin_bench::fanout(&bench, FanoutConfig { webhooks, alerts }).await?
        }
        Scenario::SlowTarget {
            load,
            slow_timeout_ms,
        } => {
            tocsin_bench::slow_target(
                &bench,
                SlowTargetConfig {
                    load: load.config(),
                    slow_timeout_ms,
                },
            )
            .await?
        }
        Scenario::Scale {
            load,
            dispatcher_count,
        } => tocsin_bench::scale(&bench, load.config(), dispatcher_count).await?,
        Scenario::Backlog { load, hold } => {
            tocsin_bench::backlog(
                &bench,
                BacklogConfig {
                    load: load.config(),
                    hold,
                },
            )
            .await?
        }
        Scenario::Aged {
            load,
            ref database,
            deliveries,
            days,
            webhooks,
            failed_share,
            reads,
            retention_passes,
        } => {
            tocsin_bench::aged::aged(
                &bench,
                tocsin_bench::aged::AgedConfig {
                    database_url: database.database_url.clone(),
                    deliveries,
                    days,
                    webhooks,
                    failed_share,
                    load: load.config(),
                    reads,
                    retention_passes,
                },
            )
            .await?
        }
        Scenario::Soak {
            ref database,
            rate,
            duration,
            window,
        } => {
            tocsin_bench::soak::soak(
                &bench,
                tocsin_bench::soak::SoakConfig {
                    database_url: database.database_url.clone(),
                    rate,
                    duration,
                    window,
                },
            )
            .await?
        }
        // Measured by `main` without a system.
        Scenario::Floor { .. } => anyhow::bail!("the floor is measured without a system"),
    })
}

/// Prints the report, writes the files asked for, and exits 2 when a delivery was lost or an
/// alert refused.
fn finish(cli: &Cli, report: &tocsin_bench::Report) -> anyhow::Result<()> {
    print!("{}", tocsin_bench::output::table(report));
    if let Some(path) = &cli.json {
        tocsin_bench::write_json(report, path)?;
        println!("json: {}", tocsin_bench::display_path(path).display());
    }
    if let Some(path) = &cli.svg {
        tocsin_bench::output::svg(report, path)?;
        println!("svg: {}", tocsin_bench::display_path(path).display());
    }
    if report.lost() > 0 || report.errors() > 0 {
        std::process::exit(2);
    }
    Ok(())
}
