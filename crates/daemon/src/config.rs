//! The daemon's configuration: `config.toml`, every key optional, defaults = the spec's constants.
//!
//! ```toml
//! [compaction]   # the engine (CompactionConfig), also overridable per session
//! [summarizer]   # which summarizer writes summaries
//! [server]       # socket and request limits
//! [store]        # database path and durability
//! ```
//! Unknown keys and bad values are errors that name the key. Hot reload lives in
//! [`crate::config_watch`]; per-session overrides are merged by [`compaction_with_overrides`].

use crate::compaction::CompactionConfig;
use crate::compaction::config::InvalidSetting;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub compaction: CompactionConfig,
    pub summarizer: SummarizerConfig,
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub proxy: ProxyConfig,
}

/// The OpenAI-compatible proxy (`POST /v1/chat/completions` on the socket): where it sends
/// the compacted conversations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Also serve the proxy on this loopback TCP address (`127.0.0.1:PORT`), for agents that
    /// take only an `http://` base URL. Off by default; any other address is refused.
    pub listen: Option<String>,
    /// The Chat Completions API root the proxy forwards to (`/chat/completions` is appended).
    pub openai_upstream: String,
    /// The Anthropic API root the proxy forwards to (`/v1/messages` is appended).
    pub anthropic_upstream: String,
    /// Total time one proxied call (its streamed answer included) may take, seconds.
    pub timeout_s: u64,
    /// What is recorded of one upstream answer at most, in bytes: a longer one keeps its
    /// head and tail with a marker (the client still gets all of it).
    pub max_recorded_bytes: usize,
    /// The largest request body the proxy takes, in bytes: a whole conversation comes with
    /// every call, answers it recorded shortened included, so it is larger than the API's
    /// `[server] max_body_bytes`.
    pub max_body_bytes: usize,
    /// Context windows by model name, over the built-in table (`[proxy.models]`); a call's
    /// `x-compactd-context-limit` header goes over both.
    pub models: std::collections::BTreeMap<String, usize>,
}

impl ProxyConfig {
    /// The context window of `model` and where it comes from: `[proxy.models]`, else the
    /// built-in table, else `None` (the caller uses `default_context_limit`).
    pub fn model_window(&self, model: &str) -> Option<(usize, String)> {
        if let Some(&tokens) = self.models.get(model) {
            return Some((tokens, format!("[proxy.models] \"{model}\"")));
        }
        crate::provider::models::context_window(model)
            .map(|tokens| (tokens, format!("model table: {model}")))
    }

    /// The loopback address to listen on, if any. Every local user can connect to it (the
    /// API key a call carries is what protects its sessions), so it is never more than local.
    pub fn listen_address(&self) -> Result<Option<std::net::SocketAddr>, InvalidSetting> {
        let Some(listen) = &self.listen else {
            return Ok(None);
        };
        let invalid = |reason: String| InvalidSetting::new("[proxy] listen", reason);
        let address: std::net::SocketAddr = listen.parse().map_err(|_| {
            invalid(format!(
                "must be an address like 127.0.0.1:8484, not `{listen}`"
            ))
        })?;
        if !address.ip().is_loopback() {
            return Err(invalid(format!(
                "must be a loopback address (the proxy listens on 127.0.0.1 or ::1 only), not `{listen}`"
            )));
        }
        Ok(Some(address))
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: None,
            openai_upstream: "https://api.openai.com/v1".into(),
            anthropic_upstream: "https://api.anthropic.com".into(),
            timeout_s: 600,
            max_recorded_bytes: 4 * 1024 * 1024,
            max_body_bytes: 32 * 1024 * 1024,
            models: Default::default(),
        }
    }
}

pub(crate) use compactd_summarize::config::{SummarizerConfig, SummarizerKind};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The socket path (default: `$XDG_RUNTIME_DIR/compactd/compactd.sock`).
    pub socket: Option<PathBuf>,
    /// Requests with larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// Seconds a request head, and then its body, may take to arrive; also how long an idle
    /// keep-alive connection stays open.
    pub request_timeout_s: u64,
    /// Connections served at once (further ones get 503); at most what the open-file limit
    /// allows.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: None,
            max_body_bytes: 8 * 1024 * 1024,
            request_timeout_s: 30,
            max_connections: 4_096,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The database path (default: `$XDG_DATA_HOME/compactd/compactd.db`).
    pub path: Option<PathBuf>,
    pub synchronous: Synchronous,
}

pub use crate::store::Synchronous;

/// Why a config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Keys read once, when the daemon starts (its listeners and its store are made then): an
/// edit of one is accepted, said in the log, and applies at the next start. Every other key
/// applies to every decision from the reload on. The README lists these; a test keeps it so.
pub(crate) const READ_AT_START: &[&str] = &[
    "[server] socket",
    "[server] max_connections",
    "[proxy] listen",
    "[store] path",
    "[store] synchronous",
];

