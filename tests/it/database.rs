//! The database as people who read it cold meet it: the system's own `sqlite3` and Python's
//! `sqlite3` module open it while the daemon runs, between appends, then the daemon is killed
//! with SIGKILL. Ground truth is what those outside programs find in the file, not the
//! daemon's own answers.

use crate::common::mock_model::{MockModel, Reply};
use crate::common::{TestDaemon, all_messages, bash_round, have, sqlite3, sqlite3_of, user};
use crate::proxy::{KEY, call, raw, tool_call_answer};
use compactd_api::client::Client;
use serde_json::{Value, json};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the system `sqlite3` counts of `session`'s messages.
fn counted(db: &Path, session: &str) -> usize {
    sqlite3(
        db,
        &format!("select count(*) from messages where session_id = '{session}'"),
    )
    .unwrap()
    .parse()
    .unwrap()
}

/// Python's `sqlite3` module as an outside reader: read-write (the default `connect`) or
/// read-only (`mode=ro`), one query, then exit.
fn python_reads(db: &Path, read_only: bool) -> usize {
    let uri = if read_only { "?mode=ro" } else { "" };
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3; c = sqlite3.connect('file:{}{uri}', uri=True); print(c.execute('select count(*) from messages').fetchone()[0]); c.close()",
            db.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn identity(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino())
}

fn wal(db: &Path) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("{}-wal", db.display()))
}

/// One step of an agent: a call and its output (so compactions and maskings run).
async fn step(client: &Client, session: &str, i: usize) -> usize {
    let [call, result] = bash_round(
        &format!("c{i}"),
        &format!("cat f{i}.rs"),
        &"x\n".repeat(400),
    );
    let answer = client
        .post(
            &format!("/session/{session}/message"),
            &json!({"messages": [call, result]}),
        )
        .await
        .unwrap();
    (answer["last_seq"].as_u64().unwrap() - answer["first_seq"].as_u64().unwrap() + 1) as usize
}

#[tokio::test]
async fn outside_readers_between_appends_lose_nothing_across_kill9() {
    if !have("sqlite3") || !have("python3") {
        eprintln!("SKIP: sqlite3 or python3 is not installed");
        return;
    }
    let mut daemon = TestDaemon::start("[compaction]\nmax_messages = 20\n");
    let client = daemon.client();
    let db = daemon.db();
    let mut acked = 0;
    for i in 0..3 {
        acked += step(&client, "s", i).await;
    }
    let wal_before = identity(&wal(&db));
    // Each kind of outside opener, then more appends: each reader exits, and must not take
    // the daemon's locks (and with them the WAL) along.
    for (round, reader) in ["sqlite3", "python", "python read-only", "sqlite3 .backup"]
        .into_iter()
        .enumerate()
    {
        let seen = match reader {
            "sqlite3" => counted(&db, "s"),
            "python" => python_reads(&db, false),
            "python read-only" => python_reads(&db, true),
            _ => {
                let copy = daemon.dir.path().join(format!("b{round}.db"));
                sqlite3(&db, &format!(".backup '{}'", copy.display())).unwrap();
                counted(&copy, "s")
            }
        };
        assert_eq!(seen, acked, "{reader} sees every acknowledged message");
        for i in 0..9 {
            acked += step(&client, "s", 100 * (round + 1) + i).await;
        }
        assert_eq!(
            counted(&db, "s"),
            acked,
            "after {reader}, sqlite3 sees every append"
        );
        assert_eq!(
            identity(&wal(&db)),
            wal_before,
            "after {reader}, the WAL is the same file"
        );
    }
    let compactions = client.get("/session/s").await.unwrap()["compaction_count"].clone();
    assert!(compactions.as_u64().unwrap() >= 2, "{compactions}");

    daemon.kill9();
    assert_eq!(counted(&db, "s"), acked, "after kill -9, before restart");
    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
    daemon.spawn();
    let client = daemon.client();
    assert_eq!(all_messages(&client, "s").await.len(), acked);
    assert_eq!(
        client.get("/session/s").await.unwrap()["compaction_count"],
        compactions
    );
}

/// A daemon on a copy of the database serves what the original holds.
async fn serves_the_same(copy: &Path, original: &[Value], how: &str) {
    let daemon = TestDaemon::builder().db(copy).start();
    let messages = all_messages(&daemon.client(), "s").await;
    assert_eq!(messages.len(), original.len(), "{how}");
    assert_eq!(
        messages.iter().map(|m| &m["parts"]).collect::<Vec<_>>(),
        original.iter().map(|m| &m["parts"]).collect::<Vec<_>>(),
        "{how}"
    );
    let compactions = daemon.client().get("/session/s/compaction").await.unwrap();
    assert!(
        !compactions["compactions"].as_array().unwrap().is_empty(),
        "{how}"
    );
}

/// `program` (a `sqlite3`) dumps `db` and restores the dump into `to`, without a word on
/// stderr.
fn dump_into(program: &Path, db: &Path, to: &Path) {
    let restore = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{program}' '{}' .dump | '{program}' -bail '{}'",
            db.display(),
            to.display(),
            program = program.display()
        ))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        restore.status.success() && restore.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );
}

/// A daemon whose session `s` was compacted and masked (a task, then 30 steps), and the
/// session's messages. It ends with a manual compaction, which waits for the one the last
/// steps started in the background: until then two readers a moment apart could see the
/// session before and after it (seen: an older `sqlite3`'s `message_text` with messages
/// compacted that the system's, read just after, showed whole).
async fn a_compacted_session() -> (TestDaemon, Vec<Value>) {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 20\n");
    let client = daemon.client();
    client
        .post("/session/s/message", &user("fix the parser"))
        .await
        .unwrap();
    for i in 0..30 {
        step(&client, "s", i).await;
    }
    client
        .post("/session/s/summarize", &serde_json::json!({}))
        .await
        .unwrap();
    let original = all_messages(&client, "s").await;
    (daemon, original)
}

