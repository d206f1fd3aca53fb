//! What an audit log entry says was done: the action, the resource, and the resource's readable
//! fields before and after — taken from the stored records here, so that no secret (a webhook's
//! signing secret, a header's value, a token or key, a signing secret) can reach the log.

use serde_json::{json, Value};
use time::OffsetDateTime;
use tocsin_storage::admin_keys::AdminKey;
use tocsin_storage::tokens::InboundToken;
use tocsin_storage::webhooks::Webhook;

/// An audit log entry's subject: what was done, to which resource, its fields before and after.
#[derive(Debug, Clone)]
pub struct Change {
    pub action: &'static str,
    pub resource_type: &'static str,
    pub resource_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl Change {
    /// `action` done to the `resource_type` with id `id`.
    pub fn new(action: &'static str, resource_type: &'static str, id: impl ToString) -> Self {
        Change {
            action,
            resource_type,
            resource_id: Some(id.to_string()),
            before: None,
            after: None,
        }
    }

    pub fn before(mut self, fields: Value) -> Self {
        self.before = Some(fields);
        self
    }

    pub fn after(mut self, fields: Value) -> Self {
        self.after = Some(fields);
        self
    }
}

fn time(at: Option<OffsetDateTime>) -> Value {
    at.map_or(Value::Null, |at| {
        tocsin_domain::rfc3339_utc::format(at).into()
    })
}

/// A webhook's settings, as the API shows them (header values masked), without its secret.
pub fn webhook_fields(webhook: &Webhook) -> Value {
    json!({
        "name": webhook.name.as_str(),
        "url": webhook.url.as_str(),
        "events": webhook.events,
        "retry": {
            "max_attempts": webhook.retry.max_attempts(),
            "timeout_ms": webhook.retry.timeout_ms(),
        },
        "enabled": webhook.enabled,
        "disabled_reason": webhook.disabled_reason,
        "filters": webhook.filters,
        "headers": webhook.headers.masked(),
        "rate_limit_per_second": webhook.rate_limit.map(|r| r.per_second()),
        "ordering": webhook.ordering,
    })
}

/// An inbound token's settings and public prefix, never the token or its signing secret.
pub fn token_fields(token: &InboundToken) -> Value {
    json!({
        "name": token.name,
        "prefix": token.lookup,
        "source": token.source,
        "basic_auth": token.basic_auth,
        "query_token": token.query_token,
        "signed": token.signing_secret.is_some() || token.sns_signature,
        "sns_signature": token.sns_signature,
    })
}

/// An admin key's name, role, public prefix and expiry, never the key.
pub fn admin_key_fields(key: &AdminKey) -> Value {
    json!({
        "name": key.name,
        "role": key.role.as_str(),
        "prefix": key.lookup,
        "expires_at": time(key.expires_at),
    })
}
