//! `tocsin-dispatcher`: turns deliveries into signed HTTP requests (and event messages of an
//! earlier version into deliveries: new events get theirs when they are written), logs every
//! attempt, and retries failures on the schedule of SPEC §8 through RabbitMQ's per-delay retry
//! queues. Any number of dispatchers share the queues.

mod config;
mod deliver;
mod fanout;
mod held;
mod metrics;
mod slots;
mod ssrf;
mod startup;
mod sweeper;

pub use config::Config;
pub use ssrf::TargetPolicy;
pub use startup::{build, App};
