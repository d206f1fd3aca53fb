//! The integration tests of `tocsin-admin`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-admin -E 'test(/^admin::/)'`.

mod admin;
mod common;
mod fuzz;
mod pages;
