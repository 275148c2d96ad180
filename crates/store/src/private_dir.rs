//! Directories and files only their owner can reach: the database's directory and the
//! socket's hold every message, and on a shared machine whoever controls the directory can
//! swap the file.

/// The real uid of this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Creates `dir` (and missing parents) readable by its owner only, if it does not exist.
/// Existing directories are left as they are: they may be shared ones like /tmp.
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.as_os_str().is_empty() || dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Makes sure `dir` can hold a socket or database no other user can reach: creates it 0700
/// when missing; an existing one must be a real directory that is either ours (then made
/// 0700 if others could write to it) or a sticky shared one like /tmp, where nobody can
/// replace our files. Anything else (another user's directory, a symlink) is refused: whoever
/// controls the directory can swap the socket and read every message.
pub fn ensure_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    let metadata = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return create_private_dir(dir),
        Err(e) => return Err(e),
    };
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{}: {why}; remove it, or point compactd elsewhere (XDG_RUNTIME_DIR, --socket, --db)",
                dir.display()
            ),
        ))
    };
    if !metadata.is_dir() {
        return refuse("exists and is not a directory (or is a symlink)".into());
    }
    let mode = metadata.mode();
    let sticky_shared = mode & 0o1000 != 0 && metadata.uid() == 0;
    if metadata.uid() == current_uid() {
        if mode & 0o022 != 0 && !sticky_shared {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    } else if sticky_shared {
        Ok(())
    } else {
        refuse(format!(
            "belongs to uid {}, not to you (uid {})",
            metadata.uid(),
            current_uid()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_dir_is_created_and_a_loose_one_of_ours_is_tightened() {
        let tmp = tempfile::TempDir::new().unwrap();
        let dir = tmp.path().join("a/b");
        ensure_private_dir(&dir).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_symlink_or_a_file_is_refused() {
        let tmp = tempfile::TempDir::new().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(ensure_private_dir(&link).is_err());
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(ensure_private_dir(&file).is_err());
        // /tmp itself: shared but sticky, so nobody can replace our files in it.
        assert!(ensure_private_dir(std::path::Path::new("/tmp")).is_ok());
    }
}
