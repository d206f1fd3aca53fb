//! Signing in to the settings pages, and what protects them.
//!
//! - One signs in with an admin key or, unless it is turned off, the bootstrap token.
//! - The session is a cookie `tocsin_session = <expiry unix secs>.<subject>.<base64url
//!   HMAC-SHA256(key, expiry.subject)>`, `HttpOnly; SameSite=Strict; Path=/settings;
//!   Max-Age=43200` (+ `Secure` with `TOCSIN_SECURE_COOKIES`). The subject is `bootstrap` or the
//!   admin key's id. The base key is HMAC-SHA256(admin token, "tocsin settings session"); a key's
//!   session is signed with HMAC-SHA256(base key, the key's stored hash), so that forging one
//!   needs the database as well as the token. No session state is stored: every request looks
//!   its key up, so revoking the key (or its expiry, or turning the bootstrap token off) ends
//!   its sessions at once, and changing the token signs everyone out.
//! - Each page and form needs a role (`crate::roles::PAGES`); beyond it, 403.
//! - Every form carries `csrf` = base64url HMAC(key, "csrf." + cookie value), checked on every
//!   POST; a POST whose `Origin` is present and names another host is refused as well.
//! - Failed sign-ins are limited per client address: the sixth wrong token within a minute
//!   answers 429. The right token is checked first and always signs in.

use std::time::Instant;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::dev::Payload;
use actix_web::http::{header, StatusCode};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use futures::future::LocalBoxFuture;
use ring::hmac;
use time::OffsetDateTime;

use tocsin_domain::Role;
use tocsin_storage::admin_keys;
use uuid::Uuid;

use super::templates::{Layout, SignInPage};
use super::{redirect, render, Form, PageError, PagesState};
use crate::actor::{Actor, Surface, Who};
use crate::config::AdminToken;
use crate::state::AdminState;

/// The session cookie's name.
pub const COOKIE: &str = "tocsin_session";
/// How long a session lasts (12 h).
const LIFETIME_SECS: i64 = 12 * 60 * 60;
/// The purpose the session key is derived for.
const KEY_PURPOSE: &str = "tocsin settings session";

/// Issues and checks session cookies and CSRF tokens.
pub struct SessionKeys {
    key: hmac::Key,
    secure: bool,
}

impl SessionKeys {
    pub fn new(token: &AdminToken, secure: bool) -> Self {
        SessionKeys {
            key: token.derive_key(KEY_PURPOSE),
            secure,
        }
    }

