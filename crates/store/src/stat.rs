//! A file's identity and size by name, without asking for its times.
//!
//! Linux (6.13 on) gives a file's change time a finer grain once someone has read it: after a
//! `stat` that returns the times, the next write to the file takes a fresh, fine-grained
//! ctime, which makes the inode itself dirty, and the next `fsync` has to commit the file
//! system's journal rather than flush the data alone. `std::fs::metadata` asks for the times.
//! So a `stat` of the WAL before each commit made that commit's `fsync` about 55 µs slower on
//! ext4 (`scripts/stat-before-fsync.py`, 4 KiB `pwrite` + `fsync` p50: 110 µs, 164 µs with a
//! `stat` before each, 109 µs with a `statx` of the inode number and size alone). The checks
//! of the database file and its side files run on every commit, so they ask for those two.

use std::io;
use std::path::Path;

/// What a look at a path found: which file it names, and how long that file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// (device, inode), as `std::os::unix::fs::MetadataExt` gives them.
    pub identity: (u64, u64),
    pub size: u64,
}

/// Looks at `path` (following a symlink, as `std::fs::metadata` does) without reading or
/// marking its times.
pub(super) fn look(path: &Path) -> io::Result<Seen> {
    #[cfg(all(target_os = "linux", any(target_env = "gnu", target_env = "musl")))]
    match statx(path) {
        // A kernel or sandbox without statx: the times are read, the check still holds.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {}
        other => return other,
    }
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(Seen {
        identity: (m.dev(), m.ino()),
        size: m.len(),
    })
}

#[cfg(all(target_os = "linux", any(target_env = "gnu", target_env = "musl")))]
fn statx(path: &Path) -> io::Result<Seen> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: `statx` is plain old data, valid when zeroed; the kernel only writes into it.
    let mut found: libc::statx = unsafe { std::mem::zeroed() };
    let wanted = libc::STATX_INO | libc::STATX_SIZE;
    // SAFETY: `name` is a NUL-terminated string and `found` a buffer of the right type, both
    // alive for the call.
    let failed = unsafe { libc::statx(libc::AT_FDCWD, name.as_ptr(), 0, wanted, &mut found) } != 0;
    if failed {
        return Err(io::Error::last_os_error());
    }
    if found.stx_mask & wanted != wanted {
        return Err(io::Error::other("statx did not say the inode and the size"));
    }
    Ok(Seen {
        identity: (
            libc::makedev(found.stx_dev_major, found.stx_dev_minor),
            found.stx_ino,
        ),
        size: found.stx_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_look_names_the_same_file_and_size_as_std() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 12_345]).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        let seen = look(&path).unwrap();
        assert_eq!(seen.identity, (m.dev(), m.ino()));
        assert_eq!(seen.size, 12_345);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(
            look(&link).unwrap(),
            seen,
            "a symlink is followed, as by std"
        );
        let missing = look(&dir.path().join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }
}
