"""A full disk stops the loop cleanly instead of blaming the step that happened to run.

When a loop starts or resumes, kiro sets aside a small reserve file beside the state
(`.state/.kiro-reserve-<task_id>`, allocated with fallocate, so the blocks are really taken). When a
write of kiro's own (a checkbox, the state, the event log) then fails with ENOSPC or EDQUOT, kiro
deletes the reserves this process holds and tries that write once more: the room freed is enough
to check the box of the step that just succeeded, save the state and log why kiro stops. The loop
then stops at its next safe point with status `stopped`, reason `disk_full`, exit code 1, and a
message that says the disk is full. Nothing counts as a failed attempt; `kiro loop resume` continues
once there is space again (it takes a new reserve first, and says so when it cannot).

When even the retried write fails, `DiskFull` is raised: one line on stderr, exit 1; the state then
says what it said before the write (a loop left `running` by a process that is gone shows as
`interrupted` and resumes).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kiro.errors import RunError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESERVE_MIN_BYTES = 128 * 1024
T = TypeVar("T")

_reserves: set[Path] = set()  # reserve files this process holds
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


def reserve_path(state_dir: Path, task_id: str) -> Path:
    return state_dir / f".kiro-reserve-{task_id}"


def reserve(path: Path, size: int) -> None:
    """Take `size` bytes (at least RESERVE_MIN_BYTES) in a reserve file; DiskFull when the disk has
    not even that much room (then nothing is left behind)."""
    size = max(size, RESERVE_MIN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, 0)  # a filesystem without fallocate: write the bytes out
                os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if is_disk_full(exc):
            raise DiskFull(f"a {size // 1024} KiB reserve in {path.parent}", exc.strerror or "",
                           then="run the command again") from None
        raise
    if not _reserves:
        _hit.clear()  # no loop of this process is running and there is room again: an old full disk is past
    _reserves.add(path)


def drop(path: Path) -> None:
    """Give a reserve back (the loop ended)."""
    _reserves.discard(path)
    with contextlib.suppress(OSError):
        os.unlink(path)


def release_all() -> bool:
    """Delete every reserve this process holds, to make room; True when there was one."""
    freed = False
    for path in list(_reserves):
        _reserves.discard(path)
        with contextlib.suppress(OSError):
            os.unlink(path)
            freed = True
    return freed


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
