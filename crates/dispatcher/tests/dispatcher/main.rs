//! The integration tests of `tocsin-dispatcher`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-dispatcher -E 'test(/^delivery::/)'`.

mod common;
mod delivery;
mod hostile;
mod ordering;
mod process;
mod replay;
