//! SWE-agent `.traj` files: the model-facing `history`. Demonstrations (`is_demo`) are
//! skipped. Function-calling runs carry OpenAI-style `tool_calls` and `role: "tool"`
//! observations with `tool_call_ids`; older runs keep the command in the assistant's text and
//! the observation in a user message, which is what their model saw, so they import as text.

use super::Draft;
use super::openai::convert_message;
use serde_json::Value;

pub(super) fn convert(value: &Value) -> Result<Draft, super::Malformed> {
    let history = value["history"].as_array().ok_or("no history array")?;
    let mut draft = Draft {
        submission: value["info"]["submission"].as_str().map(str::to_string),
        ..Default::default()
    };
    for entry in history {
        if entry["is_demo"] == true {
            draft.skip("demonstration messages (is_demo)");
            continue;
        }
        convert_message(entry, &mut draft);
    }
    Ok(draft)
}
