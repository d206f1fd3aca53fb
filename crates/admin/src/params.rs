//! Query parameters the admin API and the settings pages read alike: a page of a list (`limit`,
//! `cursor`), an optional parameter named in its error, and RFC 3339 times.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tocsin_storage::{Cursor, Page};

use crate::error::AdminError;

/// The query of a list with no filters: its page.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Items per page, 1 to 200 (default 50).
    #[param(value_type = Option<u8>, minimum = 1, maximum = 200)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageQuery {
    pub fn page(&self) -> Result<Page, AdminError> {
        page(self.limit.as_deref(), self.cursor.as_deref())
    }
}

/// Reads `limit` (1 to 200, default 50) and `cursor` (as handed out in `next_cursor`).
pub fn page(limit: Option<&str>, cursor: Option<&str>) -> Result<Page, AdminError> {
    let limit = match limit {
        None => Page::DEFAULT_LIMIT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=Page::MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                AdminError::bad_parameter(
                    "limit",
                    format!("must be a whole number from 1 to {}", Page::MAX_LIMIT),
                )
            })?,
    };
    let cursor = cursor
        .map(|text| {
            Cursor::decode(text).ok_or_else(|| {
                AdminError::bad_parameter("cursor", "not a cursor this API handed out")
            })
        })
        .transpose()?;
    Ok(Page { limit, cursor })
}

/// Parses an optional query parameter with `parse`, naming the parameter when it fails.
pub fn param<T, E: std::fmt::Display>(
    name: &'static str,
    value: Option<&str>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, AdminError> {
    value
        .map(|text| parse(text).map_err(|e| AdminError::bad_parameter(name, e)))
        .transpose()
}

/// Parses an RFC 3339 time.
pub fn rfc3339(text: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| "must be an RFC 3339 time such as 2026-11-22T01:32:00Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_bounded_and_cursors_checked() {
        assert_eq!(page(None, None).unwrap().limit, Page::DEFAULT_LIMIT);
        assert_eq!(page(Some("200"), None).unwrap().limit, 200);
        for bad in ["0", "201", "-1", "x", ""] {
            let error = page(Some(bad), None).unwrap_err();
            assert!(
                matches!(
                    error,
                    AdminError::BadParameter {
                        parameter: "limit",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        let error = page(None, Some("garbage")).unwrap_err();
        assert!(matches!(
            error,
            AdminError::BadParameter {
                parameter: "cursor",
                ..
            }
        ));
        let cursor = Cursor {
            at: OffsetDateTime::now_utc(),
            id: uuid::Uuid::now_v7(),
        };
        assert_eq!(
            page(None, Some(&cursor.encode())).unwrap().cursor,
            Some(cursor)
        );
    }

    #[test]
    fn times_must_be_rfc3339() {
        assert!(rfc3339("2026-11-22T01:32:00Z").is_ok());
        assert!(rfc3339("2026-11-22T01:32:00.5+02:00").is_ok());
        assert!(rfc3339("yesterday").is_err());
        assert!(rfc3339("2026-11-22").is_err());
    }
}
