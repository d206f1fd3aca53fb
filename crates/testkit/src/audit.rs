//! Holding the audit log to what a test changed. A harness sends every request to admin through
//! [`AuditLedger::exchange`], which notes each change an answer reports (a 2xx to a write of the
//! API, a page's answer to a form that made one, a secret's reveal) with the actor whose
//! credential or session carried it, and every secret an answer showed. Changes made elsewhere
//! (the CLI, a browser) are noted with [`AuditLedger::expect`]. [`AuditLedger::check`] then reads
//! `GET /api/v1/audit-log` page by page and requires one entry for each change, with its action,
//! resource, surface and actor, no entry besides them, and no secret in any entry.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use reqwest::header::{HeaderMap, COOKIE, LOCATION, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use uuid::Uuid;

/// The name the audit log gives the bootstrap token, `TOCSIN_ADMIN_TOKEN` (the API documents it).
pub const BOOTSTRAP_NAME: &str = "bootstrap token (TOCSIN_ADMIN_TOKEN)";

/// Who an audit entry should name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `key`, `bootstrap`, `oidc` or `cli`.
    pub kind: String,
    pub name: String,
    /// An admin key's id, when the test knows it.
    pub id: Option<Uuid>,
}

impl Actor {
    pub fn bootstrap() -> Self {
        Actor {
            kind: "bootstrap".into(),
            name: BOOTSTRAP_NAME.into(),
            id: None,
        }
    }

    /// The admin key named `name` (its id when known).
    pub fn key(name: &str, id: Option<Uuid>) -> Self {
        Actor {
            kind: "key".into(),
            name: name.into(),
            id,
        }
    }

    /// `tocsin-admin` run by the operating-system user `user` (`None`: `$USER` unset).
    pub fn cli(user: Option<&str>) -> Self {
        Actor {
            kind: "cli".into(),
            name: user.map_or_else(|| "cli".to_owned(), |u| format!("cli:{u}")),
            id: None,
        }
    }
}

/// A change the audit log must hold once.
#[derive(Debug, Clone)]
pub struct Change {
    /// `webhook.create`, `delivery.retry`, ...
    pub action: String,
    /// `webhook`, `delivery`, `incident`, `token` or `admin_key`.
    pub resource_type: String,
    /// `None` when the test cannot tell the id (a resource made through a page).
    pub resource_id: Option<String>,
    /// `api`, `pages` or `cli`.
    pub surface: String,
    pub actor: Actor,
}

impl Change {
    /// `action` (`<resource type>.<verb>`) on the resource `id`, through `surface`, by `actor`.
    pub fn new(action: &str, id: Option<String>, surface: &str, actor: Actor) -> Self {
        let resource_type = action.split('.').next().unwrap_or_default().to_owned();
        Change {
            action: action.to_owned(),
            resource_type,
            resource_id: id,
            surface: surface.to_owned(),
            actor,
        }
    }

    fn matches(&self, entry: &Value) -> bool {
        entry["action"] == self.action.as_str()
            && entry["resource_type"] == self.resource_type.as_str()
            && self
                .resource_id
                .as_ref()
                .is_none_or(|id| entry["resource_id"] == id.as_str())
            && entry["surface"] == self.surface.as_str()
            && entry["actor"]["kind"] == self.actor.kind.as_str()
            && entry["actor"]["name"] == self.actor.name.as_str()
            && self
                .actor
                .id
                .is_none_or(|id| entry["actor"]["id"] == id.to_string())
    }
}

/// An answer of admin: status, headers and body text.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Answer {
    /// The body as JSON (`Null` when empty or not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    fn location(&self) -> &str {
        self.headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

#[derive(Default)]
struct Ledger {
    changes: Vec<Change>,
    /// Every secret an answer showed or a request presented: none may be in the log.
    secrets: BTreeSet<String>,
    /// Credential → who it is.
    credentials: HashMap<String, Actor>,
    /// Session cookie (`name=value`) → who signed in with it.
    sessions: HashMap<String, Actor>,
}

/// What a test changed through admin, and the secrets it saw; see the module's comment.
pub struct AuditLedger {
    database_url: String,
    bootstrap_token: String,
    ledger: Mutex<Ledger>,
}

