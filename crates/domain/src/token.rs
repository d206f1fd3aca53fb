//! Access tokens: inbound tokens `tsn_<lookup>_<secret>` and admin keys `tak_<lookup>_<secret>`.
//! Only the lookup part and a SHA-256 hash of the whole token are stored; the token is shown
//! once, at creation.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;

/// A token as presented by a client or just generated. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// The prefix of inbound tokens.
    pub const PREFIX: &'static str = "tsn_";
    /// The prefix of admin keys (the same length as [`Self::PREFIX`]).
    pub const ADMIN_KEY_PREFIX: &'static str = "tak_";
    const LOOKUP_BYTES: usize = 9;
    const SECRET_BYTES: usize = 32;

    /// A new random inbound token.
    pub fn generate() -> Self {
        Self::generate_with(Self::PREFIX)
    }

    /// A new random admin key.
    pub fn generate_admin_key() -> Self {
        Self::generate_with(Self::ADMIN_KEY_PREFIX)
    }

    fn generate_with(prefix: &str) -> Self {
        let rng = SystemRandom::new();
        let mut lookup = [0u8; Self::LOOKUP_BYTES];
        let mut secret = [0u8; Self::SECRET_BYTES];
        rng.fill(&mut lookup).expect("system random source");
        rng.fill(&mut secret).expect("system random source");
        AccessToken(format!(
            "{}{}_{}",
            prefix,
            URL_SAFE_NO_PAD.encode(lookup),
            URL_SAFE_NO_PAD.encode(secret)
        ))
    }

    /// Wraps a presented inbound token; `None` when it cannot be one of ours (then no lookup
    /// is made).
    pub fn from_presented(text: &str) -> Option<Self> {
        Self::from_presented_with(Self::PREFIX, text)
    }

    /// Wraps a presented admin key; `None` when it cannot be one.
    pub fn admin_key_from_presented(text: &str) -> Option<Self> {
        Self::from_presented_with(Self::ADMIN_KEY_PREFIX, text)
    }

    fn from_presented_with(prefix: &str, text: &str) -> Option<Self> {
        // Both parts are base64url, which may itself contain '_': split by position.
        let rest = text.strip_prefix(prefix)?;
        let ok = rest.len() == 12 + 1 + 43
            && rest.as_bytes()[12] == b'_'
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        ok.then(|| AccessToken(text.to_owned()))
    }

    /// The public part used to find the stored row.
    pub fn lookup(&self) -> &str {
        &self.0[Self::PREFIX.len()..Self::PREFIX.len() + 12]
    }

    /// SHA-256 of the whole token, as stored.
    pub fn hash(&self) -> Vec<u8> {
        digest::digest(&digest::SHA256, self.0.as_bytes())
            .as_ref()
            .to_vec()
    }

    /// Constant-time comparison of this token's hash with a stored hash.
    pub fn matches(&self, stored_hash: &[u8]) -> bool {
        self.hash().ct_eq(stored_hash).into()
    }

    /// The token's text, to show once at creation.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AccessToken({}…redacted)",
            &self.0[..Self::PREFIX.len() + 12]
        )
    }
}

/// The secret a signing alert source signs its bodies with (Sentry's client secret), as the
/// operator gave it: 1 to 255 characters, no control characters, surrounding spaces trimmed.
/// `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(String);

/// The text cannot be a signing secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be 1 to 255 characters without control characters")]
pub struct InvalidSigningSecret;

impl SigningSecret {
    pub fn parse(raw: &str) -> Result<Self, InvalidSigningSecret> {
        let text = raw.trim();
        if text.is_empty() || text.chars().count() > 255 || text.chars().any(char::is_control) {
            return Err(InvalidSigningSecret);
        }
        Ok(SigningSecret(text.to_owned()))
    }

    /// The secret itself, to store and to check signatures with.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(…redacted)")
    }
}

/// Constant-time equality of two secrets given as text (for the admin token).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let a = digest::digest(&digest::SHA256, a.as_bytes());
    let b = digest::digest(&digest::SHA256, b.as_bytes());
    a.as_ref().ct_eq(b.as_ref()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_round_trip_and_match_only_their_hash() {
        let token = AccessToken::generate();
        let presented = AccessToken::from_presented(token.expose()).expect("well-formed");
        assert_eq!(presented.lookup(), token.lookup());
        assert!(presented.matches(&token.hash()));
        assert!(!AccessToken::generate().matches(&token.hash()));
        assert!(!format!("{token:?}").contains(&token.expose()[17..]));
    }

    #[test]
    fn admin_keys_and_inbound_tokens_are_never_taken_for_each_other() {
        let key = AccessToken::generate_admin_key();
        assert!(key.expose().starts_with("tak_"));
        let presented = AccessToken::admin_key_from_presented(key.expose()).expect("a key");
        assert!(presented.matches(&key.hash()));
        assert!(AccessToken::from_presented(key.expose()).is_none());
        let token = AccessToken::generate();
        assert!(AccessToken::admin_key_from_presented(token.expose()).is_none());
        assert!(!format!("{key:?}").contains(&key.expose()[17..]));
    }

    #[test]
    fn every_generated_token_is_accepted_back() {
        // base64url has '_' in its alphabet: a token must never be split on it.
        for _ in 0..2000 {
            let token = AccessToken::generate();
            assert!(
                AccessToken::from_presented(token.expose()).is_some(),
                "{}",
                token.expose()
            );
        }
    }

    #[test]
    fn malformed_tokens_are_not_looked_up() {
        for bad in [
            "",
            "tsn_",
            "Bearer x",
            "tsn_abc_def",
            "xyz_aaaaaaaaaaaa_bbbb",
        ] {
            assert!(AccessToken::from_presented(bad).is_none(), "{bad:?}");
        }
        let good = AccessToken::generate();
        let tampered = format!("{}!", &good.expose()[..good.expose().len() - 1]);
        assert!(AccessToken::from_presented(&tampered).is_none());
    }

    #[test]
    fn signing_secrets_are_bounded_and_not_printed() {
        let secret = SigningSecret::parse("  4f1c0ffee  ").unwrap();
        assert_eq!(secret.expose(), "4f1c0ffee");
        assert!(!format!("{secret:?}").contains("0ffee"));
        for bad in ["", "   ", "a\nb", &"s".repeat(256)] {
            assert_eq!(
                SigningSecret::parse(bad),
                Err(InvalidSigningSecret),
                "{bad:?}"
            );
        }
        assert!(SigningSecret::parse(&"s".repeat(255)).is_ok());
    }

    #[test]
    fn constant_time_eq_compares_text() {
        assert!(constant_time_eq("admin-token", "admin-token"));
        assert!(!constant_time_eq("admin-token", "admin-tokem"));
        assert!(!constant_time_eq("admin-token", ""));
    }
}
