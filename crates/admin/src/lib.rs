//! `tocsin-admin`: how operators and their automation configure Tocsin and read what happened.
//! A JSON API under `/api/v1` behind the admin token — outbound webhooks and their secrets, the
//! delivery log with manual and bulk retry, incident status changes, inbound tokens — with its
//! OpenAPI document; the settings pages under `/settings/` (sign-in with the admin token,
//! webhooks, the delivery log with its Retry button, incidents), rendered by the service itself;
//! plus `token` subcommands for scripts. Writes that emit events or attempts
//! go through the transactional outbox; the relay running here publishes them.
//!
//! The three surfaces have a module each: `api/` (with `openapi.rs` and `schema.rs`), `pages/`
//! and `cli.rs`. What more than one of them does lives beside them once: the checks of a
//! webhook or token (`validation.rs`, `api/tokens.rs`'s `CheckedToken`), the actions that write
//! (`actions.rs`, `store.rs`).

mod actions;
mod actor;
mod api;
mod audit;
mod auth;
pub mod cli;
mod config;
mod error;
mod oidc;
pub mod openapi;
mod pages;
mod params;
pub mod roles;
mod schema;
mod startup;
mod state;
mod store;
mod validation;

pub use config::{
    AdminToken, AuditArgs, Cli, Command, Config, KeyAction, KeyArgs, SecretSetting, TokenAction,
    TokenArgs,
};
pub use startup::{build, App};
