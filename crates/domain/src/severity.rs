//! Incident severity: `SEV1` (most severe) to `SEV5`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An incident severity, `SEV1` (most severe) to `SEV5`.
///
/// Ordered so that `SEV1 < SEV5`: the *most severe* of a set is its minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Severity(u8);

/// The value was not `SEV1`..`SEV5`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("severity must be one of SEV1, SEV2, SEV3, SEV4, SEV5 (got {0:?})")]
pub struct InvalidSeverity(pub String);

impl Severity {
    pub const SEV1: Severity = Severity(1);
    pub const SEV2: Severity = Severity(2);
    pub const SEV3: Severity = Severity(3);
    pub const SEV4: Severity = Severity(4);
    pub const SEV5: Severity = Severity(5);

    /// Severity used when a source says nothing.
    pub const DEFAULT: Severity = Severity::SEV3;

    /// All severities, most severe first.
    pub const ALL: [Severity; 5] = [
        Severity::SEV1,
        Severity::SEV2,
        Severity::SEV3,
        Severity::SEV4,
        Severity::SEV5,
    ];

    /// The level, 1 (most severe) to 5.
    pub fn level(self) -> u8 {
        self.0
    }

    /// The canonical code, `SEV1`..`SEV5`.
    pub fn as_str(self) -> &'static str {
        ["SEV1", "SEV2", "SEV3", "SEV4", "SEV5"][usize::from(self.0 - 1)]
    }

    /// Maps a monitoring tool's severity word to ours (case-insensitive):
    /// critical/fatal/emergency/alert → SEV1, error/high/major → SEV2,
    /// warning/warn/medium → SEV3, low/minor → SEV4, info/informational/notice/debug/none → SEV5,
    /// and a `SEVn` code as is. `None` for anything else.
    pub fn from_source(word: &str) -> Option<Severity> {
        let word = word.trim().to_ascii_lowercase();
        let severity = match word.as_str() {
            "critical" | "crit" | "fatal" | "emergency" | "emerg" | "alert" | "page" => Self::SEV1,
            "error" | "err" | "high" | "major" => Self::SEV2,
            "warning" | "warn" | "medium" | "moderate" => Self::SEV3,
            "low" | "minor" => Self::SEV4,
            "info" | "informational" | "notice" | "debug" | "none" | "ok" => Self::SEV5,
            other => return other.to_ascii_uppercase().parse().ok(),
        };
        Some(severity)
    }
}

impl FromStr for Severity {
    type Err = InvalidSeverity;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.as_bytes() {
            [b'S', b'E', b'V', digit @ b'1'..=b'5'] => Ok(Severity(digit - b'0')),
            _ => Err(InvalidSeverity(s.to_owned())),
        }
    }
}

impl TryFrom<String> for Severity {
    type Error = InvalidSeverity;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<Severity> for String {
    fn from(value: Severity) -> Self {
        value.as_str().to_owned()
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly_the_five_codes() {
        for (i, code) in ["SEV1", "SEV2", "SEV3", "SEV4", "SEV5"].iter().enumerate() {
            let severity: Severity = code.parse().unwrap();
            assert_eq!(severity.as_str(), *code);
            assert_eq!(usize::from(severity.level()), i + 1);
        }
        for bad in [
            "SEV0", "SEV6", "sev1", "SEV", "SEV12", "", " SEV1", "critical",
        ] {
            assert!(bad.parse::<Severity>().is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn most_severe_is_the_minimum() {
        assert!(Severity::SEV1 < Severity::SEV2);
        assert_eq!(
            [Severity::SEV4, Severity::SEV1, Severity::SEV3]
                .iter()
                .min(),
            Some(&Severity::SEV1)
        );
    }

    #[test]
    fn maps_source_words_per_the_documented_table() {
        let table = [
            ("critical", Severity::SEV1),
            ("CRITICAL", Severity::SEV1),
            ("error", Severity::SEV2),
            ("high", Severity::SEV2),
            ("warning", Severity::SEV3),
            ("low", Severity::SEV4),
            ("minor", Severity::SEV4),
            ("info", Severity::SEV5),
            ("sev2", Severity::SEV2),
            ("SEV4", Severity::SEV4),
        ];
        for (word, expected) in table {
            assert_eq!(Severity::from_source(word), Some(expected), "{word}");
        }
        assert_eq!(Severity::from_source("purple"), None);
        assert_eq!(Severity::from_source("SEV9"), None);
    }

    #[test]
    fn serialises_as_its_code() {
        assert_eq!(serde_json::to_string(&Severity::SEV2).unwrap(), "\"SEV2\"");
        assert_eq!(
            serde_json::from_str::<Severity>("\"SEV5\"").unwrap(),
            Severity::SEV5
        );
        assert!(serde_json::from_str::<Severity>("\"SEV7\"").is_err());
    }
}
