//! Schema migrations, tracked by `PRAGMA user_version`.
//!
//! `schema.sql` always shows the current schema: a new database is made from it whole. An
//! older database is brought up to date by the [`UPGRADES`] after its version, one per version,
//! each in its own transaction; then its views are re-created from `schema.sql`, so views
//! never need an upgrade of their own. A schema change therefore edits `schema.sql` *and* adds
//! its `ALTER`/`UPDATE` step here; a test checks that a new and an upgraded database end up
//! with the same tables, columns and views.

use super::{Result, StoreError};
use crate::compaction::constants::PIN_FIRST_USER_TOKENS;
use crate::compaction::instruction::is_instruction;
use crate::message::{Message, Part, Role};
use rusqlite::{Connection, params};

const SCHEMA: &str = include_str!("../../schema.sql");

/// One step from version N to N + 1 (index 0: 1 to 2).
struct Upgrade {
    sql: &'static str,
    /// Work SQL cannot do, run after `sql` in the same transaction.
    then: Option<fn(&Connection) -> Result<()>>,
}

const UPGRADES: &[Upgrade] = &[
    // 2: pinned messages, created and deleted files.
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN pinned_tokens INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN task_seq INTEGER;
              ALTER TABLE messages ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1));
              ALTER TABLE compactions ADD COLUMN created_files TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(created_files));
              ALTER TABLE compactions ADD COLUMN deleted_files TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(deleted_files));
              CREATE INDEX messages_pinned ON messages (session_id, seq) WHERE pinned = 1;
              UPDATE messages SET pinned = 1 WHERE role = 'system';",
        then: Some(pin_existing_tasks),
    },
    // 3: idempotent appends.
    Upgrade {
        sql: "CREATE TABLE idempotency_keys (
                  session_id   TEXT NOT NULL REFERENCES sessions(id),
                  key          TEXT NOT NULL,
                  request_hash INTEGER NOT NULL,
                  first_seq    INTEGER NOT NULL,
                  last_seq     INTEGER NOT NULL,
                  created_at   TEXT NOT NULL,
                  PRIMARY KEY (session_id, key)
              ) WITHOUT ROWID;",
        then: None,
    },
    // 4: masking old tool outputs (microcompaction). Earlier messages have no masked form,
    // so they are never masked.
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN masked_through_seq INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE messages ADD COLUMN tool_results INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE messages ADD COLUMN masked_parts TEXT CHECK (json_valid(masked_parts));
              ALTER TABLE messages ADD COLUMN masked_tokens INTEGER;
              CREATE TABLE maskings (
                  id          INTEGER PRIMARY KEY,
                  session_id  TEXT NOT NULL REFERENCES sessions(id),
                  through_seq INTEGER NOT NULL,
                  outputs     INTEGER NOT NULL,
                  pre_tokens  INTEGER NOT NULL,
                  post_tokens INTEGER NOT NULL,
                  created_at  TEXT NOT NULL
              );
              CREATE INDEX maskings_by_session ON maskings (session_id, id);",
        then: None,
    },
    // 5: sessions the proxy made belong to the API key that made them.
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN owner TEXT;",
        then: None,
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = UPGRADES.len() + 1;

pub fn migrate(conn: &Connection) -> Result<()> {
    let version: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Corrupt(format!(
            "the database has schema version {version}, newer than this compactd ({SCHEMA_VERSION}); upgrade compactd"
        )));
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    in_transaction(conn, |conn| {
        if version == 0 {
            conn.execute_batch(SCHEMA)?;
        } else {
            for upgrade in &UPGRADES[version - 1..] {
                conn.execute_batch(upgrade.sql)?;
                if let Some(then) = upgrade.then {
                    then(conn)?;
                }
            }
            recreate_views(conn)?;
        }
        conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))?;
        Ok(())
    })
}