#[tokio::test]
async fn a_live_database_checks_dumps_backs_up_and_restores_with_the_system_sqlite3() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (daemon, original) = a_compacted_session().await;
    let (client, db) = (daemon.client(), daemon.db());
    let masked = sqlite3(
        &db,
        "select count(*) from messages where masked_parts is null",
    )
    .unwrap();
    assert_ne!(
        masked, "0",
        "some messages have no masked form (the NULL case)"
    );
    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");

    let dir = daemon.dir.path();
    let dumped = dir.join("dumped.db");
    dump_into(Path::new("sqlite3"), &db, &dumped);
    let backed = dir.join("backed.db");
    sqlite3(&db, &format!(".backup '{}'", backed.display())).unwrap();
    let vacuumed = dir.join("vacuumed.db");
    sqlite3(&db, &format!("vacuum into '{}'", vacuumed.display())).unwrap();
    let ours = dir.join("ours.db");
    let out = Command::new(crate::common::BIN)
        .args(["--socket", daemon.socket().to_str().unwrap(), "backup"])
        .arg(&ours)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("{} messages", original.len())),
        "{said}"
    );
    assert_eq!(
        std::fs::metadata(&ours).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A second backup to the same path is refused, the first left whole.
    let again = Command::new(crate::common::BIN)
        .args(["--socket", daemon.socket().to_str().unwrap(), "backup"])
        .arg(&ours)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));

    // The daemon went on serving, and the outside readers took nothing from it.
    let n = step(&client, "s", 99).await;
    assert_eq!(counted(&db, "s"), original.len() + n);
    for (copy, how) in [
        (&dumped, ".dump | sqlite3"),
        (&backed, ".backup"),
        (&vacuumed, "VACUUM INTO"),
        (&ours, "compactd backup"),
    ] {
        assert_eq!(
            sqlite3(copy, "pragma integrity_check").unwrap(),
            "ok",
            "{how}"
        );
        serves_the_same(copy, &original, how).await;
    }
}

/// The oldest `sqlite3` the database is tested with: 3.34.0 (Debian 11 ships 3.34.1, Ubuntu
/// 22.04 3.37.2), built by `.ci/run` from the SQLite source the `sqlite3` npm package 5.0.2
/// ships; `COMPACTD_OLD_SQLITE3` points elsewhere.
fn old_sqlite3() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("COMPACTD_OLD_SQLITE3")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sqlite-3.34/sqlite3")
        });
    path.exists().then_some(path)
}

/// A person on an older distribution reads the live database with its `sqlite3`, far older
/// than the SQLite compactd bundles: the schema (its views, its full-text index, its triggers)
/// must parse there, every view answer, a dump restore and a backup serve the same messages,
/// and a write by hand be refused as with the system's.
#[tokio::test]
async fn an_older_sqlite3_reads_checks_dumps_and_restores_a_live_database() {
    let Some(old) = old_sqlite3() else {
        eprintln!(
            "SKIP: no sqlite3 3.34 at target/sqlite-3.34/sqlite3 (.ci/run builds it) or COMPACTD_OLD_SQLITE3"
        );
        return;
    };
    let version = sqlite3_of(&old, Path::new(":memory:"), "select sqlite_version()").unwrap();
    assert!(version.starts_with("3.34."), "{version}");
    let (daemon, original) = a_compacted_session().await;
    let (client, db) = (daemon.client(), daemon.db());
    let read = |sql: &str| sqlite3_of(&old, &db, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(read("pragma integrity_check"), "ok");
    assert_eq!(
        read("select count(*) from messages"),
        original.len().to_string()
    );
    // Every view answers, each as the bundled SQLite answers it.
    let views = read("select name from sqlite_master where type = 'view' order by name");
    assert!(views.lines().count() >= 3, "{views}");
    for view in views.lines() {
        let sql = format!("select * from {view}");
        assert_eq!(read(&sql), sqlite3(&db, &sql).unwrap(), "{view}");
    }
    // The full-text index (brought up to date by a search) reads there too.
    let found = client.get("/session/s/search?q=parser").await.unwrap();
    assert_eq!(found["results"].as_array().unwrap().len(), 1, "{found}");
    assert_eq!(
        read("select count(*) from messages_fts where messages_fts match 'parser'"),
        "1"
    );
    // The daemon holds the write lock: a write by hand is refused before it starts.
    let refused = sqlite3_of(&old, &db, "delete from messages where seq = 1").unwrap_err();
    assert!(refused.contains("database is locked"), "{refused}");

    let dir = daemon.dir.path();
    let dumped = dir.join("dumped.db");
    dump_into(&old, &db, &dumped);
    let backed = dir.join("backed.db");
    read(&format!(".backup '{}'", backed.display()));
    // The daemon went on serving while the old reader came and went.
    let n = step(&client, "s", 99).await;
    assert_eq!(counted(&db, "s"), original.len() + n);
    for (copy, how) in [
        (&dumped, ".dump | sqlite3 3.34"),
        (&backed, ".backup of sqlite3 3.34"),
    ] {
        assert_eq!(
            sqlite3_of(&old, copy, "pragma integrity_check").unwrap(),
            "ok",
            "{how}"
        );
        // Where no daemon holds the lock, the schema's triggers refuse it.
        let refused = sqlite3_of(&old, copy, "delete from messages where seq = 1").unwrap_err();
        assert!(refused.contains("append-only"), "{how}: {refused}");
        serves_the_same(copy, &original, how).await;
    }
}

/// A person with `sqlite3` writes to the live database: deletes, updates and inserts, a
/// trigger dropped, a transaction held, a backup restored over it. `.restore` used to succeed
/// (the backup API writes pages, past the triggers) and every write acknowledged since the
/// backup was gone, the daemon serving on from the old state. Now the daemon holds the write
/// lock between its writes: every one of these is refused (`database is locked`) and changes
/// nothing, appends go on meanwhile, and where no daemon runs the triggers refuse by name.
#[tokio::test]
async fn writes_by_hand_and_a_restore_over_the_live_database_are_refused() {
    if !have("sqlite3") || !have("python3") {
        eprintln!("SKIP: sqlite3 or python3 is not installed");
        return;
    }
    let mut daemon = TestDaemon::start("");
    let client = daemon.client();
    let db = daemon.db();
    let mut acked = 0;
    for i in 0..4 {
        acked += step(&client, "s", i).await;
    }
    let backup = backed_up(&daemon);
    for i in 4..8 {
        acked += step(&client, "s", i).await;
    }
    for write in [
        "delete from sessions where id = 's'",
        "update sessions set context_limit = 1000",
        "delete from messages where seq > 2",
        "insert into messages (session_id, seq, role, parts, tokens, created_at) values ('s', 99, 'user', '[]', 0, '')",
        "drop trigger messages_delete_by_hand",
        "begin immediate",
        &format!(".restore '{}'", backup.display()),
    ] {
        let e = sqlite3(&db, write).unwrap_err();
        assert!(e.contains("locked") || e.contains("busy"), "{write}: {e}");
        assert_eq!(counted(&db, "s"), acked, "{write}");
    }
    assert_eq!(
        client.get("/session/s").await.unwrap()["context_limit"],
        128_000
    );

    // A person who waits for the lock (Python's `sqlite3` waits five seconds) does not get
    // it while the daemon serves, even between its appends.
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3\nc = sqlite3.connect('{}', isolation_level=None)\ntry:\n    c.execute('begin immediate')\n    print('locked', flush=True)\nexcept sqlite3.OperationalError as e:\n    print(e, flush=True)",
            db.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    for i in 50..60 {
        acked += step(&client, "s", i).await;
    }
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    holder.wait().unwrap();
    assert_eq!(line.trim(), "database is locked");
    // With no daemon, the triggers say whose the database is.
    for write in [
        "delete from messages where seq > 2",
        "update sessions set context_limit = 1000",
    ] {
        let e = sqlite3(&backup, write).unwrap_err();
        assert!(e.contains("compactd"), "{write}: {e}");
    }

    daemon.kill9();
    assert_eq!(counted(&db, "s"), acked);
    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
    daemon.spawn();
    assert_eq!(all_messages(&daemon.client(), "s").await.len(), acked);
}

/// An outside `sqlite3` write under `.timeout`: it retries a busy lock for `wait_ms` as the
/// CLI's own `.restore` retries by itself. Whether it got the lock, and what it said.
fn outside_write(db: &Path, wait_ms: u32, sql: &str) -> Result<String, String> {
    let out = Command::new("sqlite3")
        .args(["-cmd", &format!(".timeout {wait_ms}")])
        .arg(db)
        .arg(sql)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.success() && stderr.is_empty() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(stderr),
    }
}

