//! Signing in to the settings pages, and what protects them.
//!
//! - The session is a cookie `tocsin_session = <expiry unix secs>.<base64url HMAC-SHA256(key,
//!   expiry)>`, `HttpOnly; SameSite=Strict; Path=/settings; Max-Age=43200` (+ `Secure` with
//!   `TOCSIN_SECURE_COOKIES`). The key is HMAC-SHA256(admin token, "tocsin settings session"):
//!   no session state is stored, admins stay stateless, and changing the token signs everyone
//!   out.
//! - Every form carries `csrf` = base64url HMAC(key, "csrf." + cookie value), checked on every
//!   POST; a POST whose `Origin` is present and names another host is refused as well.
//! - Failed sign-ins are limited per client address: the sixth wrong token within a minute
//!   answers 429. The right token is checked first and always signs in.

use std::future::{ready, Ready};
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

use super::templates::{Layout, SignInPage};
use super::{redirect, render, Form, PageError, PagesState};
use crate::config::AdminToken;

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
        URL_SAFE_NO_PAD
            .decode(presented)
            .is_ok_and(|tag| hmac::verify(&self.key, message.as_bytes(), &tag).is_ok())
    }

    /// A new session's cookie value, valid until `now` + 12 h.
    pub fn issue(&self, now: OffsetDateTime) -> String {
        let expiry = (now.unix_timestamp() + LIFETIME_SECS).to_string();
        let mac = self.mac(&expiry);
        format!("{expiry}.{mac}")
    }

    /// Whether a cookie value is one of ours and has not expired at `now`.
    pub fn verify(&self, value: &str, now: OffsetDateTime) -> bool {
        let Some((expiry, mac)) = value.split_once('.') else {
            return false;
        };
        let unexpired = expiry
            .parse::<i64>()
            .is_ok_and(|expiry| expiry > now.unix_timestamp());
        unexpired && self.verify_mac(expiry, mac)
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

/// A signed-in request: it carried a valid session cookie.
#[derive(Debug, Clone)]
pub struct Session {
    /// The CSRF token its forms carry.
    pub csrf: String,
    value: String,
}

impl Session {
    /// The session of a request, if it has a valid one.
    pub fn of(req: &HttpRequest, keys: &SessionKeys) -> Option<Session> {
        let cookie = req.cookie(COOKIE)?;
        let value = cookie.value();
        keys.verify(value, OffsetDateTime::now_utc())
            .then(|| Session {
                csrf: keys.csrf(value),
                value: value.to_owned(),
            })
    }

    /// The page layout of this session (navigation, sign-out form).
    pub fn layout(&self, nav: &'static str) -> Layout {
        Layout::signed_in(nav, &self.csrf)
    }
}

impl FromRequest for Session {
    type Error = PageError;
    type Future = Ready<Result<Session, PageError>>;

    /// Signed-out requests are sent to the sign-in page.
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let session = req
            .app_data::<web::Data<PagesState>>()
            .and_then(|pages| Session::of(req, &pages.keys));
        ready(session.ok_or(PageError::SignIn))
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
    let session = Session::of(req, &pages.keys).ok_or(PageError::SignIn)?;
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
) -> Result<HttpResponse, PageError> {
    if Session::of(&req, &pages.keys).is_some() {
        return Ok(redirect("/settings/"));
    }
    render(
        StatusCode::OK,
        &SignInPage {
            layout: Layout::signed_out(),
            error: None,
        },
    )
}

/// `POST /settings/sign-in`: checks the admin token; sets the session cookie on success.
#[tracing::instrument(skip_all)]
pub async fn sign_in(
    req: HttpRequest,
    payload: web::Payload,
    pages: web::Data<PagesState>,
) -> Result<HttpResponse, PageError> {
    check_origin(&req)?;
    let address = crate::auth::client_address(&req);
    let form = Form::read(&req, payload, pages.body_limit).await?;
    let presented = form.get("token").unwrap_or_default().trim();
    // The token first, then the limiter: the right token always signs in (see
    // `crate::auth::require_admin_token`).
    if !pages.token.matches(presented) {
        let now = Instant::now();
        if let Err(wait) = pages.limiter.check(address, now) {
            return Err(PageError::RateLimited {
                retry_after: wait.as_secs().max(1),
            });
        }
        pages.limiter.record_failure(address, now);
        tracing::warn!(client = %address, "settings sign-in refused: wrong admin token");
        return render(
            StatusCode::UNPROCESSABLE_ENTITY,
            &SignInPage {
                layout: Layout::signed_out(),
                error: Some("That is not the admin token."),
            },
        );
    }
    pages.limiter.clear(address);
    tracing::info!(client = %address, "settings sign-in");
    let value = pages.keys.issue(OffsetDateTime::now_utc());
    let mut response = redirect("/settings/");
    response
        .add_cookie(&pages.keys.cookie(value))
        .map_err(|e| PageError::Internal(e.to_string()))?;
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
        let value = keys().issue(now);
        assert!(keys().verify(&value, now));
        assert!(keys().verify(&value, now + time::Duration::hours(11)));
        assert!(!keys().verify(&value, now + time::Duration::hours(12)));
        let other = SessionKeys::new(&AdminToken::new("another-token-0123456789"), false);
        assert!(!other.verify(&value, now));
        let (expiry, mac) = value.split_once('.').unwrap();
        let later = format!("{}.{mac}", expiry.parse::<i64>().unwrap() + 3600);
        assert!(!keys().verify(&later, now), "a stretched expiry is refused");
        for garbage in ["", ".", "123", "abc.def", "99999999999.!!!"] {
            assert!(!keys().verify(garbage, now), "{garbage:?}");
        }
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let keys = keys();
        let now = OffsetDateTime::now_utc();
        let one = keys.issue(now);
        let two = keys.issue(now + time::Duration::seconds(1));
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
