//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "{id}.{timestamp}.{body}">`, several space-separated while a rotated secret is in its grace
//! period.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::hmac;

use crate::WebhookSecret;

/// Header names of a signed delivery.
pub mod headers {
    pub const ID: &str = "webhook-id";
    pub const TIMESTAMP: &str = "webhook-timestamp";
    pub const SIGNATURE: &str = "webhook-signature";
}

/// One `v1,<base64>` signature of `"{id}.{timestamp}.{body}"`.
pub fn sign(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.key());
    let mut context = hmac::Context::with_key(&key);
    context.update(id.as_bytes());
    context.update(b".");
    context.update(timestamp.to_string().as_bytes());
    context.update(b".");
    context.update(body);
    format!("v1,{}", STANDARD.encode(context.sign().as_ref()))
}

/// The `webhook-signature` header value: one signature per secret, space-separated, in the
/// order given (the current secret first).
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a WebhookSecret>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .into_iter()
        .map(|secret| sign(secret, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether any `v1` signature in `header` is valid for `secret` (constant-time comparison).
/// Receivers should also check that `timestamp` is recent; this checks the signature only.
pub fn verify(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.key());
    let message = [
        id.as_bytes(),
        b".",
        timestamp.to_string().as_bytes(),
        b".",
        body,
    ]
    .concat();
    header
        .split(' ')
        .filter_map(|part| part.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .any(|tag| hmac::verify(&key, &message, &tag).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn matches_the_standard_webhooks_test_vector() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert_eq!(sign(&secret, ID, TIMESTAMP, BODY), EXPECTED);
        assert!(verify(&secret, ID, TIMESTAMP, BODY, EXPECTED));
    }

    #[test]
    fn verification_fails_for_altered_content() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert!(!verify(
            &secret,
            ID,
            TIMESTAMP,
            br#"{"test": 2432232315}"#,
            EXPECTED
        ));
        assert!(!verify(&secret, "msg_other", TIMESTAMP, BODY, EXPECTED));
        assert!(!verify(&secret, ID, TIMESTAMP + 1, BODY, EXPECTED));
        assert!(!verify(
            &WebhookSecret::generate(),
            ID,
            TIMESTAMP,
            BODY,
            EXPECTED
        ));
        assert!(!verify(&secret, ID, TIMESTAMP, BODY, "v2,garbage v1,@@@"));
    }

    #[test]
    fn rotation_sends_both_signatures_and_each_secret_verifies() {
        let new = WebhookSecret::generate();
        let old = WebhookSecret::parse(SECRET).unwrap();
        let header = signature_header([&new, &old], ID, TIMESTAMP, BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], EXPECTED);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert!(verify(&new, ID, TIMESTAMP, BODY, &header));
        assert!(verify(&old, ID, TIMESTAMP, BODY, &header));
        assert!(!verify(
            &WebhookSecret::generate(),
            ID,
            TIMESTAMP,
            BODY,
            &header
        ));
    }
}
