//! Reading a request body up to a limit, refusing it as soon as it passes (413) instead of
//! buffering whatever a client sends.

use actix_web::http::header::CONTENT_LENGTH;
use actix_web::{web, HttpRequest};
use futures::StreamExt;

use crate::ApiError;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("body over {limit} bytes")]
    TooLarge { limit: usize },
    #[error("body could not be read: {0}")]
    Read(String),
}

impl From<BodyError> for ApiError {
    fn from(error: BodyError) -> Self {
        match error {
            BodyError::TooLarge { limit } => ApiError::payload_too_large(limit),
            BodyError::Read(message) => ApiError::bad_request(message),
        }
    }
}

/// Reads the whole body, refusing a declared or actual length over `limit` bytes.
pub async fn read_limited(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(4096).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| BodyError::Read(e.to_string()))?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
