//! The integration tests of `tocsin-storage`: one test binary, a module per resource or
//! concern, each opening with what it covers. One module alone:
//! `cargo nextest run -p tocsin-storage -E 'test(/^storage::/)'`.

mod errors;
mod ordering;
mod relay;
mod storage;
mod subscription;
mod tokens;
