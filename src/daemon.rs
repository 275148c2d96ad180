//! `compactd serve` as a library function: it runs until the `shutdown` future it is given
//! resolves (`main` passes SIGTERM/SIGINT). The integration tests start it as a process
//! (`compactd serve` on a temp socket and database), as systemd does; the replay and the
//! property tests drive a [`Service`] in-process instead.

use crate::config::Config;
use crate::config_watch::{self, notify_systemd};
use crate::paths;
use crate::server::{self, listener};
use crate::service::Service;
use crate::store::Store;
use anyhow::{Context, Result};
use sd_notify::NotifyState;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// Where the daemon keeps things; `None` means the config's setting, else the XDG default.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    pub socket: Option<PathBuf>,
    pub db: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

/// Runs the daemon until `shutdown` completes: then it stops accepting, cancels running
/// compactions, finishes in-flight requests, closes the database and removes its socket.
pub async fn run(
    options: DaemonOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let config_path = options.config.clone().unwrap_or_else(paths::default_config);
    let config = Config::load(&config_path)?;
    let db = options
        .db
        .clone()
        .or_else(|| config.store.path.clone())
        .unwrap_or_else(paths::default_db);
    let socket = options
        .socket
        .clone()
        .or_else(|| config.server.socket.clone())
        .unwrap_or_else(paths::default_socket);

    let store = Store::open(&db, config.store.synchronous).context("cannot open the database")?;
    let service = Service::new(store.clone(), config).context("cannot build the summarizer")?;
    service.set_config_status(|s| s.path = Some(config_path.display().to_string()));
    // A config edited while the daemon was stopped may not fit some sessions: they compact
    // with less preserved (never over their limit), and it is said here.
    let misfits = service.misfits(&service.settings().config).await?;
    if !misfits.is_empty() {
        tracing::warn!(error = %config_watch::refused_for(&misfits), "the config does not fit every session; those compact with min_preserve lowered to fit");
    }

    let (listener, bound) = match listener::from_systemd()? {
        Some(listener) => (listener, None),
        None => (listener::bind(&socket)?, Some(socket.clone())),
    };
    config_watch::spawn(config_path, service.clone());
    spawn_watchdog(&service);
    // Compactions a crash or kill interrupted, or a config change made due, run now.
    match service.resume().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            sessions = n,
            "resumed compactions of sessions over their trigger"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot look for sessions over their trigger"),
    }
    tracing::info!(
        socket = %bound.as_ref().map_or("(from systemd)".into(), |p| p.display().to_string()),
        db = %db.display(),
        summarizer = %service.settings().summarizer.name(),
        "compactd serving"
    );
    if let Some(address) = service
        .settings()
        .config
        .proxy
        .listen_address()
        .map_err(anyhow::Error::msg)?
    {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("cannot listen on {address} ([proxy] listen)"))?;
        tracing::info!(%address, "proxy listening on loopback TCP");
        tokio::spawn(server::serve_proxy(
            listener,
            service.clone(),
            service.shutdown_token(),
        ));
    }
    notify_systemd(&[NotifyState::Ready, NotifyState::Status("serving")]);

    let token = service.shutdown_token();
    let stop = async move {
        shutdown.await;
        tracing::info!("shutting down");
        notify_systemd(&[NotifyState::Stopping]);
        token.cancel();
    };
    let served = server::serve(listener, service.clone(), stop).await;
    service.shutdown().await;
    store.close();
    if let Some(path) = bound {
        let _ = std::fs::remove_file(path);
    }
    served.context("server error")
}

/// Pings systemd's watchdog at half its interval, while the runtime is healthy.
fn spawn_watchdog(service: &Arc<Service>) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let shutdown = service.shutdown_token();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval / 2);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => notify_systemd(&[NotifyState::Watchdog]),
            }
        }
    });
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, not when
/// the future is first polled: a SIGTERM that arrives right after READY=1 (systemd stopping a
/// unit it just started, say) must shut down cleanly, not kill the process by default.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            _ = received(term.as_mut()) => {}
            _ = received(interrupt.as_mut()) => {}
        }
    }
}

/// The next delivery of `signal`; never, if its handler could not be installed.
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Logs to stderr (journald picks it up under systemd), at the level `COMPACTD_LOG` names
/// (default `info`), in color only on a terminal.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("COMPACTD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
