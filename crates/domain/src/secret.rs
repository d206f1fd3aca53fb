//! Signing secrets of outbound webhooks: `whsec_` followed by the base64 of at
//! least 24 random bytes, the Standard Webhooks convention.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};

/// A webhook's signing secret. `Debug` never shows it; `expose` is the only way to the text.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    text: String,
    key: Vec<u8>,
}

/// The text is not `whsec_` + base64 of 24 to 64 bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a webhook secret is whsec_ followed by the base64 of 24 to 64 bytes")]
pub struct InvalidSecret;

impl WebhookSecret {
    pub const PREFIX: &'static str = "whsec_";
    /// Bytes of randomness in a generated secret.
    pub const GENERATED_BYTES: usize = 32;

    /// A new random secret.
    pub fn generate() -> Self {
        let mut key = vec![0u8; Self::GENERATED_BYTES];
        SystemRandom::new()
            .fill(&mut key)
            .expect("the system random source is available");
        WebhookSecret {
            text: format!("{}{}", Self::PREFIX, STANDARD.encode(&key)),
            key,
        }
    }

    pub fn parse(text: &str) -> Result<Self, InvalidSecret> {
        let encoded = text.strip_prefix(Self::PREFIX).ok_or(InvalidSecret)?;
        let key = STANDARD.decode(encoded).map_err(|_| InvalidSecret)?;
        if !(24..=64).contains(&key.len()) {
            return Err(InvalidSecret);
        }
        Ok(WebhookSecret {
            text: text.to_owned(),
            key,
        })
    }

    /// The secret's text, to store or to show once to an admin.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// The HMAC key bytes.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(whsec_…redacted)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_parse_back_and_differ() {
        let a = WebhookSecret::generate();
        let b = WebhookSecret::generate();
        assert_ne!(a, b);
        assert!(a.expose().starts_with("whsec_"));
        assert_eq!(WebhookSecret::parse(a.expose()).unwrap(), a);
        assert_eq!(a.key().len(), 32);
    }

    #[test]
    fn debug_never_prints_the_secret() {
        let secret = WebhookSecret::generate();
        let shown = format!("{secret:?} {:?}", Some(&secret));
        assert!(!shown.contains(&secret.expose()[6..]));
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn malformed_secrets_are_refused() {
        for bad in ["", "whsec_", "secret_abc", "whsec_!!!!", "whsec_c2hvcnQ="] {
            assert_eq!(WebhookSecret::parse(bad), Err(InvalidSecret), "{bad:?}");
        }
    }
}
