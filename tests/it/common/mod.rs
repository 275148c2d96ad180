//! Test harness: a real `compactd serve` process on a temp socket, temp database and temp
//! config, started and stopped the way users and systemd do it. Readiness is the daemon's own
//! `READY=1` on a NOTIFY_SOCKET the test owns, so no test sleeps and hopes.

pub mod mock_model;
pub mod model_api;
pub mod random_session;
pub mod vision;

use compactd_api::client::Client;
use serde_json::{Value, json};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_compactd");

pub struct TestDaemon {
    pub dir: TempDir,
    pub child: Option<Child>,
    /// Extra environment for the daemon process (API keys, ...).
    pub env: Vec<(String, String)>,
    socket: Option<PathBuf>,
    db: Option<PathBuf>,
    config_path: Option<PathBuf>,
}

/// How to start a [`TestDaemon`]: its config, environment and paths (each defaults to a file
/// in the daemon's own temp dir).
#[derive(Default)]
pub struct Builder {
    config: String,
    env: Vec<(String, String)>,
    socket: Option<PathBuf>,
    db: Option<PathBuf>,
    config_path: Option<PathBuf>,
}

impl Builder {
    /// The config file's TOML.
    pub fn config(mut self, toml: &str) -> Builder {
        self.config = toml.to_string();
        self
    }
    pub fn env(mut self, key: &str, value: &str) -> Builder {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
    pub fn socket(mut self, path: impl Into<PathBuf>) -> Builder {
        self.socket = Some(path.into());
        self
    }
    pub fn db(mut self, path: impl Into<PathBuf>) -> Builder {
        self.db = Some(path.into());
        self
    }
    /// Where the config file is; the builder's config is written there only if its
    /// directory exists.
    pub fn config_path(mut self, path: impl Into<PathBuf>) -> Builder {
        self.config_path = Some(path.into());
        self
    }

    /// The daemon, not started yet.
    pub fn build(self) -> TestDaemon {
        let dir = TempDir::new().unwrap();
        let daemon = TestDaemon {
            dir,
            child: None,
            env: self.env,
            socket: self.socket,
            db: self.db,
            config_path: self.config_path,
        };
        let config = daemon.config_path();
        if config.parent().is_some_and(Path::exists) {
            std::fs::write(config, self.config).unwrap();
        }
        daemon
    }

    /// Starts the daemon and waits for its READY=1.
    pub fn start(self) -> TestDaemon {
        let mut daemon = self.build();
        daemon.spawn();
        daemon
    }
}

impl TestDaemon {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Starts a daemon with `config` (TOML) as its config file.
    pub fn start(config: &str) -> TestDaemon {
        TestDaemon::builder().config(config).start()
    }

    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> TestDaemon {
        env.iter()
            .fold(TestDaemon::builder().config(config), |b, (k, v)| {
                b.env(k, v)
            })
            .start()
    }

    pub fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.dir.path().join("compactd.sock"))
    }
    pub fn db(&self) -> PathBuf {
        self.db
            .clone()
            .unwrap_or_else(|| self.dir.path().join("compactd.db"))
    }
    pub fn config_path(&self) -> PathBuf {
        self.config_path
            .clone()
            .unwrap_or_else(|| self.dir.path().join("config.toml"))
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    pub fn client(&self) -> Client {
        Client::new(self.socket())
    }

    /// The command line that starts this daemon.
    pub fn command(&self) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .arg("--socket")
            .arg(self.socket())
            .arg("--db")
            .arg(self.db())
            .arg("--config")
            .arg(self.config_path())
            .env("COMPACTD_LOG", "info")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Starts (or restarts) the process and waits for READY=1.
    pub fn spawn(&mut self) {
        let notify_path = self.dir.path().join("notify.sock");
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .unwrap();
        let child = self
            .command()
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_ready(&notify, self);
    }

    /// kill -9: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap()
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

/// Waits for the daemon's READY=1 notification (or its early death).
pub fn wait_ready(notify: &UnixDatagram, daemon: &mut TestDaemon) {
    let child = daemon.child.as_mut().expect("spawned");
    if let Err(e) =
        compactd_measure::daemon_process::wait_ready(notify, child, Duration::from_secs(60))
    {
        panic!("{e}:\n{}", daemon.log());
    }
}

/// A child process killed when the guard goes, so a failed assertion leaves nothing running.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for TestDaemon {
    /// Stops the daemon; when a test failed, keeps its directory and prints its log.
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.log();
            let kept = std::mem::replace(&mut self.dir, TempDir::new().unwrap()).keep();
            eprintln!("daemon log ({} kept):\n{}", kept.display(), log);
        }
    }
}

