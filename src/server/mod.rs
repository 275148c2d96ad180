//! HTTP/1.1 + JSON over a Unix socket (like Docker's): the router, and serving it.
//!
//! Serving is bounded by construction: at most `[server] max_connections` connections at once
//! (more are answered 503 and closed), each from the daemon's own user only (others get 403 at
//! accept), each held to header and idle timeouts ([`connection`]), each body to a size, a
//! deadline and a shared memory budget ([`body`]). At start the soft limit on open files is
//! raised to the hard one, so the connection limit, not the file limit, is what binds.

mod body;
mod connection;
mod error;
pub(crate) mod events;
mod extract;
pub mod listener;
pub mod openapi;
mod peer;
mod proxy;
mod routes;
mod tcp_peer;

pub use error::ApiError;
pub use peer::Peer;

use crate::protocol::ErrorCode;
use crate::service::Service;
use axum::routing::{get, post};
use axum::{Extension, Router};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The API's routes.
pub fn router(service: Arc<Service>) -> Router {
    let api = Router::new()
        .route("/health", get(routes::health))
        .route(
            "/session",
            post(routes::create_session).get(routes::list_sessions),
        )
        .route(
            "/session/{id}",
            get(routes::get_session)
                .patch(routes::update_session)
                .delete(routes::delete_session),
        )
        .route(
            "/session/{id}/message",
            post(routes::append).get(routes::history),
        )
        .route("/session/{id}/context", get(routes::context))
        .route("/session/{id}/search", get(routes::search))
        .route("/session/{id}/summarize", post(routes::summarize))
        .route("/session/{id}/compaction", get(routes::compactions))
        .route("/events", get(events::events))
        .route("/openapi.json", get(routes::openapi));
    let api = api.route_layer(axum::middleware::from_fn_with_state(
        service.clone(),
        body::api_bodies,
    ));
    versioned(api.merge(proxy_routes(&service)), service)
}

/// The proxy's routes alone, as the loopback TCP listener serves them: calls there are marked
/// [`proxy::Network`], so only sessions of the key they carry are theirs.
fn proxy_router(service: Arc<Service>) -> Router {
    versioned(proxy_routes(&service), service).layer(Extension(proxy::Network))
}

/// The proxy's routes, their bodies bounded by `[proxy] max_body_bytes`.
fn proxy_routes(service: &Arc<Service>) -> Router<Arc<Service>> {
    Router::new()
        .route("/chat/completions", post(proxy::chat_completions))
        .route("/messages", post(proxy::messages))
        .route("/messages/count_tokens", post(proxy::count_tokens))
        .route("/responses", post(proxy::responses))
        .route("/models", get(proxy::models))
        .route_layer(axum::middleware::from_fn_with_state(
            service.clone(),
            body::proxy_bodies,
        ))
}

/// `api` at versioned paths (`/v1/...`) and at today's unversioned ones as aliases, with JSON
/// answers for unknown paths and methods. Bodies on every listener draw on the service's one
/// memory budget.
fn versioned(api: Router<Arc<Service>>, service: Arc<Service>) -> Router {
    Router::new()
        .nest(crate::protocol::API_PREFIX, api.clone())
        .merge(api)
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(axum::middleware::from_fn(connection::head_limits))
        .with_state(service)
}

/// Serves the proxy on a loopback TCP `listener` until `stop` is cancelled, with the same
/// connection limit and timeouts as the socket.
pub async fn serve_proxy(
    listener: tokio::net::TcpListener,
    service: Arc<Service>,
    stop: CancellationToken,
) {
    let server = service.settings().config.server.clone();
    let timeout = Duration::from_secs(server.request_timeout_s);
    let timeouts = connection::Timeouts {
        first: timeout.min(FIRST_REQUEST_OVER_TCP),
        next: timeout,
    };
    let app = proxy_router(service);
    let most = max_connections(server.max_connections);
    let slots = Arc::new(Semaphore::new(most));
    let share = (most / USER_SHARE_DIVISOR).max(1);
    let users = Arc::new(tcp_peer::PerUser::default());
    let own_uid = crate::paths::current_uid();
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let uid = stream
            .local_addr()
            .ok()
            .and_then(|local| tcp_peer::peer_uid(local, peer));
        let held = match uid {
            Some(uid) if uid != own_uid => match tcp_peer::PerUser::take(&users, uid, share) {
                Some(held) => Some(held),
                None => {
                    connections.spawn(connection::refuse(stream, user_share_spent(uid, share)));
                    continue;
                }
            },
            _ => None,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            connections.spawn(connection::refuse(stream, too_many_connections()));
            continue;
        };
        let (app, stop) = (app.clone(), stop.clone());
        connections.spawn(async move {
            connection::serve(stream, app, timeouts, stop).await;
            drop((slot, held));
        });
    }
    connections.close();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connections.wait()).await;
}

/// Connections served at once: `configured`, within what the open-file limit allows.
pub fn max_connections(configured: usize) -> usize {
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

/// Serves the API on `listener` until `shutdown` completes, then finishes in-flight requests
/// (waiting at most [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: UnixListener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let server = service.settings().config.server.clone();
    let timeout = Duration::from_secs(server.request_timeout_s);
    let timeouts = connection::Timeouts {
        first: timeout,
        next: timeout,
    };
    let app = router(service);
    let slots = Arc::new(Semaphore::new(max_connections(server.max_connections)));
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let own_uid = crate::paths::current_uid();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let peer = Peer::of(&stream);
        if peer.uid != Some(own_uid) {
            tracing::warn!(peer_uid = ?peer.uid, peer_pid = ?peer.pid, "refused a connection from another user");
            connections.spawn(connection::refuse(stream, peer::forbidden(own_uid)));
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            connections.spawn(connection::refuse(stream, too_many_connections()));
            continue;
        };
        let app = app.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            connection::serve(stream, app, timeouts, stop).await;
            drop(slot);
        });
    }
    stop.cancel();
    connections.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
    }
    Ok(())
}

/// How long shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// On the loopback listener, a connection that sends no request within this is closed.
pub const FIRST_REQUEST_OVER_TCP: Duration = Duration::from_secs(5);

/// Each local user other than the daemon's own may hold this fraction of the loopback
/// listener's connections.
pub const USER_SHARE_DIVISOR: usize = 4;

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
