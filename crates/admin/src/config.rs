//! Settings and command line of `tocsin-admin` (besides the common ones of
//! `tocsin_web::config`: `DATABASE_URL`, `AMQP_URL`, `TOCSIN_AMQP_PREFIX`, ...). Every
//! flag falls back to its environment variable.
//!
//! Serving (`tocsin-admin` or `tocsin-admin serve`):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `TOCSIN_ADMIN_ADDR` | `127.0.0.1:8081` | listen address |
//! | `TOCSIN_ADMIN_TOKEN` | none: required | the bootstrap token: an `admin` credential of the API and the pages (at least 16 characters); it also keys the pages' session cookies |
//! | `TOCSIN_ADMIN_TOKEN_DISABLED` | `false` | `true`: the bootstrap token no longer opens the API or the pages; only admin keys do. Admin refuses to start so unless a live `admin` key exists |
//! | `TOCSIN_AUDIT_RETENTION` | `365d` | audit log entries older than this are deleted (hourly, by admin) |
//! | `TOCSIN_OIDC_ISSUER` | unset: no OpenID Connect | the identity provider the pages also sign in with |
//! | `TOCSIN_OIDC_CLIENT_ID`, `TOCSIN_OIDC_CLIENT_SECRET` | none | Tocsin's client at the provider (the secret optional: PKCE is always used) |
//! | `TOCSIN_OIDC_REDIRECT_URL` | from the request | `https://<admin>/settings/sign-in/oidc/callback`, as registered at the provider |
//! | `TOCSIN_OIDC_ROLE_CLAIM` | `groups` | the ID token claim holding the identity's groups or roles |
//! | `TOCSIN_OIDC_ROLES` | none | `value=role` pairs, comma-separated: which claim values give which role |
//! | `TOCSIN_SECRET_GRACE` | `24h` | how long a rotated-out webhook secret keeps signing |
//! | `TOCSIN_ADMIN_BODY_LIMIT` | `1048576` | largest accepted request body, bytes (1 MiB) |
//! | `TOCSIN_OUTBOX_POLL` | `1s` | fallback poll of the outbox relay |
//! | `TOCSIN_HTTP_WORKERS` | CPU count | HTTP worker threads |
//! | `TOCSIN_ADMIN_AUTH_FAILURES` | `5` | wrong admin tokens (API or sign-in) one client address may present per minute before its wrong tokens get 429 (the right token is never refused) |
//! | `TOCSIN_SECURE_COOKIES` | `false` | mark the settings pages' session cookie `Secure` (set it when admin is reached over HTTPS) |
//!
//! The operator commands (`tocsin-admin token create --name NAME`, `token list`,
//! `token revoke ID`, `key create|list|revoke`, `audit`, `migrate`, `reshape`,
//! `deliveries failed|retry|recover`, `prune`) read only the common settings (in practice
//! `DATABASE_URL`), migrate the database first, and need no admin token; their changes are
//! recorded in the audit log as made by `cli:$USER`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tocsin_web::config::{parse_duration_arg, CommonConfig};
use uuid::Uuid;

/// The admin API's bearer token. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Shortest token admin starts with.
    pub const MIN_CHARS: usize = 16;

    pub fn new(token: impl Into<String>) -> Self {
        AdminToken(token.into())
    }

    /// Refuses a token too short to resist guessing (without printing it).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.0.trim().chars().count() < Self::MIN_CHARS {
            anyhow::bail!(
                "TOCSIN_ADMIN_TOKEN: the admin token must be at least {} characters",
                Self::MIN_CHARS
            );
        }
        Ok(())
    }

    /// Constant-time comparison with a presented token.
    pub fn matches(&self, presented: &str) -> bool {
        tocsin_domain::constant_time_eq(&self.0, presented)
    }

    /// A key derived from the token for one purpose: HMAC-SHA256(token, purpose). Changing the
    /// token changes every derived key.
    pub(crate) fn derive_key(&self, purpose: &str) -> ring::hmac::Key {
        let token = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.0.as_bytes());
        let derived = ring::hmac::sign(&token, purpose.as_bytes());
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref())
    }
}

impl FromStr for AdminToken {
    // Never fails: a failure message from clap would print the value. `check` validates.
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(AdminToken(text.to_owned()))
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(…redacted)")
    }
}

