//! Section 2, Key Technical Concepts: the tools the session used and the kinds of files it
//! touched. (A model writes prose here; from the messages alone, these are what is certain.)

use super::{Detail, Sources};
use crate::message::Part;
use std::collections::BTreeSet;
use std::fmt::Write;

const TOOLS: &str = "- Tools used: ";
const TYPES: &str = "- File types touched: ";

pub(super) fn section(sources: &Sources, detail: Detail) -> String {
    let mut tools: BTreeSet<String> = sources.prior[1]
        .as_deref()
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix(TOOLS)))
        .map(|l| l.split(", ").map(str::to_string).collect())
        .unwrap_or_default();
    for part in sources.request.messages.iter().flat_map(|m| &m.parts) {
        if let Part::ToolCall { name, .. } = part {
            tools.insert(name.clone());
        }
    }
    let files = &sources.request.files;
    let extensions: BTreeSet<&str> = files
        .read
        .iter()
        .chain(files.changed())
        .filter_map(|p| p.rsplit('/').next()?.rsplit_once('.').map(|(_, ext)| ext))
        .filter(|ext| !ext.is_empty() && ext.len() <= 10)
        .collect();
    let mut out = String::new();
    if !tools.is_empty() {
        let tools: Vec<String> = tools.into_iter().collect();
        let _ = writeln!(out, "{TOOLS}{}", tools.join(", "));
    }
    if !extensions.is_empty() && detail < Detail::Floor {
        let list: Vec<String> = extensions.iter().map(|e| format!(".{e}")).collect();
        let _ = writeln!(out, "{TYPES}{}", list.join(", "));
    }
    out
}
