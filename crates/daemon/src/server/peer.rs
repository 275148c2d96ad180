//! The peer-credential check: only processes of the daemon's own user may talk to it.
//!
//! The socket's mode (0600) and directory (0700) already keep others out; checking
//! SO_PEERCRED on every connection, as it is accepted, also covers a socket path someone made
//! reachable (a permissive `--socket` directory, a socket passed in by another service
//! manager). Another user's connection is answered 403 and closed before any request is read.

use super::error::ApiError;
use crate::protocol::ErrorCode;
use axum::http::StatusCode;
use tokio::net::UnixStream;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub uid: Option<u32>,
    pub pid: Option<i32>,
}

impl Peer {
    pub(crate) fn of(stream: &UnixStream) -> Peer {
        match stream.peer_cred() {
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

/// The answer to another user.
pub(super) fn forbidden(own_uid: u32) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        ErrorCode::Forbidden,
        format!("this compactd serves uid {own_uid} only"),
    )
}
