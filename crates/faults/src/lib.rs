//! Tocsin's fault tests live in `tests/faults.rs`. They stop and restart the shared PostgreSQL
//! and RabbitMQ, so `deploy/local/test` runs them after every other test, one at a time.
