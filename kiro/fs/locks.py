"""kiro's one kind of file lock (`Flock`), and a probe of one that does not take it.

Every lock kiro takes is a `Flock`: a loop's lock, the start guard, watch.lock, the temporal
workspace worker's lock, a process's disk reserve, the server's event index. They are `flock` locks
(the same kernel lock as filelock's UnixFileLock), so a lock dies with its holder. Asking
"is it held?" by trying to take it and letting go again holds it for a moment, and a `kiro loop
start` that arrives in that moment fails with "already running" (issue 7 item 8). So a probe reads
the kernel's lock table (`/proc/locks`) instead: it lists every flock with the device and inode of
its file. Where there is no /proc/locks (not Linux), the probe falls back to the try-and-release
check.

The kernel hands /proc/locks out a page per read(2), each read going on from the line number the last one
reached: a lock let go between two reads, listed before that point, moves every later line up by one, and
the line at the seam is never shown. So on a busy machine (other processes taking and letting go of
locks, and a table longer than a page) a held lock can be missing from one reading: while another
process let go of and took 930 locks, 17 probes in 300 missed one (tests/test_lock_probe.py), and
`kiro loop stop --force`, which asks every 50 ms for 10 s, took a process that ignores SIGTERM for one
that had stopped. A lock missing from a table read
in pieces is looked for again in a fresh reading (`READINGS` in all); a table that fits in one piece was
read whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterable
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")
ONE_PIECE = 4096  # bytes: a table no longer than a page comes whole in one read(2)
READINGS = 3  # of a longer table in which the lock is missing, before the lock is taken for free


def is_held(path: Path) -> bool:
    """True when some process holds the flock on `path` right now. Never takes the lock (on Linux)."""
    found = _holder(path)
    return _try_and_release(path) if found is None else found is not False


def holder_pid(path: Path) -> int | None:
    """The process that holds the flock on `path`, as the kernel's lock table names it (not a file
    anyone may write): None when nobody holds it, or when the table cannot say (not Linux; a holder
    outside this process's pid namespace shows as 0)."""
    found = _holder(path)
    return found if type(found) is int and found > 0 else None  # not False: bool is an int too


def _holder(path: Path) -> int | bool | None:
    """From /proc/locks: the holder's pid (0 when the table does not show it), False when nobody
    holds the lock, None when there is no table to read."""
    try:
        key = _key(os.stat(path))
    except OSError:
        return False
    for _ in range(READINGS):
        try:
            table = PROC_LOCKS.read_bytes()
        except OSError:
            return None
        found = _listed(table.decode("ascii", "replace"), key)
        if found is not False or len(table) <= ONE_PIECE:
            return found
    return False  # missing from every reading: not held (none of 1,900 probes of held locks under churn came here)


def held_among(paths: Iterable[Path]) -> set[Path]:
    """Those of `paths` some process holds the flock on right now: `is_held` of each, the kernel's table read
    once for all of them (a dashboard or a digest of a thousand loops asked it a thousand times, each reading
    a table of a thousand lines), and read again, as `is_held` does, for those missing from a table read in
    pieces. Never takes a lock (on Linux)."""
    wanted: dict[Path, tuple[int, int, str]] = {}
    for path in paths:
        with contextlib.suppress(OSError):  # no lock file: not held
            wanted[path] = _key(os.stat(path))
    held: set[Path] = set()
    for _ in range(READINGS):
        if not wanted:
            break
        try:
            table = PROC_LOCKS.read_bytes()
        except OSError:  # no table (not Linux): the try-and-release check, each
            return held | {path for path in wanted if _try_and_release(path)}
        text = table.decode("ascii", "replace")
        for path, key in list(wanted.items()):
            if _listed(text, key) is not False:
                held.add(path)
                del wanted[path]
        if len(table) <= ONE_PIECE:
            break
    return held


def _key(st: os.stat_result) -> tuple[int, int, str]:
    """A file as a line of /proc/locks names it: its device's major and minor, its inode."""
    return os.major(st.st_dev), os.minor(st.st_dev), str(st.st_ino)


def _entry(line: str) -> tuple[tuple[int, int, str], int] | None:
    """(the locked file's key, its holder's pid, 0 when the line does not show it) of a line of /proc/locks
    that lists a held flock; None for any other line."""
    # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:2148472 0 EOF" ("-> ..." lines are waiters)
    fields = line.split()
    if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields[:2]:
        return None
    try:
        major, minor, ino = fields[5].split(":")
        key = (int(major, 16), int(minor, 16), ino)
    except ValueError:
        return None
    try:
        return key, int(fields[4])
    except ValueError:
        return key, 0


def _listed(table: str, key: tuple[int, int, str]) -> int | bool:
    """The holder's pid in one reading of /proc/locks (0 when it does not show it), False when the lock is
    not listed. Only the lines that name the file's inode are read: a free lock costs one scan of the text."""
    inode = f":{key[2]} "  # as a line names it ("... 12345 fe:00:2148472 0 EOF")
    at = table.find(inode)
    while at >= 0:
        end = table.find("\n", at)
        found = _entry(table[table.rfind("\n", 0, at) + 1:end if end >= 0 else len(table)])
        if found is not None and found[0] == key:
            return found[1]
        at = table.find(inode, at + len(inode))
    return False


def holders(path: Path) -> list[int] | None:
    """The processes that hold the flock on `path` now: each one with an open descriptor of the locked open
    file (the process that took the lock, and a child that inherited the descriptor from it), as
    /proc/<pid>/fdinfo shows them. The pid the lock table names (`holder_pid`) is the process that took the
    lock, which may have ended while a child it started still holds it, its pid free for another process.
    A process whose descriptors this one may not read (another user's; kiro, undumpable, read by a user
    without privileges) is not listed. None when there is no /proc to read (not Linux)."""
    try:
        st = os.stat(path)
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except FileNotFoundError:
        return []
    except OSError:
        return None
    return [pid for pid in pids if holds(pid, st)]


def holds(pid: int, lock_file: os.stat_result) -> bool | None:
    """Whether process `pid` has an open descriptor that holds the flock on the file `lock_file` is the
    stat of (`holders`): None when its descriptors cannot be read (another user's, or undumpable), False
    when it has ended."""
    folder = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(folder)
    except PermissionError:
        return None
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"{folder}/{fd}")
            if st.st_ino != lock_file.st_ino or st.st_dev != lock_file.st_dev:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as fh:
                info = fh.read()
        except OSError:
            continue
        # "lock:\t1: FLOCK  ADVISORY  WRITE 12345 fe:00:2148472 0 EOF": listed for each descriptor of the open
        # file that holds it, not for one opened apart (`cat` of the lock file)
        if any(line.startswith(b"lock:") and b" FLOCK " in line for line in info.splitlines()):
            return True
    return False


