//! `GET /events`: server-sent events, one per [`crate::service::Event`], ending at shutdown.

use crate::service::Service;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use std::convert::Infallible;
use std::sync::Arc;
use tokio_stream::wrappers::BroadcastStream;

/// `GET /v1/events`: one server-sent event per [`crate::protocol::Event`], named by its kind,
/// with its JSON as data; keep-alive comments every 15 s; `lagged` when this subscriber
/// missed events.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    responses((status = 200, description = "`text/event-stream`: `event: <kind>` then `data: <Event as JSON>`, until the daemon stops",
        content_type = "text/event-stream", body = crate::protocol::Event)))]
pub(crate) async fn events(
    State(service): State<Arc<Service>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let shutdown = service.shutdown_token();
    let stream = BroadcastStream::new(service.subscribe())
        .filter_map(|item| async move {
            match item {
                Ok(event) => SseEvent::default()
                    .event(event.name())
                    .json_data(&event)
                    .ok(),
                // A slow reader missed events: say so rather than pretend.
                Err(_) => {
                    let lagged = crate::protocol::Event::Lagged {};
                    SseEvent::default()
                        .event(lagged.name())
                        .json_data(&lagged)
                        .ok()
                }
            }
        })
        .map(Ok)
        .take_until(async move { shutdown.cancelled().await });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
