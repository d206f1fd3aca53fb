//! Who acts: an admin key, the bootstrap token or the CLI, with its role, the surface and where
//! the request came from. Every change and every reveal of a secret is recorded in the audit
//! log under its actor ([`Actor::record`], in the same transaction as the change).

use std::future::{ready, Ready};
use std::net::IpAddr;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use diesel_async::AsyncPgConnection;
use tocsin_domain::Role;
use tocsin_storage::audit::{self, NewAuditEntry};
use tocsin_storage::DbError;
use uuid::Uuid;

use crate::audit::Change;
use crate::error::AdminError;

/// The name the bootstrap token (`TOCSIN_ADMIN_TOKEN`) acts under.
pub const BOOTSTRAP_NAME: &str = "bootstrap token (TOCSIN_ADMIN_TOKEN)";

/// Whose credential a request carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// An admin key.
    Key { id: Uuid, name: String },
    /// The bootstrap token, `TOCSIN_ADMIN_TOKEN`.
    Bootstrap,
    /// A person signed in to the pages through the OpenID Connect provider.
    Identity { subject: String, name: String },
    /// `tocsin-admin` on the command line, as the operating-system user.
    Cli { user: String },
}

impl Who {
    /// The actor's kind as the audit log stores it: `key`, `bootstrap`, `oidc`, `cli`.
    pub fn kind(&self) -> &'static str {
        match self {
            Who::Key { .. } => "key",
            Who::Bootstrap => "bootstrap",
            Who::Identity { .. } => "oidc",
            Who::Cli { .. } => "cli",
        }
    }

    /// The name the audit log records: a key's name, the bootstrap token's, `name (subject)`
    /// of an identity, `cli:<user>`.
    pub fn name(&self) -> String {
        match self {
            Who::Key { name, .. } => name.clone(),
            Who::Bootstrap => BOOTSTRAP_NAME.to_owned(),
            Who::Identity { subject, name } => format!("{name} ({subject})"),
            Who::Cli { user } => user.clone(),
        }
    }

    pub fn key_id(&self) -> Option<Uuid> {
        match self {
            Who::Key { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// Where a change was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Api,
    Pages,
    Cli,
}

impl Surface {
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Api => "api",
            Surface::Pages => "pages",
            Surface::Cli => "cli",
        }
    }
}

/// A request's client address: the TCP peer (not a forwarded-for header, which a client could
/// set to anything). Failed attempts are counted against it, and the audit log records it.
pub fn client_address(req: &HttpRequest) -> IpAddr {
    req.peer_addr()
        .map(|addr| addr.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

/// Who is acting, with which role, through which surface and from where.
#[derive(Debug, Clone)]
pub struct Actor {
    pub who: Who,
    pub role: Role,
    pub surface: Surface,
    /// The client's address (the TCP peer); `None` on the CLI.
    pub address: Option<String>,
    /// The client's `User-Agent`; on the CLI, `tocsin-admin/<version> cli`.
    pub user_agent: Option<String>,
}

impl Actor {
    /// The actor of a request made with `who`'s credential.
    pub fn of_request(req: &HttpRequest, who: Who, role: Role, surface: Surface) -> Self {
        Actor {
            who,
            role,
            surface,
            address: Some(client_address(req).to_string()),
            user_agent: req
                .headers()
                .get(actix_web::http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(|ua| ua.chars().take(500).collect()),
        }
    }

    /// The CLI, acting as the operating-system user running it (`$USER`, else `cli`), with every
    /// right: whoever can run it can reach the database.
    pub fn cli() -> Self {
        let user = std::env::var("USER")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .map_or_else(|| "cli".to_owned(), |u| format!("cli:{u}"));
        Actor {
            who: Who::Cli { user },
            role: Role::Admin,
            surface: Surface::Cli,
            address: None,
            user_agent: Some(format!("tocsin-admin/{} cli", env!("CARGO_PKG_VERSION"))),
        }
    }

    /// Records `change` in the audit log, on the caller's connection (in its transaction).
    pub async fn record(
        &self,
        conn: &mut AsyncPgConnection,
        change: Change,
    ) -> Result<(), DbError> {
        audit::record(
            conn,
            &NewAuditEntry {
                actor_kind: self.who.kind(),
                actor_id: self.who.key_id(),
                actor_name: &self.who.name(),
                surface: self.surface.as_str(),
                address: self.address.as_deref(),
                user_agent: self.user_agent.as_deref(),
                action: change.action,
                resource_type: change.resource_type,
                resource_id: change.resource_id,
                before: change.before,
                after: change.after,
            },
        )
        .await
    }
}

/// An API request's actor, put there by the authentication in front of `/api/v1`.
impl FromRequest for Actor {
    type Error = AdminError;
    type Future = Ready<Result<Actor, AdminError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<Actor>()
                .cloned()
                .ok_or_else(|| AdminError::Request(tocsin_web::ApiError::unauthorized())),
        )
    }
}