/// A secret setting other than the admin token (the OpenID Connect client secret). `Debug` does
/// not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretSetting(String);

impl SecretSetting {
    pub fn new(secret: impl Into<String>) -> Self {
        SecretSetting(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for SecretSetting {
    // Never fails: a failure message from clap would print the value.
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(SecretSetting(text.to_owned()))
    }
}

impl fmt::Debug for SecretSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretSetting(…redacted)")
    }
}

/// `tocsin-admin` serve settings.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Address to listen on.
    #[arg(
        long,
        env = "TOCSIN_ADMIN_ADDR",
        value_name = "TOCSIN_ADMIN_ADDR",
        default_value = "127.0.0.1:8081"
    )]
    pub addr: String,

    /// The bootstrap token: an `admin` credential of the API and the pages (at least 16
    /// characters); it also keys the pages' session cookies.
    #[arg(
        long,
        env = "TOCSIN_ADMIN_TOKEN",
        value_name = "TOCSIN_ADMIN_TOKEN",
        required = true,
        hide_env_values = true
    )]
    pub admin_token: Option<AdminToken>,

    /// Turn the bootstrap token off as a credential once admin keys exist (admin refuses to
    /// start so without a live `admin` key).
    #[arg(
        long,
        env = "TOCSIN_ADMIN_TOKEN_DISABLED",
        value_name = "TOCSIN_ADMIN_TOKEN_DISABLED",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub admin_token_disabled: bool,

    /// The OpenID Connect issuer the pages also sign in with (unset: keys only).
    #[arg(long, env = "TOCSIN_OIDC_ISSUER", value_name = "TOCSIN_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,

    /// Tocsin's client id at the provider.
    #[arg(
        long,
        env = "TOCSIN_OIDC_CLIENT_ID",
        value_name = "TOCSIN_OIDC_CLIENT_ID"
    )]
    pub oidc_client_id: Option<String>,

    /// Tocsin's client secret at the provider (optional: PKCE is always used).
    #[arg(
        long,
        env = "TOCSIN_OIDC_CLIENT_SECRET",
        value_name = "TOCSIN_OIDC_CLIENT_SECRET",
        hide_env_values = true
    )]
    pub oidc_client_secret: Option<SecretSetting>,

    /// The callback registered at the provider: `https://<admin>/settings/sign-in/oidc/callback`
    /// (default: built from the address each request was sent to).
    #[arg(
        long,
        env = "TOCSIN_OIDC_REDIRECT_URL",
        value_name = "TOCSIN_OIDC_REDIRECT_URL"
    )]
    pub oidc_redirect_url: Option<String>,

    /// The ID token claim holding the identity's groups or roles.
    #[arg(
        long,
        env = "TOCSIN_OIDC_ROLE_CLAIM",
        value_name = "TOCSIN_OIDC_ROLE_CLAIM",
        default_value = "groups"
    )]
    pub oidc_role_claim: String,

    /// Which claim values give which role: `value=role` pairs, comma-separated.
    #[arg(long, env = "TOCSIN_OIDC_ROLES", value_name = "TOCSIN_OIDC_ROLES")]
    pub oidc_roles: Option<String>,

    /// How long audit log entries are kept.
    #[arg(long, env = "TOCSIN_AUDIT_RETENTION", value_name = "TOCSIN_AUDIT_RETENTION", default_value = "365d", value_parser = parse_duration_arg)]
    pub audit_retention: Duration,

    /// How long a rotated-out webhook secret keeps signing beside the new one.
    #[arg(long, env = "TOCSIN_SECRET_GRACE", value_name = "TOCSIN_SECRET_GRACE", default_value = "24h", value_parser = parse_duration_arg)]
    pub secret_grace: Duration,

    /// Largest accepted request body, in bytes.
    #[arg(
        long,
        env = "TOCSIN_ADMIN_BODY_LIMIT",
        value_name = "TOCSIN_ADMIN_BODY_LIMIT",
        default_value_t = 1024 * 1024
    )]
    pub body_limit: usize,

    /// How often the outbox relay looks for rows when no commit woke it.
    #[arg(long, env = "TOCSIN_OUTBOX_POLL", value_name = "TOCSIN_OUTBOX_POLL", default_value = "1s", value_parser = parse_duration_arg)]
    pub outbox_poll: Duration,

    /// HTTP worker threads (default: one per CPU).
    #[arg(long, env = "TOCSIN_HTTP_WORKERS", value_name = "TOCSIN_HTTP_WORKERS")]
    pub workers: Option<usize>,

    /// Mark the settings pages' session cookie `Secure` (when admin is reached over HTTPS).
    #[arg(
        long,
        env = "TOCSIN_SECURE_COOKIES",
        value_name = "TOCSIN_SECURE_COOKIES",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub secure_cookies: bool,

    /// Wrong admin tokens (API calls or sign-ins) one client address may present per minute
    /// before its further wrong tokens are answered 429 for the rest of the minute. The right
    /// token is never refused.
    #[arg(long, env = "TOCSIN_ADMIN_AUTH_FAILURES", value_name = "TOCSIN_ADMIN_AUTH_FAILURES", default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    pub auth_failures: u16,
}

