//! The retry schedule of outbound deliveries: five attempts, the first immediate,
//! then after 1 minute, 5 minutes, 30 minutes and 2 hours. `TOCSIN_RETRY_DELAYS` may shorten it
//! for tests and demos.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Delays before each attempt; `delays[0]` is before the first attempt and is always zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    delays: Vec<Duration>,
}

/// Why a schedule text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSchedule {
    #[error("the schedule must list 1 to 5 delays, comma-separated (e.g. 0s,1m,5m,30m,2h)")]
    Count,
    #[error("the first delay must be 0s: the first attempt is immediate")]
    FirstNotImmediate,
    #[error(
        "{0:?} is not a delay: use a whole number with ms, s, m, h or d (e.g. 500ms, 30s, 5m, 2h)"
    )]
    Delay(String),
    #[error("each delay must be at most 24h")]
    TooLong,
}

impl RetrySchedule {
    /// The specification's schedule, as text.
    pub const DEFAULT_TEXT: &'static str = "0s,1m,5m,30m,2h";

    /// Exactly the specification's: 0s, 1m, 5m, 30m, 2h.
    pub fn specification() -> Self {
        RetrySchedule {
            delays: vec![
                Duration::ZERO,
                Duration::from_secs(60),
                Duration::from_secs(5 * 60),
                Duration::from_secs(30 * 60),
                Duration::from_secs(2 * 60 * 60),
            ],
        }
    }

    /// How many attempts the schedule allows.
    pub fn attempts(&self) -> u8 {
        self.delays.len() as u8
    }

    /// The delay before attempt `number` (1-based), `None` past the end.
    pub fn delay_before(&self, number: u8) -> Option<Duration> {
        self.delays
            .get(usize::from(number).checked_sub(1)?)
            .copied()
    }

    /// All delays, the first being zero.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// Whether this is exactly the specification's schedule.
    pub fn is_specification(&self) -> bool {
        *self == Self::specification()
    }
}

impl Default for RetrySchedule {
    fn default() -> Self {
        Self::specification()
    }
}

impl FromStr for RetrySchedule {
    type Err = InvalidSchedule;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let delays = s
            .split(',')
            .map(|part| parse_duration(part.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if delays.is_empty() || delays.len() > 5 {
            return Err(InvalidSchedule::Count);
        }
        if delays[0] != Duration::ZERO {
            return Err(InvalidSchedule::FirstNotImmediate);
        }
        if delays.iter().any(|d| *d > Duration::from_secs(24 * 3600)) {
            return Err(InvalidSchedule::TooLong);
        }
        Ok(RetrySchedule { delays })
    }
}

impl fmt::Display for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.delays.iter().map(|d| format_duration(*d)).collect();
        f.write_str(&parts.join(","))
    }
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `30d`.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidSchedule> {
    let invalid = || InvalidSchedule::Delay(text.to_owned());
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits.parse().map_err(|_| invalid())?;
    let millis = match unit {
        "ms" => Some(value),
        "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        "d" => value.checked_mul(86_400_000),
        _ => None,
    }
    .ok_or_else(invalid)?;
    Ok(Duration::from_millis(millis))
}

/// The shortest exact text for a duration: `2h`, `30m`, `1s`, `1500ms`. Used in queue names.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_exactly_the_specification() {
        let default = RetrySchedule::default();
        assert_eq!(
            default.delays(),
            &[
                Duration::from_secs(0),
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(1800),
                Duration::from_secs(7200),
            ]
        );
        assert_eq!(default.attempts(), 5);
        assert_eq!(
            RetrySchedule::DEFAULT_TEXT
                .parse::<RetrySchedule>()
                .unwrap(),
            default
        );
        assert_eq!(default.to_string(), "0s,1m,5m,30m,2h");
        assert!(default.is_specification());
    }

    #[test]
    fn parses_shortened_schedules() {
        let s: RetrySchedule = "0s, 100ms, 200ms,1s,2s".parse().unwrap();
        assert_eq!(s.delay_before(1), Some(Duration::ZERO));
        assert_eq!(s.delay_before(2), Some(Duration::from_millis(100)));
        assert_eq!(s.delay_before(5), Some(Duration::from_secs(2)));
        assert_eq!(s.delay_before(6), None);
        assert_eq!(s.delay_before(0), None);
        assert!(!s.is_specification());
        assert_eq!(s.to_string(), "0s,100ms,200ms,1s,2s");
    }

    #[test]
    fn refuses_bad_schedules() {
        assert_eq!(
            "1s,1m".parse::<RetrySchedule>(),
            Err(InvalidSchedule::FirstNotImmediate)
        );
        assert_eq!(
            "0s,1s,1s,1s,1s,1s".parse::<RetrySchedule>(),
            Err(InvalidSchedule::Count)
        );
        assert!(matches!(
            "0s,1w".parse::<RetrySchedule>(),
            Err(InvalidSchedule::Delay(_))
        ));
        assert_eq!(
            "0s,2d".parse::<RetrySchedule>(),
            Err(InvalidSchedule::TooLong)
        );
        assert!(matches!(
            "0s,m".parse::<RetrySchedule>(),
            Err(InvalidSchedule::Delay(_))
        ));
        assert!(matches!(
            "".parse::<RetrySchedule>(),
            Err(InvalidSchedule::Delay(_))
        ));
        assert_eq!(
            "0s,25h".parse::<RetrySchedule>(),
            Err(InvalidSchedule::TooLong)
        );
        assert!(matches!(
            "0s,99999999999999999999h".parse::<RetrySchedule>(),
            Err(InvalidSchedule::Delay(_))
        ));
    }
}