impl AuditLedger {
    /// A ledger for the admin on `database_url` whose bootstrap token is `bootstrap_token`.
    pub fn new(database_url: &str, bootstrap_token: &str) -> Self {
        let mut ledger = Ledger::default();
        ledger
            .credentials
            .insert(bootstrap_token.to_owned(), Actor::bootstrap());
        ledger.secrets.insert(bootstrap_token.to_owned());
        AuditLedger {
            database_url: database_url.to_owned(),
            bootstrap_token: bootstrap_token.to_owned(),
            ledger: Mutex::new(ledger),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a change made where [`Self::exchange`] does not see it (the CLI, a browser).
    pub fn expect(&self, change: Change) {
        self.lock().changes.push(change);
    }

    /// Notes a secret the test saw elsewhere: it must not be in the log.
    pub fn secret(&self, secret: &str) {
        self.lock().secrets.insert(secret.to_owned());
    }

    /// Sends `request` with `client`, noting the change its answer reports.
    pub async fn exchange(&self, client: &reqwest::Client, request: reqwest::Request) -> Answer {
        let method = request.method().clone();
        let path = request.url().path().to_owned();
        let headers = request.headers().clone();
        let body = request
            .body()
            .and_then(|b| b.as_bytes())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        // A move to the status an incident has is no change and is not logged: look first.
        let incident = incident_of(&method, &path);
        let before = match incident {
            Some(id) => self.incident_status(id).await,
            None => None,
        };
        let response = client.execute(request).await.expect("sending to admin");
        let answer = Answer {
            status: response.status(),
            headers: response.headers().clone(),
            text: response.text().await.unwrap_or_default(),
        };
        let moved = match incident {
            Some(id) => before != self.incident_status(id).await,
            None => false,
        };
        self.note(&method, &path, &headers, &body, &answer, moved);
        answer
    }

    async fn incident_status(&self, id: Uuid) -> Option<String> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = Text)]
            status: String,
        }
        let mut conn = AsyncPgConnection::establish(&self.database_url)
            .await
            .expect("the test database");
        diesel::sql_query("SELECT status::text AS status FROM incidents WHERE id = $1")
            .bind::<SqlUuid, _>(id)
            .load::<Row>(&mut conn)
            .await
            .expect("reading an incident's status")
            .pop()
            .map(|row| row.status)
    }

    fn note(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        body: &str,
        answer: &Answer,
        incident_moved: bool,
    ) {
        let mut ledger = self.lock();
        for secret in secrets_in(&answer.text) {
            ledger.secrets.insert(secret);
        }
        if ![Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method) {
            return;
        }
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            ["api", "v1", rest @ ..] if answer.status.is_success() => {
                let credential = headers
                    .get(reqwest::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                let Some(actor) = ledger.credentials.get(credential).cloned() else {
                    panic!("{method} {path} succeeded with a credential the ledger does not know");
                };
                let Some((action, id)) = api_change(method, rest, answer, incident_moved) else {
                    return;
                };
                if action == "admin_key.create" {
                    let issued = answer.json();
                    let key = issued["key"].as_str().unwrap_or_default().to_owned();
                    let name = issued["name"].as_str().unwrap_or_default();
                    let id = issued["id"].as_str().and_then(|id| id.parse().ok());
                    ledger.credentials.insert(key, Actor::key(name, id));
                }
                ledger.changes.push(Change::new(action, id, "api", actor));
            }
            ["settings", "sign-in"] => {
                let Some(cookie) = answer
                    .headers
                    .get(SET_COOKIE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split(';').next())
                    .filter(|c| !c.ends_with('='))
                else {
                    return;
                };
                let token = form_field(body, "token").unwrap_or_default();
                let Some(actor) = ledger.credentials.get(&token).cloned() else {
                    panic!("signed in to the pages with a credential the ledger does not know");
                };
                ledger.sessions.insert(cookie.to_owned(), actor);
            }
            ["settings", rest @ ..] => {
                let done = answer.status.is_success() || answer.status == StatusCode::SEE_OTHER;
                let signed_out = answer.location().starts_with("/settings/sign-in");
                if !done || signed_out {
                    return;
                }
                let Some((action, id)) = page_change(rest, answer, incident_moved) else {
                    return;
                };
                let session = headers
                    .get(COOKIE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        v.split(';')
                            .map(str::trim)
                            .find(|c| ledger.sessions.contains_key(*c))
                    });
                let Some(actor) = session.map(|session| ledger.sessions[session].clone()) else {
                    panic!(
                        "{method} {path} changed something in a session the ledger does not know"
                    );
                };
                if action == "admin_key.create" {
                    let key = secrets_in(&answer.text)
                        .into_iter()
                        .find(|s| s.starts_with("tak_"))
                        .unwrap_or_default();
                    let name = form_field(body, "name").unwrap_or_default();
                    let actor = Actor::key(name.trim(), None);
                    ledger.credentials.insert(key, actor);
                }
                ledger.changes.push(Change::new(action, id, "pages", actor));
            }
            _ => {}
        }
    }

    /// Reads the whole audit log of the admin at `base` (`http://127.0.0.1:<port>`) and requires
    /// one entry for each noted change, no entry besides them, and no secret in any entry; panics
    /// naming what differs. Returns how many entries it matched.
    pub async fn check(&self, client: &reqwest::Client, base: &str) -> usize {
        self.verify(client, base)
            .await
            .unwrap_or_else(|problems| panic!("{problems}"))
    }

    /// Every entry of the audit log of the admin at `base`, newest first.
    pub async fn entries(&self, client: &reqwest::Client, base: &str) -> Vec<Value> {
        self.read(client, base).await.0
    }

    /// [`Self::check`], answering what differs instead of panicking.
    pub async fn verify(&self, client: &reqwest::Client, base: &str) -> Result<usize, String> {
        let (entries, text) = self.read(client, base).await;
        let ledger = self.lock();
        let mut problems = Vec::new();
        for secret in &ledger.secrets {
            if text.contains(secret_part(secret)) {
                problems.push(format!(
                    "a secret is in the audit log: {}…",
                    &secret[..secret.len().min(10)]
                ));
            }
        }
        // The changes that name their resource first, so that one that does not cannot take
        // their entry.
        let mut changes: Vec<&Change> = ledger.changes.iter().collect();
        changes.sort_by_key(|c| c.resource_id.is_none());
        let mut taken = vec![false; entries.len()];
        for change in changes {
            let found = entries
                .iter()
                .enumerate()
                .find(|(i, entry)| !taken[*i] && change.matches(entry));
            match found {
                Some((i, _)) => taken[i] = true,
                None => problems.push(format!("no audit entry for {change:?}")),
            }
        }
        for (entry, taken) in entries.iter().zip(&taken) {
            if !taken {
                problems.push(format!(
                    "an audit entry for no change the test made: {entry}"
                ));
            }
        }
        if problems.is_empty() {
            Ok(entries.len())
        } else {
            Err(format!(
                "the audit log does not hold the test's changes:\n{}",
                problems.join("\n")
            ))
        }
    }

    /// The audit log's entries, and its pages' text (for the secrets check).
    async fn read(&self, client: &reqwest::Client, base: &str) -> (Vec<Value>, String) {
        let mut entries: Vec<Value> = Vec::new();
        let mut text = String::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!("{base}/api/v1/audit-log?limit=200");
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let response = client
                .get(&url)
                .bearer_auth(&self.bootstrap_token)
                .send()
                .await
                .expect("reading the audit log");
            assert_eq!(response.status(), StatusCode::OK, "reading the audit log");
            let page_text = response.text().await.expect("the audit log");
            let page: Value = serde_json::from_str(&page_text).expect("the audit log as JSON");
            text.push_str(&page_text);
            entries.extend(page["items"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        (entries, text)
    }
}

/// The incident a request moves, if it is a move of an incident's status.
fn incident_of(method: &Method, path: &str) -> Option<Uuid> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("PATCH", ["api", "v1", "incidents", id])
        | ("POST", ["settings", "incidents", id, "status"]) => id.parse().ok(),
        _ => None,
    }
}

