#!/usr/bin/env python3
"""What a `stat` of a file costs the next write + fsync of it, on this machine's file system.

    python3 scripts/stat-before-fsync.py [directory]

Since Linux 6.13, a file's change time has a finer grain once someone has read it: after a
`stat` that returns the times, the next write takes a fresh, fine-grained ctime, the inode is
dirty, and the `fsync` commits the file system's journal too. compactd looks at its database
and WAL before every commit, so it asks `statx` for the inode number and size only
(src/store/stat.rs). Prints the p50 of a 4 KiB `pwrite` + `fsync` with nothing before it,
with a `stat` (times included) before it, and with a `statx` of the inode and size alone.
"""
import ctypes
import os
import statistics
import sys
import tempfile
import time

N = 2000
STATX_INO, STATX_SIZE = 0x100, 0x200
AT_FDCWD = -100


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(512)
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        path, fd = f.name, f.fileno()
        os.pwrite(fd, b"x" * 65536, 0)
        os.fsync(fd)

        def statx_inode_and_size():
            if libc.statx(AT_FDCWD, path.encode(), 0, STATX_INO | STATX_SIZE, buf) != 0:
                sys.exit(f"statx: {os.strerror(ctypes.get_errno())}")

        looks = {
            "nothing": lambda: None,
            "stat (with the times)": lambda: os.stat(path),
            "statx (inode, size)": statx_inode_and_size,
        }
        figures = {name: [] for name in looks}
        for _ in range(3):
            for name, look in looks.items():
                each = []
                for i in range(N // 3):
                    look()
                    start = time.perf_counter()
                    os.pwrite(fd, b"y" * 4096, (i % 16) * 4096)
                    os.fsync(fd)
                    each.append(time.perf_counter() - start)
                figures[name].append(statistics.median(each) * 1e6)
    print(f"kernel {os.uname().release}")
    for name, p50s in figures.items():
        print(f"before each write + fsync: {name:24} p50 {statistics.median(p50s):5.0f} µs")


if __name__ == "__main__":
    main()
