//! HTTP/1.1 + JSON over a Unix socket (like Docker's): the router, and serving it.
//!
//! Serving is bounded by construction: at most `[server] max_connections` connections at once
//! per listener (more are answered 503 and closed), each admitted by its listener's peer rule
//! ([`serve`]: on the socket the daemon's own user only, others get 403 at accept), each held
//! to header and idle timeouts ([`connection`]), each body to a size, a deadline and a shared
//! memory budget ([`body`]). At start the soft limit on open files is raised to the hard one,
//! so the connection limit, not the file limit, is what binds.

mod answer_reading;
mod body;
mod connection;
mod error;
pub(crate) mod events;
mod extract;
pub(crate) mod listener;
mod offload;
pub(crate) mod openapi;
mod peer;
mod proxy;
mod proxy_body;
mod request_heads;
mod routes;
mod serve;
mod tcp_peer;

pub(crate) use peer::Peer;
pub use serve::SHUTDOWN_GRACE;
pub(crate) use serve::{Listener, serve_on};

use crate::service::Service;
use axum::routing::{get, post};
use axum::{Extension, Router};
use std::sync::Arc;

/// The API's routes.
pub(crate) fn router(service: Arc<Service>) -> Router {
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
        .route("/session/{id}/overflow", post(routes::overflow))
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
        .layer(axum::middleware::from_fn(error::log_refusals))
        .with_state(service)
}
