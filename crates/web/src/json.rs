//! Strict JSON request bodies: unparseable JSON answers 400, content of the wrong shape answers
//! 422 naming the field path (`retry.max_attempts`), a missing or wrong content type 415.

use actix_web::http::header::CONTENT_TYPE;
use actix_web::HttpRequest;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// Whether the request says its body is JSON (`application/json` or `application/*+json`).
pub fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// Parses a body into `T`, naming the field of any mismatch.
pub fn parse<T: DeserializeOwned>(req: &HttpRequest, body: &[u8]) -> Result<T, ApiError> {
    if !is_json(req) {
        return Err(ApiError::unsupported_media_type());
    }
    parse_bytes(body)
}

/// Parses a JSON object into `T`: 400 for a body that is not JSON, 422 naming the field for a
/// shape error. The whole body is checked first, so that what is not JSON (invalid UTF-8, a
/// lone surrogate escape, a number past `f64`, nesting past serde_json's limit of 128, a
/// syntax error) answers 400 wherever it sits, even after a field that would be refused.
/// Every request body of Tocsin is an object; serde would otherwise read an array into a
/// struct field by field (`[]` as a patch that changes nothing).
pub fn parse_bytes<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let not_json = |error: serde_json::Error| {
        ApiError::bad_request(format!("the body is not valid JSON: {error}"))
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(not_json)?;
    if !value.is_object() {
        return Err(ApiError::invalid("body", "must be a JSON object"));
    }
    drop(value);
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(deserializer);
    parsed.map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let field = if path == "." { "body".to_owned() } else { path };
                ApiError::invalid(field, strip_position(&inner.to_string()))
            }
            _ => not_json(inner),
        }
    })
}

/// serde's messages end with " at line 1 column 42", which says nothing to a client with a path.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::StatusCode;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        retry: Retry,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Retry {
        max_attempts: u8,
    }

    #[test]
    fn names_the_field_path_of_shape_errors() {
        let error =
            parse_bytes::<Body>(br#"{"name":"a","retry":{"max_attempts":"x"}}"#).unwrap_err();
        assert_eq!(error.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            error.body().error.field.as_deref(),
            Some("retry.max_attempts")
        );
        let error =
            parse_bytes::<Body>(br#"{"name":"a","retry":{"max_attempts":1},"x":1}"#).unwrap_err();
        assert_eq!(error.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(error.body().error.message.contains("unknown field"));
        let error = parse_bytes::<Body>(br#"{"retry":{"max_attempts":1}}"#).unwrap_err();
        assert_eq!(error.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(error.body().error.message.contains("missing field `name`"));
        let error = parse_bytes::<Body>(br#"{"retry":{"max_attempts":300}}"#).unwrap_err();
        assert_eq!(error.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn bodies_must_be_objects() {
        for body in [&b"[]"[..], b" [1]", b"\"x\"", b"3", b"null"] {
            let error = parse_bytes::<Body>(body).unwrap_err();
            assert_eq!(error.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body:?}");
            assert_eq!(error.body().error.field.as_deref(), Some("body"));
        }
    }

    #[test]
    fn what_is_not_json_is_a_bad_request_wherever_it_sits() {
        // Found by the admin fuzz test: all but the number past f64 and the byte-order mark
        // answered 422, for a shape error met before the fault.
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let deep_objects = format!("{}{{}}{}", "{\"name\":".repeat(10_000), "}".repeat(10_000));
        let bodies: Vec<Vec<u8>> = vec![
            deep.into_bytes(),
            deep_objects.into_bytes(),
            "[".repeat(100_000).into_bytes(),
            b"{\"colour\":1,\"name\":\"\xff\xfe\"}".to_vec(),
            b"{\"colour\":1,\"name\":\"\\ud800\"}".to_vec(),
            b"{\"name\":\"a\",\"retry\":{\"max_attempts\":1e400}}".to_vec(),
            b"{\"name\":5,".to_vec(),
            b"\xef\xbb\xbf{}".to_vec(),
        ];
        for body in bodies {
            let error = parse_bytes::<Body>(&body).unwrap_err();
            assert_eq!(
                error.status(),
                StatusCode::BAD_REQUEST,
                "{:?}",
                String::from_utf8_lossy(&body[..body.len().min(60)])
            );
        }
    }

    #[test]
    fn syntax_errors_are_bad_requests() {
        for body in [&b"{"[..], b"nope", b"", b"{\"name\": }"] {
            let error = parse_bytes::<Body>(body).unwrap_err();
            assert_eq!(error.status(), StatusCode::BAD_REQUEST, "{body:?}");
        }
    }

    #[test]
    fn content_type_must_be_json() {
        let json = actix_web::test::TestRequest::default()
            .insert_header((CONTENT_TYPE, "application/json; charset=utf-8"))
            .to_http_request();
        assert!(is_json(&json));
        let vendor = actix_web::test::TestRequest::default()
            .insert_header((CONTENT_TYPE, "application/vnd.foo+json"))
            .to_http_request();
        assert!(is_json(&vendor));
        let text = actix_web::test::TestRequest::default()
            .insert_header((CONTENT_TYPE, "text/plain"))
            .to_http_request();
        assert!(!is_json(&text));
        assert!(!is_json(
            &actix_web::test::TestRequest::default().to_http_request()
        ));
    }
}
