//! A VFS for the write connection that keeps SQLite's write lock from the first time it takes
//! it until the connection closes, so no other process can write the database while the
//! daemon serves it.
//!
//! In WAL mode the write lock is one byte of the `-shm` file, locked by each write transaction
//! and let go as it commits. Keeping an open transaction between writes (compactd's first way
//! to keep other processes out) still left the byte free in the instant after each commit, and
//! under load an outside `sqlite3` whose busy handler retries (`.restore`, anything run under
//! `.timeout`) took it there and rewrote the live database under acknowledged appends.
//!
//! This VFS wraps the default one and passes every call through, except the write
//! connection's unlock of that byte: SQLite is told it let go while the file lock stays, and
//! its next lock of the byte is answered at once. Other connections of this process see the
//! byte held (SQLite counts this process's locks itself), other processes see it held by the
//! kernel. Unmapping the wal-index (closing the connection) lets go for real.

use rusqlite::ffi;
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

/// The name the VFS is registered under.
const NAME: &CStr = c"compactd-writer";
/// The write lock's slot among the wal-index locks (SQLite's `WAL_WRITE_LOCK`).
const WRITE_LOCK: c_int = 0;
const LOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;
const UNLOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// The file object SQLite allocates for this VFS: the default VFS's own follows it in the
/// same allocation, at [`REAL_OFFSET`].
#[repr(C)]
struct KeptFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// Whether this file holds the write lock at the kernel's level (whatever SQLite was told).
    kept: bool,
}

const REAL_OFFSET: usize = std::mem::size_of::<KeptFile>().next_multiple_of(16);

/// The name of the registered VFS, to open the write connection with; registered on first use.
pub(super) fn name() -> Result<&'static CStr, String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED.get_or_init(register).clone().map(|()| NAME)
}

fn register() -> Result<(), String> {
    // SAFETY: `sqlite3_vfs_find` initializes SQLite if needed and returns the default VFS,
    // registered for the life of the process; it is only read here. The copy made of it is
    // leaked, so it lives as long as SQLite may use it once registered.
    unsafe {
        let real = ffi::sqlite3_vfs_find(std::ptr::null());
        if real.is_null() {
            return Err("SQLite has no default VFS".into());
        }
        let mut vfs = *real;
        let size = REAL_OFFSET + usize::try_from((*real).szOsFile).unwrap_or(0);
        vfs.szOsFile = c_int::try_from(size).map_err(|e| e.to_string())?;
        vfs.zName = NAME.as_ptr();
        vfs.pNext = std::ptr::null_mut();
        vfs.pAppData = real.cast();
        vfs.xOpen = Some(open);
        let rc = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0);
        match rc {
            ffi::SQLITE_OK => Ok(()),
            rc => Err(format!(
                "cannot register the writer's VFS (SQLite code {rc})"
            )),
        }
    }
}

/// Opens a file through the default VFS, into the bytes after the [`KeptFile`].
unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite hands a zeroed allocation of `szOsFile` bytes (as registered: the
    // KeptFile, then the default VFS's file) and this VFS, whose `pAppData` is the default
    // VFS. The KeptFile's methods are set only once the default VFS set its file's: SQLite
    // calls `xClose` on a file whose methods are set, even when the open failed.
    unsafe {
        let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let kept = file.cast::<KeptFile>();
        let real = file
            .cast::<u8>()
            .add(REAL_OFFSET)
            .cast::<ffi::sqlite3_file>();
        (*kept).base.pMethods = std::ptr::null();
        (*kept).real = real;
        (*kept).kept = false;
        let Some(real_open) = (*real_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = real_open(real_vfs, name, real, flags, out_flags);
        if !(*real).pMethods.is_null() {
            (*kept).base.pMethods = &METHODS;
        }
        rc
    }
}

/// The default VFS's file behind `file`.
///
/// # Safety
/// `file` is open through this VFS and not yet closed.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: as the caller promises, `file` is a KeptFile whose real file is open; an open
    // file's methods are its VFS's static table.
    unsafe {
        let real = (*file.cast::<KeptFile>()).real;
        (real, &*(*real).pMethods)
    }
}

/// Defines a function of the method table that calls the default VFS's, or answers
/// `$missing` where it has none.
macro_rules! forward {
    ($($name:ident => $method:ident ($($arg:ident: $ty:ty),*) or $missing:expr;)*) => {$(
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            // SAFETY: SQLite calls a method only on an open file of this VFS.
            unsafe {
                let (real, methods) = real(file);
                match methods.$method {
                    Some(method) => method(real $(, $arg)*),
                    None => $missing,
                }
            }
        }
    )*};
}

