//! What the parsers' tests share: captured bodies read as JSON, the one signal or the error a
//! parser gives for a body, and bodies changed at one place.

use serde_json::Value;

use super::{AlertError, AlertSignal, Reading};

pub(super) fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// The one signal `parse` gives for `value` (a parser returns signals or a [`Reading`]).
pub(super) fn one<R: Into<Reading>>(
    parse: impl Fn(Value) -> Result<R, AlertError>,
    value: Value,
) -> AlertSignal {
    let mut reading: Reading = parse(value).unwrap().into();
    assert_eq!(reading.signals.len(), 1, "{reading:?}");
    assert_eq!(reading.notice, None);
    reading.signals.remove(0)
}

/// The field and message of the error `parse` gives for `value`.
pub(super) fn error<R: Into<Reading> + std::fmt::Debug>(
    parse: impl Fn(Value) -> Result<R, AlertError>,
    value: Value,
) -> (String, String) {
    match parse(value) {
        Err(AlertError::Invalid { field, message }) => (field, message),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// `value` with the place `pointer` (a JSON pointer) names set to `new`.
pub(super) fn with_pointer(mut value: Value, pointer: &str, new: Value) -> Value {
    *value.pointer_mut(pointer).unwrap() = new;
    value
}

/// `value` without `field` of the object `parent` (a JSON pointer; `""` is the body) names.
pub(super) fn without(mut value: Value, parent: &str, field: &str) -> Value {
    value
        .pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(field);
    value
}
