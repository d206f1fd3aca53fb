//! The integration tests of `tocsin-storage`: one test binary, a module per resource or
//! concern, each opening with what it covers, and `common` with the set-up they share. One
//! module alone: `cargo nextest run -p tocsin-storage -E 'test(/^claims::/)'`.

mod claims;
mod common;
mod completions;
mod concurrency;
mod errors;
mod fan_out;
mod incidents;
mod migrations;
mod ordering;
mod plans;
mod pool;
mod relay;
mod reshape;
mod retention;
mod rules;
mod stopping;
mod subscription;
mod sweeper;
mod tokens;
mod waiting;
