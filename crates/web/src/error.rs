//! The error body every Tocsin service answers with:
//!
//! ```json
//! {"error": {"code": "invalid", "message": "url: scheme must be http or https", "field": "url"}}
//! ```
//!
//! `code` is a stable machine-readable word; `field` names the offending request field when there
//! is one. Unexpected causes are logged with their chain and never sent to clients.

use std::fmt;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

/// The JSON error body.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An error answer: status, body and any extra headers (`WWW-Authenticate`, `Retry-After`).
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                error: ErrorDetail {
                    code: code.to_owned(),
                    message: message.into(),
                    field: None,
                },
            },
            headers: Vec::new(),
        }
    }

    /// Names the request field the error is about.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.body.error.field = Some(field.into());
        self
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// 400: the body is not parseable.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 422: the content is invalid; names the field.
    pub fn invalid(field: impl Into<String>, message: impl fmt::Display) -> Self {
        let field = field.into();
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            format!("{field}: {message}"),
        )
        .with_field(field)
    }

    /// 401 with `WWW-Authenticate: Bearer`; says nothing of why.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
        .with_header(
            actix_web::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        )
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is over the limit of {limit} bytes"),
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON (Content-Type: application/json)",
        )
    }

    /// 429 with `Retry-After`.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; retry later",
        )
        .with_header(
            actix_web::http::header::RETRY_AFTER,
            HeaderValue::from(retry_after_secs.max(1)),
        )
    }

    /// 503 with `Retry-After`: storage or the broker cannot be reached.
    pub fn unavailable(retry_after_secs: u64) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the service cannot reach its storage; retry later",
        )
        .with_header(
            actix_web::http::header::RETRY_AFTER,
            HeaderValue::from(retry_after_secs.max(1)),
        )
    }

    /// 500 for an unexpected cause: logs the cause with its chain, tells the client nothing of it.
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        let mut chain = cause.to_string();
        let mut source = cause.source();
        while let Some(next) = source {
            chain.push_str(": ");
            chain.push_str(&next.to_string());
            source = next.source();
        }
        tracing::error!(error = %chain, "request failed unexpectedly");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "an unexpected error occurred; it has been logged",
        )
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn body(&self) -> &ErrorBody {
        &self.body
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.body.error.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        for (name, value) in &self.headers {
            response.insert_header((name.clone(), value.clone()));
        }
        response.json(&self.body)
    }
}

/// Maps actix's own extractor and routing errors (bad paths, bad queries) to the common shape.
pub fn query_error_handler(
    error: actix_web::error::QueryPayloadError,
    _req: &actix_web::HttpRequest,
) -> actix_web::Error {
    let message = match &error {
        actix_web::error::QueryPayloadError::Deserialize(e) => e.to_string(),
        other => other.to_string(),
    };
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "bad_request",
        format!("query: {message}"),
    )
    .into()
}

/// Maps path parameter errors (an id that is not a UUID) to 404 in the common shape.
pub fn path_error_handler(
    _error: actix_web::error::PathError,
    _req: &actix_web::HttpRequest,
) -> actix_web::Error {
    ApiError::not_found("resource").into()
}

/// 405 with the `Allow` header RFC 9110 requires, listing the methods the resource takes.
pub fn method_not_allowed(allow: &'static str) -> HttpResponse {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("this path takes {allow} only"),
    )
    .with_header(
        actix_web::http::header::ALLOW,
        HeaderValue::from_static(allow),
    )
    .error_response()
}

/// 405 for a read-only resource asked with another method.
pub async fn get_only() -> HttpResponse {
    method_not_allowed("GET")
}

/// The common shape for a route that does not exist.
pub async fn not_found() -> HttpResponse {
    ApiError::not_found("route").error_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    #[test]
    fn errors_render_the_common_body_and_headers() {
        let response = ApiError::invalid("url", "scheme must be http or https").error_response();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let bytes = response.into_body().try_into_bytes().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["code"], "invalid");
        assert_eq!(body["error"]["field"], "url");

        let response = ApiError::unauthorized().error_response();
        assert_eq!(
            response.headers().get("www-authenticate").unwrap(),
            "Bearer"
        );
        let response = ApiError::unavailable(5).error_response();
        assert_eq!(response.headers().get("retry-after").unwrap(), "5");
    }
}
