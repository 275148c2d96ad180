//! The disk fills up under the daemon, or under a backup: a real small file system (a tmpfs
//! mounted for the test, so only where the test runs as root) holds the database or the copy.
//! Ground truth is what the system's `sqlite3` finds in the file.

use crate::common::{TestDaemon, api_error, have, post_with_headers, raw_http, sqlite3, user};
use std::path::PathBuf;
use std::process::Command;

/// A tmpfs of `size` mounted on a temp directory, unmounted when dropped.
struct SmallDisk {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// None where mounting is not allowed (not root, or a container without the right).
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::TempDir::new().unwrap();
        let mount = dir.path().to_path_buf();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&mount)
            .output()
            .is_ok_and(|out| out.status.success());
        mounted.then_some(SmallDisk { mount, _dir: dir })
    }

    /// Frees space, as an operator does by growing or cleaning the disk.
    fn grow(&self, size: &str) {
        let grown = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.mount)
            .status()
            .unwrap();
        assert!(grown.success(), "cannot remount {}", self.mount.display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// A message of about 1 KB: the disk fills after a few hundred.
fn message(i: usize) -> serde_json::Value {
    user(&format!(
        "step {i}: {}",
        "the build log again, line by line; ".repeat(28)
    ))
}

/// Appends are refused with 507 `storage_full` and a Retry-After once the disk is full, and a
/// refused one leaves nothing behind; reads go on; the daemon restarts after kill -9 on the
/// full disk; once space is freed, appends go on from the next seq. Every acknowledged
/// message is in the file (the system `sqlite3` counts them), in order, none twice.
#[tokio::test]
async fn a_full_disk_refuses_appends_loses_nothing_acknowledged_and_recovers() {
    if !have("sqlite3") {
        eprintln!("skipped: no sqlite3 on PATH");
        return;
    }
    let Some(disk) = SmallDisk::mount("3m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let db = disk.mount.join("compactd.db");
    let mut daemon = TestDaemon::builder().db(&db).start();
    let client = daemon.client();

    let mut acknowledged = 0;
    let refusal = loop {
        assert!(acknowledged < 10_000, "3 MiB never filled");
        match client
            .post("/session/s/message", &message(acknowledged))
            .await
        {
            Ok(answer) => {
                acknowledged += 1;
                assert_eq!(answer["last_seq"], acknowledged, "{answer}");
            }
            Err(e) => break api_error(e),
        }
    };
    assert_eq!(refusal.0, 507, "{refusal:?}");
    assert!(refusal.1.contains("disk"), "{refusal:?}");
    // Past the session's 80 messages: it compacted on the way (or tried to, and said why).
    assert!(
        acknowledged > 80,
        "only {acknowledged} messages filled 3 MiB"
    );

    // Still full: the same refusal, with when to try again; nothing stored.
    let body = message(acknowledged).to_string();
    let answer = raw_http(
        &daemon.socket(),
        &post_with_headers("/v1/session/s/message", &body, &[]),
    );
    assert!(answer.starts_with("HTTP/1.1 507"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: "),
        "{answer}"
    );
    assert!(answer.contains("\"storage_full\""), "{answer}");
    let context = client.get("/session/s/context").await.unwrap();
    assert!(
        context["messages"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(
        sqlite3(
            &db,
            "select count(*), max(seq) from messages where session_id = 's'"
        )
        .unwrap(),
        format!("{acknowledged}|{acknowledged}")
    );

    // kill -9 on the full disk, then start again: the file opens and holds every message.
    daemon.restart();
    let (status, _) = api_error(
        client
            .post("/session/s/message", &message(acknowledged))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 507);

    disk.grow("32m");
    let answer = client
        .post("/session/s/message", &message(acknowledged))
        .await
        .unwrap();
    assert_eq!(answer["last_seq"], acknowledged + 1, "{answer}");
    let stored = sqlite3(
        &db,
        "select count(*), count(distinct seq), min(seq), max(seq) from messages where session_id = 's'",
    )
    .unwrap();
    let n = acknowledged + 1;
    assert_eq!(stored, format!("{n}|{n}|1|{n}"));
    // The texts are the ones sent, in order.
    let texts = sqlite3(
        &db,
        "select group_concat(substr(json_extract(parts, '$[0].text'), 1, instr(json_extract(parts, '$[0].text'), ':') - 1), ',') from (select parts from messages where session_id = 's' order by seq)",
    )
    .unwrap();
    let sent: Vec<String> = (0..n).map(|i| format!("step {i}")).collect();
    assert_eq!(texts, sent.join(","));
    assert!(daemon.log().contains("full"), "{}", daemon.log());
}

/// A backup onto a disk that fills: `compactd backup` fails, names the copy's disk (not the
/// database's) and leaves no file behind, so the same path takes the next backup once there is
/// room; that one is whole.
#[tokio::test]
async fn a_backup_onto_a_full_disk_fails_and_leaves_nothing() {
    let Some(disk) = SmallDisk::mount("256k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let daemon = TestDaemon::start("");
    let client = daemon.client();
    let batch: Vec<_> = (0..600).map(message).collect();
    client
        .post(
            "/session/b/message",
            &serde_json::json!({"messages": batch}),
        )
        .await
        .unwrap();
    let copy = disk.mount.join("copy.db");
    let backup = || {
        Command::new(crate::common::BIN)
            .args(["--socket", daemon.socket().to_str().unwrap(), "backup"])
            .arg(&copy)
            .output()
            .unwrap()
    };
    let refused = backup();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("the disk holding the copy is full"), "{said}");
    let left: Vec<_> = std::fs::read_dir(&disk.mount).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    disk.grow("16m");
    let made = backup();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert_eq!(
        sqlite3(&copy, "select count(*) from messages").unwrap(),
        "600"
    );
}
