//! Getting the listening socket: from systemd (socket activation) or by binding our own.
//!
//! Binding is careful: the directory is created private (0700), a socket file left by a dead
//! daemon is replaced while a live daemon's is not, and the socket is made 0600 between
//! `bind` and `listen`, so it never accepts a connection with looser permissions.

use socket2::{Domain, SockAddr, Socket, Type};
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("another compactd is already listening on {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot listen on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("socket activation: {0}")]
    Activation(io::Error),
}

/// The socket systemd passed us (LISTEN_FDS/LISTEN_PID), if we were socket-activated.
pub fn from_systemd() -> Result<Option<UnixListener>, ListenError> {
    let mut fds = sd_notify::listen_fds().map_err(ListenError::Activation)?;
    let Some(fd) = fds.next() else {
        return Ok(None);
    };
    // SAFETY: systemd hands us this descriptor, open and ours alone, for exactly this use.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    listener
        .set_nonblocking(true)
        .map_err(ListenError::Activation)?;
    UnixListener::from_std(listener)
        .map(Some)
        .map_err(ListenError::Activation)
}

/// Binds a private socket at `path`.
pub fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    let io_error = |source| ListenError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        crate::paths::ensure_private_dir(dir).map_err(io_error)?;
    }
    remove_stale(path)?;
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(io_error)?;
    let address = SockAddr::unix(path).map_err(io_error)?;
    socket.bind(&address).map_err(io_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_error)?;
    socket.listen(1024).map_err(io_error)?;
    socket.set_nonblocking(true).map_err(io_error)?;
    UnixListener::from_std(socket.into()).map_err(io_error)
}

/// Removes a socket file nobody listens on; refuses to touch a live one or a non-socket.
fn remove_stale(path: &Path) -> Result<(), ListenError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ListenError::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ListenError::AlreadyRunning(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale socket left by a daemon that is gone");
            std::fs::remove_file(path).map_err(|source| ListenError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(ListenError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}
