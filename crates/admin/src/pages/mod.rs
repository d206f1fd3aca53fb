//! The settings pages: Settings → Webhooks (list, create, edit, enable,
//! disable, rotate the secret, send a test event, delete), the delivery log with its attempts
//! and the Retry button, inbound tokens (issue with a source and credentials, revoke),
//! incidents, admin keys and the audit log — server-rendered HTML under `/settings/`, signed in
//! with an admin key (or the bootstrap token), showing only what the key's role allows. They call the same validation (`crate::validation`) and operations
//! (`crate::actions`) as the JSON API. Every page works without JavaScript; the small script
//! only enhances (copy button, Retry without a reload, validation hints, delete confirmation).

mod admin_keys;
mod assets;
mod audit_log;
mod deliveries;
mod incidents;
pub mod session;
mod templates;
mod tokens;
mod webhook_form;
mod webhooks;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::DefaultHeaders;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use askama::Template;
use tocsin_domain::RetrySchedule;
use tocsin_storage::DbError;

use crate::config::AdminToken;
use crate::error::AdminError;
use session::SessionKeys;

use crate::auth::FailedAuthLimiter;
use templates::{ErrorPage, Layout};

/// What the page handlers share besides `AdminState`.
pub struct PagesState {
    pub keys: SessionKeys,
    /// The OpenID Connect provider the pages also sign in with, when configured.
    pub oidc: Option<crate::oidc::Oidc>,
    pub limiter: web::Data<FailedAuthLimiter>,
    /// The retry schedule, to show what a webhook's max attempts imply.
    pub schedule: RetrySchedule,
    pub body_limit: usize,
}

impl PagesState {
    pub fn new(
        token: &AdminToken,
        secure_cookies: bool,
        schedule: RetrySchedule,
        body_limit: usize,
        limiter: web::Data<FailedAuthLimiter>,
        oidc: Option<crate::oidc::Oidc>,
    ) -> Self {
        PagesState {
            keys: SessionKeys::new(token, secure_cookies),
            oidc,
            limiter,
            schedule,
            body_limit,
        }
    }
}

/// Headers of every settings page: no caching (pages show secrets), a strict content security
/// policy (scripts and styles only from the binary), no framing.
fn security_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((header::CACHE_CONTROL, "no-store"))
        .add((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "same-origin"))
}

