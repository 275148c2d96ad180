//! `compactd serve` as a library function: it runs until the `shutdown` future it is given
//! resolves (`main` passes SIGTERM/SIGINT), on the listeners its options give or on ones it
//! binds. Most integration tests start it as a process (`compactd serve` on a temp socket and
//! database), as systemd does; one runs it in-process on listeners it made
//! (tests/it/in_process.rs); the replay and the property tests drive a [`Service`] directly.

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
use tokio::net::{TcpListener, UnixListener};

/// Where the daemon keeps things; `None` means the config's setting, else the XDG default.
#[derive(Debug, Default)]
pub struct DaemonOptions {
    pub socket: Option<PathBuf>,
    pub db: Option<PathBuf>,
    pub config: Option<PathBuf>,
    /// Listeners the caller made (tests, embedders): served instead of binding `socket` or
    /// adopting systemd's, and instead of `[proxy] listen`.
    pub listeners: Option<Listeners>,
}

/// The listeners a daemon serves: its socket, and the proxy's loopback port if any.
#[derive(Debug)]
pub struct Listeners {
    pub socket: UnixListener,
    pub proxy: Option<TcpListener>,
}

/// Runs the daemon until `shutdown` completes: then it stops accepting on every listener,
/// cancels running compactions, lets in-flight requests finish (within the shutdown grace;
/// then they end), closes the database and removes the socket it bound.
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
    // Before the database is opened (and perhaps migrated): no other daemon serves it.
    let _lock = crate::database_lock::lock(&db)?;
    let store = Store::open(&db, config.store.synchronous).context("cannot open the database")?;
    let service = Service::new(store.clone(), config).context("cannot build the summarizer")?;
    service.set_config_status(|s| s.path = Some(config_path.display().to_string()));
    // A config edited while the daemon was stopped may not fit some sessions: they compact
    // with less preserved (never over their limit), and it is said here.
    let misfits = service.misfits(&service.settings().config).await?;
    if !misfits.is_empty() {
        tracing::warn!(error = %config_watch::refused_for(&misfits), "the config does not fit every session; those compact with min_preserve lowered to fit");
    }
    let (listeners, socket) = listen(options, &service).await?;
    config_watch::spawn(config_path, service.clone());
    spawn_watchdog(&service);
    resume(&service, "start").await;
    tracing::info!(
        socket = %socket,
        db = %db.display(),
        summarizer = %service.settings().summarizer.name(),
        "compactd serving"
    );
    notify_systemd(&[NotifyState::Ready, NotifyState::Status("serving")]);

    let token = service.shutdown_token();
    let stop = async move {
        shutdown.await;
        tracing::info!("shutting down");
        notify_systemd(&[NotifyState::Stopping]);
        token.cancel();
    };
    let servers = futures_util::future::join_all(
        listeners
            .into_iter()
            .map(|listener| server::serve_on(listener, service.clone(), service.shutdown_token())),
    );
    let kept = async {
        if let Socket::Bound(path) = &socket {
            keep_socket(path, &service).await;
        }
    };
    // Every server has finished (or ended what outlived the grace) before the store closes.
    tokio::join!(stop, servers, kept);
    service.shutdown().await;
    store.close();
    if let Socket::Bound(path) = socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// How often the daemon checks that the socket it bound is still there.
const SOCKET_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// A socket file removed while the daemon runs (a cleaner of `/tmp`, an `rm -rf` of its
/// directory) would leave it running with no agent able to reach it. The daemon binds its
/// socket again when the path is gone (a file someone else put there is left alone); the new
/// listener is served like the first, until shutdown. Systemd's socket is systemd's to keep.
async fn keep_socket(path: &std::path::Path, service: &Arc<Service>) {
    let stop = service.shutdown_token();
    let mut rebound = Vec::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(SOCKET_CHECK) => {}
        }
        if std::fs::symlink_metadata(path).is_ok() {
            continue;
        }
        match listener::bind(path) {
            Ok(socket) => {
                tracing::warn!(path = %path.display(), "the socket file was removed; bound it again");
                let listener = server::Listener::Unix(socket);
                let serving = server::serve_on(listener, service.clone(), stop.clone());
                rebound.push(tokio::spawn(serving));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the socket file was removed and cannot be bound again")
            }
        }
    }
    futures_util::future::join_all(rebound).await;
}

/// Where the daemon's socket came from; only one it bound is removed at exit.
enum Socket {
    Given,
    Systemd,
    Bound(PathBuf),
}

impl std::fmt::Display for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Socket::Given => f.write_str("(given by the caller)"),
            Socket::Systemd => f.write_str("(from systemd)"),
            Socket::Bound(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The listeners to serve: the caller's, else systemd's socket or a bound one, and the
/// proxy's port if `[proxy] listen` names one; and where the socket came from.
async fn listen(
    options: DaemonOptions,
    service: &Service,
) -> Result<(Vec<server::Listener>, Socket)> {
    if let Some(given) = options.listeners {
        let mut listeners = vec![server::Listener::Unix(given.socket)];
        listeners.extend(given.proxy.map(server::Listener::Tcp));
        return Ok((listeners, Socket::Given));
    }
    let config = &service.settings().config;
    let (socket, origin) = match listener::from_systemd()? {
        Some(listener) => (listener, Socket::Systemd),
        None => {
            let path = options
                .socket
                .or_else(|| config.server.socket.clone())
                .unwrap_or_else(paths::default_socket);
            (listener::bind(&path)?, Socket::Bound(path))
        }
    };
    let mut listeners = vec![server::Listener::Unix(socket)];
    if let Some(address) = config.proxy.listen_address()? {
        let port = TcpListener::bind(address)
            .await
            .with_context(|| format!("cannot listen on {address} ([proxy] listen)"))?;
        tracing::info!(%address, "proxy listening on loopback TCP");
        listeners.push(server::Listener::Tcp(port));
    }
    Ok((listeners, origin))
}

/// Compactions a crash or kill interrupted, or a config change made due, start now rather
/// than at each session's next append or context: an idle session over its new trigger is
/// compacted before its agent comes back, so its next step does not wait for it.
pub(crate) async fn resume(service: &Arc<Service>, after: &'static str) {
    match service.resume().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            sessions = n,
            after,
            "started compactions of sessions over their trigger"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot look for sessions over their trigger"),
    }
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