/// While four clients append as fast as they can, 40 `.restore`s of an older copy and 40
/// hand-written transactions (a trigger dropped, messages deleted) run from outside, each
/// retrying a busy lock. The lock was free in the instant after each commit, and under load
/// every `.restore` got it within a few tries and replaced the live database: thousands of
/// acknowledged appends were gone after a restart. Now the writer keeps the lock between
/// its transactions: every try fails, and after kill -9 every acknowledged append is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_load_no_outside_restore_or_ddl_takes_the_write_lock() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let mut daemon = TestDaemon::start("");
    let db = daemon.db();
    let mut acked = [0usize; 4];
    for i in 0..4 {
        acked[0] += step(&daemon.client(), "c0", i).await;
    }
    let backup = backed_up(&daemon);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appenders: Vec<_> = (0..4)
        .map(|c| {
            let (client, stop) = (daemon.client(), stop.clone());
            tokio::spawn(async move {
                let mut acked = 0;
                for i in 100.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    acked += step(&client, &format!("c{c}"), i).await;
                }
                acked
            })
        })
        .collect();
    let restore = format!(".restore '{}'", backup.display());
    let ddl = "begin immediate; drop trigger messages_delete_by_hand; \
               delete from messages; pragma user_version = 0; commit;";
    let outcomes = tokio::task::spawn_blocking({
        let db = db.clone();
        move || {
            std::thread::scope(|scope| {
                let tries: Vec<_> = (0..8)
                    .map(|t| {
                        let (db, restore) = (&db, &restore);
                        scope.spawn(move || {
                            (0..10)
                                .map(|n| match (t + n) % 2 {
                                    0 => outside_write(db, 0, restore),
                                    _ => outside_write(db, 300, ddl),
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                tries
                    .into_iter()
                    .flat_map(|t| t.join().unwrap())
                    .collect::<Vec<_>>()
            })
        }
    })
    .await
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (c, appender) in appenders.into_iter().enumerate() {
        acked[c] += appender.await.unwrap();
    }
    assert_eq!(outcomes.len(), 80);
    for outcome in &outcomes {
        let refused = outcome.as_ref().unwrap_err();
        assert!(
            refused.contains("locked") || refused.contains("busy"),
            "{refused}"
        );
    }
    assert!(
        acked.iter().all(|&n| n > 20),
        "the clients appended meanwhile: {acked:?}"
    );

    daemon.kill9();
    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
    daemon.spawn();
    for (c, acked) in acked.iter().enumerate() {
        let served = all_messages(&daemon.client(), &format!("c{c}")).await.len();
        assert_eq!(
            served, *acked,
            "client {c}'s acknowledged appends are all served"
        );
    }
}

/// A daemon whose session `s` took four steps, folded into the database file by an outside
/// `pragma wal_checkpoint`; and how many messages those are.
async fn four_steps_in_the_file() -> (TestDaemon, usize) {
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let mut messages = 0;
    for i in 0..4 {
        messages += step(&client, "s", i).await;
    }
    sqlite3(&daemon.db(), "pragma wal_checkpoint").unwrap();
    (daemon, messages)
}

/// A person's backup of the live database (`sqlite3 .backup`), beside it as `old.db`.
fn backed_up(daemon: &TestDaemon) -> std::path::PathBuf {
    let copy = daemon.dir.path().join("old.db");
    sqlite3(&daemon.db(), &format!(".backup '{}'", copy.display())).unwrap();
    copy
}

/// Waits (at most 10 s) for `/health` to say writes are refused.
async fn until_refusing(daemon: &TestDaemon) {
    let client = daemon.client();
    let noticed = crate::common::eventually(Duration::from_secs(10), || async {
        let health = client.get("/health").await.ok()?;
        (health["status"] == "refusing_writes").then_some(())
    })
    .await;
    assert!(noticed.is_some(), "{}", daemon.log());
}

/// The WALs set aside beside the database.
fn set_aside_wals(daemon: &TestDaemon) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(daemon.dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().contains(".db-wal.overwritten-"))
        .collect()
}

/// Restarts the daemon: it serves session `s` with `messages` messages, takes one more step,
/// and after kill -9 the system `sqlite3` finds them all in a sound file.
async fn restarted_serves(daemon: &mut TestDaemon, messages: usize) {
    daemon.spawn();
    let client = daemon.client();
    assert_eq!(all_messages(&client, "s").await.len(), messages);
    let more = step(&client, "s", 999).await;
    assert_eq!(client.get("/health").await.unwrap()["status"], "ok");
    daemon.kill9();
    assert_eq!(counted(&daemon.db(), "s"), messages + more);
    assert_eq!(
        sqlite3(&daemon.db(), "pragma integrity_check").unwrap(),
        "ok"
    );
}

/// `cp old.db compactd.db` over the live database, then a restart: a copy restored as any
/// file would be. Locks do not stop `cp`: the file then held the copy's old pages under the
/// WAL's newer ones, the next append was acknowledged into a file `PRAGMA integrity_check`
/// found malformed, and stopping folded the WAL into the copy. Now the file, smaller than it
/// was, is noticed: nothing more is acknowledged, and stopping sets the WAL aside, so the
/// restarted daemon serves the copy as copied and takes writes again.
#[tokio::test]
async fn a_copy_over_the_live_database_is_noticed_and_kept_as_copied() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    // A person folds the WAL into the file and copies it; the session goes on past another
    // fold, and beyond it (so the WAL holds frames the file has not, and the copy is only a
    // little smaller than the file).
    let (mut daemon, copied) = four_steps_in_the_file().await;
    let client = daemon.client();
    let db = daemon.db();
    let copy = backed_up(&daemon);
    for i in 4..8 {
        step(&client, "s", i).await;
    }
    sqlite3(&db, "pragma wal_checkpoint").unwrap();
    for i in 8..11 {
        step(&client, "s", i).await;
    }
    let sizes = [&copy, &db].map(|path| std::fs::metadata(path).unwrap().len());
    assert!(sizes[0] < sizes[1], "{sizes:?}");

    std::fs::copy(&copy, &db).unwrap();
    for attempt in 0..3 {
        let refused = client
            .post(
                "/session/s/message",
                &user(&format!("after the copy {attempt}")),
            )
            .await;
        let (status, message) = crate::common::api_error(refused.unwrap_err());
        assert_eq!(status, 503, "{message}");
        assert!(
            message.contains("overwritten") && message.contains("Restart compactd"),
            "{message}"
        );
    }
    assert_eq!(daemon.log().matches("refusing writes").count(), 1);
    // Nor is a context read from the mix of old pages and the WAL's.
    let refused = client.get("/session/s/context").await;
    assert_eq!(crate::common::api_error(refused.unwrap_err()).0, 503);
    // What a person checking on the daemon sees.
    crate::common::assert_refusing_writes(&client, "overwritten").await;
    let status = status_of(&daemon);
    assert!(
        status.contains("; WRITES REFUSED: ") && status.contains("overwritten"),
        "{status}"
    );
    assert!(daemon.terminate().success(), "{}", daemon.log());

    // The copy as copied, nothing of the WAL folded into it; the WAL kept beside it.
    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
    assert_eq!(counted(&db, "s"), copied);
    let aside = set_aside_wals(&daemon);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(std::fs::metadata(&aside[0]).unwrap().len() > 0);
    assert!(!wal(&db).exists());

    restarted_serves(&mut daemon, copied).await;

    // Once more, the daemon killed before it stops (so before it sets the WAL aside): it is
    // noticed while idle, and the next daemon sets the WAL aside as it starts.
    daemon.spawn();
    let client = daemon.client();
    sqlite3(&db, "pragma wal_checkpoint").unwrap();
    for i in 100..103 {
        step(&client, "s", i).await;
    }
    std::fs::copy(&copy, &db).unwrap();
    until_refusing(&daemon).await;
    daemon.kill9();
    restarted_serves(&mut daemon, copied).await;
    assert!(daemon.log().contains("set aside now"), "{}", daemon.log());
    let set_aside = set_aside_wals(&daemon);
    assert_eq!(
        set_aside.len(),
        2,
        "each WAL kept under its own name: {set_aside:?}"
    );
}

/// The database file's mark, SQLite's `application_id` in its header, as the file holds it.
fn mark_in_file(db: &Path) -> u32 {
    let bytes = std::fs::read(db).unwrap();
    u32::from_be_bytes(bytes[68..72].try_into().unwrap())
}

/// Writes `copy` over `db` in place, as `dd conv=notrunc` would: the file keeps its size.
fn copy_in_place(copy: &Path, db: &Path) {
    use std::io::Write;
    let before = std::fs::metadata(db).unwrap().len();
    let old = std::fs::read(copy).unwrap();
    assert!(
        old.len() as u64 <= before,
        "the copy is no larger than the file"
    );
    let mut file = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    file.write_all(&old).unwrap();
    assert_eq!(
        std::fs::metadata(db).unwrap().len(),
        before,
        "as large as it was"
    );
}

/// Steps until the daemon's own checkpoint (its WAL past 1,000 pages) put a newer mark in
/// the file than `copy` holds, then three more, in a WAL started over: the steps the
/// checkpoint put in the file are in it alone. Returns the next step's number.
async fn past_a_checkpoint_of_the_daemons(client: &Client, db: &Path, copy: &Path) -> usize {
    let backed_up = mark_in_file(copy);
    let mut i = 1_000;
    while mark_in_file(db) <= backed_up {
        assert!(i < 3_000, "no checkpoint after 2,000 steps");
        i += 1;
        step(client, "s", i).await;
    }
    for _ in 0..3 {
        i += 1;
        step(client, "s", i).await;
    }
    i + 1
}

/// A backup put back over the live database in place (as large as the file, so its size
/// tells nothing) after a checkpoint put newer steps in the file: SQLite reads checkpointed
/// pages from the file alone, and those are the copy's now. Before, the next 10 appends were
/// acknowledged into that mix, then reads failed `database disk image is malformed` and the
/// file failed `integrity_check`. Now the file's mark, raised before every checkpoint of the
/// daemon's and every 100 ms for anyone's, is found older than it was: nothing more is
/// acknowledged or read, and the restarted daemon serves the copy as copied. Twice: after the
/// daemon's own checkpoint (its WAL past 1,000 pages) and more steps, and right after a
/// person's `pragma wal_checkpoint` a moment after the backup (the file, holding the whole
/// WAL, must hold the mark committed last).
#[tokio::test]
async fn a_copy_as_large_as_the_live_database_is_noticed_by_its_mark() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mut daemon, _) = four_steps_in_the_file().await;
    let db = daemon.db();
    for by_whom in ["the daemon", "a person"] {
        let client = daemon.client();
        let copy = backed_up(&daemon);
        let copied = counted(&copy, "s");
        if by_whom == "the daemon" {
            past_a_checkpoint_of_the_daemons(&client, &db, &copy).await;
        } else {
            // The mark is raised by a commit 100 ms or more after the last raise; the copy is
            // put in place right after the person's checkpoint, before any commit.
            tokio::time::sleep(Duration::from_millis(150)).await;
            step(&client, "s", 5_000).await;
            sqlite3(&db, "pragma wal_checkpoint").unwrap();
        }
        copy_in_place(&copy, &db);

        let refused = client
            .post("/session/s/message", &user("after the copy"))
            .await;
        let Err(refused) = refused else {
            panic!("{by_whom}: acknowledged into the copy: {refused:?}");
        };
        let (status, message) = crate::common::api_error(refused);
        assert_eq!(status, 503, "{by_whom}: {message}");
        assert!(message.contains("older state"), "{by_whom}: {message}");
        assert_eq!(
            crate::common::api_error(client.get("/session/s/context").await.unwrap_err()).0,
            503
        );
        crate::common::assert_refusing_writes(&client, "older state").await;
        assert!(daemon.terminate().success(), "{}", daemon.log());
        assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
        assert_eq!(counted(&db, "s"), copied, "{by_whom}: the copy as copied");
        restarted_serves(&mut daemon, copied).await;
        daemon.spawn();
    }
    assert_eq!(set_aside_wals(&daemon).len(), 2);
}

/// The daemon killed, a backup copied over its database, the WAL left beside it (the README
/// says to remove it; a person in a hurry does not), the daemon started: SQLite would fold
/// the WAL, written over a newer state of the file, into the copy. The WAL's first frames
/// carry the mark the file held when it began, newer than the copy's: the starting daemon
/// sets the WAL aside and serves the copy as copied, sound.
#[tokio::test]
async fn a_copy_put_in_place_after_a_kill_under_the_old_wal_is_served_as_copied() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mut daemon, _) = four_steps_in_the_file().await;
    let client = daemon.client();
    let db = daemon.db();
    let copy = backed_up(&daemon);
    let copied = counted(&copy, "s");
    past_a_checkpoint_of_the_daemons(&client, &db, &copy).await;
    daemon.kill9();
    assert!(std::fs::metadata(wal(&db)).unwrap().len() > 0);
    std::fs::copy(&copy, &db).unwrap();

    restarted_serves(&mut daemon, copied).await;
    assert!(
        daemon.log().contains("older state than its WAL"),
        "{}",
        daemon.log()
    );
    assert_eq!(set_aside_wals(&daemon).len(), 1);
}

