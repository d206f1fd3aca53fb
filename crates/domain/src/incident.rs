//! Incidents: their status machine and title.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The status of an incident. New incidents are `triggered`; any unresolved status may move to
/// any other; `resolved` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IncidentStatus {
    Triggered,
    Acknowledged,
    Investigating,
    Mitigated,
    Resolved,
}

/// The value is not one of the five statuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "status must be one of triggered, acknowledged, investigating, mitigated, resolved (got {0:?})"
)]
pub struct InvalidStatus(pub String);

/// A move the status machine refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("a resolved incident is final; a new alert opens a new incident")]
    FromResolved,
    #[error("the incident is already {0}")]
    Unchanged(IncidentStatus),
}

impl IncidentStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [IncidentStatus; 5] = [
        IncidentStatus::Triggered,
        IncidentStatus::Acknowledged,
        IncidentStatus::Investigating,
        IncidentStatus::Mitigated,
        IncidentStatus::Resolved,
    ];

    /// The lowercase word used on the wire and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentStatus::Triggered => "triggered",
            IncidentStatus::Acknowledged => "acknowledged",
            IncidentStatus::Investigating => "investigating",
            IncidentStatus::Mitigated => "mitigated",
            IncidentStatus::Resolved => "resolved",
        }
    }

    /// Whether the incident is still open.
    pub fn is_open(self) -> bool {
        self != IncidentStatus::Resolved
    }

    /// Checks the move `self → next`.
    pub fn transition(self, next: IncidentStatus) -> Result<IncidentStatus, TransitionError> {
        if self == IncidentStatus::Resolved {
            Err(TransitionError::FromResolved)
        } else if self == next {
            Err(TransitionError::Unchanged(self))
        } else {
            Ok(next)
        }
    }
}

impl FromStr for IncidentStatus {
    type Err = InvalidStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IncidentStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| InvalidStatus(s.to_owned()))
    }
}

impl fmt::Display for IncidentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An incident title: trimmed, 1 to 500 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct IncidentTitle(String);

/// The title was empty or too long.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTitle {
    #[error("title must not be empty")]
    Empty,
    #[error("title must be at most {max} characters")]
    TooLong { max: usize },
}

impl IncidentTitle {
    pub const MAX_CHARS: usize = 500;

    /// Trims, replaces control characters with spaces and checks the length.
    pub fn parse(raw: &str) -> Result<Self, InvalidTitle> {
        let cleaned: String = raw
            .trim()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if cleaned.is_empty() {
            return Err(InvalidTitle::Empty);
        }
        if cleaned.chars().count() > Self::MAX_CHARS {
            return Err(InvalidTitle::TooLong {
                max: Self::MAX_CHARS,
            });
        }
        Ok(IncidentTitle(cleaned))
    }

    /// Like [`IncidentTitle::parse`], but cuts an over-long title (with an ellipsis) instead
    /// of refusing it: alert sources do not choose their title lengths.
    pub fn truncating(raw: &str) -> Result<Self, InvalidTitle> {
        let trimmed = raw.trim();
        if trimmed.chars().count() > Self::MAX_CHARS {
            let cut: String = trimmed.chars().take(Self::MAX_CHARS - 1).collect();
            Self::parse(&format!("{cut}…"))
        } else {
            Self::parse(trimmed)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

impl AsRef<str> for IncidentTitle {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_as_lowercase_words() {
        for status in IncidentStatus::ALL {
            assert_eq!(status.as_str().parse::<IncidentStatus>().unwrap(), status);
            assert_eq!(
                serde_json::to_string(&status).unwrap(),
                format!("\"{}\"", status.as_str())
            );
        }
        assert!("Resolved".parse::<IncidentStatus>().is_err());
        assert!("closed".parse::<IncidentStatus>().is_err());
    }

    #[test]
    fn resolved_is_final_and_others_move_freely() {
        use IncidentStatus::*;
        assert_eq!(
            Resolved.transition(Triggered),
            Err(TransitionError::FromResolved)
        );
        assert_eq!(Triggered.transition(Resolved), Ok(Resolved));
        assert_eq!(Mitigated.transition(Triggered), Ok(Triggered));
        assert_eq!(
            Acknowledged.transition(Acknowledged),
            Err(TransitionError::Unchanged(Acknowledged))
        );
    }

    #[test]
    fn titles_are_trimmed_and_bounded() {
        assert_eq!(
            IncidentTitle::parse("  disk full \n").unwrap().as_str(),
            "disk full"
        );
        assert_eq!(IncidentTitle::parse("a\u{7}b").unwrap().as_str(), "a b");
        assert_eq!(IncidentTitle::parse("   "), Err(InvalidTitle::Empty));
        let long = "x".repeat(501);
        assert!(matches!(
            IncidentTitle::parse(&long),
            Err(InvalidTitle::TooLong { .. })
        ));
        let cut = IncidentTitle::truncating(&long).unwrap();
        assert_eq!(cut.as_str().chars().count(), 500);
        assert!(cut.as_str().ends_with('…'));
    }
}
