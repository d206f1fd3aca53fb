//! The outbound webhook record's validated fields.

use serde::{Deserialize, Serialize};
use url::Url;

/// A webhook's name: trimmed, 1 to 100 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct WebhookName(String);

/// The name was empty, too long or held control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most 100 characters")]
    TooLong,
    #[error("must not contain control characters")]
    ControlCharacter,
}

impl WebhookName {
    pub const MAX_CHARS: usize = 100;

    /// The name as given, surrounding spaces trimmed. The bound applies to what was sent, spaces
    /// included, as the API's schema states it (`maxLength: 100`).
    pub fn parse(raw: &str) -> Result<Self, InvalidName> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            Err(InvalidName::Empty)
        } else if raw.chars().count() > Self::MAX_CHARS {
            Err(InvalidName::TooLong)
        } else if trimmed.chars().any(char::is_control) {
            Err(InvalidName::ControlCharacter)
        } else {
            Ok(WebhookName(trimmed.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A name as stored (what [`WebhookName::as_str`] gave when it was parsed). Not checked
    /// again: a later, stricter rule must not make a stored webhook unreadable.
    pub fn from_stored(text: String) -> Self {
        WebhookName(text)
    }
}

/// An absolute `http` or `https` URL with a host and no credentials, at most 2 048 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TargetUrl(Url);

/// Why a target URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidUrl {
    #[error("must be an absolute URL: {0}")]
    Parse(String),
    #[error("scheme must be http or https")]
    Scheme,
    #[error("must have a host")]
    NoHost,
    #[error("must not carry a user name or password")]
    Credentials,
    #[error("must be at most 2048 bytes")]
    TooLong,
}

impl TargetUrl {
    pub const MAX_BYTES: usize = 2048;

    /// The URL as given, surrounding spaces trimmed; the bound applies to what was sent.
    pub fn parse(raw: &str) -> Result<Self, InvalidUrl> {
        if raw.len() > Self::MAX_BYTES {
            return Err(InvalidUrl::TooLong);
        }
        Self::from_stored(raw.trim())
    }

    /// A URL as stored (what [`TargetUrl::as_str`] gave): checked for what a target URL is,
    /// but not against the bound on what a client sends, which its normalised form may exceed
    /// (percent-encoding makes it longer).
    pub fn from_stored(text: &str) -> Result<Self, InvalidUrl> {
        let url = Url::parse(text).map_err(|e| InvalidUrl::Parse(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(InvalidUrl::Scheme);
        }
        if url.host().is_none() {
            return Err(InvalidUrl::NoHost);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(InvalidUrl::Credentials);
        }
        Ok(TargetUrl(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn url(&self) -> &Url {
        &self.0
    }
}

/// A webhook's retry settings: how many steps of the schedule it uses and how long
/// one attempt may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetrySettings {
    max_attempts: u8,
    timeout_ms: u32,
}

/// A retry setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRetry {
    #[error("max_attempts must be between 1 and 5")]
    MaxAttempts,
    #[error("timeout_ms must be between 1000 and 30000")]
    Timeout,
}

impl InvalidRetry {
    /// The request field the error is about.
    pub fn field(&self) -> &'static str {
        match self {
            InvalidRetry::MaxAttempts => "retry.max_attempts",
            InvalidRetry::Timeout => "retry.timeout_ms",
        }
    }
}

impl RetrySettings {
    pub const MAX_ATTEMPTS: u8 = 5;
    pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
    pub const MIN_TIMEOUT_MS: u32 = 1_000;
    pub const MAX_TIMEOUT_MS: u32 = 30_000;

    pub fn new(max_attempts: i64, timeout_ms: i64) -> Result<Self, InvalidRetry> {
        let max_attempts = u8::try_from(max_attempts)
            .ok()
            .filter(|n| (1..=Self::MAX_ATTEMPTS).contains(n))
            .ok_or(InvalidRetry::MaxAttempts)?;
        let timeout_ms = u32::try_from(timeout_ms)
            .ok()
            .filter(|t| (Self::MIN_TIMEOUT_MS..=Self::MAX_TIMEOUT_MS).contains(t))
            .ok_or(InvalidRetry::Timeout)?;
        Ok(RetrySettings {
            max_attempts,
            timeout_ms,
        })
    }

    pub fn max_attempts(self) -> u8 {
        self.max_attempts
    }

    pub fn timeout_ms(self) -> u32 {
        self.timeout_ms
    }

    pub fn timeout(self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(self.timeout_ms))
    }
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_attempts: Self::MAX_ATTEMPTS,
            timeout_ms: Self::DEFAULT_TIMEOUT_MS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_url_reads_back_from_its_stored_form() {
        // Within the bound as sent, longer once percent-encoded.
        let raw = format!("https://example.com/{}", "é".repeat(1000));
        let url = TargetUrl::parse(&raw).unwrap();
        assert!(url.as_str().len() > TargetUrl::MAX_BYTES);
        assert_eq!(TargetUrl::from_stored(url.as_str()).unwrap(), url);
        assert_eq!(
            TargetUrl::from_stored("ftp://example.com/"),
            Err(InvalidUrl::Scheme)
        );
    }

    #[test]
    fn names_are_trimmed_and_bounded() {
        assert_eq!(WebhookName::parse("  ops  ").unwrap().as_str(), "ops");
        assert_eq!(WebhookName::parse(""), Err(InvalidName::Empty));
        assert!(WebhookName::parse(&"n".repeat(100)).is_ok());
        assert_eq!(
            WebhookName::parse(&"n".repeat(101)),
            Err(InvalidName::TooLong)
        );
        // The schema's maxLength counts what was sent: 100 characters and a space are too many.
        assert_eq!(
            WebhookName::parse(&format!(" {}", "é".repeat(100))),
            Err(InvalidName::TooLong)
        );
        assert!(WebhookName::parse(&format!(" {}", "é".repeat(99))).is_ok());
        assert_eq!(
            WebhookName::parse("a\r\nX-Injected: 1"),
            Err(InvalidName::ControlCharacter)
        );
    }

    #[test]
    fn urls_must_be_absolute_http_or_https() {
        assert!(TargetUrl::parse("https://hooks.example.com/tocsin?x=1").is_ok());
        assert!(TargetUrl::parse("http://127.0.0.1:9000/").is_ok());
        assert_eq!(
            TargetUrl::parse("ftp://example.com/"),
            Err(InvalidUrl::Scheme)
        );
        assert!(matches!(
            TargetUrl::parse("/relative"),
            Err(InvalidUrl::Parse(_))
        ));
        assert!(matches!(
            TargetUrl::parse("not a url"),
            Err(InvalidUrl::Parse(_))
        ));
        assert_eq!(
            TargetUrl::parse("https://user:pw@example.com/"),
            Err(InvalidUrl::Credentials)
        );
        let long = format!("https://example.com/{}", "a".repeat(2100));
        assert_eq!(TargetUrl::parse(&long), Err(InvalidUrl::TooLong));
        let at_limit = format!("https://example.com/{}", "a".repeat(2048 - 20));
        assert!(TargetUrl::parse(&at_limit).is_ok());
        assert_eq!(
            TargetUrl::parse(&format!(" {at_limit}")),
            Err(InvalidUrl::TooLong),
            "the bound counts what was sent"
        );
        // Header injection cannot survive URL parsing: control characters are stripped or refused.
        let parsed = TargetUrl::parse("https://example.com/a\r\nX: y");
        assert!(parsed.map(|u| !u.as_str().contains('\n')).unwrap_or(true));
    }

    #[test]
    fn retry_settings_are_bounded() {
        let default = RetrySettings::default();
        assert_eq!((default.max_attempts(), default.timeout_ms()), (5, 10_000));
        assert!(RetrySettings::new(1, 1_000).is_ok());
        assert!(RetrySettings::new(5, 30_000).is_ok());
        assert_eq!(
            RetrySettings::new(0, 10_000),
            Err(InvalidRetry::MaxAttempts)
        );
        assert_eq!(
            RetrySettings::new(6, 10_000),
            Err(InvalidRetry::MaxAttempts)
        );
        assert_eq!(RetrySettings::new(3, 999), Err(InvalidRetry::Timeout));
        assert_eq!(RetrySettings::new(3, 30_001), Err(InvalidRetry::Timeout));
        assert_eq!(
            RetrySettings::new(-1, 10_000),
            Err(InvalidRetry::MaxAttempts)
        );
    }
}