fn in_transaction(conn: &Connection, f: impl FnOnce(&Connection) -> Result<()>) -> Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE;")?;
    match f(conn) {
        Ok(()) => Ok(conn.execute_batch("COMMIT;")?),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK;");
            Err(e)
        }
    }
}

/// Drops every view and creates the ones `schema.sql` defines.
fn recreate_views(conn: &Connection) -> Result<()> {
    let views: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'view'")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for view in views {
        conn.execute_batch(&format!("DROP VIEW \"{}\";", view.replace('"', "\"\"")))?;
    }
    for statement in view_statements() {
        conn.execute_batch(&statement)?;
    }
    Ok(())
}

/// The `CREATE VIEW` statements of `schema.sql`.
fn view_statements() -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in SCHEMA.lines() {
        if line.starts_with("CREATE VIEW") {
            current = Some(String::new());
        }
        if let Some(statement) = current.as_mut() {
            statement.push_str(line);
            statement.push('\n');
            if line.trim_end().ends_with(';') {
                out.extend(current.take());
            }
        }
    }
    out
}

/// Version 2 pins each session's task: its first user instruction, when it is at most the
/// default pin size. (Sessions with a different `pin_first_user_tokens` override get the
/// default for messages stored before the upgrade.) Then every session's token counters are
/// recounted with pinned messages apart.
fn pin_existing_tasks(conn: &Connection) -> Result<()> {
    let sessions: Vec<String> = conn
        .prepare("SELECT id FROM sessions")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut user_messages =
        conn.prepare("SELECT seq, parts, tokens FROM messages WHERE session_id = ?1 AND role = 'user' ORDER BY seq")?;
    for id in sessions {
        let rows: Vec<(u64, String, usize)> = user_messages
            .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let task = rows.into_iter().find(|(_, parts, _)| {
            serde_json::from_str::<Vec<Part>>(parts).is_ok_and(|parts| {
                is_instruction(&Message {
                    role: Role::User,
                    parts,
                })
            })
        });
        if let Some((seq, _, tokens)) = task {
            conn.execute(
                "UPDATE sessions SET task_seq = ?2 WHERE id = ?1",
                params![id, seq],
            )?;
            if tokens <= PIN_FIRST_USER_TOKENS {
                conn.execute(
                    "UPDATE messages SET pinned = 1 WHERE session_id = ?1 AND seq = ?2",
                    params![id, seq],
                )?;
            }
        }
        conn.execute(
            "UPDATE sessions SET
                 pinned_tokens = (SELECT coalesce(sum(tokens), 0) FROM messages m
                                  WHERE m.session_id = ?1 AND m.pinned = 1),
                 active_tokens = (SELECT coalesce(sum(tokens), 0) FROM messages m
                                  WHERE m.session_id = ?1 AND m.pinned = 0 AND m.seq >= sessions.active_from_seq)
             WHERE id = ?1",
            [&id],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables with their columns, indexes, and views with their SQL: what must match.
    fn shape(conn: &Connection) -> Vec<String> {
        let mut out: Vec<String> = conn
            .prepare("SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name")
            .unwrap()
            .query_map([], |r| {
                Ok(format!("{} {} on {}", r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for table in [
            "sessions",
            "messages",
            "tool_calls",
            "compactions",
            "compaction_failures",
        ] {
            let mut columns: Vec<String> = conn
                .prepare(&format!("PRAGMA table_info({table})"))
                .unwrap()
                .query_map([], |r| {
                    Ok(format!(
                        "{table}.{} {} notnull={} default={:?}",
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Option<String>>(4)?
                    ))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            columns.sort();
            out.extend(columns);
        }
        for view in ["compaction_history", "session_overview", "message_text"] {
            let columns: Vec<String> = conn
                .prepare(&format!("PRAGMA table_info({view})"))
                .unwrap()
                .query_map([], |r| r.get::<_, String>(1))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            out.push(format!("{view}: {}", columns.join(", ")));
        }
        out
    }

    #[test]
    fn upgrading_pins_system_messages_and_each_task_and_recounts_tokens() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(include_str!("testdata/schema_v1.sql"))
            .unwrap();
        conn.execute_batch(
            r#"PRAGMA user_version = 1;
            INSERT INTO sessions (id, context_limit, created_at, updated_at, message_count, active_messages, active_tokens)
                VALUES ('s', 32000, 'now', 'now', 4, 4, 36);
            INSERT INTO messages (session_id, seq, role, parts, tokens, created_at) VALUES
                ('s', 1, 'system', '[{"type":"text","text":"be brief"}]', 2, 'now'),
                ('s', 2, 'user', '[{"type":"text","text":"Caveat: The messages below were generated by the user while running local commands."}]', 20, 'now'),
                ('s', 3, 'user', '[{"type":"text","text":"fix the parser"}]', 4, 'now'),
                ('s', 4, 'assistant', '[{"type":"text","text":"on it"}]', 10, 'now');"#,
        )
        .unwrap();
        migrate(&conn).unwrap();
        let pinned: Vec<u64> = conn
            .prepare("SELECT seq FROM messages WHERE pinned = 1 ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(pinned, [1, 3]);
        let (task, pinned_tokens, active_tokens): (u64, usize, usize) = conn
            .query_row(
                "SELECT task_seq, pinned_tokens, active_tokens FROM sessions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((task, pinned_tokens, active_tokens), (3, 6, 30));
    }

    /// A database as version `version` of compactd left it, holding one session with a user
    /// message: the version 1 schema and the upgrades that came before `version`.
    fn database_at(version: usize) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(include_str!("testdata/schema_v1.sql"))
            .unwrap();
        conn.execute_batch(
            r#"INSERT INTO sessions (id, context_limit, created_at, updated_at, message_count, active_messages, active_tokens)
                   VALUES ('s', 32000, 'now', 'now', 1, 1, 4);
               INSERT INTO messages (session_id, seq, role, parts, tokens, created_at)
                   VALUES ('s', 1, 'user', '[{"type":"text","text":"fix the parser"}]', 4, 'now');"#,
        )
        .unwrap();
        for upgrade in &UPGRADES[..version - 1] {
            conn.execute_batch(upgrade.sql).unwrap();
            if let Some(then) = upgrade.then {
                then(&conn).unwrap();
            }
        }
        conn.execute_batch(&format!("PRAGMA user_version = {version};"))
            .unwrap();
        conn
    }

    #[test]
    fn every_earlier_version_upgrades_to_the_shape_of_a_new_one_keeping_its_messages() {
        let new = Connection::open_in_memory().unwrap();
        migrate(&new).unwrap();
        for version in 1..SCHEMA_VERSION {
            let old = database_at(version);
            migrate(&old).unwrap();
            assert_eq!(shape(&old), shape(&new), "from version {version}");
            let text: String = old
                .query_row(
                    "SELECT text FROM message_text WHERE session_id = 's'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(text, "fix the parser", "from version {version}");
            // Migrating again is a no-op.
            migrate(&old).unwrap();
            assert_eq!(shape(&old), shape(&new));
        }
    }

    #[test]
    fn a_failed_upgrade_leaves_the_database_as_it_was() {
        let conn = database_at(2);
        // Version 3 creates this table; finding it already there makes the upgrade fail.
        conn.execute_batch("CREATE TABLE idempotency_keys (x);")
            .unwrap();
        let before = shape(&conn);
        assert!(migrate(&conn).is_err());
        assert_eq!(shape(&conn), before);
        let version: usize = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, 2);
    }

    #[test]
    fn a_newer_database_is_refused() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&format!("PRAGMA user_version = {};", SCHEMA_VERSION + 1))
            .unwrap();
        let e = migrate(&conn).unwrap_err().to_string();
        assert!(e.contains("upgrade compactd"), "{e}");
    }
}
