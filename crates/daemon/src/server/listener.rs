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
pub(crate) enum ListenError {
    #[error("another compactd is already listening on {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot listen on {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("socket activation: {0}")]
    Activation(io::Error),
}

/// The socket systemd passed us (LISTEN_FDS/LISTEN_PID), if we were socket-activated.
pub(crate) fn from_systemd() -> Result<Option<UnixListener>, ListenError> {
    let mut fds = sd_notify::listen_fds().map_err(ListenError::Activation)?;
    let Some(fd) = fds.next() else {
        return Ok(None);
    };
    check_activated(fd).map_err(ListenError::Activation)?;
    // SAFETY: systemd hands us this descriptor, open and ours alone, for exactly this use,
    // and it was just checked to be a listening Unix stream socket.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    listener
        .set_nonblocking(true)
        .map_err(ListenError::Activation)?;
    UnixListener::from_std(listener)
        .map(Some)
        .map_err(ListenError::Activation)
}

/// Checks that `fd` is what a `.socket` unit with `ListenStream=` passes: a Unix stream socket
/// that listens (a unit with `ListenDatagram=`, a TCP port or `Accept=yes` passes another kind,
/// and serving on it would fail in obscure ways).
fn check_activated(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: only borrowed for the checks below; LISTEN_FDS says it is open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let socket = socket2::SockRef::from(&borrowed);
    let wrong = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the descriptor systemd passed is {what}; compactd.socket needs ListenStream= on a path, without Accept="
            ),
        )
    };
    if socket.domain()? != Domain::UNIX {
        return Err(wrong("not a Unix socket"));
    }
    if socket.r#type()? != Type::STREAM {
        return Err(wrong("not a stream socket"));
    }
    if !socket.is_listener()? {
        return Err(wrong("not listening"));
    }
    Ok(())
}

/// Binds a private socket at `path`.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    let io_error = |source| ListenError::Io {
        path: path.to_path_buf(),
        error: source,
    };
    if let Some(dir) = path.parent() {
        compactd_store::private_dir::ensure_private_dir(dir).map_err(io_error)?;
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
                error: source,
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
                error: source,
            })
        }
        Err(source) => Err(ListenError::Io {
            path: path.to_path_buf(),
            error: source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn only_a_listening_unix_stream_socket_is_taken_from_systemd() {
        let dir = tempfile::TempDir::new().unwrap();
        let listening = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        assert!(check_activated(listening.as_raw_fd()).is_ok());
        let refused =
            |socket: &dyn AsRawFd| check_activated(socket.as_raw_fd()).unwrap_err().to_string();
        let datagram = Socket::new(Domain::UNIX, Type::DGRAM, None).unwrap();
        assert!(refused(&datagram).contains("not a stream socket"));
        let unbound = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        assert!(refused(&unbound).contains("not listening"));
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(refused(&tcp).contains("not a Unix socket"));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(
            check_activated(file.as_raw_fd()).is_err(),
            "not a socket at all"
        );
    }
}
