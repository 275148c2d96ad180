//! The Python and TypeScript client libraries, their own tests and their examples, against
//! real daemons (this binary). Skipped, with a message, where python3 or node is missing.

use crate::common::{TestDaemon, have};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_compactd");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn run(command: &mut Command) -> String {
    let out = command.env("COMPACTD_BIN", BIN).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn python_client_tests_and_example() {
    if !have("python3") {
        eprintln!("SKIP: python3 is not installed");
        return;
    }
    let out = run(Command::new("python3")
        .args([
            "-W",
            "error::ResourceWarning",
            "-m",
            "unittest",
            "discover",
            "-v",
        ])
        .arg(format!("{ROOT}/clients/python/tests")));
    assert!(out.contains("Ran 4 tests") && out.contains("OK"), "{out}");
    let daemon = TestDaemon::start("");
    let out = run(Command::new("python3")
        .arg(format!("{ROOT}/clients/python/examples/loop.py"))
        .arg(daemon.socket())
        .env("PYTHONPATH", format!("{ROOT}/clients/python")));
    assert!(out.contains("messages ready for the model"), "{out}");
    assert!(
        out.contains("compaction_started\ncompaction_finished"),
        "{out}"
    );
}

#[test]
fn typescript_client_tests_and_example() {
    if !have("node") {
        eprintln!("SKIP: node is not installed");
        return;
    }
    let out = run(Command::new("node")
        .arg("--test")
        .arg(format!("{ROOT}/clients/typescript/test/")));
    assert!(
        out.contains("# pass 4") && out.contains("# fail 0"),
        "{out}"
    );
    let daemon = TestDaemon::start("");
    let out = run(Command::new("node")
        .arg(format!("{ROOT}/clients/typescript/examples/loop.js"))
        .arg(daemon.socket()));
    assert!(out.contains("messages ready for the model"), "{out}");
    assert!(
        out.contains("compaction_started\ncompaction_finished"),
        "{out}"
    );
}