    fn mac(&self, message: &str) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.key, message.as_bytes()))
    }

    fn verify_mac(&self, message: &str, presented: &str) -> bool {
        verify_with(&self.key, message, presented)
    }

    /// The key a subject's sessions are signed with: the base key for the bootstrap token, and
    /// one derived from the admin key's stored hash for a key.
    fn subject_key(&self, key_hash: Option<&[u8]>) -> hmac::Key {
        match key_hash {
            None => self.key.clone(),
            Some(hash) => hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&self.key, hash).as_ref()),
        }
    }

    /// A new session's cookie value for `subject` (`bootstrap` or a key's id, with the key's
    /// stored hash), valid until `now` + 12 h.
    pub fn issue(&self, now: OffsetDateTime, subject: &str, key_hash: Option<&[u8]>) -> String {
        self.issue_until(now.unix_timestamp() + LIFETIME_SECS, subject, key_hash)
    }

    /// A session's cookie value valid until `expiry` (unix seconds).
    fn issue_until(&self, expiry: i64, subject: &str, key_hash: Option<&[u8]>) -> String {
        let message = format!("{expiry}.{subject}");
        let mac =
            URL_SAFE_NO_PAD.encode(hmac::sign(&self.subject_key(key_hash), message.as_bytes()));
        format!("{message}.{mac}")
    }

    /// The subject of a cookie value that has not expired at `now` (its MAC is checked by
    /// [`Self::verify`] once the subject's key hash is known).
    pub fn subject<'v>(&self, value: &'v str, now: OffsetDateTime) -> Option<&'v str> {
        let mut parts = value.splitn(3, '.');
        let expiry = parts.next()?;
        let subject = parts.next()?;
        parts.next()?;
        expiry
            .parse::<i64>()
            .is_ok_and(|expiry| expiry > now.unix_timestamp())
            .then_some(subject)
    }

    /// Whether a cookie value is one of ours for its subject and has not expired at `now`.
    pub fn verify(&self, value: &str, now: OffsetDateTime, key_hash: Option<&[u8]>) -> bool {
        if self.subject(value, now).is_none() {
            return false;
        }
        let Some((message, mac)) = value.rsplit_once('.') else {
            return false;
        };
        verify_with(&self.subject_key(key_hash), message, mac)
    }

    /// The cookie that carries a sign-in to the identity provider and back: its `state`, nonce
    /// and PKCE verifier, MAC'd. `SameSite=Lax`: the provider's redirect back is a cross-site
    /// navigation, with which a `Strict` cookie would not be sent.
    fn pending_cookie(&self, pending: &crate::oidc::Pending) -> Cookie<'static> {
        let value = pending.encode();
        let mac = self.mac(&format!("oidc.{value}"));
        Cookie::build(OIDC_COOKIE, format!("{value}.{mac}"))
            .path("/settings/sign-in/oidc")
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(self.secure)
            .max_age(actix_web::cookie::time::Duration::minutes(10))
            .finish()
    }

    fn pending_of(&self, req: &HttpRequest) -> Option<crate::oidc::Pending> {
        let cookie = req.cookie(OIDC_COOKIE)?;
        let (value, mac) = cookie.value().rsplit_once('.')?;
        self.verify_mac(&format!("oidc.{value}"), mac)
            .then(|| crate::oidc::Pending::decode(value))
            .flatten()
    }

    /// The CSRF token the forms of this session carry.
    pub fn csrf(&self, session: &str) -> String {
        self.mac(&format!("csrf.{session}"))
    }

    fn verify_csrf(&self, session: &str, presented: &str) -> bool {
        self.verify_mac(&format!("csrf.{session}"), presented)
    }

    /// The cookie that holds a session.
    pub fn cookie(&self, value: String) -> Cookie<'static> {
        Cookie::build(COOKIE, value)
            .path("/settings")
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .max_age(actix_web::cookie::time::Duration::seconds(LIFETIME_SECS))
            .finish()
    }

    /// The cookie that removes the session from the browser.
    fn removal(&self) -> Cookie<'static> {
        let mut cookie = self.cookie(String::new());
        cookie.make_removal();
        cookie
    }
}

fn verify_with(key: &hmac::Key, message: &str, presented: &str) -> bool {
    URL_SAFE_NO_PAD
        .decode(presented)
        .is_ok_and(|tag| hmac::verify(key, message.as_bytes(), &tag).is_ok())
}

/// The subject of the bootstrap token's sessions.
const BOOTSTRAP_SUBJECT: &str = "bootstrap";
/// The subject of an identity's sessions starts so: `oidc~<role>~<subject>~<name>`, both
/// base64url.
const IDENTITY_SUBJECT: &str = "oidc~";
/// The cookie of a sign-in under way at the identity provider.
const OIDC_COOKIE: &str = "tocsin_oidc";

/// What an identity's sessions are signed with besides the token: the client secret, so that
/// the token alone cannot make one.
fn identity_binding(pages: &PagesState) -> Option<Vec<u8>> {
    let oidc = pages.oidc.as_ref()?;
    let secret = oidc.settings.client_secret.as_deref().unwrap_or_default();
    Some(
        ring::digest::digest(&ring::digest::SHA256, format!("oidc:{secret}").as_bytes())
            .as_ref()
            .to_vec(),
    )
}

/// An identity's session subject.
fn identity_subject(identity: &crate::oidc::Identity) -> String {
    format!(
        "{IDENTITY_SUBJECT}{}~{}~{}",
        identity.role,
        URL_SAFE_NO_PAD.encode(&identity.subject),
        URL_SAFE_NO_PAD.encode(&identity.name)
    )
}