/// `: > compactd.db-wal` while the daemon waits for its agent's next step: the WAL looks like
/// a log that can be emptied to free its space, and every write since the last checkpoint
/// is in it alone. The next append was acknowledged into the emptied file, and at stop the
/// database was no longer one (`file is not a database`: all 21 messages gone). Now the
/// emptied WAL is noticed before the next write: nothing more is acknowledged, stopping sets
/// it aside instead of folding its holes into the database, and the restarted daemon serves
/// what the last checkpoint put in the file, sound, and takes writes again.
#[tokio::test]
async fn a_wal_emptied_between_steps_is_noticed_and_the_checkpointed_state_kept() {
    a_wal_emptied_is_noticed(Emptied::WhileTheAgentWaits).await;
}

/// The same, emptied right before the agent's next append, with nothing between: the write
/// looks at the WAL before it commits. When the look came every 50 ms at most, this append
/// was acknowledged into the emptied file, its frames past a hole that made the WAL look
/// whole again.
#[tokio::test]
async fn a_wal_emptied_right_before_a_write_refuses_that_write() {
    a_wal_emptied_is_noticed(Emptied::RightBeforeTheNextWrite).await;
}

enum Emptied {
    WhileTheAgentWaits,
    RightBeforeTheNextWrite,
}

async fn a_wal_emptied_is_noticed(when: Emptied) {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mut daemon, checkpointed) = four_steps_in_the_file().await;
    let client = daemon.client();
    let db = daemon.db();
    for i in 4..8 {
        step(&client, "s", i).await;
    }
    match when {
        Emptied::WhileTheAgentWaits => {
            // Indexed for search now, so the idle writer has nothing left to commit; then
            // the agent waits for its model, longer than the writer's idle look comes (every
            // second).
            client.get("/session/s/search?q=cat").await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            std::fs::File::create(wal(&db)).unwrap();
            until_refusing(&daemon).await;
        }
        Emptied::RightBeforeTheNextWrite => std::fs::File::create(wal(&db)).map(drop).unwrap(),
    }
    let refused = client.post("/session/s/message", &user("after")).await;
    let (status, message) = crate::common::api_error(refused.unwrap_err());
    assert_eq!(status, 503, "{message}");
    crate::common::assert_refusing_writes(&client, "-wal was written outside SQLite").await;
    assert!(daemon.terminate().success(), "{}", daemon.log());

    assert_eq!(sqlite3(&db, "pragma integrity_check").unwrap(), "ok");
    assert_eq!(counted(&db, "s"), checkpointed);
    restarted_serves(&mut daemon, checkpointed).await;
}

