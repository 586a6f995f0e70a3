"""Probe an OS file lock without taking it.

kiro's locks are `flock` locks (filelock's UnixFileLock). Asking "is it held?" by trying to take
it and letting go again holds it for a moment, and a `kiro loop start` that arrives in that moment
fails with "already running" (issue 7 item 8). So a probe reads the kernel's lock table
(`/proc/locks`) instead: it lists every flock with the device and inode of its file. Where there is
no /proc/locks (not Linux), the probe falls back to the try-and-release check.
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout

PROC_LOCKS = Path("/proc/locks")


def is_held(path: Path) -> bool:
    """True when some process holds the flock on `path` right now. Never takes the lock (on Linux)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    try:
        table = PROC_LOCKS.read_text()
    except OSError:
        return _try_and_release(path)
    want_ino = str(st.st_ino)
    want_dev = (os.major(st.st_dev), os.minor(st.st_dev))
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:2148472 0 EOF" ("-> ..." lines are waiters)
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields[:2]:
            continue
        try:
            major, minor, ino = fields[5].split(":")
            dev = (int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if ino == want_ino and dev == want_dev:
            return True
    return False


def _try_and_release(path: Path) -> bool:
    lock = FileLock(str(path), timeout=0, thread_local=False, is_singleton=False)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False
