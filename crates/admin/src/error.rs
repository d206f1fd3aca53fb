//! The admin API's one error type: every refusal maps to a status code and the common JSON
//! error body of `tocsin_web::ApiError`; unexpected storage errors are logged with their chain
//! and answered 500 without detail.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use tocsin_domain::TransitionError;
use tocsin_storage::incidents::StatusChangeError;
use tocsin_storage::DbError;
use tocsin_web::ApiError;

/// Seconds a client should wait after a 503.
const RETRY_AFTER_UNAVAILABLE: u64 = 5;

/// Why an admin request was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Refused while reading the request: 400, 413, 415 or 422 from the shared helpers.
    #[error("{0}")]
    Request(ApiError),
    /// 422: the body is well-formed but a field's value is not acceptable.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// 400: a query parameter is not acceptable.
    #[error("{parameter}: {message}")]
    BadParameter {
        parameter: &'static str,
        message: String,
    },
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("storage unavailable")]
    Unavailable,
    #[error(transparent)]
    Storage(DbError),
}

impl AdminError {
    pub fn invalid(field: impl Into<String>, message: impl ToString) -> Self {
        AdminError::Invalid {
            field: field.into(),
            message: message.to_string(),
        }
    }

    pub fn bad_parameter(parameter: &'static str, message: impl ToString) -> Self {
        AdminError::BadParameter {
            parameter,
            message: message.to_string(),
        }
    }

    /// The API's answer: status, code and message (logging an unexpected cause).
    pub(crate) fn to_api_error(&self) -> ApiError {
        match self {
            AdminError::Request(error) => error.clone(),
            AdminError::Invalid { field, message } => ApiError::invalid(field.clone(), message),
            AdminError::BadParameter { parameter, message } => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{parameter}: {message}"),
            )
            .with_field(*parameter),
            AdminError::NotFound(what) => ApiError::not_found(what),
            AdminError::Conflict(message) => ApiError::conflict(message.clone()),
            AdminError::Unavailable => ApiError::unavailable(RETRY_AFTER_UNAVAILABLE),
            AdminError::Storage(error) => ApiError::internal(error),
        }
    }
}

impl From<ApiError> for AdminError {
    fn from(error: ApiError) -> Self {
        AdminError::Request(error)
    }
}

impl From<tocsin_web::body::BodyError> for AdminError {
    fn from(error: tocsin_web::body::BodyError) -> Self {
        AdminError::Request(error.into())
    }
}

impl From<DbError> for AdminError {
    fn from(error: DbError) -> Self {
        if error.is_transient() {
            AdminError::Unavailable
        } else {
            AdminError::Storage(error)
        }
    }
}

impl From<StatusChangeError> for AdminError {
    fn from(error: StatusChangeError) -> Self {
        match error {
            StatusChangeError::NotFound => AdminError::NotFound("incident"),
            StatusChangeError::Transition(TransitionError::FromResolved) => AdminError::Conflict(
                "the incident is resolved, which is final; a new alert opens a new incident".into(),
            ),
            StatusChangeError::Transition(error @ TransitionError::Unchanged(_)) => {
                AdminError::Conflict(error.to_string())
            }
            StatusChangeError::Db(error) => error.into(),
        }
    }
}

/// Turns a repository's `NotFound` into a 404 naming what was looked for.
pub trait OrNotFound<T> {
    fn or_not_found(self, what: &'static str) -> Result<T, AdminError>;
}

impl<T> OrNotFound<T> for Result<T, DbError> {
    fn or_not_found(self, what: &'static str) -> Result<T, AdminError> {
        self.map_err(|error| match error {
            DbError::NotFound => AdminError::NotFound(what),
            other => other.into(),
        })
    }
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        match self {
            AdminError::Request(error) => error.status(),
            AdminError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::BadParameter { .. } => StatusCode::BAD_REQUEST,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.to_api_error().error_response()
    }
}