impl Config {
    /// Settings for a test or tool: the given database, broker and prefix, port 0.
    pub fn for_tests(common: CommonConfig, admin_token: &str) -> Self {
        Config {
            common,
            addr: "127.0.0.1:0".into(),
            admin_token: Some(AdminToken::new(admin_token)),
            admin_token_disabled: false,
            audit_retention: Duration::from_secs(365 * 24 * 60 * 60),
            oidc_issuer: None,
            oidc_client_id: None,
            oidc_client_secret: None,
            oidc_redirect_url: None,
            oidc_role_claim: "groups".into(),
            oidc_roles: None,
            secret_grace: Duration::from_secs(24 * 60 * 60),
            body_limit: 1024 * 1024,
            outbox_poll: Duration::from_millis(500),
            workers: Some(1),
            secure_cookies: false,
            auth_failures: 5,
        }
    }
}

impl Config {
    /// The OpenID Connect settings, when `TOCSIN_OIDC_ISSUER` is set (each other one it needs
    /// named when missing).
    pub fn oidc(&self) -> anyhow::Result<Option<crate::oidc::OidcSettings>> {
        let Some(issuer) = self.oidc_issuer.clone().filter(|i| !i.trim().is_empty()) else {
            return Ok(None);
        };
        let need = |value: &Option<String>, name: &str| {
            value
                .clone()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| anyhow::anyhow!("{name}: needed with TOCSIN_OIDC_ISSUER"))
        };
        Ok(Some(crate::oidc::OidcSettings {
            issuer,
            client_id: need(&self.oidc_client_id, "TOCSIN_OIDC_CLIENT_ID")?,
            client_secret: self
                .oidc_client_secret
                .as_ref()
                .map(|s| s.expose().to_owned())
                .filter(|s| !s.is_empty()),
            redirect_url: self
                .oidc_redirect_url
                .clone()
                .filter(|u| !u.trim().is_empty()),
            role_claim: self.oidc_role_claim.clone(),
            roles: crate::oidc::OidcSettings::parse_roles(&need(
                &self.oidc_roles,
                "TOCSIN_OIDC_ROLES",
            )?)?,
        }))
    }
}

/// The command line: serve (the default) or manage inbound tokens.
#[derive(Debug, clap::Parser)]
#[command(
    name = "tocsin-admin",
    version,
    about = "Tocsin's admin API: webhooks, delivery log, manual retry, incidents, inbound tokens",
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(flatten)]
    pub serve: Config,

    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// What to do, `serve` when no subcommand was given.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Serve(self.serve))
    }
}

/// A `tocsin-admin` subcommand.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run the admin HTTP API (what `tocsin-admin` alone does).
    Serve(Config),
    /// Issue, list and revoke inbound access tokens (needs only DATABASE_URL).
    Token(TokenArgs),
    /// Issue, list and revoke admin keys (needs only DATABASE_URL).
    Key(KeyArgs),
    /// Read the audit log, newest first (needs only DATABASE_URL).
    Audit(AuditArgs),
    /// Apply pending database migrations and exit (for a migration job before a rollout).
    Migrate(MigrateArgs),
    /// The delivery log from the command line: list failed deliveries, retry one, recover many.
    Deliveries(DeliveriesArgs),
    /// Delete finished deliveries, their attempts and events older than the retention, now.
    Prune(PruneArgs),
    /// Move a delivery log that holds rows into day partitions, while the services run (upgrade
    /// every service to this release first; see docs/operations/upgrade.md).
    Reshape(MigrateArgs),
    /// The parking queue (messages that could not be processed): list them, or replay them.
    Parked(ParkedArgs),
}