/// Who an identity's session subject names, and with which role.
fn identity_of(subject: &str) -> Option<(Who, Role)> {
    let mut parts = subject.strip_prefix(IDENTITY_SUBJECT)?.split('~');
    let role = parts.next()?.parse::<Role>().ok()?;
    let text = |part: Option<&str>| String::from_utf8(URL_SAFE_NO_PAD.decode(part?).ok()?).ok();
    let subject = text(parts.next())?;
    let name = text(parts.next())?;
    parts
        .next()
        .is_none()
        .then_some((Who::Identity { subject, name }, role))
}

/// A signed-in request: it carried a valid session cookie of a live credential.
#[derive(Debug, Clone)]
pub struct Session {
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// Who is signed in, from where.
    pub actor: Actor,
    value: String,
}

impl Session {
    /// The session of a request, if it has a valid one whose credential is still live.
    pub async fn of(
        req: &HttpRequest,
        pages: &PagesState,
        state: &AdminState,
    ) -> Result<Option<Session>, PageError> {
        let keys = &pages.keys;
        let Some(cookie) = req.cookie(COOKIE) else {
            return Ok(None);
        };
        let value = cookie.value();
        let now = OffsetDateTime::now_utc();
        let Some(subject) = keys.subject(value, now) else {
            return Ok(None);
        };
        let (who, role) = if subject == BOOTSTRAP_SUBJECT {
            if state.bootstrap.is_none() || !keys.verify(value, now, None) {
                return Ok(None);
            }
            (Who::Bootstrap, Role::Admin)
        } else if subject.starts_with(IDENTITY_SUBJECT) {
            let Some(binding) = identity_binding(pages) else {
                return Ok(None);
            };
            match identity_of(subject) {
                Some(identified) if keys.verify(value, now, Some(&binding)) => identified,
                _ => return Ok(None),
            }
        } else {
            let Ok(id) = subject.parse::<Uuid>() else {
                return Ok(None);
            };
            let mut conn = state.conn().await?;
            let key = match admin_keys::get(&mut conn, id).await {
                Ok(key) if key.is_live(now) => key,
                Ok(_) | Err(tocsin_storage::DbError::NotFound) => return Ok(None),
                Err(error) => return Err(error.into()),
            };
            if !keys.verify(value, now, Some(&key.key_hash)) {
                return Ok(None);
            }
            admin_keys::note_use(&mut conn, &key, now).await?;
            let who = Who::Key {
                id: key.id,
                name: key.name,
            };
            (who, key.role)
        };
        Ok(Some(Session {
            csrf: keys.csrf(value),
            actor: Actor::of_request(req, who, role, Surface::Pages),
            value: value.to_owned(),
        }))
    }

    /// The session of a request, with the role its page needs (`crate::roles::PAGES`):
    /// signed out → [`PageError::SignIn`], beyond its role → 403.
    async fn allowed(req: &HttpRequest) -> Result<Session, PageError> {
        let (pages, state) = page_states(req)?;
        let session = Session::of(req, pages, state)
            .await?
            .ok_or(PageError::SignIn)?;
        let needed = crate::roles::needed(
            crate::roles::PAGES,
            req.method().as_str(),
            req.match_pattern().as_deref(),
        );
        if !session.actor.role.allows(needed) {
            state.refused(Surface::Pages, StatusCode::FORBIDDEN);
            return Err(PageError::Role { needed });
        }
        Ok(session)
    }

    /// The page layout of this session (navigation, sign-out form, what its role shows).
    pub fn layout(&self, nav: &'static str) -> Layout {
        Layout::signed_in(nav, &self.csrf, self.actor.role)
    }
}

fn page_states(req: &HttpRequest) -> Result<(&PagesState, &AdminState), PageError> {
    let pages = req
        .app_data::<web::Data<PagesState>>()
        .ok_or_else(|| PageError::Internal("the pages are not configured".into()))?;
    let state = req
        .app_data::<web::Data<AdminState>>()
        .ok_or_else(|| PageError::Internal("the pages are not configured".into()))?;
    Ok((pages, state))
}