/// `rm *.db-wal *.db-shm`, an old remedy for a locked database, run while the daemon works.
/// SQLite kept writing to the removed WAL, which the file system frees at exit, and every
/// acknowledged write since the last checkpoint (here all of them, the schema too) went with
/// it; with the index removed, another process builds one of its own and may checkpoint while
/// the daemon writes. Now a removed WAL's frames are folded into the database file at once
/// (at the next write, which looks before it commits, or within the writer's idle second),
/// writes are refused with `storage_gone` rather than acknowledged into a file nobody will
/// find, and a restart takes writes again.
#[tokio::test]
async fn a_wal_or_index_removed_under_the_daemon_loses_no_acknowledged_write() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    // The last: the index first (writes refused), then the WAL, whose frames are still folded.
    let cases = [
        ("-wal", true, None),
        ("-wal", false, None),
        ("-shm", true, None),
        ("-shm", true, Some("-wal")),
    ];
    for (removed, while_writing, then) in cases {
        let case = format!(
            "{removed} removed while {}",
            if while_writing { "writing" } else { "idle" }
        ) + &then.map(|t| format!(", then {t}")).unwrap_or_default();
        let mut daemon = TestDaemon::start("");
        let client = daemon.client();
        let db = daemon.db();
        let mut acked = 0;
        for i in 0..6 {
            acked += step(&client, "w", i).await;
        }
        std::fs::remove_file(format!("{}{removed}", db.display())).unwrap();
        if while_writing {
            // The very next write is refused: none is acknowledged into a removed file.
            let refused = client.post("/session/w/message", &user("more")).await;
            let (status, message) = crate::common::api_error(refused.unwrap_err());
            assert_eq!(status, 503, "{case}");
            assert!(
                message.contains(removed) && message.contains("restart"),
                "{case}: {message}"
            );
            // A client retrying is refused each time, and the log says why once.
            for i in 0..5 {
                let retry = user(&format!("retry {i}"));
                let refused = client.post("/session/w/message", &retry).await;
                assert_eq!(crate::common::api_error(refused.unwrap_err()).0, 503);
            }
        }
        if let Some(then) = then {
            std::fs::remove_file(format!("{}{then}", db.display())).unwrap();
        }
        // What the system sqlite3 finds in the file, the daemon still running: every
        // acknowledged write (once a removed WAL is folded in).
        let found = crate::common::eventually(Duration::from_secs(30), || async {
            let seen = sqlite3(&db, "select count(*) from messages where session_id = 'w'")
                .ok()?
                .parse::<usize>()
                .ok()?;
            (seen == acked).then_some(seen)
        })
        .await;
        assert_eq!(found, Some(acked), "{case}");
        // The log says why once per file removed. The WAL removed second is told within the
        // writer's idle look, which may come after sqlite3 already finds every write: the
        // index's removal had the WAL folded into the file.
        let expected = 1 + usize::from(then.is_some());
        let said = crate::common::eventually(Duration::from_secs(30), || async {
            let said = daemon.log().matches("refusing writes").count();
            (said >= expected).then_some(said)
        })
        .await;
        assert_eq!(said, Some(expected), "{case}: {}", daemon.log());
        daemon.kill9();
        assert_eq!(counted(&db, "w"), acked, "{case}, after kill -9");
        assert_eq!(
            sqlite3(&db, "pragma integrity_check").unwrap(),
            "ok",
            "{case}"
        );
        daemon.spawn();
        let client = daemon.client();
        acked += step(&client, "w", 99).await;
        daemon.kill9();
        assert_eq!(
            counted(&db, "w"),
            acked,
            "{case}: after a restart, writes are taken again"
        );
    }
}

