//! Settings of `tocsin-ingest` (besides the common ones of `tocsin_web::config`):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `TOCSIN_INGEST_ADDR` | `127.0.0.1:8080` | listen address |
//! | `TOCSIN_INGEST_BODY_LIMIT` | `524288` | largest accepted body, bytes (512 KiB) |
//! | `TOCSIN_INGEST_RATE_LIMIT` | `1000` | requests per second per token (0: no limit) |
//! | `TOCSIN_INGEST_RATE_BURST` | `2000` | requests a token may send at once |
//! | `TOCSIN_OUTBOX_POLL` | `1s` | fallback poll of the outbox relay |
//! | `TOCSIN_HTTP_WORKERS` | CPU count | HTTP worker threads |
//! | `TOCSIN_SNS_HOSTS` | `sns.*.amazonaws.com,sns.*.amazonaws.com.cn` | hosts whose SNS `SubscribeURL` (to confirm a subscription) and `SigningCertURL` (to check a signature) ingest fetches; `TOCSIN_SNS_CONFIRM_HOSTS`, its name before, is read when it is unset |
//! | `TOCSIN_ALLOWED_TARGETS` | empty | CIDRs exempt from the SSRF rules for that request (as for webhook deliveries) |

use std::time::Duration;

use tocsin_web::config::{parse_duration_arg, CommonConfig};
use tocsin_web::ssrf::TargetPolicy;

use crate::sns::SnsHosts;

/// `tocsin-ingest` settings.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "tocsin-ingest",
    version,
    about = "Tocsin's inbound alert endpoint"
)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Address to listen on.
    #[arg(
        long,
        env = "TOCSIN_INGEST_ADDR",
        value_name = "TOCSIN_INGEST_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub addr: String,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "TOCSIN_INGEST_BODY_LIMIT", value_name = "TOCSIN_INGEST_BODY_LIMIT", default_value_t = 512 * 1024)]
    pub body_limit: usize,

    /// Requests per second each token may make (0 turns the limit off).
    #[arg(
        long,
        env = "TOCSIN_INGEST_RATE_LIMIT",
        value_name = "TOCSIN_INGEST_RATE_LIMIT",
        default_value_t = 1000
    )]
    pub rate_limit: u32,

    /// Requests a token may make at once before the rate applies.
    #[arg(
        long,
        env = "TOCSIN_INGEST_RATE_BURST",
        value_name = "TOCSIN_INGEST_RATE_BURST",
        default_value_t = 2000
    )]
    pub rate_burst: u32,

    /// How often the outbox relay looks for rows when no commit woke it.
    #[arg(long, env = "TOCSIN_OUTBOX_POLL", value_name = "TOCSIN_OUTBOX_POLL", default_value = "1s", value_parser = parse_duration_arg)]
    pub outbox_poll: Duration,

    /// HTTP worker threads (default: one per CPU).
    #[arg(long, env = "TOCSIN_HTTP_WORKERS", value_name = "TOCSIN_HTTP_WORKERS")]
    pub workers: Option<usize>,

    /// The SNS URLs ingest may fetch (a confirmation's `SubscribeURL`, a message's
    /// `SigningCertURL`): comma-separated host patterns (HTTPS, `*` for one DNS label) or exact
    /// origins (`http://127.0.0.1:4566`); empty fetches nothing. Default
    /// `sns.*.amazonaws.com,sns.*.amazonaws.com.cn`.
    #[arg(long, env = "TOCSIN_SNS_HOSTS", value_name = "TOCSIN_SNS_HOSTS", value_parser = SnsHosts::parse)]
    pub sns_hosts: Option<SnsHosts>,

    /// CIDRs exempt from the SSRF rules for the SNS confirmation request, comma-separated.
    #[arg(long, env = "TOCSIN_ALLOWED_TARGETS", value_name = "TOCSIN_ALLOWED_TARGETS", default_value = "", value_parser = TargetPolicy::parse)]
    pub allowed_targets: TargetPolicy,
}

/// The setting `TOCSIN_SNS_HOSTS` had before; read for one more release when the new one is
/// unset (docs/configuration.md).
const SNS_HOSTS_FORMERLY: &str = "TOCSIN_SNS_CONFIRM_HOSTS";

impl Config {
    /// `TOCSIN_SNS_HOSTS`; when it is unset, `TOCSIN_SNS_CONFIRM_HOSTS` (its former name), then
    /// the default.
    pub fn sns_hosts(&self) -> anyhow::Result<SnsHosts> {
        if let Some(hosts) = &self.sns_hosts {
            return Ok(hosts.clone());
        }
        match std::env::var(SNS_HOSTS_FORMERLY) {
            Ok(text) => {
                tracing::warn!(
                    "{SNS_HOSTS_FORMERLY} is read as TOCSIN_SNS_HOSTS, its new name; the old name stops working in the next release"
                );
                SnsHosts::parse(&text)
                    .map_err(|error| anyhow::anyhow!("{SNS_HOSTS_FORMERLY}: {error}"))
            }
            Err(_) => Ok(SnsHosts::parse(SnsHosts::DEFAULT).expect("the default parses")),
        }
    }

    /// Settings for a test or tool: the given database, broker and prefix, port 0.
    pub fn for_tests(common: CommonConfig) -> Self {
        Config {
            common,
            addr: "127.0.0.1:0".into(),
            body_limit: 512 * 1024,
            rate_limit: 0,
            rate_burst: 0,
            outbox_poll: Duration::from_millis(500),
            workers: Some(1),
            sns_hosts: Some(SnsHosts::parse("").expect("an empty list")),
            allowed_targets: TargetPolicy::default(),
        }
    }
}