impl FromRequest for Session {
    type Error = PageError;
    type Future = LocalBoxFuture<'static, Result<Session, PageError>>;

    /// Signed-out requests are sent to the sign-in page; requests beyond the session's role
    /// are refused.
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move { Session::allowed(&req).await })
    }
}

/// The form of a POST from a signed-in session. Extracting it refuses (403) a foreign `Origin`
/// or a missing or wrong CSRF token, and sends a signed-out request to the sign-in page.
pub struct SignedForm {
    pub session: Session,
    pub form: Form,
}

impl FromRequest for SignedForm {
    type Error = PageError;
    type Future = LocalBoxFuture<'static, Result<SignedForm, PageError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let payload = web::Payload::from_request(&req, payload).into_inner();
        Box::pin(async move {
            let pages = req
                .app_data::<web::Data<PagesState>>()
                .ok_or_else(|| PageError::Internal("the pages are not configured".into()))?;
            let payload = payload.map_err(|e| PageError::Internal(e.to_string()))?;
            signed_form(&req, payload, pages).await
        })
    }
}

#[tracing::instrument(skip_all)]
async fn signed_form(
    req: &HttpRequest,
    payload: web::Payload,
    pages: &PagesState,
) -> Result<SignedForm, PageError> {
    check_origin(req)?;
    let session = Session::allowed(req).await?;
    let form = Form::read(req, payload, pages.body_limit).await?;
    let presented = form.get("csrf").unwrap_or_default();
    if !pages.keys.verify_csrf(&session.value, presented) {
        return Err(PageError::Forbidden(
            "The form was not sent from this site's pages (its security token is missing or \
             wrong). Reload the page and try again.",
        ));
    }
    Ok(SignedForm { session, form })
}

/// Refuses a request whose `Origin` header is present and names another host than the one
/// the request was sent to (a cross-site form post).
fn check_origin(req: &HttpRequest) -> Result<(), PageError> {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let host = req.connection_info().host().to_ascii_lowercase();
    let same = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .is_some_and(|(_, authority)| authority.to_ascii_lowercase() == host);
    if same {
        Ok(())
    } else {
        Err(PageError::Forbidden(
            "Cross-site requests are refused: the form was sent from another site.",
        ))
    }
}

/// `GET /settings/sign-in`: the form (or the webhooks, when already signed in).
#[tracing::instrument(skip_all)]
pub async fn sign_in_form(
    req: HttpRequest,
    pages: web::Data<PagesState>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    if Session::of(&req, &pages, &state).await?.is_some() {
        return Ok(redirect("/settings/"));
    }
    render(
        StatusCode::OK,
        &SignInPage {
            layout: Layout::signed_out(),
            error: None,
            oidc: pages.oidc.is_some(),
        },
    )
}

/// `POST /settings/sign-in`: checks the admin key (or the bootstrap token); sets the session
/// cookie on success.
#[tracing::instrument(skip_all)]
pub async fn sign_in(
    req: HttpRequest,
    payload: web::Payload,
    pages: web::Data<PagesState>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    check_origin(&req)?;
    let address = crate::actor::client_address(&req);
    let form = Form::read(&req, payload, pages.body_limit).await?;
    let presented = form.get("token").unwrap_or_default().trim();
    // The credential first, then the limiter: the right one always signs in (see
    // `crate::auth::authenticate`).
    let identified = crate::auth::identify(&state, presented).await?;
    let Some((who, role)) = identified else {
        state.refused(Surface::Pages, StatusCode::UNAUTHORIZED);
        let now = Instant::now();
        if let Err(wait) = pages.limiter.check(address, now) {
            return Err(PageError::RateLimited {
                retry_after: wait.as_secs().max(1),
            });
        }
        pages.limiter.record_failure(address, now);
        tracing::warn!(client = %address, "settings sign-in refused: not an admin key");
        return render(
            StatusCode::UNPROCESSABLE_ENTITY,
            &SignInPage {
                layout: Layout::signed_out(),
                error: Some("That is not a live admin key or the admin token."),
                oidc: pages.oidc.is_some(),
            },
        );
    };
    pages.limiter.clear(address);
    let now = OffsetDateTime::now_utc();
    let value = match &who {
        Who::Key { id, .. } => {
            let mut conn = state.conn().await?;
            let key = admin_keys::get(&mut conn, *id).await?;
            pages.keys.issue(now, &id.to_string(), Some(&key.key_hash))
        }
        _ => pages.keys.issue(now, BOOTSTRAP_SUBJECT, None),
    };
    tracing::info!(client = %address, actor = who.name(), %role, "settings sign-in");
    let mut response = redirect("/settings/");
    response
        .add_cookie(&pages.keys.cookie(value))
        .map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(response)
}

