//! Text that came from outside, made storable. PostgreSQL's `text` and `jsonb` hold UTF-8
//! without NUL; a receiver may answer any bytes. One rule for everything Tocsin records of what
//! a receiver sent (response bodies, error texts): **each byte sequence that is not UTF-8, and
//! each NUL, becomes U+FFFD (`�`)**; everything else is kept as it came. The replacement is
//! visible in the delivery log and never reaches PostgreSQL as an error.

use std::borrow::Cow;

/// The replacement of what PostgreSQL cannot store.
pub const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// `bytes` as storable text: invalid UTF-8 and NUL replaced by U+FFFD.
pub fn storable(bytes: &[u8]) -> String {
    match String::from_utf8_lossy(bytes) {
        Cow::Borrowed(text) => storable_str(text).into_owned(),
        Cow::Owned(text) => storable_str(&text).into_owned(),
    }
}

/// `text` as storable text: each NUL replaced by U+FFFD.
pub fn storable_str(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_and_invalid_utf8_become_the_replacement_and_the_rest_is_kept() {
        assert_eq!(storable(b"ok"), "ok");
        assert_eq!(storable(b"a\0b"), "a\u{FFFD}b");
        assert_eq!(storable(b"a\xffb\xc3"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(storable("é\0".as_bytes()), "é\u{FFFD}");
        assert!(matches!(storable_str("clean"), Cow::Borrowed("clean")));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_become_text_without_nul(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let text = storable(&bytes);
            proptest::prop_assert!(!text.contains('\0'));
            // Bytes that were valid UTF-8 without NUL are kept as they came.
            if let Ok(original) = std::str::from_utf8(&bytes) {
                if !original.contains('\0') {
                    proptest::prop_assert_eq!(text, original);
                }
            }
        }
    }
}
