"""A full disk stops the loop cleanly instead of blaming the step that happened to run.

When a loop starts or resumes, kiro sets aside room beside the state: each process that runs loops
holds one reserve file per state folder (`.state/.kiro-reserve-<pid>`, allocated with fallocate, so
the blocks are really taken), grown by each loop's share as the loop starts and shrunk by it as the
loop ends; the file is gone when the process holds no loop there. When a write of kiro's own (a
checkbox, the state, the event log) then fails with ENOSPC or EDQUOT, kiro frees every reserve this
process holds and tries that write once more: the room freed is enough to check the box of the step
that just succeeded, save the state and log why kiro stops. The loop then stops at its next safe
point with status `stopped`, reason `disk_full`, exit code 1, and a message that says the disk is
full. Nothing counts as a failed attempt; `kiro loop resume` continues once there is space again (it
takes a new reserve first, and says so when it cannot).

When even the retried write fails, `DiskFull` is raised: one line on stderr, exit 1; the state then
says what it said before the write (a loop left `running` by a process that is gone shows as
`interrupted` and resumes).

A process holds its reserve file's lock (flock) while it has the file: the first reserve a process
takes in a state folder removes the reserve files of processes that are gone (killed), found by
their lock being free. One file per process, not per loop: creating a file is the dearest thing a
start does on a disk that scans for free inodes (1,000 loops started together made 1,000 of them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kiro.errors import RunError
from kiro.fs.locks import Flock, Timeout

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESERVE_MIN_BYTES = 128 * 1024
RESERVE_PREFIX = ".kiro-reserve-"
T = TypeVar("T")

_hit: list[str] = []  # the files whose writes found the disk full (the first one is named)


class DiskFull(RunError):
    """A write kiro needs found no space left, even after releasing its reserve."""

    def __init__(self, what: str, detail: str = "",
                 then: str = "run `kiro loop resume` (nothing was counted as a failed step)") -> None:
        super().__init__(f"disk full: could not write {what}{f' ({detail})' if detail else ''}; free some space, "
                         f"then {then}")
        self.what = what


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


class _Reserve:
    """This process's reserve file in one state folder: its lock (the open descriptor) and each loop's share."""

    def __init__(self, path: Path, lock: Flock, fd: int) -> None:
        self.path = path
        self.lock = lock
        self.fd = fd
        self.shares: dict[str, int] = {}

    @property
    def size(self) -> int:
        return sum(self.shares.values())

    def resize(self, size: int) -> None:
        """Make the file hold `size` bytes of really taken blocks (fewer: the rest freed)."""
        have = os.fstat(self.fd).st_size
        if size <= have:
            os.ftruncate(self.fd, size)
            return
        try:
            try:
                os.posix_fallocate(self.fd, have, size - have)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.pwrite(self.fd, b"\0" * (size - have), have)  # a filesystem without fallocate
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, have)  # what a failed allocation took, given back
            raise

    def close(self) -> None:
        """Free the blocks and remove the file (truncated first: an unlinked file keeps its blocks
        while it is open)."""
        self.lock.clear()
        self.lock.remove()
        self.lock.release()


_lock = threading.Lock()
_held: dict[Path, _Reserve] = {}  # state folder -> this process's reserve there


def _forget_after_fork() -> None:
    """A forked child (a fork server's) holds no reserve of its own: its parent's are not its to shrink
    or remove (and a lock another thread held at the fork is held by nobody in the child)."""
    global _lock
    _lock = threading.Lock()
    _held.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _open(state_dir: Path) -> _Reserve:
    """This process's reserve file in `state_dir`, created empty and locked; the reserve files of
    processes that are gone are removed first. A file left by a dead process of the same pid is
    taken over; one locked by a live process of the same pid (another host sharing the folder), or
    something else in its place (a folder, a symlink: not followed), is stepped around."""
    sweep(state_dir)
    base = f"{RESERVE_PREFIX}{os.getpid()}"
    for n in range(100):
        path = state_dir / (base if n == 0 else f"{base}-{n}")
        lock = Flock(path, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            continue  # a live process of the same pid holds it
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ETXTBSY):
                continue  # not a file of ours in its place
            raise
        fd = lock.fd
        assert fd is not None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                lock.release()
                continue
            os.ftruncate(fd, 0)
        except BaseException:
            lock.release()
            raise
        return _Reserve(path, lock, fd)
    raise OSError(errno.EEXIST, "no free name for a reserve file", str(state_dir / base))


def sweep(state_dir: Path) -> None:
    """Remove the reserve files in `state_dir` that no process holds: their process was killed.
    (A reserve file of kiro before 2026-11-27, one per loop and unlocked, is removed too, even when
    an older kiro still runs that loop: that loop then has no reserve.)"""
    try:
        names = [n for n in os.listdir(state_dir) if n.startswith(RESERVE_PREFIX)]
    except OSError:
        return
    for name in names:
        lock = Flock(state_dir / name)
        try:
            lock.acquire()
        except (Timeout, OSError):
            continue  # held by a running process (or not a file: left alone)
        # free: a dead process's. (A process that created it a moment ago and has not locked it
        # yet finds it unlinked: its reserve still holds its blocks, under no name.)
        lock.remove()
        lock.release()


def reserve(state_dir: Path, owner: str, size: int) -> None:
    """Take `size` bytes (at least RESERVE_MIN_BYTES) for loop `owner` in this process's reserve in
    `state_dir` (a loop that has a share already has it replaced); DiskFull when the disk has not even
    that much room (then the reserve is as it was, and no file is left for a process with no share)."""
    size = max(size, RESERVE_MIN_BYTES)
    with _lock:
        res = _held.get(state_dir)
        try:
            if res is None:
                res = _open(state_dir)
            before = res.shares.get(owner)
            res.shares[owner] = size
            try:
                res.resize(res.size)
            except BaseException:
                if before is None:
                    del res.shares[owner]
                else:
                    res.shares[owner] = before
                raise
        except OSError as exc:
            if res is not None and not res.shares:
                _held.pop(state_dir, None)
                res.close()
            if is_disk_full(exc):
                raise DiskFull(f"a {size // 1024} KiB reserve in {state_dir}", exc.strerror or "",
                               then="run the command again") from None
            raise
        _held[state_dir] = res
        if len(_held) == 1 and len(res.shares) == 1:
            _hit.clear()  # no other loop of this process is running and there is room again: an old full disk is past


def drop(state_dir: Path, owner: str) -> None:
    """Give loop `owner`'s share back (the loop ended); the file goes with the last share."""
    with _lock:
        res = _held.get(state_dir)
        if res is None or res.shares.pop(owner, None) is None:
            return
        if res.shares:
            with contextlib.suppress(OSError):
                res.resize(res.size)
            return
        del _held[state_dir]
        res.close()


def release_all() -> bool:
    """Free every reserve this process holds, to make room; True when there was one."""
    with _lock:
        held = list(_held.values())
        _held.clear()
    for res in held:
        res.close()
    return bool(held)


def note_low_space(fd: int, what: str | Path, needed: int) -> bool:
    """After a write that needed no new blocks (an append inside a block, a byte overwritten): note
    the disk as full when fewer than `needed` bytes are free, so the loop stops at its next safe
    point before a step's own writes fail and get blamed on the step. True when noted."""
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return False
    if st.f_bavail * st.f_frsize >= needed:
        return False
    if not _hit:
        _hit.append(str(what))
    return True


def hit() -> str | None:
    """The first file whose write found the disk full in this process, if any did."""
    return _hit[0] if _hit else None


def retry(write: Callable[[], T], what: str | Path) -> T:
    """`write()`; when it fails because the disk is full, release the reserves and try once more.
    Either way the full disk is noted (`hit()`), so the loop stops at its next safe point."""
    try:
        return write()
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        _hit.append(str(what))
        if not release_all():
            raise DiskFull(str(what), exc.strerror or "") from None
    try:
        return write()
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(str(what), exc.strerror or "") from None
        raise