/// A config file larger than this is refused (the full example in the README is ~6 KB).
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The text of the config file at `path`, checked to be a regular file (a symlink to one is
/// followed) of at most [`MAX_CONFIG_BYTES`] before it is opened.
pub(crate) fn read_config_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if !std::fs::metadata(path)?.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(invalid(format!(
            "larger than {} KiB; a config file is a few KB",
            MAX_CONFIG_BYTES / 1024
        )));
    }
    Ok(text)
}

impl Config {
    /// Loads `path`; a missing file is the defaults. Only a regular file of at most
    /// [`MAX_CONFIG_BYTES`] is read: a path that names a FIFO would block the daemon's start
    /// and every reload, and one that names a device or a runaway file would fill its memory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match read_config_file(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                error: source,
            }),
        }
    }

    /// Parses and validates TOML; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: parse_error_message(&e, text),
        })?;
        config.validate().map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(config)
    }

    /// The keys of [`READ_AT_START`] whose value differs in `new`.
    pub fn changed_keys_read_at_start(&self, new: &Config) -> Vec<&'static str> {
        let (old, new) = (
            serde_json::to_value(self).unwrap_or_default(),
            serde_json::to_value(new).unwrap_or_default(),
        );
        READ_AT_START
            .iter()
            .filter(|key| {
                let (section, name) = key
                    .trim_start_matches('[')
                    .split_once("] ")
                    .unwrap_or_default();
                old[section][name] != new[section][name]
            })
            .copied()
            .collect()
    }

    /// Checks values that parse but cannot work, naming the key.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.validate_proxy()?;
        self.compaction
            .validate()
            .map_err(|e| e.in_section("[compaction]"))?;
        self.validate_summarizer()?;
        at_least("[server] max_body_bytes", self.server.max_body_bytes, 1024)?;
        at_least(
            "[server] request_timeout_s",
            self.server.request_timeout_s,
            1,
        )?;
        at_least("[server] max_connections", self.server.max_connections, 1)?;
        Ok(())
    }

    fn validate_proxy(&self) -> Result<(), InvalidSetting> {
        for (key, upstream) in [
            ("openai_upstream", &self.proxy.openai_upstream),
            ("anthropic_upstream", &self.proxy.anthropic_upstream),
        ] {
            if !(upstream.starts_with("http://") || upstream.starts_with("https://")) {
                return Err(InvalidSetting::new(
                    format!("[proxy] {key}"),
                    format!("must be an http:// or https:// URL, not `{upstream}`"),
                ));
            }
        }
        self.proxy.listen_address()?;
        at_least("[proxy] timeout_s", self.proxy.timeout_s, 1)?;
        at_least("[proxy] max_body_bytes", self.proxy.max_body_bytes, 1024)
    }

    fn validate_summarizer(&self) -> Result<(), InvalidSetting> {
        let s = &self.summarizer;
        let needs = |what: bool, key: &str| {
            if what {
                Ok(())
            } else {
                Err(InvalidSetting::new(
                    format!("[summarizer] {key}"),
                    format!("is required for kind = \"{}\"", kind_name(s.kind)),
                ))
            }
        };
        match s.kind {
            SummarizerKind::Extractive => {}
            SummarizerKind::Openai | SummarizerKind::Anthropic => {
                needs(s.model.is_some(), "model")?;
            }
            SummarizerKind::Command => needs(s.command.is_some(), "command")?,
        }
        at_least("[summarizer] timeout_s", s.timeout_s, 1)?;
        at_least("[summarizer] max_output_tokens", s.max_output_tokens, 1)?;
        at_least("[summarizer] max_concurrent", s.max_concurrent, 1)?;
        if s.max_concurrent > MAX_CONCURRENT_SUMMARIES {
            return Err(InvalidSetting::new(
                "[summarizer] max_concurrent",
                format!("must be at most {MAX_CONCURRENT_SUMMARIES}"),
            ));
        }
        if let Some(window) = s.context_window.filter(|&w| w <= s.max_output_tokens) {
            return Err(InvalidSetting::new(
                "[summarizer] context_window",
                format!(
                    "({window}) must exceed max_output_tokens ({})",
                    s.max_output_tokens
                ),
            ));
        }
        Ok(())
    }
}

/// Most compactions that may call the summarizer at once.
const MAX_CONCURRENT_SUMMARIES: usize = 256;

