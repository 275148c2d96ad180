//! Serving a listener: one accept loop for the Unix socket and the loopback TCP port alike.
//!
//! What differs between them is data, not code: the routes (the socket serves the whole API,
//! the port only the proxy), the first request's deadline (a few seconds on the port, where
//! an idle connection is any local user's to hoard) and who may connect (the socket admits
//! the daemon's own user only; the port admits everyone, each other user held to a share of
//! its connections). Connections are bounded by a semaphore; past it they are answered 503.
//! On shutdown the loop stops accepting, each connection finishes the request in flight, and
//! whatever is still running after [`SHUTDOWN_GRACE`] is aborted, so nothing a listener
//! started outlives the call (the store closes after it).

use super::connection::{self, Timeouts};
use super::error::ApiError;
use super::{Peer, peer, tcp_peer};
use crate::protocol::ErrorCode;
use crate::service::Service;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// On the loopback listener, a connection that sends no request within this is closed.
pub(super) const FIRST_REQUEST_OVER_TCP: Duration = Duration::from_secs(5);

/// Each local user other than the daemon's own may hold this fraction of the loopback
/// listener's connections.
pub(super) const USER_SHARE_DIVISOR: usize = 4;

/// A listener the daemon serves.
pub(crate) enum Listener {
    /// The daemon's socket: the whole API, for the daemon's own user.
    Unix(UnixListener),
    /// The proxy's loopback port (`[proxy] listen`): the proxy's routes, for every local user.
    Tcp(TcpListener),
}

/// An accepted connection, before it is admitted.
enum Accepted {
    Unix(UnixStream),
    Tcp(TcpStream, SocketAddr),
}

/// Who may connect to a listener.
enum PeerRule {
    /// Only the daemon's own user (checked by SO_PEERCRED).
    OwnUser,
    /// Anyone; each user but the daemon's own holds at most `share` connections at once.
    SharePerUser {
        share: usize,
        users: Arc<tcp_peer::PerUser>,
    },
}

/// What a connection that was let in holds until it ends.
struct Admission {
    _slot: OwnedSemaphorePermit,
    _held: Option<tcp_peer::Held>,
}

/// Serves `listener` until `stop` is cancelled, then finishes in-flight requests within
/// [`SHUTDOWN_GRACE`] and aborts what is left.
pub(crate) async fn serve_on(listener: Listener, service: Arc<Service>, stop: CancellationToken) {
    let most = max_connections(service.settings().config.server.max_connections);
    let (app, rule) = match &listener {
        Listener::Unix(_) => (super::router(service.clone()), PeerRule::OwnUser),
        Listener::Tcp(_) => (
            super::proxy_router(service.clone()),
            PeerRule::SharePerUser {
                share: (most / USER_SHARE_DIVISOR).max(1),
                users: Arc::default(),
            },
        ),
    };
    let slots = Arc::new(Semaphore::new(most));
    let own_uid = compactd_store::private_dir::current_uid();
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        // Finished connections leave the set here, so it holds only the open ones.
        while connections.try_join_next().is_some() {}
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_failed(&e).await;
                continue;
            }
        };
        match admit(&accepted, &rule, own_uid, &slots) {
            Ok(admission) => {
                let timeouts = timeouts(&service, &listener);
                let (app, stop) = (app.clone(), stop.clone());
                connections.spawn(async move {
                    accepted.serve(app, timeouts, stop).await;
                    drop(admission);
                });
            }
            Err(refusal) => {
                connections.spawn(accepted.refuse(refusal));
            }
        }
    }
    let finished = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still open after the shutdown grace period; closing them"
        );
        connections.shutdown().await;
    }
}

/// A new connection's timeouts, from the config in force (`[server] request_timeout_s`; on
/// the loopback port the first request comes within [`FIRST_REQUEST_OVER_TCP`] too).
fn timeouts(service: &Service, listener: &Listener) -> Timeouts {
    let timeout = Duration::from_secs(service.settings().config.server.request_timeout_s);
    let first = match listener {
        Listener::Unix(_) => timeout,
        Listener::Tcp(_) => timeout.min(FIRST_REQUEST_OVER_TCP),
    };
    Timeouts {
        first,
        next: timeout,
    }
}

/// Lets `accepted` in by `rule` and the connection limit, or says why not.
fn admit(
    accepted: &Accepted,
    rule: &PeerRule,
    own_uid: u32,
    slots: &Arc<Semaphore>,
) -> Result<Admission, ApiError> {
    let held = match (accepted, rule) {
        (Accepted::Unix(stream), _) => {
            let peer = Peer::of(stream);
            if peer.uid != Some(own_uid) {
                tracing::warn!(peer_uid = ?peer.uid, peer_pid = ?peer.pid, "refused a connection from another user");
                return Err(peer::forbidden(own_uid));
            }
            None
        }
        (Accepted::Tcp(stream, peer), PeerRule::SharePerUser { share, users }) => {
            let uid = stream
                .local_addr()
                .ok()
                .and_then(|local| tcp_peer::peer_uid(local, *peer));
            match uid {
                Some(uid) if uid != own_uid => Some(
                    tcp_peer::PerUser::take(users, uid, *share)
                        .ok_or_else(|| user_share_spent(uid, *share))?,
                ),
                _ => None,
            }
        }
        (Accepted::Tcp(..), PeerRule::OwnUser) => None,
    };
    let slot = slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| too_many_connections())?;
    Ok(Admission {
        _slot: slot,
        _held: held,
    })
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Unix(listener) => Ok(Accepted::Unix(listener.accept().await?.0)),
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                Ok(Accepted::Tcp(stream, peer))
            }
        }
    }
}

impl Accepted {
    async fn serve(self, app: Router, timeouts: Timeouts, stop: CancellationToken) {
        match self {
            Accepted::Unix(stream) => connection::serve(stream, app, timeouts, stop).await,
            Accepted::Tcp(stream, _) => connection::serve(stream, app, timeouts, stop).await,
        }
    }

    async fn refuse(self, error: ApiError) {
        match self {
            Accepted::Unix(stream) => connection::refuse(stream, error).await,
            Accepted::Tcp(stream, _) => connection::refuse(stream, error).await,
        }
    }
}

/// Connections served at once: `configured`, within what the open-file limit allows.
pub(super) fn max_connections(configured: usize) -> usize {
    let limit = raise_open_file_limit();
    configured.min((limit.saturating_sub(128) as usize).max(16))
}

/// Raises the soft limit on open files to the hard one (systemd's default soft limit is
/// 1,024); returns the soft limit now in force.
fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1_024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

fn user_share_spent(uid: u32, share: usize) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Busy,
        format!("uid {uid} holds {share} of this listener's connections, the most one other user may; close some and retry"),
    )
    .retry_after(1)
}

fn too_many_connections() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Busy,
        "too many open connections; retry shortly",
    )
    .retry_after(1)
}

/// Accept errors (out of file descriptors, mostly) are logged at most once a minute, and
/// accepting pauses briefly so a full table is not spun on.
async fn accept_failed(error: &std::io::Error) {
    static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now.saturating_sub(LAST_LOGGED.load(Ordering::Relaxed)) >= 60 {
        LAST_LOGGED.store(now, Ordering::Relaxed);
        tracing::error!(%error, "cannot accept connections (logged once a minute)");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}