/// `tocsin-admin parked ...`.
#[derive(Debug, clap::Args)]
pub struct ParkedArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    #[command(subcommand)]
    pub action: ParkedAction,
}

/// What to do with parked messages (queue `<TOCSIN_AMQP_PREFIX>.parking`).
#[derive(Debug, clap::Subcommand)]
pub enum ParkedAction {
    /// List parked messages, oldest first, leaving them parked.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Move parked events back to the fan-out and parked attempts back to the delivery queue
    /// (fix what parked them first). Unreadable messages stay parked.
    Replay {
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
}

/// `tocsin-admin key ...`.
#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    #[command(subcommand)]
    pub action: KeyAction,
}

/// What to do with admin keys.
#[derive(Debug, clap::Subcommand)]
pub enum KeyAction {
    /// Issue a key and print it on stdout (shown this once).
    Create {
        /// A name telling the key apart (1 to 100 characters), e.g. its holder.
        #[arg(long)]
        name: String,
        /// `viewer`, `operator` or `admin`.
        #[arg(long)]
        role: String,
        /// RFC 3339 time after which the key is refused (default: never).
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// List keys, newest first (never the keys themselves).
    List,
    /// Revoke a key: its next request is refused, on every admin instance.
    Revoke {
        /// The key's id, as `key list` shows it.
        id: Uuid,
    },
}

/// `tocsin-admin audit`: the audit log, newest first, as tab-separated lines.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Only this actor's entries: an admin key's id, `bootstrap` or `cli`.
    #[arg(long)]
    pub actor: Option<String>,
    /// Only entries about this kind of resource (`webhook`, `delivery`, `incident`, `token`,
    /// `admin_key`).
    #[arg(long)]
    pub resource_type: Option<String>,
    /// Only entries about this resource id.
    #[arg(long)]
    pub resource_id: Option<String>,
    /// Only this action (e.g. `webhook.update`).
    #[arg(long)]
    pub action: Option<String>,
    /// RFC 3339 time: entries at or after it.
    #[arg(long)]
    pub since: Option<String>,
    /// RFC 3339 time: entries before it.
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: i64,
}

/// `tocsin-admin migrate`.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub common: CommonConfig,
}

/// `tocsin-admin deliveries ...`.
#[derive(Debug, clap::Args)]
pub struct DeliveriesArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    #[command(subcommand)]
    pub action: DeliveriesAction,
}

/// What to do with deliveries. Retries go through the outbox: a running ingest or admin
/// publishes them at once and a dispatcher makes the attempts.
#[derive(Debug, clap::Subcommand)]
pub enum DeliveriesAction {
    /// List failed deliveries, newest first.
    Failed {
        /// Only this webhook's.
        #[arg(long)]
        webhook: Option<Uuid>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Make one immediate manual attempt of a delivery.
    Retry {
        /// The delivery's id.
        id: Uuid,
    },
    /// Retry every failed delivery of a webhook created since a time.
    Recover {
        /// The webhook's id.
        #[arg(long)]
        webhook: Uuid,
        /// RFC 3339 time, e.g. 2026-11-22T00:00:00Z.
        #[arg(long, value_parser = parse_rfc3339)]
        since: time::OffsetDateTime,
    },
    /// Give a webhook the past events of a window it has no delivery of (dispatchers make the
    /// deliveries in the background, marked replayed); prints the replay's id.
    Replay {
        /// The webhook's id.
        #[arg(long)]
        webhook: Uuid,
        /// RFC 3339 time: events at or after it.
        #[arg(long)]
        since: String,
        /// RFC 3339 time: events before it (default now).
        #[arg(long)]
        until: Option<String>,
        /// Only these event kinds, comma-separated (default every kind it subscribes to).
        #[arg(long, value_delimiter = ',')]
        events: Option<Vec<String>>,
    },
}

/// `tocsin-admin prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    /// Delete what is older than this.
    #[arg(long, env = "TOCSIN_RETENTION", value_name = "TOCSIN_RETENTION", default_value = "30d", value_parser = tocsin_web::config::parse_duration_arg)]
    pub retention: std::time::Duration,
}

