//! The OpenAPI 3.1 document of the API, generated from the protocol types and the handlers'
//! descriptions. Served at `GET /v1/openapi.json` and checked in as `docs/openapi.json`
//! (a test fails when the two differ: regenerate with `compactd openapi > docs/openapi.json`).

use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "compactd",
        description = "Keeps long-running LLM agent sessions inside their context window. \
            HTTP/1.1 + JSON over a Unix socket (`$XDG_RUNTIME_DIR/compactd/compactd.sock`). \
            Every path is also served without the `/v1` prefix, as an alias. Errors are \
            `{\"error\": {\"code\", \"message\"}}` (see ErrorCode). docs/API.md has examples."
    ),
    paths(
        super::routes::health,
        super::routes::create_session,
        super::routes::list_sessions,
        super::routes::get_session,
        super::routes::update_session,
        super::routes::delete_session,
        super::routes::append,
        super::routes::history,
        super::routes::search,
        super::routes::context,
        super::routes::summarize,
        super::routes::overflow,
        super::routes::compactions,
        super::routes::openapi,
        crate::server::events::events,
    ),
    components(schemas(
        crate::protocol::Event,
        crate::protocol::ErrorCode,
        crate::protocol::MessageInput,
        crate::protocol::Message,
    )),
    tags(
        (name = "daemon", description = "Health and this document"),
        (name = "sessions", description = "Create, read, change and hide sessions"),
        (name = "messages", description = "Append messages; read and search the history; read the context"),
        (name = "compaction", description = "Compact by hand; say the model refused a context as too long; read what compactions did"),
        (name = "events", description = "Server-sent events"),
    )
)]
struct ApiDoc;

/// The document as JSON.
pub fn document() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}

/// The document as the pretty JSON checked in as `docs/openapi.json`.
pub fn pretty() -> String {
    serde_json::to_string_pretty(&document()).unwrap_or_default() + "\n"
}
