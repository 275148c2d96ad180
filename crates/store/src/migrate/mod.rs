//! Schema migrations, tracked by `PRAGMA user_version`.
//!
//! `schema.sql` always shows the current schema: a new database is made from it whole. An
//! older database is brought up to date in one transaction: first the [`UPGRADES`] after its
//! version, one per version, which add what is new and fill it in (`ALTER`, `UPDATE`, code);
//! then [`rebuild::to_schema`] makes every table, index, trigger and view exactly what
//! `schema.sql` says, rebuilding a table whose definition differs by SQLite's documented
//! procedure (new table, copy every row, drop the old one). So an upgraded database checks,
//! dumps and restores like a new one, constraints included. A schema change therefore edits
//! `schema.sql`, and adds an upgrade step only when existing rows need new values.
//!
//! A database restored from `.dump` has lost its `user_version` (a dump does not carry it):
//! its version is read from its shape instead ([`VERSION_MARKERS`]).

use super::{Result, StoreError};
use crate::compaction::constants::PIN_FIRST_USER_TOKENS;
use crate::compaction::instruction::is_instruction;
use crate::message::{Message, Part, Role};
use rusqlite::{Connection, params};

mod rebuild;

/// The whole schema, as people read it in `schema.sql`: a new database is made from it.
pub const SCHEMA: &str = include_str!("../../schema.sql");

/// Declares `conn` compactd's writer: it runs with triggers off, so `schema.sql`'s triggers,
/// which refuse every write (a `sqlite3` user's, say), never fire for it. The setting belongs
/// to the connection: every other one, opened by anyone, has them on.
pub fn declare_writer(conn: &Connection) -> Result<()> {
    use rusqlite::config::DbConfig;
    let on = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
    if on {
        return Err(StoreError::Internal(
            "SQLite kept triggers on for the writer connection".into(),
        ));
    }
    Ok(())
}

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
    // 6: nullable JSON columns checked as `IS NULL OR json_valid(...)` (before SQLite 3.45,
    // json_valid(NULL) is 0: integrity_check failed and a .dump did not restore), and
    // triggers that refuse writes by hand. The rebuild does it all.
    Upgrade { sql: "", then: None },
    // 7: the current step shortened in the context. Earlier messages are shown whole.
    Upgrade {
        sql: "ALTER TABLE messages ADD COLUMN shortened_parts TEXT;
              ALTER TABLE messages ADD COLUMN shortened_tokens INTEGER;
              ALTER TABLE sessions ADD COLUMN step_calls INTEGER NOT NULL DEFAULT 0;",
        then: None,
    },
    // 8: conversations as trees of messages (the proxy's), and what a proxied session knows
    // of its client. Every earlier message is on its session's one branch.
    Upgrade {
        sql: "ALTER TABLE messages ADD COLUMN parent_seq INTEGER;
              ALTER TABLE messages ADD COLUMN hash INTEGER;
              UPDATE messages SET parent_seq = seq - 1 WHERE seq > 1;
              ALTER TABLE sessions ADD COLUMN head_seq INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN branch_points INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN summary_num INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN kind TEXT NOT NULL DEFAULT 'api';
              ALTER TABLE sessions ADD COLUMN conversation TEXT;
              ALTER TABLE sessions ADD COLUMN root_hash INTEGER;
              ALTER TABLE sessions ADD COLUMN task_hash INTEGER;
              ALTER TABLE sessions ADD COLUMN static_seq INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN overhead_tokens INTEGER NOT NULL DEFAULT 0;
              ALTER TABLE sessions ADD COLUMN limit_source TEXT;
              UPDATE sessions SET head_seq = message_count, summary_num = compaction_count,
                  kind = CASE WHEN owner IS NULL THEN 'api' ELSE 'proxy' END;
              ALTER TABLE compactions ADD COLUMN summary_tokens INTEGER;",
        then: None,
    },
    // 9: an index of the messages holding tool results (a restored dump of version 9
    // reads as 8 and has it already).
    Upgrade {
        sql: "CREATE INDEX IF NOT EXISTS messages_with_results ON messages (session_id, seq, tool_results) WHERE tool_results > 0;",
        then: None,
    },
    // 10: full-text search over every message, built here for the messages already stored.
    Upgrade {
        sql: "",
        then: Some(index_for_search),
    },
    // 11: the index by parent holds only proxied messages (the ones the tree walk looks up),
    // and `branch_messages` finds leaves without it: an append of the socket API wrote a
    // page of that index for nothing, a fifth of its WAL bytes. The rebuild makes both.
    Upgrade {
        sql: "",
        then: None,
    },
    // 12: messages check their role with `=` and `OR`, not `IN (...)`: for an IN list of
    // three or more, SQLite fills a temporary index on every insert (a sixth of an append's
    // SQL). The rebuild copies the table under the new check. And the triggers refusing
    // writes by hand refuse every write (the writer runs with triggers off) instead of asking
    // each time whether the connection is the writer (a PRAGMA prepared per row written).
    Upgrade {
        sql: "",
        then: None,
    },
    // 13: the proxy's tree walk reads only indexes: the index by parent holds each child's
    // fingerprint and seq, and a new one holds each proxied message's fingerprint by seq. The
    // rebuild makes both.
    Upgrade {
        sql: "",
        then: None,
    },
    // 14: the rate the model counts at, kept across compactions (a report is dropped at each).
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN token_rate REAL;",
        then: None,
    },
    // 15: the completion a client asks room for beside each prompt.
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0;",
        then: None,
    },
    // 16: when a refusal taught a session's window (windows taught before stay unshared).
    Upgrade {
        sql: "ALTER TABLE sessions ADD COLUMN limit_taught_at TEXT;",
        then: None,
    },
    // 17: which branch a masking masked (those made before mask every branch, as they did).
    Upgrade {
        sql: "ALTER TABLE maskings ADD COLUMN head_seq INTEGER;",
        then: None,
    },
    // 18: what a proxied message's media cost, by where they sit (messages stored before
    // have none recorded: a context shown otherwise counts their text alone, as it did).
    Upgrade {
        sql: "ALTER TABLE messages ADD COLUMN media TEXT;",
        then: None,
    },
];

