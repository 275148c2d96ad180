//! Context windows of the models people use, so a conversation the proxy records gets its
//! model's limit rather than one number for all.
//!
//! The table is a vendored snapshot of LiteLLM's model table (MIT; `model_windows.LICENSE`
//! beside it; `scripts/refresh-model-windows.py` refreshes it). A name is looked up as the client
//! sends it, then without a provider prefix (`anthropic/`, `openrouter/openai/`) and without a
//! date or `-latest` suffix (`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`).

use std::collections::HashMap;
use std::sync::LazyLock;

static WINDOWS: LazyLock<HashMap<String, usize>> =
    LazyLock::new(|| serde_json::from_str(include_str!("model_windows.json")).unwrap_or_default());

/// The context window of `model`, if the table knows it.
pub fn context_window(model: &str) -> Option<usize> {
    candidates(model).find_map(|name| WINDOWS.get(&name).copied())
}

/// The names to look `model` up by, most specific first.
fn candidates(model: &str) -> impl Iterator<Item = String> {
    let model = model.trim().to_ascii_lowercase();
    let mut names = vec![model.clone()];
    let mut bare = model.as_str();
    while let Some((_, rest)) = bare.split_once('/') {
        bare = rest;
        names.push(bare.to_string());
    }
    let undated = without_date(bare);
    if undated != bare {
        names.push(undated.to_string());
    }
    names.into_iter()
}

/// `name` without a trailing date (`-20250929`, `-2024-08-06`, `@20250929`) or `-latest`.
fn without_date(name: &str) -> &str {
    if let Some(stripped) = name.strip_suffix("-latest") {
        return stripped;
    }
    let bytes = name.as_bytes();
    let digits = bytes
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit() || **b == b'-')
        .count();
    let tail = &name[name.len() - digits..];
    let date_digits = tail.bytes().filter(u8::is_ascii_digit).count();
    if date_digits == 8 && (tail.starts_with('-') || name[..name.len() - digits].ends_with('@')) {
        return name[..name.len() - digits].trim_end_matches('@');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_found_with_prefixes_and_dates_tolerated() {
        assert_eq!(context_window("gpt-4o"), Some(128_000));
        assert_eq!(context_window("openai/gpt-4o"), Some(128_000));
        assert_eq!(context_window("gpt-4o-2024-08-06"), Some(128_000));
        assert_eq!(context_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(
            context_window("anthropic/claude-sonnet-4-5-20250929"),
            Some(200_000)
        );
        assert_eq!(context_window("Claude-Sonnet-4-5"), Some(200_000));
        assert_eq!(context_window("no-such-model-at-all"), None);
        assert_eq!(without_date("claude-3-5-haiku-latest"), "claude-3-5-haiku");
        assert_eq!(without_date("model@20250929"), "model");
        assert_eq!(without_date("gpt-4"), "gpt-4");
    }
}