/// A daemon proxying to a model that never refuses for length, and a conversation begun.
fn proxying_daemon() -> (TestDaemon, crate::common::mock_model::MockModel, Vec<Value>) {
    let mock = crate::common::mock_model::MockModel::roomy();
    let daemon = TestDaemon::builder()
        .config(&format!(
            "[proxy]\nopenai_upstream = \"{}/v1\"\n",
            mock.base
        ))
        .start();
    (daemon, mock, vec![user("Fix the build.")])
}

/// One step of an agent through the proxy (session `agent`): its whole conversation to the
/// model, which must answer and must have seen every message, the newest last; the answer is
/// kept. Returns `x-compactd-unrecorded`, if the answer carried it.
async fn agent_step(
    client: &Client,
    mock: &crate::common::mock_model::MockModel,
    history: &mut Vec<Value>,
    i: usize,
) -> Option<String> {
    // A page's worth of output each: the database file grows as the session does.
    history.push(user(&format!(
        "step {i}: {}",
        "the build log; ".repeat(300)
    )));
    let body = json!({"model": "gpt-test", "messages": history});
    let (status, headers, answer) =
        crate::proxy::call(client, crate::proxy::KEY, Some("agent"), &body).await;
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(status, 200, "step {i}: {answer}");
    let sent = mock.requests().last().unwrap().body["messages"].clone();
    assert_eq!(sent.as_array().unwrap().len(), history.len(), "step {i}");
    let newest = sent[history.len() - 1]["content"].as_str().unwrap();
    assert!(newest.starts_with(&format!("step {i}:")), "step {i}");
    history.push(answer["choices"][0]["message"].clone());
    headers
        .get("x-compactd-unrecorded")
        .map(|v| v.to_str().unwrap().to_string())
}

