//! Where compactd keeps things by default, following the XDG base directories.
//!
//! - socket: `$XDG_RUNTIME_DIR/compactd/compactd.sock`, else `/tmp/compactd-$UID/compactd.sock`
//! - database: `$XDG_DATA_HOME/compactd/compactd.db` (`~/.local/share/compactd/compactd.db`)
//! - config: `$XDG_CONFIG_HOME/compactd/config.toml` (`~/.config/compactd/config.toml`)

use directories::{BaseDirs, ProjectDirs};
use std::path::PathBuf;

fn project() -> Option<ProjectDirs> {
    ProjectDirs::from("", "", "compactd")
}

/// The default socket path.
pub fn default_socket() -> PathBuf {
    let runtime = BaseDirs::new()
        .and_then(|b| b.runtime_dir().map(PathBuf::from))
        .or_else(|| std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
        .filter(|p| p.is_absolute());
    match runtime {
        Some(dir) => dir.join("compactd").join("compactd.sock"),
        // No runtime dir (e.g. a root shell without a login session): a private dir in /tmp,
        // checked before use (`ensure_private_dir`), since anyone can create it first.
        None => std::env::temp_dir()
            .join(format!("compactd-{}", current_uid()))
            .join("compactd.sock"),
    }
}

/// The default database path.
pub fn default_db() -> PathBuf {
    project()
        .map(|p| p.data_dir().join("compactd.db"))
        .unwrap_or_else(|| PathBuf::from("compactd.db"))
}

/// The default config file path.
pub fn default_config() -> PathBuf {
    project()
        .map(|p| p.config_dir().join("config.toml"))
        .unwrap_or_else(|| PathBuf::from("compactd.toml"))
}

/// The real uid of this process: the socket's default directory and the owner a client
/// expects of the socket are named by it.
pub(crate) fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}