/// `key` must be at least `least`.
fn at_least(key: &str, value: impl TryInto<u64>, least: u64) -> Result<(), InvalidSetting> {
    if value.try_into().is_ok_and(|v| v < least) {
        return Err(InvalidSetting::new(
            key,
            format!("must be at least {least}"),
        ));
    }
    Ok(())
}

/// A TOML error as `line N: what`, without the quoted source line toml adds: the error goes
/// to the log, `/health` and events, and the line may hold a key (`api_key = "sk-..."` is a
/// typo of `api_key_env`). What serde quotes of a value is redacted too.
fn parse_error_message(error: &toml::de::Error, text: &str) -> String {
    let message = crate::compaction::redact::redact_secrets(error.message().trim()).into_owned();
    match error.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            // The key of that line, never its value.
            let key = text[..start]
                .rsplit('\n')
                .next()
                .and_then(|l| l.split('=').next())
                .map(str::trim)
                .filter(|k| !k.is_empty() && !k.starts_with('['));
            match key {
                Some(key) => format!("line {line} (`{key}`): {}", message.replace('\n', " ")),
                None => format!("line {line}: {}", message.replace('\n', " ")),
            }
        }
        None => message.replace('\n', " "),
    }
}

fn kind_name(kind: SummarizerKind) -> &'static str {
    match kind {
        SummarizerKind::Extractive => "extractive",
        SummarizerKind::Openai => "openai",
        SummarizerKind::Anthropic => "anthropic",
        SummarizerKind::Command => "command",
    }
}

