//! Schema migrations, tracked by `PRAGMA user_version`.
//!
//! Version 1 is `schema.sql` as a whole. A later change to the schema adds its `ALTER`/`CREATE`
//! statements as the next entry here *and* edits `schema.sql`, so a new database and a migrated
//! one end up the same; `schema.sql` always shows the current schema.

use super::{Result, StoreError};
use rusqlite::Connection;

const MIGRATIONS: &[&str] = &[include_str!("../../schema.sql")];

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

pub fn migrate(conn: &Connection) -> Result<()> {
    let version: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Sqlite(format!(
            "the database has schema version {version}, newer than this compactd ({SCHEMA_VERSION}); upgrade compactd"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(version) {
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE;\n{migration}\nPRAGMA user_version = {};\nCOMMIT;",
            index + 1
        ))
        .inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    }
    Ok(())
}