fn parse_rfc3339(text: &str) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("not an RFC 3339 time ({e})"))
}

/// `tocsin-admin token ...`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub common: CommonConfig,

    #[command(subcommand)]
    pub action: TokenAction,
}

/// What to do with inbound tokens.
#[derive(Debug, clap::Subcommand)]
pub enum TokenAction {
    /// Issue a token and print it on stdout (shown this once).
    Create {
        /// A name telling the token apart (1 to 100 characters), e.g. the sending tool.
        #[arg(long)]
        name: String,
        /// The alert source its bodies are read as (`cloudwatch`, `azure`, `sentry`, ...;
        /// docs/ingest.md); without it, each body's format is detected.
        #[arg(long)]
        source: Option<String>,
        /// Also accept HTTP basic authentication with the token as password.
        #[arg(long)]
        basic_auth: bool,
        /// Also accept the token in the `token` query parameter.
        #[arg(long)]
        query_token: bool,
        /// The secret a `sentry` source signs its bodies with (its client secret).
        #[arg(long, env = "TOCSIN_TOKEN_SIGNING_SECRET", hide_env_values = true)]
        signing_secret: Option<String>,
        /// Require SNS's signature of every message (a `cloudwatch` source only).
        #[arg(long)]
        sns_signature: bool,
    },
    /// List tokens, newest first (never their secrets).
    List,
    /// Revoke a token: the next request with it is refused.
    Revoke {
        /// The token's id, as `token list` shows it.
        id: Uuid,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn no_subcommand_serves_and_the_token_is_required() {
        let error = Cli::try_parse_from(["tocsin-admin"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("TOCSIN_ADMIN_TOKEN"), "{error}");
        let cli = Cli::try_parse_from([
            "tocsin-admin",
            "--admin-token",
            "0123456789abcdef",
            "--addr",
            "127.0.0.1:0",
        ])
        .unwrap();
        let Command::Serve(config) = cli.into_command() else {
            panic!("serves by default");
        };
        assert_eq!(config.addr, "127.0.0.1:0");
        assert_eq!(config.secret_grace, Duration::from_secs(86_400));
        assert_eq!(config.body_limit, 1024 * 1024);
        assert!(!config.secure_cookies);
        assert!(config.admin_token.unwrap().check().is_ok());
    }

    #[test]
    fn serve_subcommand_also_requires_the_token() {
        let error = Cli::try_parse_from(["tocsin-admin", "serve"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("TOCSIN_ADMIN_TOKEN"), "{error}");
        assert!(Cli::try_parse_from(["tocsin-admin", "serve", "--admin-token", "x"]).is_ok());
    }

    #[test]
    fn token_commands_need_no_admin_token() {
        let cli =
            Cli::try_parse_from(["tocsin-admin", "token", "create", "--name", "grafana"]).unwrap();
        let Command::Token(args) = cli.into_command() else {
            panic!("a token command");
        };
        assert!(matches!(args.action, TokenAction::Create { name, .. } if name == "grafana"));
        let cli = Cli::try_parse_from([
            "tocsin-admin",
            "token",
            "--database-url",
            "postgres://x@127.0.0.1/y",
            "revoke",
            "0192f3c4-0000-7000-8000-000000000000",
        ])
        .unwrap();
        assert!(matches!(
            cli.into_command(),
            Command::Token(TokenArgs {
                action: TokenAction::Revoke { .. },
                ..
            })
        ));
    }

    #[test]
    fn short_tokens_are_refused_without_being_printed() {
        let error = AdminToken::new("short-secret")
            .check()
            .unwrap_err()
            .to_string();
        assert!(error.contains("TOCSIN_ADMIN_TOKEN"), "{error}");
        assert!(!error.contains("short-secret"));
        assert!(!format!("{:?}", AdminToken::new("short-secret")).contains("short"));
        assert!(AdminToken::new("0123456789abcdef").matches("0123456789abcdef"));
        let secret: SecretSetting = "client-secret-value".parse().unwrap();
        assert!(!format!("{secret:?}").contains("client-secret-value"));
        assert!(!AdminToken::new("0123456789abcdef").matches("0123456789abcdeF"));
    }
}
