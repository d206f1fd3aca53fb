//! Connection strings made safe to print: passwords hidden, for logs, error messages and
//! `Debug` output. Pure text handling, shared by the storage and broker crates and the
//! services' settings.

/// A connection string with its passwords replaced by `***`, for logs and error messages.
///
/// Handles one URL, a comma-separated list of URLs (`AMQP_URL`), the libpq multi-host form
/// (`postgres://user:pw@h1:5432,h2:5433/db?...`, which URL parsers refuse) and `password=`
/// parameters (in a query string or libpq's `key=value` form).
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(redact_segment)
        .collect::<Vec<_>>()
        .join(",")
}

/// Redacts the user-info password of a segment that starts a URL, and any `password=` value.
fn redact_segment(segment: &str) -> String {
    let mut out = match segment.find("://") {
        Some(scheme_end) => {
            let authority_start = scheme_end + 3;
            let rest = &segment[authority_start..];
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..authority_end];
            match authority.rfind('@') {
                Some(at) => {
                    let userinfo = &authority[..at];
                    let user = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => userinfo.to_owned(),
                    };
                    format!(
                        "{}{user}{}",
                        &segment[..authority_start],
                        &segment[authority_start + at..]
                    )
                }
                None => segment.to_owned(),
            }
        }
        None => segment.to_owned(),
    };
    let mut searched = 0;
    while let Some(found) = out[searched..].to_ascii_lowercase().find("password=") {
        let value_start = searched + found + "password=".len();
        let value_end = out[value_start..]
            .find(['&', ' ', '#'])
            .map_or(out.len(), |end| value_start + end);
        out.replace_range(value_start..value_end, "***");
        searched = value_start + 3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/tocsin"),
            "postgres://postgres@127.0.0.1:5432/tocsin"
        );
        assert_eq!(
            redact_url(
                "postgres://app:s3cret@h1:5432,h2:5433/tocsin?target_session_attrs=read-write"
            ),
            "postgres://app:***@h1:5432,h2:5433/tocsin?target_session_attrs=read-write"
        );
        assert_eq!(
            redact_url("amqp://u:p1@h1:5672/%2f,amqp://u:p2@h2:5673,amqps://v@h3/%2f"),
            "amqp://u:***@h1:5672/%2f,amqp://u:***@h2:5673,amqps://v@h3/%2f"
        );
        assert_eq!(
            redact_url("postgres://h1/db?user=app&password=s3cret&sslmode=disable"),
            "postgres://h1/db?user=app&password=***&sslmode=disable"
        );
        assert_eq!(
            redact_url("host=h1,h2 user=app Password=s3cret dbname=tocsin"),
            "host=h1,h2 user=app Password=*** dbname=tocsin"
        );
        assert!(!redact_url("postgres://a:b@c@h1/db").contains(":b"));
    }
}