/// An agent through the proxy does not stop when the daemon refuses writes (its WAL removed
/// under it): its calls go upstream from what the session has stored plus the call's newer
/// messages, unrecorded and marked so, and the refusal is said once in the log, not per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_agent_goes_on_unrecorded_while_writes_are_refused() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (daemon, mock, mut history) = proxying_daemon();
    let client = daemon.client();
    for i in 0..8 {
        if i == 4 {
            std::fs::remove_file(wal(&daemon.db())).unwrap();
        }
        let unrecorded = agent_step(&client, &mock, &mut history, i).await;
        match i < 4 {
            true => assert_eq!(unrecorded, None, "step {i}"),
            false => assert_eq!(unrecorded.as_deref(), Some("storage_gone"), "step {i}"),
        }
    }
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["status"], "refusing_writes", "{health}");
    let log = daemon.log();
    assert_eq!(log.matches("refusing writes").count(), 1, "{log}");
    assert!(!log.contains("store error"), "{log}");
    // What was acknowledged before is in the file: 4 calls, each its new message and answer.
    assert_eq!(counted(&daemon.db(), "agent"), 1 + 4 * 2);
}

/// A person's transaction holds the database's write lock, taken while no daemon held it (here
/// between a stop and a start; a running daemon keeps it from its first write on): a proxied agent does not stop, nor wait. The daemon finds the lock taken when it
/// tries it (`/health` and `compactd status` say so, the log once); each call goes upstream at
/// once with what the session has stored and the call's newer messages, unrecorded and marked
/// `busy`; once the person lets go, the daemon says so within its next idle second, the next
/// call stores all it carries, and the system `sqlite3` finds every message of the
/// conversation once, in order. Before, each call answered 503 `busy`, and an agent retried
/// until it gave up; then each waited the 2 s a write waits for a lock before it went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_agent_goes_on_unrecorded_while_a_person_holds_the_write_lock() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mut daemon, mock, mut history) = proxying_daemon();
    for i in 0..3 {
        let unrecorded = agent_step(&daemon.client(), &mock, &mut history, i).await;
        assert_eq!(unrecorded, None, "step {i}");
    }
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let client = daemon.client();
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["write_lock_held_elsewhere"], true, "{health}");
    assert_eq!(health["status"], "ok", "{health}");
    let status = status_of(&daemon);
    assert!(
        status.contains("WRITE LOCK HELD BY ANOTHER PROCESS"),
        "{status}"
    );
    for i in 3..6 {
        let started = std::time::Instant::now();
        let unrecorded = agent_step(&client, &mock, &mut history, i).await;
        assert_eq!(unrecorded.as_deref(), Some("busy"), "step {i}");
        // A write waits 2 s for the lock before it fails: a call that tried one took longer.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "step {i} waited for the lock: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(counted(&daemon.db(), "agent"), 1 + 3 * 2, "nothing written");
    crate::common::let_go(person, &client).await;
    let unrecorded = agent_step(&client, &mock, &mut history, 6).await;
    assert_eq!(unrecorded, None);
    crate::common::assert_stored_whole(&daemon.db(), "agent", &history);
    let log = daemon.log();
    assert_eq!(
        log.matches("another process holds the database's write lock")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("write lock is free again").count(), 1, "{log}");
}

/// A model of a `window`-token window (the limit compactd is told), its tokenizer counting a
/// token every `chars_per_token` characters, answering each call with a `cat` (its usage
/// saying 1,000 input tokens, a count no larger call believes); a daemon proxying to it; and
/// an agent's conversation before its first call.
fn reading_modules(window: usize, chars_per_token: usize) -> (MockModel, TestDaemon, Vec<Value>) {
    let script = (0..80)
        .map(|i| Reply::Fitting {
            window,
            chars_per_token,
            then: Box::new(raw(tool_call_answer(i), false)),
        })
        .collect();
    let mock = MockModel::start(script, Reply::status(500, "{}"));
    let daemon = TestDaemon::start(&format!(
        "[compaction]\ndefault_context_limit = {window}\n[proxy]\nopenai_upstream = \"{}/v1\"\n",
        mock.base
    ));
    let history = vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "Read every module, then say which one defines main."}),
    ];
    (mock, daemon, history)
}

/// One step of the agent of [`reading_modules`] (session `agent`): its whole conversation
/// to the model, which must answer; its answer (a `cat`) and the output, `lines` lines, kept.
/// Returns `x-compactd-unrecorded`.
async fn read_module(
    client: &Client,
    history: &mut Vec<Value>,
    i: usize,
    lines: usize,
) -> Option<String> {
    let body = json!({"model": "gpt-test", "messages": history});
    let (status, headers, answer) = call(client, KEY, Some("agent"), &body).await;
    assert_eq!(
        status,
        200,
        "step {i}: {}",
        String::from_utf8_lossy(&answer)
    );
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    let answer = &answer["choices"][0]["message"];
    history.push(answer.clone());
    history.push(
        json!({"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"],
        "content": format!("module {i}: {}", "def f(): pass\n".repeat(lines))}),
    );
    headers
        .get("x-compactd-unrecorded")
        .map(|v| v.to_str().unwrap().to_string())
}

/// A model that counts twice compactd's estimate, its usage reports unbelievable, while a
/// person holds the write lock: compactd's estimate of an unrecorded call falls short of the
/// model's count, and the first call past the window is refused (as OpenAI refuses it). That
/// call is compacted to what the refusal counted and sent once more, so the agent gets its
/// answer; what the refusal taught is kept for the conversation's later calls, none refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_call_refused_as_too_long_is_compacted_and_sent_once_more() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mock, mut daemon, mut history) = reading_modules(32_000, 2);
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let client = daemon.client();
    for i in 0..60 {
        let unrecorded = read_module(&client, &mut history, i, 200).await;
        assert_eq!(unrecorded.as_deref(), Some("busy"), "step {i}");
    }
    // The model's count of each call (as the mock counts), and the refusals among them.
    let counts: Vec<usize> = mock
        .requests()
        .iter()
        .map(|r| r.body["messages"].to_string().len() / 2)
        .collect();
    let refused: Vec<usize> = counts.iter().copied().filter(|c| *c > 32_000).collect();
    assert_eq!(refused.len(), 1, "{counts:?}");
    assert_eq!(counts.len(), 61, "{counts:?}");
    let log = daemon.log();
    assert!(log.contains("compacted in memory"), "{log}");
    crate::common::let_go(person, &client).await;
}

