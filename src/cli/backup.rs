//! `compactd backup PATH`: which database to copy, and the copy.

use super::render::Output;
use crate::client::{Client, ClientError};
use crate::config::Config;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Copies the database (`--db`, else the running daemon's, else the config's or the default
/// path) to `dest`.
pub async fn backup(
    client: &Client,
    dest: &Path,
    db: Option<PathBuf>,
    config: Option<PathBuf>,
    out: Output,
) -> Result<()> {
    let source = match db {
        Some(db) => db,
        None => match client.health().await {
            Ok(health) => PathBuf::from(health.database),
            Err(ClientError::NotRunning { .. }) => {
                let path = config.unwrap_or_else(crate::paths::default_config);
                Config::load(&path)?
                    .store
                    .path
                    .unwrap_or_else(crate::paths::default_db)
            }
            Err(e) => return Err(e.into()),
        },
    };
    let (from, to) = (source.clone(), dest.to_path_buf());
    let report = tokio::task::spawn_blocking(move || crate::store::backup(&from, &to))
        .await?
        .with_context(|| format!("cannot back up {}", source.display()))?;
    out.print(&report, |r| {
        format!(
            "backed up {} to {}: {} sessions, {} messages, {} bytes\n",
            source.display(),
            dest.display(),
            r.sessions,
            r.messages,
            r.bytes
        )
    });
    Ok(())
}
