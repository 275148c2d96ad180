//! A real `compactd serve` child process on a private directory, for `compactd bench` and
//! `compactd torture`: started like systemd starts it (ready once it says `READY=1` on a
//! notify socket, so nothing sleeps and hopes), measured (resident and peak memory), killed
//! with SIGKILL or stopped with SIGTERM, and restarted on the same files.

use anyhow::{Context, Result};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A daemon child process.
pub struct DaemonProcess {
    dir: PathBuf,
    child: Option<Child>,
}

impl DaemonProcess {
    /// Starts a daemon in `dir` with `config` (TOML) and waits until it is ready.
    pub fn start(dir: &Path, config: &str) -> Result<DaemonProcess> {
        // Not beside the database: the config watcher would wake on every WAL write.
        std::fs::create_dir_all(dir.join("config"))?;
        std::fs::write(dir.join("config").join("config.toml"), config)?;
        let mut daemon = DaemonProcess {
            dir: dir.to_path_buf(),
            child: None,
        };
        daemon.spawn()?;
        Ok(daemon)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("compactd.sock")
    }

    pub fn db(&self) -> PathBuf {
        self.dir.join("compactd.db")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts (or restarts) the process on the same files and waits for `READY=1`.
    pub fn spawn(&mut self) -> Result<()> {
        let notify_path = self.dir.join("notify.sock");
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path)?;
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--socket")
            .arg(self.socket())
            .arg("serve")
            .arg("--db")
            .arg(self.db())
            .arg("--config")
            .arg(self.dir.join("config").join("config.toml"))
            .env("NOTIFY_SOCKET", &notify_path)
            .env("COMPACTD_LOG", "error")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start the daemon")?;
        wait_ready(&notify, &mut child, Duration::from_secs(60))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            child.wait()?;
        }
        Ok(())
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Resident memory now, MB.
    pub fn rss_mb(&self) -> Result<f64> {
        self.status_kb("VmRSS:").map(|kb| kb / 1024.0)
    }

    /// The most resident memory the process has had, MB.
    pub fn peak_rss_mb(&self) -> Result<f64> {
        self.status_kb("VmHWM:").map(|kb| kb / 1024.0)
    }

    fn status_kb(&self, field: &str) -> Result<f64> {
        let pid = self.pid().context("the daemon is not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {field} in /proc/{pid}/status"))
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits for `READY=1` on `notify` (a NOTIFY_SOCKET the caller bound and passed to `child`),
/// failing early if the child exits.
pub fn wait_ready(notify: &UnixDatagram, child: &mut Child, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    notify.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match notify.recv(&mut buf) {
            Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("READY=1") => return Ok(()),
            Ok(_) => {}
            Err(_) => {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("the daemon exited with {status} before it was ready");
                }
            }
        }
    }
    anyhow::bail!("the daemon was not ready after {} s", timeout.as_secs())
}