/// The id in a path, as the audit log writes it.
fn id_in(text: &str) -> Option<String> {
    text.parse::<Uuid>().ok().map(|id| id.to_string())
}

/// The change a successful write of the API made: its action and resource id. Panics for a
/// write this table does not know, so that a new one is taught here before it is tested.
fn api_change(
    method: &Method,
    path: &[&str],
    answer: &Answer,
    incident_moved: bool,
) -> Option<(&'static str, Option<String>)> {
    let created = || answer.json()["id"].as_str().map(str::to_owned);
    let (action, id) = match (method.as_str(), path) {
        ("POST", ["webhooks"]) => ("webhook.create", created()),
        ("PATCH", ["webhooks", id]) => ("webhook.update", id_in(id)),
        ("DELETE", ["webhooks", id]) => ("webhook.delete", id_in(id)),
        ("POST", ["webhooks", id, "reveal-secret"]) => ("webhook.reveal_secret", id_in(id)),
        ("POST", ["webhooks", id, "rotate-secret"]) => ("webhook.rotate_secret", id_in(id)),
        ("POST", ["webhooks", id, "test"]) => ("webhook.test_event", id_in(id)),
        ("POST", ["webhooks", id, "recover"]) => ("webhook.recover", id_in(id)),
        ("POST", ["webhooks", id, "replay"]) => ("webhook.replay", id_in(id)),
        ("POST", ["deliveries", id, "retry"]) => ("delivery.retry", id_in(id)),
        ("PATCH", ["incidents", _]) if !incident_moved => return None,
        ("PATCH", ["incidents", id]) => ("incident.change_status", id_in(id)),
        ("POST", ["tokens"]) => ("token.create", created()),
        ("DELETE", ["tokens", id]) => ("token.revoke", id_in(id)),
        ("POST", ["admin-keys"]) => ("admin_key.create", created()),
        ("DELETE", ["admin-keys", id]) => ("admin_key.revoke", id_in(id)),
        _ => panic!(
            "{method} /api/v1/{} succeeded, and the audit ledger (tocsin_testkit::audit) does \
             not know what it changes",
            path.join("/")
        ),
    };
    Some((action, id))
}

