//! How a sender presents its inbound token, and what each token allows (docs/ingest.md,
//! "Credentials"). Every token takes `Authorization: Bearer <token>`; senders that cannot send
//! that header may use, when the token opts in, HTTP basic authentication with the token as
//! password (`https://tocsin:<token>@host/...`, whatever the user name) or the `token` query
//! parameter. Opsgenie-style senders' `Authorization: GenieKey <token>` is a header like Bearer.
//! A token with a signing secret, or with `sns_signature`, also needs its source's signature of
//! the body ([`signed`]).
//!
//! Credentials never leave this module: they are not logged, not put in spans or metrics, and
//! every refusal looks the same to the client.

use actix_web::http::header::AUTHORIZATION;
use actix_web::HttpRequest;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Deserialize;
use tocsin_domain::alerts::{sentry_signature_matches, SENTRY_SIGNATURE_HEADER};
use tocsin_domain::AccessToken;
use tocsin_storage::tokens::LiveToken;

use crate::sns::{SignatureError, Sns};

/// How the token came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `Authorization: Bearer` (or `GenieKey` on the Opsgenie-style routes): always accepted.
    Header,
    /// `Authorization: Basic` with the token as password: only for tokens with `basic_auth`.
    Basic,
    /// The `token` query parameter: only for tokens with `query_token`.
    Query,
}

/// The `token` query parameter as a request carries it. `Debug` does not print it.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct QueryToken(String);

impl std::fmt::Debug for QueryToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueryToken(…redacted)")
    }
}

/// The token a request presents and how; `None` when it presents none that could be ours. An
/// `Authorization` header wins over the query parameter; a header of another scheme, or a
/// malformed one, presents nothing.
pub fn presented(
    req: &HttpRequest,
    query: Option<&QueryToken>,
    genie_key: bool,
) -> Option<(AccessToken, Via)> {
    let Some(header) = req.headers().get(AUTHORIZATION) else {
        let token = AccessToken::from_presented(query?.0.trim())?;
        return Some((token, Via::Query));
    };
    let (scheme, value) = header.to_str().ok()?.split_once(' ')?;
    let value = value.trim();
    if scheme.eq_ignore_ascii_case("bearer")
        || (genie_key && scheme.eq_ignore_ascii_case("geniekey"))
    {
        Some((AccessToken::from_presented(value)?, Via::Header))
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = STANDARD.decode(value).ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (_user, password) = decoded.split_once(':')?;
        Some((AccessToken::from_presented(password)?, Via::Basic))
    } else {
        None
    }
}

/// Whether `token` takes credentials that came `via`.
pub fn accepts(token: &LiveToken, via: Via) -> bool {
    match via {
        Via::Header => true,
        Via::Basic => token.basic_auth,
        Via::Query => token.query_token,
    }
}

/// Whether the body carries the signature the token asks for, if it asks for one: for a Sentry
/// token with a signing secret, `Sentry-Hook-Signature` must be the HMAC of the body with it;
/// for a token with `sns_signature`, the body must be an SNS message SNS signed.
pub async fn signed(
    token: &LiveToken,
    req: &HttpRequest,
    body: &[u8],
    sns: &Sns,
) -> Result<(), SignatureError> {
    if let Some(secret) = &token.signing_secret {
        let matches = req
            .headers()
            .get(SENTRY_SIGNATURE_HEADER)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|signature| sentry_signature_matches(secret.expose(), body, signature));
        if !matches {
            return Err(SignatureError::Refused(
                "Sentry-Hook-Signature is missing or does not match".into(),
            ));
        }
    }
    if token.sns_signature {
        sns.verify(body).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;
    use tocsin_domain::SigningSecret;
    use uuid::Uuid;

    use super::*;

    fn live(basic_auth: bool, query_token: bool) -> LiveToken {
        LiveToken {
            id: Uuid::now_v7(),
            source: None,
            basic_auth,
            query_token,
            signing_secret: None,
            sns_signature: false,
        }
    }

    #[test]
    fn every_way_of_presenting_a_token() {
        let token = AccessToken::generate();
        let text = token.expose();
        let query = QueryToken(text.to_owned());
        let with = |value: String| {
            TestRequest::default()
                .insert_header((AUTHORIZATION, value))
                .to_http_request()
        };
        let basic = |user_password: String| format!("Basic {}", STANDARD.encode(user_password));

        let cases = [
            (
                with(format!("Bearer {text}")),
                None,
                false,
                Some(Via::Header),
            ),
            (
                with(format!("bearer  {text} ")),
                None,
                false,
                Some(Via::Header),
            ),
            (
                with(basic(format!("tocsin:{text}"))),
                None,
                false,
                Some(Via::Basic),
            ),
            (
                with(basic(format!(":{text}"))),
                None,
                false,
                Some(Via::Basic),
            ),
            (
                with(format!("GenieKey {text}")),
                None,
                true,
                Some(Via::Header),
            ),
            (with(format!("GenieKey {text}")), None, false, None),
            (with(format!("Token {text}")), Some(&query), false, None),
            (with(basic(text.to_owned())), None, false, None),
            (with(basic(format!("{text}:x"))), None, false, None),
            (with("Basic %%%".into()), None, false, None),
            (with("Bearer".into()), None, false, None),
            (
                TestRequest::default().to_http_request(),
                Some(&query),
                false,
                Some(Via::Query),
            ),
            (TestRequest::default().to_http_request(), None, false, None),
            (
                with(format!("Bearer {text}")),
                Some(&query),
                false,
                Some(Via::Header),
            ),
        ];
        for (i, (req, query, genie, expected)) in cases.into_iter().enumerate() {
            let got = presented(&req, query, genie);
            assert_eq!(got.as_ref().map(|(_, via)| *via), expected, "case {i}");
            if let Some((presented, _)) = got {
                assert_eq!(presented, token, "case {i}");
            }
        }
        let bad_query = QueryToken("tsn_short".into());
        assert!(presented(
            &TestRequest::default().to_http_request(),
            Some(&bad_query),
            false
        )
        .is_none());
        assert!(!format!("{query:?}").contains(&text[17..]));
    }

    #[test]
    fn other_credentials_are_opt_ins_of_the_token() {
        let plain = live(false, false);
        assert!(accepts(&plain, Via::Header));
        assert!(!accepts(&plain, Via::Basic));
        assert!(!accepts(&plain, Via::Query));
        assert!(accepts(&live(true, false), Via::Basic));
        assert!(!accepts(&live(true, false), Via::Query));
        assert!(accepts(&live(false, true), Via::Query));
    }

    #[tokio::test]
    async fn a_signing_secret_requires_the_signature() {
        let sns = Sns::new(
            crate::sns::SnsHosts::parse("").unwrap(),
            tocsin_web::ssrf::TargetPolicy::default(),
        )
        .unwrap();
        let signed = async |token: &LiveToken, req: &HttpRequest, body: &[u8]| {
            signed(token, req, body, &sns).await.is_ok()
        };
        let body = br#"{"action":"triggered"}"#;
        let mut token = live(false, false);
        let unsigned = TestRequest::default().to_http_request();
        assert!(signed(&token, &unsigned, body).await);
        token.signing_secret = Some(SigningSecret::parse("secret").unwrap());
        assert!(!signed(&token, &unsigned, body).await);
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"secret");
        let signature: String = ring::hmac::sign(&key, body)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let good = TestRequest::default()
            .insert_header((SENTRY_SIGNATURE_HEADER, signature.clone()))
            .to_http_request();
        assert!(signed(&token, &good, body).await);
        assert!(!signed(&token, &good, b"{}").await);
    }
}
