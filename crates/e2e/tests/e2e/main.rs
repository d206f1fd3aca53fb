//! The integration tests of `tocsin-e2e`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-e2e -E 'test(/^addresses::/)'`.

mod addresses;
mod api;
mod browser;
mod invariants;
mod metrics;
mod oidc;
mod scaling;
mod secrets;
mod shutdown;
mod slowloris;
mod subscriptions;
mod traces;
