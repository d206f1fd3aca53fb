//! Placeholder; see mod.rs.

use super::{AlertError, AlertSignal};

pub(super) fn parse(_value: serde_json::Value) -> Result<Vec<AlertSignal>, AlertError> {
    Err(AlertError::invalid("body", "not yet supported"))
}
