//! Bearer tokens from the `Authorization` header.

use actix_web::http::header::AUTHORIZATION;
use actix_web::HttpRequest;

/// The token of an `Authorization: Bearer <token>` header, if well-formed.
pub fn bearer_token(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn reads_only_bearer_tokens() {
        let req = TestRequest::default()
            .insert_header((AUTHORIZATION, "Bearer abc"))
            .to_http_request();
        assert_eq!(bearer_token(&req), Some("abc"));
        let req = TestRequest::default()
            .insert_header((AUTHORIZATION, "bearer  abc "))
            .to_http_request();
        assert_eq!(bearer_token(&req), Some("abc"));
        for value in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            let req = TestRequest::default()
                .insert_header((AUTHORIZATION, value))
                .to_http_request();
            assert_eq!(bearer_token(&req), None, "{value:?}");
        }
        assert_eq!(
            bearer_token(&TestRequest::default().to_http_request()),
            None
        );
    }
}
