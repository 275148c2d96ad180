//! Bringing an upgraded database to exactly the shape `schema.sql` gives a new one.
//!
//! SQLite cannot change a table's constraints in place. Its documented way is a rebuild: create
//! the table as it should be, copy every row, drop the old one. Here the old table is renamed
//! aside first (with `legacy_alter_table` on, so the other tables' `REFERENCES` keep naming the
//! table, not its old copy) and the new one is created from `schema.sql`'s own text, so the
//! stored definition is the same, byte for byte, as in a new database: what `.schema` shows
//! a person reading the file is what `schema.sql` says. Runs inside the migration's transaction,
//! with foreign keys off.

use super::{Result, SCHEMA, StoreError};
use rusqlite::Connection;
use std::collections::HashMap;

/// One entry of `sqlite_master`.
struct SchemaObject {
    kind: String,
    name: String,
    /// The table an index or trigger belongs to (its own name for a table or view).
    table: String,
    sql: Option<String>,
}

/// The objects of `conn`'s main schema that SQLite did not make itself (nor a virtual table
/// for itself: FTS5's shadow tables), in creation order.
fn objects(conn: &Connection) -> Result<Vec<SchemaObject>> {
    let rows = conn
        .prepare(
            "SELECT type, name, tbl_name, sql FROM sqlite_master
             WHERE name NOT LIKE 'sqlite_%'
               AND name NOT IN (SELECT name FROM pragma_table_list WHERE type = 'shadow')
             ORDER BY rowid",
        )?
        .query_map([], |r| {
            Ok(SchemaObject {
                kind: r.get(0)?,
                name: r.get(1)?,
                table: r.get(2)?,
                sql: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// Whether `table` (or view) has `column`.
pub(super) fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool> {
    Ok(conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?)
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Drops every trigger and view: upgrades may then change the tables they name, and
/// [`to_schema`] creates the current ones.
pub(super) fn drop_triggers_and_views(conn: &Connection) -> Result<()> {
    for object in objects(conn)? {
        if object.kind == "trigger" || object.kind == "view" {
            conn.execute_batch(&format!(
                "DROP {} {};",
                object.kind.to_uppercase(),
                quoted(&object.name)
            ))?;
        }
    }
    Ok(())
}

/// Makes every table and index what `schema.sql` defines (rebuilding the tables whose
/// definition differs, keeping every row), then creates its triggers and views. Tables and
/// indexes `schema.sql` does not name (a user's own) are left alone.
pub(super) fn to_schema(conn: &Connection) -> Result<()> {
    let reference = Connection::open_in_memory()?;
    reference.execute_batch(SCHEMA)?;
    let wanted = objects(&reference)?;
    let present: HashMap<String, Option<String>> = objects(conn)?
        .into_iter()
        .map(|o| (o.name, o.sql))
        .collect();
    let tables: Vec<&SchemaObject> = wanted.iter().filter(|o| o.kind == "table").collect();
    let stale: Vec<&SchemaObject> = tables
        .iter()
        .copied()
        .filter(|t| present.get(&t.name).is_some_and(|sql| *sql != t.sql))
        .collect();
    for table in &stale {
        conn.execute_batch(&format!(
            "ALTER TABLE {} RENAME TO {};",
            quoted(&table.name),
            quoted(&aside(&table.name))
        ))?;
    }
    for table in &tables {
        if !present.contains_key(&table.name) || stale.iter().any(|t| t.name == table.name) {
            conn.execute_batch(definition(table)?)?;
        }
    }
    for table in &stale {
        copy_rows(conn, &table.name)?;
    }
    for index in wanted.iter().filter(|o| o.kind == "index") {
        let rebuilt = stale.iter().any(|t| t.name == index.table);
        if rebuilt || present.get(&index.name) != Some(&index.sql) {
            conn.execute_batch(&format!("DROP INDEX IF EXISTS {};", quoted(&index.name)))?;
            conn.execute_batch(definition(index)?)?;
        }
    }
    for object in wanted
        .iter()
        .filter(|o| o.kind == "view" || o.kind == "trigger")
    {
        conn.execute_batch(definition(object)?)?;
    }
    report_orphans(conn)
}

/// The name a stale table is renamed to while its rows are copied.
fn aside(table: &str) -> String {
    format!("{table}__before_upgrade")
}

fn definition(object: &SchemaObject) -> Result<&str> {
    object
        .sql
        .as_deref()
        .ok_or_else(|| StoreError::Internal(format!("schema.sql's {} has no SQL", object.name)))
}

/// Copies every row of the table renamed aside into its new definition (the columns both
/// have), then drops the old table with its indexes.
fn copy_rows(conn: &Connection, table: &str) -> Result<()> {
    let old = aside(table);
    let columns: Vec<String> = conn
        .prepare(
            "SELECT n.name FROM pragma_table_info(?1) n
             WHERE n.name IN (SELECT name FROM pragma_table_info(?2)) ORDER BY n.cid",
        )?
        .query_map([table, old.as_str()], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let list = columns
        .iter()
        .map(|c| quoted(c))
        .collect::<Vec<_>>()
        .join(", ");
    conn.execute_batch(&format!(
        "INSERT INTO {table} ({list}) SELECT {list} FROM {old}; DROP TABLE {old};",
        table = quoted(table),
        old = quoted(&old),
    ))?;
    Ok(())
}

/// Rows whose session is missing (deleted by hand before the triggers refused it) are kept,
/// as everything is; the upgrade says so in the log rather than refusing to open.
fn report_orphans(conn: &Connection) -> Result<()> {
    let orphans: usize = conn
        .prepare("SELECT count(*) FROM pragma_foreign_key_check")?
        .query_row([], |r| r.get(0))?;
    if orphans > 0 {
        tracing::warn!(
            rows = orphans,
            "the database holds rows whose session is missing (deleted by hand); they are kept"
        );
    }
    Ok(())
}