/// `GET /settings/sign-in/oidc`: sends the browser to the identity provider, with a new
/// `state`, nonce and PKCE challenge, keeping them in a short-lived cookie.
#[tracing::instrument(skip_all)]
pub async fn oidc_start(
    req: HttpRequest,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    let oidc = pages
        .oidc
        .as_ref()
        .ok_or(PageError::Admin(crate::error::AdminError::NotFound("page")))?;
    let pending = crate::oidc::Pending::new();
    let redirect_url = oidc.settings.redirect_url(&req);
    let url = oidc.authorization_url(&pending, &redirect_url).await.map_err(|error| {
        tracing::warn!(error = %format!("{error:#}"), "the identity provider cannot be reached");
        PageError::OidcFailed
    })?;
    let mut response = HttpResponse::SeeOther()
        .insert_header((header::LOCATION, url))
        .finish();
    response
        .add_cookie(&pages.keys.pending_cookie(&pending))
        .map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(response)
}

/// The provider's answer on the callback.
#[derive(Debug, serde::Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// `GET /settings/sign-in/oidc/callback`: checks `state` against the cookie, exchanges the
/// code (with the PKCE verifier), checks the ID token and its nonce, maps the identity's claim
/// to a role, and signs in for as long as the ID token is valid (at most 12 h). An identity
/// with no role is refused (403); anything else amiss is 401.
#[tracing::instrument(skip_all)]
pub async fn oidc_callback(
    req: HttpRequest,
    query: web::Query<Callback>,
    pages: web::Data<PagesState>,
    state: web::Data<AdminState>,
) -> Result<HttpResponse, PageError> {
    let oidc = pages
        .oidc
        .as_ref()
        .ok_or(PageError::Admin(crate::error::AdminError::NotFound("page")))?;
    let refused = |status: StatusCode, why: &str| {
        state.refused(Surface::Pages, status);
        tracing::warn!(client = %crate::actor::client_address(&req), why, "identity provider sign-in refused");
    };
    let pending = pages.keys.pending_of(&req);
    let (Some(pending), Some(code), Some(returned), None) =
        (pending, &query.code, &query.state, &query.error)
    else {
        refused(
            StatusCode::UNAUTHORIZED,
            "no sign-in under way, or the provider refused",
        );
        return Err(PageError::OidcFailed);
    };
    if !tocsin_domain::constant_time_eq(returned, &pending.state) {
        refused(StatusCode::UNAUTHORIZED, "state mismatch");
        return Err(PageError::OidcFailed);
    }
    let redirect_url = oidc.settings.redirect_url(&req);
    let identity = match oidc.finish(code, &pending, &redirect_url).await {
        Ok(identity) => identity,
        Err(crate::oidc::OidcError::NoRole(name)) => {
            refused(StatusCode::FORBIDDEN, "no role");
            tracing::info!(identity = %name, "identity without a role refused");
            return Err(PageError::Forbidden(
                "Your identity has no role in Tocsin. Ask an admin to map one of your groups to a role.",
            ));
        }
        Err(crate::oidc::OidcError::Failed(error)) => {
            refused(StatusCode::UNAUTHORIZED, &format!("{error:#}"));
            return Err(PageError::OidcFailed);
        }
    };
    let binding = identity_binding(&pages).unwrap_or_default();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let expiry = identity
        .expires_at
        .unix_timestamp()
        .min(now + LIFETIME_SECS);
    let value = pages
        .keys
        .issue_until(expiry, &identity_subject(&identity), Some(&binding));
    tracing::info!(identity = %identity.name, role = %identity.role, "settings sign-in through the identity provider");
    let mut response = render(
        StatusCode::OK,
        &super::templates::SignedInPage {
            layout: Layout::signed_out(),
            name: identity.name.clone(),
        },
    )?;
    let mut done = pages.keys.pending_cookie(&pending);
    done.make_removal();
    for cookie in [pages.keys.cookie(value), done] {
        response
            .add_cookie(&cookie)
            .map_err(|e| PageError::Internal(e.to_string()))?;
    }
    Ok(response)
}

