//! `tocsin-dispatcher`: fans incident events out into deliveries, one per subscribed webhook,
//! turns them into signed HTTP requests, logs every attempt, and retries failures on the
//! five-step schedule through RabbitMQ's per-delay retry queues. Any number of dispatchers share
//! the queues.

mod attempt;
mod batched;
mod config;
mod context;
mod fan_out;
mod gauges;
mod health;
mod metrics;
mod replays;
mod request;
mod slots;
mod startup;
mod sweeper;
mod waiting;

pub use config::Config;
pub use startup::{build, App};
pub use tocsin_web::ssrf::TargetPolicy;