def process_exists(pid: int) -> bool:
    """Whether process `pid` exists (another user's process counts; a pid too large for the kernel does not
    raise). kiro asks it of the pid a lock's taker, a temp file or a step's record names."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


class Timeout(TimeoutError):
    """The lock is still held by another holder when the wait ends (`Flock.acquire`)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"the lock {path} is held")
        self.lock_file = path


def _try_and_release(path: Path) -> bool:
    lock = Flock(path)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


class Flock:
    """An exclusive flock on a file, held from `acquire()` until `release()` or the end of the
    process, whatever way it ends. What filelock's FileLock did for kiro, at a sixth of its cost
    (about 100 us less per lock: a batch start of 1,000 loops spent 0.1 s in FileLock, issue #12) and
    without its import on the start path (12 ms). Not re-entrant: kiro takes each lock once.
    `mode`: the permissions of a lock file it creates."""

    def __init__(self, path: Path | str, *, mode: int = 0o644) -> None:
        self.path = os.fspath(path)
        self.mode = mode
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The locked file's descriptor while the lock is held (a disk reserve sizes the file through it)."""
        return self._fd

    def acquire(self, timeout: float | None = 0.0, poll: float = 0.05) -> None:
        """Take the lock, waiting up to `timeout` seconds for its holder to let go (None: until it
        does); `Timeout` when it is still held then. An OSError when the file cannot be opened (made
        if missing; O_NONBLOCK: a FIFO in its place cannot hang the open; O_NOFOLLOW: a symlink in its
        place is not followed, so no file it points at is made, emptied or locked)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         self.mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(self.path) from None
                time.sleep(poll)
                continue
            if not self._still_named(fd):
                os.close(fd)  # its holder removed the file as it let go (`remove`): lock the file there now
                continue
            self._fd = fd
            return

    @classmethod
    def handed(cls, path: Path | str, fd: int) -> Flock:
        """The lock on `path` a parent process took and handed to this one as the inherited descriptor
        `fd` (kiro.core.api.in_background): held all along, now this process's. It is taken again on the
        same open file (shared, then exclusive) so that the kernel's lock table names this process, not the
        parent that took it. flock(2) does not promise a conversion is atomic: a start or resume that takes the
        lock in between keeps it (one holder at any moment), and this process gets `Timeout`. An OSError when
        `fd` is not an open descriptor of the file `path` names; `Timeout` when it does not hold the lock."""
        lock = cls(path)
        here, mine = os.lstat(lock.path), os.fstat(fd)
        if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
            raise OSError(errno.EBADF, f"descriptor {fd} is not the lock file", lock.path)
        try:
            for how in (fcntl.LOCK_SH, fcntl.LOCK_EX):
                fcntl.flock(fd, how | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise Timeout(lock.path) from None
        os.set_inheritable(fd, False)
        lock._fd = fd
        return lock

    def hand_over(self) -> None:
        """Close this process's descriptor without letting the lock go: a process started with an
        inherited copy of it (`handed`) holds the lock from here on, and it is let go when that one ends."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _still_named(self, fd: int) -> bool:
        """The locked file is the one the path names now (not one its last holder removed)."""
        try:
            here, mine = os.lstat(self.path), os.fstat(fd)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def clear(self) -> None:
        """Empty the locked file (what its holder wrote in it), while the lock is still held."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)

    def remove(self) -> None:
        """Delete the lock file, while the lock is still held (then `release`): a lock file that is no
        longer needed does not stay behind. Safe with waiters: one that locks the removed file sees
        that the path no longer names it (`acquire`) and locks the file there instead."""
        if self._fd is not None and self._still_named(self._fd):
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> Flock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