/// `POST /settings/sign-out`: removes the session cookie.
#[tracing::instrument(skip_all)]
pub async fn sign_out(
    signed: Result<SignedForm, PageError>,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    match signed {
        Ok(_) | Err(PageError::SignIn) => {}
        Err(other) => return Err(other),
    }
    let mut response = redirect("/settings/sign-in");
    response
        .add_cookie(&pages.keys.removal())
        .map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> SessionKeys {
        SessionKeys::new(&AdminToken::new("0123456789abcdef-token"), false)
    }

    #[test]
    fn sessions_verify_until_they_expire_and_only_with_their_key() {
        let now = OffsetDateTime::now_utc();
        let value = keys().issue(now, BOOTSTRAP_SUBJECT, None);
        assert!(keys().verify(&value, now, None));
        assert!(keys().verify(&value, now + time::Duration::hours(11), None));
        assert!(!keys().verify(&value, now + time::Duration::hours(12), None));
        let other = SessionKeys::new(&AdminToken::new("another-token-0123456789"), false);
        assert!(!other.verify(&value, now, None));
        let (expiry, rest) = value.split_once('.').unwrap();
        let later = format!("{}.{rest}", expiry.parse::<i64>().unwrap() + 3600);
        assert!(
            !keys().verify(&later, now, None),
            "a stretched expiry is refused"
        );
        for garbage in [
            "",
            ".",
            "123",
            "abc.def",
            "99999999999.!!!",
            "99999999999.x.!!!",
        ] {
            assert!(!keys().verify(garbage, now, None), "{garbage:?}");
        }
    }

    #[test]
    fn a_key_session_needs_the_key_hash_and_names_its_key() {
        let now = OffsetDateTime::now_utc();
        let id = Uuid::now_v7().to_string();
        let value = keys().issue(now, &id, Some(b"hash-of-the-key"));
        assert_eq!(keys().subject(&value, now), Some(id.as_str()));
        assert!(keys().verify(&value, now, Some(b"hash-of-the-key")));
        assert!(!keys().verify(&value, now, Some(b"hash-of-another-key")));
        assert!(
            !keys().verify(&value, now, None),
            "the token alone cannot sign it"
        );
        let swapped = value.replacen(&id, BOOTSTRAP_SUBJECT, 1);
        assert!(!keys().verify(&swapped, now, None));
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let keys = keys();
        let now = OffsetDateTime::now_utc();
        let one = keys.issue(now, BOOTSTRAP_SUBJECT, None);
        let two = keys.issue(now + time::Duration::seconds(1), BOOTSTRAP_SUBJECT, None);
        assert!(keys.verify_csrf(&one, &keys.csrf(&one)));
        assert!(!keys.verify_csrf(&two, &keys.csrf(&one)));
        assert!(!keys.verify_csrf(&one, ""));
        assert!(!keys.verify_csrf(&one, "not base64 !"));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped() {
        let cookie = keys().cookie("v".into()).to_string();
        for part in [
            "tocsin_session=v",
            "HttpOnly",
            "SameSite=Strict",
            "Path=/settings",
            "Max-Age=43200",
        ] {
            assert!(cookie.contains(part), "{cookie}");
        }
        assert!(!cookie.contains("Secure"));
        let secure = SessionKeys::new(&AdminToken::new("0123456789abcdef-token"), true);
        assert!(secure.cookie("v".into()).to_string().contains("Secure"));
    }
}
