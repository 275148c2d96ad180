//! Parts the converters' tests build conversations from.

use crate::message::Part;
use serde_json::json;

/// A `bash` call to `ls` with this id.
pub fn call(id: &str) -> Part {
    Part::ToolCall {
        id: id.into(),
        name: "bash".into(),
        args: json!({"command": "ls"}),
    }
}

/// A successful result of call `id`.
pub fn result(id: &str, out: &str) -> Part {
    Part::ToolResult {
        call_id: id.into(),
        name: None,
        output: out.into(),
        is_error: false,
    }
}