/// A person holds the write lock for long while an agent works through the proxy: its
/// conversation grows past the model's window with nothing stored. Every call still reaches
/// the model inside its window (the mock counts tokens and refuses a longer call as OpenAI
/// does): past the session's trigger, the stored context and the call's newer messages are
/// compacted in memory with the built-in summarizer, unrecorded like the rest, the newest
/// messages verbatim after the summary (an output larger than the window shortened, its head
/// and tail kept, as an append shortens it), each tool result after its call; the summary keeps
/// what the agent did while nothing was stored (the task, every file read). That
/// compaction serves the calls after it, as a stored one would: the same summary, byte for
/// byte, until they pass the trigger again. Once the lock is free, the next call stores every
/// message of the conversation, once, in order, and the session compacts as it would have.
/// Before, each call past the window was refused, and the agent stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_hold_of_the_write_lock_never_sends_a_proxied_agent_past_its_window() {
    use crate::proxy::no_orphans;
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (mock, mut daemon, mut history) = reading_modules(16_000, 4);
    // Each output about 700 tokens; one, in the middle of the outage, four times the window
    // (a log read whole).
    async fn step(client: &Client, history: &mut Vec<Value>, i: usize) -> Option<String> {
        read_module(client, history, i, if i == 30 { 20_000 } else { 200 }).await
    }
    for i in 0..3 {
        assert_eq!(step(&daemon.client(), &mut history, i).await, None);
    }
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let client = daemon.client();
    // About 700 tokens a step: the window's worth twice over while nothing is stored.
    let mut summaries = Vec::new();
    for i in 3..48 {
        assert_eq!(
            step(&client, &mut history, i).await.as_deref(),
            Some("busy")
        );
        let sent = mock.requests().last().unwrap().body["messages"].clone();
        let sent = sent.as_array().unwrap();
        no_orphans(sent);
        // The call's newest message is last, as the agent sent it (the log shortened).
        let (newest, sent_newest) = (&history[history.len() - 3], &sent[sent.len() - 1]);
        match i {
            31 => {
                let shown = sent_newest["content"].as_str().unwrap();
                assert!(shown.starts_with("module 30: def f()"), "{shown:.100}");
                assert!(shown.contains("characters cut here; the whole message is"));
                assert!(shown.len() * 4 < newest["content"].as_str().unwrap().len());
                assert_eq!(sent_newest["tool_call_id"], newest["tool_call_id"]);
            }
            _ => assert_eq!(sent_newest, newest, "step {i}"),
        }
        let summary = sent
            .iter()
            .filter_map(|m| m["content"].as_str())
            .find(|text| text.contains("Summary of it"));
        summaries.extend(summary.map(str::to_string));
    }
    // A few compactions, each serving the calls after it unchanged.
    let compactions = daemon.log().matches("compacted in memory").count();
    let mut distinct = summaries.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), compactions, "{compactions} compactions");
    assert!(
        compactions * 3 < summaries.len(),
        "{compactions} compactions for {} calls",
        summaries.len()
    );
    // The system message, the task, three answers and the two outputs sent after them.
    assert_eq!(counted(&daemon.db(), "agent"), 7, "nothing written");
    // The last call's summary covers what was read while nothing was stored.
    let summary = summaries.last().expect("never compacted");
    for kept in ["which one defines main", "src/mod_30.py"] {
        assert!(summary.contains(kept), "{kept} lost: {summary}");
    }
    // Every file read up to the newest it names, those of the first compaction too: the
    // newest fifteen listed, and how many more.
    let read = summary.split("Read:").nth(1).unwrap();
    let newest: usize = read
        .split("src/mod_")
        .nth(1)
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let more: usize = read
        .split("… and ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .map_or(0, |n| n.parse().unwrap());
    assert_eq!(15 + more, newest + 1, "{read:.900}");
    crate::common::let_go(person, &client).await;
    assert_eq!(step(&client, &mut history, 48).await, None);
    // Stored whole, and the model's last answer after it (its output not sent yet).
    history.pop();
    crate::common::assert_stored_whole(&daemon.db(), "agent", &history);
    let session = client.get("/v1/session/agent").await.unwrap();
    assert!(
        session["compaction_count"].as_u64().unwrap() >= 1,
        "{session}"
    );
}

/// A copy put over the live database, where reads are refused too (a context read from the
/// mix of old pages and the WAL's could be unsound): an agent's call goes upstream as the
/// agent sent it, unrecorded, and the agent goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_agent_goes_on_as_it_sent_when_the_database_was_overwritten() {
    if !have("sqlite3") {
        eprintln!("SKIP: sqlite3 is not installed");
        return;
    }
    let (daemon, mock, mut history) = proxying_daemon();
    let client = daemon.client();
    let db = daemon.db();
    let copy = daemon.dir.path().join("old.db");
    for i in 0..12 {
        match i {
            4 => sqlite3(&db, &format!(".backup '{}'", copy.display())).map(drop),
            8 => sqlite3(&db, "pragma wal_checkpoint").map(drop),
            10 => std::fs::copy(&copy, &db)
                .map(drop)
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        }
        .unwrap();
        let unrecorded = agent_step(&client, &mock, &mut history, i).await;
        match i < 10 {
            true => assert_eq!(unrecorded, None, "step {i}"),
            false => assert_eq!(unrecorded.as_deref(), Some("storage_gone"), "step {i}"),
        }
    }
    crate::common::assert_refusing_writes(&client, "overwritten").await;
}

/// What `compactd status` prints of the daemon.
fn status_of(daemon: &TestDaemon) -> String {
    let out = Command::new(crate::common::BIN)
        .arg("--socket")
        .arg(daemon.socket())
        .arg("status")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
