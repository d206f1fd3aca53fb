//! The integration tests of `tocsin-ingest`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-ingest -E 'test(/^ingest::/)'`.

mod common;
mod credentials;
mod fuzz;
mod ingest;
mod process;
mod sns;
mod sources;