forward! {
    read => xRead(buf: *mut c_void, amount: c_int, offset: i64) or ffi::SQLITE_IOERR_READ;
    write => xWrite(buf: *const c_void, amount: c_int, offset: i64) or ffi::SQLITE_IOERR_WRITE;
    truncate => xTruncate(size: i64) or ffi::SQLITE_IOERR_TRUNCATE;
    sync => xSync(flags: c_int) or ffi::SQLITE_IOERR_FSYNC;
    file_size => xFileSize(size: *mut i64) or ffi::SQLITE_IOERR_FSTAT;
    lock => xLock(level: c_int) or ffi::SQLITE_IOERR_LOCK;
    unlock => xUnlock(level: c_int) or ffi::SQLITE_IOERR_UNLOCK;
    check_reserved_lock => xCheckReservedLock(out: *mut c_int) or ffi::SQLITE_IOERR_CHECKRESERVEDLOCK;
    file_control => xFileControl(op: c_int, arg: *mut c_void) or ffi::SQLITE_NOTFOUND;
    sector_size => xSectorSize() or 4096;
    device_characteristics => xDeviceCharacteristics() or 0;
    shm_map => xShmMap(page: c_int, page_size: c_int, extend: c_int, out: *mut *mut c_void) or ffi::SQLITE_IOERR_SHMMAP;
    fetch => xFetch(offset: i64, amount: c_int, out: *mut *mut c_void) or { *out = std::ptr::null_mut(); ffi::SQLITE_OK };
    unfetch => xUnfetch(offset: i64, page: *mut c_void) or ffi::SQLITE_OK;
}

/// Locks and unlocks as asked, but for the write lock: once taken, it stays taken.
unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: SQLite calls a method only on an open file of this VFS, one call at a time per
    // connection, so the KeptFile is not shared while this runs.
    unsafe {
        let kept = &mut *file.cast::<KeptFile>();
        let write_lock = offset == WRITE_LOCK && n == 1;
        if write_lock && kept.kept && (flags == LOCK_EXCLUSIVE || flags == UNLOCK_EXCLUSIVE) {
            return ffi::SQLITE_OK;
        }
        let (real, methods) = real(file);
        let Some(shm_lock) = methods.xShmLock else {
            return ffi::SQLITE_IOERR_SHMLOCK;
        };
        let rc = shm_lock(real, offset, n, flags);
        if write_lock && flags == LOCK_EXCLUSIVE && rc == ffi::SQLITE_OK {
            kept.kept = true;
        }
        rc
    }
}

/// Lets go of a kept write lock for real: the wal-index is being unmapped or the file closed.
///
/// # Safety
/// `file` is open through this VFS and not yet closed.
unsafe fn let_go(file: *mut ffi::sqlite3_file) {
    // SAFETY: as the caller promises.
    unsafe {
        let kept = &mut *file.cast::<KeptFile>();
        if !kept.kept {
            return;
        }
        kept.kept = false;
        let (real, methods) = real(file);
        if let Some(shm_lock) = methods.xShmLock {
            shm_lock(real, WRITE_LOCK, 1, UNLOCK_EXCLUSIVE);
        }
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: SQLite calls a method only on an open file of this VFS.
    unsafe {
        let_go(file);
        let (real, methods) = real(file);
        match methods.xShmUnmap {
            Some(unmap) => unmap(real, delete),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite calls a method only on an open file of this VFS.
    unsafe {
        let (real, methods) = real(file);
        if let Some(barrier) = methods.xShmBarrier {
            barrier(real);
        }
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes an open file of this VFS once; its methods are cleared after,
    // so no other call reaches it.
    unsafe {
        let_go(file);
        let (real, methods) = real(file);
        let rc = methods.xClose.map_or(ffi::SQLITE_OK, |close| close(real));
        (*file).pMethods = std::ptr::null();
        rc
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// Whether `conn`'s main database file (opened through this VFS) keeps the write lock now.
pub(super) fn kept(conn: &rusqlite::Connection) -> bool {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: FILE_POINTER writes one pointer to the open connection's main database file,
    // valid while the connection is open and borrowed; it is ours only if its methods are.
    unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast(),
        );
        if rc != ffi::SQLITE_OK || file.is_null() || !std::ptr::eq((*file).pMethods, &METHODS) {
            return false;
        }
        (*file.cast::<KeptFile>()).kept
    }
}