/// The change a form of the pages made, from the answer that says it was done (a redirect
/// elsewhere than the sign-in page, or the page showing a new secret); `None` for a form that
/// changes nothing (signing out, the delete confirmation page).
fn page_change(
    path: &[&str],
    answer: &Answer,
    incident_moved: bool,
) -> Option<(&'static str, Option<String>)> {
    let ok = answer.status == StatusCode::OK;
    let see_other = answer.status == StatusCode::SEE_OTHER;
    let (action, id) = match path {
        ["sign-out"] => return None,
        ["webhooks", "new"] if ok => ("webhook.create", webhook_linked(&answer.text)),
        ["webhooks", id, "edit" | "enable" | "disable"] if see_other => {
            ("webhook.update", id_in(id))
        }
        ["webhooks", _, "delete"] if ok => return None,
        ["webhooks", id, "delete"] if see_other => ("webhook.delete", id_in(id)),
        ["webhooks", id, "rotate-secret"] if ok => ("webhook.rotate_secret", id_in(id)),
        ["webhooks", id, "test"] if see_other => ("webhook.test_event", id_in(id)),
        ["webhooks", id, "recover"] if see_other => ("webhook.recover", id_in(id)),
        ["webhooks", id, "replay"] if see_other => ("webhook.replay", id_in(id)),
        ["deliveries", id, "retry"] if see_other || answer.status == StatusCode::ACCEPTED => {
            ("delivery.retry", id_in(id))
        }
        ["incidents", _, "status"] if !incident_moved => return None,
        ["incidents", id, "status"] if see_other => ("incident.change_status", id_in(id)),
        ["tokens"] if ok => ("token.create", None),
        ["tokens", id, "revoke"] if see_other => ("token.revoke", id_in(id)),
        ["admin-keys"] if ok => ("admin_key.create", None),
        ["admin-keys", id, "revoke"] if see_other => ("admin_key.revoke", id_in(id)),
        _ => panic!(
            "POST /settings/{} answered {}, and the audit ledger (tocsin_testkit::audit) does \
             not know what it changes",
            path.join("/"),
            answer.status
        ),
    };
    Some((action, id))
}

/// The webhook a page links to (`/settings/webhooks/<id>`), if any.
fn webhook_linked(html: &str) -> Option<String> {
    html.match_indices("/settings/webhooks/")
        .find_map(|(at, marker)| {
            html.get(at + marker.len()..at + marker.len() + 36)
                .and_then(id_in)
        })
}

/// Secrets shown in a text: signing secrets (`whsec_…`), inbound tokens (`tsn_…`), admin keys
/// (`tak_…`).
fn secrets_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["whsec_", "tsn_", "tak_"] {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "+/=-_".contains(c)))
                .unwrap_or(rest.len());
            // Shorter is a prefix named in prose or a placeholder, not a secret.
            if len >= 20 {
                found.push(format!("{prefix}{}", &rest[..len]));
            }
        }
    }
    found
}

/// The part of a secret that must never be in the log: an access token's secret part (its
/// lookup part is public, and the log shows it as the prefix), else all of it.
fn secret_part(secret: &str) -> &str {
    let token = secret.starts_with("tsn_") || secret.starts_with("tak_");
    if token && secret.len() > 43 {
        &secret[secret.len() - 43..]
    } else {
        secret
    }
}

/// A field of a form body (`application/x-www-form-urlencoded`).
fn form_field(body: &str, name: &str) -> Option<String> {
    url::form_urlencoded::parse(body.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_found_in_text_and_only_their_secret_part_is_searched() {
        let key = format!("tak_{}_{}", "a".repeat(12), "b".repeat(43));
        let text = format!("value=\"{key}\" and whsec_c2hvcnQ9PT0xMjM0NTY3ODkwMTIz, tsn_ prefix");
        let found = secrets_in(&text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&key));
        assert_eq!(secret_part(&key), "b".repeat(43));
        assert_eq!(secret_part("whsec_abc"), "whsec_abc");
    }

    #[test]
    fn a_form_field_is_decoded() {
        assert_eq!(
            form_field("name=On-call+Olga&role=operator", "name").as_deref(),
            Some("On-call Olga")
        );
    }
}