/// Every stored message of a session, following the history's pages.
pub async fn all_messages(client: &Client, session: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .get(&format!(
                "/session/{session}/message?after={after}&limit=1000"
            ))
            .await
            .unwrap();
        all.extend(page["messages"].as_array().unwrap().clone());
        match page["next_after"].as_u64() {
            Some(next) => after = next,
            None => return all,
        }
    }
}

/// A plain user message.
/// Asserts that `/health` says every write is refused, for a reason that mentions `why`.
pub async fn assert_refusing_writes(client: &Client, why: &str) {
    let health = client.get("/health").await.unwrap();
    assert_eq!(health["status"], "refusing_writes", "{health}");
    let reason = health["writes_refused"].as_str().unwrap_or_default();
    assert!(reason.contains(why), "{health}");
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// An assistant message calling `bash` with `command`, and the tool message answering it.
pub fn bash_round(id: &str, command: &str, output: &str) -> [Value; 2] {
    [
        json!({"role": "assistant", "parts": [
            {"type": "text", "text": format!("Running {command}")},
            {"type": "tool_call", "id": id, "name": "bash", "args": {"command": command}}]}),
        json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": id, "output": output}]}),
    ]
}

/// The status and message of an API error (the test fails on any other error).
pub fn api_error(e: compactd_api::client::ClientError) -> (u16, String) {
    match e {
        compactd_api::client::ClientError::Api {
            status, message, ..
        } => (status, message),
        other => panic!("expected an API error, got {other}"),
    }
}

/// A free loopback port (for a proxy listener).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The system `sqlite3` on `db`, as a person runs it with `.timeout` set: compactd's writer
/// holds the write lock for the moment of each commit (and of indexing new messages for
/// search, right after a burst of appends), so a write by hand may find it taken.
pub fn sqlite3(db: &Path, sql: &str) -> Result<String, String> {
    sqlite3_of(Path::new("sqlite3"), db, sql)
}

/// [`sqlite3`] with the `sqlite3` program at `program` (another version than the system's).
pub fn sqlite3_of(program: &Path, db: &Path, sql: &str) -> Result<String, String> {
    let out = Command::new(program)
        .args(["-cmd", ".timeout 2000"])
        .arg(db)
        .arg(sql)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Asserts that the system `sqlite3` finds in `db` every message of a proxied conversation
/// (session `session`, each message's text, or a tool message's output, opening with what
/// `history`'s does) once, in order.
pub fn assert_stored_whole(db: &Path, session: &str, history: &[serde_json::Value]) {
    let stored = sqlite3(
        db,
        &format!(
            "select count(*), group_concat(substr(coalesce(json_extract(parts, '$[0].text'), json_extract(parts, '$[0].output'), ''), 1, 8), '|') from (select parts from messages where session_id = '{session}' order by seq)"
        ),
    )
    .unwrap();
    let expected: Vec<String> = history
        .iter()
        .map(|m| m["content"].as_str().unwrap().chars().take(8).collect())
        .collect();
    assert_eq!(stored, format!("{}|{}", history.len(), expected.join("|")));
}

/// Whether a program is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Sends `request` (raw HTTP bytes) on a fresh connection and reads until the daemon closes it
/// or `Connection: close` framing ends; returns what came back.
pub fn raw_http(socket: &Path, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // A daemon that refuses the connection (503 at the limit) may close before reading it all.
    let _ = stream.write_all(request);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A POST of a JSON body with extra headers, as raw HTTP.
pub fn post_with_headers(path: &str, body: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    format!(
        "POST {path} HTTP/1.1\r\nHost: compactd\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The daemon's process id, from /health.
pub async fn daemon_pid(client: &Client) -> u32 {
    client.get("/health").await.unwrap()["pid"]
        .as_u64()
        .unwrap() as u32
}

/// Retries `check` every 50 ms until it returns `Some`, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next event; the timeout only turns a hang into a failure.
pub async fn next_event(events: &mut compactd_api::client::EventStream) -> (String, Value) {
    tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("event within 30 s")
        .expect("stream open")
        .unwrap()
}

/// Writes the daemon's config the way editors do: a new file renamed over the old one.
pub fn edit_config(daemon: &TestDaemon, text: &str) {
    let tmp = daemon.dir.path().join(".config.toml.swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, daemon.config_path()).unwrap();
}

/// Skips events until one named `name` comes (each within 30 s, as [`next_event`]).
pub async fn wait_for_event(events: &mut compactd_api::client::EventStream, name: &str) -> Value {
    loop {
        let (event, data) = next_event(events).await;
        if event == name {
            return data;
        }
    }
}

/// The shared real transcripts (Claude Code, mini-swe-agent, SWE-agent), sorted, or `None`
/// (the caller skips, saying so) where ../shared/transcripts is absent.
pub fn shared_transcripts() -> Option<Vec<PathBuf>> {
    let root = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/transcripts"
    ));
    if !root.exists() {
        eprintln!("SKIP: {} is absent", root.display());
        return None;
    }
    let mut files: Vec<PathBuf> = ["claude-code", "mini-swe-agent", "swe-agent"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    Some(files)
}

/// A command summarizer held by two named pipes in `dir`: it writes a line to `started` once
/// it runs (so the compaction's plan is made), then waits for a line on `gate` before it
/// answers a summary whose section 1 is `body`. Returns (started, gate, the command line).
pub fn gated_summarizer(dir: &Path, body: &str) -> (PathBuf, PathBuf, String) {
    let (started, gate) = (dir.join("started"), dir.join("gate"));
    for fifo in [&started, &gate] {
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    }
    let command = format!(
        "cat > /dev/null; echo up > '{}'; read line < '{}'; printf '## 1. Primary Request and Intent\\\\n{body}'",
        started.display(),
        gate.display()
    );
    (started, gate, command)
}

/// A tmpfs of `size` mounted on a temp directory, unmounted when dropped.
pub struct SmallDisk {
    pub mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// None where mounting is not allowed (not root, or a container without the right).
    pub fn mount(size: &str) -> Option<SmallDisk> {
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
    pub fn grow(&self, size: &str) {
        let grown = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.mount)
            .status()
            .unwrap();
        assert!(grown.success(), "cannot remount {}", self.mount.display());
    }

    /// Fills the disk with a file of zeros, all but `free` bytes of it; returns the file.
    pub fn fill_leaving(&self, free: u64) -> PathBuf {
        use std::io::Write;
        let path = self.mount.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.flush();
        let written = file.metadata().unwrap().len();
        file.set_len(written.saturating_sub(free)).unwrap();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Restarts `daemon` while a person's transaction (as `sqlite3` leaves one open) holds its
/// database's write lock, taken between the stop and the start (while a daemon runs, it holds
/// the lock itself). Returns the person's connection, for [`let_go`].
pub fn restart_under_a_held_lock(daemon: &mut TestDaemon) -> rusqlite::Connection {
    assert!(daemon.terminate().success());
    let person = rusqlite::Connection::open(daemon.db()).unwrap();
    person.execute_batch("BEGIN IMMEDIATE").unwrap();
    daemon.spawn();
    person
}

/// The person lets go of the write lock; returns once the daemon (its `/health`) says it
/// noticed, within its next idle second.
pub async fn let_go(person: rusqlite::Connection, client: &Client) {
    person.execute_batch("ROLLBACK").unwrap();
    drop(person);
    let free = eventually(Duration::from_secs(10), || async {
        let health = client.get("/health").await.unwrap();
        health
            .get("write_lock_held_elsewhere")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(free.is_some(), "the lock's release was never noticed");
}