/// Mounts `/` (a redirect to the settings) and every `/settings/` route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let path_config = web::PathConfig::default()
        .error_handler(|_, _| PageError::Admin(AdminError::NotFound("page")).into());
    let query_config = web::QueryConfig::default().error_handler(|error, _| {
        PageError::Admin(AdminError::bad_parameter("query", error)).into()
    });
    cfg.route("/", web::get().to(to_settings)).service(
        web::scope("/settings")
            .app_data(path_config)
            .app_data(query_config)
            .wrap(security_headers())
            .route("", web::get().to(to_settings))
            .service(
                web::resource("/")
                    .route(web::get().to(webhooks::list))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/assets/{file}")
                    .route(web::get().to(assets::serve))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/sign-in")
                    .route(web::get().to(session::sign_in_form))
                    .route(web::post().to(session::sign_in))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/sign-out").route(web::post().to(session::sign_out)))
            .service(
                web::resource("/sign-in/oidc")
                    .route(web::get().to(session::oidc_start))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/sign-in/oidc/callback")
                    .route(web::get().to(session::oidc_callback))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/webhooks")
                    .route(web::get().to(to_settings))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/webhooks/new")
                    .route(web::get().to(webhooks::new_form))
                    .route(web::post().to(webhooks::create))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/webhooks/{id}")
                    .route(web::get().to(webhooks::detail))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/webhooks/{id}/edit")
                    .route(web::get().to(webhooks::edit_form))
                    .route(web::post().to(webhooks::update))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/webhooks/{id}/delete").route(web::post().to(webhooks::delete)))
            .service(
                post("/webhooks/{id}/{switch:enable|disable}")
                    .route(web::post().to(webhooks::set_enabled)),
            )
            .service(
                post("/webhooks/{id}/rotate-secret").route(web::post().to(webhooks::rotate_secret)),
            )
            .service(post("/webhooks/{id}/test").route(web::post().to(webhooks::send_test_event)))
            .service(post("/webhooks/{id}/recover").route(web::post().to(webhooks::recover)))
            .service(post("/webhooks/{id}/replay").route(web::post().to(webhooks::replay)))
            .service(
                web::resource("/deliveries")
                    .route(web::get().to(deliveries::list))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/deliveries/{id}")
                    .route(web::get().to(deliveries::detail))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/deliveries/{id}/retry").route(web::post().to(deliveries::retry)))
            .service(
                web::resource("/incidents")
                    .route(web::get().to(incidents::list))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/incidents/{id}/status").route(web::post().to(incidents::change_status)))
            .service(
                web::resource("/tokens")
                    .route(web::get().to(tokens::list))
                    .route(web::post().to(tokens::create))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/tokens/{id}/revoke").route(web::post().to(tokens::revoke)))
            .service(
                web::resource("/admin-keys")
                    .route(web::get().to(admin_keys::list))
                    .route(web::post().to(admin_keys::create))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(post("/admin-keys/{id}/revoke").route(web::post().to(admin_keys::revoke)))
            .service(
                web::resource("/audit-log")
                    .route(web::get().to(audit_log::list))
                    .default_service(web::to(method_not_allowed)),
            )
            .default_service(web::to(not_found)),
    );
}

/// A resource that takes only the POST its caller adds.
fn post(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

async fn to_settings() -> HttpResponse {
    redirect("/settings/")
}

async fn not_found() -> HttpResponse {
    PageError::Admin(AdminError::NotFound("page")).error_response()
}

async fn method_not_allowed() -> HttpResponse {
    PageError::MethodNotAllowed.error_response()
}

/// A 303 to `location` (after a form post, the browser follows it with a GET).
pub fn redirect(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// Renders a page with a status.
pub fn render(status: StatusCode, page: &impl Template) -> Result<HttpResponse, PageError> {
    let body = page.render()?;
    Ok(HttpResponse::build(status)
        .insert_header((
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ))
        .body(body))
}

/// Why a page could not be shown. Each renders as an HTML page (or, for a signed-out request,
/// a redirect to the sign-in page).
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("sign in first")]
    SignIn,
    /// 403: a cross-site or tokenless form post.
    #[error("{0}")]
    Forbidden(&'static str),
    /// 401: the identity provider's answer could not be used.
    #[error("the sign-in through the identity provider failed")]
    OidcFailed,
    /// 403: beyond the signed-in key's role.
    #[error("this needs the {needed} role")]
    Role { needed: tocsin_domain::Role },
    /// 429: too many failed sign-ins from this address.
    #[error("too many failed sign-ins")]
    RateLimited { retry_after: u64 },
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Whatever the API would refuse, for the same reason.
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("rendering a page: {0}")]
    Render(#[from] askama::Error),
    #[error("{0}")]
    Internal(String),
}

impl From<DbError> for PageError {
    fn from(error: DbError) -> Self {
        PageError::Admin(error.into())
    }
}

impl From<tocsin_web::body::BodyError> for PageError {
    fn from(error: tocsin_web::body::BodyError) -> Self {
        PageError::Admin(error.into())
    }
}

impl PageError {
    fn title_and_message(&self) -> (&'static str, String) {
        match self {
            PageError::SignIn => ("Sign in", "Sign in to see this page.".into()),
            PageError::Forbidden(message) => ("Refused", (*message).into()),
            PageError::OidcFailed => (
                "Sign-in failed",
                "The sign-in through the identity provider could not be completed. Try again."
                    .into(),
            ),
            PageError::Role { needed } => (
                "Not allowed",
                format!(
                    "This needs the {needed} role, which the key you signed in with does not have."
                ),
            ),
            PageError::RateLimited { retry_after } => (
                "Too many attempts",
                format!(
                    "Too many failed sign-ins from this address. Try again in {retry_after} s."
                ),
            ),
            PageError::MethodNotAllowed => (
                "Not allowed",
                "This address does not take that kind of request.".into(),
            ),
            PageError::Admin(error) => {
                let title = match error.status_code() {
                    StatusCode::NOT_FOUND => "Not found",
                    StatusCode::CONFLICT => "Not possible now",
                    StatusCode::SERVICE_UNAVAILABLE => "Unavailable",
                    status if status.is_server_error() => "Something went wrong",
                    _ => "Not accepted",
                };
                let api = error.to_api_error();
                (title, sentence(&api.body().error.message))
            }
            PageError::Render(_) | PageError::Internal(_) => {
                tracing::error!(error = %self, "settings page failed");
                (
                    "Something went wrong",
                    "An unexpected error occurred; it has been logged.".into(),
                )
            }
        }
    }
}

/// An API message as a sentence: capitalised, with a full stop.
fn sentence(message: &str) -> String {
    let mut chars = message.chars();
    let mut text = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    };
    if !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    text
}

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        match self {
            PageError::SignIn => StatusCode::SEE_OTHER,
            PageError::Forbidden(_) | PageError::Role { .. } => StatusCode::FORBIDDEN,
            PageError::OidcFailed => StatusCode::UNAUTHORIZED,
            PageError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            PageError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            PageError::Admin(error) => error.status_code(),
            PageError::Render(_) | PageError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let PageError::SignIn = self {
            return redirect("/settings/sign-in");
        }
        let status = self.status_code();
        let (title, message) = self.title_and_message();
        let page = ErrorPage {
            layout: Layout::signed_out(),
            status: status.as_u16(),
            title,
            message,
        };
        let mut response = render(status, &page).unwrap_or_else(|_| {
            HttpResponse::build(status)
                .content_type("text/plain; charset=utf-8")
                .body(title)
        });
        if let PageError::RateLimited { retry_after } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        response
    }
}

/// A submitted form (`application/x-www-form-urlencoded`), its fields in order.
#[derive(Debug, Default)]
pub struct Form(Vec<(String, String)>);

impl Form {
    /// Reads and decodes a form body of at most `limit` bytes.
    pub async fn read(
        req: &HttpRequest,
        payload: web::Payload,
        limit: usize,
    ) -> Result<Form, PageError> {
        let body = tocsin_web::body::read_limited(req, payload, limit).await?;
        Ok(Form::parse(&body))
    }

    fn parse(body: &[u8]) -> Form {
        Form(
            url::form_urlencoded::parse(body)
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect(),
        )
    }

    /// The first value of a field.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every value of a field (checkboxes), in order.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(field, _)| field == name)
            .map(|(_, value)| value.clone())
            .collect()
    }
}

/// A message confirming what a form post did, named by a fixed key in the redirect's query
/// (`?notice=enabled`), so no text of the request is ever echoed into the page.
pub fn notice(key: Option<&str>, count: Option<&str>) -> Option<String> {
    let text = match key? {
        "updated" => "Webhook saved.".to_owned(),
        "enabled" => "Webhook enabled: it receives its events again. Recover the deliveries that waited meanwhile below.".to_owned(),
        "disabled" => {
            "Webhook disabled: its unfinished deliveries were stopped; events that come meanwhile wait in its log until you enable it and recover them."
                .to_owned()
        }
        "test" => "Test event sent: its delivery appears in the log below in a moment.".to_owned(),
        "recovered" => {
            let count: usize = count.and_then(|c| c.parse().ok()).unwrap_or(0);
            match count {
                0 => "No failed or waiting deliveries since then: nothing to send.".to_owned(),
                1 => "1 delivery enqueued: a failed one retried, or one that waited sent.".to_owned(),
                n => format!("{n} deliveries enqueued: failed ones retried, those that waited sent."),
            }
        }
        "replaying" => "Replay started: the past events this webhook has no delivery of appear in its log, marked replayed, as dispatchers make them.".to_owned(),
        "deleted" => "Webhook deleted. Its delivery log stays readable.".to_owned(),
        "retried" => {
            "Manual attempt enqueued: it appears below once made (reload to see it).".to_owned()
        }
        "acknowledged" => "Incident acknowledged.".to_owned(),
        "resolved" => "Incident resolved.".to_owned(),
        "status" => "Incident status changed.".to_owned(),
        "revoked" => "Token revoked: the next alert sent with it is refused.".to_owned(),
        "key-revoked" => "Admin key revoked: its next request is refused and its sessions ended.".to_owned(),
        _ => return None,
    };
    Some(text)
}

/// Query text of a link: `name=value` pairs, percent-encoded, skipping empty values.
pub fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut serializer = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if !value.is_empty() {
            serializer.append_pair(name, value);
        }
    }
    serializer.finish()
}

/// The link to the next (older) page of a list at `path`, when there is one.
pub fn older_page(path: &str, next: Option<tocsin_storage::Cursor>) -> Option<String> {
    next.map(|cursor| {
        let cursor = cursor.encode();
        format!("{path}?{}", query_string([("cursor", cursor.as_str())]))
    })
}

/// A webhook's page.
pub fn webhook_href(id: uuid::Uuid) -> String {
    format!("/settings/webhooks/{id}")
}

/// An optional query parameter, empty counting as absent (forms submit empty selects).
pub fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_keep_every_value_of_a_field() {
        let form =
            Form::parse(b"csrf=abc&events=incidents.opened&events=incidents.resolved&name=a+b%26c");
        assert_eq!(form.get("csrf"), Some("abc"));
        assert_eq!(form.get("name"), Some("a b&c"));
        assert_eq!(
            form.all("events"),
            ["incidents.opened", "incidents.resolved"]
        );
        assert_eq!(form.get("missing"), None);
    }

    #[test]
    fn notices_come_from_fixed_keys_only() {
        assert_eq!(notice(Some("<script>"), None), None);
        assert_eq!(
            notice(Some("recovered"), Some("3")).unwrap(),
            "3 deliveries enqueued: failed ones retried, those that waited sent."
        );
        assert!(notice(Some("recovered"), Some("<b>"))
            .unwrap()
            .starts_with("No failed"));
    }

    #[test]
    fn links_skip_empty_values() {
        assert_eq!(
            query_string([("state", "failed"), ("event", ""), ("cursor", "a b")]),
            "state=failed&cursor=a+b"
        );
        assert_eq!(sentence("webhook not found"), "Webhook not found.");
    }
}
