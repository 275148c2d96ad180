//! Config hot reload: watch the config file's directory (editors replace files rather than
//! write them in place), debounce the burst of events an edit makes, re-parse, and put the new
//! config in force. An invalid edit is logged, reported in `/health`, and changes nothing:
//! the old config stays. SIGHUP reloads too (`systemctl --user reload compactd`), also when
//! the watcher could not be set up.
//!
//! Only changes count: reading the file (which the reload itself does) is not an edit, and a
//! file whose bytes did not change is neither reapplied nor re-rejected. A config put in force
//! starts the compactions it makes due, as a start does (`daemon::resume`).

use crate::config::Config;
use crate::service::{Event, Service};
use notify::{RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Edits closer together than this are one reload.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// While the config on disk is rejected, it is said again this often: the next start (after a
/// reboot, say) refuses it, and the first warning may be long out of sight.
const REJECTED_REMINDER: Duration = Duration::from_secs(15 * 60);

/// Starts watching `path`; reloads run until the service shuts down.
pub(crate) fn spawn(path: PathBuf, service: Arc<Service>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    // Keep a sender here too, so a missing watcher leaves the channel open (and SIGHUP works).
    let watcher = start_watcher(&path, tx.clone());
    let shutdown = service.shutdown_token();
    // Read now, before the daemon says it is ready: read in the task, it could see an edit
    // made right after the start as the file's first state, and never apply it.
    // Read as the config is (a regular file, bounded): a FIFO put there would block a worker.
    let mut last = crate::config::read_config_file(&path).ok();
    tokio::spawn(async move {
        // Keep the watcher and the sender alive as long as this task.
        let _watcher = (watcher, tx);
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut reminder = tokio::time::interval(REJECTED_REMINDER);
        reminder.tick().await;
        loop {
            let forced = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = reminder.tick() => {
                    if let Some(error) = service.config_status().error {
                        tracing::warn!(path = %path.display(), %error, "the config on disk is still rejected; the previous one stays in force until it is fixed (a start with an invalid config fails)");
                    }
                    continue;
                }
                event = rx.recv() => {
                    if event.is_none() { break; }
                    // Let the editor finish: swallow events until the file is quiet.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                    false
                }
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            // An event that changed nothing (a touch, an editor's swap file) is not an edit.
            let now = crate::config::read_config_file(&path).ok();
            if forced || now != last {
                last = now;
                reload(&path, &service).await;
            }
        }
    });
}

fn start_watcher(path: &Path, tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // On a fresh machine ~/.config/compactd does not exist yet; without it there is nothing to
    // watch, and a config written later would not apply until a restart.
    if let Err(e) = compactd_store::private_dir::create_private_dir(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the config directory");
    }
    let name = path.file_name()?.to_os_string();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (ours included) are access events: only creations, writes, renames and
        // removals of the file are edits.
        let ours = event.is_ok_and(|e| {
            !matches!(e.kind, notify::EventKind::Access(_))
                && e.paths.iter().any(|p| p.file_name() == Some(&name))
        });
        if ours {
            let _ = tx.send(());
        }
    })
    .inspect_err(|e| tracing::warn!(error = %e, "config hot reload unavailable"))
    .ok()?;
    match watcher.watch(dir, RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; edits need a restart or SIGHUP");
            None
        }
    }
}

/// Re-reads the config; applies it if valid, keeps the old one otherwise.
pub(crate) async fn reload(path: &Path, service: &Arc<Service>) {
    let shown = path.display().to_string();
    let result = match Config::load(path) {
        Ok(new) => match service.misfits(&new).await {
            Ok(misfits) if misfits.is_empty() => Ok(new),
            Ok(misfits) => Err(refused_for(&misfits)),
            Err(e) => Err(format!("cannot check the sessions it applies to: {e}")),
        },
        Err(e) => Err(e.to_string()),
    };
    let result = result.and_then(|new| {
        let old = service.settings().config.clone();
        if new == old {
            return Ok(false);
        }
        let at_start = old.changed_keys_read_at_start(&new);
        if !at_start.is_empty() {
            tracing::warn!(keys = %at_start.join(", "), "these keys are read once at start: their change takes effect at the next start");
        }
        notify_systemd(&[sd_notify::NotifyState::Reloading, monotonic_now()]);
        let applied = service.apply_config(new).map_err(|e| e.to_string());
        notify_systemd(&[sd_notify::NotifyState::Ready]);
        applied.map(|()| true)
    });
    match result {
        Ok(changed) => {
            service.set_config_status(|s| {
                s.error = None;
                if changed {
                    s.reloads += 1;
                }
            });
            if changed {
                tracing::info!(path = %shown, "config reloaded");
                service.emit(Event::ConfigReloaded { path: shown });
                crate::daemon::resume(service, "config reload").await;
            }
        }
        Err(error) => {
            tracing::error!(path = %shown, %error, "config edit rejected; the previous config stays in force");
            service.set_config_status(|s| s.error = Some(error.clone()));
            service.emit(Event::ConfigRejected { path: shown, error });
        }
    }
}

/// The error of a config that does not fit some live sessions: the first few named.
pub(crate) fn refused_for(misfits: &[String]) -> String {
    const NAMED: usize = 3;
    let mut error = format!(
        "it does not fit {} live session{} (lower the setting, or PATCH the session's context_limit or config first): {}",
        misfits.len(),
        if misfits.len() == 1 { "" } else { "s" },
        misfits[..misfits.len().min(NAMED)].join("; ")
    );
    if misfits.len() > NAMED {
        error.push_str(&format!("; and {} more", misfits.len() - NAMED));
    }
    error
}

fn monotonic_now() -> sd_notify::NotifyState<'static> {
    sd_notify::NotifyState::monotonic_usec_now()
        .unwrap_or(sd_notify::NotifyState::Status("reloading"))
}

/// Tells systemd about a state change; a no-op outside systemd (no NOTIFY_SOCKET).
pub(crate) fn notify_systemd(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}
