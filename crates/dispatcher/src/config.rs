//! Settings of `tocsin-dispatcher` (besides the common ones of `tocsin_web::config`):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `TOCSIN_DISPATCHER_ADDR` | `127.0.0.1:8082` | address of `/healthz`, `/readyz`, `/metrics` |
//! | `TOCSIN_ALLOWED_TARGETS` | empty | CIDRs exempt from the SSRF rules, comma-separated |
//! | `TOCSIN_DISPATCHER_CONCURRENCY` | `256` | attempts in flight at once (the delivery queue's prefetch) |
//! | `TOCSIN_FANOUT_PREFETCH` | `256` | events fanned out at once |
//! | `TOCSIN_WEBHOOK_CONCURRENCY` | `64` | requests in flight to one webhook; its other deliveries are `waiting` until one finishes |
//! | `TOCSIN_SWEEP_INTERVAL` | `30s` | how often the sweeper looks for overdue deliveries |
//! | `TOCSIN_SWEEP_GRACE` | `2m` | how overdue a delivery must be before the sweeper re-enqueues it |
//! | `TOCSIN_RESPONSE_BODY_LIMIT` | `65536` | bytes of a target's response body kept in the log |
//! | `TOCSIN_RETENTION` | `30d` | finished deliveries, their attempts and events older than this are deleted |
//! | `TOCSIN_PRUNE_INTERVAL` | `1h` | how often the dispatcher prunes (0s: never) |
//! | `TOCSIN_AUTO_DISABLE_AFTER` | `5d` | a webhook failing without a success this long is disabled (`0`: never) |

use std::time::Duration;

use tocsin_web::config::{parse_duration_arg, CommonConfig};

use tocsin_web::ssrf::TargetPolicy;

/// `tocsin-dispatcher` settings.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "tocsin-dispatcher",
    version,
    about = "Tocsin's webhook dispatcher"
)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Address of the health and metrics endpoints.
    #[arg(
        long,
        env = "TOCSIN_DISPATCHER_ADDR",
        value_name = "TOCSIN_DISPATCHER_ADDR",
        default_value = "127.0.0.1:8082"
    )]
    pub addr: String,

    /// CIDRs exempt from the SSRF rules (e.g. `127.0.0.0/8,10.1.0.0/16`).
    #[arg(long, env = "TOCSIN_ALLOWED_TARGETS", value_name = "TOCSIN_ALLOWED_TARGETS", default_value = "", value_parser = TargetPolicy::parse)]
    pub allowed_targets: TargetPolicy,

    /// Attempts in flight at once.
    #[arg(long, env = "TOCSIN_DISPATCHER_CONCURRENCY", value_name = "TOCSIN_DISPATCHER_CONCURRENCY", default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=10000))]
    pub concurrency: u16,

    /// Requests in flight to one webhook at once; the webhook's other deliveries are `waiting`
    /// in the delivery log until one finishes.
    #[arg(long, env = "TOCSIN_WEBHOOK_CONCURRENCY", value_name = "TOCSIN_WEBHOOK_CONCURRENCY", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=10000))]
    pub webhook_concurrency: u16,

    /// Events fanned out at once.
    #[arg(long, env = "TOCSIN_FANOUT_PREFETCH", value_name = "TOCSIN_FANOUT_PREFETCH", default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub fanout_prefetch: u16,

    /// How often the sweeper runs.
    #[arg(long, env = "TOCSIN_SWEEP_INTERVAL", value_name = "TOCSIN_SWEEP_INTERVAL", default_value = "30s", value_parser = parse_duration_arg)]
    pub sweep_interval: Duration,

    /// How overdue a delivery must be before the sweeper re-enqueues it.
    #[arg(long, env = "TOCSIN_SWEEP_GRACE", value_name = "TOCSIN_SWEEP_GRACE", default_value = "2m", value_parser = parse_duration_arg)]
    pub sweep_grace: Duration,

    /// Bytes of a response body kept in the delivery log.
    #[arg(long, env = "TOCSIN_RESPONSE_BODY_LIMIT", value_name = "TOCSIN_RESPONSE_BODY_LIMIT", default_value_t = 64 * 1024)]
    pub response_body_limit: usize,

    /// Finished deliveries, their attempts and unreferenced events older than this are deleted.
    #[arg(long, env = "TOCSIN_RETENTION", value_name = "TOCSIN_RETENTION", default_value = "30d", value_parser = parse_duration_arg)]
    pub retention: Duration,

    /// How often the dispatcher prunes (0s turns pruning off in this dispatcher).
    #[arg(long, env = "TOCSIN_PRUNE_INTERVAL", value_name = "TOCSIN_PRUNE_INTERVAL", default_value = "1h", value_parser = parse_duration_arg)]
    pub prune_interval: Duration,

    /// A webhook whose attempts have failed without a single success for this long is
    /// disabled, with its reason (`0`: never). The sweeper checks on each pass.
    #[arg(long, env = "TOCSIN_AUTO_DISABLE_AFTER", value_name = "TOCSIN_AUTO_DISABLE_AFTER", default_value = "5d", value_parser = parse_auto_disable_after)]
    pub auto_disable_after: Duration,
}

/// `0` (never) or a duration.
fn parse_auto_disable_after(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration_arg(text)
}

impl Config {
    /// Settings for a test: port 0, loopback targets allowed, a fast sweeper.
    pub fn for_tests(common: CommonConfig) -> Self {
        Config {
            common,
            addr: "127.0.0.1:0".into(),
            allowed_targets: TargetPolicy::parse("127.0.0.0/8,::1/128").expect("valid CIDRs"),
            concurrency: 32,
            webhook_concurrency: 32,
            fanout_prefetch: 8,
            sweep_interval: Duration::from_millis(500),
            sweep_grace: Duration::from_secs(2),
            response_body_limit: 64 * 1024,
            retention: Duration::from_secs(30 * 86_400),
            prune_interval: Duration::ZERO,
            auto_disable_after: Duration::from_secs(5 * 86_400),
        }
    }
}
