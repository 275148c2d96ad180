//! HTTP/1.1 + JSON over a Unix socket (like Docker's): the router, and serving it.

mod error;
mod events;
mod extract;
pub mod listener;
mod peer;
mod routes;

pub use error::ApiError;
pub use peer::Peer;

use crate::service::Service;
use axum::Router;
use axum::middleware::from_fn;
use axum::routing::{get, post};
use std::future::Future;
use std::sync::Arc;
use tokio::net::UnixListener;

/// The API's routes.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
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
        .route("/session/{id}/summarize", post(routes::summarize))
        .route("/session/{id}/compaction", get(routes::compactions))
        .route("/events", get(events::events))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(from_fn(peer::same_user_only))
        .with_state(service)
}

/// Serves the API on `listener` until `shutdown` completes, then finishes in-flight requests.
pub async fn serve(
    listener: UnixListener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(service).into_make_service_with_connect_info::<Peer>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