/// Why a session's config overrides cannot apply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverrideError {
    #[error("config overrides must be a JSON object")]
    NotAnObject,
    /// An unknown key or a value of the wrong type, as serde names it.
    #[error("config: {0}")]
    Unreadable(String),
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// The compaction config of a session: the global one with the session's overrides (a JSON
/// object of `[compaction]` keys) on top. Unknown keys and bad values are errors naming the key.
pub(crate) fn compaction_with_overrides(
    global: &CompactionConfig,
    overrides: &Value,
) -> Result<CompactionConfig, OverrideError> {
    let Value::Object(overrides) = overrides else {
        return Err(OverrideError::NotAnObject);
    };
    if overrides.is_empty() {
        // Most sessions: no overrides.
        return Ok(global.clone());
    }
    let mut merged =
        serde_json::to_value(global).map_err(|e| OverrideError::Unreadable(e.to_string()))?;
    if let Value::Object(map) = &mut merged {
        for (key, value) in overrides {
            map.insert(key.clone(), value.clone());
        }
    }
    let config: CompactionConfig =
        serde_json::from_value(merged).map_err(|e| OverrideError::Unreadable(e.to_string()))?;
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's config table names every key of every section (and nothing else), and
    /// its list of keys read once at start is [`READ_AT_START`], in order.
    #[test]
    fn the_readme_says_what_the_config_is_and_what_a_reload_applies() {
        let readme = include_str!("../../../README.md");
        let backticked = |line: &'static str| {
            line.split('`')
                .skip(1)
                .step_by(2)
                .collect::<Vec<&'static str>>()
        };
        let defaults = serde_json::to_value(Config::default()).unwrap();
        for (section, keys) in defaults.as_object().unwrap() {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `[{section}]` |")))
                .unwrap_or_else(|| panic!("the README's config table has no [{section}] row"));
            let mut named: std::collections::BTreeSet<&str> = backticked(row)
                .into_iter()
                .filter(|w| !w.starts_with('['))
                .collect();
            if row.contains(&format!("`[{section}.models]`")) {
                named.insert("models");
            }
            let keys: std::collections::BTreeSet<&str> = keys
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(named, keys, "the README's [{section}] row");
        }
        let listed = readme
            .lines()
            .find(|l| l.starts_with("Read once at start:"))
            .map(backticked)
            .expect("the README lists the keys read once at start");
        assert_eq!(listed, READ_AT_START);
    }

    /// A config path naming a FIFO, a directory or a runaway file is refused at once with a
    /// reason (a FIFO would block the start; /dev/zero would fill memory); a symlink to a
    /// regular file is read.
    #[test]
    fn only_a_regular_config_file_of_bounded_size_is_read() {
        let dir = tempfile::TempDir::new().unwrap();
        let fifo = dir.path().join("fifo.toml");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let big = dir.path().join("big.toml");
        let line = "# a comment that goes on and on\n";
        std::fs::write(
            &big,
            line.repeat(MAX_CONFIG_BYTES as usize / line.len() + 1),
        )
        .unwrap();
        for (path, why) in [
            (fifo.as_path(), "not a regular file"),
            (dir.path(), "not a regular file"),
            (Path::new("/dev/zero"), "not a regular file"),
            (big.as_path(), "larger than 1024 KiB"),
        ] {
            let refused = Config::load(path).unwrap_err().to_string();
            assert!(refused.contains(why), "{}: {refused}", path.display());
        }
        let real = dir.path().join("real.toml");
        std::fs::write(&real, "[compaction]\nmax_messages = 42\n").unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(Config::load(&link).unwrap().compaction.max_messages, 42);
    }

    #[test]
    fn a_reload_names_the_keys_it_cannot_apply_until_the_next_start() {
        let old = Config::default();
        let mut new = old.clone();
        new.server.max_connections = 10;
        new.server.max_body_bytes = 4096;
        new.store.synchronous = crate::store::Synchronous::Normal;
        assert_eq!(
            old.changed_keys_read_at_start(&new),
            ["[server] max_connections", "[store] synchronous"]
        );
        assert!(old.changed_keys_read_at_start(&old).is_empty());
    }

    #[test]
    fn an_empty_file_is_the_spec_defaults() {
        let c = Config::parse("", Path::new("c.toml")).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.compaction.max_messages, 80);
        assert_eq!(c.compaction.min_preserve, 2_000);
        assert_eq!(c.compaction.max_preserve, 15_000);
        assert!(c.compaction.mask_observations);
        assert_eq!(c.summarizer.kind, SummarizerKind::Extractive);
        assert_eq!(c.store.synchronous, Synchronous::Full);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = Config::parse("[compaction]\nmax_mesages = 3\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_mesages") && e.contains("c.toml"), "{e}");
        let e = Config::parse(
            "[compaction]\nmax_messages = \"many\"\n",
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_messages"), "{e}");
        let e = Config::parse("[summarizer]\nkind = \"openai\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("model"), "{e}");
        let e = Config::parse(
            "[store]\nsynchronous = \"sometimes\"\n",
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sometimes"), "{e}");
        for bad in ["0", "1000"] {
            let e = Config::parse(
                &format!("[summarizer]\nmax_concurrent = {bad}\n"),
                Path::new("c.toml"),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("[summarizer] max_concurrent"), "{e}");
        }
    }

    #[test]
    fn a_rejected_config_never_quotes_a_key() {
        let key = "sk-proj-abcdefghijklmnop0123456789";
        for text in [
            format!("[summarizer]\napi_key = \"{key}\"\n"),
            format!("[summarizer]\nmodel = 3\napi_key_env = \"{key}\"\ntimeout_s = \"{key}\"\n"),
        ] {
            let e = Config::parse(&text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(!e.contains(key) && !e.contains("abcdefghijklmnop"), "{e}");
            assert!(e.contains("line "), "{e}");
        }
    }

    #[test]
    fn session_overrides_merge_and_are_validated() {
        let global = CompactionConfig::default();
        let c =
            compaction_with_overrides(&global, &serde_json::json!({"max_messages": 10})).unwrap();
        assert_eq!(c.max_messages, 10);
        assert_eq!(c.min_preserve, global.min_preserve);
        let e = compaction_with_overrides(&global, &serde_json::json!({"bogus": 1})).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = compaction_with_overrides(&global, &serde_json::json!({"max_messages": 0}))
            .unwrap_err();
        assert_eq!(
            e,
            OverrideError::Invalid(InvalidSetting::new("max_messages", "must be at least 1"))
        );
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;
    use compactd_summarize::config::{CommandLine, Fallback};

    const EXAMPLE: &str = include_str!("../../../config.example.toml");

    #[test]
    fn the_example_config_is_valid_and_shows_the_defaults() {
        assert_eq!(
            Config::parse(EXAMPLE, Path::new("config.example.toml")).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn the_example_config_documents_every_key() {
        let uncommented: String = EXAMPLE
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.contains(" = "))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let every_key = toml::to_string(&Config {
            compaction: CompactionConfig {
                reserve_tokens: Some(1),
                background_at: Some(0.8),
                ..Default::default()
            },
            summarizer: SummarizerConfig {
                base_url: Some("x".into()),
                model: Some("x".into()),
                api_key_env: Some("x".into()),
                context_window: Some(1),
                command: Some(CommandLine::Shell("x".into())),
                fallback: Some(Fallback::Extractive),
                ..Default::default()
            },
            server: ServerConfig {
                socket: Some("x".into()),
                ..Default::default()
            },
            proxy: ProxyConfig::default(),
            store: StoreConfig {
                path: Some("x".into()),
                ..Default::default()
            },
        })
        .unwrap();
        for line in every_key.lines().filter(|l| l.contains(" = ")) {
            let key = line.split(" = ").next().unwrap();
            assert!(
                uncommented
                    .lines()
                    .any(|l| l.starts_with(&format!("{key} = "))),
                "config.example.toml does not document `{key}`"
            );
        }
    }
}
