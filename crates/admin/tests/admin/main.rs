//! The integration tests of `tocsin-admin`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-admin -E 'test(/^webhooks::/)'`.

mod api;
mod auth;
mod binary;
mod common;
mod deliveries;
mod fuzz;
mod incidents;
mod openapi;
mod outages;
mod pages;
mod people;
mod recovery;
mod tokens;
mod webhook_validation;
mod webhooks;
