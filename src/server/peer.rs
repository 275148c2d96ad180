//! The peer-credential guard: only processes of the daemon's own user may talk to it.
//!
//! The socket's mode (0600) and directory (0700) already keep others out; checking
//! SO_PEERCRED on every connection also covers a socket path someone made reachable (a
//! permissive `--socket` directory, a socket passed in by another service manager).

use super::error::ApiError;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use tokio::net::UnixListener;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: Option<u32>,
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        match stream.io().peer_cred() {
            Ok(cred) => Peer {
                uid: Some(cred.uid()),
                pid: cred.pid(),
            },
            Err(_) => Peer {
                uid: None,
                pid: None,
            },
        }
    }
}

/// Refuses requests from other users with 403.
pub async fn same_user_only(
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
    next: Next,
) -> Response {
    let own = crate::paths::current_uid();
    if peer.uid == Some(own) {
        return next.run(request).await;
    }
    tracing::warn!(peer_uid = ?peer.uid, peer_pid = ?peer.pid, "refused a connection from another user");
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("this compactd serves uid {own} only"),
    )
    .into_response()
}