/// Creates `messages_fts` as schema.sql defines it (the rebuild then finds it as it should
/// be) and indexes every stored message.
fn index_for_search(conn: &Connection) -> Result<()> {
    let statement = SCHEMA
        .split_inclusive(';')
        .find(|s| s.contains("CREATE VIRTUAL TABLE messages_fts"))
        .ok_or_else(|| StoreError::Internal("schema.sql defines no messages_fts".into()))?;
    let statement = &statement[statement.find("CREATE VIRTUAL TABLE").unwrap_or(0)..];
    conn.execute_batch(&format!("DROP TABLE IF EXISTS messages_fts; {statement}"))?;
    while super::search::index_pending(conn, super::search::INDEX_STEP)?.more {}
    Ok(())
}

/// The schema version this build writes.
pub(super) const SCHEMA_VERSION: usize = UPGRADES.len() + 1;

/// For each version from 2 on that added columns or tables, one it was the first to have: how
/// the version of a database that lost its `user_version` (restored from `.dump`) is found.
/// (Version 6 changed only constraints and triggers, which the rebuild makes anyway: its
/// dump reads as version 5, and upgrading it from there is the same; version 9 added only an
/// index, and its dump reads as 8; versions 11, 12 and 13 changed only indexes, a view and a
/// check, and their dumps read as 10.)
const VERSION_MARKERS: &[(usize, &str, &str)] = &[
    (18, "messages", "media"),
    (17, "maskings", "head_seq"),
    (16, "sessions", "limit_taught_at"),
    (15, "sessions", "completion_tokens"),
    (14, "sessions", "token_rate"),
    (10, "messages_fts", "text"),
    (8, "sessions", "head_seq"),
    (7, "sessions", "step_calls"),
    (5, "sessions", "owner"),
    (4, "sessions", "masked_through_seq"),
    (3, "idempotency_keys", "key"),
    (2, "sessions", "pinned_tokens"),
];

pub(super) fn migrate(conn: &Connection) -> Result<()> {
    let (version, recorded) = stored_version(conn)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Corrupt(format!(
            "the database has schema version {version}, newer than this compactd ({SCHEMA_VERSION}); upgrade compactd"
        )));
    }
    if version == SCHEMA_VERSION {
        if !recorded {
            conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))?;
        }
        return Ok(());
    }
    // Rebuilding a table needs foreign keys off (they cannot change inside a transaction)
    // and renames that leave other tables' REFERENCES alone.
    conn.execute_batch("PRAGMA foreign_keys = OFF; PRAGMA legacy_alter_table = ON;")?;
    let upgraded = in_transaction(conn, |conn| {
        if version == 0 {
            conn.execute_batch(SCHEMA)?;
        } else {
            rebuild::drop_triggers_and_views(conn)?;
            for upgrade in &UPGRADES[version - 1..] {
                conn.execute_batch(upgrade.sql)?;
                if let Some(then) = upgrade.then {
                    then(conn)?;
                }
            }
            rebuild::to_schema(conn)?;
        }
        conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))?;
        Ok(())
    });
    conn.execute_batch("PRAGMA legacy_alter_table = OFF; PRAGMA foreign_keys = ON;")?;
    upgraded
}

/// The database's schema version, and whether `user_version` records it: when that is 0
/// but compactd's tables are there (a restored `.dump`), the version its shape shows.
fn stored_version(conn: &Connection) -> Result<(usize, bool)> {
    let version: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version != 0 || !rebuild::has_column(conn, "sessions", "id")? {
        return Ok((version, true));
    }
    for &(version, table, column) in VERSION_MARKERS {
        if rebuild::has_column(conn, table, column)? {
            return Ok((version, false));
        }
    }
    Ok((1, false))
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

/// The plan SQLite makes for `query` on the daemon's schema, a step a line: an empty
/// database has no statistics (`sqlite_stat1`), as the daemon's file has none, so the plan is
/// the one the daemon's statements get.
#[cfg(test)]
pub(super) fn query_plan(query: &str, params: impl rusqlite::Params) -> Vec<String> {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    conn.prepare(&format!("EXPLAIN QUERY PLAN {query}"))
        .unwrap()
        .query_map(params, |r| r.get(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[cfg(test)]
mod tests;
